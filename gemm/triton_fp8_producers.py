"""The kernels before an FP8 GEMM, casting their own output: RMSNorm (and residual add + RMSNorm)
and the gated units (SwiGLU, GeGLU) writing e4m3 values with a scale per row, so that the GEMM
after them reads one byte a value and no quantization pass reads their output again.

    y = rmsnorm(x) or act(gate) * up       the math of normalization/triton_rmsnorm.py and
                                           mlp/triton_glu.py, rounded to x's dtype (the sum of
                                           squares in this kernel's own order)
    scale = max(amax(y row), AMAX_FLOOR) / 448,  q = e4m3(clamp(y * (448 / amax)))

q and scale are what quantize_fp8(y, "row") (gemm/triton_fp8_quant.py) gives for the same y, bit
for bit: the cast reads y rounded to x's dtype, not the fp32 value before that rounding, so the
fused kernel and the two-kernel composition agree exactly (the tests check it). keep_y also writes
y itself: a training step keeps it for the weight gradient's own cast (its scales run along the
tokens, not along a row).

Bytes a row of N values of e bytes, against rmsnorm then quantize_fp8: reads x (N*e), writes q (N)
and a scale (4): 2*N*e + N less than the two kernels' 3*N*e + N, and N*e more with keep_y; with a
residual, also reads it and writes u (2*N*e, as residual_rmsnorm does). A row
of at most ONE_PASS_MAX values stays in registers between the norm, the max and the cast; a longer
one is read three times (the sum of squares, the max, the cast; the last two from L2), a gated
unit's twice.

Operators llmk::rmsnorm_fp8 and llmk::glu_fp8, differentiable through y (and the residual sum
u) only: the e4m3 values and their scales are marked non-differentiable (a GEMM of them takes its
gradient through the 16-bit y it saves). Their autograd formulas are the 16-bit ops' backward
kernels on the saved inputs: llmk::rmsnorm_backward on x, or with a residual
llmk::residual_rmsnorm_backward on u = x + residual (u's own upstream gradient added in the
kernel; x and residual get the same gradient), and the gated unit's llmk::swiglu_backward or
llmk::geglu_backward on gate and up. With keep_y off there is no y to differentiate: the inputs
get u's gradient only.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from llmk.common.device import INTERPRET
from llmk.common.direct_launch import Launcher
from llmk.common.ints import cdiv
from llmk.common.ops import define_op
from llmk.common.triton_utils import activate
from llmk.common.validation import as_rows
from llmk.gemm.fp8_ops import FP8
from llmk.gemm.triton_fp8_quant import AMAX_FLOOR, FP8_MAX, cast_e4m3, group_amax, quant_factor, quant_scale, row_plan
from llmk.mlp.checks import check_swiglu_args
from llmk.mlp.reference_mlp import check_approximate
from llmk.mlp.triton_glu import ACTIVATIONS, GEGLU_OPS, GELU_ACTIVATION, SWIGLU_OPS
from llmk.normalization.checks import check_norm_args, check_residual
from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm_backward_op
from llmk.normalization.triton_rmsnorm import rmsnorm_backward_op


class FP8Rows(NamedTuple):
    """A producer's FP8 output: q (..., N) float8_e4m3fn and scale (...,) fp32, q * scale ~ y; y
    (..., N) in the input's dtype with keep_y, else None; residual_out, the residual stream
    x + residual (rmsnorm_fp8 with a residual), else None."""

    q: torch.Tensor
    scale: torch.Tensor
    y: torch.Tensor | None
    residual_out: torch.Tensor | None


@triton.jit
def _norm_source(
    x_ptr,
    res_ptr,
    u_ptr,
    rows,
    cols,
    mask,
    stride_xm,
    stride_rm,
    stride_um,
    HAS_RESIDUAL: tl.constexpr,
    FIRST: tl.constexpr,
):
    """A block of the values RMSNorm normalizes, in fp32: x, or u = x + residual rounded to x's
    dtype, which the first pass (FIRST) computes and stores and later passes read back."""
    if HAS_RESIDUAL and not FIRST:
        return tl.load(u_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(u_ptr + rows[:, None] * stride_um + cols[None, :], x, mask=mask)
    return x.to(tl.float32)


@triton.jit
def _normalized(x, rstd, w_ptr, cols, in_row, offset, HAS_WEIGHT: tl.constexpr):
    """x * rstd * (offset + weight) in fp32, RMSNorm's order (normalization/triton_rmsnorm.py)."""
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32) + offset
        return x * rstd[:, None] * w[None, :]
    return x * rstd[:, None]


@triton.jit
def _rounded(y, y_ptr, offs, mask, STORE_Y: tl.constexpr):
    """y (fp32) rounded to the input's dtype (y_ptr's: the launchers give y the input's dtype, and
    x or gate itself stands in for y when it is not kept), back in fp32, stored with STORE_Y."""
    y = y.to(y_ptr.dtype.element_ty)
    if STORE_Y:
        tl.store(y_ptr + offs, y, mask=mask)
    return y.to(tl.float32)


@triton.jit
def _norm_block(
    x_ptr,
    res_ptr,
    u_ptr,
    w_ptr,
    y_ptr,
    rows,
    cols,
    row_ok,
    n_cols,
    rstd,
    offset,
    stride_xm,
    stride_rm,
    stride_um,
    stride_ym,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    STORE_Y: tl.constexpr,
):
    """(y, mask) of one block of a looped pass after the first: the normalized values rounded to x's
    dtype (back in fp32), stored with STORE_Y."""
    in_row = cols < n_cols
    mask = row_ok[:, None] & in_row[None, :]
    x = _norm_source(x_ptr, res_ptr, u_ptr, rows, cols, mask, stride_xm, stride_rm, stride_um, HAS_RESIDUAL, False)
    y = _rounded(
        _normalized(x, rstd, w_ptr, cols, in_row, offset, HAS_WEIGHT),
        y_ptr,
        rows[:, None] * stride_ym + cols[None, :],
        mask,
        STORE_Y,
    )
    return y, mask


@triton.jit
def _rmsnorm_fp8_kernel(
    # pointers
    x_ptr, res_ptr, w_ptr, y_ptr, u_ptr, q_ptr, s_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_xm, stride_rm, stride_ym, stride_um, stride_qm,
    eps, offset,
    # meta-parameters
    FP8_MAX_: tl.constexpr, AMAX_FLOOR_: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    STORE_Y: tl.constexpr, SOFT_ROUND: tl.constexpr, ONE_PASS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """BLOCK_M rows a program. ONE_PASS (n_cols <= BLOCK_N): the row in registers from the load to
    the cast; else three passes over BLOCK_N-column blocks: sum of squares, max of y, cast."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows * stride
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        in_row = cols < n_cols
        mask = row_ok[:, None] & in_row[None, :]
        x = _norm_source(x_ptr, res_ptr, u_ptr, rows, cols, mask, stride_xm, stride_rm, stride_um, HAS_RESIDUAL, True)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        y = _rounded(
            _normalized(x, rstd, w_ptr, cols, in_row, offset, HAS_WEIGHT),
            y_ptr,
            rows[:, None] * stride_ym + cols[None, :],
            mask,
            STORE_Y,
        )
        amax = group_amax(y, tl.zeros([BLOCK_M], tl.float32), AMAX_FLOOR_, 1)
        q = cast_e4m3(y, quant_factor(amax, FP8_MAX_)[:, None], FP8_MAX_, SOFT_ROUND)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=mask)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = row_ok[:, None] & (start + cols < n_cols)[None, :]
            x = _norm_source(
                x_ptr, res_ptr, u_ptr, rows, start + cols, mask, stride_xm, stride_rm, stride_um, HAS_RESIDUAL, True
            )
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        if HAS_RESIDUAL:
            tl.debug_barrier()  # the passes below read u back: every thread's stores first
        amax = tl.full([BLOCK_M], AMAX_FLOOR_, tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            y, _ = _norm_block(
                x_ptr,
                res_ptr,
                u_ptr,
                w_ptr,
                y_ptr,
                rows,
                start + cols,
                row_ok,
                n_cols,
                rstd,
                offset,
                stride_xm,
                stride_rm,
                stride_um,
                stride_ym,
                HAS_RESIDUAL,
                HAS_WEIGHT,
                STORE_Y,
            )
            amax = group_amax(y, amax, AMAX_FLOOR_, 1)
        inv = quant_factor(amax, FP8_MAX_)[:, None]
        for start in range(0, n_cols, BLOCK_N):
            y, mask = _norm_block(
                x_ptr,
                res_ptr,
                u_ptr,
                w_ptr,
                y_ptr,
                rows,
                start + cols,
                row_ok,
                n_cols,
                rstd,
                offset,
                stride_xm,
                stride_rm,
                stride_um,
                stride_ym,
                HAS_RESIDUAL,
                HAS_WEIGHT,
                False,
            )
            tl.store(
                q_ptr + rows[:, None] * stride_qm + (start + cols)[None, :],
                cast_e4m3(y, inv, FP8_MAX_, SOFT_ROUND),
                mask=mask,
            )
    tl.store(s_ptr + rows, quant_scale(amax, FP8_MAX_), mask=row_ok)


@triton.jit
def _glu_block(
    gate_ptr,
    up_ptr,
    y_ptr,
    rows,
    cols,
    mask,
    stride_gm,
    stride_um,
    stride_ym,
    ACTIVATION: tl.constexpr,
    STORE_Y: tl.constexpr,
):
    """act(gate) * up of a block, rounded to gate's dtype (back in fp32), stored with STORE_Y."""
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return _rounded(activate(g, ACTIVATION) * u, y_ptr, rows[:, None] * stride_ym + cols[None, :], mask, STORE_Y)


@triton.jit
def _glu_fp8_kernel(
    # pointers
    gate_ptr, up_ptr, y_ptr, q_ptr, s_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_gm, stride_um, stride_ym, stride_qm,
    # meta-parameters
    FP8_MAX_: tl.constexpr, AMAX_FLOOR_: tl.constexpr, ACTIVATION: tl.constexpr, STORE_Y: tl.constexpr,
    SOFT_ROUND: tl.constexpr, ONE_PASS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """BLOCK_M rows a program. ONE_PASS (n_cols <= BLOCK_N): the row in registers; else two passes
    over BLOCK_N-column blocks: the max of y, then y again (gate and up from L2) and the cast."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows * stride
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        y = _glu_block(gate_ptr, up_ptr, y_ptr, rows, cols, mask, stride_gm, stride_um, stride_ym, ACTIVATION, STORE_Y)
        amax = group_amax(y, tl.zeros([BLOCK_M], tl.float32), AMAX_FLOOR_, 1)
        q = cast_e4m3(y, quant_factor(amax, FP8_MAX_)[:, None], FP8_MAX_, SOFT_ROUND)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=mask)
    else:
        amax = tl.full([BLOCK_M], AMAX_FLOOR_, tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = row_ok[:, None] & (start + cols < n_cols)[None, :]
            y = _glu_block(
                gate_ptr, up_ptr, y_ptr, rows, start + cols, mask, stride_gm, stride_um, stride_ym, ACTIVATION, STORE_Y
            )
            amax = group_amax(y, amax, AMAX_FLOOR_, 1)
        inv = quant_factor(amax, FP8_MAX_)[:, None]
        for start in range(0, n_cols, BLOCK_N):
            mask = row_ok[:, None] & (start + cols < n_cols)[None, :]
            y = _glu_block(
                gate_ptr, up_ptr, y_ptr, rows, start + cols, mask, stride_gm, stride_um, stride_ym, ACTIVATION, False
            )
            tl.store(
                q_ptr + rows[:, None] * stride_qm + (start + cols)[None, :],
                cast_e4m3(y, inv, FP8_MAX_, SOFT_ROUND),
                mask=mask,
            )
    tl.store(s_ptr + rows, quant_scale(amax, FP8_MAX_), mask=row_ok)


# direct launches from a specialization's second on (common/direct_launch.py): an FP8 training
# step makes hundreds of them, host-bound (docs/tuning/gemm.md, third GPU run)
_rmsnorm_fp8 = Launcher(_rmsnorm_fp8_kernel)
_glu_fp8 = Launcher(_glu_fp8_kernel)


def _buffers(x, keep_y, residual=None):
    """(q, scale, y, u) for x (..., N): y and u 0-size where not wanted (an operator returns
    tensors only)."""
    q = x.new_empty(x.shape, dtype=FP8)
    scale = x.new_empty(x.shape[:-1], dtype=torch.float32)
    y = x.new_empty(x.shape) if keep_y else x.new_empty((0,))
    u = x.new_empty(x.shape) if residual is not None else x.new_empty((0,))
    return q, scale, y, u


def launch_rmsnorm_fp8(x, residual, weight, eps, offset, q, scale, y=None, u=None, one_pass=None):
    """Launch on validated arguments: x, residual (or None) (..., N); weight (N,) or None; q
    (..., N) e4m3, scale (...,) fp32, y and u (or None) contiguous, shaped like x, of x's dtype (the
    dtype y rounds to before the cast). one_pass: force the path (tests)."""
    if y is not None and y.dtype != x.dtype:
        raise TypeError(f"y must have x's dtype {x.dtype}, got {y.dtype}")
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    r2 = as_rows(residual) if residual is not None else x2
    q2, y2 = q.view(-1, n_cols), (y.view(-1, n_cols) if y is not None else x2)
    u2 = u.view(-1, n_cols) if u is not None else x2  # placeholders: pointers the kernel never touches
    w = weight.contiguous() if weight is not None else x2
    block_m, block_n, one_pass = row_plan(n_cols, one_pass)
    _rmsnorm_fp8[(cdiv(n_rows, block_m),)](
        x2,
        r2,
        w,
        y2,
        u2,
        q2,
        scale,
        n_rows,
        n_cols,
        x2.stride(0),
        r2.stride(0),
        y2.stride(0),
        u2.stride(0),
        q2.stride(0),
        eps,
        offset,
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT=weight is not None,
        FP8_MAX_=FP8_MAX,
        AMAX_FLOOR_=AMAX_FLOOR,
        STORE_Y=y is not None,
        SOFT_ROUND=INTERPRET,
        ONE_PASS=one_pass,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=4,
    )


def launch_glu_fp8(gate, up, activation, q, scale, y=None, one_pass=None):
    """Launch on validated arguments: gate, up (..., I) of one dtype, any row strides; activation
    "silu", "gelu" or "gelu_tanh"; q (..., I) e4m3, scale (...,) fp32, y (or None) contiguous, of
    gate's dtype."""
    if activation not in ACTIVATIONS:  # a direct call of the operator raises too
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    if y is not None and y.dtype != gate.dtype:
        raise TypeError(f"y must have gate's dtype {gate.dtype}, got {y.dtype}")
    g2, u2 = as_rows(gate), as_rows(up)
    n_rows, n_cols = g2.shape
    q2, y2 = q.view(-1, n_cols), (y.view(-1, n_cols) if y is not None else g2)
    block_m, block_n, one_pass = row_plan(n_cols, one_pass)
    _glu_fp8[(cdiv(n_rows, block_m),)](
        g2,
        u2,
        y2,
        q2,
        scale,
        n_rows,
        n_cols,
        g2.stride(0),
        u2.stride(0),
        y2.stride(0),
        q2.stride(0),
        FP8_MAX_=FP8_MAX,
        AMAX_FLOOR_=AMAX_FLOOR,
        ACTIVATION=activation,
        STORE_Y=y is not None,
        SOFT_ROUND=INTERPRET,
        ONE_PASS=one_pass,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=4,
    )


def _rmsnorm_fp8_impl(x, residual, weight, eps, offset, keep_y):
    q, scale, y, u = _buffers(x, keep_y, residual)
    if q.numel():
        launch_rmsnorm_fp8(
            x, residual, weight, eps, offset, q, scale, y if keep_y else None, u if residual is not None else None
        )
    else:
        scale.zero_()  # rows of no values: no amax
    return q, scale, y, u


def _rmsnorm_fp8_setup(ctx, inputs, output):
    q, scale, y, u = output
    ctx.mark_non_differentiable(q, scale)
    ctx.set_materialize_grads(False)
    ctx.has_residual = inputs.residual is not None
    ctx.save_for_backward(u if ctx.has_residual else inputs.x, inputs.weight)  # what the norm normalized
    ctx.eps, ctx.offset, ctx.keep_y = inputs.eps, inputs.offset, inputs.keep_y


def _rmsnorm_fp8_backward(ctx, dq, dscale, dy, du):
    """(dx, dresidual, dweight): rmsnorm's backward of dy on the normalized rows; with a residual,
    residual_rmsnorm's, which adds u's own gradient du in the same kernel."""
    source, weight = ctx.saved_tensors
    x_grad, residual_grad, weight_grad = ctx.needs_input_grad[:3]
    dy = dy if ctx.keep_y else None
    du = du if ctx.has_residual else None
    if dy is None and du is None:
        return None, None, None, None, None, None
    if ctx.has_residual:
        if dy is None:  # only u is used: y's gradient is zero (as residual_rmsnorm's formula does)
            dy = torch.zeros_like(source)
        dsource, dweight = residual_rmsnorm_backward_op(
            dy, du, source, weight, eps=ctx.eps, weight_grad=bool(weight_grad), offset=ctx.offset
        )
    else:
        dsource, dweight = rmsnorm_backward_op(
            dy, source, weight, eps=ctx.eps, weight_grad=bool(weight_grad), offset=ctx.offset
        )
    return (
        dsource if x_grad else None,
        dsource if residual_grad else None,
        dweight if weight_grad else None,
        None,
        None,
        None,
    )


rmsnorm_fp8_op = define_op(
    "rmsnorm_fp8(Tensor x, Tensor? residual, Tensor? weight, float eps, float offset, bool keep_y)"
    " -> (Tensor, Tensor, Tensor, Tensor)",
    _rmsnorm_fp8_impl,
    lambda x, residual, weight, eps, offset, keep_y: _buffers(x, keep_y, residual),
    backward=_rmsnorm_fp8_backward,
    setup_context=_rmsnorm_fp8_setup,
)


def _glu_fp8_impl(gate, up, activation, keep_y):
    q, scale, y, _ = _buffers(gate, keep_y)
    if q.numel():
        launch_glu_fp8(gate, up, activation, q, scale, y if keep_y else None)
    else:
        scale.zero_()
    return q, scale, y


def _glu_fp8_setup(ctx, inputs, output):
    q, scale, _ = output
    ctx.mark_non_differentiable(q, scale)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(inputs.gate, inputs.up)
    ctx.activation, ctx.keep_y = inputs.activation, inputs.keep_y
    # geglu's backward takes its approximation by name ("none", "tanh")
    ctx.approximate = next((a for a, act in GELU_ACTIVATION.items() if act == inputs.activation), None)


def _glu_fp8_backward(ctx, dq, dscale, dy):
    """(dgate, dup): the 16-bit gated unit's backward kernel of dy."""
    if dy is None or not ctx.keep_y:
        return None, None, None, None
    gate, up = ctx.saved_tensors
    gate_grad, up_grad = ctx.needs_input_grad[:2]
    if ctx.activation == "silu":
        dgate, dup = SWIGLU_OPS.backward(dy, gate, up, gate_grad, up_grad)
    else:
        dgate, dup = GEGLU_OPS.backward(dy, gate, up, ctx.approximate, gate_grad, up_grad)
    return dgate if gate_grad else None, dup if up_grad else None, None, None


glu_fp8_op = define_op(
    "glu_fp8(Tensor gate, Tensor up, str activation, bool keep_y) -> (Tensor, Tensor, Tensor)",
    _glu_fp8_impl,
    lambda gate, up, activation, keep_y: _buffers(gate, keep_y)[:3],
    backward=_glu_fp8_backward,
    setup_context=_glu_fp8_setup,
)


def _fp8_rows(q, scale, y, u, keep_y, residual):
    return FP8Rows(q, scale, y if keep_y else None, u if residual is not None else None)


def rmsnorm_fp8(x, weight, eps=1e-6, *, offset=0.0, residual=None, keep_y=False):
    """RMSNorm (normalization.triton_rmsnorm.rmsnorm's math) cast to e4m3 with a scale per row, in
    one kernel (operator llmk::rmsnorm_fp8). Differentiable in x, weight and residual through y
    (keep_y) and residual_out, by the 16-bit RMSNorm's backward (module docstring).

    x: (..., N) fp16, bf16 or fp32, any row stride. weight: (N,) or None; offset: added to it
    (1.0: Gemma's). residual: None, or like x: the norm then runs on u = x + residual (rounded to
    x's dtype), returned as residual_out, the next block's skip. keep_y: also return y, the norm's
    output in x's dtype (a training step's weight gradient casts it along the tokens).
    Returns FP8Rows: q (..., N) float8_e4m3fn and scale (...,) fp32 with q * scale ~ y, equal to
    quantize_fp8(y, "row") bit for bit."""
    check_norm_args(x, weight, eps, offset=offset)
    if residual is not None:
        check_residual(residual, x)
    q, scale, y, u = rmsnorm_fp8_op(x, residual, weight, eps=float(eps), offset=float(offset), keep_y=bool(keep_y))
    return _fp8_rows(q, scale, y, u, keep_y, residual)


def swiglu_fp8(gate, up, *, keep_y=False):
    """silu(gate) * up (mlp.triton_glu.swiglu's math) cast to e4m3 with a scale per row, in one
    kernel (operator llmk::glu_fp8). Differentiable in gate and up through y (keep_y).

    gate, up: (..., I) of one dtype and shape, any row strides (the halves of a fused gate/up
    projection are read in place). keep_y: also return y in gate's dtype.
    Returns FP8Rows: q (..., I) float8_e4m3fn, scale (...,) fp32, equal to quantize_fp8(y, "row")."""
    check_swiglu_args(gate, up)
    q, scale, y = glu_fp8_op(gate, up, activation="silu", keep_y=bool(keep_y))
    return _fp8_rows(q, scale, y, None, keep_y, None)


def geglu_fp8(gate, up, approximate="tanh", *, keep_y=False):
    """gelu(gate) * up (mlp.triton_glu.geglu's math; approximate "tanh", Gemma's, or "none") cast to
    e4m3 with a scale per row, as swiglu_fp8 (operator llmk::glu_fp8), differentiable alike."""
    check_swiglu_args(gate, up)
    check_approximate(approximate)
    q, scale, y = glu_fp8_op(gate, up, activation=GELU_ACTIVATION[approximate], keep_y=bool(keep_y))
    return _fp8_rows(q, scale, y, None, keep_y, None)


__all__ = [
    "FP8Rows",
    "geglu_fp8",
    "glu_fp8_op",
    "launch_glu_fp8",
    "launch_rmsnorm_fp8",
    "rmsnorm_fp8",
    "rmsnorm_fp8_op",
    "swiglu_fp8",
]
