"""Residual add + RMSNorm in one pass, as a pre-norm transformer block uses it:

    u = x + residual      (rounded to x's dtype: the skip stream the next block adds to)
    y = rmsnorm(u) * (offset + weight)      (offset 1: Gemma's form, triton_rmsnorm.py)
    y = rmsnorm(u)                          weight None (offset ignored, as in triton_rmsnorm.py)

Traffic: read x and residual, write u and y (4*N*e bytes a row) against 6*N*e for an add followed
by an RMSNorm. The kernel is the RMSNorm kernel with HAS_RESIDUAL set (triton_rmsnorm.py).

Backward, through both outputs, one kernel (llmk::residual_rmsnorm_backward, the RMSNorm backward
with HAS_DU): du_total = rmsnorm_backward(dy) + du, and dx = dresidual = du_total (one tensor,
returned for both, as autograd's own add does). Saved: u (an output, alive anyway as the next
block's skip) and weight. Traffic: read u, dy, du, write dx: 4*N*e a row (3*N*e when u's gradient
is undefined, du = None).
"""

import torch

from llmk.common.ops import define_op, define_ops
from llmk.common.validation import check_out, contiguous_like
from llmk.normalization.checks import check_norm_args, check_residual
from llmk.normalization.triton_norm_backward import launch_rmsnorm_backward
from llmk.normalization.triton_rmsnorm import launch_rmsnorm, weight_grad_buffer


def _backward_impl(dy, du, u, weight, eps, weight_grad, offset):
    dx = contiguous_like(u)
    dweight = weight_grad_buffer(u, weight, weight_grad)
    wanted = weight_grad and weight is not None
    launch_rmsnorm_backward(dy, u, weight, du, eps, dx, dweight if wanted else None, offset=offset)
    return dx, dweight


residual_rmsnorm_backward_op = define_op(
    "residual_rmsnorm_backward(Tensor dy, Tensor? du, Tensor u, Tensor? weight, float eps, bool weight_grad,"
    " float offset) -> (Tensor, Tensor)",
    _backward_impl,
    lambda dy, du, u, weight, eps, weight_grad, offset: (
        u.new_empty(u.shape),
        weight_grad_buffer(u, weight, weight_grad),
    ),
)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output[1], inputs.weight)  # u: the rounded sum the forward normalized
    ctx.eps, ctx.offset = inputs.eps, inputs.offset
    ctx.set_materialize_grads(False)  # an unused u gives du = None: not a tensor of zeros to read


def _backward(ctx, dy, du):
    u, weight = ctx.saved_tensors
    if dy is None and du is None:
        return None, None, None, None, None
    if dy is None:  # only u is used: y's gradient is zero (rare; not worth a kernel variant)
        dy = torch.zeros_like(u)
    wants_x, wants_residual, wants_weight = ctx.needs_input_grad[:3]
    dx, dweight = residual_rmsnorm_backward_op(
        dy, du, u, weight, eps=ctx.eps, weight_grad=wants_weight, offset=ctx.offset
    )
    return (dx if wants_x else None), (dx if wants_residual else None), (dweight if wants_weight else None), None, None


def _empty(x, residual, weight, eps, offset):
    """The operator's new outputs, y and u (its fake implementation too)."""
    return contiguous_like(x), contiguous_like(x)


def _into(x, residual, weight, eps, offset, y, u):
    """llmk::residual_rmsnorm_out's body: the kernel writing y and u."""
    launch_rmsnorm(x, residual, weight, eps, y, u, offset=offset)


residual_rmsnorm_op, residual_rmsnorm_out_op = define_ops(
    "residual_rmsnorm",
    "Tensor x, Tensor residual, Tensor? weight, float eps, float offset",
    _empty,
    _into,
    outs=("out", "residual_out"),
    backward=_backward,
    setup_context=_setup_context,
)


def residual_rmsnorm(x, residual, weight, eps=1e-6, out=None, residual_out=None, *, offset=0.0):
    """Operators llmk::residual_rmsnorm and llmk::residual_rmsnorm_out; differentiable in x,
    residual and weight through both outputs (llmk::residual_rmsnorm_backward); `out=` and
    `residual_out=` are forward-only.

    x, residual: (..., N), same shape and dtype (fp16, bf16, fp32), any row strides.
    weight: (N,), or None: no affine weight, y = rmsnorm(u) = u * rstd (offset then ignored).
    out, residual_out: optional contiguous buffers shaped like x.
    offset: added to the weight in fp32: 1.0 is Gemma's RMSNorm.
    Returns (y, u), both (..., N) in x's dtype, contiguous.
    """
    check_norm_args(x, weight, eps, offset=offset)
    check_residual(residual, x)
    if out is None and residual_out is None:
        return residual_rmsnorm_op(x, residual, weight, eps=float(eps), offset=float(offset))
    for name, buf in (("out", out), ("residual_out", residual_out)):
        if buf is not None:
            check_out(name, buf, x.shape, x.dtype, x.device)
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    u = residual_out if residual_out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_rmsnorm_out_op(x, residual, weight, eps=float(eps), offset=float(offset), out=y, residual_out=u)
    return y, u
