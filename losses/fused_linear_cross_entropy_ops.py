"""The LM head and its loss in one op: cross_entropy(hidden @ weight.T + bias, target) without
the (tokens x vocab) logits.

    loss = fused_linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100,
                                      reduction="mean", label_smoothing=0.0, softcap=None)

At a 128k-152k vocabulary the logits of a training batch and their gradient are the largest
tensors of the step (BT x V, 4 GB in fp32 at 8192 x 128256). Here the tokens go in chunks of
C rows (chunk_rows: CHUNK_ROWS, a (C, V) buffer):

    logits_c = hidden_c @ weight.T + bias           one GEMM into a (C, V) buffer in hidden's dtype
    loss_c, dlogits_c                               losses/triton_cross_entropy.py's row kernel, one launch:
                                                    the rows' losses, and their gradient written
                                                    over logits_c in place (softcap applied in fp32)
    grad_hidden_c = dlogits_c @ weight              a GEMM into grad_hidden's rows
    grad_weight  += dlogits_c.T @ hidden_c          an accumulating GEMM (beta = 1)
    grad_bias    += column sums of dlogits_c        in fp32

so the gradients are done when the forward is: three GEMMs of 2 * BT * V * H FLOPs each, the
minimum, and the only memory beyond the gradients is one (C, V) buffer. The backward then scales
them by the loss's gradient (a scalar for "mean" and "sum"), in place. "mean" divides by the
number of targets that are not ignored, counted on the device (no host sync).

reduction="none" cannot fold the upstream gradient in ahead of time (each row's differs): its
forward computes the losses only, and its backward recomputes each chunk's logits (a fourth GEMM)
and writes dlogits with each row's gradient (the cross-entropy backward kernel).

GEMMs: cuBLAS through torch.mm / addmm, which accumulate into grad_weight in place (beta = 1);
gemm/matmul_ops.py's kernels write a fresh output. grad_weight accumulates in weight's dtype,
so in bf16 it is rounded once a chunk (BT / C roundings, as Liger-Kernel's does); fp32 weights
accumulate in fp32.

class_weight, lse_square_scale (the z-loss, folded into the forward's gradient), return_z_loss and
return_token_accuracy: cross_entropy's options (losses/triton_cross_entropy.py), through the same row
kernel; the operators return each row's LSE and, asked for, its hit.

Targets outside [0, V) that are not ignore_index raise TargetError (a ValueError and an IndexError),
checked in the operators' implementations as losses/triton_cross_entropy.py's (start_target_check,
its module docstring says why there): the check is enqueued ahead of the first chunk's GEMM and read
once every chunk is launched, so the host waits for the GPU to reach it while the chunks are queued,
and the op raises before it returns. The recomputing backward operator checks when called on its
own; autograd calls it with check_target=False, on the target its forward checked. Under CUDA-graph
capture there is no check: a bad target's row gets a NaN loss ("mean" and "sum" are NaN) and finite
gradients, its dlogits g * (softmax(logits) - eps / V) (times the softcap's derivative), without the
target's one-hot term.

grad_in_place=True writes grad_hidden over hidden itself, chunk by chunk, each chunk's rows once
its grad_weight product has read them (llmk::fused_linear_cross_entropy_in_place): the (BT, H)
grad_hidden is then not a tensor of its own, 34 MB at a 1.5B Llama's 8192 x 2048, at the moment
of the training step's peak (the end of the forward, with every layer's saved activations live).
It is for a hidden nothing reads afterwards (an LM head's input), and only where that can be told
safely (fused_linear_cross_entropy's docstring): otherwise the call is the functional operator's.

Operators: llmk::fused_linear_cross_entropy (the loss and, under grad, the gradients),
llmk::fused_linear_cross_entropy_none (the loss rows of reduction "none"),
llmk::fused_linear_cross_entropy_backward (the recomputing backward of reduction "none") and
llmk::fused_linear_cross_entropy_in_place (grad_in_place's forward).
"""

import torch

from llmk.common.device import INTERPRET
from llmk.common.ops import define_op, needs_grad
from llmk.common.torch_private import dispatch_mode_depth, functorch_active
from llmk.common.validation import check_same_device, check_tensor
from llmk.losses.triton_cross_entropy import (
    LossOutput,
    check_loss_args,
    check_loss_options,
    launch_backward_rows,
    launch_rows,
    reduce_extras,
    reduce_rows,
    row_options,
    start_target_check,
    target_weights,
)

# Rows C of a chunk. Every chunk's grad_weight += dlogits_c.T @ hidden_c reads and writes all of
# grad_weight (V x H, 4VH bytes) for 2CVH FLOPs: C / 2 FLOPs a byte, whatever V and H. An H100 does
# ~700 TFLOP/s against 3 TB/s, ~230 FLOPs a byte, so from C ~ 460 the accumulation runs at the
# tensor cores' pace and below it at memory's: 512 rows. The (C, V) buffer is then the op's only
# scratch: 131 MB at V = 128256 in bf16. The sweep on an H100: docs/tuning/losses.md.
CHUNK_ROWS = 512
# The buffer's bytes at most: fewer rows for fp32 logits of a very large vocabulary
MAX_CHUNK_BYTES = 256 * 2**20
CHUNK_ALIGN = 64  # a GEMM-friendly row count
# The interpreter's chunk: a few rows, so the tests' batches run several chunks and a ragged last one
INTERPRET_CHUNK = 8


def chunk_rows(n, v, element_size):
    """Rows a chunk: CHUNK_ROWS, fewer where the (C, V) buffer would pass MAX_CHUNK_BYTES (a
    multiple of CHUNK_ALIGN, at least CHUNK_ALIGN), at least one and at most n."""
    if INTERPRET:
        return max(1, min(n, INTERPRET_CHUNK))
    fit = MAX_CHUNK_BYTES // max(v * element_size, 1) // CHUNK_ALIGN * CHUNK_ALIGN
    return max(1, min(n, CHUNK_ROWS, max(CHUNK_ALIGN, fit)))


def _chunks(hidden, weight, bias):
    """(index, rows slice, the chunk's logits) for each chunk of hidden's rows in turn, the logits
    (C, V) = hidden_c @ weight.T + bias written into one buffer that every chunk reuses."""
    n, v = hidden.shape[0], weight.shape[0]
    c = chunk_rows(n, v, hidden.element_size())
    buffer = hidden.new_empty((c, v))
    for i, start in enumerate(range(0, n, c)):
        rows = slice(start, min(start + c, n))
        out = buffer[: rows.stop - start]
        if bias is not None:
            torch.addmm(bias, hidden[rows], weight.T, out=out)
        else:
            torch.mm(hidden[rows], weight.T, out=out)
        yield i, rows, out


def _accumulate(dlogits, hidden_c, weight, grad_hidden_c, grad_weight, grad_bias, first):
    """The three gradient products of one chunk, from its dlogits. grad_weight's reads hidden_c
    before grad_hidden_c is written, so grad_hidden_c may be hidden_c itself (grad_in_place)."""
    if grad_weight is not None:
        if first:
            torch.mm(dlogits.T, hidden_c, out=grad_weight)
        else:
            grad_weight.addmm_(dlogits.T, hidden_c)
    if grad_hidden_c is not None:
        torch.mm(dlogits, weight, out=grad_hidden_c)
    if grad_bias is not None:
        grad_bias += dlogits.sum(0, dtype=torch.float32)


def _grad_scales(target, ignore_index, reduction, class_weight, lse_square_scale):
    """The scales of the gradients computed in the forward (fp32 (1,), or (2,) with a z-loss): the
    loss rows' (1 / the count of targets not ignored for "mean", 1 / their weights' sum with
    class weights, 1 for "sum"), then the z-loss's (1 / that count, or 1). On the device, no sync."""
    ones = torch.ones(2 if lse_square_scale else 1, device=target.device)
    if reduction != "mean":
        return ones
    count = (target != ignore_index).sum().float()
    rows = count if class_weight is None else target_weights(class_weight, target, ignore_index).sum()
    return ones / (torch.stack((rows, count)) if lse_square_scale else rows.reshape(1))


def _forward(
    hidden,
    weight,
    target,
    bias,
    ignore_index,
    label_smoothing,
    softcap,
    reduction,
    grads,
    class_weight=None,
    lse_square_scale=0.0,
    accuracy=False,
    over_hidden=False,
):
    """(loss, grad_hidden, grad_weight, grad_bias, lse, hits): loss fp32 (the z-loss included), a
    scalar for "mean"/"sum" or (N,) rows for "none"; the
    gradients of the loss (for grad_output 1) when `grads` (three bools: of hidden, weight, bias),
    else empty tensors; lse fp32 (N,); hits fp32 (N,) with `accuracy`, else empty. over_hidden:
    grad_hidden is written over hidden itself, a chunk's rows once its products have read them
    (llmk::fused_linear_cross_entropy_in_place)."""
    n, v = hidden.shape[0], weight.shape[0]
    rows = hidden.new_empty((n,), dtype=torch.float32)
    lse = hidden.new_empty((n,), dtype=torch.float32)
    hits = hidden.new_empty((n if accuracy else 0,), dtype=torch.float32)
    want_h, want_w, want_b = grads if reduction != "none" else (False, False, False)
    grad_hidden = (hidden if over_hidden else torch.empty_like(hidden)) if want_h else hidden.new_empty((0,))
    grad_weight = torch.empty_like(weight) if want_w else hidden.new_empty((0,))
    grad_bias = torch.zeros(v, device=hidden.device, dtype=torch.float32) if want_b else hidden.new_empty((0,))
    any_grad = want_h or want_w or want_b
    options = row_options(ignore_index, label_smoothing, softcap, class_weight, lse_square_scale)
    check = start_target_check(target, v, ignore_index)
    scale = _grad_scales(target, ignore_index, reduction, class_weight, lse_square_scale) if any_grad else None
    if n:
        for i, r, logits in _chunks(hidden, weight, bias):
            launch_rows(
                logits,
                target[r],
                rows[r],
                lse[r],
                options,
                grad_out=logits if any_grad else None,
                grad_scale=scale,
                hits=hits[r] if accuracy else None,
            )
            if any_grad:
                _accumulate(
                    logits,
                    hidden[r],
                    weight,
                    grad_hidden[r] if want_h else None,
                    grad_weight if want_w else None,
                    grad_bias if want_b else None,
                    i == 0,
                )
    elif any_grad:
        for g in (grad_hidden, grad_weight, grad_bias):
            g.zero_()
    check()
    loss = reduce_rows(rows, target, ignore_index, reduction, torch.float32, class_weight, lse, lse_square_scale)
    return loss, grad_hidden, grad_weight, grad_bias.to(bias.dtype) if want_b else grad_bias, lse, hits


def _fake(
    hidden,
    weight,
    target,
    bias,
    ignore_index,
    label_smoothing,
    softcap,
    reduction,
    grads,
    class_weight=None,
    lse_square_scale=0.0,
    accuracy=False,
):
    n = hidden.shape[0]
    want_h, want_w, want_b = grads if reduction != "none" else (False, False, False)
    return (
        hidden.new_empty((n,) if reduction == "none" else (), dtype=torch.float32),
        torch.empty_like(hidden) if want_h else hidden.new_empty((0,)),
        torch.empty_like(weight) if want_w else hidden.new_empty((0,)),
        bias.new_empty(bias.shape) if want_b else hidden.new_empty((0,)),
        hidden.new_empty((n,), dtype=torch.float32),
        hidden.new_empty((n if accuracy else 0,), dtype=torch.float32),
    )


def _backward_none(
    grad_rows,
    grad_lse,
    hidden,
    weight,
    target,
    bias,
    lse,
    ignore_index,
    label_smoothing,
    softcap,
    grads,
    check_target=True,
    class_weight=None,
):
    """(grad_hidden, grad_weight, grad_bias) of reduction "none" for the rows' gradients
    grad_rows (N,) and, when not None, the LSE's grad_lse (N,) (a z-loss's): each chunk's logits
    again, dlogits with each row's gradients, the products.
    grads: three bools (hidden, weight, bias); a gradient not asked for is an empty tensor, and
    its product is skipped (a frozen head's V x H grad_weight is never made). check_target: False
    from the autograd formula, whose forward checked the same target."""
    check = start_target_check(target, weight.shape[0], ignore_index, check_target)
    want_h, want_w, want_b = grads
    grad_hidden = torch.empty_like(hidden) if want_h else hidden.new_empty((0,))
    grad_weight = torch.empty_like(weight) if want_w else hidden.new_empty((0,))
    grad_bias = (
        torch.zeros(weight.shape[0], device=hidden.device, dtype=torch.float32) if want_b else hidden.new_empty((0,))
    )
    options = row_options(ignore_index, label_smoothing, softcap, class_weight)
    if not hidden.shape[0]:
        grad_hidden.zero_(), grad_weight.zero_()
    elif want_h or want_w or want_b:
        for i, r, logits in _chunks(hidden, weight, bias):
            # dlogits with each row's gradient, over the chunk's logits in place
            launch_backward_rows(
                logits, target[r], lse[r], grad_rows[r], None if grad_lse is None else grad_lse[r], logits, options
            )
            _accumulate(
                logits,
                hidden[r],
                weight,
                grad_hidden[r] if want_h else None,
                grad_weight if want_w else None,
                grad_bias if want_b else None,
                i == 0,
            )
    check()
    return grad_hidden, grad_weight, grad_bias.to(bias.dtype) if want_b else grad_bias


def _fake_backward_none(
    grad_rows,
    grad_lse,
    hidden,
    weight,
    target,
    bias,
    lse,
    ignore_index,
    label_smoothing,
    softcap,
    grads,
    check_target=True,
    class_weight=None,
):
    return (
        torch.empty_like(hidden) if grads[0] else hidden.new_empty((0,)),
        torch.empty_like(weight) if grads[1] else hidden.new_empty((0,)),
        bias.new_empty(bias.shape) if grads[2] else hidden.new_empty((0,)),
    )


fused_linear_cross_entropy_backward_op = define_op(
    "fused_linear_cross_entropy_backward(Tensor grad_rows, Tensor? grad_lse, Tensor hidden, Tensor weight, "
    "Tensor target, Tensor? bias, Tensor lse, int ignore_index, float label_smoothing, float? softcap, bool[] grads, "
    "bool check_target=True, Tensor? class_weight=None) -> (Tensor, Tensor, Tensor)",
    _backward_none,
    _fake_backward_none,
)


def _setup(ctx, inputs, output):
    """Keep the gradients the forward computed (reductions "mean" and "sum"); as outputs of the
    operator they are results, not functions of the inputs to differentiate (nor are lse and hits:
    the loss's gradients already hold the z-loss's). Gradients are not materialized: autograd
    would otherwise hand the backward a zero tensor for each of those outputs, as large as the
    gradients themselves (a V x H one for grad_weight), at the peak."""
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(*output[1:4])
    ctx.set_materialize_grads(False)
    ctx.used = False


def _backward(ctx, grad_loss, *unused):
    n_inputs = len(ctx.needs_input_grad)
    if grad_loss is None:  # the loss is not what was differentiated
        return (None,) * n_inputs
    if type(grad_loss) is torch.Tensor and torch.is_grad_enabled():
        raise RuntimeError(
            "llmk::fused_linear_cross_entropy has no double backward (its gradients were "
            "computed in the forward): call backward without create_graph=True"
        )
    if ctx.used:
        raise RuntimeError(
            "llmk::fused_linear_cross_entropy scales the gradients it computed in the forward "
            "in place: backward through the same graph twice (retain_graph=True) is not supported"
        )
    ctx.used = True
    grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
    out = []
    for g, need in zip((grad_hidden, grad_weight, grad_bias), ctx.needs_input_grad[:2] + ctx.needs_input_grad[3:4]):
        out.append(_scaled(g, grad_loss) if need else None)
    return (out[0], out[1], None, out[2]) + (None,) * (n_inputs - 4)


def _scaled(grad, grad_loss):
    """grad * grad_loss: in place on the plain tensors of an eager backward (grad_weight is V x H:
    a copy would double the peak), out of place under tracing (torch.compile's AOTAutograd, whose
    graph may not mutate a saved forward output; Inductor reuses the dead buffer by itself)."""
    if type(grad) is torch.Tensor and type(grad_loss) is torch.Tensor:
        return grad.mul_(grad_loss)
    return grad * grad_loss


OPTIONS_SCHEMA = "Tensor? class_weight=None, float lse_square_scale=0.0, bool accuracy=False"

fused_linear_cross_entropy_op = define_op(
    "fused_linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, int ignore_index, "
    f"float label_smoothing, float? softcap, str reduction, bool[] grads, {OPTIONS_SCHEMA}) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _forward,
    _fake,
    backward=_backward,
    setup_context=_setup,
)


def _in_place_forward(
    hidden,
    weight,
    target,
    bias,
    ignore_index,
    label_smoothing,
    softcap,
    reduction,
    grads,
    class_weight=None,
    lse_square_scale=0.0,
    accuracy=False,
):
    loss, _, grad_weight, grad_bias, lse, hits = _forward(
        hidden,
        weight,
        target,
        bias,
        ignore_index,
        label_smoothing,
        softcap,
        reduction,
        grads,
        class_weight,
        lse_square_scale,
        accuracy,
        over_hidden=True,
    )
    return loss, grad_weight, grad_bias, lse, hits


def _fake_in_place(*args):
    loss, _, grad_weight, grad_bias, lse, hits = _fake(*args)
    return loss, grad_weight, grad_bias, lse, hits


# grad_in_place's operator: hidden holds grad_hidden when it returns (loss, grad_weight, grad_bias, lse, hits).
# It mutates an input, so it has no registered autograd formula (register_autograd takes functional
# schemas only): fused_linear_cross_entropy calls it from _GradInPlace, in eager mode only.
fused_linear_cross_entropy_in_place_op = define_op(
    "fused_linear_cross_entropy_in_place(Tensor(a!) hidden, Tensor weight, Tensor target, Tensor? bias, "
    f"int ignore_index, float label_smoothing, float? softcap, str reduction, bool[] grads, {OPTIONS_SCHEMA}) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _in_place_forward,
    _fake_in_place,
)


def _in_place_safe(hidden, weight, target, bias, reduction, grads):
    """Whether grad_hidden may be written over hidden (grad_in_place): an eager call on plain
    tensors that computes grad_hidden in its forward ("mean", "sum"), a hidden that is contiguous,
    fills its storage and is not a leaf or a view of one (no parameter or user input is written),
    and shares no memory with weight, target or bias."""
    if reduction == "none" or not grads[0] or torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return False
    tensors = [t for t in (hidden, weight, target, bias) if t is not None]
    if any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors) or type(hidden) is not torch.Tensor:
        return False  # fake, functional or DTensor: traced or dispatched
    if functorch_active() or dispatch_mode_depth():
        return False
    base = hidden if hidden._base is None else hidden._base
    if (
        base.is_leaf
        or not hidden.is_contiguous()
        or hidden.storage_offset()
        or hidden.untyped_storage().nbytes() != hidden.numel() * hidden.element_size()
    ):
        return False
    return all(t.untyped_storage().data_ptr() != hidden.untyped_storage().data_ptr() for t in tensors[1:])


class _GradInPlace(torch.autograd.Function):
    """llmk::fused_linear_cross_entropy's autograd formula (its _backward) with grad_hidden
    kept in hidden's own memory: one (BT, H) tensor less at the loss, where the step's peak is.
    Returns (loss, lse, hits), the last two without gradient."""

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        target,
        bias,
        ignore_index,
        label_smoothing,
        softcap,
        reduction,
        grads,
        class_weight,
        lse_square_scale,
        accuracy,
    ):
        loss, grad_weight, grad_bias, lse, hits = fused_linear_cross_entropy_in_place_op(
            hidden,
            weight,
            target,
            bias,
            ignore_index,
            label_smoothing,
            softcap,
            reduction,
            grads,
            class_weight,
            lse_square_scale,
            accuracy,
        )
        # hidden's version moves: a node that saved hidden raises in its backward rather than read gradients
        torch.autograd.graph.increment_version(hidden)
        ctx.save_for_backward(hidden, grad_weight, grad_bias)  # hidden holds grad_hidden now
        ctx.mark_non_differentiable(lse, hits)
        ctx.set_materialize_grads(False)
        ctx.used = False
        return loss, lse, hits

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        return _backward(ctx, grad_loss)


def _none_forward(
    hidden, weight, target, bias, ignore_index, label_smoothing, softcap, class_weight=None, accuracy=False
):
    """reduction "none": (loss rows, LSE, hits), fp32 (N,) (hits (0,) without `accuracy`); the
    z-loss is the caller's, from the LSE (whose gradient the backward takes)."""
    n = hidden.shape[0]
    check = start_target_check(target, weight.shape[0], ignore_index)
    rows = hidden.new_empty((n,), dtype=torch.float32)
    lse = hidden.new_empty((n,), dtype=torch.float32)
    hits = hidden.new_empty((n if accuracy else 0,), dtype=torch.float32)
    options = row_options(ignore_index, label_smoothing, softcap, class_weight)
    for _, r, logits in _chunks(hidden, weight, bias):
        launch_rows(logits, target[r], rows[r], lse[r], options, hits=hits[r] if accuracy else None)
    check()
    return rows, lse, hits


def _setup_none(ctx, inputs, output):
    ctx.options = dict(ignore_index=inputs.ignore_index, label_smoothing=inputs.label_smoothing, softcap=inputs.softcap)
    ctx.save_for_backward(inputs.hidden, inputs.weight, inputs.target, inputs.bias, output[1], inputs.class_weight)
    ctx.mark_non_differentiable(output[2])  # the hits: a metric
    ctx.set_materialize_grads(False)


def _backward_none_formula(ctx, grad_rows, grad_lse, _):
    hidden, weight, target, bias, lse, class_weight = ctx.saved_tensors
    if grad_rows is None and grad_lse is None:
        return (None,) * 9
    if grad_rows is None:
        grad_rows = torch.zeros_like(lse)
    need = ctx.needs_input_grad
    grads = [need[0], need[1], bias is not None and need[3]]
    gh, gw, gb = fused_linear_cross_entropy_backward_op(
        grad_rows,
        grad_lse,
        hidden,
        weight,
        target,
        bias,
        lse,
        grads=grads,
        check_target=False,
        class_weight=class_weight,
        **ctx.options,
    )
    return (gh if grads[0] else None, gw if grads[1] else None, None, gb if grads[2] else None) + (None,) * 5


fused_linear_cross_entropy_none_op = define_op(
    "fused_linear_cross_entropy_none(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, int ignore_index, "
    "float label_smoothing, float? softcap, Tensor? class_weight=None, bool accuracy=False) "
    "-> (Tensor, Tensor, Tensor)",
    _none_forward,
    lambda hidden, weight, target, bias, ignore_index, label_smoothing, softcap, class_weight=None, accuracy=False: (
        hidden.new_empty((hidden.shape[0],), dtype=torch.float32),
        hidden.new_empty((hidden.shape[0],), dtype=torch.float32),
        hidden.new_empty((hidden.shape[0] if accuracy else 0,), dtype=torch.float32),
    ),
    backward=_backward_none_formula,
    setup_context=_setup_none,
)


def fused_linear_cross_entropy(
    hidden,
    weight,
    target,
    bias=None,
    ignore_index=-100,
    reduction="mean",
    label_smoothing=0.0,
    softcap=None,
    loss_dtype=None,
    grad_in_place=False,
    *,
    class_weight=None,
    lse_square_scale=0.0,
    return_z_loss=False,
    return_token_accuracy=False,
):
    """cross_entropy(hidden @ weight.T + bias, target) without the logits in memory (module
    docstring; operators llmk::fused_linear_cross_entropy and llmk::fused_linear_cross_entropy_none).

    hidden: (..., H) fp16, bf16 or fp32; weight: (V, H) (an nn.Linear's), hidden's dtype;
    bias: optional (V,), hidden's dtype. target: (...) int64 or int32.
    ignore_index, reduction ("mean", "sum", "none"), label_smoothing: as losses/triton_cross_entropy.py.
    softcap: optional positive float c: logits -> c * tanh(logits / c) before the softmax.
    loss_dtype: the loss's dtype; default hidden's, as F.cross_entropy gives on logits of that
    dtype (torch.float32 keeps the kernel's fp32 loss, as HF's causal-LM loss upcasts).
    class_weight, lse_square_scale, return_z_loss, return_token_accuracy: cross_entropy's weight
       (named so beside the LM head's weight; F.linear_cross_entropy's `weight`, Liger-Kernel's
       `ce_weight`), z-loss and extra outputs (losses/triton_cross_entropy.py).
    Returns the loss (a scalar, or shaped like target for "none"); with either return_* flag, a
    LossOutput (loss, z_loss, token_accuracy), None for what was not asked for.
    Differentiable in hidden, weight and bias. With "mean" or "sum" the gradients are computed by
    the forward (under grad) and the backward only scales them, in place; such a graph supports one
    backward.
    grad_in_place: write grad_hidden over hidden in the forward where it safely can (eager, "mean"
       or "sum", a hidden that is not a leaf or a view of one and owns its memory: _in_place_safe),
       saving one (BT, H) tensor at the loss; for a hidden that nothing reads after this call, as
       an LM head's input in a training step. A node that saved hidden then raises in its backward.
    Raises TargetError (a ValueError and an IndexError) for a target outside [0, V) that is not
    ignore_index, checked by the operator after its chunks are launched and before it returns (one
    16-byte read by the host; module docstring), in eager calls and in compiled graphs alike. Under
    CUDA-graph capture there is no check: such a row's loss is NaN (so is a "mean" or "sum" loss) and
    the gradients finite, the row's dlogits missing the target's one-hot term.
    """
    check_tensor("hidden", hidden)
    check_tensor("weight", weight, min_dim=2)
    check_same_device("weight", weight, "hidden", hidden)
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must be (V, H={hidden.shape[-1]}) to match hidden {tuple(hidden.shape)}, got {tuple(weight.shape)}"
        )
    if weight.shape[0] < 1:
        raise ValueError("weight must have at least one row (V >= 1 classes)")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight must have hidden's dtype {hidden.dtype}, got {weight.dtype}")
    if bias is not None:
        check_tensor("bias", bias)
        check_same_device("bias", bias, "hidden", hidden)
        if tuple(bias.shape) != (weight.shape[0],) or bias.dtype != hidden.dtype:
            raise ValueError(
                f"bias must be ({weight.shape[0]},) of dtype {hidden.dtype}, got {tuple(bias.shape)} {bias.dtype}"
            )
    check_loss_args(target, hidden.shape[:-1], ignore_index, reduction, label_smoothing, hidden.device)
    softcap = check_loss_options(
        "class_weight",
        class_weight,
        weight.shape[0],
        hidden.device,
        lse_square_scale,
        softcap,
        return_z_loss,
        return_token_accuracy,
    )
    if loss_dtype is not None and loss_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"loss_dtype must be None, torch.float16, torch.bfloat16 or torch.float32, got {loss_dtype!r}")
    dtype = loss_dtype or hidden.dtype
    h2 = hidden.reshape(-1, hidden.shape[-1])
    t1 = target.reshape(-1).contiguous()  # the row kernel reads one index a row at unit stride
    z_scale = float(lse_square_scale)
    if reduction == "none":
        rows, lse, hits = fused_linear_cross_entropy_none_op(
            h2,
            weight,
            t1,
            bias,
            ignore_index=ignore_index,
            label_smoothing=float(label_smoothing),
            softcap=softcap,
            class_weight=class_weight,
            accuracy=return_token_accuracy,
        )
        loss = reduce_rows(rows, target, ignore_index, "none", dtype, class_weight, lse, z_scale)
    else:
        grads = [needs_grad(hidden), needs_grad(weight), needs_grad(bias)]
        args = (
            h2,
            weight,
            t1,
            bias,
            ignore_index,
            float(label_smoothing),
            softcap,
            reduction,
            grads,
            class_weight,
            z_scale,
            return_token_accuracy,
        )
        if grad_in_place and _in_place_safe(hidden, weight, t1, bias, reduction, grads):
            loss, lse, hits = _GradInPlace.apply(*args)
        else:
            loss, _, _, _, lse, hits = fused_linear_cross_entropy_op(*args)
        loss = loss.to(dtype)
    if not (return_z_loss or return_token_accuracy):
        return loss
    return LossOutput(
        loss,
        *reduce_extras(
            target,
            ignore_index,
            reduction,
            dtype,
            lse if return_z_loss else None,
            z_scale,
            hits if return_token_accuracy else None,
        ),
    )
