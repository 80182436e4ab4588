"""MLP activations: bias + GELU, SwiGLU and GeGLU against PyTorch eager and torch.compile, as GB/s and as
a share of the copy bandwidth of the same run.

Providers: triton (mlp/triton_bias_gelu.py, mlp/triton_glu.py); eager, the op as a user writes
it in the input dtype (`F.gelu(x + bias)`, `F.silu(gate) * up`, `F.gelu(gate, approximate="tanh") * up`:
two kernels each); torch.compile
of that same function.

Bytes moved (e = element size, M tokens of hidden size O or I; only the bytes a fused kernel must
move, so eager's extra round trip shows as a lower figure; benchmarks/sweeps.py):
    bias_gelu, bias_gelu_tanh   read x, write y, read bias:   2*M*O*e + O*e
    swiglu, geglu               read gate and up, write y:    3*M*I*e

Sweeps: hidden sizes of real MLPs (4096, 11008, 14336, 16384, 28672) at 4096 tokens; tokens 1..16384
at hidden size 14336. fp16 and bf16 (the tanh form in fp16 only, to keep the run short; smoke: the
first dtype of each op; GeGLU, Gemma's tanh form, in bf16 only). max_err: against the reference in fp32.

Training rows (bf16, mode "fwd+bwd" and "bwd", peak_MB; MLP_TRAIN_SWEEPS): the gradients of both
inputs against autograd through the fp32 reference, on one set of upstream gradients dy for every
provider. Bytes (the issue's counting; the bias and dbias's fp32 partial sums are not counted):
    swiglu, geglu    fwd+bwd: read gate, up, write y; read gate, up, dy, write dgate, dup:  8*M*I*e
                     bwd:     read gate, up and dy, write dgate and dup:                    5*M*I*e
    bias_gelu(_tanh) fwd+bwd: read x, write y; read x and dy, write dx:                     5*M*O*e
                     bwd:     read x and dy, write dx:                                      3*M*O*e
Providers: triton, eager, torch.compile (as above), and for swiglu and geglu Liger-Kernel's
LigerSiLUMulFunction and LigerGELUMulFunction (skipped where not installed; Liger has no bias + GELU).
Liger writes dgate and
dup into the saved gate and up, which are the benchmark's inputs: its rows run on copies of its own,
so the providers after it see the inputs they were given. peak_MB: the memory a call adds (y, the
gradients, scratch); Liger's in-place gradients add none, ours 2*M*I*e (mlp/triton_glu.py).
    python benchmarks/mlp_bench.py            (GPU; writes benchmarks/results/mlp.json and PNGs)
    python benchmarks/mlp_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/mlp_bench.py --only swiglu --dtype bf16   (a subset)
"""

import torch
import torch.nn.functional as F

from llmk.benchmarks.sweeps import (
    MLP_SMOKE_SWEEPS,
    MLP_SWEEPS,
    MLP_TRAIN_SMOKE_SWEEPS,
    MLP_TRAIN_SWEEPS,
    bias_gelu_bytes,
    shapes_of,
    swiglu_bytes,
)
from llmk.common.device import INTERPRET
from llmk.devtools.bench import compile_fn, compile_train_fn, train_call
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.peers import LIGER, liger_geglu, liger_swiglu
from llmk.devtools.results import plot_sweeps
from llmk.devtools.testing import grads_of, rand
from llmk.mlp.reference_mlp import bias_gelu_ref, geglu_ref, swiglu_ref
from llmk.mlp.triton_bias_gelu import bias_gelu
from llmk.mlp.triton_glu import geglu, swiglu


def eager_bias_gelu(x, bias):
    return F.gelu(x + bias)


def eager_bias_gelu_tanh(x, bias):
    return F.gelu(x + bias, approximate="tanh")


def eager_swiglu(gate, up):
    return F.silu(gate) * up


def eager_geglu(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def x_and_bias(m, n, dtype):
    return rand((m, n), dtype), rand((n,), dtype)


def gate_and_up(m, n, dtype):
    return rand((m, n), dtype), rand((m, n), dtype)


# op -> (dtypes, inputs (m, n, dtype), triton, eager, fp32 reference, bytes(m, n, e))
OPS = {
    "bias_gelu": (
        (torch.float16, torch.bfloat16),
        x_and_bias,
        bias_gelu,
        eager_bias_gelu,
        bias_gelu_ref,
        bias_gelu_bytes,
    ),
    "bias_gelu_tanh": (
        (torch.float16,),
        x_and_bias,
        lambda x, b: bias_gelu(x, b, "tanh"),
        eager_bias_gelu_tanh,
        lambda x, b: bias_gelu_ref(x, b, "tanh"),
        bias_gelu_bytes,
    ),
    "swiglu": ((torch.float16, torch.bfloat16), gate_and_up, swiglu, eager_swiglu, swiglu_ref, swiglu_bytes),
    "geglu": ((torch.bfloat16,), gate_and_up, geglu, eager_geglu, geglu_ref, swiglu_bytes),
}


def setup(make_inputs, ref, m, n, dtype):
    inputs = make_inputs(m, n, dtype)
    return inputs, ref(*(t.float() for t in inputs))  # fp32 math, fp32 result


def cases(sweeps, smoke):
    for op, (dtypes, make_inputs, kernel, eager, ref, n_bytes) in OPS.items():
        providers = {"triton": kernel, "eager": eager, "torch.compile": compile_fn(eager)}
        for dtype in dtypes[:1] if smoke else dtypes:  # smoke: the code path once, compiles are slow on a CPU
            for m, n in shapes_of(sweeps):
                yield BenchCase(
                    op,
                    (m, n),
                    dtype,
                    providers,
                    lambda make=make_inputs, ref=ref, m=m, n=n, dtype=dtype: setup(make, ref, m, n, dtype),
                    n_bytes=n_bytes(m, n, dtype.itemsize),
                )


TRAIN_DTYPE = torch.bfloat16
WRT = (0, 1)  # both inputs get gradients
# bytes(M, N, e) of fwd+bwd and of bwd (module docstring)
GATED_BYTES = (lambda m, n, e: 8 * m * n * e, lambda m, n, e: 5 * m * n * e)
BIAS_GELU_BYTES = (lambda m, n, e: 5 * m * n * e, lambda m, n, e: 3 * m * n * e)
# training op -> (its sweeps' key, bytes of fwd+bwd, of bwd, Liger's function or None)
TRAIN = {
    "swiglu": ("swiglu", *GATED_BYTES, liger_swiglu),
    "geglu": ("swiglu", *GATED_BYTES, liger_geglu),
    "bias_gelu": ("bias_gelu", *BIAS_GELU_BYTES, None),
    "bias_gelu_tanh": ("bias_gelu", *BIAS_GELU_BYTES, None),
}


def train_setup(make_inputs, ref, m, n):
    """(inputs + (upstream gradients,), the fp32 reference's gradients): one dy, made here, for
    every provider of the case."""
    inputs = make_inputs(m, n, TRAIN_DTYPE)
    dys = [rand((m, n), TRAIN_DTYPE)]
    _, grads = grads_of(ref, inputs, WRT, dys, dtype=torch.float32)
    return inputs + (dys,), grads


def bind_train(providers, mode):
    """Case.bind of a training row: train_call on the case's inputs; Liger on copies of them, since
    its backward overwrites the saved inputs with the gradients."""

    def bind(name, inputs):
        *tensors, dys = inputs
        if name == LIGER:
            tensors = [t.clone() for t in tensors]
        return train_call(providers[name], tensors, WRT, mode, dys)

    return bind


def train_cases(train_sweeps):
    for op, (sweep_key, fwd_bwd_bytes, bwd_bytes, liger_fn) in TRAIN.items():
        _, make_inputs, kernel, eager, ref, _ = OPS[op]
        for mode, n_bytes in (("fwd+bwd", fwd_bwd_bytes), ("bwd", bwd_bytes)):
            compiled = compile_train_fn(eager, mode)
            providers = {"triton": kernel, "eager": eager, "torch.compile": compiled}
            if liger_fn is not None:
                providers[LIGER] = (
                    liger_fn() if not INTERPRET else "liger: its kernels do not run in Triton's interpreter"
                )
            for m, n in shapes_of(train_sweeps[sweep_key]):
                yield BenchCase(
                    op,
                    (m, n),
                    TRAIN_DTYPE,
                    providers,
                    lambda make=make_inputs, ref=ref, m=m, n=n: train_setup(make, ref, m, n),
                    n_bytes=n_bytes(m, n, TRAIN_DTYPE.itemsize),
                    mode=mode,
                    peak=True,
                    bind=bind_train(providers, mode),
                )


def charts(args, sweeps, train_sweeps):
    def draw(meta, rows):
        forward = [r for r in rows if r.get("mode", "fwd") == "fwd"]
        for op, dtype in dict.fromkeys((r["op"], r["dtype"]) for r in forward):
            sel = [r for r in forward if r["op"] == op and r["dtype"] == dtype]
            plot_sweeps(args.out / f"mlp_{op}_{dtype}.png", f"{op} {dtype}", sel, sweeps, meta)
        for op, (sweep_key, *_) in TRAIN.items():
            sel = [r for r in rows if r["op"] == op and r.get("mode") == "fwd+bwd"]
            plot_sweeps(args.out / f"mlp_{op}_bf16_train.png", f"{op} bf16 fwd+bwd", sel, train_sweeps[sweep_key], meta)

    return draw


def main():
    args = parse_args(__doc__)
    sweeps = MLP_SMOKE_SWEEPS if args.smoke else MLP_SWEEPS
    train_sweeps = MLP_TRAIN_SMOKE_SWEEPS if args.smoke else MLP_TRAIN_SWEEPS
    run(
        args,
        "mlp",
        charts(args, sweeps, train_sweeps),
        cases=lambda: [*cases(sweeps, args.smoke), *train_cases(train_sweeps)],
    )


if __name__ == "__main__":
    main()
