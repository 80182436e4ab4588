"""The persistent TMA matmul (gemm/triton_matmul_tma.py) against cuBLAS and the pointer kernel
(gemm/triton_matmul_tiled.py) at large GEMM shapes: every TMA_CONFIGS row and the pointer kernel's two
128x256 rows, each checked against cuBLAS and timed twice in turn (do_bench medians, us); the best
of the two per provider, and its ratio to cuBLAS.

    python scripts/tune/tma_sweep.py [--quick]      (~3 min on an H100)

Sets TMA_CONFIGS and TMA_MIN_M; the figures behind them are in docs/tuning/gemm.md.
"""

import sys

import torch
import triton.testing

import llmk.gemm.matmul_ops as tm
import llmk.gemm.triton_matmul_tma as tma
from llmk.common.device import sm_count
from llmk.devtools.bench import host_time_us

SHAPES = (
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (512, 4096, 4096),
    (1024, 4096, 4096),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (2048, 4096, 4096),
    (2048, 14336, 4096),
    (8192, 14336, 4096),
    (2048, 4096, 14336),
    (8192, 4096, 14336),
)
POINTER = ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 4, 4), (64, 128, 128, 4, 3), (64, 128, 64, 4, 4))


def us(fn):
    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    sms = sm_count(torch.device("cuda"), 0)
    shapes = SHAPES[:3] if "--quick" in sys.argv else SHAPES
    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in shapes:
            a, b = torch.randn(m, k, device="cuda").to(dtype), torch.randn(k, n, device="cuda").to(dtype)
            c = torch.empty(m, n, device="cuda", dtype=dtype)
            ref = torch.matmul(a, b)
            fns = {"cuBLAS": lambda: torch.matmul(a, b)}
            for cfg in POINTER:
                fns["ptr %dx%dx%d s%d" % (cfg[0], cfg[1], cfg[2], cfg[4])] = lambda cfg=cfg: tm.launch_matmul(
                    a, b, None, None, c, config=cfg
                )
            for cfg in tma.TMA_CONFIGS:
                fns["tma %dx%dx%d w%d s%d e%d" % cfg] = lambda cfg=cfg: tma.launch_matmul_tma(
                    a, b, None, None, c, sms, cfg
                )
            fns["tma auto"] = lambda: tma.launch_matmul_tma(a, b, None, None, c, sms)
            res = {}
            for name, fn in list(fns.items()):
                try:
                    c.fill_(float("nan"))
                    out = fn()
                    got = out if name == "cuBLAS" else c
                    err = (got.float() - ref.float()).abs().max().item()
                    if not err <= 1e-2 * ref.float().abs().max().item():
                        print(f"  {name}: WRONG, max err {err}", flush=True)
                        del fns[name]
                except Exception as exc:  # noqa: BLE001  (report and go on: one config must not stop the sweep)
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    del fns[name]
            for _ in range(2):
                for name, fn in fns.items():
                    res.setdefault(name, []).append(us(fn))
            if m * n * k <= 2048**3:
                res_host = {
                    name: host_time_us(fns[name]) for name in ("cuBLAS", "tma auto", "ptr 64x128x128 s3") if name in fns
                }
                print("  host us a call: " + ", ".join(f"{kk} {v:.1f}" for kk, v in res_host.items()), flush=True)
            cub = min(res["cuBLAS"])

            def tf(t):
                return 2 * m * n * k / t / 1e6

            print(
                f"{str(dtype)[6:]} {m}x{n}x{k}: cuBLAS {cub:.1f} us {tf(cub):.0f} TF | "
                + " | ".join(f"{kk} {min(v):.1f} ({cub / min(v):.3f})" for kk, v in res.items() if kk != "cuBLAS"),
                flush=True,
            )
            del a, b, c, ref
            torch.cuda.empty_cache()
    # the transposed (nn.Linear) layout of b at one shape
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16)
    tma.launch_matmul_tma(a, w.T, None, None, c, sms)
    err = (c.float() - (a @ w.T).float()).abs().max().item()
    print(f"  host us a call: matmul() {host_time_us(lambda: tm.matmul(a, w.T, out=c)):.1f}")
    print(
        f"bf16 4096^3 b = W.T: cuBLAS {us(lambda: a @ w.T):.1f} us, "
        f"tma auto {us(lambda: tma.launch_matmul_tma(a, w.T, None, None, c, sms)):.1f} us, err {err:.3g}"
    )


if __name__ == "__main__":
    main()
