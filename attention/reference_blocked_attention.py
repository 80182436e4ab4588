"""Online-softmax attention over key blocks, in plain PyTorch: FlashAttention's algorithm without
the kernel.

For each block of `block_size` keys it keeps, per query row, the running max m, the running sum
l of exp(s - m) and the unnormalized output acc, and rescales them when the max grows:

    m_new = max(m, rowmax(S_blk));  alpha = exp(m - m_new)
    l = l * alpha + rowsum(exp(S_blk - m_new));  acc = acc * alpha + exp(S_blk - m_new) @ V_blk
    O = acc / l

It never holds more than Tq x block_size scores, which proves the algorithm is exact; it is not
fast, because every block is its own round of PyTorch launches reading and writing memory. Same
conventions as naive_attention (GQA, bottom-right causal, a sliding window, softcap, zeros for a
query with no key). A key block that no query sees (past the causal diagonal or outside every
window) is skipped, as the kernel skips it: the result is the same, since exp(-inf) adds nothing.
"""

import math

import torch

from llmk.attention.reference_attention import expand_kv, softcapped, visible_mask


def blocked_attention(q, k, v, causal=False, sm_scale=None, block_size=128, window=None, softcap=None):
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D) -> O (B, H, Tq, D) in q's dtype, math in fp32.
    window: None or (left, right), -1 unbounded; softcap: None/0 or c > 0 (naive_attention's)."""
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    compute = torch.promote_types(q.dtype, torch.float32)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    tq, tk = q.shape[2], k.shape[2]
    qf = q.to(compute) * sm_scale
    k, v = expand_kv(k, q.shape[1]).to(compute), expand_kv(v, q.shape[1]).to(compute)
    m = torch.full(q.shape[:3], float("-inf"), dtype=compute, device=q.device)
    row_sum = torch.zeros(q.shape[:3], dtype=compute, device=q.device)
    acc = torch.zeros(*q.shape[:3], v.shape[-1], dtype=compute, device=q.device)
    visible = visible_mask(tq, tk, q.device, causal, window)
    starts = range(0, tk, block_size)
    if visible is not None:
        # the keys some query sees, in one host transfer: a test per block would sync a GPU per block
        seen = visible.any(0).tolist()
        starts = [start for start in starts if any(seen[start : start + block_size])]  # skip keys no query sees
    for start in starts:
        block = slice(start, start + block_size)
        kb, vb = k[:, :, block], v[:, :, block]
        s = softcapped(torch.matmul(qf, kb.transpose(-1, -2)), softcap)
        if visible is not None:
            s = s.masked_fill(~visible[:, block], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        # rows that have seen no key yet keep m = -inf; subtracting 0 instead avoids inf - inf
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - m_safe[..., None])
        alpha = torch.exp(m - m_safe)
        row_sum = row_sum * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.matmul(p, vb)
        m = m_new
    out = acc / torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum)[..., None]
    return out.to(q.dtype)
