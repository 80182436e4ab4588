"""GPU sweep for gemm/triton_gemv.py: one-token decode (M = 1) against cuBLAS and the tiled tensor-core kernel
(split-K), over a few GEMV configs, to set GEMV_CONFIGS from measurement.

    python scripts/tune/gemv_sweep.py           (GPU: fp16 and bf16, both layouts; ~3 min on an H100, compiles included)
    python scripts/tune/gemv_sweep.py --bf16    (one dtype, about half the time; --fp16 likewise)
    python scripts/tune/gemv_sweep.py --smoke   (interpreter, tiny shapes: proves the script runs, numbers mean nothing)

Bytes a call (e = element size): K*N*e (b) + K*e (a) + N*e (c), the same for every provider; the
split partials (SPLIT_K*N*4*2) are overhead and not counted. "% copy" is those bytes over the GPU
time, against the device-to-device copy bandwidth measured at the start (devtools.bench).
Per dtype, layout of b (row-major (K, N), or W.T of an nn.Linear weight (N, K)) and (N, K), one row
per provider, printed as measured (a run cut short keeps what it printed):
    GPU us   common.timing.graph_time_ms: CUDA-graph replays after an L2 flush, the host out of the loop
    eager us common.timing.time_ms: do_bench, so for calls this short partly the host's launch cost
    x cuBLAS cuBLAS's GPU time over the provider's (>= 0.90 is the target; > 1 is faster)
GEMV rows are (BLOCK_N, BLOCK_K, num_warps, NUM_STAGES, programs per SM) with the planned SPLIT_K;
'*' marks GEMV_CONFIGS' row. Every provider's result is checked against an fp32 product first
(max |err| / max |ref| < 2^-6); a wrong one prints BAD and is not timed.
Read off: the best config per shape, and at the end each candidate's geometric-mean GPU time over
all shapes and dtypes of its layout, relative to the best at each: the GEMV_CONFIGS row is the
candidate with the smallest, unless one shape loses badly with it.
"""

import math
import sys
import time

import torch
import triton

from llmk.common.device import DEVICE, INTERPRET, describe, sm_count
from llmk.common.timing import graph_time_ms, time_ms
from llmk.devtools.bench import copy_bandwidth_GBps, gbps
from llmk.devtools.testing import dtype_name
from llmk.gemm.matmul_ops import launch_matmul
from llmk.gemm.triton_gemv import GEMV_CONFIGS, INTERPRET_SMS, gemv_plan, launch_gemv

SMOKE = "--smoke" in sys.argv
if SMOKE and not INTERPRET:
    sys.exit("gemv_sweep --smoke runs in the interpreter: set TRITON_INTERPRET=1 on a GPU machine")
if not SMOKE and INTERPRET:
    sys.exit("gemv_sweep needs a CUDA GPU (or --smoke for the interpreter)")
DTYPES = [d for d, flag in ((torch.bfloat16, "--bf16"), (torch.float16, "--fp16")) if flag in sys.argv]
DTYPES = DTYPES or [torch.bfloat16, torch.float16]
# (N, K) of a 4096-wide model's decode projections: attention (the 0.87x case first), a narrower
# and a wider output, MLP up and down
SHAPES = [(48, 80), (100, 257)] if SMOKE else [(4096, 4096), (2048, 4096), (8192, 4096), (14336, 4096), (4096, 14336)]
# (BLOCK_N, BLOCK_K, num_warps, NUM_STAGES, programs per SM). Each row compiles once per dtype and
# per power of two of the splits its shapes take: 12 rows, about 70 builds in all.
CANDIDATES = {
    "row_major": [
        (256, 32, 4, 3, 2),  # 512-byte rows, three stages
        (256, 32, 4, 1, 4),  # not pipelined: registers bound the loads in flight, twice the programs
        (128, 64, 4, 3, 2),  # 256-byte rows, twice the strips and half the split
        (256, 64, 8, 3, 2),  # 32 KB stages
        (512, 16, 4, 4, 2),  # 1 KB rows, four stages
        (128, 32, 4, 4, 4),  # 8 KB stages, four programs an SM
    ],
    "linear": [
        (8, 512, 4, 3, 4),  # 1 KB runs of each row, three stages
        (8, 512, 4, 1, 4),  # _rmsnorm_gemv_kernel's tile, not pipelined
        (16, 512, 8, 3, 2),  # 16 KB stages, half the programs
        (4, 1024, 4, 3, 4),  # 2 KB runs of each row
        (16, 256, 4, 4, 4),  # 8 KB stages, four of them
        (32, 256, 8, 3, 2),  # 32 rows a program
    ],
}
LAYOUT_NAMES = {"row_major": "b (K,N)", "linear": "W.T"}


def gpu_us(fn):
    return 1e3 * graph_time_ms(fn)


def eager_us(fn):
    return 1e3 * time_ms(fn, warmup_ms=10, rep_ms=40)


def config_name(config):
    return "x".join(map(str, config[:2])) + f" w{config[2]} s{config[3]} p{config[4]}"


def error(fn, expected):
    """max |err| / max |ref| of fn()'s result, NaN-filled first where fn writes into a buffer."""
    out = fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return ((out.float() - expected).abs().max() / expected.abs().max()).item()


def sweep(dtype, layout, n, k, n_sms, copy, rel_times):
    """Print one row per provider of one shape and the best GEMV config; add each candidate's GPU
    time over the best candidate's to rel_times[layout][config]."""
    a = torch.randn(1, k, device=DEVICE).to(dtype)
    b = (
        torch.randn(k, n, device=DEVICE).to(dtype)
        if layout == "row_major"
        else torch.randn(n, k, device=DEVICE).to(dtype).t()
    )
    c = torch.empty(1, n, device=DEVICE, dtype=dtype)
    expected = a.float() @ b.float()
    n_bytes = (k * n + k + n) * a.element_size()
    head = f"{dtype_name(dtype):5s} {LAYOUT_NAMES[layout]:8s} {n:6d} {k:6d}"

    def run_into_c(launch):
        def fn():
            c.fill_(float("nan"))
            launch()
            return c

        return fn

    providers = {
        "cuBLAS": (lambda: torch.matmul(a, b), None, None),
        # the tiled tensor-core kernel with its split-K (what M = 1 ran before the GEMV)
        "tiled": (lambda: launch_matmul(a, b, None, None, c, kernel="tiled"), "tiled", None),
    }
    for config in CANDIDATES[layout]:
        split = gemv_plan(n, k, layout == "row_major", n_sms, config)[-1]
        label = config_name(config) + ("*" if config == GEMV_CONFIGS[layout] else "")
        providers[label] = (lambda config=config: launch_gemv(a, b, None, None, c, config=config), config, split)

    cublas_us, gemv_us = None, {}
    for label, (fn, config, split) in providers.items():
        check = run_into_c(fn) if config is not None else fn
        try:
            err = error(check, expected)
        except Exception as e:  # out of shared memory or registers
            print(f"{head}  {label:24s} {type(e).__name__}: {str(e)[:60]}", flush=True)
            continue
        if not err < 2**-6:
            print(f"{head}  {label:24s} BAD (rel err {err:.3g})", flush=True)
            continue
        gpu, eager = gpu_us(fn), eager_us(fn)
        cublas_us = cublas_us or gpu
        if config not in (None, "tiled"):
            gemv_us[config] = gpu
        pct = 100 * gbps(n_bytes, gpu * 1e-3) / copy
        print(
            f"{head}  {label:24s} {split if split else '':>5} {gpu:8.1f} {eager:8.1f} {pct:6.1f}% "
            f"{cublas_us / gpu:8.2f}",
            flush=True,
        )
    if gemv_us:
        best = min(gemv_us, key=gemv_us.get)
        print(
            f"{head}  best {config_name(best)}: {gemv_us[best]:.1f} us, "
            f"{100 * gbps(n_bytes, gemv_us[best] * 1e-3) / copy:.0f}% copy, {cublas_us / gemv_us[best]:.2f}x cuBLAS",
            flush=True,
        )
        for config, us in gemv_us.items():
            rel_times[layout].setdefault(config, []).append(us / gemv_us[best])
    del a, b, c, expected
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def main():
    t0 = time.perf_counter()
    n_sms = sm_count(torch.device(DEVICE), INTERPRET_SMS)
    copy = copy_bandwidth_GBps(1 << 20 if SMOKE else 1 << 30)
    print(
        f"{describe()}, {n_sms} SMs; triton {triton.__version__}, torch {torch.__version__}; "
        f"copy bandwidth {copy:.0f} GB/s"
    )
    print(
        f"{'dtype':5s} {'layout':8s} {'N':>6s} {'K':>6s}  {'provider':24s} {'split':>5s} {'GPU us':>8s} "
        f"{'eager us':>8s} {'% copy':>7s} {'x cuBLAS':>8s}",
        flush=True,
    )
    rel_times = {layout: {} for layout in CANDIDATES}
    for dtype in DTYPES:
        for layout in CANDIDATES:
            for n, k in SHAPES:
                sweep(dtype, layout, n, k, n_sms, copy, rel_times)
    print("\ngeometric mean of GPU time / the best candidate's, over every shape and dtype measured:")
    for layout, by_config in rel_times.items():
        geomeans = {config: math.exp(sum(map(math.log, rels)) / len(rels)) for config, rels in by_config.items()}
        for config in sorted(geomeans, key=geomeans.get):
            mark = "*" if config == GEMV_CONFIGS[layout] else " "
            geo, rels = geomeans[config], by_config[config]
            print(
                f"  {LAYOUT_NAMES[layout]:8s} {config_name(config):24s}{mark} {geo:6.3f}  (worst {max(rels):.3f}, "
                f"{len(rels)} shapes)"
            )
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
