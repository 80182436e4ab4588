"""The mixture-of-experts router in Triton: each token's top_k experts and their weights in one
kernel (moe_route), and the order that groups the routed (token, slot) pairs by expert
(moe_permute), all on the device: no host sync, so a layer built on them is CUDA-graph-capturable
and compiles without graph breaks.

    ids     = the top_k experts by router logit, the highest first (equal logits: lowest index)
    weights = softmax(logits)[ids] or sigmoid(logits)[ids], fp32; renormalize: / their sum

Both scores grow with the logit, so the choice reads the logits themselves (no rounding of a score
can reorder two experts). With renormalize, softmax's weights are the softmax over the chosen
logits alone (Qwen3-MoE's norm_topk_prob, Mixtral), sigmoid's the chosen scores over their sum.
A NaN logit is never chosen before a number other than -inf (ids stay in 0..E-1; torch.topk would
take it first)
and makes its row's weights NaN under softmax, as PyTorch's softmax does.

Work: one read of the logits (T x E, 2-4 bytes a value) and writes of T x top_k weights and ids:
memory-bound and small beside the experts' GEMMs. One program takes BLOCK_T tokens, a row of
next_power_of_2(E) logits each in registers; top_k passes of a max over the row pick the experts.

Backward (the autograd formula of llmk::moe_route, in PyTorch ops on the (T, E) logits beside it):
the weights' gradient g reaches the logits through the scores, the choice being constant:
    softmax, renormalized:  dx[ids] = w * (g - sum(w * g))                 (a softmax over the chosen)
    softmax:                dx = p * (G - sum(w * g)), p = softmax(x), G = g scattered to (T, E)
    sigmoid:                dx[ids] = g * s * (1 - s), s = sigmoid(x[ids])
    sigmoid, renormalized:  dx[ids] = (g - sum(w * g)) / sum(s) * s * (1 - s)
moe_permute is PyTorch ops (a stable sort and a sum by expert), differentiable in nothing.
"""

import torch
import triton
import triton.language as tl

from llmk.common.device import INTERPRET
from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.ops import define_op
from llmk.common.validation import check_tensor

SCORINGS = ("softmax", "sigmoid")
MAX_EXPERTS = 1024  # a row of logits in registers: 1024 fp32 over 4 warps' 128 threads is 8 a thread
MAX_TOP_K = 64  # the choice unrolls top_k passes over the row (models take 1-16)
# Tokens a program: ROUTE_VALUES logits in registers (BLOCK_T x next_power_of_2(E)), at most
# MAX_ROUTE_TOKENS tokens (E = 128: 32 tokens; E = 8: 64). Not yet measured on a GPU. The
# interpreter takes 4 tokens a program, so that its small tests run several programs and a tail.
ROUTE_VALUES = 4096
MAX_ROUTE_TOKENS = 64
INTERPRET_ROUTE_TOKENS = 4


@triton.jit
def _route_kernel(
    # pointers: logits (T, E); weights (T, TOP_K) fp32 and ids (T, TOP_K) int32, contiguous
    logits_ptr, w_ptr, ids_ptr,
    # sizes and the logits' strides (in elements)
    n_tokens, n_experts, stride_lt, stride_le,
    # meta-parameters
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, SIGMOID: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # 64-bit: rows * stride
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < n_tokens
    col_ok = cols < n_experts
    x = tl.load(
        logits_ptr + rows[:, None] * stride_lt + cols[None, :] * stride_le,
        mask=row_ok[:, None] & col_ok[None, :],
        other=float("-inf"),
    ).to(tl.float32)
    rank = tl.where(x != x, float("-inf"), x)  # the choice's key: a NaN never goes before a number
    taken = tl.zeros([BLOCK_T, BLOCK_E], tl.int32) != 0  # the experts chosen so far
    slots = tl.arange(0, K_PAD)
    ids = tl.zeros([BLOCK_T, K_PAD], tl.int32)
    picked = tl.zeros([BLOCK_T, K_PAD], tl.float32)  # the chosen logits
    for j in tl.static_range(TOP_K):
        # the largest key among the experts not yet taken, then the lowest such expert: every
        # row has one (TOP_K <= E), even a row of -inf or NaN
        free = col_ok[None, :] & ~taken
        best = tl.max(tl.where(free, rank, float("-inf")), axis=1)
        choice = tl.min(tl.where(free & (rank == best[:, None]), cols[None, :], BLOCK_E), axis=1)
        hit = cols[None, :] == choice[:, None]
        taken = taken | hit
        ids = tl.where(slots[None, :] == j, choice[:, None], ids)
        picked = tl.where(slots[None, :] == j, tl.sum(tl.where(hit, x, 0.0), axis=1)[:, None], picked)
    in_k = slots[None, :] < TOP_K
    if SIGMOID:
        w = 1.0 / (1.0 + tl.exp(-picked))
    else:
        # exp against the row's max (NaN if the row holds one, as PyTorch's softmax gives it)
        top = tl.max(tl.where(col_ok[None, :], x, float("-inf")), axis=1)
        w = tl.exp(picked - top[:, None])
        if not RENORMALIZE:  # over every expert
            w = w / tl.sum(tl.where(col_ok[None, :], tl.exp(x - top[:, None]), 0.0), axis=1)[:, None]
        has_nan = tl.max((x != x).to(tl.int32), axis=1)  # tl.max passes a NaN over: PyTorch's softmax does not
        w = tl.where(has_nan[:, None] > 0, float("nan"), w)
    if RENORMALIZE:
        w = w / tl.sum(tl.where(in_k, w, 0.0), axis=1)[:, None]
    offs = rows[:, None] * TOP_K + slots[None, :]
    mask = row_ok[:, None] & in_k
    tl.store(w_ptr + offs, w, mask=mask)
    tl.store(ids_ptr + offs, ids, mask=mask)


def route_tokens(n_experts):
    """Tokens a program of _route_kernel for n_experts experts (the table above)."""
    if INTERPRET:
        return INTERPRET_ROUTE_TOKENS
    return max(1, min(MAX_ROUTE_TOKENS, ROUTE_VALUES // next_power_of_2(n_experts)))


def launch_moe_route(logits, top_k, scoring, renormalize, weights, ids):
    """Launch on validated arguments: logits (T, E) any strides, 1 <= top_k <= E <= MAX_EXPERTS;
    weights (T, top_k) fp32 and ids (T, top_k) int32, contiguous. Writes them."""
    n_tokens, n_experts = logits.shape
    block_t = route_tokens(n_experts)
    _route_kernel[(cdiv(n_tokens, block_t),)](
        logits,
        weights,
        ids,
        n_tokens,
        n_experts,
        logits.stride(0),
        logits.stride(1),
        TOP_K=top_k,
        K_PAD=next_power_of_2(top_k),
        SIGMOID=scoring == "sigmoid",
        RENORMALIZE=renormalize,
        BLOCK_T=block_t,
        BLOCK_E=next_power_of_2(n_experts),
        num_warps=4,
    )


def _route_empty(logits, top_k, scoring, renormalize):
    n = logits.shape[0]
    return (logits.new_empty((n, top_k), dtype=torch.float32), logits.new_empty((n, top_k), dtype=torch.int32))


def _route(logits, top_k, scoring, renormalize):
    weights, ids = _route_empty(logits, top_k, scoring, renormalize)
    if weights.numel():
        launch_moe_route(logits, top_k, scoring, renormalize, weights, ids)
    return weights, ids


def route_backward(grad_weights, logits, weights, ids, scoring, renormalize):
    """d logits (T, E) in the logits' dtype from d weights (T, top_k) (module docstring)."""
    g, w, x = grad_weights.float(), weights, logits.float()
    index = ids.long()
    wg = (w * g).sum(-1, keepdim=True)
    if scoring == "softmax" and not renormalize:
        p = torch.softmax(x, dim=-1)
        return (p * (torch.zeros_like(x).scatter(1, index, g) - wg)).to(logits.dtype)
    if scoring == "softmax":
        d = w * (g - wg)
    else:
        s = torch.sigmoid(x.gather(1, index))
        d = ((g - wg) / s.sum(-1, keepdim=True) if renormalize else g) * s * (1 - s)
    return torch.zeros_like(x).scatter(1, index, d).to(logits.dtype)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs.logits, *output)
    ctx.scoring, ctx.renormalize = inputs.scoring, inputs.renormalize


def _backward(ctx, grad_weights, grad_ids):
    logits, weights, ids = ctx.saved_tensors
    if grad_weights is None:
        return None, None, None, None
    return route_backward(grad_weights, logits, weights, ids, ctx.scoring, ctx.renormalize), None, None, None


moe_route_op = define_op(
    "moe_route(Tensor logits, int top_k, str scoring, bool renormalize) -> (Tensor, Tensor)",
    _route,
    _route_empty,
    backward=_backward,
    setup_context=_setup_context,
)


def check_route_args(logits, top_k, scoring, renormalize):
    check_tensor("logits", logits, min_dim=2)
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D (tokens, experts); got shape {tuple(logits.shape)}")
    n_experts = logits.shape[1]
    if not 1 <= n_experts <= MAX_EXPERTS:
        raise ValueError(f"logits must have 1..{MAX_EXPERTS} experts (dim 1); got {n_experts}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= min(n_experts, MAX_TOP_K):
        raise ValueError(
            f"top_k must be an int in 1..{min(n_experts, MAX_TOP_K)} (the number of experts, at "
            f"most MAX_TOP_K); got {top_k!r}"
        )
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}; got {scoring!r}")
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize must be a bool; got {renormalize!r}")


def moe_route(logits, top_k, scoring="softmax", renormalize=True):
    """Each token's top_k experts and their weights (operator llmk::moe_route), differentiable in
    the logits through the weights.

    logits: (T, E) fp16, bf16 or fp32, any strides, E <= MAX_EXPERTS: the router's output.
    top_k: experts a token, 1..E. scoring: "softmax" (over all E) or "sigmoid".
    renormalize: divide the chosen weights by their sum (softmax: the softmax over the chosen).
    Returns (weights (T, top_k) fp32, ids (T, top_k) int32), the highest logit first; equal logits
    in expert order."""
    check_route_args(logits, top_k, scoring, renormalize)
    return moe_route_op(logits, top_k=top_k, scoring=scoring, renormalize=renormalize)


def moe_permute(ids, n_experts):
    """The routed (token, slot) pairs grouped by expert, on the device with no host sync.

    ids: (T, top_k) int32 or int64 expert indices, each in 0..n_experts-1 (not checked on a GPU:
    that would need a sync; an index out of range there is an indexing error of the device).
    Returns (order (T * top_k,) int64: flat indices t * top_k + slot sorted by expert, in token
    order within an expert (order // top_k is the token a sorted row gathers); counts (n_experts,)
    int64; offsets (n_experts + 1,) int64: expert e's rows are order[offsets[e]:offsets[e + 1]])."""
    check_tensor("ids", ids, (torch.int32, torch.int64), min_dim=2)
    if ids.dim() != 2:
        raise ValueError(f"ids must be 2-D (tokens, top_k); got shape {tuple(ids.shape)}")
    if isinstance(n_experts, bool) or not isinstance(n_experts, int) or n_experts < 1:
        raise ValueError(f"n_experts must be an int >= 1; got {n_experts!r}")
    check_ids_range(ids, n_experts)
    return permute(ids, n_experts)


def check_ids_range(ids, n_experts):
    """On the CPU, every expert index in 0..n_experts-1 (on a GPU the check would need a host sync)."""
    if ids.device.type == "cpu" and ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < n_experts:
        raise ValueError(f"ids must lie in 0..{n_experts - 1}; got {int(ids.min())}..{int(ids.max())}")


def permute(ids, n_experts):
    """moe_permute on checked arguments."""
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(n_experts, dtype=torch.int64, device=ids.device).index_add_(0, flat, torch.ones_like(flat))
    return order, counts, torch.cat([counts.new_zeros(1), counts.cumsum(0)])


__all__ = [
    "MAX_EXPERTS",
    "MAX_TOP_K",
    "SCORINGS",
    "check_ids_range",
    "launch_moe_route",
    "moe_permute",
    "moe_route",
    "moe_route_op",
    "permute",
]
