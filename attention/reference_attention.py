"""Attention the textbook way, the reference every attention kernel is tested against.

    S = q @ k^T * sm_scale          (B, H, Tq, Tk), materialized in fp32 (fp64 for fp64 inputs)
    S = c * tanh(S / c)             with softcap c (Gemma 2's logit softcapping), else unchanged
    P = softmax(S + mask)           row-wise over keys: causal and/or sliding window
    O = P @ v                       (B, H, Tq, D), cast to q's dtype once

Memory: the score matrix alone is B * H * Tq * Tk * 4 bytes (16 GB at B1 H32 T16384): the reason a
fused kernel exists. Conventions shared by every attention function in this folder:
- q (B, H, Tq, D), k and v (B, Hkv, Tk, D); H a multiple of Hkv: query head h reads kv head
  h // (H // Hkv) (MHA when Hkv == H, GQA in between, MQA when Hkv == 1).
- causal masks are aligned to the bottom right, as FlashAttention does when Tq != Tk: query i sees
  keys j <= i + (Tk - Tq). A query that sees no key at all (possible when Tq > Tk) gets zeros.
- a sliding window (left, right), -1 an unbounded side (flash-attn's window_size), aligns the same
  way: query i sees keys j with i' - left <= j <= i' + right, i' = i + (Tk - Tq); with causal as
  well, right is 0 at most.
- sm_scale defaults to 1 / sqrt(D).
"""

import math

import torch


def causal_mask(tq, tk, device):
    """(Tq, Tk) bool, True where query i may see key j: j <= i + (Tk - Tq)."""
    return visible_mask(tq, tk, device, causal=True)


def visible_mask(tq, tk, device, causal=False, window=None):
    """(Tq, Tk) bool, True where query i may see key j under causal and a window (left, right);
    None where every query sees every key."""
    if not causal and (window is None or tuple(window) == (-1, -1)):
        return None
    rel = torch.arange(tk, device=device)[None, :] - (torch.arange(tq, device=device)[:, None] + (tk - tq))
    visible = torch.ones(tq, tk, dtype=torch.bool, device=device)
    left, right = (-1, -1) if window is None else window
    if causal:
        visible &= rel <= 0
    if left >= 0:
        visible &= rel >= -left
    if right >= 0:
        visible &= rel <= right
    return visible


def softcapped(scores, softcap):
    """Gemma 2's logit softcapping, c * tanh(s / c), of scores of any shape in their dtype;
    unchanged for softcap None or 0."""
    return torch.tanh(scores / softcap) * softcap if softcap else scores


def expand_kv(k, n_heads):
    """(B, Hkv, T, D) -> (B, H, T, D): each kv head repeated for the H / Hkv query heads it serves."""
    return k.repeat_interleave(n_heads // k.shape[1], dim=1)


def attention_scores(q, k, causal=False, sm_scale=None, window=None, softcap=None, dtype=None):
    """q (B, H, Tq, D), k (B, Hkv, Tk, D) -> the scores the softmax takes, (B, H, Tq, Tk): scaled,
    capped (softcap c: c * tanh(s / c)), -inf where the mask hides a key. In `dtype`; by default
    fp32 (fp64 for fp64 inputs)."""
    compute = torch.promote_types(q.dtype, torch.float32) if dtype is None else dtype
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    k = expand_kv(k, q.shape[1])
    scores = softcapped(torch.matmul(q.to(compute), k.to(compute).transpose(-1, -2)) * sm_scale, softcap)
    visible = visible_mask(q.shape[2], k.shape[2], q.device, causal, window)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return scores


def attention_probs(q, k, causal=False, sm_scale=None, window=None, softcap=None):
    """q (B, H, Tq, D), k (B, Hkv, Tk, D) -> P (B, H, Tq, Tk) in fp32 (fp64 for fp64 inputs).
    window (left, right) and softcap as attention_scores takes them."""
    scores = attention_scores(q, k, causal, sm_scale, window, softcap)
    # a row with no visible key is all -inf: softmax would give NaN, the convention is zeros
    return torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)


def naive_attention(q, k, v, causal=False, sm_scale=None, window=None, softcap=None):
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D) -> O (B, H, Tq, D) in q's dtype, math in fp32.
    window: None or (left, right), -1 unbounded; softcap: None/0 or c > 0."""
    p = attention_probs(q, k, causal, sm_scale, window, softcap)
    return torch.matmul(p, expand_kv(v, q.shape[1]).to(p.dtype)).to(q.dtype)
