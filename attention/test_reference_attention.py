"""Tests for the two PyTorch references: blocked_attention (online softmax over key blocks) against
naive_attention, and naive_attention itself against PyTorch's scaled_dot_product_attention.

    python attention/test_reference_attention.py      (or: pytest attention/test_reference_attention.py)

Both references run in fp64 here, so they must agree to fp64 rounding: the online rescaling is
exact algebra, not an approximation. SDPA is the independent check of the conventions (GQA head
mapping, bottom-right causal mask, scale): it runs in fp64 with an explicit boolean mask. Sliding
windows and softcapping are checked against masks built key by key from their definition.
"""

import torch
import torch.nn.functional as F

from llmk.attention.reference_attention import causal_mask, expand_kv, naive_attention
from llmk.attention.reference_blocked_attention import blocked_attention
from llmk.devtools.testing import Case, Outcome, Tol, compare, expect_raises, main, rand

FP64 = Tol(1e-12, 1e-12, "fp64 throughout; only the order of the sums differs")


def qkv(b, h, hkv, tq, tk, d, dtype=torch.float64):
    return rand((b, h, tq, d), dtype), rand((b, hkv, tk, d), dtype), rand((b, hkv, tk, d), dtype)


def check(b, h, hkv, tq, tk, d, causal, block_size):
    q, k, v = qkv(b, h, hkv, tq, tk, d)
    ref = naive_attention(q, k, v, causal)
    out = blocked_attention(q, k, v, causal, block_size=block_size)
    outcomes = [compare("blocked vs naive", out, ref, FP64)]
    # SDPA knows no "no key visible" row: compare the rows that see at least one key
    mask = causal_mask(tq, tk, q.device) if causal else torch.ones(tq, tk, dtype=torch.bool, device=q.device)
    seen = mask.any(-1)
    sdpa = F.scaled_dot_product_attention(q, expand_kv(k, h), expand_kv(v, h), attn_mask=mask)
    outcomes.append(compare("naive vs SDPA", ref[:, :, seen], sdpa[:, :, seen], FP64))
    if not seen.all():
        outcomes.append(Outcome("no key: zeros", bool((ref[:, :, ~seen] == 0).all())))
    return outcomes


def check_window_softcap(tq, tk, causal, window, softcap):
    """naive_attention's window and softcap against SDPA given a mask built key by key from the
    definition (query i sees key j when i' - left <= j <= i' + right, i' = i + Tk - Tq; causal:
    j <= i'); with a softcap, which SDPA cannot apply, against the softmax of c * tanh(s / c) written
    out here in fp64 under that mask."""
    q, k, v = qkv(1, 4, 2, tq, tk, 16)
    left, right = window
    mask = torch.zeros(tq, tk, dtype=torch.bool)
    for i in range(tq):
        for j in range(tk):
            ip = i + tk - tq
            mask[i, j] = (left < 0 or j >= ip - left) and (right < 0 or j <= ip + right) and (not causal or j <= ip)
    mask = mask.to(q.device)
    ref = naive_attention(q, k, v, causal, 0.3, window, softcap)
    blocked = blocked_attention(q, k, v, causal, 0.3, block_size=8, window=window, softcap=softcap)
    seen = mask.any(-1)
    if softcap:
        s = torch.tanh(q @ expand_kv(k, 4).transpose(-1, -2) * 0.3 / softcap) * softcap
        want = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(nan=0.0) @ expand_kv(v, 4)
    else:
        want = F.scaled_dot_product_attention(q, expand_kv(k, 4), expand_kv(v, 4), attn_mask=mask, scale=0.3)
    outcomes = [
        compare("naive vs the definition", ref[:, :, seen], want[:, :, seen], FP64),
        compare("blocked vs naive", blocked, ref, FP64),
    ]
    if not seen.all():
        outcomes.append(Outcome("no key: zeros", bool((ref[:, :, ~seen] == 0).all())))
    return outcomes


def check_low_precision():
    """bf16 in, bf16 out, fp32 math: within one bf16 rounding of the fp64 result."""
    q, k, v = qkv(1, 4, 2, 40, 40, 64, torch.bfloat16)
    ref = naive_attention(q.double(), k.double(), v.double(), True)
    return [
        compare("naive bf16", naive_attention(q, k, v, True), ref),
        compare("blocked bf16", blocked_attention(q, k, v, True, block_size=16), ref),
    ]


def check_errors():
    q, k, v = qkv(1, 2, 2, 8, 8, 16)
    return [expect_raises("block_size 0", lambda: blocked_attention(q, k, v, block_size=0), ValueError, "block_size")]


CASES = (
    [
        Case(
            f"B{b} H{h}/{hkv} Tq{tq} Tk{tk} D{d} {'causal' if causal else 'full'} block {bs}",
            check,
            dict(b=b, h=h, hkv=hkv, tq=tq, tk=tk, d=d, causal=causal, block_size=bs),
        )
        for b, h, hkv, tq, tk, d, bs in [
            (2, 4, 4, 77, 77, 32, 16),
            (1, 8, 2, 50, 130, 64, 128),
            (1, 4, 1, 130, 50, 16, 7),
            (3, 2, 2, 1, 1, 8, 128),
            (1, 2, 1, 1, 60, 32, 8),
        ]
        for causal in (False, True)
    ]
    + [
        Case(
            f"Tq{tq} Tk{tk} window {window}{' causal' if causal else ''}{f' softcap {c}' if c else ''}",
            check_window_softcap,
            dict(tq=tq, tk=tk, causal=causal, window=window, softcap=c),
        )
        for tq, tk, causal, window, c in [
            (20, 20, False, (3, 2), None),
            (12, 30, True, (5, 4), None),
            (30, 12, False, (2, -1), None),
            (30, 12, False, (-1, 1), 2.0),
            (20, 20, True, (-1, -1), 0.5),
        ]
    ]
    + [Case("bf16 inputs", check_low_precision), Case("bad input", check_errors)]
)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("attention references", CASES)
