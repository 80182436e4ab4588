"""The experts of a mixture-of-experts layer as one operator, forward and backward (llmk::moe_experts):
each token's top_k rows through their experts' gated MLPs, weighted and summed back to the token.

    for each token t and slot j, e = ids[t, j]:
        gate, up = x[t] @ w_gate_up[e, :I]^T, x[t] @ w_gate_up[e, I:]^T     (transformers' layout)
        h        = act(gate) * up                                            (SwiGLU: act = silu)
        out[t]  += weights[t, j] * (h @ w_down[e]^T)

Forward, two launches of the row GEMM over the rows sorted by expert (moe_permute, on the device):
moe/triton_moe_rows_tma.py's persistent kernel on long runs (prefill, training), moe/
triton_moe_gemm.py's row kernel on short ones (decode) and where TMA cannot read the weights
(expert_rows chooses):
  1. gate/up with x's rows gathered in its loads (no gathered copy of x) and act(gate) * up in the
     epilogue: h (S, I) in expert order, and gate | up (S, 2I) when a backward will need them;
  2. down with the routing weight in the epilogue, each row stored at its (token, slot) place:
     y (S, H) in token order; out = y summed over each token's top_k rows (PyTorch's sum, which
     accumulates in fp32 and rounds once).
Backward (the autograd formula, llmk::moe_experts_backward), from dout (T, H), S = T * top_k rows:
  3. dh = dout[token] @ w_down[e] (rows gathered), stored as it is in d gate's place; then a pass
     over the sorted rows reads it with gate | up and writes d gate | d up = swiglu'(dh * weight)
     in place, and d weights = sum over I of dh * h (h recomputed from gate and up, in fp32). The
     GEMM's epilogue did that pass itself once: holding dh, gate and up in registers cost it a
     64-row tile and spills (269 TFLOP/s, docs/tuning/moe.md);
  4. d w_down[e] = (weight * dout)[tokens of e]^T @ h[rows of e] (the weight kernel), its operand
     the rows step 3's GEMM read, which it stored in expert order as it read them;
  5. dx = d gate | d up @ w_gate_up[e], stored in token order and summed over the slots;
  6. d w_gate_up[e] = (d gate | d up)[rows of e]^T @ x[tokens of e], over x's rows copied into
     expert order first.
  Steps 4 and 6 are skipped when neither expert weight requires grad (frozen experts); one (S, H)
  buffer lives at a time (weight * dout's rows, dx's rows, x's rows).
Saved for it: gate | up (S x 2I) and h (S x I), nothing of size S x H; transformers' grouped_mm
form keeps the gathered x (S x H), gate | up, act(gate), h and the down projection's output.

Expert weights may be any strided views (a transposed layout is read in place); x may have any
strides; the routing weights are taken in fp32 (their gradient returns in their dtype).
"""

import torch

from llmk.common.ops import define_op, needs_grad
from llmk.common.validation import check_same_device, check_tensor
from llmk.moe.triton_moe_gemm import (
    launch_expert_rows,
    launch_expert_weight_grad,
    launch_gather_rows,
    launch_glu_backward_rows,
    rows_config,
)
from llmk.moe.triton_moe_routing import MAX_TOP_K, check_ids_range, permute
from llmk.moe.triton_moe_rows_tma import fits, launch_expert_rows_tma

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")  # SwiGLU (Qwen3-MoE, Mixtral), GeGLU (exact or tanh)
# d w_down's operand, weight * dout's rows in expert order: kept by dh's GEMM as it reads them (True),
# or copied by a gather of their own after it (False; 0.23 ms at Qwen3-30B-A3B's widths, T 16384)
COPY_DOUT_ROWS = True
# gate/up, down and dx on long runs: the persistent TMA kernel where MOE_CONFIGS gives it a tile and
# the operands fit its descriptors (True), or the row kernel, one program a tile (False)
TMA_ROWS = True


def expert_rows(a, b, c, order, offsets, *, epilogue, **kw):
    """A "glu" (a = x gathered through the order) or "scatter" launch of the row GEMM: moe/
    triton_moe_rows_tma.py's persistent kernel where it has a tile for the run and `fits`, else
    moe/triton_moe_gemm.py's row kernel. kw: the launchers' activation, top_k and pre (glu), scale
    (scatter). Returns whether the persistent kernel ran (the tests check the path)."""
    config = rows_config(order.shape[0], offsets.shape[0] - 1, epilogue + "_tma", c.shape[1], b.shape[2])
    tma = TMA_ROWS and config is not None and fits(a, b, epilogue, config[2])
    if tma:
        launch_expert_rows_tma(a, b, c, order, offsets, config, epilogue=epilogue, **kw)
    else:
        launch_expert_rows(a, b, c, order, offsets, gather=epilogue == "glu", epilogue=epilogue, **kw)
    return tma


def _sizes(x, ids, w_gate_up):
    n_tokens, hidden = x.shape
    return n_tokens, hidden, ids.shape[1], w_gate_up.shape[0], w_gate_up.shape[1] // 2


def _experts_empty(x, weights, ids, w_gate_up, w_down, activation, save):
    n_tokens, hidden, top_k, n_experts, inter = _sizes(x, ids, w_gate_up)
    rows = n_tokens * top_k
    return (
        x.new_empty((n_tokens, hidden)),
        x.new_empty((rows if save else 0, 2 * inter)),
        x.new_empty((rows, inter)),
        x.new_empty((rows,), dtype=torch.int64),
        x.new_empty((n_experts + 1,), dtype=torch.int64),
    )


def _experts(x, weights, ids, w_gate_up, w_down, activation, save):
    """-> (out (T, H), gate | up (S, 2I) or (0, 2I) when not save, h (S, I), order (S,), offsets (E + 1,))."""
    n_tokens, hidden, top_k, n_experts, inter = _sizes(x, ids, w_gate_up)
    rows = n_tokens * top_k
    order, _, offsets = permute(ids, n_experts)
    pre, h = x.new_empty((rows if save else 0, 2 * inter)), x.new_empty((rows, inter))
    y = x.new_empty((rows, hidden))
    if y.numel():
        expert_rows(
            x,
            w_gate_up,
            h,
            order,
            offsets,
            epilogue="glu",
            activation=activation,
            top_k=top_k,
            pre=pre if save else None,
        )
        expert_rows(h, w_down, y, order, offsets, epilogue="scatter", scale=weights.reshape(-1).float().contiguous())
    out = y.view(n_tokens, top_k, hidden).sum(1) if y.numel() else x.new_zeros((n_tokens, hidden))
    return out, pre, h, order, offsets


def _backward_empty(dout, x, weights, w_gate_up, w_down, pre, h, order, offsets, activation, weight_grads):
    """The gradients' buffers; the expert weights' are empty (0-element) when not weight_grads."""

    def expert_grad(w):
        return w.new_empty(w.shape if weight_grads else (0,))

    return x.new_empty(x.shape), weights.new_empty(weights.shape), expert_grad(w_gate_up), expert_grad(w_down)


def _experts_backward(dout, x, weights, w_gate_up, w_down, pre, h, order, offsets, activation, weight_grads):
    """-> (dx (T, H), d weights (T, top_k), d w_gate_up (E, 2I, H), d w_down (E, H, I)), the
    weights' gradients contiguous; without weight_grads (frozen experts) those two are empty and
    their launches are skipped."""
    n_tokens, hidden = x.shape
    top_k = weights.shape[1]
    rows, inter = order.shape[0], w_down.shape[2]
    dx, dweights, dw_gate_up, dw_down = _backward_empty(
        dout, x, weights, w_gate_up, w_down, pre, h, order, offsets, activation, weight_grads
    )
    if not rows:
        return dx.zero_(), dweights.zero_(), dw_gate_up.zero_(), dw_down.zero_()
    scale = weights.reshape(-1).float().contiguous()
    dpre = torch.empty_like(pre)
    # 3: dh = dout[token] @ w_down[e], w_down (E, H, I) read as (E, N = I, K = H), stored in d gate's
    # place; with the weights' gradients its loads are also kept as weight * dout's rows in expert
    # order, d w_down's operand
    copy = weight_grads and COPY_DOUT_ROWS
    dout_rows = x.new_empty((rows, hidden)) if copy else None
    launch_expert_rows(
        dout,
        w_down.transpose(1, 2),
        dpre[:, :inter],
        order,
        offsets,
        gather=True,
        epilogue="store",
        top_k=top_k,
        scale=scale,
        a_copy=dout_rows,
    )
    if weight_grads and not copy:
        dout_rows = launch_gather_rows(dout, order, top_k, scale=scale)
    # then in place: d gate | d up, and the routing weights' gradient
    launch_glu_backward_rows(dpre, pre, order, scale, dweights, activation)
    if weight_grads:  # 4: d w_down
        launch_expert_weight_grad(dout_rows, h, dw_down, offsets, kind="down")
        del dout_rows  # dx's rows take its place
    # 5: dpre @ w_gate_up[e], w_gate_up (E, 2I, H) read as (E, N = H, K = 2I), stored in token order
    dx_rows = x.new_empty((rows, hidden))
    expert_rows(dpre, w_gate_up.transpose(1, 2), dx_rows, order, offsets, epilogue="scatter")
    torch.sum(dx_rows.view(n_tokens, top_k, hidden), 1, out=dx)
    del dx_rows  # x's rows take its place
    # 6: d w_gate_up over x's rows copied into expert order
    if weight_grads:
        launch_expert_weight_grad(dpre, launch_gather_rows(x, order, top_k), dw_gate_up, offsets, kind="gate_up")
    return dx, dweights, dw_gate_up, dw_down


moe_experts_backward_op = define_op(
    "moe_experts_backward(Tensor dout, Tensor x, Tensor weights, Tensor w_gate_up, Tensor w_down, Tensor pre, "
    "Tensor h, Tensor order, Tensor offsets, str activation, bool weight_grads) -> (Tensor, Tensor, Tensor, Tensor)",
    _experts_backward,
    _backward_empty,
)


def _setup_context(ctx, inputs, output):
    _, pre, h, order, offsets = output
    ctx.save_for_backward(inputs.x, inputs.weights, inputs.w_gate_up, inputs.w_down, pre, h, order, offsets)
    ctx.activation = inputs.activation
    # only out takes a gradient: no zeros made for gate | up, h, order and offsets
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, *unused):
    x, weights, w_gate_up, w_down, pre, h, order, offsets = ctx.saved_tensors
    if pre.shape[0] != order.shape[0]:
        raise RuntimeError(
            "llmk::moe_experts ran with save=False, which keeps no gate | up for a backward: "
            "call moe_experts (it sets save when an input requires grad)"
        )
    if dout is None:
        return None, None, None, None, None, None, None
    x_grad, weights_grad, _, w1_grad, w2_grad = ctx.needs_input_grad[:5]
    weight_grads = bool(w1_grad or w2_grad)
    dx, dweights, dw_gate_up, dw_down = moe_experts_backward_op(
        dout,
        x,
        weights,
        w_gate_up,
        w_down,
        pre,
        h,
        order,
        offsets,
        activation=ctx.activation,
        weight_grads=weight_grads,
    )
    return (
        dx if x_grad else None,
        dweights if weights_grad else None,
        None,
        dw_gate_up if w1_grad else None,
        dw_down if w2_grad else None,
        None,
        None,
    )


moe_experts_op = define_op(
    "moe_experts(Tensor x, Tensor weights, Tensor ids, Tensor w_gate_up, Tensor w_down, str activation, bool save)"
    " -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _experts,
    _experts_empty,
    backward=_backward,
    setup_context=_setup_context,
)


def check_experts_args(x, weights, ids, w_gate_up, w_down, activation):
    check_tensor("x", x, min_dim=2)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (tokens, hidden); got shape {tuple(x.shape)}")
    n_tokens, hidden = x.shape
    check_tensor("ids", ids, (torch.int32, torch.int64), min_dim=2)
    check_tensor("weights", weights, min_dim=2)
    check_tensor("w_gate_up", w_gate_up, (x.dtype,), min_dim=3)
    check_tensor("w_down", w_down, (x.dtype,), min_dim=3)
    if ids.dim() != 2 or ids.shape[0] != n_tokens or not 1 <= ids.shape[1] <= MAX_TOP_K:
        raise ValueError(f"ids must be (tokens, top_k) = ({n_tokens}, 1..{MAX_TOP_K}); got shape {tuple(ids.shape)}")
    if tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(f"weights must have ids' shape {tuple(ids.shape)}; got {tuple(weights.shape)}")
    if w_gate_up.dim() != 3 or w_gate_up.shape[2] != hidden or w_gate_up.shape[1] % 2 or not w_gate_up.shape[1]:
        raise ValueError(
            f"w_gate_up must be (experts, 2 * intermediate, hidden = {hidden}); got shape {tuple(w_gate_up.shape)}"
        )
    n_experts, inter = w_gate_up.shape[0], w_gate_up.shape[1] // 2
    if tuple(w_down.shape) != (n_experts, hidden, inter):
        raise ValueError(
            f"w_down must be (experts, hidden, intermediate) = {(n_experts, hidden, inter)} "
            f"(w_gate_up's); got shape {tuple(w_down.shape)}"
        )
    if ids.shape[1] > n_experts:
        raise ValueError(f"ids has top_k = {ids.shape[1]} columns, more than the {n_experts} experts")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    for name, t in (("weights", weights), ("ids", ids), ("w_gate_up", w_gate_up), ("w_down", w_down)):
        check_same_device(name, t, "x", x)
    if not torch.compiler.is_compiling():  # the check reads the ids on the host: no graph break for it
        check_ids_range(ids, n_experts)


def moe_experts(x, weights, ids, w_gate_up, w_down, activation="silu"):
    """The routed experts' output (operator llmk::moe_experts), differentiable in x, weights,
    w_gate_up and w_down.

    x: (T, H) fp16, bf16 or fp32, any strides. weights: (T, top_k) routing weights, any float dtype
    (moe_route's fp32). ids: (T, top_k) int32 or int64 experts, each in 0..E-1 (checked on the CPU
    only: a GPU check would sync). w_gate_up: (E, 2I, H), gate rows first then up, x's dtype;
    w_down: (E, H, I); any strides. activation: "silu" (SwiGLU), "gelu" or "gelu_tanh" (GeGLU).
    Returns (T, H) in x's dtype: sum over j of weights[t, j] * expert ids[t, j]'s MLP of x[t]."""
    check_experts_args(x, weights, ids, w_gate_up, w_down, activation)
    save = needs_grad(x, weights, w_gate_up, w_down)
    return moe_experts_op(x, weights, ids, w_gate_up, w_down, activation=activation, save=save)[0]


__all__ = ["ACTIVATIONS", "moe_experts", "moe_experts_backward_op", "moe_experts_op"]
