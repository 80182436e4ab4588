"""Decode attention the textbook way: the reference the Triton decode kernels are tested against.

One new query token per sequence attends to the first lengths[b] tokens of its KV cache:

    S[b, h, t] = q[b, h] . k[b, t, h // G] * sm_scale     for t < lengths[b]   (G = H / Hkv)
    O[b, h]    = softmax_t(S[b, h]) @ v[b, :, h // G]

Scores, softmax and the weighted sum are computed in fp32 (fp64 for fp64 inputs) and the output is
cast to q's dtype once. A sequence of length 0 sees no key: its output is zeros, as in
attention/reference_attention.py. Slots past a sequence's length are never used, whatever they hold.
Memory: the scores are B * H * T_max values; the cache is read in the compute dtype, so an fp16
cache is copied once to fp32 (2x its size), and v once more for the masking.
"""

import math

import torch

from llmk.attention.reference_attention import softcapped


def grouped_scores(q, k_cache):
    """q k^T of decode, (B, Hkv, G, T_max), in q's dtype: q (B, H, D) grouped by kv head (query
    head h reads kv head h // G), no copy of the cache per head; k_cache (B, T_max, Hkv, D)."""
    b, h, d = q.shape
    hkv = k_cache.shape[2]
    return torch.einsum("bkgd,btkd->bkgt", q.reshape(b, hkv, h // hkv, d), k_cache.to(q.dtype))


def decode_probs(q, k_cache, lengths, sm_scale, window_left=-1, softcap=None, dtype=None):
    """(P, visible): the softmax probabilities (B, Hkv, G, T_max) of one query per sequence over its
    first lengths[b] keys (the last window_left + 1 of them where window_left >= 0; scores capped at
    softcap * tanh(s / softcap) where softcap is given), and the (B, T_max) bool of the keys each
    sequence sees. In `dtype` (default: q's, at least fp32); a sequence that sees no key gets zeros."""
    compute = dtype or torch.promote_types(q.dtype, torch.float32)
    t_max = k_cache.shape[1]
    scores = softcapped(grouped_scores(q.to(compute), k_cache) * sm_scale, softcap)
    positions = torch.arange(t_max, device=q.device)[None, :]
    ends = lengths.to(q.device)[:, None]
    visible = positions < ends  # (B, T_max)
    if window_left >= 0:
        visible &= positions >= ends - 1 - window_left
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    # a sequence of length 0 is a row of -inf: softmax gives NaN, the convention is zeros
    return torch.softmax(scores, dim=-1).nan_to_num(nan=0.0), visible


def decode_attention_reference(q, k_cache, v_cache, lengths, sm_scale=None, window_left=-1, softcap=None):
    """q (B, H, D); k_cache, v_cache (B, T_max, Hkv, D), H a multiple of Hkv; lengths (B,) int,
    0 <= lengths[b] <= T_max. Returns O (B, H, D) in q's dtype. sm_scale defaults to 1/sqrt(D).
    window_left >= 0: the query (token lengths[b] - 1) sees tokens from lengths[b] - 1 - window_left
    on; softcap c: the scores become c * tanh(s / c)."""
    b, h, d = q.shape
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    p, visible = decode_probs(q, k_cache, lengths, sm_scale, window_left, softcap)
    # slots past a length may hold anything (NaN included): 0 * NaN would leak into the sum
    v = v_cache.to(p.dtype).masked_fill(~visible[:, :, None, None], 0.0)
    return torch.einsum("bkgt,btkd->bkgd", p, v).reshape(b, h, d).to(q.dtype)
