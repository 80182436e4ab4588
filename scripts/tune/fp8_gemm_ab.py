"""GPU A/B of the FP8 GEMM (gemm/triton_fp8_matmul.py) against torch._scaled_mm and cuBLAS bf16, at
square shapes, small M and the llama-1.5b training step's products (fp8_linear at 8192 tokens: the
forward, the input gradient and the weight gradient of each linear), in one process:

- row-wise scales, the pointer kernel (gemm/triton_fp8_matmul.py) at CONFIG_TABLE's config and at
  each AB_CONFIGS row, and the persistent TMA kernel (gemm/triton_fp8_matmul_tma.py) at
  FP8_TMA_TABLE's and each TMA_AB_CONFIGS row; each with the sums promoted into fp32 every
  128-deep step (the tables' accumulation) and not promoted (the whole K loop in the tensor
  cores' accumulator, as torch._scaled_mm's use_fast_accum=True);
- block scales (1 x 128 and 128 x 128) at the table's config;
- the peers: torch._scaled_mm row-wise (use_fast_accum False and True) and tensor-wise, cuBLAS bf16.

Each variant's output is checked against _scaled_mm row-wise's on the same e4m3 inputs and scales
(max |diff| / max |ref|; past MAX_REL it prints BAD and is not timed; block scales against their own
dequantized product in fp32). Times are triton.testing.do_bench medians, TFLOP/s of 2 M N K.

    python scripts/tune/fp8_gemm_ab.py [--shapes square,small,llama]
    python scripts/tune/fp8_gemm_ab.py --compile   (no GPU needed, Triton 3.6+: ptxas's registers and
                                                   spills for sm_90a of every config above)
"""

import argparse
import os
import re

SHAPES = {
    "square": [(4096, 4096, 4096), (8192, 8192, 8192)],
    "small": [(128, 4096, 4096), (512, 4096, 4096), (1024, 4096, 14336)],
    # llama-1.5b (hidden 2048, 32 heads over 8 of 64, MLP 8192) at B2 x T4096 = 8192 tokens, (M, N, K):
    # the forward x @ W^T, the input gradient dy @ W, the weight gradient dy^T @ x
    "llama": [
        (8192, 2048, 2048),
        (8192, 512, 2048),
        (8192, 8192, 2048),
        (8192, 2048, 8192),  # forward
        (8192, 2048, 512),
        (8192, 2048, 8192),  # input gradient
        (2048, 2048, 8192),
        (512, 2048, 8192),
        (8192, 2048, 8192),
        (2048, 8192, 8192),
    ],  # weight gradient
}
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) weighed beside the table's. ptxas for sm_90a
# (--compile, Triton 3.6), registers a thread with promotion / without: none of these spills but the
# first table's 128 x 256 x 128 (704 bytes promoted, 0 not; 128 x 256 x 64 spilled 488 and 64 x 256 x
# 128 at 4 warps 1080, left out). The tables (from this A/B's H200 run, docs/tuning/gemm.md): promoted
# 64 x 128 x 128 below 1024 rows and 256 x 128 x 128 from there, not promoted 64 x 128 and 128 x 256
AB_CONFIGS = [
    (128, 256, 128, 8, 3),  # the first table's: 255 (704 bytes spilled) / 196
    (128, 128, 128, 4, 4),  # 255 / 206
    (256, 128, 128, 8, 3),  # 254 / 244
    (128, 128, 256, 8, 3),  # 181 / 130, 192 KB of stages
    (64, 128, 128, 4, 4),  # 167 / 124: small M
    (128, 128, 128, 8, 4),  # 163 / 126
]
# the TMA kernel's (..., EPILOGUE_SPLIT) beside FP8_TMA_TABLE's; registers promoted / not (--compile)
TMA_AB_CONFIGS = [
    (128, 128, 128, 8, 4, 1),  # 174 / 141
    (256, 128, 128, 8, 3, 2),  # 254 / 214
    (128, 256, 128, 8, 3, 2),  # 255, 280 bytes spilled / 162
    (128, 128, 128, 4, 4, 1),  # 254 / 168
    (128, 256, 64, 8, 4, 2),  # 255, 280 bytes spilled / 162
    (64, 128, 128, 4, 4, 1),  # 162 / 104
]
MAX_REL = 1e-2


def flops(m, n, k):
    return 2.0 * m * n * k


def variants(m):
    """(label, kernel "ptr" or "tma", launcher kwargs) of our kernels' row-wise variants at M rows."""
    from llmk.gemm.triton_fp8_matmul import fp8_config
    from llmk.gemm.triton_fp8_matmul_tma import fp8_tma_config

    out = []
    for kernel, pick, others in (("ptr", fp8_config, AB_CONFIGS), ("tma", fp8_tma_config, TMA_AB_CONFIGS)):
        tables = {True: pick(m), False: pick(m, promote=False)}  # the promoted table's and the fast one's
        for config in dict.fromkeys((*tables.values(), *others)):
            for promote in (True, False):
                mark = " (table)" if config == tables[promote] else ""
                out.append(
                    (
                        f"{kernel} {config}{mark}, {'promoted' if promote else 'not promoted'}",
                        kernel,
                        dict(config=config, promote=promote),
                    )
                )
    return out


def launcher(kernel):
    """The launch function of kernel "ptr" or "tma", as (a, b, sa, sb, bias, activation, c, **kw)."""
    from llmk.common.device import sm_count
    from llmk.gemm.triton_fp8_matmul import launch_fp8_matmul
    from llmk.gemm.triton_fp8_matmul_tma import INTERPRET_SMS, launch_fp8_matmul_tma

    if kernel == "ptr":
        return launch_fp8_matmul
    import torch

    sms = sm_count(torch.device("cuda"), INTERPRET_SMS) if torch.cuda.is_available() else 132
    return lambda *args, **kw: launch_fp8_matmul_tma(*args, num_sms=sms, **kw)


def shape_rows(m, n, k):
    import torch
    import triton.testing

    from llmk.gemm.fp8_ops import FP8
    from llmk.gemm.triton_fp8_matmul import launch_fp8_matmul
    from llmk.gemm.triton_fp8_quant import launch_quantize_fp8, scale_shape

    name = f"{m}x{n}x{k}"
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)  # an nn.Linear weight: b = W.T

    def quantized(t, granularity):
        q = torch.empty(t.shape, device="cuda", dtype=FP8)
        s = torch.empty(scale_shape(*t.shape, granularity), device="cuda", dtype=torch.float32)
        launch_quantize_fp8(t, q, s, granularity)
        return q, s

    (qa, sa), (qw, sw) = quantized(x, "row"), quantized(w, "row")
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ref = torch._scaled_mm(qa, qw.T, scale_a=sa[:, None], scale_b=sw[None, :], out_dtype=torch.bfloat16)

    def time_row(label, call, want):
        c.fill_(float("nan"))
        try:
            got = call()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (one config that fails to launch must not stop the A/B)
            print(f"{name} | {label} | FAILED | {type(e).__name__}: {str(e)[:160]}", flush=True)
            return
        got = c if got is None else got
        err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
        if not err <= MAX_REL:
            print(f"{name} | {label} | BAD | max |diff| / max |ref| {err:.3g}", flush=True)
            return
        ms = triton.testing.do_bench(call)
        print(
            f"{name} | {label} | {flops(m, n, k) / ms / 1e9:.0f} TFLOP/s | {ms:.4f} ms | rel err {err:.2g}", flush=True
        )

    for label, kernel, kw in variants(m):
        launch = launcher(kernel)
        time_row(label, lambda launch=launch, kw=kw: launch(qa, qw.T, sa, sw, None, None, c, **kw), ref)
    if k % 128 == 0:
        (qb, sba), (qwb, swb) = quantized(x, "1x128"), quantized(w, "128x128")
        rows_b = torch.arange(n, device="cuda") // 128
        wb = (qwb.float().view(n, k // 128, 128) * swb[rows_b][:, :, None]).view(n, k)
        want = (qb.float().view(m, k // 128, 128) * sba[:, :, None]).view(m, k) @ wb.T
        time_row("block 1x128 / 128x128 (table)", lambda: launch_fp8_matmul(qb, qwb.T, sba, swb.T, None, None, c), want)
    time_row(
        "torch._scaled_mm row-wise (peer)",
        lambda: torch._scaled_mm(qa, qw.T, scale_a=sa[:, None], scale_b=sw[None, :], out_dtype=torch.bfloat16),
        ref,
    )
    time_row(
        "torch._scaled_mm row-wise, use_fast_accum (peer)",
        lambda: torch._scaled_mm(
            qa, qw.T, scale_a=sa[:, None], scale_b=sw[None, :], out_dtype=torch.bfloat16, use_fast_accum=True
        ),
        ref,
    )
    one = torch.ones((), device="cuda")
    time_row(
        "torch._scaled_mm tensor-wise (peer, unit scales)",
        lambda: torch._scaled_mm(qa, qw.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        (qa.float() @ qw.float().T).to(torch.bfloat16),
    )
    time_row("cuBLAS bf16 (x @ W^T)", lambda: x @ w.T, x @ w.T)


def compile_configs():
    """ptxas's (registers, spill bytes) for sm_90a of each config, row-wise promoted and not, and
    the table's block-scaled kernel: JITFunction.run captured, each launch compiled for the target
    (scripts/gluon_compile.py's compile_case)."""
    os.environ["TRITON_INTERPRET"] = "0"  # before llmk reads it: compile for the GPU without one
    import torch
    from triton.runtime.jit import JITFunction

    from llmk.gemm.fp8_ops import FP8
    from llmk.gemm.triton_fp8_matmul import launch_fp8_matmul
    from llmk.scripts.gluon_compile import compile_case, ptxas_report

    captured = []
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: captured.append((self, args, kwargs))
    m = n = k = 4096
    a, w, c = torch.empty(m, k, dtype=FP8), torch.empty(n, k, dtype=FP8), torch.empty(m, n, dtype=torch.bfloat16)
    row = (torch.empty(m), torch.empty(n))
    block = (torch.empty(m, k // 128), torch.empty(n // 128, k // 128).T)
    cases = [(label, launcher(kernel), row, kw) for label, kernel, kw in variants(m)]
    cases.append(("ptr block (table)", launch_fp8_matmul, block, {}))
    for label, launch, (sa, sb), kw in cases:
        captured.clear()
        launch(a, w.T, sa, sb, None, None, c, **kw)
        compiled = compile_case(*captured[0])
        ptx = compiled.asm["ptx"]
        regs, spills = ptxas_report(ptx)
        waits = len(re.findall(r"wgmma\.wait_group", ptx))
        print(
            f"{label}: {regs} registers, {spills} bytes spilled, shared {compiled.metadata.shared}, "
            f"{waits} wgmma waits",
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    parser.add_argument("--compile", action="store_true", help="ptxas's registers and spills, no GPU")
    args = parser.parse_args()
    if args.compile:
        return compile_configs()
    for group in args.shapes.split(","):
        if group not in SHAPES:
            parser.error(f"--shapes: unknown {group!r}; expected a comma list of {', '.join(SHAPES)}")
    for group in args.shapes.split(","):
        for m, n, k in SHAPES[group]:
            shape_rows(m, n, k)


if __name__ == "__main__":
    main()
