"""Tests for inference/kv_cache.py and inference/paged_kv_cache.py: what an append writes and where,
ragged lengths after a reset, the max_len and free-page limits (a refused append changes nothing),
page accounting, bad input, and attention through each cache against the fp64 reference.

    python inference/test_kv_cache.py        (or: pytest inference/test_kv_cache.py)

Every run replays one script of appends and resets on a Python model (a list of tokens per
sequence) and checks each cache against it after every step.
"""

import torch

from llmk.common.device import DEVICE
from llmk.devtools.testing import Case, Outcome, compare, dtype_name, expect_raises, main, rand
from llmk.inference.decode_cases import decode_tol
from llmk.inference.kv_cache import KVCache
from llmk.inference.paged_kv_cache import PagedKVCache, gather_pages
from llmk.inference.reference_decode_attention import decode_attention_reference

B, MAX_LEN, HKV, D = 3, 40, 2, 64
# appends of t tokens (a prefill chunk, decode steps) and resets of some sequences
SCRIPT = [
    ("append", 5),
    ("append", 1),
    ("append", 1),
    ("reset", [1]),
    ("append", 7),
    ("append", 1),
    ("reset", 0),
    ("append", 16),
    ("append", 1),
]


def same_bits(a, b):
    """Equal as stored bits (a cache's unwritten slots may hold NaN, which == would call unequal)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


class Model:
    """What the cache must hold: per sequence, the list of its (k, v) tokens, each (Hkv, D)."""

    def __init__(self, batch):
        self.k = [[] for _ in range(batch)]
        self.v = [[] for _ in range(batch)]

    def append(self, k, v):
        for b in range(len(self.k)):
            self.k[b] += list(k[b])
            self.v[b] += list(v[b])

    def reset(self, seqs):
        for s in [seqs] if isinstance(seqs, int) else seqs:
            self.k[s], self.v[s] = [], []

    def lengths(self):
        return [len(tokens) for tokens in self.k]


def contents_match(name, model, k_cache, v_cache, lengths, host_lengths):
    """k_cache, v_cache (B, >= max length, Hkv, D): the first lengths[b] tokens match the model."""
    ok = lengths.tolist() == model.lengths() == host_lengths
    for b, n in enumerate(model.lengths()):
        if n:
            ok &= same_bits(k_cache[b, :n], torch.stack(model.k[b]))
            ok &= same_bits(v_cache[b, :n], torch.stack(model.v[b]))
    return Outcome(name, bool(ok), note="" if ok else f"lengths {lengths.tolist()} model {model.lengths()}")


def page_accounting(cache):
    """Each sequence holds ceil(length / page_size) pages, no page is held twice or also free, the
    block table lists each sequence's pages in order."""
    held = [p for pages in cache.seq_pages for p in pages]
    ok = all(len(pages) == -(-n // cache.page_size) for pages, n in zip(cache.seq_pages, cache.host_lengths))
    ok &= len(set(held)) == len(held) and not set(held) & set(cache.free_pages)
    ok &= len(held) + len(cache.free_pages) == cache.num_pages
    table = cache.block_table.tolist()
    ok &= all(row[: len(pages)] == pages for row, pages in zip(table, cache.seq_pages))
    return Outcome("page accounting", bool(ok), note="" if ok else f"pages {cache.seq_pages} free {cache.free_pages}")


def run_script(make_cache, view, seed=None, d=D, dtype=torch.float16):
    """Replay SCRIPT on the cache from make_cache() (head dim d, dtype) and on the model; view(cache)
    -> (k, v) as (B, T, Hkv, D). seed: draw the tokens from it (the same tokens for two caches).
    Returns (outcomes, cache, model)."""
    if seed is not None:
        torch.manual_seed(seed)
    cache, model = make_cache(), Model(B)
    outcomes = []
    for step, (op, arg) in enumerate(SCRIPT):
        if op == "append":
            k, v = rand((B, arg, HKV, d), dtype), rand((B, arg, HKV, d), dtype)
            cache.append(k, v)
            model.append(k, v)
        else:
            cache.reset(arg)
            model.reset(arg)
        k_view, v_view = view(cache)
        outcome = contents_match(f"step {step}: {op} {arg}", model, k_view, v_view, cache.lengths, cache.host_lengths)
        if not outcome.passed:
            return [outcome], cache, model
        outcomes.append(outcome)
        if isinstance(cache, PagedKVCache):
            outcomes.append(page_accounting(cache))
    return [Outcome(f"{len(SCRIPT)} steps match the model", all(o.passed for o in outcomes))], cache, model


def contiguous_view(cache):
    return cache.k, cache.v


def paged_view(cache):
    return gather_pages(cache.k_pages, cache.block_table), gather_pages(cache.v_pages, cache.block_table)


def check_contiguous():
    outcomes, _, _ = run_script(lambda: KVCache(B, MAX_LEN, HKV, D, torch.float16), contiguous_view)
    return outcomes


def check_paged():
    outcomes, _, _ = run_script(
        lambda: PagedKVCache(B, MAX_LEN, HKV, D, torch.float16, num_pages=12, page_size=8), paged_view
    )
    return outcomes


def check_attend(d=D, dtype=torch.float16):
    """attend() of both caches (head dim d) after the script: the fp64 reference, and paged ==
    contiguous bit for bit (same kernel, same blocks, forced split count)."""
    seed = int(torch.randint(2**31, ()).item())
    _, contiguous, _ = run_script(lambda: KVCache(B, MAX_LEN, HKV, d, dtype), contiguous_view, seed, d, dtype)
    _, paged, _ = run_script(lambda: PagedKVCache(B, MAX_LEN, HKV, d, dtype, page_size=16), paged_view, seed, d, dtype)
    q = rand((B, 4, d), dtype)
    ref = decode_attention_reference(q.double(), contiguous.k.double(), contiguous.v.double(), contiguous.lengths)
    tol = decode_tol(q, contiguous.k, contiguous.v, contiguous.lengths, d**-0.5)
    outcomes = []
    for splits in (1, 3):
        o = contiguous.attend(q, num_splits=splits)
        o_paged = paged.attend(q, num_splits=splits)
        outcomes.append(compare(f"contiguous, splits {splits}", o, ref, tol))
        outcomes.append(Outcome(f"paged == contiguous, splits {splits}", torch.equal(o, o_paged)))
    return outcomes


def check_past_max_len():
    """An append past max_len raises ValueError and leaves data, lengths and pages as they were."""
    outcomes = []
    for name, cache in (
        ("contiguous", KVCache(B, 10, HKV, D, torch.float16)),
        ("paged", PagedKVCache(B, 10, HKV, D, torch.float16, page_size=4)),
    ):
        cache.append(rand((B, 6, HKV, D), torch.float16), rand((B, 6, HKV, D), torch.float16))
        cache.reset(2)  # ragged: only sequences 0 and 1 overflow
        tensors = (cache.k, cache.v) if name == "contiguous" else (cache.k_pages, cache.v_pages, cache.block_table)
        before = [t.clone() for t in tensors] + [cache.lengths.clone()]
        host_before = list(cache.host_lengths)
        pages_before = [list(p) for p in cache.seq_pages] if name == "paged" else None
        big = rand((B, 5, HKV, D), torch.float16)
        outcomes.append(expect_raises(f"{name}: 6 + 5 > 10", lambda: cache.append(big, big), ValueError, "max_len"))
        unchanged = all(
            same_bits(a, b) if a.is_floating_point() else torch.equal(a, b)
            for a, b in zip(before, list(tensors) + [cache.lengths])
        )
        unchanged &= cache.host_lengths == host_before
        if name == "paged":
            unchanged &= [list(p) for p in cache.seq_pages] == pages_before
        outcomes.append(Outcome(f"{name}: unchanged after the refused append", bool(unchanged)))
    return outcomes


def check_out_of_pages():
    """More pages needed than are free: ValueError, nothing taken or written; a reset frees them."""
    cache = PagedKVCache(B, 40, HKV, D, torch.float16, num_pages=5, page_size=4)
    chunk = rand((B, 6, HKV, D), torch.float16)  # 2 pages each: 6 of 5
    outcomes = [expect_raises("6 pages of 5", lambda: cache.append(chunk, chunk), ValueError, "free")]
    untouched = cache.free_pages == [4, 3, 2, 1, 0] and cache.host_lengths == cache.lengths.tolist() == [0] * B
    outcomes.append(Outcome("nothing taken", bool(untouched)))
    small = rand((B, 4, HKV, D), torch.float16)  # 1 page each
    cache.append(small, small)
    cache.reset([0, 2])
    outcomes.append(Outcome("reset returns pages", len(cache.free_pages) == 4 and cache.host_lengths == [0, 4, 0]))
    outcomes.append(page_accounting(cache))
    return outcomes


def check_empty():
    outcomes = []
    for name, cache in (
        ("contiguous", KVCache(0, 8, HKV, D, torch.float16)),
        ("paged", PagedKVCache(0, 8, HKV, D, torch.float16)),
    ):
        empty = rand((0, 3, HKV, D), torch.float16)
        cache.append(empty, empty)
        outcomes.append(Outcome(f"{name}: batch 0 append", cache.lengths.numel() == 0 and cache.max_length == 0))
    cache = KVCache(2, 8, HKV, D, torch.float16)
    none = rand((2, 0, HKV, D), torch.float16)
    cache.append(none, none)
    outcomes.append(Outcome("t = 0 append", cache.host_lengths == [0, 0] and cache.lengths.tolist() == [0, 0]))
    return outcomes


def check_errors():
    cache = KVCache(2, 8, HKV, D, torch.float16)
    paged = PagedKVCache(2, 8, HKV, D, torch.float16)
    k = rand((2, 1, HKV, D), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    outcomes = []
    for name, c in (("contiguous", cache), ("paged", paged)):
        outcomes += [
            expect_raises(f"{name}: bf16 k", lambda c=c: c.append(k.bfloat16(), k), TypeError, "k"),
            expect_raises(f"{name}: bf16 v", lambda c=c: c.append(k, k.bfloat16()), TypeError, "v"),
            expect_raises(f"{name}: 3-D k", lambda c=c: c.append(k[0], k[0]), ValueError, "k"),
            expect_raises(f"{name}: batch 1", lambda c=c: c.append(k[:1], k[:1]), ValueError, "k"),
            expect_raises(f"{name}: head dim 32", lambda c=c: c.append(k[..., :32], k[..., :32]), ValueError, "k"),
            expect_raises(f"{name}: v length", lambda c=c: c.append(k, k.repeat(1, 2, 1, 1)), ValueError, "v"),
            expect_raises(f"{name}: k on {other}", lambda c=c: c.append(k.to(other), k), ValueError, "k"),
            expect_raises(f"{name}: not a tensor", lambda c=c: c.append([1.0], k), TypeError, "k"),
            expect_raises(f"{name}: reset 2 of 2", lambda c=c: c.reset(2), ValueError, "seqs"),
        ]
    outcomes += [
        expect_raises("max_len -1", lambda: KVCache(2, -1, HKV, D), ValueError, "max_len"),
        expect_raises("n_kv_heads 0", lambda: KVCache(2, 8, 0, D), ValueError, "n_kv_heads"),
        expect_raises("int dtype", lambda: KVCache(2, 8, HKV, D, torch.int32), TypeError, "dtype"),
        expect_raises("page_size 0", lambda: PagedKVCache(2, 8, HKV, D, page_size=0), ValueError, "page_size"),
        expect_raises("num_pages -1", lambda: PagedKVCache(2, 8, HKV, D, num_pages=-1), ValueError, "num_pages"),
    ]
    return outcomes


CASES = [
    Case("contiguous: appends and resets", check_contiguous),
    Case("paged: appends and resets", check_paged),
    Case("attend through both caches", check_attend),
    Case("append past max_len", check_past_max_len),
    Case("paged: out of pages", check_out_of_pages),
    Case("empty", check_empty),
    Case("bad input", check_errors),
]
# head dims the kernels pad to BLOCK_D (80 and 96: Phi-2's and Phi-3-mini's; 72; 24, below 32) and 32,
# in both dtypes
CASES += [
    Case(f"attend through both caches hd {d} {dtype_name(dtype)}", check_attend, dict(d=d, dtype=dtype))
    for d in (32, 80, 96, 72, 24)
    for dtype in (torch.float16, torch.bfloat16)
]


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("kv_cache", CASES)
