"""GPU sweeps of the small, launch-bound shapes: where the host's time goes and which configs win in
GPU time (CUDA graphs, common.timing.graph_time_ms). Sets SPLIT_TABLE (inference), PATH_TABLE and
DECODE_TABLE (gemm/triton_rmsnorm_linear.py) and the 1024^3 row of CONFIGS (gemm/triton_matmul_tiled.py);
the figures behind them are in docs/tuning/gemm.md and docs/tuning/inference.md.

    python scripts/tune/small_shapes.py [host] [rl] [split] [1024]     (all four without arguments; ~3 min on an H100)

host:  host us a call (200 calls, no sync), do_bench us and GPU us of matmul, rmsnorm_linear and
       decode attention at decode sizes, against cuBLAS, F.rms_norm + cuBLAS and sdpa-flash.
rl:    rmsnorm_linear's decode kernel over (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, warps, stages) at
       M = 16-64, against our rmsnorm + cuBLAS.
split: decode attention, contiguous | paged, GPU us at each split count.
1024:  1024^3 one-kernel configs and split-K, GPU us / do_bench us, against cuBLAS.
"""

import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import llmk.gemm.matmul_ops as tm
import llmk.gemm.triton_rmsnorm_linear as trl
import llmk.inference.triton_inference_attention as ia
from llmk.common.timing import graph_time_ms
from llmk.devtools.bench import host_time_us
from llmk.normalization.triton_rmsnorm import rmsnorm

PARTS = sys.argv[1:] or ["host", "rl", "split", "1024"]


def bench_us(fn):
    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def gpu_us(fn):
    return 1e3 * graph_time_ms(fn)


def line(label, fns, ref=None):
    cells = []
    for name, fn in fns.items():
        err = ""
        if ref is not None:
            err = f" e{((fn().float() - ref).abs().max() / ref.abs().max()).item():.1e}"
        fn()
        torch.cuda.synchronize()
        cells.append(f"{name}: host {host_time_us(fn):5.1f} eager {bench_us(fn):6.1f} gpu {gpu_us(fn):6.1f}{err}")
    print(f"{label:24s} " + " | ".join(cells), flush=True)


def rl_data(m, n, k=4096, dtype=torch.bfloat16):
    x = torch.randn(m, k, device="cuda").to(dtype)
    nw = (1 + 0.1 * torch.randn(k, device="cuda")).to(dtype)
    w = (torch.randn(n, k, device="cuda") * k**-0.5).to(dtype)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * nw.float()) @ w.float().t()
    return x, nw, w, ref


t00 = time.perf_counter()
print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__, flush=True)
if "host" in PARTS:
    print("== us: host a call / do_bench / GPU (graph)")
    for dtype in (torch.bfloat16,):
        for m, n, k in ((1, 4096, 4096), (1, 8192, 4096), (16, 4096, 4096), (1024, 1024, 1024), (128, 4096, 4096)):
            a, b = torch.randn(m, k, device="cuda").to(dtype), torch.randn(k, n, device="cuda").to(dtype)
            line(
                f"matmul {m}x{n}x{k}",
                {"triton": lambda: tm.matmul(a, b), "cuBLAS": lambda: torch.matmul(a, b)},
                a.float() @ b.float(),
            )
    for n in (4096, 14336):
        for m in (1, 4, 16, 32):
            x, nw, w, ref = rl_data(m, n)
            line(
                f"rms_lin M{m} N{n}",
                {
                    "triton": lambda: trl.rmsnorm_linear(x, nw, w),
                    "F.rms+cuBLAS": lambda: torch.matmul(F.rms_norm(x, (4096,), nw, 1e-6), w.t()),
                    "ours+cuBLAS": lambda: torch.matmul(rmsnorm(x, nw, 1e-6), w.t()),
                },
                ref,
            )
    for hkv in (8, 32):
        q = torch.randn(1, 32, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, 8192, hkv, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        k4, v4 = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        lengths = torch.full((1,), 8192, dtype=torch.int32, device="cuda")

        def flash():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q[:, :, None], k4, v4, enable_gqa=hkv != 32)

        line(
            f"decode B1 Hkv{hkv} T8192",
            {"triton": lambda: ia.decode_attention(q, k, v, lengths, max_length=8192), "sdpa-flash": flash},
        )

if "rl" in PARTS:
    print("== rmsnorm_linear decode configs (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, warps, stages): GPU us (graph)")
    cands = {
        16: [
            (16, 128, 128, 4, 8, 1),
            (16, 128, 128, 4, 8, 2),
            (16, 128, 128, 8, 8, 1),
            (16, 64, 128, 4, 4, 2),
            (16, 128, 64, 4, 8, 3),
            (16, 256, 64, 4, 8, 2),
        ],
        32: [
            (32, 128, 128, 4, 8, 1),
            (32, 128, 128, 4, 8, 2),
            (32, 128, 128, 2, 8, 2),
            (32, 64, 128, 4, 4, 1),
            (32, 64, 128, 4, 4, 2),
            (32, 128, 64, 4, 8, 3),
            (32, 256, 64, 4, 8, 2),
        ],
        64: [
            (64, 64, 128, 4, 4, 1),
            (64, 64, 128, 4, 4, 2),
            (64, 128, 128, 4, 8, 1),
            (64, 128, 128, 4, 8, 2),
            (64, 128, 64, 4, 8, 3),
            (64, 128, 64, 2, 8, 3),
            (64, 256, 64, 2, 8, 2),
            (64, 64, 64, 4, 4, 3),
        ],
    }
    for n in (4096, 14336):
        for m in (16, 32, 48, 64):
            x, nw, w, ref = rl_data(m, n)
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            auto = trl.decode_config(m, n, 4096, 132)
            cells = [f"ours+cuBLAS {gpu_us(lambda: torch.matmul(rmsnorm(x, nw, 1e-6), w.t())):.1f}"]
            for cfg in [auto] + cands[16 if m <= 16 else 32 if m <= 32 else 64]:
                bm, bn, bk, sp, wp, st = cfg
                tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
                if n == 14336 and sp > 1:  # fewer splits where there are many column tiles
                    sp = max(1, min(sp, triton.cdiv(264, tiles)))
                cfg = (bm, bn, bk, sp, wp, st)
                fn = lambda: trl.launch_decode(x, nw, w, 1e-6, y, config=cfg)  # noqa: E731
                try:
                    y.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                except Exception as e:
                    cells.append(f"{cfg} {type(e).__name__}")
                    continue
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                bad = "" if err < 1e-2 else " BAD"
                cells.append(f"{cfg}{'*' if cfg == auto else ''} {gpu_us(fn):.1f}{bad}")
            print(f"M{m} N{n}: " + " | ".join(cells), flush=True)

if "split" in PARTS:
    print("== decode splits, H32 hd128 fp16, GPU us (graph): contiguous | paged (16-token pages, shuffled)")
    from llmk.scripts.tune.decode_configs import D, H, decode_inputs

    for b, hkv, t in (
        (1, 8, 512),
        (1, 8, 1024),
        (1, 8, 2048),
        (1, 8, 4096),
        (1, 8, 8192),
        (1, 8, 16384),
        (1, 32, 512),
        (1, 32, 1024),
        (1, 32, 2048),
        (1, 32, 8192),
        (2, 8, 8192),
        (4, 8, 8192),
        (4, 32, 8192),
        (16, 8, 512),
        (16, 8, 2048),
        (16, 32, 512),
    ):
        q, k, v, lengths, table, kp, vp = decode_inputs(b, hkv, t)
        ca = ia.decode_config(b, hkv, H // hkv, D, t, 132).num_splits
        pa = ia.decode_config(b, hkv, H // hkv, D, t, 132, True).num_splits
        splits = sorted({s for s in (1, 2, 4, 8, 16, 32, 64) if s * 64 <= t} | {ca, pa})
        cont = [gpu_us(lambda: ia.decode_attention(q, k, v, lengths, num_splits=s, max_length=t)) for s in splits]
        paged = [
            gpu_us(lambda: ia.paged_decode_attention(q, kp, vp, table, lengths, num_splits=s, max_length=t))
            for s in splits
        ]
        print(
            f"B{b} Hkv{hkv} T{t} (auto c{ca} p{pa}): "
            + " ".join(f"s{s} {c:.1f}|{p:.1f}" for s, c, p in zip(splits, cont, paged))
            + f"  best c {min(cont):.1f} p {min(paged):.1f} ({min(cont) / min(paged):.2f})",
            flush=True,
        )
if "1024" in PARTS:
    print("== 1024^3 one-kernel configs and split-K, GPU us (graph) / do_bench us")
    for dtype in (torch.bfloat16, torch.float16):
        a, b = torch.randn(1024, 1024, device="cuda").to(dtype), torch.randn(1024, 1024, device="cuda").to(dtype)
        c = torch.empty(1024, 1024, device="cuda", dtype=dtype)
        cells = [f"cuBLAS {gpu_us(lambda: torch.matmul(a, b)):.1f}"]
        for cfg in tm.CONFIGS + [(64, 128, 64, 4, 3), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4), (128, 128, 64, 8, 3)]:
            fn = lambda: tm.launch_matmul(a, b, None, None, c, config=cfg)  # noqa: E731
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:  # out of shared memory or registers
                cells.append(f"{cfg} {type(e).__name__}")
                continue
            cells.append(f"{cfg[0]}x{cfg[1]}x{cfg[2]}w{cfg[3]}s{cfg[4]} {gpu_us(fn):.1f}/{bench_us(fn):.1f}")
        for sk in (2, 4):
            for cfg in ((64, 128, 64, 4, 4), (128, 128, 64, 4, 4)):
                fn = lambda: tm.launch_matmul(a, b, None, None, c, config=cfg, split_k=sk)  # noqa: E731
                fn()
                cells.append(f"split {sk} {cfg[0]}x{cfg[1]} {gpu_us(fn):.1f}/{bench_us(fn):.1f}")
        print(str(dtype)[6:], " | ".join(cells), flush=True)
print(f"total {time.perf_counter() - t00:.0f} s")
