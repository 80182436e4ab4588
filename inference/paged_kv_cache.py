"""A paged KV cache: sequences take fixed-size pages from one shared pool as they grow, so memory
follows the tokens actually held instead of B * T_max.

Layout: k_pages, v_pages (num_pages, page_size, Hkv, D). Sequence b's token t lives in slot
t % page_size of page block_table[b, t // page_size]. block_table (B, max_pages) int32 and
lengths (B,) int32 live on the device, for the kernel; the host keeps the free-page list, each
sequence's page list and its length, so an append is checked (max_len, free pages) and its pages
taken before anything is written. Unused block table entries are 0 and never read.
dtype=torch.float8_e4m3fn: e4m3 pages with an fp32 scale a (slot, kv head) in k_scale and v_scale
(num_pages, page_size, Hkv), as KVCache keeps them (inference/kv_cache.py); v_pages' storage is
(num_pages, Hkv, D, page_size), slots innermost, as KVCache's e4m3 v keeps its tokens.
"""

import torch

from llmk.common.device import DEVICE
from llmk.common.ints import cdiv
from llmk.inference.kv_cache import (
    as_token_minor,
    check_cache_dtype,
    check_int_at_least,
    check_kv_chunk,
    check_past_max_len,
    scale_buffers,
    sequence_indices,
    value_buffer,
    write_kv,
)
from llmk.inference.triton_inference_attention import paged_decode_attention

# an e4m3 v's pages keep their slots innermost unpadded (kv_cache.token_minor with align 1): a page
# of 16 slots, the default, is one 16-byte run a head dim already, and padding a smaller page would
# multiply its bytes
PAGE_ALIGN = 1


def as_value_pages(pages):
    """A copy of pages (P, page_size, Hkv, D) in the layout PagedKVCache keeps an e4m3 v_pages in
    (slots innermost), for tests and benchmarks that build a pool from whole tensors."""
    return as_token_minor(pages, PAGE_ALIGN)


def to_pages(cache, perm, page_size=16):
    """The inverse of gather_pages, for building test and benchmark inputs: a contiguous cache
    (B, T, Hkv, D), T a multiple of page_size, -> pages (B * T / page_size, page_size, Hkv, D) with
    block j of sequence b at page perm[b, j] (perm (B, T / page_size), a permutation of the pages)."""
    b, t, hkv, d = cache.shape
    pages = torch.empty((b * t // page_size, page_size, hkv, d), dtype=cache.dtype, device=cache.device)
    pages[perm] = cache.view(b, t // page_size, page_size, hkv, d)
    return pages


def gather_pages(pages, block_table):
    """pages (num_pages, page_size, Hkv, D), block_table (B, max_pages) -> the contiguous cache
    (B, max_pages * page_size, Hkv, D): every mapped page in sequence order (a copy)."""
    b, max_pages = block_table.shape
    return pages[block_table.long()].reshape(b, max_pages * pages.shape[1], *pages.shape[2:])


class PagedKVCache:
    """Paged key and value caches for B sequences of at most max_len tokens each.

    k_pages, v_pages: (num_pages, page_size, Hkv, D) of `dtype` (an e4m3 v_pages slot-minor in
    memory, module docstring); num_pages defaults to enough for every sequence at max_len. k_scale,
    v_scale: (num_pages, page_size, Hkv) fp32 for dtype torch.float8_e4m3fn, else None.
    block_table: (B, ceil(max_len / page_size)) int32; lengths: (B,) int32 (device); host_lengths,
    seq_pages, free_pages: the host's view.
    """

    def __init__(
        self, batch, max_len, n_kv_heads, head_dim, dtype=torch.float16, device=DEVICE, num_pages=None, page_size=16
    ):
        check_int_at_least("batch", batch, 0)
        check_int_at_least("max_len", max_len, 0)
        check_int_at_least("n_kv_heads", n_kv_heads)
        check_int_at_least("head_dim", head_dim)
        check_int_at_least("page_size", page_size)
        check_cache_dtype(dtype)
        self.max_pages = cdiv(max_len, page_size)
        if num_pages is None:
            num_pages = batch * self.max_pages
        check_int_at_least("num_pages", num_pages, 0)
        self.batch, self.max_len, self.n_kv_heads, self.head_dim = batch, max_len, n_kv_heads, head_dim
        self.page_size, self.num_pages = page_size, num_pages
        self.k_pages = torch.empty((num_pages, page_size, n_kv_heads, head_dim), dtype=dtype, device=device)
        self.v_pages = value_buffer(self.k_pages.shape, dtype, device, PAGE_ALIGN)
        self.k_scale, self.v_scale = scale_buffers(self.k_pages.shape, dtype, device)
        self.block_table = torch.zeros((batch, self.max_pages), dtype=torch.int32, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.host_lengths = [0] * batch
        self.seq_pages = [[] for _ in range(batch)]
        self.free_pages = list(range(num_pages - 1, -1, -1))  # a stack: pop() hands out page 0 first

    @property
    def max_length(self):
        """The longest sequence now (host side, no sync)."""
        return max(self.host_lengths, default=0)

    def append(self, k, v):
        """Write k, v (B, t, Hkv, D) at each sequence's current length, taking pages from the pool as
        needed, and advance every length by t. Raises ValueError, and changes nothing, if a sequence
        would pass max_len or the pool has too few free pages."""
        t = check_kv_chunk(k, v, self.k_pages, self.batch, self.n_kv_heads, self.head_dim)
        check_past_max_len(self.host_lengths, t, self.max_len)
        if t == 0 or self.batch == 0:
            return
        new_pages = [cdiv(n + t, self.page_size) - len(pages) for n, pages in zip(self.host_lengths, self.seq_pages)]
        if sum(new_pages) > len(self.free_pages):
            raise ValueError(
                f"append of {t} token(s) needs {sum(new_pages)} new page(s) but only "
                f"{len(self.free_pages)} of {self.num_pages} are free; the cache is unchanged"
            )
        if sum(new_pages):  # take the pages, then write only the new block table entries
            rows, cols, taken = [], [], []
            for b, (pages, n) in enumerate(zip(self.seq_pages, new_pages)):
                for _ in range(n):
                    rows.append(b)
                    cols.append(len(pages))
                    pages.append(self.free_pages.pop())
                    taken.append(pages[-1])
            where = torch.tensor([rows, cols], device=self.block_table.device)
            self.block_table[where[0], where[1]] = torch.tensor(taken, dtype=torch.int32, device=where.device)
        # token positions (B, t) -> (page, slot) on the device: one scatter for the whole batch
        positions = self.lengths[:, None].long() + torch.arange(t, device=self.lengths.device)
        page = self.block_table.gather(1, positions // self.page_size).long()
        slot = positions % self.page_size
        write_kv(self.k_pages, self.k_scale, (page, slot), k)
        write_kv(self.v_pages, self.v_scale, (page, slot), v)
        self.lengths += t
        self.host_lengths = [n + t for n in self.host_lengths]

    def reset(self, seqs=None):
        """Return the pages of `seqs` (None: every sequence; an int or a list of indices) to the
        pool and set their lengths to 0."""
        seqs = sequence_indices(seqs, self.batch)
        for s in seqs:
            self.free_pages.extend(reversed(self.seq_pages[s]))
            self.seq_pages[s] = []
            self.host_lengths[s] = 0
        if seqs:
            rows = torch.tensor(seqs, device=self.lengths.device)
            self.lengths[rows] = 0
            self.block_table[rows] = 0

    def attend(self, q, sm_scale=None, **kwargs):
        """paged_decode_attention of q (B, H, D) against this cache; kwargs as its own."""
        kwargs.setdefault("max_length", self.max_length)
        return paged_decode_attention(
            q,
            self.k_pages,
            self.v_pages,
            self.block_table,
            self.lengths,
            sm_scale,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            **kwargs,
        )
