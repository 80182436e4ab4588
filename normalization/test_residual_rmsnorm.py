"""Tests for normalization/residual_rmsnorm_ops.py: u against x + residual, y against the fp64
RMSNorm of u as stored (rounded to the input dtype), and both against PyTorch's add + F.rms_norm;
the gradients (dx, dresidual, dweight) through both outputs, or y alone (du = None); with a weight
and without one (weight None).

    python normalization/test_residual_rmsnorm.py   (or: pytest normalization/test_residual_rmsnorm.py)
"""

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
    gemma_cases,
    grad_cases,
    grad_tol,
    huge_rows,
    no_weight_cases,
    norm_cases,
)
from llmk.normalization.reference_rmsnorm import rmsnorm_ref
from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm
from llmk.normalization.rmsnorm_cases import as_double, rms_grad_atol, torch_weight, weight_or_none

EPS = 1e-6


def outcomes(x, r, w, y, u, with_torch=True, offset=0.0):
    u_ref = x.double() + r.double()
    y_ref = rmsnorm_ref(u.double(), as_double(w), EPS, offset)  # normalize u as it was stored
    torch_u = x + r
    torch_y = F.rms_norm(torch_u, (x.shape[-1],), torch_weight(w, offset), EPS) if with_torch else None
    return [compare("u", u, u_ref, torch_out=torch_u), compare("y", y, y_ref, torch_out=torch_y)]


def check(shape, dtype, pad=None, scale=1.0, weight_dtype=None, offset=0.0, weight_scale=1.0, affine=True):
    """offset, weight_scale: Gemma's form, y = rmsnorm(u) * (offset + weight), its weights near 0.
    affine=False: weight None, y = rmsnorm(u) whatever the offset."""
    # Large-value cases halve each input so x + residual stays inside fp16's range (65504; past it
    # u = inf is the right answer, as in PyTorch) while the squares still overflow fp16.
    scale = scale / 2 if scale > 1 else scale
    x = rand(shape, dtype, pad=pad, scale=scale)
    r = rand(shape, dtype, pad=pad, scale=scale)
    w = weight_or_none(shape, weight_dtype or dtype, affine, weight_scale)
    y, u = residual_rmsnorm(
        x, r, w, EPS, out=poisoned(shape, dtype), residual_out=poisoned(shape, dtype), offset=offset
    )
    return outcomes(x, r, w, y, u, with_torch=weight_dtype is None, offset=offset)


def check_own_buffer():
    x, r, w = rand((9, 41), torch.float16), rand((9, 41), torch.float16), rand((41,), torch.float16)
    y, u = residual_rmsnorm(x, r, w, EPS)
    return outcomes(x, r, w, y, u)


def check_huge(n_cols):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    x, r = rand((rows, n_cols), torch.float16), rand((rows, n_cols), torch.float16)
    w = rand((n_cols,), torch.float16)
    y, u = residual_rmsnorm(x, r, w, EPS, out=poisoned(x.shape, x.dtype), residual_out=poisoned(x.shape, x.dtype))
    return outcomes(x[-4:], r[-4:], w, y[-4:], u[-4:])


def check_errors():
    x, w = rand((4, 64), torch.float16), rand((64,), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("residual shape", lambda: residual_rmsnorm(x, x[:3], w), ValueError, "residual"),
        expect_raises("residual dtype", lambda: residual_rmsnorm(x, x.float(), w), ValueError, "residual"),
        expect_raises("int residual", lambda: residual_rmsnorm(x, x.to(torch.int16), w), TypeError, "residual"),
        expect_raises("residual elsewhere", lambda: residual_rmsnorm(x, x.to(other), w), ValueError, "residual"),
        expect_raises("weight size", lambda: residual_rmsnorm(x, x, w[:32]), ValueError, "weight"),
        expect_raises("int x", lambda: residual_rmsnorm(x.to(torch.int32), x, w), TypeError, "x"),
        expect_raises(
            "residual_out shape",
            lambda: residual_rmsnorm(x, x, w, residual_out=x[:1].clone()),
            ValueError,
            "residual_out",
        ),
        expect_raises(
            "residual_out= under grad (forward-only)",
            lambda: residual_rmsnorm(x, x.clone().requires_grad_(), w, residual_out=torch.empty_like(x)),
            RuntimeError,
            "without out/residual_out",
        ),
    ]


def check_empty():
    x, w = rand((0, 64), torch.float16), rand((64,), torch.float16)
    y, u = residual_rmsnorm(x, x, w)
    return [Outcome("empty in, empty out", y.shape == x.shape and u.shape == x.shape)]


def reference(dtype, outputs, offset=0.0):
    """The fp64 reference of the gradient checks: u rounded to `dtype` in the forward, as the
    kernel stores and normalizes it, with the identity as its derivative (rounding has none to
    follow); outputs "both" -> (y, u), "y" -> y alone."""

    def ref(x, r, w):
        u = x + r
        u = u + (u.to(dtype).to(u.dtype) - u).detach()
        y = rmsnorm_ref(u, w, EPS, offset)
        return (y, u) if outputs == "both" else y

    return ref


def check_grad(
    shape, dtype, pad=None, wrt=None, weight_dtype=None, outputs="both", offset=0.0, weight_scale=1.0, affine=True
):
    """Gradients through y and u (outputs="both") or y alone (u's gradient undefined: du = None),
    against the fp64 reference and PyTorch's add + F.rms_norm (2x rule). offset, weight_scale,
    affine: as check takes them (affine=False: dx and dresidual only)."""
    x, r = rand(shape, dtype, pad=pad), rand(shape, dtype, pad=pad)
    dy, du = rand(shape, dtype, pad=pad), rand(shape, dtype)
    w = weight_or_none(shape, weight_dtype or dtype, affine, weight_scale)
    u = (x.double() + r.double()).to(dtype)
    atol = rms_grad_atol(u, w, dy, du if outputs == "both" else None, offset)
    atol["residual"] = atol["x"]
    pick = (lambda y, u: (y, u)) if outputs == "both" else (lambda y, u: y)
    grad_outputs = [dy, du] if outputs == "both" else [dy]
    if not affine:
        ref = reference(dtype, outputs, offset)
        return check_grads(
            outputs,
            lambda x, r: pick(*residual_rmsnorm(x, r, None, EPS, offset=offset)),
            lambda x, r: ref(x, r, None),
            (x, r),
            (0, 1),
            ("x", "residual"),
            lambda name, _: grad_tol(dtype, atol[name]),
            torch_fn=lambda x, r: pick(F.rms_norm(x + r, (shape[-1],), None, EPS), x + r),
            grad_outputs=grad_outputs,
        )
    torch_fn = (
        (lambda x, r, w: pick(F.rms_norm(x + r, (shape[-1],), w + offset, EPS), x + r))
        if weight_dtype is None
        else None
    )
    return check_grads(
        outputs,
        lambda x, r, w: pick(*residual_rmsnorm(x, r, w, EPS, offset=offset)),
        reference(dtype, outputs, offset),
        (x, r, w),
        {"x": (0,), "weight": (2,)}.get(wrt, (0, 1, 2)),
        ("x", "residual", "weight"),
        lambda name, _: grad_tol(dtype if name != "weight" else w.dtype, atol[name]),
        torch_fn=torch_fn,
        grad_outputs=grad_outputs,
    )


def check_grad_empty():
    x, w = rand((0, 64), torch.bfloat16), rand((64,), torch.bfloat16)
    return check_grads(
        "empty",
        lambda x, r, w: residual_rmsnorm(x, r, w, EPS),
        reference(torch.bfloat16, "both"),
        (x, x.clone(), w),
        (0, 1, 2),
        ("x", "residual", "weight"),
        TOLERANCES[torch.bfloat16],
    )


def check_grad_huge(n_cols):
    """Past 2^31 elements (bf16): dx of the last rows, where a 32-bit offset would wrap, and
    dweight over every row (fp64, a chunk of rows at a time)."""
    rows = huge_rows(n_cols)
    x, r = rand((rows, n_cols), torch.bfloat16), rand((rows, n_cols), torch.bfloat16)
    dy, du, w = (
        rand((rows, n_cols), torch.bfloat16),
        rand((rows, n_cols), torch.bfloat16),
        rand((n_cols,), torch.bfloat16),
    )
    leaves = [t.detach().requires_grad_() for t in (x, r, w)]
    y, u = residual_rmsnorm(*leaves, EPS)
    dx, dw = torch.autograd.grad((y, u), (leaves[0], leaves[2]), (dy, du))
    del y
    u = u.detach()
    last = [t.detach().double().requires_grad_() for t in (u[-4:], w)]
    (dx_ref,) = torch.autograd.grad(rmsnorm_ref(*last, EPS), last[:1], dy[-4:].double())

    def terms(start, stop):
        ud = u[start:stop].double()
        return dy[start:stop].double() * ud * torch.rsqrt(ud.pow(2).mean(-1, keepdim=True) + EPS)

    dw_ref, dw_atol = chunked_param_grad(rows, terms, 2**26 // n_cols)
    return [
        compare(
            "dx, last rows",
            dx[-4:],
            dx_ref + du[-4:].double(),
            tol=grad_tol(torch.bfloat16, rms_grad_atol(u[-4:], w, dy[-4:], du[-4:])["x"]),
        ),
        compare("dweight", dw, dw_ref, tol=grad_tol(torch.bfloat16, dw_atol)),
    ]


CASES = norm_cases(check, check_own_buffer, check_errors, check_empty, check_huge, huge_gb=23)  # 21.5 GB printed
CASES += grad_cases(check_grad, check_grad_empty, check_grad_huge, huge_gb=32)  # 30.1 GB printed
CASES += [
    Case(f"grad {shape} {dtype_name(dtype)} y only", check_grad, dict(shape=shape, dtype=dtype, outputs="y"))
    for shape, dtype in (((7, 123), torch.bfloat16), ((4, 4500), torch.float32))
]
CASES += gemma_cases(check, check_grad)
CASES += no_weight_cases(check, check_grad)
CASES.append(
    Case(
        "grad (7, 123) bf16 weight=None y only",
        check_grad,
        dict(shape=(7, 123), dtype=torch.bfloat16, outputs="y", affine=False),
    )
)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("residual_rmsnorm", CASES)
