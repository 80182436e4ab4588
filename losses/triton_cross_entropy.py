"""Cross-entropy over logits in Triton, forward and backward, rows up to 262144 classes wide.

    loss = cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, *,
                         weight=None, lse_square_scale=0.0, softcap=None, return_z_loss=False,
                         return_token_accuracy=False)

Conventions: losses/reference_losses.py (F.cross_entropy's, class dimension last).

One program a row, two kernels:
- forward: one pass over the row in BLOCK_V chunks with an online max and sum (the softmax's
  statistics, as the attention kernels keep them), the sum of the row (label smoothing) and the
  target's logit: the row's loss and its log-sum-exp LSE, both fp32. Reads N*V*e bytes.
- backward: dlogits = g * (softmax(x) - (1 - eps) * onehot(t) - eps / V) + dLSE * softmax(x),
  with softmax(x) = exp(x - LSE) from the saved LSE: reads N*V*e, writes N*V*e. g is the row's
  gradient, from the reduction (1/n_valid for "mean"), so the kernel never waits for the host.
The reduction runs in PyTorch on the fp32 rows (sum, or sum over the count of targets that are
not ignored), so torch.compile sees it and autograd hands each row its share. Rows whose target is
ignore_index get loss 0 and zero gradient.

Options (constexpr flags: without them the kernels compile to the plain code): class weights
(HAS_WEIGHT: the target's weight scales its row, weighted smoothing reads the row's weights too, from
L2), softcap (HAS_SOFTCAP), the token accuracy's argmax (WITH_ARGMAX: the first largest logit, from the
online max's pass, one fp32 hit a row). The z-loss s * lse^2 is PyTorch on the LSE output: its
gradient 2 s lse reaches dlogits as the LSE's (dLSE * softmax(x)); the fused linear cross-entropy's
forward-written gradient takes it in the kernel (HAS_Z_LOSS).

Targets outside [0, V) that are not ignore_index raise TargetError, a ValueError and an IndexError
(the class F.cross_entropy raises on the CPU). The check (start_target_check) runs in the operators'
implementations, not in the public function: every entry that takes a target reaches one (this
file's and fused_linear_cross_entropy's public functions, torch.ops.llmk.* called directly),
torch.compile never traces it (the fake
implementations stand in, so a fullgraph compile has no graph break), and a compiled graph calls it
on real tensors, so it raises there too. It costs one read of 16 bytes by the host: ignore_index
entries replaced by 0, torch.aminmax over the N targets, a copy to pinned memory, all enqueued
before the row kernels; the host waits for that copy after launching them, so the GPU has the loss
kernels queued while the host waits, and the op raises before it returns (its outputs are fresh
tensors no caller has seen). The backward operator checks when called on its own; autograd calls it
with check_target=False, on the target its forward checked.
The check cannot run under CUDA-graph capture (a host read is not capturable), so neither in the
captured call nor in the graph's replays. There (and with the measurement switch _CHECK_TARGETS
off) a bad target's row gets a NaN loss ("mean" and "sum" are NaN; "mean" counts the row among the
targets not ignored) and a finite gradient without its one-hot term,
g * (softmax(x) - eps / V) + dLSE * softmax(x): as if no class were the target.

The shared row code also serves losses/fused_linear_cross_entropy_ops.py: `launch_rows` with
`grad_out` writes the gradient in the same launch as the loss, reading the row twice (softcap too).

Operators: llmk::cross_entropy -> (loss rows, LSE, hits) and llmk::cross_entropy_backward.
"""

import math
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from llmk.common.device import INTERPRET
from llmk.common.ints import next_power_of_2
from llmk.common.ops import define_op, needs_grad
from llmk.common.triton_utils import LN2, LOG2E
from llmk.common.validation import check_tensor
from llmk.losses.reference_losses import REDUCTIONS

# Chunk of a row a program holds at once, and its warps: 4096 fp32 values over 8 warps is 16 a
# thread (docs/tuning/losses.md). The interpreter takes 128, so test rows of a few hundred classes
# run several chunks and a ragged last one.
BLOCK_V, NUM_WARPS = 4096, 8
INTERPRET_BLOCK_V = 128


def block_v(n_cols):
    return min(INTERPRET_BLOCK_V if INTERPRET else BLOCK_V, max(16, next_power_of_2(n_cols)))


@triton.jit
def _capped(x, softcap, HAS_SOFTCAP: tl.constexpr):
    """softcap * tanh(x / softcap), and tanh itself (for the derivative); x when not HAS_SOFTCAP.
    tanh(u) = 1 - 2 / (1 + e^(2u)): exact at both ends (+-1 for |u| large), no overflow."""
    if HAS_SOFTCAP:
        th = 1.0 - 2.0 / (1.0 + tl.math.exp2(x * (2.0 * LOG2E / softcap)))
        return softcap * th, th
    else:
        return x, x


@triton.jit
def _row_loss(
    row_ptr,
    stride_col,
    target,
    n_cols,
    ignore_index,
    smoothing,
    softcap,
    weight_ptr,
    stride_w,
    weight_sum,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    WITH_ARGMAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """(loss, LSE, hit) of one row, fp32: one pass with an online max and sum. -inf logits (a masked
    vocabulary) are classes of probability 0, as in F.cross_entropy. With HAS_WEIGHT the loss is
    torch's weighted one, (1 - eps) w_t (lse - x_t) + eps / V * sum_j w_j (lse - x_j), weight_sum
    = sum_j w_j. hit (WITH_ARGMAX): 1.0 where the row's first largest logit is the target's."""
    offs = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    row_sum = tl.zeros([], tl.float32)
    arg = tl.zeros([], tl.int32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(row_ptr + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
        x, _ = _capped(x, softcap, HAS_SOFTCAP)
        if HAS_SMOOTHING:  # only smoothing reads the row's sum (-inf in it makes the loss inf, as torch's)
            if HAS_WEIGHT:
                w = tl.load(weight_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
                row_sum += tl.sum(tl.where(mask, w * x, 0.0))
            else:
                row_sum += tl.sum(tl.where(mask, x, 0.0))
        x = tl.where(mask, x, float("-inf"))
        block_max = tl.max(x, 0)
        if WITH_ARGMAX:  # the first column of the largest logit, as torch.argmax picks among ties
            first = tl.min(tl.where(x == block_max, cols, n_cols), 0)
            arg = tl.where(block_max > m, first, arg)
        m_new = tl.maximum(m, block_max)
        # while every logit so far is -inf, subtract 0: -inf - -inf would be NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.math.exp2((m - m_safe) * LOG2E) + tl.sum(tl.math.exp2((x - m_safe) * LOG2E))
        m = m_new
    lse = m + tl.math.log2(s) * LN2
    valid = (target >= 0) & (target < n_cols)
    safe_target = tl.where(valid, target, 0).to(tl.int64)
    x_t = tl.load(row_ptr + safe_target * stride_col).to(tl.float32)
    x_t, _ = _capped(x_t, softcap, HAS_SOFTCAP)
    loss = lse - x_t
    if HAS_WEIGHT:
        loss = tl.load(weight_ptr + safe_target * stride_w).to(tl.float32) * loss
        if HAS_SMOOTHING:
            loss = (1.0 - smoothing) * loss + smoothing / n_cols * (weight_sum * lse - row_sum)
    elif HAS_SMOOTHING:
        loss = (1.0 - smoothing) * loss + smoothing * (lse - row_sum / n_cols)
    loss = tl.where(valid, loss, float("nan"))
    ignored = target == ignore_index
    hit = tl.where(ignored | (arg != target), 0.0, 1.0)
    return tl.where(ignored, 0.0, loss), lse, hit


@triton.jit
def _row_grad(
    row_ptr,
    stride_col,
    grad_ptr,
    grad_stride_col,
    target,
    lse,
    scale,
    scale_lse,
    n_cols,
    ignore_index,
    smoothing,
    softcap,
    weight_ptr,
    stride_w,
    weight_sum,
    HAS_SOFTCAP: tl.constexpr,
    HAS_SMOOTHING: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Write scale * (p - (1 - eps) * onehot - eps / V) + scale_lse * p for one row (the first term
    zero for an ignored target), times the softcap's derivative; with HAS_WEIGHT the first term is
    scale * ((1 - eps) w_t (p - onehot) + eps / V (weight_sum p - w)). grad_ptr may be row_ptr (in
    place: each chunk is read before it is written, by this program only)."""
    offs = tl.arange(0, BLOCK)
    ignored = target == ignore_index
    if HAS_WEIGHT:  # a target outside [0, V) (no check under graph capture) weighs 1: a finite gradient
        valid = (target >= 0) & (target < n_cols)
        w_t = tl.load(weight_ptr + tl.where(valid, target, 0).to(tl.int64) * stride_w).to(tl.float32)
        w_t = tl.where(valid, w_t, 1.0)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        z = tl.load(row_ptr + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
        x, th = _capped(z, softcap, HAS_SOFTCAP)
        p = tl.math.exp2((x - lse) * LOG2E)
        if HAS_WEIGHT:
            g = (1.0 - smoothing) * w_t * (p - tl.where(cols == target, 1.0, 0.0))
            if HAS_SMOOTHING:
                w = tl.load(weight_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
                g += smoothing / n_cols * (weight_sum * p - w)
            g = scale * g
        else:
            g = scale * (p - smoothing / n_cols - tl.where(cols == target, 1.0 - smoothing, 0.0))
        g = tl.where(ignored, 0.0, g) + scale_lse * p  # an ignored row's LSE still has a gradient
        if HAS_SOFTCAP:
            g = g * (1.0 - th * th)
        tl.store(grad_ptr + cols * grad_stride_col, g.to(grad_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _weight_sum(weight_sum_ptr, HAS_SMOOTHING: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """sum_j w_j, which only weighted smoothing reads (one fp32 value), else 0."""
    if HAS_WEIGHT and HAS_SMOOTHING:
        return tl.load(weight_sum_ptr)
    else:
        return 0.0


@triton.jit
def _cross_entropy_fwd_kernel(
    # pointers
    logits_ptr, target_ptr, loss_ptr, lse_ptr, hit_ptr, grad_ptr, grad_scale_ptr, weight_ptr, weight_sum_ptr,
    # strides
    stride_row, stride_col, grad_stride_row, grad_stride_col, stride_w,
    # sizes and options
    n_cols, ignore_index, smoothing, softcap, lse_square_scale,
    # meta-parameters
    HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_Z_LOSS: tl.constexpr,
    WITH_ARGMAX: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Loss and LSE of row program_id(0) (and its hit, WITH_ARGMAX); with WRITE_GRAD also its
    gradient, scaled by the fp32 value at grad_scale_ptr (fused linear cross-entropy: 1 / n_valid
    or 1 / the targets' weight sum for "mean", 1 for "sum") and, HAS_Z_LOSS, the z-loss's
    lse_square_scale * lse^2 gradient scaled by the value after it."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    target = tl.load(target_ptr + row).to(tl.int64)
    weight_sum = _weight_sum(weight_sum_ptr, HAS_SMOOTHING, HAS_WEIGHT)
    loss, lse, hit = _row_loss(
        row_ptr,
        stride_col,
        target,
        n_cols,
        ignore_index,
        smoothing,
        softcap,
        weight_ptr,
        stride_w,
        weight_sum,
        HAS_SOFTCAP,
        HAS_SMOOTHING,
        HAS_WEIGHT,
        WITH_ARGMAX,
        BLOCK,
    )
    tl.store(loss_ptr + row, loss)
    tl.store(lse_ptr + row, lse)
    if WITH_ARGMAX:
        tl.store(hit_ptr + row, hit)
    if WRITE_GRAD:
        if HAS_Z_LOSS:  # d(s * lse^2) / dlogits = 2 s lse p, for the rows not ignored
            z_grad = 2.0 * lse_square_scale * lse * tl.load(grad_scale_ptr + 1)
            scale_lse = tl.where(target == ignore_index, 0.0, z_grad)
        else:
            scale_lse = 0.0
        _row_grad(
            row_ptr,
            stride_col,
            grad_ptr + row * grad_stride_row,
            grad_stride_col,
            target,
            lse,
            tl.load(grad_scale_ptr),
            scale_lse,
            n_cols,
            ignore_index,
            smoothing,
            softcap,
            weight_ptr,
            stride_w,
            weight_sum,
            HAS_SOFTCAP,
            HAS_SMOOTHING,
            HAS_WEIGHT,
            BLOCK,
        )


@triton.jit
def _cross_entropy_bwd_kernel(
    # pointers
    logits_ptr, target_ptr, lse_ptr, grad_loss_ptr, grad_lse_ptr, grad_ptr, weight_ptr, weight_sum_ptr,
    # strides
    stride_row, stride_col, grad_stride_row, grad_stride_col, stride_gl, stride_glse, stride_w,
    # sizes and options
    n_cols, ignore_index, smoothing, softcap,
    # meta-parameters
    HAS_GRAD_LSE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """dlogits of row program_id(0) from its saved LSE, its loss's gradient and LSE's (if used: the
    z-loss's reaches the row through it). grad_ptr may be logits_ptr (fused linear cross-entropy's
    chunk buffer, rewritten in place)."""
    row = tl.program_id(0).to(tl.int64)
    target = tl.load(target_ptr + row).to(tl.int64)
    if HAS_GRAD_LSE:
        scale_lse = tl.load(grad_lse_ptr + row * stride_glse)
    else:
        scale_lse = 0.0
    _row_grad(
        logits_ptr + row * stride_row,
        stride_col,
        grad_ptr + row * grad_stride_row,
        grad_stride_col,
        target,
        tl.load(lse_ptr + row),
        tl.load(grad_loss_ptr + row * stride_gl),
        scale_lse,
        n_cols,
        ignore_index,
        smoothing,
        softcap,
        weight_ptr,
        stride_w,
        _weight_sum(weight_sum_ptr, HAS_SMOOTHING, HAS_WEIGHT),
        HAS_SOFTCAP,
        HAS_SMOOTHING,
        HAS_WEIGHT,
        BLOCK,
    )


class RowOptions(NamedTuple):
    """What the row kernels read beside the logits and targets. weight: None or the (V,) class
    weights, any float dtype and stride; weight_sum: their fp32 sum (a 0-d tensor, weighted
    smoothing reads it); lse_square_scale: the z-loss's factor (the forward's gradient only)."""

    ignore_index: int
    smoothing: float
    softcap: Optional[float] = None
    weight: Optional[torch.Tensor] = None
    weight_sum: Optional[torch.Tensor] = None
    lse_square_scale: float = 0.0


def row_options(ignore_index, smoothing, softcap=None, weight=None, lse_square_scale=0.0):
    """RowOptions with the weights' sum computed on the device (no host sync), where smoothing reads it."""
    weight_sum = weight.sum(dtype=torch.float32) if weight is not None and smoothing > 0 else None
    return RowOptions(ignore_index, float(smoothing), softcap, weight, weight_sum, float(lse_square_scale))


def _flags(options):
    return dict(
        HAS_SOFTCAP=options.softcap is not None,
        HAS_SMOOTHING=options.smoothing > 0,
        HAS_WEIGHT=options.weight is not None,
    )


def launch_rows(logits, target, loss, lse, options, grad_out=None, grad_scale=None, hits=None):
    """Forward over the rows of logits (N, V), any strides, and target (N,), contiguous, not range
    checked here (start_target_check): loss and lse (fp32 (N,)), and hits (fp32 (N,), the token
    accuracy's 1.0 or 0.0 a row) unless None. options: RowOptions. grad_out: None, or an (N, V)
    buffer (logits itself is allowed) for the gradient, scaled by grad_scale (fp32: the loss's
    scale, then with options.lse_square_scale the z-loss's)."""
    n, v = logits.shape
    write = grad_out is not None
    weight = options.weight
    _cross_entropy_fwd_kernel[(n,)](
        logits,
        target,
        loss,
        lse,
        hits if hits is not None else lse,
        grad_out if write else logits,
        grad_scale if write else lse,
        weight if weight is not None else lse,
        options.weight_sum if options.weight_sum is not None else lse,
        logits.stride(0),
        logits.stride(1),
        grad_out.stride(0) if write else 0,
        grad_out.stride(1) if write else 0,
        weight.stride(0) if weight is not None else 0,
        v,
        options.ignore_index,
        options.smoothing,
        float(options.softcap or 1.0),
        options.lse_square_scale,
        **_flags(options),
        HAS_Z_LOSS=write and options.lse_square_scale != 0,
        WITH_ARGMAX=hits is not None,
        WRITE_GRAD=write,
        BLOCK=block_v(v),
        num_warps=NUM_WARPS,
    )


# Measurement switch, for scripts/target_check_cost.py only (it times the ops without the check):
# with it off a bad target gives a NaN loss silently, as under CUDA-graph capture.
_CHECK_TARGETS = True


def _unchecked():
    pass


class TargetError(ValueError, IndexError):
    """A target outside [0, V) that is not ignore_index: a ValueError, as every bad argument here,
    and an IndexError, the class F.cross_entropy raises on the CPU (callers that catch it keep working)."""


def start_target_check(target, n_classes, ignore_index, enabled=True):
    """Start the range check of target (N,) against [0, n_classes): its smallest and largest entry
    that is not ignore_index (torch.aminmax with those entries set to 0: four small kernels),
    copied to pinned host memory, all enqueued now. Returns a function that waits for that copy
    (not for later work) and raises TargetError naming the bad value; call it once the loss kernels
    are launched. Where the check cannot run (CUDA-graph capture), is not wanted (not `enabled`,
    _CHECK_TARGETS off) or has nothing to read (an empty target), the function does nothing."""
    if not (enabled and _CHECK_TARGETS and target.numel()) or (
        target.is_cuda and torch.cuda.is_current_stream_capturing()
    ):
        return _unchecked
    kept = target.masked_fill(target == ignore_index, 0)  # class 0 exists (V >= 1): ignored entries pass
    bounds = torch.stack(torch.aminmax(kept))
    copied = None
    if bounds.is_cuda:
        host = torch.empty(2, dtype=bounds.dtype, pin_memory=True)
        host.copy_(bounds, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(bounds.device))
        bounds = host

    def raise_if_out_of_range():
        if copied is not None:
            copied.synchronize()
        low, high = bounds.tolist()
        bad = high if high >= n_classes else low if low < 0 else None
        if bad is not None:
            raise TargetError(f"target holds {bad}, outside [0, V={n_classes}) (and not ignore_index={ignore_index})")

    return raise_if_out_of_range


def _empty_rows(like, n):
    return like.new_empty((n,), dtype=torch.float32)


def _rows(logits, target, ignore_index, label_smoothing, weight=None, softcap=None, accuracy=False):
    n = logits.shape[0]
    check = start_target_check(target, logits.shape[1], ignore_index)
    loss, lse, hits = _empty_rows(logits, n), _empty_rows(logits, n), _empty_rows(logits, n if accuracy else 0)
    if n:
        launch_rows(
            logits,
            target,
            loss,
            lse,
            row_options(ignore_index, label_smoothing, softcap, weight),
            hits=hits if accuracy else None,
        )
    check()
    return loss, lse, hits


def launch_backward_rows(logits, target, lse, grad_loss, grad_lse, grad, options):
    """dlogits of the rows of logits (N >= 1, V) into grad (logits itself is allowed), from the
    saved lse, each row's loss gradient grad_loss (N,) and, when not None, LSE's grad_lse (N,).
    options: RowOptions (its lse_square_scale unused: a z-loss reaches the rows through grad_lse).
    target is not range checked here (start_target_check)."""
    n, v = logits.shape
    weight = options.weight
    _cross_entropy_bwd_kernel[(n,)](
        logits,
        target,
        lse,
        grad_loss,
        grad_lse if grad_lse is not None else lse,
        grad,
        weight if weight is not None else lse,
        options.weight_sum if options.weight_sum is not None else lse,
        logits.stride(0),
        logits.stride(1),
        grad.stride(0),
        grad.stride(1),
        grad_loss.stride(0),
        grad_lse.stride(0) if grad_lse is not None else 0,
        weight.stride(0) if weight is not None else 0,
        v,
        options.ignore_index,
        options.smoothing,
        float(options.softcap or 1.0),
        HAS_GRAD_LSE=grad_lse is not None,
        **_flags(options),
        BLOCK=block_v(v),
        num_warps=NUM_WARPS,
    )


def _backward_rows(
    grad_loss,
    grad_lse,
    logits,
    target,
    lse,
    ignore_index,
    label_smoothing,
    check_target=True,
    weight=None,
    softcap=None,
):
    check = start_target_check(target, logits.shape[1], ignore_index, check_target)
    grad = torch.empty_like(logits)
    if logits.shape[0]:
        launch_backward_rows(
            logits, target, lse, grad_loss, grad_lse, grad, row_options(ignore_index, label_smoothing, softcap, weight)
        )
    check()
    return grad


# check_target: False from the autograd formula, whose forward checked the same target
cross_entropy_backward_op = define_op(
    "cross_entropy_backward(Tensor grad_loss, Tensor? grad_lse, Tensor logits, Tensor target, Tensor lse, "
    "int ignore_index, float label_smoothing, bool check_target=True, Tensor? weight=None, float? softcap=None) "
    "-> Tensor",
    _backward_rows,
    lambda grad_loss, grad_lse, logits, *rest: torch.empty_like(logits),
)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs.logits, inputs.target, output[1], inputs.weight)
    ctx.options = dict(ignore_index=inputs.ignore_index, label_smoothing=inputs.label_smoothing)
    ctx.softcap = inputs.softcap
    ctx.mark_non_differentiable(output[2])  # the hits: a metric
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, grad_lse, _):
    logits, target, lse, weight = ctx.saved_tensors
    if grad_loss is None and grad_lse is None:
        return (None,) * 7
    if grad_loss is None:
        grad_loss = torch.zeros_like(lse)
    grad = cross_entropy_backward_op(
        grad_loss, grad_lse, logits, target, lse, check_target=False, weight=weight, softcap=ctx.softcap, **ctx.options
    )
    return grad, None, None, None, None, None, None


def _fake_rows(logits, target, ignore_index, label_smoothing, weight=None, softcap=None, accuracy=False):
    n = logits.shape[0]
    return _empty_rows(logits, n), _empty_rows(logits, n), _empty_rows(logits, n if accuracy else 0)


cross_entropy_op = define_op(
    "cross_entropy(Tensor logits, Tensor target, int ignore_index, float label_smoothing, Tensor? weight=None, "
    "float? softcap=None, bool accuracy=False) -> (Tensor, Tensor, Tensor)",
    _rows,
    _fake_rows,
    backward=_backward,
    setup_context=_setup,
)


def check_loss_args(target, expected_shape, ignore_index, reduction, label_smoothing, device):
    """The checks every loss of this folder shares (target's type and shape, the options)."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"target must have dtype int64 or int32 (class indices), got {target.dtype}")
    if target.device != device:
        raise ValueError(f"target is on {target.device} but the logits are on {device}")
    if tuple(target.shape) != tuple(expected_shape):
        raise ValueError(
            f"target must have shape {tuple(expected_shape)} (one class index a row), got {tuple(target.shape)}"
        )
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")


def check_loss_options(
    weight_name, weight, n_classes, device, lse_square_scale, softcap, return_z_loss, return_token_accuracy
):
    """The options both losses take beside F.cross_entropy's: class weights (named weight_name),
    the z-loss, the softcap and the extra outputs. Returns softcap as the operators' float or None."""
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"{weight_name} must be None or a torch.Tensor, got {type(weight).__name__}")
        if not weight.is_floating_point():
            raise TypeError(f"{weight_name} must have a floating-point dtype (one weight a class), got {weight.dtype}")
        if tuple(weight.shape) != (n_classes,) or weight.device != device:
            raise ValueError(
                f"{weight_name} must have shape ({n_classes},) (one weight a class) on {device}, got "
                f"{tuple(weight.shape)} on {weight.device}"
            )
        if needs_grad(weight):
            raise ValueError(
                f"{weight_name} must not require grad: the loss has no gradient for the class weights "
                "(as F.cross_entropy's); pass weight.detach()"
            )
    if (
        not isinstance(lse_square_scale, (int, float))
        or isinstance(lse_square_scale, bool)
        or not (math.isfinite(lse_square_scale) and lse_square_scale >= 0)
    ):
        raise ValueError(f"lse_square_scale must be a finite number >= 0 (0: no z-loss), got {lse_square_scale!r}")
    if softcap is not None and not (
        isinstance(softcap, (int, float)) and not isinstance(softcap, bool) and math.isfinite(softcap) and softcap > 0
    ):
        raise ValueError(f"softcap must be a positive finite number or None, got {softcap!r}")
    for name, flag in (("return_z_loss", return_z_loss), ("return_token_accuracy", return_token_accuracy)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    return None if softcap is None else float(softcap)


def target_weights(weight, target, ignore_index):
    """The class weight of each row's target, 0 for an ignored one, fp32 (N,): the weighted "mean"
    divides by their sum. A target outside [0, V) (unchecked under graph capture) reads class 0."""
    kept = target != ignore_index
    inside = kept & (target >= 0) & (target < weight.shape[0])
    return torch.where(kept, weight.float()[torch.where(inside, target, 0)], 0.0)


def z_rows(lse, target, ignore_index, lse_square_scale):
    """The z-loss of each row, lse_square_scale * lse^2, 0 for an ignored target (fp32 (N,))."""
    return lse_square_scale * torch.where(target != ignore_index, lse.square(), 0.0)


def reduce_rows(rows, target, ignore_index, reduction, dtype, weight=None, lse=None, lse_square_scale=0.0):
    """The per-row fp32 losses reduced as F.cross_entropy does (a weighted "mean" divides by the
    sum of the targets' weights), in `dtype`; with lse (fp32 (N,)) and lse_square_scale, plus the
    z-loss (z_rows), whose "mean" divides by the count of targets not ignored (Liger-Kernel's), and
    whose gradient reaches the logits through lse. target: the caller's shape."""
    flat = target.reshape(-1)
    if reduction == "none":
        loss = rows
    elif reduction == "sum":
        loss = rows.sum()
    elif weight is None:
        loss = rows.sum() / (flat != ignore_index).sum()
    else:
        loss = rows.sum() / target_weights(weight, flat, ignore_index).sum()
    if lse is not None and lse_square_scale:
        loss = loss + _reduce_z(z_rows(lse, flat, ignore_index, lse_square_scale), flat, ignore_index, reduction)
    return (loss.reshape(target.shape) if reduction == "none" else loss).to(dtype)


def _reduce_z(z, flat, ignore_index, reduction):
    """The z-loss rows (N,) fp32 reduced: kept as rows ("none"), summed, or their mean over the
    targets not ignored (unweighted, as Liger-Kernel's, class weights or not)."""
    if reduction == "none":
        return z
    return z.sum() / (flat != ignore_index).sum() if reduction == "mean" else z.sum()


class LossOutput(NamedTuple):
    """What a loss returns when an extra output is asked for: the loss (z-loss included), the
    z-loss term (reduced as the loss, detached: for logging) and the token accuracy (fp32, no
    gradient), each None when not asked for."""

    loss: torch.Tensor
    z_loss: Optional[torch.Tensor]
    token_accuracy: Optional[torch.Tensor]


def reduce_extras(target, ignore_index, reduction, dtype, lse=None, lse_square_scale=0.0, hits=None):
    """(z_loss, token_accuracy) of LossOutput from the fp32 rows' LSE (z-loss asked for) and hits
    (accuracy asked for), either None: "none" gives rows shaped like target (0 where ignored);
    "mean" and "sum" the z-loss's mean over the targets not ignored (unweighted, as Liger-Kernel's)
    or sum, and the accuracy's share of those targets (NaN when every target is ignored)."""
    flat = target.reshape(-1)
    z = None
    if lse is not None:
        z = _reduce_z(z_rows(lse.detach(), flat, ignore_index, lse_square_scale), flat, ignore_index, reduction)
        z = (z.reshape(target.shape) if reduction == "none" else z).to(dtype)
    if hits is not None:
        hits = hits.reshape(target.shape) if reduction == "none" else hits.sum() / (flat != ignore_index).sum()
    return z, hits


def cross_entropy(
    logits,
    target,
    ignore_index=-100,
    reduction="mean",
    label_smoothing=0.0,
    *,
    weight=None,
    lse_square_scale=0.0,
    softcap=None,
    return_z_loss=False,
    return_token_accuracy=False,
):
    """Cross-entropy of logits against class indices (operators llmk::cross_entropy and
    llmk::cross_entropy_backward), as F.cross_entropy with the class dimension last.

    logits: (..., V) fp16, bf16 or fp32, any strides; V >= 1 (tested to 262144).
    target: (...) int64 or int32, class indices in [0, V) or ignore_index; any strides.
    reduction: "mean" (over targets not ignored; NaN when all are), "sum" or "none" (a loss a row,
    shaped like target). label_smoothing: eps in [0, 1].
    weight: None or (V,) class weights, any float dtype, not requiring grad: F.cross_entropy's, so a
       row's loss is w_t (lse - x_t) and the weighted "mean" divides by the sum of the targets'
       weights; with label smoothing, torch's (1 - eps) w_t (lse - x_t) + eps / V * sum_j w_j
       (lse - x_j) (Liger-Kernel's too).
    lse_square_scale: the z-loss s (PaLM's; Liger-Kernel's semantics): s * lse^2 added to the loss
       of each row not ignored; "mean" divides that sum by the count of targets not ignored
       (unweighted, even with class weights).
    softcap: None or c > 0: logits -> c * tanh(logits / c) before the softmax (Gemma 2's).
    return_z_loss, return_token_accuracy: also return the z-loss term (reduced as the loss,
       detached) and the share of targets not ignored whose logit is the row's first largest
       (fp32, no gradient; "none": 1.0 or 0.0 a row, 0 for an ignored one).
    Returns the loss in logits' dtype, computed in fp32; with either return_* flag, a LossOutput
    (loss, z_loss, token_accuracy) with None for what was not asked for. Differentiable in logits;
    the gradient is computed from the saved logits and the per-row LSE (4 bytes a row), none of it
    stored in the forward.
    Raises TargetError (a ValueError and an IndexError) for a target outside [0, V) that is not
    ignore_index, checked by the operator after its kernels are launched and before it returns (one
    16-byte read by the host; module docstring), in eager calls and in compiled graphs alike. Under
    CUDA-graph capture there is no check: such a row's loss is NaN (so is a "mean" or "sum" loss)
    and its gradient finite, missing the target's one-hot term.
    """
    check_tensor("logits", logits)
    if logits.shape[-1] < 1:
        raise ValueError(f"logits must have at least one class (last dim), got shape {tuple(logits.shape)}")
    check_loss_args(target, logits.shape[:-1], ignore_index, reduction, label_smoothing, logits.device)
    softcap = check_loss_options(
        "weight",
        weight,
        logits.shape[-1],
        logits.device,
        lse_square_scale,
        softcap,
        return_z_loss,
        return_token_accuracy,
    )
    flat = target.reshape(-1).contiguous()
    rows, lse, hits = cross_entropy_op(
        logits.reshape(-1, logits.shape[-1]),
        flat,
        ignore_index=ignore_index,
        label_smoothing=float(label_smoothing),
        weight=weight,
        softcap=softcap,
        accuracy=return_token_accuracy,
    )
    loss = reduce_rows(rows, target, ignore_index, reduction, logits.dtype, weight, lse, float(lse_square_scale))
    if not (return_z_loss or return_token_accuracy):
        return loss
    return LossOutput(
        loss,
        *reduce_extras(
            target,
            ignore_index,
            reduction,
            logits.dtype,
            lse if return_z_loss else None,
            float(lse_square_scale),
            hits if return_token_accuracy else None,
        ),
    )
