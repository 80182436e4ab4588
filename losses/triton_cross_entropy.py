"""Cross-entropy over logits in Triton, forward and backward, rows up to 262144 classes wide.

    loss = cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0)

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

Targets outside [0, V) that are not ignore_index raise IndexError, as F.cross_entropy on the CPU
does. The check (start_target_check) runs in the operators' implementations, not in the public
function: every entry that takes a target reaches one (this file's and fused_linear_cross_entropy's
public functions, torch.ops.llmk.* called directly), torch.compile never traces it (the fake
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

The shared row code also serves losses/triton_fused_linear_cross_entropy.py: `launch_rows` with
`grad_out` writes the gradient in the same launch as the loss, reading the row twice (softcap too).

Operators: llmk::cross_entropy -> (loss rows, LSE) and llmk::cross_entropy_backward.
"""
import torch
import triton
import triton.language as tl

from llmk.common.device import INTERPRET
from llmk.common.ints import next_power_of_2
from llmk.common.ops import define_op
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
def _row_loss(row_ptr, stride_col, target, n_cols, ignore_index, smoothing, softcap,
              HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, BLOCK: tl.constexpr):
    """(loss, LSE) of one row, fp32: one pass with an online max and sum. -inf logits (a masked
    vocabulary) are classes of probability 0, as in F.cross_entropy."""
    offs = tl.arange(0, BLOCK)
    m = tl.full([], float("-inf"), tl.float32)
    s = tl.zeros([], tl.float32)
    row_sum = tl.zeros([], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        x = tl.load(row_ptr + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
        x, _ = _capped(x, softcap, HAS_SOFTCAP)
        if HAS_SMOOTHING:  # only smoothing reads the row's sum (-inf in it makes the loss inf, as torch's)
            row_sum += tl.sum(tl.where(mask, x, 0.0))
        x = tl.where(mask, x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, 0))
        # while every logit so far is -inf, subtract 0: -inf - -inf would be NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.math.exp2((m - m_safe) * LOG2E) + tl.sum(tl.math.exp2((x - m_safe) * LOG2E))
        m = m_new
    lse = m + tl.math.log2(s) * LN2
    valid = (target >= 0) & (target < n_cols)
    x_t = tl.load(row_ptr + tl.where(valid, target, 0).to(tl.int64) * stride_col).to(tl.float32)
    x_t, _ = _capped(x_t, softcap, HAS_SOFTCAP)
    loss = lse - x_t
    if HAS_SMOOTHING:
        loss = (1.0 - smoothing) * loss + smoothing * (lse - row_sum / n_cols)
    loss = tl.where(valid, loss, float("nan"))
    return tl.where(target == ignore_index, 0.0, loss), lse


@triton.jit
def _row_grad(row_ptr, stride_col, grad_ptr, grad_stride_col, target, lse, scale, scale_lse, n_cols,
              ignore_index, smoothing, softcap, HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    """Write scale * (p - (1 - eps) * onehot - eps / V) + scale_lse * p for one row (the first term
    zero for an ignored target), times the softcap's derivative. grad_ptr may be row_ptr (in place: each
    chunk is read before it is written, by this program only)."""
    offs = tl.arange(0, BLOCK)
    ignored = target == ignore_index
    for start in range(0, n_cols, BLOCK):
        cols = start + offs
        mask = cols < n_cols
        z = tl.load(row_ptr + cols * stride_col, mask=mask, other=0.0).to(tl.float32)
        x, th = _capped(z, softcap, HAS_SOFTCAP)
        p = tl.math.exp2((x - lse) * LOG2E)
        g = scale * (p - smoothing / n_cols - tl.where(cols == target, 1.0 - smoothing, 0.0))
        g = tl.where(ignored, 0.0, g) + scale_lse * p  # an ignored row's LSE still has a gradient
        if HAS_SOFTCAP:
            g = g * (1.0 - th * th)
        tl.store(grad_ptr + cols * grad_stride_col, g.to(grad_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _cross_entropy_fwd_kernel(
    logits_ptr, target_ptr, loss_ptr, lse_ptr, grad_ptr, grad_scale_ptr,
    stride_row, stride_col, grad_stride_row, grad_stride_col, n_cols, ignore_index, smoothing, softcap,
    HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    """Loss and LSE of row program_id(0); with WRITE_GRAD also its gradient, scaled by the one
    fp32 value at grad_scale_ptr (fused linear cross-entropy: 1 / n_valid for "mean", 1 for "sum")."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    target = tl.load(target_ptr + row).to(tl.int64)
    loss, lse = _row_loss(row_ptr, stride_col, target, n_cols, ignore_index, smoothing, softcap, HAS_SOFTCAP,
                          HAS_SMOOTHING, BLOCK)
    tl.store(loss_ptr + row, loss)
    tl.store(lse_ptr + row, lse)
    if WRITE_GRAD:
        _row_grad(row_ptr, stride_col, grad_ptr + row * grad_stride_row, grad_stride_col, target, lse,
                  tl.load(grad_scale_ptr), 0.0, n_cols, ignore_index, smoothing, softcap, HAS_SOFTCAP, BLOCK)


@triton.jit
def _cross_entropy_bwd_kernel(
    logits_ptr, target_ptr, lse_ptr, grad_loss_ptr, grad_lse_ptr, grad_ptr,
    stride_row, stride_col, grad_stride_row, grad_stride_col, stride_gl, stride_glse,
    n_cols, ignore_index, smoothing, softcap,
    HAS_GRAD_LSE: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK: tl.constexpr,
):
    """dlogits of row program_id(0) from its saved LSE, its loss's gradient and LSE's (if used).
    grad_ptr may be logits_ptr (fused linear cross-entropy's chunk buffer, rewritten in place)."""
    row = tl.program_id(0).to(tl.int64)
    target = tl.load(target_ptr + row).to(tl.int64)
    if HAS_GRAD_LSE:
        scale_lse = tl.load(grad_lse_ptr + row * stride_glse)
    else:
        scale_lse = 0.0
    _row_grad(logits_ptr + row * stride_row, stride_col, grad_ptr + row * grad_stride_row, grad_stride_col, target,
              tl.load(lse_ptr + row), tl.load(grad_loss_ptr + row * stride_gl), scale_lse, n_cols, ignore_index,
              smoothing, softcap, HAS_SOFTCAP, BLOCK)


def launch_rows(logits, target, loss, lse, ignore_index, smoothing, softcap=None, grad_out=None, grad_scale=None):
    """Forward over the rows of logits (N, V), any strides, and target (N,), contiguous, not range
    checked here (start_target_check): loss and lse (fp32 (N,)). grad_out:
    None, or an (N, V) buffer (logits itself is allowed) for the gradient, scaled by grad_scale
    (a one-element fp32 tensor)."""
    n, v = logits.shape
    write = grad_out is not None
    _cross_entropy_fwd_kernel[(n,)](
        logits, target, loss, lse, grad_out if write else logits, grad_scale if write else lse,
        logits.stride(0), logits.stride(1), grad_out.stride(0) if write else 0, grad_out.stride(1) if write else 0,
        v, ignore_index, float(smoothing), float(softcap or 1.0),
        HAS_SOFTCAP=softcap is not None, HAS_SMOOTHING=smoothing > 0, WRITE_GRAD=write, BLOCK=block_v(v),
        num_warps=NUM_WARPS)


# Measurement switch, for scripts/target_check_cost.py only (it times the ops without the check):
# with it off a bad target gives a NaN loss silently, as under CUDA-graph capture.
_CHECK_TARGETS = True


def _unchecked():
    pass


def start_target_check(target, n_classes, ignore_index, enabled=True):
    """Start the range check of target (N,) against [0, n_classes): its smallest and largest entry
    that is not ignore_index (torch.aminmax with those entries set to 0: four small kernels),
    copied to pinned host memory, all enqueued now. Returns a function that waits for that copy
    (not for later work) and raises IndexError naming the bad value; call it once the loss kernels
    are launched. Where the check cannot run (CUDA-graph capture), is not wanted (not `enabled`,
    _CHECK_TARGETS off) or has nothing to read (an empty target), the function does nothing."""
    if not (enabled and _CHECK_TARGETS and target.numel()) or (target.is_cuda and
                                                               torch.cuda.is_current_stream_capturing()):
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
            raise IndexError(f"target holds {bad}, outside [0, V={n_classes}) (and not ignore_index={ignore_index})")

    return raise_if_out_of_range


def _rows(logits, target, ignore_index, label_smoothing):
    n = logits.shape[0]
    check = start_target_check(target, logits.shape[1], ignore_index)
    loss = logits.new_empty((n,), dtype=torch.float32)
    lse = logits.new_empty((n,), dtype=torch.float32)
    if n:
        launch_rows(logits, target, loss, lse, ignore_index, label_smoothing)
    check()
    return loss, lse


def launch_backward_rows(logits, target, lse, grad_loss, grad_lse, grad, ignore_index, smoothing, softcap=None):
    """dlogits of the rows of logits (N >= 1, V) into grad (logits itself is allowed), from the
    saved lse, each row's loss gradient grad_loss (N,) and, when not None, LSE's grad_lse (N,).
    target is not range checked here (start_target_check)."""
    n, v = logits.shape
    _cross_entropy_bwd_kernel[(n,)](
        logits, target, lse, grad_loss, grad_lse if grad_lse is not None else lse, grad,
        logits.stride(0), logits.stride(1), grad.stride(0), grad.stride(1), grad_loss.stride(0),
        grad_lse.stride(0) if grad_lse is not None else 0, v, ignore_index, float(smoothing), float(softcap or 1.0),
        HAS_GRAD_LSE=grad_lse is not None, HAS_SOFTCAP=softcap is not None, BLOCK=block_v(v), num_warps=NUM_WARPS)


def _backward_rows(grad_loss, grad_lse, logits, target, lse, ignore_index, label_smoothing, check_target=True):
    check = start_target_check(target, logits.shape[1], ignore_index, check_target)
    grad = torch.empty_like(logits)
    if logits.shape[0]:
        launch_backward_rows(logits, target, lse, grad_loss, grad_lse, grad, ignore_index, label_smoothing)
    check()
    return grad


# check_target: False from the autograd formula, whose forward checked the same target
cross_entropy_backward_op = define_op(
    "cross_entropy_backward(Tensor grad_loss, Tensor? grad_lse, Tensor logits, Tensor target, Tensor lse, "
    "int ignore_index, float label_smoothing, bool check_target=True) -> Tensor",
    _backward_rows, lambda grad_loss, grad_lse, logits, *rest: torch.empty_like(logits))


def _setup(ctx, inputs, output):
    logits, target, ignore_index, label_smoothing = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.ignore_index, ctx.label_smoothing = ignore_index, label_smoothing
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, grad_lse):
    logits, target, lse = ctx.saved_tensors
    if grad_loss is None and grad_lse is None:
        return None, None, None, None
    if grad_loss is None:
        grad_loss = torch.zeros_like(lse)
    grad = cross_entropy_backward_op(grad_loss, grad_lse, logits, target, lse, ctx.ignore_index,
                                     ctx.label_smoothing, False)
    return grad, None, None, None


cross_entropy_op = define_op(
    "cross_entropy(Tensor logits, Tensor target, int ignore_index, float label_smoothing) -> (Tensor, Tensor)",
    _rows,
    lambda logits, target, *rest: (logits.new_empty((logits.shape[0],), dtype=torch.float32),
                                   logits.new_empty((logits.shape[0],), dtype=torch.float32)),
    backward=_backward, setup_context=_setup)


def check_loss_args(target, expected_shape, ignore_index, reduction, label_smoothing, device):
    """The checks every loss of this folder shares (target's type and shape, the options)."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"target must have dtype int64 or int32 (class indices), got {target.dtype}")
    if target.device != device:
        raise ValueError(f"target is on {target.device} but the logits are on {device}")
    if tuple(target.shape) != tuple(expected_shape):
        raise ValueError(f"target must have shape {tuple(expected_shape)} (one class index a row), "
                         f"got {tuple(target.shape)}")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")


def reduce_rows(rows, target, ignore_index, reduction, dtype):
    """The per-row fp32 losses reduced as F.cross_entropy does, in `dtype`."""
    if reduction == "none":
        return rows.reshape(target.shape).to(dtype)
    total = rows.sum()
    if reduction == "sum":
        return total.to(dtype)
    return (total / (target != ignore_index).sum()).to(dtype)


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """Cross-entropy of logits against class indices (operators llmk::cross_entropy and
    llmk::cross_entropy_backward), as F.cross_entropy with the class dimension last.

    logits: (..., V) fp16, bf16 or fp32, any strides; V >= 1 (tested to 262144).
    target: (...) int64 or int32, class indices in [0, V) or ignore_index; any strides.
    reduction: "mean" (over targets not ignored; NaN when all are), "sum" or "none" (a loss a row,
    shaped like target). label_smoothing: eps in [0, 1].
    Returns the loss in logits' dtype, computed in fp32. Differentiable in logits; the gradient is
    computed from the saved logits and the per-row LSE (4 bytes a row), none of it stored in the
    forward.
    Raises IndexError for a target outside [0, V) that is not ignore_index, checked by the operator
    after its kernels are launched and before it returns (one 16-byte read by the host; module
    docstring), in eager calls and in compiled graphs alike. Under CUDA-graph capture there is no
    check: such a row's loss is NaN (so is a "mean" or "sum" loss) and its gradient finite, missing
    the target's one-hot term.
    """
    check_tensor("logits", logits)
    if logits.shape[-1] < 1:
        raise ValueError(f"logits must have at least one class (last dim), got shape {tuple(logits.shape)}")
    check_loss_args(target, logits.shape[:-1], ignore_index, reduction, label_smoothing, logits.device)
    rows, _ = cross_entropy_op(logits.reshape(-1, logits.shape[-1]), target.reshape(-1).contiguous(), ignore_index,
                               float(label_smoothing))
    return reduce_rows(rows, target, ignore_index, reduction, logits.dtype)
