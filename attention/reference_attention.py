"""Attention the textbook way, the reference every attention kernel is tested against.

    S = q @ k^T * sm_scale          (B, H, Tq, Tk), materialized in fp32 (fp64 for fp64 inputs)
    P = softmax(S + causal mask)    row-wise over keys
    O = P @ v                       (B, H, Tq, D), cast to q's dtype once

Memory: the score matrix alone is B * H * Tq * Tk * 4 bytes (16 GB at B1 H32 T16384): the reason a
fused kernel exists. Conventions shared by every attention function in this folder:
- q (B, H, Tq, D), k and v (B, Hkv, Tk, D); H a multiple of Hkv: query head h reads kv head
  h // (H // Hkv) (MHA when Hkv == H, GQA in between, MQA when Hkv == 1).
- causal masks are aligned to the bottom right, as FlashAttention does when Tq != Tk: query i sees
  keys j <= i + (Tk - Tq). A query that sees no key at all (possible when Tq > Tk) gets zeros.
- sm_scale defaults to 1 / sqrt(D).
"""
import math

import torch


def causal_mask(tq, tk, device):
    """(Tq, Tk) bool, True where query i may see key j: j <= i + (Tk - Tq)."""
    i = torch.arange(tq, device=device)[:, None]
    j = torch.arange(tk, device=device)[None, :]
    return j <= i + (tk - tq)


def expand_kv(k, n_heads):
    """(B, Hkv, T, D) -> (B, H, T, D): each kv head repeated for the H / Hkv query heads it serves."""
    return k.repeat_interleave(n_heads // k.shape[1], dim=1)


def attention_probs(q, k, causal=False, sm_scale=None):
    """q (B, H, Tq, D), k (B, Hkv, Tk, D) -> P (B, H, Tq, Tk) in fp32 (fp64 for fp64 inputs)."""
    compute = torch.promote_types(q.dtype, torch.float32)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    k = expand_kv(k, q.shape[1])
    scores = torch.matmul(q.to(compute), k.to(compute).transpose(-1, -2)) * sm_scale
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    # a row with no visible key is all -inf: softmax would give NaN, the convention is zeros
    return torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)


def naive_attention(q, k, v, causal=False, sm_scale=None):
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D) -> O (B, H, Tq, D) in q's dtype, math in fp32."""
    p = attention_probs(q, k, causal, sm_scale)
    return torch.matmul(p, expand_kv(v, q.shape[1]).to(p.dtype)).to(q.dtype)
