"""Residual add + RMSNorm in one pass, as a pre-norm transformer block uses it:

    u = x + residual      (rounded to x's dtype: the skip stream the next block adds to)
    y = rmsnorm(u) * weight

Traffic: read x and residual, write u and y (4*N*e bytes a row) against 6*N*e for an add followed
by an RMSNorm. The kernel is the RMSNorm kernel with HAS_RESIDUAL set (triton_rmsnorm.py).
"""
import common  # noqa: F401  (interpreter switch before triton is imported)
import torch

from common.ops import define_ops
from common.validation import check_norm_args, check_out, check_same_device, check_tensor
from normalization.triton_rmsnorm import launch_rmsnorm


residual_rmsnorm_op, residual_rmsnorm_out_op = define_ops(
    "residual_rmsnorm", "Tensor x, Tensor residual, Tensor weight, float eps",
    lambda x, residual, weight, eps: (x.new_empty(x.shape), x.new_empty(x.shape)), launch_rmsnorm,
    outs=("out", "residual_out"))


def residual_rmsnorm(x, residual, weight, eps=1e-6, out=None, residual_out=None):
    """Operators llmk::residual_rmsnorm and llmk::residual_rmsnorm_out.

    x, residual: (..., N), same shape and dtype (fp16, bf16, fp32), any row strides.
    weight: (N,). out, residual_out: optional contiguous buffers shaped like x.
    Returns (y, u), both (..., N) in x's dtype, contiguous.
    """
    check_norm_args(x, weight, eps)
    check_tensor("residual", residual)
    check_same_device("residual", residual, "x", x)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual must match x: shape {tuple(x.shape)} dtype {x.dtype}; "
                         f"got {tuple(residual.shape)} {residual.dtype}")
    if out is None and residual_out is None:
        return residual_rmsnorm_op(x, residual, weight, float(eps))
    for name, buf in (("out", out), ("residual_out", residual_out)):
        if buf is not None:
            check_out(name, buf, x.shape, x.dtype, x.device)
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    u = residual_out if residual_out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_rmsnorm_out_op(x, residual, weight, float(eps), y, u)
    return y, u
