"""PyTorch references for the mixture-of-experts router (moe/triton_moe_routing.py): the truth of
its tests, in fp64 where it computes.

Routing picks each token's top_k experts by their router logits (the highest first; equal logits
in expert order, the lowest index first) and weighs them by the scores: softmax over every expert
(Qwen3-MoE, Mixtral) or sigmoid (DeepSeek-V3's form), optionally renormalized to sum to 1 over
the chosen ones (Qwen3's norm_topk_prob, Mixtral always). Both scores grow with the logit, so the
top-k of the scores is the top-k of the logits.
"""
import torch


def route_ref(logits, top_k, scoring="softmax", renormalize=True):
    """logits (T, E) -> (weights (T, top_k) fp64, ids (T, top_k) int64), the highest logit first."""
    x = logits.double()
    ids = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :top_k]
    scores = torch.softmax(x, dim=-1) if scoring == "softmax" else torch.sigmoid(x)
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


def permute_ref(ids, n_experts):
    """ids (T, top_k) -> (order (T * top_k,): the flat (token, slot) indices sorted by expert, in
    token order within an expert; counts (E,); offsets (E + 1,), the start of each expert's run)."""
    flat = ids.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    counts = torch.bincount(ids.reshape(-1).cpu(), minlength=n_experts)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return torch.tensor(order, dtype=torch.int64), counts, offsets


def experts_ref(x, weights, ids, w_gate_up, w_down, activation="silu", dtype=torch.float64):
    """The experts' eager loop (transformers' form) in `dtype` (fp64: the truth; x's dtype: PyTorch's
    own result in it): x (T, H), weights and ids (T, top_k), w_gate_up (E, 2I, H) gate rows first,
    w_down (E, H, I) -> (T, H), differentiable."""
    act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
           "gelu_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh")}[activation]
    x, w, w1, w2 = (t.to(dtype) for t in (x, weights, w_gate_up, w_down))
    out = x.new_zeros(x.shape)
    for e in range(w1.shape[0]):
        tokens, slots = torch.where(ids == e)
        if tokens.numel():
            gate, up = (x[tokens] @ w1[e].t()).chunk(2, dim=-1)
            out = out.index_add(0, tokens, (act(gate) * up) @ w2[e].t() * w[tokens, slots, None])
    return out
