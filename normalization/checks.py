"""Argument checks of the row-wise norms (RMSNorm, LayerNorm, residual RMSNorm; the Triton kernels,
RMSNorm + linear in gemm/ and the CUDA comparison in cuda_cpp/)."""

import math

from llmk.common.validation import check_same_device, check_tensor


def check_norm_args(x, weight, eps, x_name="x", weight_name="weight", offset=0.0):
    """Argument checks of the row-wise norms (RMSNorm, LayerNorm; Triton and CUDA); returns N, the
    normalized size. weight may be None (no affine weight). offset: RMSNorm's, added to the weight."""
    check_tensor(x_name, x)
    n_cols = x.shape[-1]
    if weight is not None:
        check_tensor(weight_name, weight)
        check_same_device(weight_name, weight, x_name, x)
        if tuple(weight.shape) != (n_cols,):
            raise ValueError(
                f"{weight_name} must have shape ({n_cols},) to match the last dim of "
                f"{x_name} {tuple(x.shape)}; got {tuple(weight.shape)}"
            )
    if isinstance(eps, bool):  # a flag passed where eps goes would be taken as 1.0
        raise TypeError(f"eps must be a number, not a bool; got {eps!r}")
    if not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    if isinstance(offset, bool) or not isinstance(offset, (int, float)):
        raise TypeError(f"offset must be a number (1.0 for Gemma's RMSNorm), got {offset!r}")
    if not math.isfinite(offset):
        raise ValueError(f"offset must be finite, got {offset!r}")
    return n_cols


def check_residual(residual, x):
    """The residual of a residual-add norm: a tensor of x's shape, dtype and device."""
    check_tensor("residual", residual)
    check_same_device("residual", residual, "x", x)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual must match x: shape {tuple(x.shape)} dtype {x.dtype}; "
            f"got {tuple(residual.shape)} {residual.dtype}"
        )
