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


def decode_attention_reference(q, k_cache, v_cache, lengths, sm_scale=None, window_left=-1, softcap=None):
    """q (B, H, D); k_cache, v_cache (B, T_max, Hkv, D), H a multiple of Hkv; lengths (B,) int,
    0 <= lengths[b] <= T_max. Returns O (B, H, D) in q's dtype. sm_scale defaults to 1/sqrt(D).
    window_left >= 0: the query (token lengths[b] - 1) sees tokens from lengths[b] - 1 - window_left
    on; softcap c: the scores become c * tanh(s / c)."""
    compute = torch.promote_types(q.dtype, torch.float32)
    b, h, d = q.shape
    t_max, hkv = k_cache.shape[1], k_cache.shape[2]
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    # query head h reads kv head h // G: group the query heads by kv head, no copy of the cache per head
    q_grouped = q.to(compute).reshape(b, hkv, h // hkv, d)
    k, v = k_cache.to(compute), v_cache.to(compute)
    scores = torch.einsum("bkgd,btkd->bkgt", q_grouped, k) * sm_scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    positions = torch.arange(t_max, device=q.device)[None, :]
    visible = positions < lengths.to(q.device)[:, None]  # (B, T_max)
    if window_left >= 0:
        visible &= positions >= lengths.to(q.device)[:, None] - 1 - window_left
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    # a sequence of length 0 is a row of -inf: softmax gives NaN, the convention is zeros
    p = torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)
    # slots past a length may hold anything (NaN included): 0 * NaN would leak into the sum
    v = v.masked_fill(~visible[:, :, None, None], 0.0)
    return torch.einsum("bkgt,btkd->bkgd", p, v).reshape(b, h, d).to(q.dtype)
