"""Host cost of our launchers, the autotuners' picks, and the decode-size GEMM choices (the H100
figures behind gemm/'s CONFIGS, SPLIT_TABLE, TMA_CONFIGS and PATH_TABLE: docs/tuning/gemm.md).

    python scripts/tune/host_and_picks.py [host] [auto] [m1] [small] [fused] [tma1024]   (all: ~6 min on an H100)

host:    CPU us a call (1000 calls, no sync) of matmul on each kernel, rmsnorm, rmsnorm_linear and
         decode attention, against torch.matmul.
auto:    the autotuned pick a fresh key gets, its GPU time (CUDA graphs) and do_bench time, against cuBLAS.
m1:      M = 1 against a row-major b: split-K configs and slice counts (SPLIT_TABLE).
small:   M = 1-64, both layouts of b: the tiled configs (CONFIGS) and split-K, forced.
fused:   rmsnorm + matmul in one big-tile kernel (defined here), the squares summed elementwise,
         at M = 17-64, against the same tiles without the norm and our rmsnorm + cuBLAS: why
         rmsnorm_linear has no big-tile fused path.
tma1024: 1024^3 and neighbours on each TMA config and a few more (TMA_CONFIGS).
"""

import sys
import time

import torch
import triton
import triton.language as tl
import triton.testing

import llmk.gemm.matmul_ops as tm
import llmk.gemm.triton_matmul_tiled as tiled
import llmk.gemm.triton_matmul_tma as tma
import llmk.gemm.triton_rmsnorm_linear as trl
import llmk.inference.triton_inference_attention as ia
from llmk.common.device import sm_count
from llmk.common.timing import graph_time_ms
from llmk.devtools.bench import host_time_us
from llmk.gemm.triton_matmul_common import grouped_tile, picked_config
from llmk.normalization.triton_rmsnorm import rmsnorm

PARTS = sys.argv[1:] or ["host", "auto", "m1", "small", "fused", "tma1024"]
dev = torch.device("cuda", 0)


def gpu_us(fn):
    return 1e3 * graph_time_ms(fn)


@triton.jit
def _rms_mm_v2(
    x_ptr,
    nw_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    sxm,
    sxk,
    swn,
    swk,
    sym,
    syn,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * sxm + rk[None, :] * sxk
    b_ptrs = w_ptr + rk[:, None] * swk + rn[None, :].to(tl.int64) * swn
    nw_ptrs = nw_ptr + rk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        x = tl.load(x_ptrs)
        nw = tl.load(nw_ptrs)
        b = tl.load(b_ptrs)
        xf = x.to(tl.float32)
        sq += xf * xf
        a = (xf * nw.to(tl.float32)[None, :]).to(x.dtype)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K * sxk
        b_ptrs += BLOCK_K * swk
        nw_ptrs += BLOCK_K
    rstd = tl.rsqrt(tl.sum(sq, axis=1) / K + eps)
    acc = acc * rstd[:, None]
    rm2 = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn2 = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(
        y_ptr + rm2[:, None] * sym + rn2[None, :] * syn,
        acc.to(y_ptr.dtype.element_ty),
        mask=(rm2 < M)[:, None] & (rn2 < N)[None, :],
    )


t00 = time.perf_counter()
print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__, flush=True)
if "host" in PARTS:
    dt = torch.bfloat16
    a16, b256 = torch.randn(16, 256, device=dev, dtype=dt), torch.randn(256, 256, device=dev, dtype=dt)
    a1, w256 = torch.randn(1, 256, device=dev, dtype=dt), torch.randn(256, 256, device=dev, dtype=dt)
    a1024 = torch.randn(1024, 256, device=dev, dtype=dt)
    x4 = torch.randn(4, 4096, device=dev, dtype=dt)
    nw = torch.randn(4096, device=dev, dtype=dt)
    x4s, nws, ws = (
        torch.randn(4, 512, device=dev, dtype=dt),
        torch.randn(512, device=dev, dtype=dt),
        torch.randn(512, 512, device=dev, dtype=dt),
    )
    q = torch.randn(1, 32, 128, device=dev, dtype=torch.float16)
    kc, vc = (torch.randn(1, 512, 8, 128, device=dev, dtype=torch.float16) for _ in range(2))
    lens = torch.full((1,), 512, dtype=torch.int32, device=dev)
    fns = {
        "torch.matmul 16x256x256": lambda: torch.matmul(a16, b256),
        "matmul tiled 16x256x256": lambda: tm.matmul(a16, b256),
        "matmul split 1x256x4096 row": None,
        "matmul TMA 1024x256x256": lambda: tm.matmul(a1024, b256),
        "matmul gemv 1x256 W.T": lambda: tm.matmul(a1, w256.T),
        "rmsnorm 4x4096": lambda: rmsnorm(x4, nw, 1e-6),
        "rmsnorm_linear 4x512x512": lambda: trl.rmsnorm_linear(x4s, nws, ws),
        "decode_attention B1 T512": lambda: ia.decode_attention(q, kc, vc, lens),
    }
    a1k, bk = torch.randn(1, 4096, device=dev, dtype=dt), torch.randn(4096, 256, device=dev, dtype=dt)
    fns["matmul split 1x256x4096 row"] = lambda: tm.matmul(a1k, bk)
    for name, fn in fns.items():
        print(f"host {name:36s} {host_time_us(fn, calls=1000):7.1f} us", flush=True)

if "auto" in PARTS:
    print("== autotuned picks (autotune_bench): GPU us (graph) and do_bench us, against cuBLAS")
    for dtype in (torch.bfloat16, torch.float16):
        for m, n, k in (
            (1024, 1024, 1024),
            (2048, 2048, 2048),
            (16, 4096, 14336),
            (16, 4096, 4096),
            (32, 4096, 4096),
            (128, 4096, 4096),
        ):
            a, b = torch.randn(m, k, device=dev).to(dtype), torch.randn(k, n, device=dev).to(dtype)
            c = torch.empty(m, n, device=dev, dtype=dtype)
            t0 = time.perf_counter()
            tm.matmul(a, b, out=c)
            torch.cuda.synchronize()
            tune_s = time.perf_counter() - t0
            err = ((c.float() - a.float() @ b.float()).abs().max()).item()
            kern = tm.choose_kernel(a, b, c, m)
            pick = picked_config(tiled._matmul_kernel if kern == "tiled" else tma._matmul_tma_kernel, a, b, m, n, k)
            pick = {
                kk: v
                for kk, v in (pick or {}).items()
                if kk in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_stages", "num_warps")
            }
            f_ours, f_cub = (lambda: tm.matmul(a, b, out=c)), (lambda: torch.matmul(a, b))
            print(
                f"{str(dtype)[6:]} {m}x{n}x{k} [{kern}] tuned in {tune_s:.1f}s pick {pick} err {err:.3g}: "
                f"GPU ours {gpu_us(f_ours):.1f} cuBLAS {gpu_us(f_cub):.1f} | do_bench ours "
                f"{1e3 * triton.testing.do_bench(f_ours, return_mode='median'):.1f} cuBLAS "
                f"{1e3 * triton.testing.do_bench(f_cub, return_mode='median'):.1f}",
                flush=True,
            )

if "m1" in PARTS:
    print("== M = 1, b row-major: split configs, GPU us (graph)")
    for dtype in (torch.bfloat16,):
        for n, k in ((2048, 4096), (4096, 4096), (8192, 4096), (4096, 14336), (14336, 4096)):
            a = torch.randn(1, k, device=dev).to(dtype)
            b = torch.randn(k, n, device=dev).to(dtype)
            c = torch.empty(1, n, device=dev, dtype=dtype)
            cells = [
                f"cuBLAS {gpu_us(lambda: torch.matmul(a, b)):.1f}",
                f"auto {gpu_us(lambda: tm.matmul(a, b, out=c)):.1f}",
            ]
            for cfg in ((16, 128, 128, 4, 4), (16, 256, 64, 8, 4), (16, 256, 64, 4, 4), (16, 256, 128, 8, 3)):
                for sk in (1, 2, 4, 8):
                    fn = lambda: tm.launch_matmul(a, b, None, None, c, config=cfg, split_k=sk)  # noqa
                    try:
                        cells.append(f"s{sk}{cfg} {gpu_us(fn):.1f}")
                    except Exception as e:
                        cells.append(f"s{sk}{cfg} {type(e).__name__}")
            print(f"1x{n}x{k}: " + " | ".join(cells), flush=True)

if "fused" in PARTS:
    print("== fused rmsnorm+matmul, elementwise squares: GPU us (graph); plain matmul with the same config")
    for n in (4096, 14336):
        for m in (17, 32, 64):
            dtype = torch.bfloat16
            x = torch.randn(m, 4096, device=dev).to(dtype)
            nwt = (1 + 0.1 * torch.randn(4096, device=dev)).to(dtype)
            w = (torch.randn(n, 4096, device=dev) * 4096**-0.5).to(dtype)
            y = torch.empty(m, n, device=dev, dtype=dtype)
            xf = x.float()
            ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * nwt.float()) @ w.float().t()
            cells = [
                f"ours+cuBLAS {gpu_us(lambda: torch.matmul(rmsnorm(x, nwt, 1e-6), w.t())):.1f}",
                f"decode {gpu_us(lambda: trl.rmsnorm_linear(x, nwt, w, path='decode')):.1f}",
            ]
            for cfg in (
                (16, 64, 256, 4, 4),
                (16, 64, 256, 4, 3),
                (16, 32, 256, 4, 4),
                (32, 64, 128, 4, 4),
                (32, 64, 256, 4, 3),
                (64, 64, 128, 4, 6),
                (64, 64, 128, 4, 4),
                (32, 128, 128, 4, 4),
                (64, 128, 128, 4, 3),
                (16, 128, 128, 4, 4),
            ):
                bm, bn, bk, wp, st = cfg
                grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)

                def fn():
                    _rms_mm_v2[grid](
                        x,
                        nwt,
                        w,
                        y,
                        m,
                        n,
                        4096,
                        x.stride(0),
                        x.stride(1),
                        w.stride(0),
                        w.stride(1),
                        y.stride(0),
                        y.stride(1),
                        1e-6,
                        BLOCK_M=bm,
                        BLOCK_N=bn,
                        BLOCK_K=bk,
                        GROUP_M=16,
                        num_warps=wp,
                        num_stages=st,
                    )

                try:
                    y.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    bad = "" if ((y.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2 else " BAD"
                    plain = gpu_us(lambda: tm.launch_matmul(x, w.t(), None, None, y, config=cfg))
                    cells.append(f"{cfg} {gpu_us(fn):.1f}{bad} (mm {plain:.1f})")
                except Exception as e:
                    cells.append(f"{cfg} {type(e).__name__}")
            print(f"M{m} N{n}: " + " | ".join(cells), flush=True)
if "small" in PARTS:
    print("== small M GPU us (graph), b row-major and W.T: cuBLAS, tiled configs, split")
    for dtype in (torch.bfloat16, torch.float16):
        for m, n, k in (
            (16, 4096, 14336),
            (16, 4096, 4096),
            (1, 4096, 4096),
            (32, 4096, 4096),
            (64, 4096, 4096),
            (32, 14336, 4096),
            (64, 14336, 4096),
        ):
            for lin in (False, True):
                a = torch.randn(m, k, device=dev).to(dtype)
                w = torch.randn(n, k, device=dev).to(dtype)
                b = w.T if lin else w.T.contiguous()
                c = torch.empty(m, n, device=dev, dtype=dtype)
                cells = [f"cuBLAS {gpu_us(lambda: torch.matmul(a, b)):.1f}"]
                for cfg in [cf for cf in tiled.CONFIGS if cf[0] <= max(16, m) and cf[0] < 128] + [
                    (16, 64, 256, 4, 4),
                    (32, 128, 128, 4, 4),
                    (64, 128, 128, 4, 3),
                    (16, 256, 64, 4, 4),
                ]:
                    fn = lambda: tm.launch_matmul(a, b, None, None, c, config=cfg)  # noqa: E731
                    try:
                        cells.append(f"{cfg} {gpu_us(fn):.1f}")
                    except Exception as e:
                        cells.append(f"{cfg} {type(e).__name__}")
                if m <= 16:
                    for sk in (2, 4, 8):
                        for cfg in ((16, 128, 128, 4, 4), (16, 64, 128, 4, 4), (16, 256, 64, 8, 4)):
                            fn = lambda: tm.launch_matmul(a, b, None, None, c, config=cfg, split_k=sk)  # noqa: E731
                            try:
                                cells.append(f"s{sk}{cfg} {gpu_us(fn):.1f}")
                            except Exception as e:
                                cells.append(f"s{sk}{cfg} {type(e).__name__}")
                fn = lambda: tm.matmul(a, b, out=c)  # noqa: E731
                fn()
                kern = tm.choose_kernel(a, b, c, m)
                cells.append(f"auto[{kern}] {gpu_us(fn):.1f}")
                print(f"{str(dtype)[6:]} {m}x{n}x{k} {'W.T' if lin else 'row'}: " + " | ".join(cells), flush=True)

if "tma1024" in PARTS:
    print("== TMA configs at 1024^3 and neighbours, GPU us (graph)")
    extra = [
        (128, 128, 64, 8, 3, 1),
        (64, 128, 64, 4, 4, 1),
        (128, 64, 64, 4, 4, 1),
        (64, 64, 128, 4, 4, 1),
        (64, 128, 128, 4, 3, 1),
        (64, 256, 64, 4, 3, 1),
    ]
    for dtype in (torch.bfloat16, torch.float16):
        for m, n, k in ((1024, 1024, 1024), (1024, 4096, 4096), (2048, 2048, 2048)):
            a, b = torch.randn(m, k, device=dev).to(dtype), torch.randn(k, n, device=dev).to(dtype)
            c = torch.empty(m, n, device=dev, dtype=dtype)
            ref = a.float() @ b.float()
            cells = [f"cuBLAS {gpu_us(lambda: torch.matmul(a, b)):.1f}"]
            for cfg in tma.TMA_CONFIGS + [e for e in extra if e not in tma.TMA_CONFIGS]:
                fn = lambda: tma.launch_matmul_tma(a, b, None, None, c, sm_count(dev, tma.INTERPRET_SMS), cfg)  # noqa: E731
                try:
                    c.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    bad = "" if ((c.float() - ref).abs().max() / ref.abs().max()).item() < 1e-2 else " BAD"
                    cells.append(f"{cfg} {gpu_us(fn):.1f}{bad}")
                except Exception as e:  # noqa: BLE001  (out of shared memory: report and go on)
                    cells.append(f"{cfg} {type(e).__name__}")
            print(f"{str(dtype)[6:]} {m}x{n}x{k}: " + " | ".join(cells), flush=True)
print(f"total {time.perf_counter() - t00:.0f} s")
