"""MLP activations: bias + GELU and SwiGLU against PyTorch eager and torch.compile, as GB/s and as
a share of the copy bandwidth of the same run.

Providers: triton (mlp/triton_bias_gelu.py, mlp/triton_swiglu.py); eager, the op as a user writes
it in the input dtype (`F.gelu(x + bias)`, `F.silu(gate) * up`: two kernels each); torch.compile
of that same function.

Bytes moved (e = element size, M tokens of hidden size O or I; only the bytes a fused kernel must
move, so eager's extra round trip shows as a lower figure):
    bias_gelu, bias_gelu_tanh   read x, write y, read bias:   2*M*O*e + O*e
    swiglu                      read gate and up, write y:    3*M*I*e

Sweeps: hidden sizes of real MLPs (4096, 11008, 14336, 16384, 28672) at 4096 tokens; tokens 1..16384
at hidden size 14336. fp16 and bf16 (the tanh form in fp16 only, to keep the run short).
    python benchmarks/mlp_bench.py            (GPU; writes benchmarks/results/mlp.json and PNGs)
    python benchmarks/mlp_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
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
from mlp.gelu import bias_gelu_ref, swiglu_ref  # noqa: E402
from mlp.triton_bias_gelu import bias_gelu  # noqa: E402
from mlp.triton_swiglu import swiglu  # noqa: E402

FULL_SWEEPS = [
    ("hidden size (4096 tokens)", [(n, (4096, n)) for n in (4096, 11008, 14336, 16384, 28672)]),
    ("tokens (hidden size 14336)", [(m, (m, 14336)) for m in (1, 64, 1024, 4096, 8192, 16384)]),
]
SMOKE_SWEEPS = [("hidden size", [(n, (4, n)) for n in (64, 1000)]),
                ("tokens", [(m, (m, 256)) for m in (1, 3)])]


def eager_bias_gelu(x, bias):
    return F.gelu(x + bias)


def eager_bias_gelu_tanh(x, bias):
    return F.gelu(x + bias, approximate="tanh")


def eager_swiglu(gate, up):
    return F.silu(gate) * up


# op -> (dtypes, inputs (m, n, dtype), triton, eager, fp32 reference, bytes(m, n, e))
OPS = {
    "bias_gelu": ((torch.float16, torch.bfloat16),
                  lambda m, n, dt: (torch.randn(m, n, device=DEVICE).to(dt), torch.randn(n, device=DEVICE).to(dt)),
                  bias_gelu, eager_bias_gelu, bias_gelu_ref,
                  lambda m, n, e: 2 * m * n * e + n * e),
    "bias_gelu_tanh": ((torch.float16,),
                       lambda m, n, dt: (torch.randn(m, n, device=DEVICE).to(dt), torch.randn(n, device=DEVICE).to(dt)),
                       lambda x, b: bias_gelu(x, b, "tanh"), eager_bias_gelu_tanh,
                       lambda x, b: bias_gelu_ref(x, b, "tanh"),
                       lambda m, n, e: 2 * m * n * e + n * e),
    "swiglu": ((torch.float16, torch.bfloat16),
               lambda m, n, dt: tuple(torch.randn(m, n, device=DEVICE).to(dt) for _ in range(2)),
               swiglu, eager_swiglu, swiglu_ref,
               lambda m, n, e: 3 * m * n * e),
}


def measure(sweeps, smoke):
    """Time every op, dtype, shape and provider; returns (meta, rows)."""
    shapes = list(dict.fromkeys(s for _, points in sweeps for _, s in points))
    meta = start_run(smoke)
    copy_GBps = meta["copy_GBps"]
    rows = []
    for op, (dtypes, make_inputs, kernel, eager, ref, n_bytes) in OPS.items():
        providers = {"triton": kernel, "eager": eager, "torch.compile": compile_fn(eager)}
        for dtype in dtypes[:1] if smoke else dtypes:  # smoke: the code path once, compiles are slow on a CPU
            for m, n in shapes:
                inputs = make_inputs(m, n, dtype)
                expected = ref(*(t.float() for t in inputs))  # fp32 math, fp32 result
                for provider, fn in providers.items():
                    err = (fn(*inputs).float() - expected).abs().max().item()  # also the warm-up
                    ms = time_ms(lambda: fn(*inputs))
                    row = make_row(op, shape_str((m, n)), dtype_name(dtype), provider, ms, copy_GBps,
                                   n_bytes=n_bytes(m, n, inputs[0].element_size()), max_err=err)
                    rows.append(row)
                    print(f"{op:15s} {row['shape']:>11s} {row['dtype']} {provider:14s} {ms:9.4f} ms "
                          f"{row['GBps']:8.1f} GB/s {row['pct_copy']:5.1f}% of copy  err {err:.2g}", flush=True)
                del inputs, expected
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()  # the largest shapes need the memory the last ones held
    return meta, rows


def main():
    args = parse_args(__doc__.splitlines()[0])
    sweeps = SMOKE_SWEEPS if args.smoke else FULL_SWEEPS
    meta, rows = load_or_measure(args, "mlp", lambda: measure(sweeps, args.smoke))
    for op, dtype in dict.fromkeys((r["op"], r["dtype"]) for r in rows):
        sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
        plot_sweeps(args.out / f"mlp_{op}_{dtype}.png", f"{op} {dtype}", sel, sweeps, meta)


if __name__ == "__main__":
    main()
