"""Hand-written CUDA C++ kernels (cuda_cpp/ops.py) against the Triton kernels on RMSNorm, RoPE and SwiGLU,
as GB/s and as a share of the copy bandwidth of the same run.

Sweeps and byte formulas are the per-op benchmarks' own (benchmarks/sweeps.py; e = element size):
    rmsnorm            read x, write y, read weight:  2*M*N*e + N*e
    rope,              read q, k, write q_out, k_out, read cos and sin once:
    rope_interleaved       2*(B*H*T*D + B*Hkv*T*D)*e + 2*T*D*e_c   (shapes B x H x Hkv x T x D)
    swiglu             read gate and up, write y:      3*M*I*e
Providers: triton (normalization/triton_rmsnorm.py, attention/triton_rope.py, mlp/triton_glu.py)
and cuda, on the same tensors; max_err is against the fp32 reference. Both are ours for the max_err
gate; its baseline is PyTorch's op in the input dtype (F.rms_norm, apply_rope_ref, F.silu(gate) * up),
run once untimed. The CUDA kernels are compiled first (well under a minute on a fresh machine; the
time is printed); the timings are do_bench medians of 50 ms.
    python benchmarks/cuda_vs_triton_bench.py          (GPU; benchmarks/results/cuda_vs_triton.json, PNGs)
    python benchmarks/cuda_vs_triton_bench.py --smoke  (tiny shapes; without a GPU, Triton in the
                                                        interpreter only: the CUDA kernels need one)
    python benchmarks/cuda_vs_triton_bench.py --only swiglu --dtype bf16   (a subset)
"""

import time

import torch
import torch.nn.functional as F

from llmk.attention.reference_rope import apply_rope_ref
from llmk.attention.triton_rope import apply_rope as triton_rope
from llmk.benchmarks.sweeps import (
    MLP_SMOKE_SWEEPS,
    MLP_SWEEPS,
    NORM_SMOKE_SWEEPS,
    NORM_SWEEPS,
    ROPE_SMOKE_SWEEPS,
    ROPE_SWEEPS,
    rmsnorm_bytes,
    rope_bytes,
    rope_inputs,
    shapes_of,
    swiglu_bytes,
)
from llmk.common.device import INTERPRET
from llmk.cuda_cpp import ops as cuda_kernels
from llmk.cuda_cpp.extension import extension, unavailable_reason
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.results import plot_sweeps
from llmk.devtools.testing import rand
from llmk.mlp.reference_mlp import swiglu_ref
from llmk.mlp.triton_glu import swiglu as triton_swiglu
from llmk.normalization.reference_rmsnorm import rmsnorm_ref
from llmk.normalization.triton_rmsnorm import rmsnorm as triton_rmsnorm

OURS = ("triton", "cuda")
# op -> (sweeps, smoke sweeps); both providers run every shape of every sweep
SWEEPS = {
    "rmsnorm": (NORM_SWEEPS, NORM_SMOKE_SWEEPS),
    "rope": (ROPE_SWEEPS["rope"], ROPE_SMOKE_SWEEPS["rope"]),
    "rope_interleaved": (ROPE_SWEEPS["rope_interleaved"], ROPE_SMOKE_SWEEPS["rope_interleaved"]),
    "swiglu": (MLP_SWEEPS, MLP_SMOKE_SWEEPS),
}
# op -> {provider: fn}; "eager" is the gate's untimed baseline
PROVIDERS = {
    "rmsnorm": {
        "triton": triton_rmsnorm,
        "cuda": cuda_kernels.rmsnorm,
        "eager": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
    },
    "rope": {"triton": triton_rope, "cuda": cuda_kernels.apply_rope, "eager": apply_rope_ref},
    "swiglu": {"triton": triton_swiglu, "cuda": cuda_kernels.swiglu, "eager": lambda gate, up: F.silu(gate) * up},
}


def setup(op, shape, dtype):
    """(inputs, fp32 reference) of one op at one shape."""
    if op == "rmsnorm":
        x, w = rand(shape, dtype), rand((shape[1],), dtype)
        return (x, w), rmsnorm_ref(x.float(), w.float())
    if op == "swiglu":
        gate, up = rand(shape, dtype), rand(shape, dtype)
        return (gate, up), swiglu_ref(gate.float(), up.float())
    q, k, cos, sin = rope_inputs(shape, dtype)
    interleaved = op == "rope_interleaved"
    return (q, k, cos, sin, interleaved), apply_rope_ref(q.float(), k.float(), cos.float(), sin.float(), interleaved)


# op -> bytes(shape, e)
BYTES = {
    "rmsnorm": lambda shape, e: rmsnorm_bytes(*shape, e),
    "rope": lambda shape, e: rope_bytes(*shape, e, e),  # cos and sin in the input dtype
    "swiglu": lambda shape, e: swiglu_bytes(*shape, e),
}


def cases(smoke, dtypes, with_cuda):
    for op, (full, small) in SWEEPS.items():
        kind = op.replace("_interleaved", "")
        providers = dict(PROVIDERS[kind])
        if not with_cuda:
            del providers["cuda"]
        for dtype in dtypes:
            for shape in shapes_of(small if smoke else full):
                yield BenchCase(
                    op,
                    shape,
                    dtype,
                    providers,
                    lambda op=op, shape=shape, dtype=dtype: setup(op, shape, dtype),
                    n_bytes=BYTES[kind](shape, dtype.itemsize),
                    untimed=("eager",),
                )


def summary(rows):
    """One line per op, dtype and shape: both providers' share of the copy bandwidth, and cuda / triton."""
    cell = {(r["op"], r["dtype"], r["shape"], r["provider"]): r for r in rows}
    if not any(r["provider"] == "cuda" for r in rows):
        return
    print(f"\n{'op':16s} {'dtype':5s} {'shape':>18s} {'triton %':>9s} {'cuda %':>7s} {'cuda/triton':>11s}")
    for (op, dtype, shape, provider), r in cell.items():
        cuda_row = cell.get((op, dtype, shape, "cuda"))
        if provider == "triton" and cuda_row:
            print(
                f"{op:16s} {dtype:5s} {shape:>18s} {r['pct_copy']:9.1f} {cuda_row['pct_copy']:7.1f} "
                f"{r['ms'] / max(cuda_row['ms'], 1e-9):11.2f}"
            )  # same bytes: speed ratio = time ratio


def charts(args):
    def draw(meta, rows):
        summary(rows)
        for op, (full, small) in SWEEPS.items():
            for dtype in dict.fromkeys(r["dtype"] for r in rows):
                sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
                plot_sweeps(
                    args.out / f"cuda_vs_triton_{op}_{dtype}.png",
                    f"{op} {dtype}: CUDA C++ vs Triton",
                    sel,
                    small if args.smoke else full,
                    meta,
                )

    return draw


def main():
    args = parse_args(__doc__, warmup_ms=10, rep_ms=50)
    reason = unavailable_reason() or ("TRITON_INTERPRET=1 puts the inputs on the CPU" if INTERPRET else None)
    if reason is not None:
        print(f"cuda provider skipped: {reason}", flush=True)
    elif not args.replot:
        t0 = time.perf_counter()
        extension()
        print(f"CUDA kernels built or loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    dtypes = (torch.float16,) if args.smoke else (torch.float16, torch.bfloat16)  # smoke: interpreter time
    run(args, "cuda_vs_triton", charts(args), cases=lambda: cases(args.smoke, dtypes, reason is None), ours=OURS)


if __name__ == "__main__":
    main()
