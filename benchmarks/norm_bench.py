"""Row-wise norms: RMSNorm, LayerNorm, residual add + RMSNorm against PyTorch eager,
torch.compile and the vendor op, as GB/s and as a share of the copy bandwidth of the same run.

Bytes moved (e = element size, M rows of N; benchmarks/sweeps.py):
    rmsnorm           read x, write y, read weight:            2*M*N*e + N*e
    layernorm         read x, write y, read weight and bias:   2*M*N*e + 2*N*e
    residual_rmsnorm  read x and residual, write u and y:      4*M*N*e + N*e
max_err: the first output (y) against the reference in fp32.

Sweeps: hidden size N at 16384 rows; rows M at N = 4096; wide rows N = 32768..131072 at 4096 rows.
    python benchmarks/norm_bench.py            (GPU; writes benchmarks/results/norm.json and PNGs)
    python benchmarks/norm_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/norm_bench.py --only rmsnorm --dtype bf16 --csv norm.csv   (a subset)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.sweeps import (NORM_SMOKE_SWEEPS, NORM_SWEEPS, layernorm_bytes,  # noqa: E402
                               residual_rmsnorm_bytes, rmsnorm_bytes, shapes_of)
from common.bench import compile_fn  # noqa: E402
from common.harness import Case, max_err, parse_args, run  # noqa: E402
from common.results import plot_sweeps  # noqa: E402
from common.testing import rand  # noqa: E402
from normalization.layernorm import layernorm_ref  # noqa: E402
from normalization.rmsnorm import residual_rmsnorm_ref, rmsnorm_ref  # noqa: E402
from normalization.triton_layernorm import layernorm  # noqa: E402
from normalization.triton_residual_rmsnorm import residual_rmsnorm  # noqa: E402
from normalization.triton_rmsnorm import rmsnorm  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16)
# op -> (inputs from (x, weight, bias, residual), kernel, reference, vendor name, vendor call, bytes(M, N, e))
OPS = {
    "rmsnorm": (lambda x, w, b, r: (x, w), rmsnorm, rmsnorm_ref, "F.rms_norm",
                lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), rmsnorm_bytes),
    "layernorm": (lambda x, w, b, r: (x, w, b), layernorm, layernorm_ref, "F.layer_norm",
                  lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), layernorm_bytes),
    "residual_rmsnorm": (lambda x, w, b, r: (x, r, w), residual_rmsnorm, residual_rmsnorm_ref, "add+F.rms_norm",
                         lambda x, r, w: (F.rms_norm(x + r, (x.shape[-1],), w, 1e-6), x + r),
                         residual_rmsnorm_bytes),
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
                yield Case(op, (m, n), dtype, providers, lambda pick=pick, ref=ref, m=m, n=n, dtype=dtype:
                           setup(pick, ref, m, n, dtype), n_bytes=n_bytes(m, n, dtype.itemsize),
                           compare=lambda out, expected: max_err(first(out), expected))


def charts(args, sweeps):
    def draw(meta, rows):
        for op in OPS:
            for dtype in ("fp16", "bf16"):
                sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
                plot_sweeps(args.out / f"norm_{op}_{dtype}.png", f"{op} {dtype}", sel, sweeps, meta)
    return draw


def main():
    args = parse_args(__doc__)
    sweeps = NORM_SMOKE_SWEEPS if args.smoke else NORM_SWEEPS
    run(args, "norm", charts(args, sweeps), cases=lambda: cases(sweeps))


if __name__ == "__main__":
    main()
