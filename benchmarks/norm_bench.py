"""Row-wise norms: RMSNorm, LayerNorm, residual add + RMSNorm against PyTorch eager,
torch.compile and the vendor op, as GB/s and as a share of the copy bandwidth of the same run.

Bytes moved (e = element size, M rows of N):
    rmsnorm           read x, write y, read weight:            2*M*N*e + N*e
    layernorm         read x, write y, read weight and bias:   2*M*N*e + 2*N*e
    residual_rmsnorm  read x and residual, write u and y:      4*M*N*e + N*e

Sweeps: hidden size N at 16384 rows; rows M at N = 4096; wide rows N = 32768..131072 at 4096 rows.
    python benchmarks/norm_bench.py            (GPU; writes benchmarks/results/norm.json and PNGs)
    python benchmarks/norm_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common.bench import compile_fn, time_ms  # noqa: E402
from common.device import DEVICE  # noqa: E402
from common.results import load_or_measure, make_row, parse_args, plot_sweeps, shape_str, start_run  # noqa: E402
from common.testing import dtype_name  # noqa: E402
from normalization.layernorm import layernorm_ref  # noqa: E402
from normalization.rmsnorm import residual_rmsnorm_ref, rmsnorm_ref  # noqa: E402
from normalization.triton_layernorm import layernorm  # noqa: E402
from normalization.triton_residual_rmsnorm import residual_rmsnorm  # noqa: E402
from normalization.triton_rmsnorm import rmsnorm  # noqa: E402

FULL_SWEEPS = [
    ("hidden size N (16384 rows)", [(n, (16384, n)) for n in (512, 1024, 2048, 4096, 5120, 8192, 16384)]),
    ("rows M (N = 4096)", [(m, (m, 4096)) for m in (1, 16, 256, 1024, 4096, 16384, 32768)]),
    ("wide rows N (4096 rows)", [(n, (4096, n)) for n in (32768, 65536, 131072)]),
]
SMOKE_SWEEPS = [("hidden size N", [(n, (4, n)) for n in (64, 1000)]),
                ("rows M", [(m, (m, 256)) for m in (1, 3)])]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


# op -> (inputs from (x, weight, bias, residual), reference, vendor name, vendor call, bytes(M, N, e))
OPS = {
    "rmsnorm": (lambda x, w, b, r: (x, w), rmsnorm, rmsnorm_ref, "F.rms_norm",
                lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
                lambda m, n, e: 2 * m * n * e + n * e),
    "layernorm": (lambda x, w, b, r: (x, w, b), layernorm, layernorm_ref, "F.layer_norm",
                  lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
                  lambda m, n, e: 2 * m * n * e + 2 * n * e),
    "residual_rmsnorm": (lambda x, w, b, r: (x, r, w), residual_rmsnorm, residual_rmsnorm_ref, "add+F.rms_norm",
                         lambda x, r, w: (F.rms_norm(x + r, (x.shape[-1],), w, 1e-6), x + r),
                         lambda m, n, e: 4 * m * n * e + n * e),
}


def measure(sweeps, smoke):
    """Time every op, dtype, shape and provider; returns (meta, rows)."""
    shapes = list(dict.fromkeys(s for _, points in sweeps for _, s in points))
    meta = start_run(smoke)
    copy_GBps = meta["copy_GBps"]
    rows = []
    for op, (pick, kernel, ref, vendor_name, vendor, n_bytes) in OPS.items():
        compiled = compile_fn(ref)
        providers = {"triton": kernel, "eager": ref, "torch.compile": compiled, vendor_name: vendor}
        for dtype in (torch.float16, torch.bfloat16):
            for m, n in shapes:
                x, r = (torch.randn(m, n, device=DEVICE).to(dtype) for _ in range(2))
                w, b = (torch.randn(n, device=DEVICE).to(dtype) for _ in range(2))
                inputs = pick(x, w, b, r)
                expected = _first(ref(*(t.float() for t in inputs)))  # fp32 math, fp32 result
                for provider, fn in providers.items():
                    err = (_first(fn(*inputs)).float() - expected).abs().max().item()  # also the warm-up
                    ms = time_ms(lambda: fn(*inputs))
                    row = make_row(op, shape_str((m, n)), dtype_name(dtype), provider, ms, copy_GBps,
                                   n_bytes=n_bytes(m, n, x.element_size()), max_err=err)
                    rows.append(row)
                    print(f"{op:17s} {row['shape']:>12s} {row['dtype']} {provider:15s} {ms:9.4f} ms "
                          f"{row['GBps']:8.1f} GB/s {row['pct_copy']:5.1f}% of copy  err {err:.2g}", flush=True)
                del x, r, w, b, inputs, expected
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()  # the widest shapes need the memory the last ones held
    return meta, rows


def main():
    args = parse_args(__doc__.splitlines()[0])
    sweeps = SMOKE_SWEEPS if args.smoke else FULL_SWEEPS
    meta, rows = load_or_measure(args, "norm", lambda: measure(sweeps, args.smoke))
    for op in OPS:
        for dtype in ("fp16", "bf16"):
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
            plot_sweeps(args.out / f"norm_{op}_{dtype}.png", f"{op} {dtype}", sel, sweeps, meta)


if __name__ == "__main__":
    main()
