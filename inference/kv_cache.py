"""A contiguous KV cache (one attention layer's) for batched decoding: every sequence owns T_max
slots, allocated up front and never resized, and its own length.

Layout: k, v (B, T_max, Hkv, D), the layout decode_attention reads. lengths (B,) int32 lives on
the device, for the kernel (no host sync at attention time); a host mirror of the same lengths
decides before anything is written whether an append fits, and gives the split heuristic the
longest length without a sync.

append(k, v) writes t tokens per sequence (t = 1 for a decode step, more for a prefill chunk),
each sequence at its own current length, with one indexed copy per tensor for the whole batch.

dtype=torch.float8_e4m3fn keeps K and V in e4m3, one byte a value, with an fp32 scale a (token, kv
head) in k_scale and v_scale (B, T_max, Hkv): append quantizes each head's D values of a token by
their own max (quantize_fp8's row-wise formula, gemm/triton_fp8_quant.py), and decode attention
reads the bytes with the scales applied to the scores and the weights. The bytes a decode step
reads drop to (D + 4) / 2D of a 16-bit cache's (0.52 at hd 128); the values keep e4m3's 3-bit
significand, a relative error of at most 2^-4 a value. An e4m3 v keeps its tokens innermost in
memory (value_buffer): (B, Hkv, D, T_max rounded up to 16) storage seen as (B, T_max, Hkv, D),
so the decode kernel's p V product reads each byte pair it multiplies from one place (a token-major
v's bytes are gathered one by one: docs/tuning/inference.md).
"""

import torch

from llmk.common.device import DEVICE
from llmk.common.validation import check_same_device, check_tensor
from llmk.gemm.fp8_ops import quantize_fp8
from llmk.inference.triton_inference_attention import FP8, decode_attention

CHUNK_DTYPES = (torch.float16, torch.bfloat16)  # what an e4m3 cache's append takes
CACHE_DTYPES = CHUNK_DTYPES + (FP8,)


def check_int_at_least(name, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_cache_dtype(dtype):
    """A cache holds what the decode kernels read: fp16, bf16, or e4m3 with scales."""
    if dtype not in CACHE_DTYPES:
        raise TypeError(f"dtype must be one of {CACHE_DTYPES}, got {dtype!r}")


def check_kv_chunk(k, v, like, batch, n_kv_heads, head_dim):
    """k, v: (B, t, Hkv, D) of the cache's dtype (fp16 or bf16 for an e4m3 cache) and device (`like`
    is a cache tensor); returns t."""
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, CHUNK_DTYPES if like.dtype == FP8 else (like.dtype,))
        check_same_device(name, t, "the cache", like)
        if t.dim() != 4 or t.shape[0] != batch or tuple(t.shape[2:]) != (n_kv_heads, head_dim):
            raise ValueError(
                f"{name} must be (B={batch}, t, Hkv={n_kv_heads}, D={head_dim}), got shape {tuple(t.shape)}"
            )
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if v.dtype != k.dtype:
        raise TypeError(f"v must have k's dtype {k.dtype}, got {v.dtype}")
    return k.shape[1]


def quantize_kv(t):
    """t (B, t, Hkv, D) 16-bit -> (e4m3 values (B, t, Hkv, D) as uint8, the byte copies of indexing
    take; fp32 scales (B, t, Hkv)): a scale a (token, kv head), over its D values."""
    q, scale = quantize_fp8(t.reshape(-1, t.shape[-1]))
    return q.view(torch.uint8).view(t.shape), scale.view(t.shape[:-1])


def dequantize_kv(values, scale, dtype):
    """e4m3 values (..., D) times their scales (...,) in fp32, rounded to dtype: the 16-bit cache an
    e4m3 one stands for (the naive provider's in benchmarks; the decode kernels themselves keep the
    products exact, inference/triton_inference_attention.py)."""
    return (values.float() * scale[..., None]).to(dtype)


# an e4m3 v's token dim is padded to a multiple of this: each head dim's row of tokens then starts
# 16-byte aligned, which the decode kernel's vector loads of whole token runs need
TOKEN_ALIGN = 16


def token_minor(shape, dtype, device, align=TOKEN_ALIGN):
    """An empty tensor of `shape` (B or pages, T or page size, Hkv, D) stored with its tokens
    innermost: (B, Hkv, D, T rounded up to `align`), seen as `shape` (stride 1 along T)."""
    n, t, hkv, d = shape
    padded = -(-t // align) * align
    return torch.empty((n, hkv, d, padded), dtype=dtype, device=device)[..., :t].permute(0, 3, 1, 2)


def as_token_minor(t, align=TOKEN_ALIGN):
    """A copy of t (B or pages, T, Hkv, D) in token_minor's layout: an e4m3 v as the caches store it,
    for tests and benchmarks that build one from whole tensors."""
    out = token_minor(t.shape, t.dtype, t.device, align)
    out.copy_(t)
    return out


def value_buffer(shape, dtype, device, align=TOKEN_ALIGN):
    """A cache's empty v of `shape`: token-minor for e4m3 (module docstring), else plain."""
    return token_minor(shape, dtype, device, align) if dtype == FP8 else torch.empty(shape, dtype=dtype, device=device)


def scale_buffers(shape, dtype, device):
    """(k_scale, v_scale) of an e4m3 cache whose values have `shape` (..., D): fp32 (...,), ones
    (slots past a length are never read); None and None for a 16-bit cache."""
    if dtype != FP8:
        return None, None
    return (
        torch.ones(shape[:-1], dtype=torch.float32, device=device),
        torch.ones(shape[:-1], dtype=torch.float32, device=device),
    )


def write_kv(values, scales, index, t):
    """Write chunk t (B, t, Hkv, D) at values[index] (values: a cache's k or v, index the advanced
    index of its (B, t) token slots), quantized into an e4m3 cache with its scales."""
    if scales is None:
        values[index] = t
        return
    q, scale = quantize_kv(t)
    values.view(torch.uint8)[index] = q
    scales[index] = scale


def check_past_max_len(host_lengths, t, max_len):
    """Raise before anything is written when t more tokens do not fit in some sequence."""
    for b, n in enumerate(host_lengths):
        if n + t > max_len:
            raise ValueError(
                f"append of {t} token(s) would take sequence {b} from {n} to {n + t} tokens, "
                f"past max_len {max_len}; the cache is unchanged"
            )


def sequence_indices(seqs, batch):
    """None -> every sequence; an int or an iterable of ints -> that list, each checked."""
    if seqs is None:
        return list(range(batch))
    seqs = [seqs] if isinstance(seqs, int) else list(seqs)
    for s in seqs:
        if not isinstance(s, int) or not 0 <= s < batch:
            raise ValueError(f"seqs must hold sequence indices in 0..{batch - 1}, got {s!r}")
    return seqs


class KVCache:
    """Pre-allocated (B, T_max, Hkv, D) key and value caches with a length per sequence.

    k, v: (B, T_max, Hkv, D) tensors of `dtype` (slots past a sequence's length hold garbage); an
    e4m3 v a view of token-minor storage (module docstring).
    k_scale, v_scale: (B, T_max, Hkv) fp32 for dtype torch.float8_e4m3fn (module docstring), else
    None. lengths: (B,) int32 on the device; host_lengths: the same as a Python list.
    """

    def __init__(self, batch, max_len, n_kv_heads, head_dim, dtype=torch.float16, device=DEVICE):
        check_int_at_least("batch", batch, 0)
        check_int_at_least("max_len", max_len, 0)
        check_int_at_least("n_kv_heads", n_kv_heads)
        check_int_at_least("head_dim", head_dim)
        check_cache_dtype(dtype)
        self.batch, self.max_len, self.n_kv_heads, self.head_dim = batch, max_len, n_kv_heads, head_dim
        self.k = torch.empty((batch, max_len, n_kv_heads, head_dim), dtype=dtype, device=device)
        self.v = value_buffer(self.k.shape, dtype, device)
        self.k_scale, self.v_scale = scale_buffers(self.k.shape, dtype, device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.host_lengths = [0] * batch

    @property
    def max_length(self):
        """The longest sequence now (host side, no sync)."""
        return max(self.host_lengths, default=0)

    def append(self, k, v):
        """Write k, v (B, t, Hkv, D) at each sequence's current length and advance every length by t.
        Raises ValueError, and changes nothing, if a sequence would pass max_len."""
        t = check_kv_chunk(k, v, self.k, self.batch, self.n_kv_heads, self.head_dim)
        check_past_max_len(self.host_lengths, t, self.max_len)
        if t == 0 or self.batch == 0:
            return
        # positions (B, t) from the device lengths: one scatter for the whole batch, no sync
        positions = self.lengths[:, None].long() + torch.arange(t, device=self.k.device)
        rows = torch.arange(self.batch, device=self.k.device)[:, None].expand(-1, t)
        write_kv(self.k, self.k_scale, (rows, positions), k)
        write_kv(self.v, self.v_scale, (rows, positions), v)
        self.lengths += t
        self.host_lengths = [n + t for n in self.host_lengths]

    def reset(self, seqs=None):
        """Set the length of `seqs` (None: every sequence; an int or a list of indices) to 0."""
        seqs = sequence_indices(seqs, self.batch)
        if seqs:
            self.lengths[torch.tensor(seqs, device=self.lengths.device)] = 0
        for s in seqs:
            self.host_lengths[s] = 0

    def attend(self, q, sm_scale=None, **kwargs):
        """decode_attention of q (B, H, D) against this cache; kwargs as decode_attention's."""
        kwargs.setdefault("max_length", self.max_length)
        return decode_attention(
            q, self.k, self.v, self.lengths, sm_scale, k_scale=self.k_scale, v_scale=self.v_scale, **kwargs
        )
