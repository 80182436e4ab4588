"""LayerNorm over the last dim in Triton, matching `F.layer_norm` (biased variance).

    y = (x - mean) * rsqrt(var + eps) * weight + bias       math in fp32, one cast

Traffic per row: read x (N*e), write y (N*e); weight and bias stay in L2.
The fused kernel (short rows, in registers) takes the variance of the centred values, so there is
no E[x^2] - E[x]^2 cancellation; the looped kernel does the same in three passes over the row
(mean, squared deviations, normalize), the second and third served from L1/L2.
normalization/launch_config.py picks the kernel and its launch.

Backward (normalization/triton_norm_backward.py, operator llmk::layernorm_backward): the forward
saves x and weight; mean and rstd are recomputed (read x, dy, write dx: 3*N*e a row).
"""

import triton
import triton.language as tl

from llmk.common.direct_launch import Launcher
from llmk.common.ops import define_op, define_ops
from llmk.common.triton_utils import col_mask
from llmk.common.validation import check_out, contiguous_like, rows_of
from llmk.normalization.checks import check_norm_args
from llmk.normalization.launch_config import row_config
from llmk.normalization.triton_norm_backward import launch_layernorm_backward


@triton.jit
def _layernorm_fused_kernel(
    # pointers
    x_ptr, w_ptr, b_ptr, y_ptr,
    # matrix dimensions and strides (in elements)
    n_rows, n_cols, stride_xm, stride_ym,
    eps,
    # meta-parameters
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < n_cols
    mask = (rows < n_rows)[:, None] & in_row[None, :]
    x = tl.load(
        x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
    ).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        y *= tl.load(w_ptr + cols, mask=in_row, other=0.0, eviction_policy="evict_last").to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=in_row, other=0.0, eviction_policy="evict_last").to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm_looped_kernel(
    # pointers
    x_ptr, w_ptr, b_ptr, y_ptr,
    # matrix dimensions and strides (in elements); compile-time constants, see below
    n_rows, n_cols: tl.constexpr, stride_xm: tl.constexpr, stride_ym: tl.constexpr,
    eps,
    # meta-parameters
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """One row per program in BLOCK_N chunks, three passes: the mean, the mean of squared
    deviations from it (the textbook two-pass variance: nothing cancels however large the mean),
    then normalize. Passes 2 and 3 re-read the row from L1/L2; each loop carries one accumulator.

    The row length and strides are compile-time constants, as in Inductor's static-shape kernels:
    one compile per (N, stride), and a model has a few. With them as runtime values this kernel
    ran 15-23% slower (docs/tuning/normalization.md).
    """
    row = tl.program_id(0).to(tl.int64)
    # pass 1: the mean; keep the row in L2 (evict_last) for passes 2 and 3
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        acc += tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(
            tl.float32
        )
    mean = tl.sum(acc, axis=0) / n_cols
    # pass 2: squared deviations from the mean
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        centred = tl.where(mask, x - mean, 0.0)
        acc += centred * centred
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    # pass 3: normalize, reading the row for the last time
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y *= tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(
            y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first"
        )  # y is not read again: keep L2 for x


# direct launches from a specialization's second on (common/direct_launch.py): at decode and
# micro-batch sizes a norm's host time is its cost
_fused, _looped = Launcher(_layernorm_fused_kernel), Launcher(_layernorm_looped_kernel)


def launch_layernorm(x, weight, bias, eps, y, cfg=None):
    """Launch on validated arguments: x (..., N); weight, bias (N,) or None; y a contiguous output
    shaped like x, written in place. cfg: a RowConfig to launch instead of row_config's choice
    (tuning sweeps); a fused one must hold the whole row (BLOCK_N >= N)."""
    if x.numel() == 0:
        return
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    x2, stride_x = rows_of(x)
    if cfg is None:
        cfg = row_config(n_rows, n_cols, x.element_size(), layernorm=True)
    # y is contiguous: row stride N. Absent weight/bias: x stands in as a never-read placeholder pointer
    args = (
        x2,
        weight.contiguous() if weight is not None else x2,
        bias.contiguous() if bias is not None else x2,
        y,
        n_rows,
        n_cols,
        stride_x,
        n_cols,
        eps,
    )
    if cfg.looped:
        _looped[(cfg.grid,)](
            *args,
            HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None,
            BLOCK_N=cfg.BLOCK_N,
            EVEN_N=n_cols % cfg.BLOCK_N == 0,
            num_warps=cfg.num_warps,
        )
    else:
        _fused[(cfg.grid,)](
            *args,
            HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None,
            BLOCK_M=cfg.BLOCK_M,
            BLOCK_N=cfg.BLOCK_N,
            num_warps=cfg.num_warps,
        )


def _grad_buffer(param, wanted):
    """A parameter's gradient output: (N,) in its dtype, or a 0-size placeholder when not wanted."""
    return contiguous_like(param) if wanted else param.new_empty((0,))


def _backward_impl(dy, x, weight, bias, eps, weight_grad, bias_grad):
    dx = contiguous_like(x)
    dweight = _grad_buffer(weight if weight is not None else x, weight_grad)
    dbias = _grad_buffer(bias if bias is not None else x, bias_grad)
    launch_layernorm_backward(dy, x, weight, eps, dx, dweight if weight_grad else None, dbias if bias_grad else None)
    return dx, dweight, dbias


layernorm_backward_op = define_op(
    "layernorm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, float eps, bool weight_grad, "
    "bool bias_grad) -> (Tensor, Tensor, Tensor)",
    _backward_impl,
    lambda dy, x, weight, bias, eps, weight_grad, bias_grad: (
        x.new_empty(x.shape),
        _grad_buffer(weight if weight is not None else x, weight_grad),
        _grad_buffer(bias if bias is not None else x, bias_grad),
    ),
)


def _setup_context(ctx, inputs, output):
    # bias is saved for its dtype and shape only (db = sum of dy): a parameter, no extra memory
    ctx.save_for_backward(inputs.x, inputs.weight, inputs.bias)
    ctx.eps = inputs.eps


def _backward(ctx, dy):
    x, weight, bias = ctx.saved_tensors
    wants_x, wants_weight, wants_bias = ctx.needs_input_grad[:3]
    dx, dweight, dbias = layernorm_backward_op(
        dy, x, weight, bias, eps=ctx.eps, weight_grad=wants_weight, bias_grad=wants_bias
    )
    return (dx if wants_x else None), (dweight if wants_weight else None), (dbias if wants_bias else None), None


def _empty(x, weight, bias, eps):
    """The operator's new output (its fake implementation too)."""
    return contiguous_like(x)


layernorm_op, layernorm_out_op = define_ops(
    "layernorm",
    "Tensor x, Tensor? weight, Tensor? bias, float eps",
    _empty,
    launch_layernorm,
    backward=_backward,
    setup_context=_setup_context,
)


def layernorm(x, weight=None, bias=None, eps=1e-5, out=None):
    """LayerNorm over the last dim (operators llmk::layernorm and llmk::layernorm_out), differentiable
    in x, weight and bias (llmk::layernorm_backward); `out=` is forward-only.

    x: (..., N) fp16, bf16 or fp32, any row stride. weight, bias: (N,) any float dtype, or None.
    out: optional contiguous buffer shaped like x. Returns y: (..., N), x's dtype, contiguous.
    """
    check_norm_args(x, weight, eps)
    if bias is not None:
        check_norm_args(x, bias, eps, weight_name="bias")
    if out is None:
        return layernorm_op(x, weight, bias, eps=float(eps))
    check_out("out", out, x.shape, x.dtype, x.device)
    layernorm_out_op(x, weight, bias, eps=float(eps), out=out)
    return out
