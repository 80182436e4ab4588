"""A contiguous KV cache (one attention layer's) for batched decoding: every sequence owns T_max
slots, allocated up front and never resized, and its own length.

Layout: k, v (B, T_max, Hkv, D), the layout decode_attention reads. lengths (B,) int32 lives on
the device, for the kernel (no host sync at attention time); a host mirror of the same lengths
decides before anything is written whether an append fits, and gives the split heuristic the
longest length without a sync.

append(k, v) writes t tokens per sequence (t = 1 for a decode step, more for a prefill chunk),
each sequence at its own current length, with one indexed copy per tensor for the whole batch.
"""
import torch

from llmk.common.device import DEVICE
from llmk.common.validation import check_same_device, check_tensor
from llmk.inference.triton_inference_attention import decode_attention


def check_int_at_least(name, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_kv_chunk(k, v, like, batch, n_kv_heads, head_dim):
    """k, v: (B, t, Hkv, D) of the cache's dtype and device (`like` is a cache tensor); returns t."""
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, (like.dtype,))
        check_same_device(name, t, "the cache", like)
        if t.dim() != 4 or t.shape[0] != batch or tuple(t.shape[2:]) != (n_kv_heads, head_dim):
            raise ValueError(f"{name} must be (B={batch}, t, Hkv={n_kv_heads}, D={head_dim}), got shape "
                             f"{tuple(t.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    return k.shape[1]


def check_past_max_len(host_lengths, t, max_len):
    """Raise before anything is written when t more tokens do not fit in some sequence."""
    for b, n in enumerate(host_lengths):
        if n + t > max_len:
            raise ValueError(f"append of {t} token(s) would take sequence {b} from {n} to {n + t} tokens, "
                             f"past max_len {max_len}; the cache is unchanged")


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

    k, v: (B, T_max, Hkv, D) tensors of `dtype` (slots past a sequence's length hold garbage).
    lengths: (B,) int32 on the device; host_lengths: the same as a Python list.
    """

    def __init__(self, batch, max_len, n_kv_heads, head_dim, dtype=torch.float16, device=DEVICE):
        check_int_at_least("batch", batch, 0)
        check_int_at_least("max_len", max_len, 0)
        check_int_at_least("n_kv_heads", n_kv_heads)
        check_int_at_least("head_dim", head_dim)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.batch, self.max_len, self.n_kv_heads, self.head_dim = batch, max_len, n_kv_heads, head_dim
        self.k = torch.empty((batch, max_len, n_kv_heads, head_dim), dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
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
        self.k[rows, positions] = k
        self.v[rows, positions] = v
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
        return decode_attention(q, self.k, self.v, self.lengths, sm_scale, **kwargs)
