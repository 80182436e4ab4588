"""MLP activations: bias + GELU and SwiGLU against PyTorch eager and torch.compile, as GB/s and as
a share of the copy bandwidth of the same run.

Providers: triton (mlp/triton_bias_gelu.py, mlp/triton_swiglu.py); eager, the op as a user writes
it in the input dtype (`F.gelu(x + bias)`, `F.silu(gate) * up`: two kernels each); torch.compile
of that same function.

Bytes moved (e = element size, M tokens of hidden size O or I; only the bytes a fused kernel must
move, so eager's extra round trip shows as a lower figure; benchmarks/sweeps.py):
    bias_gelu, bias_gelu_tanh   read x, write y, read bias:   2*M*O*e + O*e
    swiglu                      read gate and up, write y:    3*M*I*e

Sweeps: hidden sizes of real MLPs (4096, 11008, 14336, 16384, 28672) at 4096 tokens; tokens 1..16384
at hidden size 14336. fp16 and bf16 (the tanh form in fp16 only, to keep the run short; smoke: the
first dtype of each op). max_err: against the reference in fp32.
    python benchmarks/mlp_bench.py            (GPU; writes benchmarks/results/mlp.json and PNGs)
    python benchmarks/mlp_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/mlp_bench.py --only swiglu --dtype bf16   (a subset)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.sweeps import (MLP_SMOKE_SWEEPS, MLP_SWEEPS, bias_gelu_bytes, shapes_of,  # noqa: E402
                               swiglu_bytes)
from common.bench import compile_fn  # noqa: E402
from common.harness import Case, parse_args, run  # noqa: E402
from common.results import plot_sweeps  # noqa: E402
from common.testing import rand  # noqa: E402
from mlp.gelu import bias_gelu_ref, swiglu_ref  # noqa: E402
from mlp.triton_bias_gelu import bias_gelu  # noqa: E402
from mlp.triton_swiglu import swiglu  # noqa: E402


def eager_bias_gelu(x, bias):
    return F.gelu(x + bias)


def eager_bias_gelu_tanh(x, bias):
    return F.gelu(x + bias, approximate="tanh")


def eager_swiglu(gate, up):
    return F.silu(gate) * up


def x_and_bias(m, n, dtype):
    return rand((m, n), dtype), rand((n,), dtype)


def gate_and_up(m, n, dtype):
    return rand((m, n), dtype), rand((m, n), dtype)


# op -> (dtypes, inputs (m, n, dtype), triton, eager, fp32 reference, bytes(m, n, e))
OPS = {
    "bias_gelu": ((torch.float16, torch.bfloat16), x_and_bias, bias_gelu, eager_bias_gelu, bias_gelu_ref,
                  bias_gelu_bytes),
    "bias_gelu_tanh": ((torch.float16,), x_and_bias, lambda x, b: bias_gelu(x, b, "tanh"), eager_bias_gelu_tanh,
                       lambda x, b: bias_gelu_ref(x, b, "tanh"), bias_gelu_bytes),
    "swiglu": ((torch.float16, torch.bfloat16), gate_and_up, swiglu, eager_swiglu, swiglu_ref, swiglu_bytes),
}


def setup(make_inputs, ref, m, n, dtype):
    inputs = make_inputs(m, n, dtype)
    return inputs, ref(*(t.float() for t in inputs))  # fp32 math, fp32 result


def cases(sweeps, smoke):
    for op, (dtypes, make_inputs, kernel, eager, ref, n_bytes) in OPS.items():
        providers = {"triton": kernel, "eager": eager, "torch.compile": compile_fn(eager)}
        for dtype in dtypes[:1] if smoke else dtypes:  # smoke: the code path once, compiles are slow on a CPU
            for m, n in shapes_of(sweeps):
                yield Case(op, (m, n), dtype, providers,
                           lambda make=make_inputs, ref=ref, m=m, n=n, dtype=dtype: setup(make, ref, m, n, dtype),
                           n_bytes=n_bytes(m, n, dtype.itemsize))


def charts(args, sweeps):
    def draw(meta, rows):
        for op, dtype in dict.fromkeys((r["op"], r["dtype"]) for r in rows):
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
            plot_sweeps(args.out / f"mlp_{op}_{dtype}.png", f"{op} {dtype}", sel, sweeps, meta)
    return draw


def main():
    args = parse_args(__doc__)
    sweeps = MLP_SMOKE_SWEEPS if args.smoke else MLP_SWEEPS
    run(args, "mlp", charts(args, sweeps), cases=lambda: cases(sweeps, args.smoke))


if __name__ == "__main__":
    main()
