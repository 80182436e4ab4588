"""Tests for inference/triton_inference_attention.py (contiguous and paged decode attention) against
inference/reference_decode_attention.py computed in fp64.

    python inference/test_inference_attention.py   (or: pytest inference/test_inference_attention.py)

Error model and tolerance: attention/attention_cases.py, as for attention/test_flash_attention.py
(the split path merges fp32 partials, the same model): p rounded once to the input dtype before
p @ v, O rounded once, a bound for each element from the fp64 probabilities. Beside that bound, the
2x rule: our error must be at most twice that of PyTorch's same-dtype decode (scores, softmax and
p @ v each in the input dtype).

Every batch is ragged where it can be: lengths 0, 1 and T_max side by side, the rest random. Caches
are filled everywhere (also past each length) so a kernel that reads past a length fails.

Head dims other than 64, 128 and 256 (two parts: 96 and 160 exact, 80 and 72 with a padded second;
one padded tile: 40, 24, 8, 1; and 32) run with q, K and V as views of tensors holding NaN past D in
every row (layout "nan_cols"): a kernel that reads a column of q or K past D returns NaN; the output
is the head of a longer NaN buffer whose tail must stay NaN, so a store past D of the last head shows.

An e4m3 cache (check_fp8) is checked against the reference on its own dequantized values, each
(token, kv head)'s D bytes times its scale rounded to q's dtype, as the kernel dequantizes them: the
same error model and tolerance as a 16-bit cache of those values, so a scale applied to the wrong
token, head or page, or not at all, fails. Its keys' scales vary over four orders of magnitude.
"""

import dataclasses
import math

import torch

from llmk.common.device import DEVICE, INTERPRET, sm_count
from llmk.common.ints import cdiv
from llmk.devtools.testing import (
    Case,
    Outcome,
    compare,
    dtype_name,
    expect_raises,
    main,
    one_dtype_here,
    poisoned,
    rand,
)
from llmk.inference.decode_cases import decode_tol
from llmk.inference.kv_cache import KVCache, as_token_minor, dequantize_kv, quantize_kv
from llmk.inference.paged_kv_cache import PagedKVCache, as_value_pages
from llmk.inference.reference_decode_attention import decode_attention_reference, decode_probs
from llmk.inference.triton_inference_attention import (
    BLOCK_TABLE,
    FP8,
    HEAD_DIMS,
    INTERPRET_SMS,
    MAX_SPLITS,
    PAGED_LONG_TOKENS,
    PARTS_MAX_WAVES,
    SPLIT_TABLE,
    DecodeConfig,
    decode_attention,
    decode_attention_op,
    decode_attention_out_op,
    decode_config,
    head_dim_parts,
    paged_blocks,
    paged_decode_attention,
    paged_decode_attention_op,
    split_count,
)

H100_SMS = 132


def same_dtype_decode(q, k, v, lengths, sm_scale, window_left=-1, softcap=None):
    """PyTorch's decode with every step in the input dtype: the error the 2x rule allows."""
    p, _ = decode_probs(q, k, lengths, sm_scale, window_left, softcap, dtype=q.dtype)
    return torch.einsum("bkgt,btkd->bkgd", p, v).reshape(q.shape)


def ragged_lengths(b, t_max):
    """(B,) int32: T_max, 0 and 1 first (as many as fit), the rest random in 0..T_max."""
    fixed = [t_max, 0, 1][:b]
    rest = torch.randint(0, t_max + 1, (b - len(fixed),)).tolist()
    return torch.tensor(fixed + rest, dtype=torch.int32, device=DEVICE)


NAN_COLS = 16  # columns of NaN past D in layout "nan_cols": the first columns a read past D meets


def nan_cols(shape, dtype, scale=1.0):
    """A fresh normal tensor of `shape`, a view whose rows run on into NAN_COLS columns of NaN."""
    full = rand((*shape[:-1], shape[-1] + NAN_COLS), dtype, scale=scale)
    full[..., shape[-1] :] = float("nan")
    return full[..., : shape[-1]]


def guarded_out(shape, dtype, spare=256):
    """(out, tail): a poisoned contiguous out at the head of a longer NaN buffer, and the spare tail
    past it, which a store past the last head's D columns would write."""
    n = math.prod(shape)
    buffer = poisoned((n + spare,), dtype)
    return buffer[:n].view(shape), buffer[n:]


def tail_intact(tail, name="nothing written past out"):
    return Outcome(name, bool(tail.isnan().all()))


def make_cache(b, t_max, hkv, d, dtype, layout):
    """k, v (B, T_max, Hkv, D). layout "bthd": packed; "hf": (B, Hkv, T, D) tensors viewed with
    .transpose(1, 2); "padded": views cut from larger tensors (every stride unpacked); "nan_cols":
    views whose rows run on into NaN past D."""
    if layout == "hf":
        return [rand((b, hkv, t_max, d), dtype).transpose(1, 2) for _ in range(2)]
    if layout == "nan_cols":
        return [nan_cols((b, t_max, hkv, d), dtype) for _ in range(2)]
    pad = (0, 3, 1, 8) if layout == "padded" else None
    return [rand((b, t_max, hkv, d), dtype, pad=pad) for _ in range(2)]


def reference(q, k, v, lengths, sm_scale, window_left=-1, softcap=None):
    return decode_attention_reference(q.double(), k.double(), v.double(), lengths, sm_scale, window_left, softcap)


def make_q(b, h, d, dtype, layout, scale=1.0):
    if layout == "nan_cols":
        return nan_cols((b, h, d), dtype, scale)
    return rand((b, h, d), dtype, pad=(0, 2, 8) if layout == "padded" else None, scale=scale)


def forced_config(b, h, hkv, t_max, d, num_splits, use_dot, head_parts):
    """The heuristics' blocks with one product (use_dot), a split count (None: 1) and the head dim in
    parts or one tile (head_parts) forced; None where neither use_dot nor head_parts is given."""
    if use_dot is None and head_parts is None:
        return None
    auto = decode_config(b, hkv, h // hkv, d, t_max, 2)
    return DecodeConfig(
        auto.BLOCK_N,
        auto.num_warps,
        auto.num_stages,
        auto.use_dot if use_dot is None else use_dot,
        num_splits or 1,
        True if head_parts is None else head_parts,
    )


def check(
    b, h, hkv, t_max, d, dtype, num_splits=None, layout="bthd", sm_scale=None, scale=1.0, use_dot=None, head_parts=None
):
    q = make_q(b, h, d, dtype, layout, scale)
    k, v = make_cache(b, t_max, hkv, d, dtype, layout)
    lengths = ragged_lengths(b, t_max)
    config = forced_config(b, h, hkv, t_max, d, num_splits, use_dot, head_parts)  # None: the heuristics
    out, tail = guarded_out((b, h, d), dtype)
    o = decode_attention(q, k, v, lengths, sm_scale, num_splits=num_splits, config=config, out=out)
    scale_used = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    return [
        compare(
            "O",
            o,
            reference(q, k, v, lengths, scale_used),
            decode_tol(q, k, v, lengths, scale_used),
            torch_out=same_dtype_decode(q, k, v, lengths, scale_used),
        ),
        tail_intact(tail),
    ]


def to_pages(caches, lengths, page_size, spare_pages=3, layout="bthd"):
    """Paged copies of contiguous caches (each (B, T_max, Hkv, D)), one page order for all: pages in
    a random order, spare pages of large values, and block table entries past each sequence's pages
    pointing at a spare (a kernel that reads past a length fails). layout "nan_cols": pages whose
    rows run on into NaN past D. Returns ([pages...], block_table)."""
    b, t_max, hkv, d = caches[0].shape
    max_pages = cdiv(t_max, page_size)
    num_pages = b * max_pages + spare_pages
    order = torch.randperm(num_pages, device=DEVICE)
    table = order[: b * max_pages].reshape(b, max_pages)
    paged = []
    for cache in caches:
        pages = (nan_cols if layout == "nan_cols" else rand)((num_pages, page_size, hkv, d), cache.dtype, scale=100.0)
        padded = torch.zeros((b, max_pages * page_size, hkv, d), dtype=cache.dtype, device=DEVICE)
        padded[:, :t_max] = cache
        pages[table] = padded.reshape(b, max_pages, page_size, hkv, d)
        paged.append(pages)
    used = (lengths.long()[:, None] + page_size - 1) // page_size  # pages each sequence holds
    unused = torch.arange(max_pages, device=DEVICE)[None, :] >= used
    table = torch.where(unused, order[b * max_pages], table)
    return paged, table.to(torch.int32)


def check_paged(
    b,
    h,
    hkv,
    t_max,
    d,
    dtype,
    page_size=16,
    num_splits=None,
    use_dot=None,
    window=None,
    softcap=None,
    scale=1.0,
    layout="bthd",
    head_parts=None,
):
    """The paged and the contiguous kernel against the reference, and against each other on the same
    data where both take the same split count and blocks: the same blocks in the same order, so bit
    for bit the same output. window: a sliding window (only the last left + 1 tokens seen, the
    range cut before the splits); softcap: logit softcapping (scale: q's, so that scores reach the cap);
    layout: "bthd" or "nan_cols" (q, caches and pages, as in check); head_parts: forces the head dim
    in parts (True) or one tile (False) on both sides."""
    q = make_q(b, h, d, dtype, layout, scale)
    k, v = make_cache(b, t_max, hkv, d, dtype, layout)
    lengths = ragged_lengths(b, t_max)
    (k_pages, v_pages), table = to_pages((k, v), lengths, page_size, layout=layout)
    config = None
    if use_dot is not None:
        config = forced_config(b, h, hkv, t_max, d, num_splits, use_dot, head_parts)
    elif num_splits is not None or head_parts is not None:  # the paged heuristics' blocks, given to both sides
        config = decode_config(
            b, hkv, h // hkv, d, t_max, sm_count(torch.device(DEVICE).index or 0, INTERPRET_SMS), True, num_splits
        )
        if head_parts is not None:
            config = dataclasses.replace(config, head_parts=head_parts)
    options = dict(window=window, softcap=softcap, num_splits=num_splits, config=config)
    (out, tail), (out_contiguous, tail_contiguous) = guarded_out((b, h, d), dtype), guarded_out((b, h, d), dtype)
    o = paged_decode_attention(q, k_pages, v_pages, table, lengths, **options, out=out)
    o_contiguous = decode_attention(q, k, v, lengths, **options, out=out_contiguous)
    sm = 1.0 / math.sqrt(d)
    left = -1 if window is None else window[0]
    want = reference(q, k, v, lengths, sm, left, softcap)
    tol = decode_tol(q, k, v, lengths, sm, left, softcap)
    theirs = same_dtype_decode(q, k, v, lengths, sm, left, softcap)
    outcomes = [
        compare("O paged", o, want, tol, torch_out=theirs),
        compare("O", o_contiguous, want, tol, torch_out=theirs),
        tail_intact(tail, "paged: nothing written past out"),
        tail_intact(tail_contiguous),
    ]
    if num_splits is not None:  # both sides then take the same split count
        outcomes.append(Outcome("paged == contiguous, bit for bit", torch.equal(o, o_contiguous)))
    return outcomes


def fp8_cache(t, exact=False):
    """(e4m3 values, fp32 scales, dequantized) of a 16-bit cache or pool t (..., D): quantize_kv's
    cast, then each value times its scale, rounded to t's dtype (or, exact, in fp64: what the
    kernels compute with, the scales applied to the scores and to p in fp32, module docstring of
    inference/triton_inference_attention.py)."""
    q, scale = quantize_kv(t)
    q = q.view(FP8)
    if exact:
        return q, scale, q.double() * scale.double()[..., None]
    return q, scale, dequantize_kv(q, scale, t.dtype)


def spread(t, decades=2.0):
    """t (B, T, Hkv, D) with each (token, kv head) scaled by 10^u, u uniform in [-decades, decades]:
    scales that differ from token to token and head to head."""
    factor = 10.0 ** ((torch.rand(t.shape[:-1] + (1,), device=DEVICE) * 2 - 1) * decades)
    return (t.float() * factor).to(t.dtype)


def check_fp8(
    b,
    h,
    hkv,
    t_max,
    d,
    dtype,
    paged=False,
    num_splits=None,
    window=None,
    softcap=None,
    scale=1.0,
    use_dot=None,
    v_token_major=False,
    v_zero=None,
):
    """decode_attention (or, paged, paged_decode_attention) on an e4m3 cache against the reference
    on the exactly dequantized cache, with its tolerance and the 2x rule. use_dot: a forced config
    with that product (False: the broadcast product). v is token-minor, as the caches store it
    (inference/kv_cache.py's token_minor), unless v_token_major. v_zero: (first, end) tokens of v
    set to zero in every sequence."""
    q = make_q(b, h, d, dtype, "bthd", scale)
    k, v = (spread(t) for t in make_cache(b, t_max, hkv, d, dtype, "bthd"))
    if v_zero is not None:
        v[:, v_zero[0] : v_zero[1]] = 0
    lengths = ragged_lengths(b, t_max)
    config = None if use_dot is None else forced_config(b, h, hkv, t_max, d, num_splits, use_dot, None)
    options = dict(window=window, softcap=softcap, num_splits=num_splits, config=config)
    out, tail = guarded_out((b, h, d), dtype)
    if paged:
        (k_pages, v_pages), table = to_pages((k, v), lengths, 16)
        (kq, ks, _), (vq, vs, _) = fp8_cache(k_pages), fp8_cache(v_pages)
        vq = vq if v_token_major else as_value_pages(vq)
        o = paged_decode_attention(q, kq, vq, table, lengths, k_scale=ks, v_scale=vs, out=out, **options)
    else:
        (kq, ks, _), (vq, vs, _) = fp8_cache(k), fp8_cache(v)
        vq = vq if v_token_major else as_token_minor(vq)
        o = decode_attention(q, kq, vq, lengths, k_scale=ks, v_scale=vs, out=out, **options)
    # per (token, head): the pages' rows, in cache order
    k_deq, v_deq = fp8_cache(k, True)[2], fp8_cache(v, True)[2]
    sm = 1.0 / math.sqrt(d)
    left = -1 if window is None else window[0]
    return [
        compare(
            "O vs the dequantized cache's",
            o,
            reference(q, k_deq, v_deq, lengths, sm, left, softcap),
            decode_tol(q, k_deq, v_deq, lengths, sm, left, softcap, e4m3=True),
            torch_out=same_dtype_decode(q, k_deq.to(dtype), v_deq.to(dtype), lengths, sm, left, softcap),
        ),
        tail_intact(tail),
    ]


def check_fp8_caches():
    """KVCache and PagedKVCache with dtype float8_e4m3fn: a prefill chunk and a decode token
    appended (quantized on the way in), attend against the reference on the dequantized tokens."""
    b, h, hkv, d, dtype = 3, 8, 2, 64, torch.bfloat16
    k, v = (spread(rand((b, 21, hkv, d), dtype)) for _ in range(2))
    q = rand((b, h, d), dtype)
    lengths = torch.full((b,), 21, dtype=torch.int32, device=DEVICE)
    k_deq, v_deq = fp8_cache(k, True)[2], fp8_cache(v, True)[2]
    want = reference(q, k_deq, v_deq, lengths, d**-0.5)
    tol = decode_tol(q, k_deq, v_deq, lengths, d**-0.5, e4m3=True)
    outcomes = []
    for name, cache in (("KVCache", KVCache(b, 40, hkv, d, FP8)), ("PagedKVCache", PagedKVCache(b, 40, hkv, d, FP8))):
        cache.append(k[:, :20], v[:, :20])
        cache.append(k[:, 20:], v[:, 20:])
        outcomes.append(compare(f"{name} e4m3: attend", cache.attend(q), want, tol))
        values = cache.v if name == "KVCache" else cache.v_pages
        outcomes.append(Outcome(f"{name} e4m3: v token-minor", values.stride(1) == 1, note=str(values.stride())))
        cache.reset(1)  # sequence 1 again from its first token, its old bytes and scales left behind
        cache.append(k[:, :1], v[:, :1])
        kept = torch.tensor([22, 1, 22], dtype=torch.int32, device=DEVICE)
        k2, v2 = torch.cat([k_deq, k_deq[:, :1]], 1), torch.cat([v_deq, v_deq[:, :1]], 1)
        k2[1, 0], v2[1, 0] = k_deq[1, 0], v_deq[1, 0]
        outcomes.append(
            compare(
                f"{name} e4m3: reset, append",
                cache.attend(q),
                reference(q, k2, v2, kept, d**-0.5),
                decode_tol(q, k2, v2, kept, d**-0.5, e4m3=True),
            )
        )
    outcomes.append(
        expect_raises(
            "e4m3 cache: fp32 chunk", lambda: KVCache(b, 40, hkv, d, FP8).append(k.float(), v.float()), TypeError, "k"
        )
    )
    outcomes.append(expect_raises("e5m2 cache", lambda: KVCache(b, 40, hkv, d, torch.float8_e5m2), TypeError, "dtype"))
    return outcomes


def check_fp8_errors():
    q = rand((2, 8, 64), torch.float16)
    k, v = make_cache(2, 20, 2, 64, torch.float16, "bthd")
    (kq, ks, _), (vq, vs, _) = fp8_cache(k), fp8_cache(v)
    lengths = torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    f = decode_attention
    return [
        expect_raises("e4m3 cache, no scales", lambda: f(q, kq, vq, lengths), ValueError, "k_scale"),
        expect_raises("e4m3 cache, v_scale None", lambda: f(q, kq, vq, lengths, k_scale=ks), ValueError, "v_scale"),
        expect_raises(
            "scales with a 16-bit cache", lambda: f(q, k, v, lengths, k_scale=ks, v_scale=vs), ValueError, "k_scale"
        ),
        expect_raises("e4m3 k, 16-bit v", lambda: f(q, kq, v, lengths, k_scale=ks, v_scale=vs), TypeError, "v_cache"),
        expect_raises(
            "k_scale shape", lambda: f(q, kq, vq, lengths, k_scale=ks[:, :10], v_scale=vs), ValueError, "k_scale"
        ),
        expect_raises(
            "k_scale fp16", lambda: f(q, kq, vq, lengths, k_scale=ks.half(), v_scale=vs), TypeError, "k_scale"
        ),
        expect_raises(
            "scales of two layouts",
            lambda: f(q, kq, vq, lengths, k_scale=ks, v_scale=vs.transpose(0, 1).contiguous().transpose(0, 1)),
            ValueError,
            "layout",
        ),
        expect_raises(
            "op: e4m3 cache, no scales",
            lambda: decode_attention_op(q, kq, vq, lengths, None, None, None),
            ValueError,
            "k_scale",
        ),
    ]


def check_huge():
    """Past 2^31 elements per cache (B65 T32768 H32/8 hd128, 4.4 GB each): the last sequences, where
    a 32-bit batch or page offset would wrap; contiguous and paged (the same memory as pages)."""
    b, h, hkv, t_max, d, dtype = 65, 32, 8, 32768, 128, torch.float16
    q = rand((b, h, d), dtype)
    k, v = (torch.randn((b, t_max, hkv, d), device=DEVICE, dtype=dtype) for _ in range(2))
    lengths = torch.randint(1, t_max + 1, (b,), dtype=torch.int32, device=DEVICE)
    lengths[-1] = t_max
    tail = slice(b - 2, b)
    ref = reference(q[tail], k[tail], v[tail], lengths[tail], 1.0 / math.sqrt(d))
    tol = decode_tol(q[tail], k[tail], v[tail], lengths[tail], 1.0 / math.sqrt(d))
    page_size = 16
    table = torch.arange(b * t_max // page_size, device=DEVICE, dtype=torch.int32).reshape(b, -1)
    outcomes = []
    for splits in (None, 1):
        o = decode_attention(q, k, v, lengths, num_splits=splits)
        outcomes.append(compare(f"last 2 sequences, splits {splits}", o[tail], ref, tol))
        o = paged_decode_attention(
            q, k.view(-1, page_size, hkv, d), v.view(-1, page_size, hkv, d), table, lengths, num_splits=splits
        )
        outcomes.append(compare(f"paged, last 2 sequences, splits {splits}", o[tail], ref, tol))
    return outcomes


def check_no_keys():
    """T_max = 0 and all lengths 0: every sequence sees nothing, O is zeros (unsplit and split)."""
    q = rand((3, 4, 64), torch.float16)
    outcomes = []
    k = v = rand((3, 0, 2, 64), torch.float16)
    zero = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    o = decode_attention(q, k, v, zero, out=poisoned((3, 4, 64), torch.float16))
    outcomes.append(Outcome("T_max 0: zeros", bool((o == 0).all())))
    k = v = rand((3, 40, 2, 64), torch.float16)
    for splits in (1, 4):
        o = decode_attention(q, k, v, zero, num_splits=splits, out=poisoned((3, 4, 64), torch.float16))
        outcomes.append(Outcome(f"lengths 0, splits {splits}: zeros", bool((o == 0).all())))
    return outcomes


def check_empty():
    outcomes = []
    for b, h, hkv in ((0, 4, 2), (2, 0, 2)):
        q = rand((b, h, 64), torch.bfloat16)
        k = v = rand((b, 9, hkv, 64), torch.bfloat16)
        lengths = torch.zeros(b, dtype=torch.int32, device=DEVICE)
        o = decode_attention(q, k, v, lengths)
        outcomes.append(Outcome(f"q {tuple(q.shape)}", o.shape == q.shape and o.dtype == q.dtype))
        table = torch.zeros((b, 1), dtype=torch.int32, device=DEVICE)
        o = paged_decode_attention(q, k[:0].reshape(0, 16, hkv, 64), k[:0].reshape(0, 16, hkv, 64), table, lengths)
        outcomes.append(Outcome(f"paged q {tuple(q.shape)}", o.shape == q.shape and o.dtype == q.dtype))
    return outcomes


def check_head_dim_parts():
    """head_dim_parts: the documented splits, and at every head dim parts of tl.dot's sizes (powers of
    two >= 16) that cover D, no wider than the one padded tile, the second narrower than the first."""
    named = {
        (80, 16): (64, 32),
        (96, 16): (64, 32),
        (72, 16): (64, 32),
        (160, 16): (128, 32),
        (192, 16): (128, 64),
        (112, 16): (128, 0),
        (64, 16): (64, 0),
        (128, 16): (128, 0),
        (256, 16): (256, 0),
        (8, 16): (16, 0),
        (80, 32): (128, 0),
        (192, 32): (128, 64),
        (80, 1): (64, 32),
    }
    out = [
        Outcome(f"hd {d} group_pad {g} -> {want}", head_dim_parts(d, g) == want, note=str(head_dim_parts(d, g)))
        for (d, g), want in named.items()
    ]
    bad = []
    for g in (1, 16, 32, 64):
        for d in HEAD_DIMS:
            first, second = head_dim_parts(d, g)
            pow2 = [w for w in (first, second) if w]
            if not (
                all(w >= 16 and w & (w - 1) == 0 for w in pow2)
                and first + second >= d
                and first + second <= max(16, 1 << (d - 1).bit_length())
                and second < first
                and (second == 0 or second > g)
            ):
                bad.append((d, g))
    out.append(
        Outcome(
            "every head dim 1..256: parts tl.dot takes, covering D, wider than the group",
            not bad,
            note=f"bad: {bad[:8]}" if bad else "",
        )
    )
    # decode_config: parts on grids of at most PARTS_MAX_WAVES programs an SM, one tile past them
    for b, hkv, t, paged, want in (
        (1, 32, 8192, False, True),
        (16, 8, 4096, False, True),
        (1, 8, 8192, True, True),
        (16, 32, 4096, False, False),
        (64, 8, 8192, False, False),
    ):
        cfg = decode_config(b, hkv, 4, 80, t, H100_SMS, paged)
        programs = b * hkv * cfg.num_splits
        out.append(
            Outcome(
                f"B{b} Hkv{hkv} T{t}{' paged' if paged else ''} at 132 SMs: {'parts' if want else 'one tile'}",
                cfg.head_parts == want and (programs <= PARTS_MAX_WAVES * H100_SMS) == want,
                note=f"{programs} programs",
            )
        )
    return out


def check_split_heuristic():
    """The split table on an H100's 132 SMs: B1 splits (the GPU is otherwise idle), one program an SM
    (B16 H32/8) or a full GPU does not, nor does a one-block sequence, no count passes MAX_SPLITS,
    and the paged kernel splits more."""
    shapes = ((1, 8, 8192), (1, 32, 8192), (8, 8, 4096), (16, 8, 4096), (64, 32, 4096), (1, 8, 64), (1, 1, 10**6))
    counts = {(b, hkv, t): split_count(b * hkv, t, H100_SMS, 64) for b, hkv, t in shapes}
    paged = split_count(8, 8192, H100_SMS, 64, paged=True)  # fewer loads in flight a program
    paged_b16 = split_count(128, 4096, H100_SMS, 64, paged=True)
    return [
        Outcome("B1 H32/8 T8192 splits", counts[(1, 8, 8192)] > 8, note=str(counts[(1, 8, 8192)])),
        Outcome("B1 H32/32 T8192 splits", counts[(1, 32, 8192)] > 1, note=str(counts[(1, 32, 8192)])),
        Outcome("B8 H32/8 T4096 splits", counts[(8, 8, 4096)] > 1, note=str(counts[(8, 8, 4096)])),
        Outcome("B16 H32/8 unsplit", counts[(16, 8, 4096)] == 1, note=str(counts[(16, 8, 4096)])),
        Outcome("B64 H32/32 unsplit", counts[(64, 32, 4096)] == 1, note=str(counts[(64, 32, 4096)])),
        Outcome("T64 (one block) unsplit", counts[(1, 8, 64)] == 1, note=str(counts[(1, 8, 64)])),
        Outcome("at most MAX_SPLITS", counts[(1, 1, 10**6)] == MAX_SPLITS, note=str(counts[(1, 1, 10**6)])),
        Outcome("paged B1 H32/8 T8192 splits more", paged > counts[(1, 8, 8192)], note=str(paged)),
        Outcome("paged B16 H32/8 unsplit", paged_b16 == 1, note=str(paged_b16)),
        # the paged kernel's blocks (hd 128: 64 tokens, 4 warps, 3 stages) under one program an SM:
        # halved in a split of several blocks, two stages for a split of one; unsplit, doubled with
        # the warps for a long sequence. From one program an SM up, split or not, unchanged.
        Outcome(
            "paged blocks",
            (
                paged_blocks(64, 4, 3, 8, 8192, True),
                paged_blocks(64, 4, 3, 8, 512, True),
                paged_blocks(64, 4, 3, 1, 8192, True),
                paged_blocks(64, 4, 3, 1, 1024, True),
                paged_blocks(64, 4, 3, 1, 8192, False),
                paged_blocks(64, 4, 3, 4, 8192, False),
                paged_blocks(32, 4, 3, 8, 8192, True),
                paged_blocks(16, 1, 1, 4, 512, True),
            )
            == ((32, 4, 3), (64, 4, 2), (128, 8, 3), (64, 4, 3), (64, 4, 3), (64, 4, 3), (32, 4, 3), (16, 1, 1)),
            note=str(paged_blocks(64, 4, 3, 1, 8192, True)),
        ),
    ]


def check_e4m3_config():
    """E4M3_BLOCK_TABLE's rows (GPU: the interpreter keeps its own blocks): an e4m3 cache at hd 128
    and 96 takes twice the 16-bit block, three stages (two for a group of one), twice the splits
    under one program an SM and a quarter past it (132 SMs); hd 64 and a 16-bit cache keep the
    16-bit choice."""

    def pick(b, hkv, d=128, paged=False, e4m3=True, group=4):
        cfg = decode_config(b, hkv, group, d, 8192, H100_SMS, paged, None, e4m3)
        return cfg.BLOCK_N, cfg.num_warps, cfg.num_stages, cfg.num_splits

    return [
        Outcome("B1 H32/8 e4m3", pick(1, 8) == (128, 4, 3, 33), note=str(pick(1, 8))),
        Outcome("B1 H32/8 e4m3 paged", pick(1, 8, paged=True) == (128, 4, 3, 33), note=str(pick(1, 8, paged=True))),
        Outcome("B16 H32/8 e4m3", pick(16, 8) == (128, 4, 3, 2), note=str(pick(16, 8))),
        Outcome("B64 H32/8 e4m3", pick(64, 8) == (128, 4, 3, 1), note=str(pick(64, 8))),
        Outcome("B16 H32/32 e4m3 (MHA)", pick(16, 32, group=1) == (128, 4, 2, 1), note=str(pick(16, 32, group=1))),
        Outcome("hd 96 e4m3 as hd 128", pick(16, 8, d=96) == pick(16, 8), note=str(pick(16, 8, d=96))),
        Outcome(
            "hd 64 e4m3 as 16-bit", pick(16, 8, d=64) == pick(16, 8, d=64, e4m3=False), note=str(pick(16, 8, d=64))
        ),
        Outcome("16-bit hd 128 unchanged", pick(16, 8, e4m3=False) == (64, 4, 3, 1), note=str(pick(16, 8, e4m3=False))),
    ]


def check_errors():
    q = rand((2, 8, 64), torch.float16)
    k, v = make_cache(2, 20, 2, 64, torch.float16, "bthd")
    lengths = torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    (pages,), table = to_pages((k,), lengths, 16)
    wide_q, wide_k = rand((2, 8, 257), torch.float16), rand((2, 20, 2, 257), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    f = decode_attention
    return [
        expect_raises("fp32 q", lambda: f(q.float(), k, v, lengths), TypeError, "q"),
        expect_raises("k dtype differs", lambda: f(q, k.bfloat16(), v, lengths), TypeError, "k_cache"),
        expect_raises("4-D q", lambda: f(q[:, None], k, v, lengths), ValueError, "q"),
        expect_raises("head dim 257", lambda: f(wide_q, wide_k, wide_k, lengths), ValueError, "head_dim"),
        expect_raises("head dim 0", lambda: f(q[..., :0], k[..., :0], v[..., :0], lengths), ValueError, "head_dim"),
        expect_raises("k head dim", lambda: f(q, k[..., :32], v[..., :32], lengths), ValueError, "k_cache"),
        expect_raises("3-D k", lambda: f(q, k[0], v[0], lengths), ValueError, "k_cache"),
        expect_raises("v shape", lambda: f(q, k, v[:, :10], lengths), ValueError, "v_cache"),
        expect_raises(
            "heads 8 vs 3",
            lambda: f(q, k.repeat(1, 1, 2, 1)[:, :, :3], v.repeat(1, 1, 2, 1)[:, :, :3], lengths),
            ValueError,
            "head count",
        ),
        expect_raises("batch", lambda: f(q, k[:1], v[:1], lengths), ValueError, "k_cache"),
        expect_raises("int64 lengths", lambda: f(q, k, v, lengths.long()), TypeError, "lengths"),
        expect_raises("lengths shape", lambda: f(q, k, v, lengths[:1]), ValueError, "lengths"),
        expect_raises("window of one int", lambda: f(q, k, v, lengths, window=(3,)), TypeError, "window"),
        expect_raises("window side -2", lambda: f(q, k, v, lengths, window=(-2, 0)), ValueError, "window"),
        expect_raises("softcap -1", lambda: f(q, k, v, lengths, softcap=-1.0), ValueError, "softcap"),
        expect_raises(
            "paged softcap NaN",
            lambda: paged_decode_attention(q, pages, pages, table, lengths, softcap=float("nan")),
            ValueError,
            "softcap",
        ),
        # the operators called directly, past the public functions' checks
        expect_raises(
            "op softcap NaN",
            lambda: decode_attention_op(q, k, v, lengths, None, None, None, -1, float("nan")),
            ValueError,
            "softcap",
        ),
        expect_raises(
            "op window_left -7",
            lambda: decode_attention_op(q, k, v, lengths, None, None, None, -7),
            ValueError,
            "window_left",
        ),
        expect_raises(
            "_out op window_left -7",
            lambda: decode_attention_out_op(q, k, v, lengths, None, None, None, torch.empty_like(q), -7),
            ValueError,
            "window_left",
        ),
        expect_raises(
            "paged op softcap NaN",
            lambda: paged_decode_attention_op(q, pages, pages, table, lengths, None, None, None, -1, float("nan")),
            ValueError,
            "softcap",
        ),
        expect_raises(f"lengths on {other}", lambda: f(q, k, v, lengths.to(other)), ValueError, "lengths"),
        expect_raises("sm_scale 0", lambda: f(q, k, v, lengths, 0.0), ValueError, "sm_scale"),
        expect_raises("num_splits 0", lambda: f(q, k, v, lengths, num_splits=0), ValueError, "num_splits"),
        expect_raises(
            "num_splits 65", lambda: f(q, k, v, lengths, num_splits=MAX_SPLITS + 1), ValueError, "num_splits"
        ),
        expect_raises("max_length -1", lambda: f(q, k, v, lengths, max_length=-1), ValueError, "max_length"),
        expect_raises("num_splits True", lambda: f(q, k, v, lengths, num_splits=True), ValueError, "num_splits"),
        expect_raises("max_length False", lambda: f(q, k, v, lengths, max_length=False), ValueError, "max_length"),
        expect_raises("sm_scale True", lambda: f(q, k, v, lengths, True), ValueError, "sm_scale"),
        expect_raises(
            "config use_dot 1", lambda: f(q, k, v, lengths, config=DecodeConfig(16, 1, 1, 1, 1)), TypeError, "config"
        ),
        expect_raises(
            "config num_splits True",
            lambda: f(q, k, v, lengths, config=DecodeConfig(16, 1, 1, True, True)),
            TypeError,
            "config",
        ),
        expect_raises(
            "config BLOCK_N 8", lambda: f(q, k, v, lengths, config=DecodeConfig(8, 4, 1, True, 1)), ValueError, "config"
        ),
        expect_raises(f"q on {other}", lambda: f(q.to(other), k, v, lengths), ValueError, "q"),
        expect_raises("v elsewhere", lambda: f(q, k, v.to(other), lengths), ValueError, "v_cache"),
        expect_raises("not a tensor", lambda: f(q, [1.0], v, lengths), TypeError, "k_cache"),
        expect_raises("out shape", lambda: f(q, k, v, lengths, out=q[:, :2].clone()), ValueError, "out"),
        expect_raises(
            "paged: int64 table",
            lambda: paged_decode_attention(q, pages, pages, table.long(), lengths),
            TypeError,
            "block_table",
        ),
        expect_raises(
            "paged: table rows",
            lambda: paged_decode_attention(q, pages, pages, table[:1], lengths),
            ValueError,
            "block_table",
        ),
        expect_raises(
            "paged: table strided",
            lambda: paged_decode_attention(q, pages, pages, table.t().contiguous().t(), lengths),
            ValueError,
            "block_table",
        ),
        expect_raises(
            "paged: v_pages shape",
            lambda: paged_decode_attention(q, pages, pages[:, :8], table, lengths),
            ValueError,
            "v_pages",
        ),
        expect_raises(
            "paged: k_pages dtype",
            lambda: paged_decode_attention(q, pages.bfloat16(), pages, table, lengths),
            TypeError,
            "k_pages",
        ),
    ]


def check_forward_only():
    """The decode operators have no backward: with grad mode on, an input that requires grad raises
    (a forced config, which launches past the operator, too); under torch.no_grad() each call gives
    the same bits as on plain tensors."""
    q = rand((2, 8, 64), torch.float16)
    k, v = make_cache(2, 20, 2, 64, torch.float16, "bthd")
    lengths = torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    (k_pages, v_pages), table = to_pages((k, v), lengths, 16)
    config = DecodeConfig(16, 1, 1, True, 2)
    q_grad, k_grad, v_pages_grad = (t.clone().requires_grad_() for t in (q, k, v_pages))
    forward_only = "is forward-only"
    outcomes = [
        expect_raises(
            "q requires grad",
            lambda: decode_attention(q_grad, k, v, lengths),
            RuntimeError,
            "llmk::decode_attention " + forward_only,
        ),
        expect_raises(
            "k_cache requires grad, out=",
            lambda: decode_attention(q, k_grad, v, lengths, out=torch.empty_like(q)),
            RuntimeError,
            "llmk::decode_attention_out " + forward_only,
        ),
        expect_raises(
            "k_cache requires grad, config=",
            lambda: decode_attention(q, k_grad, v, lengths, config=config),
            RuntimeError,
            "llmk::decode_attention " + forward_only,
        ),
        expect_raises(
            "paged: v_pages requires grad",
            lambda: paged_decode_attention(q, k_pages, v_pages_grad, table, lengths),
            RuntimeError,
            "llmk::paged_decode_attention " + forward_only,
        ),
        expect_raises(
            "paged: q requires grad, out=",
            lambda: paged_decode_attention(q_grad, k_pages, v_pages, table, lengths, out=torch.empty_like(q)),
            RuntimeError,
            "llmk::paged_decode_attention_out " + forward_only,
        ),
    ]
    calls = {
        "contiguous": lambda q, k, v_pages: decode_attention(q, k, v, lengths),
        "contiguous, out=": lambda q, k, v_pages: decode_attention(
            q, k, v, lengths, num_splits=2, out=poisoned(q.shape, q.dtype)
        ),
        "contiguous, config=": lambda q, k, v_pages: decode_attention(q, k, v, lengths, config=config),
        "paged": lambda q, k, v_pages: paged_decode_attention(q, k_pages, v_pages, table, lengths),
        "paged, out=": lambda q, k, v_pages: paged_decode_attention(
            q, k_pages, v_pages, table, lengths, num_splits=2, out=poisoned(q.shape, q.dtype)
        ),
    }
    scale = 1.0 / math.sqrt(64)
    for name, call in calls.items():
        with torch.no_grad():
            o = call(q_grad, k_grad, v_pages_grad)
        outcomes.append(
            Outcome(
                f"no_grad, {name}: as on plain tensors", torch.equal(o, call(q, k, v_pages)) and not o.requires_grad
            )
        )
    outcomes.append(
        compare(
            f"no_grad, {name}: O",
            o,
            reference(q, k, v, lengths, scale),
            decode_tol(q, k, v, lengths, scale),
            torch_out=same_dtype_decode(q, k, v, lengths, scale),
        )
    )
    return outcomes


def paged_table_blocks(block_n, num_warps, num_stages):
    """The paged kernel's blocks from one BLOCK_TABLE row, under one program an SM: a split of several
    blocks (halved), a split of one block (fewer stages), a long unsplit sequence (doubled)."""
    return sorted(
        {
            paged_blocks(block_n, num_warps, num_stages, 4, 16 * block_n, True),
            paged_blocks(block_n, num_warps, num_stages, 2, block_n, True),
            paged_blocks(block_n, num_warps, num_stages, 1, PAGED_LONG_TOKENS, True),
        }
    )


def check_block(d, block_n, num_warps, num_stages, dtype, paged=False, num_splits=1, head_parts=True):
    """One launch-table block (BLOCK_N, num_warps, num_stages) forced at head dim d on about three
    blocks of tokens (the last one partial), GQA 4/2 B3, ragged lengths; paged: 16-token pages. A
    head dim its BLOCK_D pads reads NaN past D (layout "nan_cols")."""
    b, h, hkv, t_max = 3, 4, 2, 3 * block_n - 5
    layout = "bthd" if d in (64, 128, 256) else "nan_cols"
    q = make_q(b, h, d, dtype, layout)
    k, v = make_cache(b, t_max, hkv, d, dtype, layout)
    lengths = ragged_lengths(b, t_max)
    config = DecodeConfig(block_n, num_warps, num_stages, True, num_splits, head_parts)
    out, tail = guarded_out((b, h, d), dtype)
    if paged:
        (k_pages, v_pages), table = to_pages((k, v), lengths, 16, layout=layout)
        o = paged_decode_attention(q, k_pages, v_pages, table, lengths, config=config, out=out)
    else:
        o = decode_attention(q, k, v, lengths, config=config, out=out)
    scale = 1.0 / math.sqrt(d)
    return [
        compare(
            "O paged" if paged else "O",
            o,
            reference(q, k, v, lengths, scale),
            decode_tol(q, k, v, lengths, scale),
            torch_out=same_dtype_decode(q, k, v, lengths, scale),
        ),
        tail_intact(tail),
    ]


def split_row(n_programs, n_sms):
    """The index of the SPLIT_TABLE row that applies to n_programs, or len(SPLIT_TABLE): none."""
    return next((i for i, row in enumerate(SPLIT_TABLE) if n_programs < row[0] * n_sms), len(SPLIT_TABLE))


# (B, Hkv, T) landing in each SPLIT_TABLE row on an H100's 132 SMs, and past the last
SPLIT_ROW_SHAPES = [(1, 8, 8192), (12, 8, 8192), (16, 32, 4096), (64, 32, 4096)]


def check_split_row(b, hkv, t, dtype):
    """The SPLIT_TABLE row (B, Hkv, T) lands in on 132 SMs, and its split counts (contiguous and
    paged) run on a small cache (most splits of a short sequence are empty)."""
    row = split_row(b * hkv, H100_SMS)
    outcomes = [Outcome(f"B{b} Hkv{hkv} lands in row {row}", row == SPLIT_ROW_SHAPES.index((b, hkv, t)))]
    q = rand((3, 4, 64), dtype)
    k, v = make_cache(3, 70, 2, 64, dtype, "bthd")
    lengths = ragged_lengths(3, 70)
    (k_pages, v_pages), table = to_pages((k, v), lengths, 16)
    ref = reference(q, k, v, lengths, 1 / 8)
    for paged in (False, True):
        splits = split_count(b * hkv, t, H100_SMS, 64, paged)
        if paged:
            o = paged_decode_attention(q, k_pages, v_pages, table, lengths, num_splits=splits)
        else:
            o = decode_attention(q, k, v, lengths, num_splits=splits)
        outcomes.append(
            compare(
                f"O {'paged' if paged else 'contiguous'}, {splits} splits",
                o,
                ref,
                decode_tol(q, k, v, lengths, 1 / 8),
                torch_out=same_dtype_decode(q, k, v, lengths, 1 / 8),
            )
        )
    return outcomes


def check_tables_forced():
    """Every BLOCK_TABLE row (contiguous), each paged block derived from it, and every SPLIT_TABLE
    row are forced by a case that runs on this device."""
    runnable = [c for c in CASES if not (c.gpu_only and INTERPRET)]
    forced = {
        (c.kwargs["d"], c.kwargs["block_n"], c.kwargs["num_warps"], c.kwargs["num_stages"], c.kwargs["paged"])
        for c in runnable
        if c.fn is check_block
    }
    expected = {(d, *row, False) for d, *row in BLOCK_TABLE}
    expected |= {(d, *blocks, True) for d, *row in BLOCK_TABLE for blocks in paged_table_blocks(*row)}
    missing = sorted(expected - forced)
    rows = {split_row(c.kwargs["b"] * c.kwargs["hkv"], H100_SMS) for c in runnable if c.fn is check_split_row}
    return [
        Outcome(
            "every BLOCK_TABLE row and paged block forced", not missing, note=f"missing {missing}" if missing else ""
        ),
        Outcome("every SPLIT_TABLE row run", rows >= set(range(len(SPLIT_TABLE))), note=str(sorted(rows))),
    ]


# The head-dim sweep's dtype in the interpreter (both dtypes on a GPU): what the sweep checks, the
# reads and stores of a head dim's columns (NaN past D, in parts or one tile), is the same code in
# fp16 and bf16, and each dtype still meets two-part head dims exact and padded (fp16: 160 and 80,
# bf16: 96 and 72) and one-tile ones. The main cases above run every path in both dtypes.
SWEEP_DTYPE = {
    32: torch.float16,
    80: torch.float16,
    160: torch.float16,
    24: torch.float16,
    1: torch.float16,
    96: torch.bfloat16,
    72: torch.bfloat16,
    40: torch.bfloat16,
    8: torch.bfloat16,
}


def _cases():
    cases = []

    def add(name, fn=check, gpu_only=False, **kw):
        cases.append(Case(name, fn, kw, gpu_only))

    for dtype in (torch.float16, torch.bfloat16):
        dt = dtype_name(dtype)
        first = len(cases)
        # interpreter tier: heads and lengths scaled down, every path and head dim
        for splits in (None, 1, 3):
            add(
                f"GQA 8/2 B5 T237 D128 splits {splits} {dt}",
                b=5,
                h=8,
                hkv=2,
                t_max=237,
                d=128,
                dtype=dtype,
                num_splits=splits,
            )
        for use_dot in (True, False):
            for splits in (1, 4):
                add(
                    f"MHA 4/4 B3 T150 D64 {'dot' if use_dot else 'broadcast'} splits {splits} {dt}",
                    b=3,
                    h=4,
                    hkv=4,
                    t_max=150,
                    d=64,
                    dtype=dtype,
                    num_splits=splits,
                    use_dot=use_dot,
                )
        add(f"MQA 8/1 B3 T100 D256 splits 2 {dt}", b=3, h=8, hkv=1, t_max=100, d=256, dtype=dtype, num_splits=2)
        add(f"GQA 32/8 B3 T70 D128 {dt}", b=3, h=32, hkv=8, t_max=70, d=128, dtype=dtype)
        add(f"GQA 32/4 B3 T40 D64 splits 2 {dt}", b=3, h=32, hkv=4, t_max=40, d=64, dtype=dtype, num_splits=2)
        add(f"MQA 32/1 B3 T40 D128 {dt}", b=3, h=32, hkv=1, t_max=40, d=128, dtype=dtype)
        for splits in (1, 3):
            add(
                f"HF (B,Hkv,T,D) view 8/2 B3 T120 D64 splits {splits} {dt}",
                b=3,
                h=8,
                hkv=2,
                t_max=120,
                d=64,
                dtype=dtype,
                num_splits=splits,
                layout="hf",
            )
        add(
            f"padded q and cache views 4/2 B3 T50 D128 {dt}",
            b=3,
            h=4,
            hkv=2,
            t_max=50,
            d=128,
            dtype=dtype,
            layout="padded",
            num_splits=2,
        )
        add(f"16 splits of T40: most empty {dt}", b=3, h=4, hkv=2, t_max=40, d=64, dtype=dtype, num_splits=16)
        add(f"sm_scale 0.3 4/2 B3 T60 D64 {dt}", b=3, h=4, hkv=2, t_max=60, d=64, dtype=dtype, sm_scale=0.3)
        add(
            f"peaked: q x 30, 4/2 B3 T90 D64 splits 3 {dt}",
            b=3,
            h=4,
            hkv=2,
            t_max=90,
            d=64,
            dtype=dtype,
            num_splits=3,
            scale=30.0,
        )
        for page_size, splits in ((16, 1), (16, 3), (7, 2)):
            add(
                f"paged {page_size} vs contiguous 8/2 B4 T100 D128 splits {splits} {dt}",
                check_paged,
                b=4,
                h=8,
                hkv=2,
                t_max=100,
                d=128,
                dtype=dtype,
                page_size=page_size,
                num_splits=splits,
            )
        add(
            f"paged 16 MHA broadcast 4/4 B3 T70 D64 {dt}",
            check_paged,
            b=3,
            h=4,
            hkv=4,
            t_max=70,
            d=64,
            dtype=dtype,
            num_splits=2,
            use_dot=False,
        )
        add(f"paged 16 auto splits 8/2 B3 T64 D256 {dt}", check_paged, b=3, h=8, hkv=2, t_max=64, d=256, dtype=dtype)
        # sliding window and softcap: a window of one token, one inside a block, one across several
        # blocks and splits; softcap with scores past the cap
        for window, softcap, splits in (
            ((0, 0), None, None),
            ((5, 0), None, 3),
            ((37, -1), None, 1),
            ((37, 0), None, 4),
            (None, 5.0, 2),
            ((20, 0), 5.0, None),
        ):
            add(
                f"window {window} softcap {softcap} 8/2 B5 T100 D64 splits {splits} {dt}",
                check_paged,
                b=5,
                h=8,
                hkv=2,
                t_max=100,
                d=64,
                dtype=dtype,
                window=window,
                softcap=softcap,
                num_splits=splits,
                scale=4.0 if softcap else 1.0,
            )
        # the interpreter runs each of the cases above in one dtype, alternating down the list (the GPU
        # both): every layout, split count, page size, window and cap still runs there
        one_dtype_here(cases[first:], dtype)
        # head dims in two parts (96 = 64 + 32, 160 = 128 + 32; 80 and 72 with a padded second
        # part), in one padded tile (40, 24, 8, 1) and 32, a power of two below 64, reading NaN past
        # D: contiguous unsplit and split, paged against contiguous, a window with softcap; MHA's
        # broadcast product
        # (head_parts: in parts where head_dim_parts splits the dim, or one padded tile: both forced
        # past decode_config, which on the interpreter's 2 SMs takes one tile from 5 programs on)
        for d in (32, 80, 96, 72, 160, 40, 24, 8, 1):
            split_dim = head_dim_parts(d)[1] > 0
            other = SWEEP_DTYPE[d] != dtype  # the interpreter runs this head dim in its other dtype
            for splits in (1, 3):
                for parts in (True, False) if split_dim else (None,):
                    # split in the head dim's own way (parts where it has them): in the interpreter the
                    # contiguous kernel of its paged case below, split in two, stands in for it
                    twin = splits > 1 and parts is not False
                    add(
                        f"hd {d} GQA 8/2 B4 T70 splits {splits}{' parts' if parts else ''} NaN past D {dt}",
                        b=4,
                        h=8,
                        hkv=2,
                        t_max=70,
                        d=d,
                        dtype=dtype,
                        num_splits=splits,
                        layout="nan_cols",
                        head_parts=parts,
                        gpu_only=other or twin,
                    )
            parts = True if split_dim else None
            add(
                f"hd {d} paged 7 vs contiguous 4/2 B3 T50 splits 2{' parts' if parts else ''} NaN past D {dt}",
                check_paged,
                b=3,
                h=4,
                hkv=2,
                t_max=50,
                d=d,
                dtype=dtype,
                page_size=7,
                num_splits=2,
                layout="nan_cols",
                head_parts=parts,
                gpu_only=other,
            )
            add(
                f"hd {d} paged window (20, 0) softcap 5 8/2 B5 T60{' parts' if parts else ''} NaN past D {dt}",
                check_paged,
                b=5,
                h=8,
                hkv=2,
                t_max=60,
                d=d,
                dtype=dtype,
                window=(20, 0),
                softcap=5.0,
                scale=4.0,
                layout="nan_cols",
                head_parts=parts,
                gpu_only=other,
            )
        # a group of 32 heads pads to 32 rows, which no 32-wide second part exceeds: one 128-wide tile
        add(
            f"hd 96 MQA 32/1 B2 T40 one tile NaN past D {dt}",
            b=2,
            h=32,
            hkv=1,
            t_max=40,
            d=96,
            dtype=dtype,
            layout="nan_cols",
        )
        for d in (80, 96):
            for parts in (True, False):
                add(
                    f"hd {d} MHA 4/4 B3 T60 broadcast splits 2{' parts' if parts else ''} NaN past D {dt}",
                    b=3,
                    h=4,
                    hkv=4,
                    t_max=60,
                    d=d,
                    dtype=dtype,
                    num_splits=2,
                    use_dot=False,
                    layout="nan_cols",
                    head_parts=parts,
                    gpu_only=SWEEP_DTYPE[d] != dtype,
                )
        # full sizes: real head counts, long caches
        add(f"B1 H32/8 T32768 D128 {dt}", gpu_only=True, b=1, h=32, hkv=8, t_max=32768, d=128, dtype=dtype)
        add(
            f"window (4095, 0) softcap 50 B4 H32/8 T16384 D128 {dt}",
            check_paged,
            gpu_only=True,
            b=4,
            h=32,
            hkv=8,
            t_max=16384,
            d=128,
            dtype=dtype,
            window=(4095, 0),
            softcap=50.0,
            scale=4.0,
        )
        add(
            f"window (1023, 0) B2 H16/8 T8192 D256 splits 8 {dt}",
            check_paged,
            gpu_only=True,
            b=2,
            h=16,
            hkv=8,
            t_max=8192,
            d=256,
            dtype=dtype,
            window=(1023, 0),
            num_splits=8,
        )
        for splits in (None, 1, 16):
            add(
                f"B4 H32/8 T16384 ragged D128 splits {splits} {dt}",
                gpu_only=True,
                b=4,
                h=32,
                hkv=8,
                t_max=16384,
                d=128,
                dtype=dtype,
                num_splits=splits,
            )
        add(f"B16 H32/8 T4096 D128 {dt}", gpu_only=True, b=16, h=32, hkv=8, t_max=4096, d=128, dtype=dtype)
        for use_dot in (True, False):
            add(
                f"B2 H32/32 T8192 D128 MHA {'dot' if use_dot else 'broadcast'} {dt}",
                gpu_only=True,
                b=2,
                h=32,
                hkv=32,
                t_max=8192,
                d=128,
                dtype=dtype,
                use_dot=use_dot,
                num_splits=8,
            )
        add(f"B2 H32/4 T8192 D128 {dt}", gpu_only=True, b=2, h=32, hkv=4, t_max=8192, d=128, dtype=dtype)
        add(f"B3 H32/1 T8192 D128 MQA {dt}", gpu_only=True, b=3, h=32, hkv=1, t_max=8192, d=128, dtype=dtype)
        add(
            f"HF view B3 H32/8 T8192 D128 {dt}",
            gpu_only=True,
            b=3,
            h=32,
            hkv=8,
            t_max=8192,
            d=128,
            dtype=dtype,
            layout="hf",
        )
        for d in (64, 256, 160, 192):
            add(
                f"B3 H16/4 T4096 D{d} {dt}",
                gpu_only=True,
                b=3,
                h=16,
                hkv=4,
                t_max=4096,
                d=d,
                dtype=dtype,
                layout="bthd" if d in (64, 256) else "nan_cols",
            )
        for splits in (None, 1, 8):
            add(
                f"paged 16 vs contiguous B4 H32/8 T8192 D128 splits {splits} {dt}",
                check_paged,
                gpu_only=True,
                b=4,
                h=32,
                hkv=8,
                t_max=8192,
                d=128,
                dtype=dtype,
                num_splits=splits,
            )
        # the paged heuristics' own blocks: halved in a split of several blocks (hd 64: 128 -> 64 tokens;
        # hd 256 stays at 32), and a split of one block (B1 H32/8 T512: 8 splits of 64 tokens)
        for d in (64, 256):
            add(
                f"paged 16 auto splits B2 H16/4 T2000 D{d} {dt}",
                check_paged,
                gpu_only=True,
                b=2,
                h=16,
                hkv=4,
                t_max=2000,
                d=d,
                dtype=dtype,
            )
        add(
            f"paged 16 auto splits B1 H32/8 T512 D128 {dt}",
            check_paged,
            gpu_only=True,
            b=1,
            h=32,
            hkv=8,
            t_max=512,
            d=128,
            dtype=dtype,
        )
        # long, 128 programs: on 129+ SMs unsplit with twice the block and the warps (hd 64: 256 tokens)
        for d in (64, 128, 256):
            add(
                f"paged 16 auto B16 H32/8 T2100 D{d} {dt}",
                check_paged,
                gpu_only=True,
                b=16,
                h=32,
                hkv=8,
                t_max=2100,
                d=d,
                dtype=dtype,
            )
        # full sizes at head dims 80 and 96 (two parts, hd 128's blocks and splits), NaN past D;
        # Phi-3-mini's is MHA 32/32 at hd 96
        for d in (80, 96):
            for splits in (None, 1):
                add(
                    f"B4 H32/8 T16384 ragged D{d} splits {splits} NaN past D {dt}",
                    gpu_only=True,
                    b=4,
                    h=32,
                    hkv=8,
                    t_max=16384,
                    d=d,
                    dtype=dtype,
                    num_splits=splits,
                    layout="nan_cols",
                )
            add(f"B1 H32/8 T32768 D{d} {dt}", gpu_only=True, b=1, h=32, hkv=8, t_max=32768, d=d, dtype=dtype)
            # 512 programs, past PARTS_MAX_WAVES on an H100 or H200: the heuristics' one padded tile
            add(
                f"B16 H32/32 T4096 D{d} one tile NaN past D {dt}",
                gpu_only=True,
                b=16,
                h=32,
                hkv=32,
                t_max=4096,
                d=d,
                dtype=dtype,
                layout="nan_cols",
            )
            for use_dot in (True, False):
                add(
                    f"B2 H32/32 T8192 D{d} MHA {'dot' if use_dot else 'broadcast'} {dt}",
                    gpu_only=True,
                    b=2,
                    h=32,
                    hkv=32,
                    t_max=8192,
                    d=d,
                    dtype=dtype,
                    use_dot=use_dot,
                    num_splits=8,
                )
            for splits in (None, 8):
                add(
                    f"paged 16 vs contiguous B4 H32/8 T8192 D{d} splits {splits} NaN past D {dt}",
                    check_paged,
                    gpu_only=True,
                    b=4,
                    h=32,
                    hkv=8,
                    t_max=8192,
                    d=d,
                    dtype=dtype,
                    num_splits=splits,
                    layout="nan_cols",
                )
            add(
                f"paged 16 auto B16 H32/8 T2100 D{d} {dt}",
                check_paged,
                gpu_only=True,
                b=16,
                h=32,
                hkv=8,
                t_max=2100,
                d=d,
                dtype=dtype,
            )
            add(
                f"paged 16 auto splits B1 H32/8 T512 D{d} {dt}",
                check_paged,
                gpu_only=True,
                b=1,
                h=32,
                hkv=8,
                t_max=512,
                d=d,
                dtype=dtype,
            )
            add(
                f"window (4095, 0) softcap 50 B4 H32/8 T16384 D{d} {dt}",
                check_paged,
                gpu_only=True,
                b=4,
                h=32,
                hkv=8,
                t_max=16384,
                d=d,
                dtype=dtype,
                window=(4095, 0),
                softcap=50.0,
                scale=4.0,
            )
    # e4m3 caches: the contiguous and the paged kernel, split or not, two-part head dims, window and cap
    for dtype in (torch.float16, torch.bfloat16):
        dt = dtype_name(dtype)
        for paged in (False, True):
            kind = "paged " if paged else ""
            # T100, not the 16-bit cases' T237: the interpreter's e4m3 casts (quantize_kv's, 4 a case) cost
            # a program per 32 rows of the cache; 100 is still 7 blocks over 3 splits, the last one ragged.
            # In the interpreter one dtype a layout, as below
            add(
                f"e4m3 {kind}cache GQA 8/2 B5 T100 D128 splits 3 {dt}",
                check_fp8,
                b=5,
                h=8,
                hkv=2,
                t_max=100,
                d=128,
                dtype=dtype,
                paged=paged,
                num_splits=3,
                gpu_only=dtype != (torch.float16 if paged else torch.bfloat16),
            )
            # the products run in fp16 whatever q's dtype: in the interpreter each of these takes one
            # dtype a layout (both on the GPU)
            if not INTERPRET or dtype == (torch.bfloat16 if paged else torch.float16):
                add(
                    f"e4m3 {kind}cache MHA 4/4 B3 T70 D96 {dt}",
                    check_fp8,
                    b=3,
                    h=4,
                    hkv=4,
                    t_max=70,
                    d=96,
                    dtype=dtype,
                    paged=paged,
                )
                add(
                    f"e4m3 {kind}cache window (20, 0) softcap 5 B3 T90 D64 {dt}",
                    check_fp8,
                    b=3,
                    h=8,
                    hkv=2,
                    t_max=90,
                    d=64,
                    dtype=dtype,
                    paged=paged,
                    window=(20, 0),
                    softcap=5.0,
                    scale=2.0,
                )
            if not INTERPRET or dtype == (torch.float16 if paged else torch.bfloat16):
                add(
                    f"e4m3 {kind}cache MHA 4/4 B3 T60 D64 broadcast product splits 2 {dt}",
                    check_fp8,
                    b=3,
                    h=4,
                    hkv=4,
                    t_max=60,
                    d=64,
                    dtype=dtype,
                    paged=paged,
                    num_splits=2,
                    use_dot=False,
                )
            add(
                f"e4m3 {kind}cache B4 H32/8 T16384 D128 {dt}",
                check_fp8,
                gpu_only=True,
                b=4,
                h=32,
                hkv=8,
                t_max=16384,
                d=128,
                dtype=dtype,
                paged=paged,
            )
            add(
                f"e4m3 {kind}cache B1 H32/8 T32768 D128 splits auto {dt}",
                check_fp8,
                gpu_only=True,
                b=1,
                h=32,
                hkv=8,
                t_max=32768,
                d=128,
                dtype=dtype,
                paged=paged,
            )
            add(
                f"e4m3 {kind}cache B16 H32/8 T8192 D128 {dt}",
                check_fp8,
                gpu_only=True,
                b=16,
                h=32,
                hkv=8,
                t_max=8192,
                d=128,
                dtype=dtype,
                paged=paged,
            )
            # a token-major v (its bytes gathered one by one for p v): the kernel takes any strides
            if dtype == torch.float16:  # one dtype in the interpreter: the layout is what differs
                add(
                    f"e4m3 {kind}cache, token-major v, GQA 8/2 B3 T70 D128 splits 2 {dt}",
                    check_fp8,
                    b=3,
                    h=8,
                    hkv=2,
                    t_max=70,
                    d=128,
                    dtype=dtype,
                    paged=paged,
                    num_splits=2,
                    v_token_major=True,
                )
                # tokens 16-47 of v all zero: their scales at quantize_fp8's floor, the p v product's
                # largest V scale of those blocks too (V_SCALE_FLOOR's reason)
                add(
                    f"e4m3 {kind}cache, v zero over tokens 16-47, GQA 8/2 B3 T70 D64 {dt}",
                    check_fp8,
                    b=3,
                    h=8,
                    hkv=2,
                    t_max=70,
                    d=64,
                    dtype=dtype,
                    paged=paged,
                    v_zero=(16, 48),
                )
            add(
                f"e4m3 {kind}cache, token-major v, B16 H32/8 T8192 D128 {dt}",
                check_fp8,
                gpu_only=True,
                b=16,
                h=32,
                hkv=8,
                t_max=8192,
                d=128,
                dtype=dtype,
                paged=paged,
                v_token_major=True,
            )
    cases += [
        Case("e4m3 KVCache and PagedKVCache", check_fp8_caches),
        Case("e4m3 cache: bad input", check_fp8_errors),
        Case("e4m3 launch table", check_e4m3_config, gpu_only=True),
    ]
    cases += [
        Case("head-dim parts", check_head_dim_parts),
        Case("split heuristic", check_split_heuristic),
        Case("no keys", check_no_keys),
        Case("empty input", check_empty),
        Case("bad input", check_errors),
        Case("forward-only operators", check_forward_only),
        Case("2^31+ elements per cache (contiguous, paged)", check_huge, gpu_only=True),
    ]
    # every launch-table row forced on small shapes (the interpreter's own choice is always
    # INTERPRET_BLOCK): fp16 there, both dtypes on the GPU; hd 128's row also at hd 80 and 96, which take it
    padded_rows = [(d, *row[1:]) for d in (80, 96) for row in BLOCK_TABLE if row[0] == 128]
    for dtype in (torch.float16, torch.bfloat16):
        dt = dtype_name(dtype)
        for d, block_n, warps, stages in BLOCK_TABLE + padded_rows:
            add(
                f"BLOCK_TABLE hd{d} {block_n}/{warps}/{stages} {dt}",
                check_block,
                gpu_only=dtype != torch.float16,
                d=d,
                block_n=block_n,
                num_warps=warps,
                num_stages=stages,
                dtype=dtype,
                paged=False,
            )
            if head_dim_parts(d)[1]:  # the same row with one padded tile
                add(
                    f"BLOCK_TABLE hd{d} {block_n}/{warps}/{stages} one tile {dt}",
                    check_block,
                    gpu_only=dtype != torch.float16,
                    d=d,
                    block_n=block_n,
                    num_warps=warps,
                    num_stages=stages,
                    dtype=dtype,
                    paged=False,
                    head_parts=False,
                )
            for bn, w, s in paged_table_blocks(block_n, warps, stages):
                # a split of one block where the stages drop, else two splits of a block and a half
                splits = 2 if s != stages or bn < block_n else 1
                add(
                    f"paged blocks hd{d} {bn}/{w}/{s} splits {splits} {dt}",
                    check_block,
                    gpu_only=dtype != torch.float16,
                    d=d,
                    block_n=bn,
                    num_warps=w,
                    num_stages=s,
                    dtype=dtype,
                    paged=True,
                    num_splits=splits,
                )
        for b, hkv, t in SPLIT_ROW_SHAPES:
            add(
                f"SPLIT_TABLE B{b} Hkv{hkv} T{t} (132 SMs) {dt}",
                check_split_row,
                gpu_only=dtype != torch.float16,
                b=b,
                hkv=hkv,
                t=t,
                dtype=dtype,
            )
    cases.append(Case("every launch-table row forced", check_tables_forced))
    return cases


CASES = _cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("decode_attention", CASES)
