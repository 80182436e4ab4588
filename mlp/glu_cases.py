"""Gated-unit inputs and forward checks for any implementation `glu.fn(gate, up, out=None)`: the
Triton SwiGLU and GeGLU (mlp/test_glu.py) and the CUDA SwiGLU (cuda_cpp/test_cuda_kernels.py)."""

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from llmk.common.device import DEVICE
from llmk.devtools.testing import Outcome, compare, expect_raises, poisoned, rand
from llmk.mlp.mlp_cases import ONE_ROUNDING, every_value, huge_rows, overflow_expected


@dataclass(frozen=True)
class Glu:
    """One gated unit under test. fn(gate, up, out=None): the implementation, its activation's
    arguments bound; ref(gate, up): the reference, run on fp64 copies; eager(gate, up): PyTorch's
    same-dtype computation (it rounds act(gate) before the product), whose error bounds ours."""

    name: str
    fn: Callable
    ref: Callable
    eager: Callable


def inputs(shape, dtype, layout, pad, gate_scale, up_scale, up_pad=None):
    """gate, up of `shape` laid out as:
    separate    two tensors (gate a strided view when pad is given, up when up_pad is)
    fused       the two halves of one (..., 2I) buffer, as a fused gate/up projection returns them
    transposed  2-D views whose last dim is strided (copied once by the launcher)"""
    n = shape[-1]
    if layout == "fused":
        h = rand((*shape[:-1], 2 * n), dtype)
        return h[..., :n], h[..., n:]
    if layout == "transposed":
        return rand(shape[::-1], dtype).t(), rand(shape[::-1], dtype).t()
    return rand(shape, dtype, pad=pad, scale=gate_scale), rand(shape, dtype, pad=up_pad, scale=up_scale)


def check(shape, dtype, glu, layout="separate", pad=None, gate_scale=1.0, up_scale=1.0, up_pad=None):
    gate, up = inputs(shape, dtype, layout, pad, gate_scale, up_scale, up_pad)
    with overflow_expected() if gate_scale > 100 else contextlib.nullcontext():
        y = glu.fn(gate, up, out=poisoned(shape, dtype))
        torch_out = glu.eager(gate, up)
    ref = glu.ref(gate.double(), up.double())
    # inf/NaN where the reference is finite fails too
    return [compare("y", y, ref, ONE_ROUNDING[dtype], torch_out=torch_out)]


def check_extremes(dtype, glu):
    """act(-1e4) * up = 0 and act(1e4) * up = 1e4 * up (rounded once), for silu and either GELU;
    NaN in, NaN out."""
    pick = torch.randint(0, 3, (7, 129), device=DEVICE)
    gate = torch.tensor([-1e4, 1e4, float("nan")], device=DEVICE)[pick].to(dtype)
    up = rand(gate.shape, dtype)
    with overflow_expected():
        y = glu.fn(gate, up, out=poisoned(gate.shape, dtype))
    big = (gate.double() * up.double()).to(dtype)
    return [
        Outcome("act(-1e4) * up == 0", bool((y[pick == 0] == 0).all())),
        Outcome("act(1e4) * up == 1e4 * up", bool((y[pick == 1] == big[pick == 1]).all())),
        Outcome("act(NaN) * up is NaN", bool(y[pick == 2].isnan().all())),
    ]


def check_every_value(dtype, glu):
    """Every fp16 / bf16 gate value (fp32: a grid over [-100, 100]) with up in [-1, 1], so that no
    product overflows: both tails of the activation, subnormals, the largest values (in bf16 the
    tanh GELU's gate^3 overflows in fp32: the result is still 0 or gate)."""
    gate = every_value(dtype, fp32_limit=100.0)
    up = (torch.rand(gate.shape, device=DEVICE) * 2 - 1).to(dtype)
    with overflow_expected():
        y = glu.fn(gate, up, out=poisoned(gate.shape, dtype))
        torch_out = glu.eager(gate, up)
    return [compare("y", y, glu.ref(gate.double(), up.double()), ONE_ROUNDING[dtype], torch_out=torch_out)]


def check_own_buffer(glu):
    gate, up = rand((9, 41), torch.bfloat16), rand((9, 41), torch.bfloat16)
    return [compare("y", glu.fn(gate, up), glu.ref(gate.double(), up.double()), ONE_ROUNDING[gate.dtype])]


def check_huge(n_cols, glu):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    gate, up = rand((rows, n_cols), torch.float16), rand((rows, n_cols), torch.float16)
    y = glu.fn(gate, up, out=poisoned((rows, n_cols), torch.float16))
    ref = glu.ref(gate[-4:].double(), up[-4:].double())
    return [compare("last rows", y[-4:], ref, ONE_ROUNDING[torch.float16])]


def check_errors(glu):
    """The argument checks every gated unit shares (mlp/checks.py's check_swiglu_args, common.validation.check_out)."""
    gate, up = rand((4, 64), torch.float16), rand((4, 64), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    fn = glu.fn
    return [
        expect_raises("up shape", lambda: fn(gate, up[:, :63]), ValueError, "up"),
        expect_raises("up broadcast", lambda: fn(gate, up[:1]), ValueError, "up"),
        expect_raises("up dtype", lambda: fn(gate, up.float()), TypeError, "up"),
        expect_raises("int gate", lambda: fn(gate.to(torch.int32), up), TypeError, "gate"),
        expect_raises("int up", lambda: fn(gate, up.to(torch.int32)), TypeError, "up"),
        expect_raises(f"gate on {other}", lambda: fn(gate.to(other), up.to(other)), ValueError, "gate"),
        expect_raises("up elsewhere", lambda: fn(gate, up.to(other)), ValueError, "up"),
        expect_raises("not a tensor", lambda: fn(gate, [1.0]), TypeError, "up"),
        expect_raises("0-dim gate", lambda: fn(gate[0, 0], up[0, 0]), ValueError, "gate"),
        expect_raises("out shape", lambda: fn(gate, up, out=gate[:2].clone()), ValueError, "out"),
        expect_raises("out dtype", lambda: fn(gate, up, out=gate.float()), ValueError, "out"),
    ]


def check_empty(glu):
    outcomes = []
    for shape in ((0, 64), (2, 0, 64), (3, 0)):
        gate, up = rand(shape, torch.float16), rand(shape, torch.float16)
        y = glu.fn(gate, up)
        outcomes.append(Outcome(f"{shape}: empty in, empty out", y.shape == gate.shape and y.dtype == gate.dtype))
    return outcomes
