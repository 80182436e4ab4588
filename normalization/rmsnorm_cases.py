"""RMSNorm checks for any implementation `impl(x, weight, eps, out=None)`: the Triton kernel
(normalization/test_rmsnorm.py) and the CUDA one (cuda_cpp/test_cuda_kernels.py); the gradient
checks (check_grad*) for an implementation with a backward."""

import torch
import torch.nn.functional as F

from llmk.devtools.testing import TOLERANCES, check_grads, compare, grads_of, poisoned, rand
from llmk.normalization.norm_cases import (
    U32,
    chunked_param_grad,
    dx_atol,
    grad_tol,
    huge_rows,
    param_grad_atol,
    x_hat_error,
)
from llmk.normalization.reference_rmsnorm import rmsnorm_ref

EPS = 1e-6


def offset_kwargs(offset):
    """impl's offset= argument, passed only where it is not 0: the CUDA kernel has none."""
    return {"offset": offset} if offset else {}


def weight_or_none(shape, dtype, affine, scale=1.0):
    """A fresh (N,) weight, or None for a norm without an affine weight (affine=False)."""
    return rand((shape[-1],), dtype, scale=scale) if affine else None


def as_double(t):
    return None if t is None else t.double()


def torch_weight(w, offset):
    """The weight F.rms_norm takes for ours: offset + weight, or None (no weight: offset ignored)."""
    return None if w is None else w + offset


def check(shape, dtype, impl, pad=None, scale=1.0, weight_dtype=None, offset=0.0, weight_scale=1.0, affine=True):
    """offset, weight_scale: Gemma's form, y = x * rstd * (offset + weight), its weights near 0.
    affine=False: weight None, y = x * rstd whatever the offset."""
    x = rand(shape, dtype, pad=pad, scale=scale)
    w = weight_or_none(shape, weight_dtype or dtype, affine, weight_scale)
    y = impl(x, w, EPS, out=poisoned(shape, dtype), **offset_kwargs(offset))
    ref = rmsnorm_ref(x.double(), as_double(w), EPS, offset)
    # PyTorch's own same-dtype result bounds our error; it needs weight and x in one dtype (and
    # rounds offset + weight to it)
    torch_out = F.rms_norm(x, (shape[-1],), torch_weight(w, offset), EPS) if weight_dtype is None else None
    return [compare("y", y, ref, torch_out=torch_out)]  # inf/NaN where ref is finite fails too


def check_own_buffer(impl):
    x, w = rand((9, 41), torch.float16), rand((41,), torch.float16)
    return [compare("y", impl(x, w, EPS), rmsnorm_ref(x.double(), w.double(), EPS))]


def check_huge(n_cols, impl):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    x, w = rand((rows, n_cols), torch.float16), rand((n_cols,), torch.float16)
    y = impl(x, w, EPS, out=poisoned((rows, n_cols), torch.float16))
    return [compare("last rows", y[-4:], rmsnorm_ref(x[-4:].double(), w.double(), EPS))]


def x_hat(x, eps=EPS):
    """x * rstd in fp64."""
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)


def rms_grad_atol(x, w, dy, du=None, offset=0.0):
    """Per-element fp32 error bounds of RMSNorm's dx (plus du, one more rounding) and dweight
    (norm_cases' error model), in fp64. w None: no weight (g = dy)."""
    xd, dyd = x.double(), dy.double()
    rstd = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)
    atol = dx_atol(xd * rstd, dyd * (offset + w.double()) if w is not None else dyd, rstd)
    if du is not None:
        atol = atol + 2 * U32 * du.double().abs()
    x_hat = xd * rstd
    return dict(x=atol, weight=param_grad_atol(dyd * x_hat, dyd.abs() * x_hat_error(xd, x_hat, rstd)))


def check_grad(shape, dtype, impl, pad=None, wrt=None, weight_dtype=None, offset=0.0, weight_scale=1.0, affine=True):
    """Gradients of impl(x, weight, EPS) against autograd through the fp64 reference, and against
    PyTorch's F.rms_norm in the same dtype (2x rule). x and dy are strided views when pad is given.
    wrt: "x" or "weight" for that gradient alone (the other is not wanted), default both.
    offset, weight_scale: Gemma's form, as check takes them. affine=False: weight None, dx only."""
    x, dy = rand(shape, dtype, pad=pad), rand(shape, dtype, pad=pad)
    if not affine:
        atol = rms_grad_atol(x, None, dy)["x"]
        return check_grads(
            "",
            lambda x: impl(x, None, EPS, **offset_kwargs(offset)),
            lambda x: rmsnorm_ref(x, None, EPS, offset),
            (x,),
            (0,),
            ("x",),
            grad_tol(dtype, atol),
            torch_fn=lambda x: F.rms_norm(x, (shape[-1],), None, EPS),
            grad_outputs=[dy],
        )
    w = rand((shape[-1],), weight_dtype or dtype, scale=weight_scale)
    atol = rms_grad_atol(x, w, dy, offset=offset)
    torch_fn = (lambda x, w: F.rms_norm(x, (shape[-1],), w + offset, EPS)) if weight_dtype is None else None
    return check_grads(
        "",
        lambda x, w: impl(x, w, EPS, **offset_kwargs(offset)),
        lambda x, w: rmsnorm_ref(x, w, EPS, offset),
        (x, w),
        {"x": (0,), "weight": (1,)}.get(wrt, (0, 1)),
        ("x", "weight"),
        lambda name, _: grad_tol(x.dtype if name == "x" else w.dtype, atol[name]),
        torch_fn=torch_fn,
        grad_outputs=[dy],
    )


def check_grad_empty(impl):
    x, w = rand((2, 0, 64), torch.bfloat16), rand((64,), torch.bfloat16)
    return check_grads(
        "empty",
        lambda x, w: impl(x, w, EPS),
        lambda x, w: rmsnorm_ref(x, w, EPS),
        (x, w),
        (0, 1),
        ("x", "weight"),
        TOLERANCES[torch.bfloat16],
    )


def check_grad_huge(n_cols, impl):
    """Past 2^31 elements (bf16): dx of the last rows, where a 32-bit offset would wrap, and
    dweight over every row."""
    rows = huge_rows(n_cols)
    x, dy, w = (
        rand((rows, n_cols), torch.bfloat16),
        rand((rows, n_cols), torch.bfloat16),
        rand((n_cols,), torch.bfloat16),
    )
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    dx, dw = torch.autograd.grad(impl(xg, wg, EPS), (xg, wg), dy)
    _, (dx_ref,) = grads_of(lambda x, w: rmsnorm_ref(x, w, EPS), (x[-4:], w), (0,), [dy[-4:]], dtype=torch.float64)
    dw_ref, dw_atol = chunked_param_grad(
        rows, lambda start, stop: dy[start:stop].double() * x_hat(x[start:stop]), 2**26 // n_cols
    )  # 64M fp64 values a chunk
    return [
        compare("dx, last rows", dx[-4:], dx_ref, tol=grad_tol(torch.bfloat16, rms_grad_atol(x[-4:], w, dy[-4:])["x"])),
        compare("dweight", dw, dw_ref, tol=grad_tol(torch.bfloat16, dw_atol)),
    ]
