"""Bias + GELU in one pass, the activation after the MLP's first linear layer (GPT-2, BERT, ...):

    y = gelu(x + bias)       exact:  z * Phi(z)            Phi the standard normal CDF, z = x + bias
                             tanh:   z * sigmoid(2 * sqrt(2/pi) * (z + 0.044715 * z^3))

in fp32 (common.triton_utils.gelu), with one rounding to x's dtype at the end. Neither form calls
erf or tanh. The textbook 0.5 * z * (1 + erf(z / sqrt(2))) loses most of its digits to 1 + erf(.)
for z < -2, and with libdevice's erf the kernel takes about twice the instructions a value, near
what an H100 can issue while streaming fp16 at full bandwidth (docs/tuning/mlp.md).

Memory traffic for M rows of O values of e bytes: read x (M*O*e), write y (M*O*e), read bias (O*e,
from L2 after the first band of rows). Eager PyTorch takes two kernels and rounds x + bias between
them: 5*M*O*e bytes.

Backward (llmk::bias_gelu_backward): the forward saves x and bias, not y; z = x + bias is
recomputed and, in fp32 (common.triton_utils.gelu_grad),
    dx = dy * gelu'(z)        rounded once to x's dtype
    dbias = sum over rows of dx (the fp32 values, before that rounding)
dbias is deterministic, in two stages: each program sums its band of rows into an fp32 partial row,
then common.reduce.sum_partials adds the partial rows in a fixed order and rounds once to bias's dtype.
Traffic: read x and dy, write dx: 3*M*O*e (fwd+bwd 5*M*O*e), plus the partial sums, 8*O bytes a
band of 128 rows (~1% at e = 2); without dx (only bias requires grad) 2*M*O*e.
Tiling (2D tiles over rows and columns, 64-bit offsets; bands of rows for dbias) and its tables:
mlp/launch_config.py.
"""

import torch
import triton
import triton.language as tl

from llmk.common.direct_launch import Launcher
from llmk.common.ops import define_op, define_ops
from llmk.common.reduce import sum_partials
from llmk.common.triton_utils import gelu, gelu_grad
from llmk.common.validation import check_out, check_same_device, check_tensor, contiguous_like, rows_of
from llmk.mlp.launch_config import band_config, tile_config, tile_offsets
from llmk.mlp.reference_mlp import check_approximate


@triton.jit
def _bias_gelu_kernel(
    # pointers
    x_ptr, b_ptr, y_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_xm, stride_ym,
    # meta-parameters
    HAS_BIAS: tl.constexpr, TANH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    rows, cols, mask, in_cols = tile_offsets(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N, EVEN_M, EVEN_N)
    # x is read exactly once: do not let it push the bias out of L2
    z = tl.load(
        x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
    ).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=in_cols, other=0.0, eviction_policy="evict_last")
        z += b.to(tl.float32)[None, :]
    y = gelu(z, TANH)
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def check_bias_gelu_args(x, bias, approximate):
    check_tensor("x", x)
    if bias is not None:
        check_tensor("bias", bias)
        check_same_device("bias", bias, "x", x)
        if tuple(bias.shape) != (x.shape[-1],):
            raise ValueError(
                f"bias must have shape ({x.shape[-1]},) to match the last dim of x "
                f"{tuple(x.shape)}; got {tuple(bias.shape)}"
            )
    check_approximate(approximate)


# direct launches from a specialization's second on (common/direct_launch.py): at decode and
# micro-batch sizes bias + GELU's host time is its cost
_bias_gelu = Launcher(_bias_gelu_kernel)


def launch_bias_gelu(x, bias, approximate, y, cfg=None):
    """Launch on validated arguments: x (..., O); bias (O,) or None; y a contiguous output shaped
    like x. Writes y in place. cfg: a TileConfig to launch instead of tile_config's choice
    (tuning sweeps: mlp.launch_config.tile_config_for)."""
    if x.numel() == 0:
        return
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    x2, stride_x = rows_of(x)
    if cfg is None:
        cfg = tile_config("bias_gelu", n_rows, n_cols, x.element_size())
    b = bias.contiguous() if bias is not None else x2  # x2: a placeholder pointer, never read
    # y is contiguous: row stride N
    _bias_gelu[(cfg.grid,)](
        x2,
        b,
        y,
        n_rows,
        n_cols,
        stride_x,
        n_cols,
        HAS_BIAS=bias is not None,
        TANH=approximate == "tanh",
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        EVEN_M=cfg.EVEN_M,
        EVEN_N=cfg.EVEN_N,
        num_warps=cfg.num_warps,
    )


@triton.jit
def _bias_gelu_backward_kernel(
    # pointers
    dy_ptr, x_ptr, b_ptr, dx_ptr, partial_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_dym, stride_xm, stride_dxm,
    # meta-parameters
    HAS_BIAS: tl.constexpr, TANH: tl.constexpr, X_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """Program (band, column tile): dx over ROWS rows of BLOCK_N columns, BLOCK_M rows an iteration;
    with BIAS_GRAD, the band's fp32 column sums of dx into row `band` of partial (n_bands, n_cols)."""
    n_col_tiles = tl.cdiv(n_cols, BLOCK_N)
    band = tl.program_id(0) // n_col_tiles
    cols = (tl.program_id(0) % n_col_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    if EVEN_N:
        in_cols = tl.full((BLOCK_N,), True, tl.int1)
    else:
        in_cols = cols < n_cols
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=in_cols, other=0.0).to(tl.float32)
    band_start = band.to(tl.int64) * ROWS  # 64-bit: rows * stride can pass 2^31
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(0, tl.minimum(n_rows - band_start, ROWS), BLOCK_M):  # the last band may be short
        rows = band_start + start + tl.arange(0, BLOCK_M)
        if EVEN_M:
            mask = in_cols[None, :]
        else:
            mask = (rows < n_rows)[:, None] & in_cols[None, :]
        # x and dy are read exactly once: do not let them push the bias out of L2
        z = tl.load(
            x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
        ).to(tl.float32)
        dy = tl.load(
            dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
        ).to(tl.float32)
        if HAS_BIAS:
            z += b[None, :]
        dx = dy * gelu_grad(z, TANH)  # 0 outside the mask: dy = 0 there and gelu' of a bias is finite
        if X_GRAD:
            tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if BIAS_GRAD:
            acc += dx
    if BIAS_GRAD:
        tl.store(partial_ptr + band * n_cols + cols, tl.sum(acc, axis=0), mask=in_cols)


_bias_gelu_backward = Launcher(_bias_gelu_backward_kernel)


def launch_bias_gelu_backward(dy, x, bias, approximate, dx, dbias, cfg=None):
    """Launch on validated arguments: dy, x (..., O), any row strides (dy may be an expanded view);
    bias (O,) or None; dx a contiguous output shaped like x, or None (not wanted); dbias a (O,)
    output of bias's dtype, or None (not wanted: without bias, or bias does not require grad).
    Writes them in place. cfg: a BandConfig to launch instead of band_config's choice."""
    if dbias is not None and x.numel() == 0:
        dbias.zero_()  # a sum over no rows
    if x.numel() == 0:
        return
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    (x2, stride_x), (dy2, stride_dy) = rows_of(x), rows_of(dy)
    if cfg is None:
        cfg = band_config("bias_gelu_backward", n_rows, n_cols, x.element_size(), dbias is not None)
    partial = torch.empty((cfg.n_bands, n_cols), dtype=torch.float32, device=x.device) if dbias is not None else x2
    b = bias.contiguous() if bias is not None else x2  # x2: a placeholder pointer, never read
    # dx is contiguous (row stride N); x2 stands in for it when it is not wanted, never written
    _bias_gelu_backward[(cfg.grid,)](
        dy2,
        x2,
        b,
        x2 if dx is None else dx,
        partial,
        n_rows,
        n_cols,
        stride_dy,
        stride_x,
        n_cols,
        HAS_BIAS=bias is not None,
        TANH=approximate == "tanh",
        X_GRAD=dx is not None,
        BIAS_GRAD=dbias is not None,
        ROWS=cfg.ROWS,
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        EVEN_M=cfg.EVEN_M,
        EVEN_N=cfg.EVEN_N,
        num_warps=cfg.num_warps,
    )
    if dbias is not None:
        sum_partials(partial, dbias)


def _backward_empty(dy, x, bias, approximate, x_grad, bias_grad):
    """(dx, dbias): new contiguous tensors like x and bias, 0-size where that gradient is not
    wanted (an op may not return None). Also the backward op's fake implementation."""
    dbias = contiguous_like(bias) if bias_grad and bias is not None else x.new_empty((0,))
    return contiguous_like(x) if x_grad else x.new_empty((0,)), dbias


def _backward_impl(dy, x, bias, approximate, x_grad, bias_grad):
    dx, dbias = _backward_empty(dy, x, bias, approximate, x_grad, bias_grad)
    bias_grad = bias_grad and bias is not None
    if x_grad or bias_grad:
        launch_bias_gelu_backward(dy, x, bias, approximate, dx if x_grad else None, dbias if bias_grad else None)
    return dx, dbias


bias_gelu_backward_op = define_op(
    "bias_gelu_backward(Tensor dy, Tensor x, Tensor? bias, str approximate, bool x_grad, bool bias_grad) "
    "-> (Tensor, Tensor)",
    _backward_impl,
    _backward_empty,
)


def _setup_context(ctx, inputs, output):
    ctx.approximate = inputs.approximate
    ctx.save_for_backward(inputs.x, inputs.bias)  # z = x + bias is recomputed, y is not kept


def _backward(ctx, dy):
    x, bias = ctx.saved_tensors
    x_grad, bias_grad = ctx.needs_input_grad[:2]
    dx, dbias = bias_gelu_backward_op(dy, x, bias, approximate=ctx.approximate, x_grad=x_grad, bias_grad=bias_grad)
    return dx if x_grad else None, dbias if bias_grad else None, None


bias_gelu_op, bias_gelu_out_op = define_ops(
    "bias_gelu",
    "Tensor x, Tensor? bias, str approximate",
    lambda x, bias, approximate: contiguous_like(x),
    launch_bias_gelu,
    backward=_backward,
    setup_context=_setup_context,
)


def bias_gelu(x, bias, approximate="none", out=None):
    """gelu(x + bias) in one pass, as F.gelu(x + bias, approximate=approximate) but with no
    rounding of x + bias (operators llmk::bias_gelu and llmk::bias_gelu_out).

    x: (..., O) fp16, bf16 or fp32, any row stride (a view whose leading dims cannot merge is
       copied once). bias: (O,) any float dtype, or None for plain GELU.
    approximate: "none" (the exact GELU, F.gelu's default) or "tanh".
    out: optional contiguous buffer shaped like x, x's dtype (forward-only: with out= an input
       that requires grad raises).
    Returns y: (..., O), x's dtype, contiguous (out itself when given). Differentiable in x and
    bias (llmk::bias_gelu_backward).
    """
    check_bias_gelu_args(x, bias, approximate)
    if out is None:
        return bias_gelu_op(x, bias, approximate=approximate)
    check_out("out", out, x.shape, x.dtype, x.device)
    bias_gelu_out_op(x, bias, approximate=approximate, out=out)
    return out
