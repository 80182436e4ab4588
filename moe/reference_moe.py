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


ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
}


def experts_ref(x, weights, ids, w_gate_up, w_down, activation="silu", dtype=torch.float64):
    """The experts' eager loop (transformers' form) in `dtype` (fp64: the truth; x's dtype: PyTorch's
    own result in it): x (T, H), weights and ids (T, top_k), w_gate_up (E, 2I, H) gate rows first,
    w_down (E, H, I) -> (T, H), differentiable."""
    act = ACTIVATIONS[activation]
    x, w, w1, w2 = (t.to(dtype) for t in (x, weights, w_gate_up, w_down))
    out = x.new_zeros(x.shape)
    for e in range(w1.shape[0]):
        tokens, slots = torch.where(ids == e)
        if tokens.numel():
            gate, up = (x[tokens] @ w1[e].t()).chunk(2, dim=-1)
            out = out.index_add(0, tokens, (act(gate) * up) @ w2[e].t() * w[tokens, slots, None])
    return out


def experts_grad_scales(x, weights, ids, w_gate_up, w_down, grad_out, activation="silu"):
    """The error scale of each element of experts_ref's four gradients, in fp64, for upstream
    gradient grad_out (T, H): {"x": (T, H), "weights": (T, top_k), "w_gate_up": (E, 2I, H),
    "w_down": (E, H, I)}. Each gradient element is a sum of products (dw_down[e, h, i] of dy[r, h]
    hid[r, i] over expert e's rows r, dy the routing-weighted grad_out; dw_gate_up of dz[r, j]
    x[r, h], dz the gate and up gradients; dx[t, h] of dz[r, j] w_gate_up[e, j, h] over t's slots;
    dweights[t, s] of grad_out[t, h] y[r, h], y the expert's output rows), and its rounding error
    is about u times the root-sum-square of its terms, each factor taken at its own scale: the
    value for an input, and for a computed factor (hid, dz, y) the larger of its value and the
    scale its own sums and their roundings carry into it (a sum that cancels is small, but its
    error is not). A tolerance from the gradient's row and column sizes instead misses an expert
    with few tokens, one of them large."""
    act = ACTIVATIONS[activation]
    x, w, w1, w2, g = (t.double() for t in (x, weights, w_gate_up, w_down, grad_out))
    sq = {
        "x": torch.zeros_like(x),
        "weights": torch.zeros_like(w),
        "w_gate_up": torch.zeros_like(w1),
        "w_down": torch.zeros_like(w2),
    }
    for e in range(w1.shape[0]):
        tokens, slots = torch.where(ids == e)
        if not tokens.numel():
            continue
        xe = x[tokens]
        z = xe @ w1[e].t()
        gate, up = z.chunk(2, dim=-1)
        s_gate, s_up = torch.maximum(z.abs(), (xe.square() @ w1[e].square().t()).sqrt()).chunk(2, dim=-1)
        with torch.enable_grad():  # act, act' and act'' at gate
            leaf = gate.detach().requires_grad_(True)
            a = act(leaf)
            (d1,) = torch.autograd.grad(a.sum(), leaf, create_graph=True)
            (d2,) = torch.autograd.grad(d1.sum(), leaf)
        a, d1, d2 = a.detach(), d1.detach(), d2.abs()
        hid = a * up
        s_hid = torch.maximum(hid.abs(), d1.abs() * s_gate * up.abs() + a.abs() * s_up)
        dy = g[tokens] * w[tokens, slots, None]  # the gradient of the expert's output rows
        dhid = dy @ w2[e]
        s_dhid = torch.maximum(dhid.abs(), (dy.square() @ w2[e].square()).sqrt())
        s_dgate = s_dhid * (up * d1).abs() + dhid.abs() * (d1.abs() * s_up + up.abs() * d2 * s_gate)
        s_dup = s_dhid * a.abs() + dhid.abs() * d1.abs() * s_gate
        s_dz = torch.cat([s_dgate, s_dup], dim=-1)
        y = hid @ w2[e].t()
        s_y = torch.maximum(y.abs(), (s_hid.square() @ w2[e].square().t()).sqrt())
        sq["w_down"][e] = dy.square().t() @ s_hid.square()
        sq["w_gate_up"][e] = s_dz.square().t() @ xe.square()
        sq["x"].index_add_(0, tokens, s_dz.square() @ w1[e].square())
        sq["weights"][tokens, slots] = (g[tokens].square() * s_y.square()).sum(-1)
    return {name: t.sqrt() for name, t in sq.items()}
