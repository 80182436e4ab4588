"""RMSNorm (and residual-add + RMSNorm) in Triton.

    y = x * rsqrt(mean(x^2) + eps) * (offset + weight)  over the last dim, math in fp32, one cast
    y = x * rsqrt(mean(x^2) + eps)                      weight None (HAS_WEIGHT off)
    u = x + residual;  y = rmsnorm(u)                   with HAS_RESIDUAL (u rounded to x's dtype)

offset is 0 for Llama-style norms and 1 for Gemma's, whose weights are stored as the scale minus 1.
Either way the math runs in fp32 and y is rounded once, in Gemma's order ((x * rstd) * (1 + w) in
fp32, then the cast); Llama's module rounds x * rstd to x's dtype before the weight multiplies it.
Without a weight (torch.nn.RMSNorm(elementwise_affine=False), F.rms_norm(x, shape, None)) y is
x * rstd and offset, which shifts a weight, is ignored, as Liger's RMSNorm without an affine
weight ignores it: a Gemma norm built without a weight still means x * rstd.

Memory traffic per row of N values of e bytes: read x (N*e), write y (N*e), plus weight (N*w_e,
read once per program, L2-resident). With a residual: also read residual and write u: 4*N*e.
Two kernels, chosen by normalization/launch_config.py: `_rmsnorm_fused_kernel` holds BLOCK_M short
rows in registers; `_rmsnorm_looped_kernel` streams a row in chunks twice, the second pass served
from L1/L2, which needs fewer registers and so keeps more loads in flight.

Backward (normalization/triton_norm_backward.py): the operator llmk::rmsnorm_backward, which
autograd calls and `rmsnorm_backward` exposes; the forward saves x and weight only (rstd is
recomputed from x: read x, dy, write dx, 3*N*e a row). Without a weight there is no dweight.
"""

import triton
import triton.language as tl

from llmk.common.direct_launch import Launcher
from llmk.common.ops import define_op, define_ops
from llmk.common.triton_utils import col_mask
from llmk.common.validation import check_out, check_same_device, check_tensor, contiguous_like, rows_of
from llmk.normalization.checks import check_norm_args
from llmk.normalization.launch_config import row_config
from llmk.normalization.triton_norm_backward import launch_rmsnorm_backward


@triton.jit
def _rmsnorm_fused_kernel(
    # pointers
    x_ptr, res_ptr, w_ptr, y_ptr, u_ptr,
    # matrix dimensions and strides (in elements)
    n_rows, n_cols, stride_xm, stride_rm, stride_ym, stride_um,
    eps, offset,
    # meta-parameters
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows*stride can pass 2^31
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < n_cols
    mask = (rows < n_rows)[:, None] & in_row[None, :]
    # x and residual are read exactly once: do not let them push the weight out of L2
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    if HAS_RESIDUAL:
        r = tl.load(
            res_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
        )
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # u is rounded before it is normalized
        tl.store(u_ptr + rows[:, None] * stride_um + cols[None, :], x, mask=mask)
    x = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=in_row, other=0.0, eviction_policy="evict_last").to(tl.float32) + offset
        y = x * rstd[:, None] * w[None, :]
    else:
        y = x * rstd[:, None]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_looped_kernel(
    # pointers
    x_ptr, res_ptr, w_ptr, y_ptr, u_ptr,
    # matrix dimensions and strides (in elements), compile-time constants: see the docstring
    n_rows, n_cols: tl.constexpr, stride_xm: tl.constexpr, stride_rm: tl.constexpr,
    stride_ym: tl.constexpr, stride_um: tl.constexpr,
    eps, offset,
    # meta-parameters
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """One row per program in BLOCK_N chunks: pass 1 sums squares, pass 2 re-reads (from L1/L2).

    The row length and strides are compile-time constants, as in Inductor's static-shape kernels:
    the chunk loop's trip count and every address offset are then known to the compiler. One
    compile per row length, worth 3-21% on the widest rows (docs/tuning/normalization.md).
    """
    row = tl.program_id(0).to(tl.int64)
    # pass 1: keep the row in L2 (evict_last) for pass 2
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_rm + cols, mask=mask, other=0.0, eviction_policy="evict_first")
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
            tl.store(u_ptr + row * stride_um + cols, x, mask=mask, eviction_policy="evict_last")
        x = x.to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    if HAS_RESIDUAL:
        tl.debug_barrier()  # pass 2 reads u back: make every thread's stores visible to the block
    # pass 2: normalize; the source is read for the last time
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        if HAS_RESIDUAL:
            x = tl.load(u_ptr + row * stride_um + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        if HAS_WEIGHT:  # statements in the order of the weighted kernel as tuned (same PTX)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32) + offset
            y = x.to(tl.float32) * rstd * w
        else:
            y = x.to(tl.float32) * rstd
        tl.store(
            y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first"
        )  # y is not read again: keep L2 for x


# direct launches from a specialization's second on (common/direct_launch.py): at decode and
# micro-batch sizes a norm's host time is its cost
_fused, _looped = Launcher(_rmsnorm_fused_kernel), Launcher(_rmsnorm_looped_kernel)


def launch_rmsnorm(x, residual, weight, eps, y, u, cfg=None, offset=0.0):
    """Launch on validated arguments: x, residual (or None) (..., N); weight (N,) or None (no
    weight: y = x * rstd, offset ignored); y, u (or None) contiguous outputs shaped like x; offset
    added to the weight (module docstring). Writes y (and
    u) in place. cfg: a RowConfig to launch instead of row_config's choice (tuning sweeps); a fused
    one must hold the whole row (BLOCK_N >= N)."""
    if x.numel() == 0:
        return
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    x2, stride_x = rows_of(x)
    r2, stride_r = rows_of(residual) if residual is not None else (x2, stride_x)
    if cfg is None:
        cfg = row_config(n_rows, n_cols, x.element_size())
    # y and u are contiguous: row stride N. No weight: x stands in as a pointer the kernel never reads
    args = (
        x2,
        r2,
        weight.contiguous() if weight is not None else x2,
        y,
        y if u is None else u,
        n_rows,
        n_cols,
        stride_x,
        stride_r,
        n_cols,
        n_cols,
        eps,
        offset,
    )
    if cfg.looped:
        _looped[(cfg.grid,)](
            *args,
            HAS_RESIDUAL=residual is not None,
            HAS_WEIGHT=weight is not None,
            BLOCK_N=cfg.BLOCK_N,
            EVEN_N=n_cols % cfg.BLOCK_N == 0,
            num_warps=cfg.num_warps,
        )
    else:
        _fused[(cfg.grid,)](
            *args,
            HAS_RESIDUAL=residual is not None,
            HAS_WEIGHT=weight is not None,
            BLOCK_M=cfg.BLOCK_M,
            BLOCK_N=cfg.BLOCK_N,
            num_warps=cfg.num_warps,
        )


def weight_grad_buffer(x, weight, weight_grad):
    """dweight of the backward operators: (N,) in weight's dtype, or a 0-size placeholder when it
    is not wanted or there is no weight (the operators return a Tensor either way)."""
    if weight is None or not weight_grad:
        return x.new_empty((0,))
    return contiguous_like(weight)


def _rmsnorm_backward_impl(dy, x, weight, eps, weight_grad, offset):
    dx = contiguous_like(x)
    dweight = weight_grad_buffer(x, weight, weight_grad)
    wanted = weight_grad and weight is not None
    launch_rmsnorm_backward(dy, x, weight, None, eps, dx, dweight if wanted else None, offset=offset)
    return dx, dweight


rmsnorm_backward_op = define_op(
    "rmsnorm_backward(Tensor dy, Tensor x, Tensor? weight, float eps, bool weight_grad, float offset)"
    " -> (Tensor, Tensor)",
    _rmsnorm_backward_impl,
    lambda dy, x, weight, eps, weight_grad, offset: (x.new_empty(x.shape), weight_grad_buffer(x, weight, weight_grad)),
)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs.x, inputs.weight)
    ctx.eps, ctx.offset = inputs.eps, inputs.offset


def _backward(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dweight = rmsnorm_backward_op(
        dy, x, weight, eps=ctx.eps, weight_grad=ctx.needs_input_grad[1], offset=ctx.offset
    )
    return (dx if ctx.needs_input_grad[0] else None), (dweight if ctx.needs_input_grad[1] else None), None, None


def _empty(x, weight, eps, offset):
    """The operator's new output (its fake implementation too)."""
    return contiguous_like(x)


def _into(x, weight, eps, offset, out):
    """llmk::rmsnorm_out's body: the kernel writing out."""
    launch_rmsnorm(x, None, weight, eps, out, None, offset=offset)


rmsnorm_op, rmsnorm_out_op = define_ops(
    "rmsnorm",
    "Tensor x, Tensor? weight, float eps, float offset",
    _empty,
    _into,
    backward=_backward,
    setup_context=_setup_context,
)


def rmsnorm(x, weight, eps=1e-6, out=None, *, offset=0.0):
    """RMSNorm over the last dim (operators llmk::rmsnorm and llmk::rmsnorm_out), differentiable
    in x and weight (llmk::rmsnorm_backward); `out=` is forward-only.

    x: (..., N) fp16, bf16 or fp32, any row stride (a view whose leading dims cannot merge is
       copied once). weight: (N,) any float dtype, or None: no affine weight, y = x * rstd, as
       torch.nn.RMSNorm(elementwise_affine=False) and F.rms_norm(x, (N,), None) compute it.
    out: optional contiguous buffer shaped like x.
    offset: added to the weight in fp32, y = x * rstd * (offset + weight): 1.0 is Gemma's RMSNorm.
       Ignored when weight is None (it shifts a weight; Liger's RMSNorm without a weight does the same).
    Returns y: (..., N), x's dtype, contiguous.
    """
    check_norm_args(x, weight, eps, offset=offset)
    if out is None:
        return rmsnorm_op(x, weight, eps=float(eps), offset=float(offset))
    check_out("out", out, x.shape, x.dtype, x.device)
    rmsnorm_out_op(x, weight, eps=float(eps), offset=float(offset), out=out)
    return out


def rmsnorm_backward(dy, x, weight, eps=1e-6, weight_grad=True, *, offset=0.0):
    """The gradients of y = rmsnorm(x, weight, eps, offset=offset) given dy (operator
    llmk::rmsnorm_backward; a caller fusing RMSNorm into another op's autograd formula calls this,
    and torch.compile traces it).

    dy, x: (..., N) of one dtype (fp16, bf16, fp32), any strides (a dy with a column stride, such
    as an expanded one, is copied once). weight: (N,) any float dtype, or None (no affine weight).
    Returns (dx, dweight): dx (..., N) contiguous in x's dtype; dweight (N,) in weight's dtype,
    summed over rows in fp32 and rounded once, or None when weight_grad is False or weight is None.
    """
    check_norm_args(x, weight, eps, offset=offset)
    check_tensor("dy", dy)
    check_same_device("dy", dy, "x", x)
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise ValueError(f"dy must match x: shape {tuple(x.shape)} dtype {x.dtype}; got {tuple(dy.shape)} {dy.dtype}")
    weight_grad = bool(weight_grad) and weight is not None
    dx, dweight = rmsnorm_backward_op(dy, x, weight, eps=float(eps), weight_grad=weight_grad, offset=float(offset))
    return dx, (dweight if weight_grad else None)
