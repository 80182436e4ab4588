"""matmul's backward, piece by piece, against cuBLAS on the same views: the two backward GEMMs
(da = dz @ W, "NN"; dW = dz^T @ a, "TN", dz read transposed), the training forward that also
writes z, and the elementwise dz/dbias pass, then whole training calls (bwd, fwd+bwd) in do_bench
time and GPU time (CUDA graph), with the configs the autotuner picked inside autograd's backward.

    python scripts/tune/backward_sweep.py [--quick]      (~2 min on an H100; --quick: 4096^3 only)

a (M, K), W (N, K) as nn.Linear holds it, dz (M, N); bf16; times in us (do_bench medians, L2
flushed). Every TMA config is checked against cuBLAS before it is timed. The figures behind the
backward's choices are in docs/tuning/gemm.md.
"""

import sys

import torch
import torch.nn.functional as F
import triton.testing

import llmk.gemm.matmul_ops as tm
import llmk.gemm.triton_matmul_tma as tma
from llmk.common.device import sm_count
from llmk.common.timing import graph_time_ms
from llmk.devtools.bench import host_time_us, train_call
from llmk.gemm import triton_matmul_common
from llmk.gemm.triton_matmul_backward import epilogue_backward

SHAPES = ((4096, 4096, 4096), (8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336))
# TMA_CONFIGS and a few more: 256 x 128 tiles (the transposed operand's long side along M), 128 x 256
# with the c tile stored whole, 128 x 128 with two warpgroups
CONFIGS = list(
    dict.fromkeys(list(tma.TMA_CONFIGS) + [(256, 128, 64, 8, 3, 2), (128, 256, 64, 8, 3, 1), (128, 128, 64, 8, 4, 1)])
)
DTYPE = torch.bfloat16


def us(fn):
    return 1e3 * triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def cfg_name(cfg):
    return "%dx%dx%d w%d s%d e%d" % cfg


def sweep(label, ref_fn, out, run_cfg, auto_fn, sms):
    """cuBLAS, our automatic choice, and every config of CONFIGS on one GEMM; one line each."""
    ref = ref_fn()
    rows = [("cuBLAS", us(ref_fn)), ("auto", us(auto_fn))]
    for cfg in CONFIGS:
        try:
            out.fill_(float("nan"))
            run_cfg(cfg)
            err = (out.float() - ref.float()).abs().max().item()
            if not err <= 1e-2 * ref.float().abs().max().item():
                rows.append((cfg_name(cfg), float("nan")))
                continue
            rows.append((cfg_name(cfg), us(lambda cfg=cfg: run_cfg(cfg))))
        except Exception as exc:  # noqa: BLE001  (a config out of shared memory: report it, go on)
            print(f"    {cfg_name(cfg)}: {type(exc).__name__}", flush=True)
    base = rows[0][1]
    print(f"  {label}: " + ", ".join(f"{n} {t:.0f} ({base / t:.2f}x)" for n, t in rows), flush=True)


def whole_calls(m, n, k):
    """Training calls as benchmarks/gemm_bench.py times them, for matmul, bias_gelu, bias_silu."""
    a = torch.randn(m, k, device="cuda").to(DTYPE)
    w = (torch.randn(n, k, device="cuda") * k**-0.5).to(DTYPE)
    bias = torch.randn(n, device="cuda").to(DTYPE)
    dc = torch.randn(m, n, device="cuda").to(DTYPE)
    for act in (None, "gelu", "silu"):
        torch_act = {None: lambda y: y, "gelu": F.gelu, "silu": F.silu}[act]
        b = bias if act else None
        wrt = (0, 1, 2) if act else (0, 1)
        ours = lambda a, w, bias, act=act: tm.matmul(a, w.T, bias, act)  # noqa: E731
        peer = lambda a, w, bias, torch_act=torch_act: torch_act(F.linear(a, w, bias))  # noqa: E731
        line = []
        for mode in ("bwd", "fwd+bwd"):
            for name, fn in (("ours", ours), ("cuBLAS", peer)):
                call = train_call(fn, (a, w, b), wrt, mode, [dc])
                call()
                t = us(call)
                g = graph_time_ms(call) * 1e3 if mode == "fwd+bwd" else float("nan")
                h = host_time_us(call, calls=20, rounds=2)
                line.append(f"{mode} {name} {t:.0f} graph {g:.0f} host {h:.0f}")
        print(f"  whole {act or 'none'}: " + "; ".join(line), flush=True)


def main():
    sms = sm_count(torch.device("cuda"), 0)
    torch.manual_seed(0)
    for m, n, k in SHAPES[:1] if "--quick" in sys.argv else SHAPES:
        print(f"M, N, K = {m}, {n}, {k}", flush=True)
        whole_calls(m, n, k)  # first: the autotuner picks inside autograd's backward, as in the benchmark
        for key, meta in triton_matmul_common._PICKED.items():
            if key[0] is tma._matmul_tma_kernel:
                print(
                    f"    picked MNK {key[1:4]} a_rowmajor={key[4]} b_stride1={key[5]} z={key[8]}: "
                    f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} w{meta['num_warps']} "
                    f"s{meta['num_stages']} e{meta['EPILOGUE_SPLIT']}",
                    flush=True,
                )
        a = torch.randn(m, k, device="cuda").to(DTYPE)
        w = (torch.randn(n, k, device="cuda") * k**-0.5).to(DTYPE)
        dz = torch.randn(m, n, device="cuda").to(DTYPE)
        bias = torch.randn(n, device="cuda").to(DTYPE)
        da = torch.empty(m, k, device="cuda", dtype=DTYPE)
        dwt = torch.empty(n, k, device="cuda", dtype=DTYPE)
        sweep(
            "NN da = dz @ W",
            lambda: torch.mm(dz, w),
            da,
            lambda cfg: tma.launch_matmul_tma(dz, w, None, None, da, sms, cfg),
            lambda: tm.matmul_op(dz, w, None, None),
            sms,
        )
        sweep(
            "TN dW = dz^T @ a",
            lambda: torch.mm(dz.T, a),
            dwt,
            lambda cfg: tma.launch_matmul_tma(dz.T, a, None, None, dwt, sms, cfg),
            lambda: tm.matmul_op(dz.T, a, None, None),
            sms,
        )
        c = torch.empty(m, n, device="cuda", dtype=DTYPE)
        z = torch.empty_like(c)
        sweep(
            "fwd+z gelu",
            lambda: F.linear(a, w, bias),
            z,
            lambda cfg: tma.launch_matmul_tma(a, w.T, bias, "gelu", c, sms, cfg, z),
            lambda: tm.matmul_train_op(a, w.T, bias, "gelu"),
            sms,
        )
        print(
            f"  fwd no z (auto) {us(lambda: tm.matmul_op(a, w.T, bias, 'gelu')):.0f}, "
            f"cuBLAS+gelu {us(lambda: F.gelu(F.linear(a, w, bias))):.0f}",
            flush=True,
        )
        for act, fn in (("gelu", F.gelu), ("silu", F.silu)):
            zz = torch.randn(m, n, device="cuda").to(DTYPE).requires_grad_()
            y = fn(zz)

            def eager(y=y, zz=zz):
                (g,) = torch.autograd.grad(y, zz, dz, retain_graph=True)
                return g, g.sum(0)

            ours = us(lambda: epilogue_backward(dz, zz.detach(), bias, act, True))
            print(f"  dz+dbias {act}: ours {ours:.0f}, eager {us(eager):.0f}", flush=True)


if __name__ == "__main__":
    main()
