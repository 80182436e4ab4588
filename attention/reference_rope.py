"""PyTorch references for rotary position embeddings (RoPE) on q and k.

Two layouts of the D features of a head, both rotating D/2 pairs, pair i by the angle whose cosine
and sine are cos[..., i] and sin[..., i] in a Hugging Face table:
- half (Hugging Face / GPT-NeoX): pair i is (x[i], x[i + D/2]).
      out = x * cos + rotate_half(x) * sin,   rotate_half(x) = cat(-x[D/2:], x[:D/2])
  Every column of cos and sin is used as given, as HF's apply_rotary_pos_emb does, so a table whose
  halves differ is applied exactly as HF would apply it.
- interleaved (GPT-J, Meta's original Llama): pair i is (x[2i], x[2i + 1]).
      out[2i]     = x[2i]     * cos[..., i] - x[2i + 1] * sin[..., i]
      out[2i + 1] = x[2i + 1] * cos[..., i] + x[2i]     * sin[..., i]
  Only columns 0 .. D/2-1 of cos and sin are used. In a table built by rope_cos_sin (the HF layout
  cat(freqs, freqs)) those hold angle i = position * base^(-2i/D), which is Meta's freqs_cis, so
  one table serves both layouts. A GPT-J duplicate-interleaved table t (t[2i] == t[2i + 1])
  becomes this one as torch.cat((t[..., ::2], t[..., ::2]), -1): column i holds pair i's angle.

Partial rotary (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor, flash-attn's rotary_dim): a
table of R < D columns rotates the first R features of a head, as above with R for D, and the other
D - R pass through unchanged, as HF's models split the head (q_rot, q_pass = q[..., :R], q[..., R:]).
That is also how a head of odd D takes RoPE (R even, at most D - 1).

Tables: cos, sin (T, R), (1, T, R) or (B, T, R), R = D unless partial; a 3-dim table is broadcast
over heads as HF's apply_rotary_pos_emb(unsqueeze_dim=1) does. The math runs in q's dtype after casting the table to it
(LlamaRotaryEmbedding returns cos, sin in x's dtype), so these are the same-dtype `eager` baseline;
pass fp64 tensors for an exact reference.
"""

import torch


def rope_cos_sin(positions, head_dim, base=10000.0, dtype=torch.float32):
    """The Hugging Face table, as LlamaRotaryEmbedding builds it (angles in fp32).

    positions: (T,) or (B, T) integer positions. Returns cos, sin: (T, D) or (B, T, D) in `dtype`,
    column j holding angle j mod D/2: inv_freq = 1 / base^(arange(0, D, 2) / D),
    emb = cat(freqs, freqs) with freqs = positions * inv_freq.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (base**exponent)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    """cat(-x2, x1) of the two halves of the last dim (HF)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x):
    """(-x[2i+1], x[2i]) for every pair of the last dim (GPT-J)."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rope_ref(q, k, cos, sin, interleaved=False):
    """Rotate q (B, H, T, D) and k (B, Hkv, T, D) by cos, sin ((T, R), (1, T, R) or (B, T, R),
    R <= D: the first R features rotate, the rest pass through).

    Returns (q_out, k_out) shaped and typed like q and k. Layouts as in the module docstring: for
    interleaved, columns 0 .. R/2-1 of the table are duplicated onto pairs (GPT-J's
    duplicate_interleave) and the rest ignored.
    """
    rotary_dim = cos.shape[-1]
    if rotary_dim < q.shape[-1]:
        q_rot, k_rot = apply_rope_ref(q[..., :rotary_dim], k[..., :rotary_dim], cos, sin, interleaved)
        return torch.cat((q_rot, q[..., rotary_dim:]), -1), torch.cat((k_rot, k[..., rotary_dim:]), -1)
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    if cos.dim() == 3:  # (B, T, D) -> (B, 1, T, D): one table for every head
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotate = rotate_half
    if interleaved:
        half = q.shape[-1] // 2
        cos = cos[..., :half].repeat_interleave(2, dim=-1)
        sin = sin[..., :half].repeat_interleave(2, dim=-1)
        rotate = rotate_every_two
    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
