"""Tests for normalization/triton_layernorm.py against the fp64 reference and F.layer_norm: the
output, and the gradients (dx, dweight, dbias) against autograd through the fp64 reference.

    python normalization/test_layernorm.py        (or: pytest normalization/test_layernorm.py)
"""

from dataclasses import replace

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE
from llmk.devtools.testing import (
    TOLERANCES,
    Case,
    Outcome,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    main,
    poisoned,
    rand,
)
from llmk.normalization.norm_cases import (
    chunked_param_grad,
    dx_atol,
    grad_cases,
    grad_tol,
    huge_rows,
    norm_cases,
    param_grad_atol,
    x_hat_error,
)
from llmk.normalization.reference_layernorm import layernorm_ref
from llmk.normalization.triton_layernorm import layernorm

EPS = 1e-5


def check(shape, dtype, pad=None, scale=1.0, weight_dtype=None, offset=0.0, affine=(True, True), lead=False):
    x = rand(shape, dtype, pad=pad, scale=scale)
    if offset:  # a large mean: E[x^2] - E[x]^2 would cancel here
        if lead:  # only the first eighth: the looped kernel's shift (first chunk's mean) is far off
            x[..., : shape[-1] // 8] += offset
        else:
            x = x + offset
    n = shape[-1]
    w = rand((n,), weight_dtype or dtype) if affine[0] else None
    b = rand((n,), weight_dtype or dtype) if affine[1] else None
    y = layernorm(x, w, b, EPS, out=poisoned(shape, dtype))
    ref = layernorm_ref(x.double(), None if w is None else w.double(), None if b is None else b.double(), EPS)
    torch_out = F.layer_norm(x, (n,), w, b, EPS) if weight_dtype is None else None
    # With a large mean the fp32 mean itself is off by up to an ulp of the offset (2^-23 * offset),
    # and x - mean carries that into y scaled by |weight| / std (~4 here): allow 2x that, 2^-20 * offset.
    # Cancellation (E[x^2] - E[x]^2) would be ~2^-24 * offset^2 / std^2 relative: 6% of y at 1000.
    # No rounding-bias check there: the fp32 mean's own error (up to an ulp of the offset) shifts
    # every (x - mean) of a row the same way, a shared bias of up to half an ulp of y, not of rounding.
    tol = replace(TOLERANCES[dtype], atol=TOLERANCES[dtype].atol + 2**-20 * offset, rounding_check=not offset)
    return [compare("y", y, ref, tol=tol, torch_out=torch_out)]  # inf/NaN where ref is finite fails too


def check_own_buffer():
    x, w, b = rand((9, 41), torch.float16), rand((41,), torch.float16), rand((41,), torch.float16)
    return [compare("y", layernorm(x, w, b, EPS), layernorm_ref(x.double(), w.double(), b.double(), EPS))]


def check_huge(n_cols):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    x, w, b = rand((rows, n_cols), torch.float16), rand((n_cols,), torch.float16), rand((n_cols,), torch.float16)
    y = layernorm(x, w, b, EPS, out=poisoned((rows, n_cols), torch.float16))
    return [compare("last rows", y[-4:], layernorm_ref(x[-4:].double(), w.double(), b.double(), EPS))]


def check_errors():
    x, w = rand((4, 64), torch.float16), rand((64,), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("weight size", lambda: layernorm(x, w[:63]), ValueError, "weight"),
        expect_raises("bias size", lambda: layernorm(x, w, w[:10]), ValueError, "bias"),
        expect_raises("int x", lambda: layernorm(x.to(torch.int64), w), TypeError, "x"),
        expect_raises("int bias", lambda: layernorm(x, w, w.to(torch.int32)), TypeError, "bias"),
        expect_raises(f"x on {other}", lambda: layernorm(x.to(other)), ValueError, "x"),
        expect_raises("bias elsewhere", lambda: layernorm(x, w, w.to(other)), ValueError, "bias"),
        expect_raises("eps < 0", lambda: layernorm(x, w, eps=-1e-5), ValueError, "eps"),
        expect_raises("out dtype", lambda: layernorm(x, w, out=x.float()), ValueError, "out"),
        expect_raises(
            "out= under grad (forward-only)",
            lambda: layernorm(x.clone().requires_grad_(), w, out=torch.empty_like(x)),
            RuntimeError,
            "without out",
        ),
    ]


def check_empty():
    x = rand((2, 0, 64), torch.float32)
    y = layernorm(x, rand((64,), torch.float32))
    return [Outcome("empty in, empty out", y.shape == x.shape and y.dtype == x.dtype)]


def grad_atol(x, w, dy):
    """Per-element fp32 error bounds of dx, dweight, dbias (norm_cases' error model), in fp64."""
    xd, dyd = x.double(), dy.double()
    centred = xd - xd.mean(-1, keepdim=True)
    rstd = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + EPS)
    x_hat = centred * rstd
    g = dyd * w.double() if w is not None else dyd
    return dict(
        x=dx_atol(x_hat, g, rstd, centred=True),
        weight=param_grad_atol(dyd * x_hat, dyd.abs() * x_hat_error(xd, x_hat, rstd, centred=True)),
        bias=param_grad_atol(dyd),
    )


def check_grad(shape, dtype, pad=None, wrt=None, weight_dtype=None, affine=(True, True), offset=0.0, lead=False):
    """Gradients against autograd through the fp64 reference and F.layer_norm's (2x rule); x and dy
    strided views when pad is given; wrt: one input's gradient alone; affine: weight, bias present;
    offset (on the first eighth of each row with lead): a large mean, as check's."""
    n = shape[-1]
    x, dy = rand(shape, dtype, pad=pad), rand(shape, dtype, pad=pad)
    if offset:
        x = x.clone()
        x[..., : n // 8 if lead else n] += offset
    w = rand((n,), weight_dtype or dtype) if affine[0] else None
    b = rand((n,), weight_dtype or dtype) if affine[1] else None
    atol = grad_atol(x, w, dy)
    present = [i for i, t in enumerate((x, w, b)) if t is not None]
    wrt = {"x": (0,), "weight": (1,), "bias": (2,)}[wrt] if wrt else tuple(present)
    torch_fn = (lambda x, w, b: F.layer_norm(x, (n,), w, b, EPS)) if weight_dtype is None else None
    return check_grads(
        "",
        lambda x, w, b: layernorm(x, w, b, EPS),
        lambda x, w, b: layernorm_ref(x, w, b, EPS),
        (x, w, b),
        wrt,
        ("x", "weight", "bias"),
        lambda name, _: grad_tol(x.dtype if name == "x" else (weight_dtype or dtype), atol[name]),
        torch_fn=torch_fn,
        grad_outputs=[dy],
    )


def check_grad_empty():
    x, w, b = rand((0, 64), torch.float16), rand((64,), torch.float16), rand((64,), torch.float16)
    return check_grads(
        "empty",
        lambda x, w, b: layernorm(x, w, b, EPS),
        lambda x, w, b: layernorm_ref(x, w, b, EPS),
        (x, w, b),
        (0, 1, 2),
        ("x", "weight", "bias"),
        TOLERANCES[torch.float16],
    )


def check_grad_huge(n_cols):
    """Past 2^31 elements (bf16): dx of the last rows, where a 32-bit offset would wrap, and dbias
    (the sum of dy over every row, in fp64 a chunk at a time)."""
    rows = huge_rows(n_cols)
    x, dy = rand((rows, n_cols), torch.bfloat16), rand((rows, n_cols), torch.bfloat16)
    w, b = rand((n_cols,), torch.bfloat16), rand((n_cols,), torch.bfloat16)
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    dx, _, db = torch.autograd.grad(layernorm(*leaves, EPS), leaves, dy)
    last = [t.detach().double().requires_grad_() for t in (x[-4:], w, b)]
    (dx_ref,) = torch.autograd.grad(layernorm_ref(*last, EPS), last[:1], dy[-4:].double())
    db_ref, db_atol = chunked_param_grad(rows, lambda start, stop: dy[start:stop].double(), 2**26 // n_cols)
    return [
        compare("dx, last rows", dx[-4:], dx_ref, tol=grad_tol(torch.bfloat16, grad_atol(x[-4:], w, dy[-4:])["x"])),
        compare("dbias", db, db_ref, tol=grad_tol(torch.bfloat16, db_atol)),
    ]


CASES = norm_cases(check, check_own_buffer, check_errors, check_empty, check_huge)
CASES += grad_cases(check_grad, check_grad_empty, check_grad_huge, huge_gb=23)  # 21.5 GB printed
# without weight or bias: the fused kernel in fp32 and bf16, the looped one in fp32 (8300: five
# chunks of 2048, the last partial)
AFFINE = {"no bias": (True, False), "bias only": (False, True), "no affine": (False, False)}
CASES += [
    Case(f"grad {shape} {dtype_name(dtype)} {name}", check_grad, dict(shape=shape, dtype=dtype, affine=AFFINE[name]))
    for shape, dtype, names in (
        ((7, 123), torch.float32, AFFINE),
        ((7, 123), torch.bfloat16, AFFINE),
        ((2, 8300), torch.float32, ("bias only", "no affine")),
    )
    for name in names
]
CASES.append(Case("grad (9, 41) fp16 wrt=bias", check_grad, dict(shape=(9, 41), dtype=torch.float16, wrt="bias")))
# a large mean in the looped backward, whose one pass over x sums x minus the first chunk's mean:
# on every value, and on the first eighth alone (that shift then far from the row's mean)
CASES += [
    Case(
        f"grad (2, 8300) fp32 {name}offset=1000",
        check_grad,
        dict(shape=(2, 8300), dtype=torch.float32, offset=1000.0, lead=lead),
    )
    for name, lead in (("", False), ("first eighth ", True))
]
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    # the fused kernel (123) and the looped one with 1, several and many chunks;
    # each with and without weight and bias
    for n in (123, 4096, 20000, 65537):
        CASES += [
            Case(
                f"(3, {n}) {dtype_name(dtype)} {name} offset=1000",
                check,
                dict(shape=(3, n), dtype=dtype, offset=1000.0, affine=affine),
            )
            for name, affine in (("w+b", (True, True)), ("no bias", (True, False)), ("no affine", (False, False)))
        ]
        CASES.append(
            Case(
                f"(3, {n}) {dtype_name(dtype)} first eighth offset=1000",
                check,
                dict(shape=(3, n), dtype=dtype, offset=1000.0, lead=True),
            )
        )


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("layernorm", CASES)
