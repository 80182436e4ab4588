"""PyTorch references for bias + GELU (exact and tanh), SwiGLU and GeGLU.

The math runs in fp32 (or fp64 when given fp64 inputs, as the tests do) and is cast to the input
dtype once, as the fused kernels do. PyTorch's own same-dtype calls round in between: eager
`F.gelu(x + bias)` rounds x + bias first, `F.silu(gate) * up` rounds silu(gate) first (and
`F.gelu(gate) * up` gelu(gate)).
"""

import math

import torch

APPROXIMATIONS = ("none", "tanh")


def check_approximate(approximate):
    """`approximate` must name one of F.gelu's two formulas."""
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be 'none' (erf) or 'tanh', got {approximate!r}")


def _compute_dtype(t):
    return torch.promote_types(t.dtype, torch.float32)


def _gelu(xf, approximate):
    """GELU of xf, already in the compute dtype.
    none: 0.5 * x * (1 + erf(x / sqrt(2)))
    tanh: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
    """
    check_approximate(approximate)
    if approximate == "none":
        return 0.5 * xf * (1.0 + torch.erf(xf * math.sqrt(0.5)))
    return 0.5 * xf * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (xf + 0.044715 * xf.pow(3))))


def bias_gelu_ref(x, bias, approximate="none"):
    """y = gelu(x + bias), the sum kept in the compute dtype (no rounding before the GELU).
    x (..., O), bias (O,) or None -> y like x."""
    xf = x.to(_compute_dtype(x))
    if bias is not None:
        xf = xf + bias.to(xf.dtype)
    return _gelu(xf, approximate).to(x.dtype)


def swiglu_ref(gate, up):
    """y = silu(gate) * up = gate * sigmoid(gate) * up.   gate, up (..., I) -> y like gate."""
    compute = _compute_dtype(gate)
    g = gate.to(compute)
    return (g * torch.sigmoid(g) * up.to(compute)).to(gate.dtype)


def geglu_ref(gate, up, approximate="tanh"):
    """y = gelu(gate) * up, GELU's tanh form (Gemma's) or exact one ("none").
    gate, up (..., I) -> y like gate."""
    compute = _compute_dtype(gate)
    return (_gelu(gate.to(compute), approximate) * up.to(compute)).to(gate.dtype)
