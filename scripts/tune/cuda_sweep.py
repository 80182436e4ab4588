"""Sweep the launch shapes of the CUDA kernels (cuda_cpp/launch_config.py) on the GPU.

    python scripts/tune/cuda_sweep.py [rmsnorm|swiglu|rope ...]     (GPU, ~60-90 s with the build)

For each shape and dtype: every candidate launch, GB/s (the benchmarks' byte formulas) and % of the
copy bandwidth, sorted best first; `*` marks the launch cuda_cpp/launch_config.py picks, and the Triton
kernel's figure is printed for reference. Read off: whether the default is within ~2% of the best
everywhere; where it is not, which constant to change (names in brackets).
"""

import sys
import time

import torch

from llmk.attention.triton_rope import apply_rope as triton_rope
from llmk.common.timing import time_ms
from llmk.cuda_cpp import launch_config as lc
from llmk.cuda_cpp import ops
from llmk.cuda_cpp.extension import extension, unavailable_reason
from llmk.devtools.bench import copy_bandwidth_GBps, gbps
from llmk.mlp.triton_glu import swiglu as triton_swiglu
from llmk.normalization.triton_rmsnorm import rmsnorm as triton_rmsnorm

reason = unavailable_reason()
if reason:
    sys.exit(f"cuda_sweep: {reason}")
t_start = time.time()
extension()
print(f"build/load {time.time() - t_start:.0f} s")
COPY = copy_bandwidth_GBps()
print(f"copy bandwidth {COPY:.0f} GB/s on {torch.cuda.get_device_name()}")
WHICH = sys.argv[1:] or ["rmsnorm", "swiglu", "rope"]
DTYPES = (torch.float16, torch.bfloat16)


def bench(fn):
    return time_ms(fn, warmup_ms=5, rep_ms=30)


def report(title, n_bytes, results, default, triton_ms):
    """results: {label: ms}."""
    print(f"\n{title}   triton {gbps(n_bytes, triton_ms):6.0f} GB/s ({100 * gbps(n_bytes, triton_ms) / COPY:.0f}%)")
    best = min(results.values())
    for label, ms in sorted(results.items(), key=lambda kv: kv[1]):
        bw = gbps(n_bytes, ms)
        mark = "*" if label == default else " "
        print(f"  {mark} {label:34s} {bw:6.0f} GB/s {100 * bw / COPY:5.1f}%  {ms / best:5.3f}x best")


def rmsnorm_label(cfg):
    if cfg.looped:
        return f"looped {cfg.threads_per_row} threads"
    return f"cached {cfg.threads_per_row}x{cfg.rows_per_block} vpt {cfg.vectors_per_thread}"


if "rmsnorm" in WHICH:  # [WARP_ROW_PACKS, CACHED_SMALL_PACKS, CACHED_THREADS, LOOPED_*]
    for m, n in (
        (16384, 1024),
        (16384, 2048),
        (16384, 4096),
        (16384, 8192),
        (16384, 16384),
        (4096, 32768),
        (4096, 65536),
        (4096, 131072),
    ):
        for dtype in DTYPES:
            x, w = torch.randn(m, n, device="cuda").to(dtype), torch.randn(n, device="cuda").to(dtype)
            y = torch.empty_like(x)
            packs = n // 8
            cfgs = [lc.RmsnormConfig(True, 1, t, 1) for t in (128, 256, 512, 1024)]
            cfgs += [
                lc.RmsnormConfig(False, v, t, 4 if t == 32 else 1)
                for v in (1, 2, 4)
                for t in (32, 64, 128, 256, 512, 1024)
                if packs <= t * v < 2 * packs
            ]
            results = {}
            for cfg in cfgs:
                results[rmsnorm_label(cfg)] = bench(lambda: ops.launch_rmsnorm(x, w, 1e-6, y, cfg))
            default = rmsnorm_label(lc.rmsnorm_config(n, 2, True))
            report(
                f"rmsnorm {m}x{n} {str(dtype)[6:]}",
                2 * m * n * 2 + n * 2,
                results,
                default,
                bench(lambda: triton_rmsnorm(x, w, 1e-6)),
            )
            del x, y
            torch.cuda.empty_cache()

if "swiglu" in WHICH:  # [SWIGLU_THREADS, SWIGLU_PACKS]
    for m, n in ((1024, 14336), (4096, 11008), (4096, 14336), (8192, 14336), (16384, 14336)):
        for dtype in DTYPES:
            gate, up = (torch.randn(m, n, device="cuda").to(dtype) for _ in range(2))
            y = torch.empty_like(gate)
            results = {}
            for threads in (128, 256, 512):
                for vpt in (1, 2, 4):
                    cfg = lc.SwigluConfig(vpt, threads)
                    results[f"{threads} threads x {vpt} packs"] = bench(lambda: ops.launch_swiglu(gate, up, y, cfg))
            d = lc.swiglu_config(True)
            report(
                f"swiglu {m}x{n} {str(dtype)[6:]}",
                3 * m * n * 2,
                results,
                f"{d.threads} threads x {d.vectors_per_thread} packs",
                bench(lambda: triton_swiglu(gate, up)),
            )
            del gate, up, y
            torch.cuda.empty_cache()

if "rope" in WHICH:  # [ROPE_THREADS]
    for batch, heads, kv, seq, dim, interleaved, strided in (
        (1, 32, 8, 2048, 128, False, False),
        (1, 32, 8, 8192, 128, False, False),
        (4, 32, 8, 4096, 128, False, True),
        (1, 32, 8, 8192, 128, True, False),
        (1, 32, 8, 8192, 64, False, False),
        (1, 32, 8, 8192, 256, False, False),
    ):
        for dtype in DTYPES:
            if strided:
                q = torch.randn(batch, seq, heads, dim, device="cuda").to(dtype).transpose(1, 2)
                k = torch.randn(batch, seq, kv, dim, device="cuda").to(dtype).transpose(1, 2)
            else:
                q = torch.randn(batch, heads, seq, dim, device="cuda").to(dtype)
                k = torch.randn(batch, kv, seq, dim, device="cuda").to(dtype)
            angles = torch.rand(1, seq, dim, device="cuda") * 100
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
            q_out, k_out = (
                torch.empty(q.shape, dtype=dtype, device="cuda"),
                torch.empty(k.shape, dtype=dtype, device="cuda"),
            )
            results = {}
            for most in (64, 128, 256, 512):
                cfg = lc.rope_config(dim, heads + kv, 2, True, max_threads=most)
                label = f"{cfg.threads_pairs}x{cfg.threads_heads} threads"
                results[label] = bench(lambda: ops.launch_rope(q, k, cos, sin, q_out, k_out, interleaved, cfg))
            d = lc.rope_config(dim, heads + kv, 2, True)
            n_bytes = 2 * batch * (heads + kv) * seq * dim * 2 + 2 * seq * dim * 2
            name = (
                f"rope B{batch} H{heads}/{kv} T{seq} D{dim}"
                f"{' interleaved' if interleaved else ''}{' BTHD' if strided else ''}"
            )
            report(
                f"{name} {str(dtype)[6:]}",
                n_bytes,
                results,
                f"{d.threads_pairs}x{d.threads_heads} threads",
                bench(lambda: triton_rope(q, k, cos, sin, interleaved)),
            )
            del q, k, q_out, k_out
            torch.cuda.empty_cache()

print(f"\ntotal {time.time() - t_start:.0f} s")
