"""Row-wise norms: RMSNorm, LayerNorm, residual add + RMSNorm against PyTorch eager,
torch.compile and the vendor op, as GB/s and as a share of the copy bandwidth of the same run.

Bytes moved (e = element size, M rows of N; benchmarks/sweeps.py):
    rmsnorm           read x, write y, read weight:            2*M*N*e + N*e
    layernorm         read x, write y, read weight and bias:   2*M*N*e + 2*N*e
    residual_rmsnorm  read x and residual, write u and y:      4*M*N*e + N*e
max_err: the first output (y) against the reference in fp32.

Training rows (bf16, mode "fwd+bwd" and "bwd", peak_MB): the gradients of every input against
autograd through the fp32 reference, on the same upstream gradients for every provider. Bytes
(the issue's counting; weight, bias and the fp32 dweight partials are L2-sized and not counted):
    rmsnorm, layernorm  fwd+bwd: read x twice, write y, read dy, write dx:          5*M*N*e
                        bwd:     read x and dy, write dx:                           3*M*N*e
    residual_rmsnorm    fwd+bwd: forward 4*M*N*e, then read u, dy, du, write dx:    8*M*N*e
                        bwd:     read u, dy and du, write dx (= dresidual, one tensor): 4*M*N*e
Providers: triton, eager (the reference), torch.compile of it, the vendor op, and Liger-Kernel
(LigerRMSNormFunction with in_place=False: in place it would overwrite the shared upstream
gradient; LigerLayerNormFunction; LigerFusedAddRMSNormFunction), skipped where not installed.

Sweeps: hidden size N at 16384 rows; rows M at N = 4096; wide rows N = 32768..131072 at 4096 rows;
training: NORM_TRAIN_SWEEPS (16384 rows at N = 1024..8192, 2048 and 8192 rows at N = 5120, 4096 rows
at N = 32768 and 131072).
    python benchmarks/norm_bench.py            (GPU; writes benchmarks/results/norm.json and PNGs)
    python benchmarks/norm_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/norm_bench.py --only rmsnorm --dtype bf16 --csv norm.csv   (a subset)
"""

import torch
import torch.nn.functional as F

from llmk.benchmarks.sweeps import (
    NORM_SMOKE_SWEEPS,
    NORM_SWEEPS,
    NORM_TRAIN_SMOKE_SWEEPS,
    NORM_TRAIN_SWEEPS,
    layernorm_bytes,
    residual_rmsnorm_bytes,
    rmsnorm_bytes,
    shapes_of,
)
from llmk.common.device import INTERPRET
from llmk.devtools.bench import compile_fn, compile_train_fn, train_call
from llmk.devtools.harness import BenchCase, max_err, parse_args, run
from llmk.devtools.peers import LIGER, liger_layernorm, liger_residual_rmsnorm, liger_rmsnorm
from llmk.devtools.results import plot_sweeps
from llmk.devtools.testing import grads_of, rand
from llmk.normalization.reference_layernorm import layernorm_ref
from llmk.normalization.reference_rmsnorm import residual_rmsnorm_ref, rmsnorm_ref
from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm
from llmk.normalization.triton_layernorm import layernorm
from llmk.normalization.triton_rmsnorm import rmsnorm

DTYPES = (torch.float16, torch.bfloat16)
# op -> (inputs from (x, weight, bias, residual), kernel, reference, vendor name, vendor call, bytes(M, N, e))
OPS = {
    "rmsnorm": (
        lambda x, w, b, r: (x, w),
        rmsnorm,
        rmsnorm_ref,
        "F.rms_norm",
        lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
        rmsnorm_bytes,
    ),
    "layernorm": (
        lambda x, w, b, r: (x, w, b),
        layernorm,
        layernorm_ref,
        "F.layer_norm",
        lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
        layernorm_bytes,
    ),
    "residual_rmsnorm": (
        lambda x, w, b, r: (x, r, w),
        residual_rmsnorm,
        residual_rmsnorm_ref,
        "add+F.rms_norm",
        lambda x, r, w: (F.rms_norm(x + r, (x.shape[-1],), w, 1e-6), x + r),
        residual_rmsnorm_bytes,
    ),
}


def first(out):
    return out[0] if isinstance(out, tuple) else out


def setup(pick, ref, m, n, dtype):
    x, r = rand((m, n), dtype), rand((m, n), dtype)
    w, b = rand((n,), dtype), rand((n,), dtype)
    inputs = pick(x, w, b, r)
    return inputs, first(ref(*(t.float() for t in inputs)))  # fp32 math, fp32 result


def cases(sweeps):
    for op, (pick, kernel, ref, vendor_name, vendor, n_bytes) in OPS.items():
        providers = {"triton": kernel, "eager": ref, "torch.compile": compile_fn(ref), vendor_name: vendor}
        for dtype in DTYPES:
            for m, n in shapes_of(sweeps):
                yield BenchCase(
                    op,
                    (m, n),
                    dtype,
                    providers,
                    lambda pick=pick, ref=ref, m=m, n=n, dtype=dtype: setup(pick, ref, m, n, dtype),
                    n_bytes=n_bytes(m, n, dtype.itemsize),
                    compare=lambda out, expected: max_err(first(out), expected),
                )


TRAIN_DTYPE = torch.bfloat16
# op -> (positions of the inputs that get gradients, Liger's provider, bytes(M, N, e) of fwd+bwd, of bwd)
TRAIN = {
    "rmsnorm": ((0, 1), liger_rmsnorm, lambda m, n, e: 5 * m * n * e, lambda m, n, e: 3 * m * n * e),
    "layernorm": ((0, 1, 2), liger_layernorm, lambda m, n, e: 5 * m * n * e, lambda m, n, e: 3 * m * n * e),
    "residual_rmsnorm": (
        (0, 1, 2),
        liger_residual_rmsnorm,
        lambda m, n, e: 8 * m * n * e,
        lambda m, n, e: 4 * m * n * e,
    ),
}


def train_setup(pick, ref, wrt, m, n):
    """(inputs + (upstream gradients,), the fp32 reference's gradients): one set of upstream
    gradients, made here, for every provider of the case."""
    x, r = rand((m, n), TRAIN_DTYPE), rand((m, n), TRAIN_DTYPE)
    w, b = rand((n,), TRAIN_DTYPE), rand((n,), TRAIN_DTYPE)
    inputs = pick(x, w, b, r)
    with torch.no_grad():
        outs = ref(*inputs)
    dys = [rand(o.shape, TRAIN_DTYPE) for o in (outs if isinstance(outs, tuple) else (outs,))]
    _, grads = grads_of(ref, inputs, wrt, dys, dtype=torch.float32)
    return inputs + (dys,), grads


def train_cases(sweeps):
    for op, (wrt, liger_fn, fwd_bwd_bytes, bwd_bytes) in TRAIN.items():
        pick, kernel, ref, vendor_name, vendor, _ = OPS[op]
        for mode, n_bytes in (("fwd+bwd", fwd_bwd_bytes), ("bwd", bwd_bytes)):
            compiled = compile_train_fn(ref, mode)
            providers = {
                "triton": kernel,
                "eager": ref,
                "torch.compile": compiled,
                vendor_name: vendor,
                LIGER: (liger_fn() if not INTERPRET else "liger: its kernels do not run in Triton's interpreter"),
            }
            for m, n in shapes_of(sweeps):
                yield BenchCase(
                    op,
                    (m, n),
                    TRAIN_DTYPE,
                    providers,
                    lambda pick=pick, ref=ref, wrt=wrt, m=m, n=n: train_setup(pick, ref, wrt, m, n),
                    n_bytes=n_bytes(m, n, TRAIN_DTYPE.itemsize),
                    mode=mode,
                    peak=True,
                    bind=lambda name, inputs, providers=providers, wrt=wrt, mode=mode: train_call(
                        providers[name], inputs[:-1], wrt, mode, inputs[-1]
                    ),
                )


def charts(args, sweeps, train_sweeps):
    def draw(meta, rows):
        for op in OPS:
            for dtype in ("fp16", "bf16"):
                sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype and r.get("mode", "fwd") == "fwd"]
                plot_sweeps(args.out / f"norm_{op}_{dtype}.png", f"{op} {dtype}", sel, sweeps, meta)
            sel = [r for r in rows if r["op"] == op and r.get("mode") == "fwd+bwd"]
            plot_sweeps(args.out / f"norm_{op}_bf16_train.png", f"{op} bf16 fwd+bwd", sel, train_sweeps, meta)

    return draw


def main():
    args = parse_args(__doc__)
    sweeps = NORM_SMOKE_SWEEPS if args.smoke else NORM_SWEEPS
    train_sweeps = NORM_TRAIN_SMOKE_SWEEPS if args.smoke else NORM_TRAIN_SWEEPS
    run(args, "norm", charts(args, sweeps, train_sweeps), cases=lambda: [*cases(sweeps), *train_cases(train_sweeps)])


if __name__ == "__main__":
    main()
