"""An e4m3 KV cache for a patched model's generation: FP8KVCache, a transformers Cache whose layers
keep K and V in e4m3 with an fp32 scale a (kv head, token), as inference/kv_cache.py's caches do
(quantize_kv: each head's D values of a token scaled by their own max).

    cache = FP8KVCache()
    model.generate(ids, past_key_values=cache, ...)    # or model(ids, past_key_values=cache, ...)

A decode step reads 2 * (D + 4) bytes a token and kv head instead of 4 * D (0.52 of bf16's at
hd 128): the patched attention (models/patch_attention.py) passes the e4m3 cache and its scales to
decode_attention, which dequantizes each block in registers. The prefill that fills an empty cache
attends over its own 16-bit keys and values (they are all the keys there are); the cache keeps
their e4m3 copies. Any other call that meets the e4m3 keys (a second prefill chunk, a padded
batch's decode step, a head dim the decode kernel lacks) gets them dequantized into the query's
dtype first, through an fp32 product (4 bytes a value for that call: a padded batch's decode steps
cost more than on a bf16 cache). Only a model patched with the "attention" kernel reads this
cache: transformers' own attention functions take no e4m3 keys. Every layer keeps its whole
history: a model with sliding-window layers (Gemma 2 and 3; Mistral and Qwen with a window) keeps
more than their window there, and once the keys outnumber the window those layers' steps take the
masked, dequantized path. transformers 5.24 and later name the argument `cache=`.

Layer state: keys, values (B, Hkv, T, D) as uint8 (the e4m3 bytes: concatenation and indexing copy
bytes), k_scale, v_scale (B, Hkv, T) fp32. The tensors the layer returns on a decode step are the
e4m3 views; their scales are found through _SCALES, keyed by those views.
"""
import functools

import torch
from torch.utils.weak import WeakIdKeyDictionary

FP8 = torch.float8_e4m3fn
# an e4m3 key or value tensor a layer returned -> its scales (B, Hkv, T) (weak keys: the entry lives
# as long as the tensor; the value does not hold it)
_SCALES = WeakIdKeyDictionary()


def cache_scales(key, value):
    """(k_scale, v_scale) of e4m3 key and value tensors an FP8KVCache layer returned, else None."""
    if key.dtype != FP8 or key not in _SCALES or value not in _SCALES:
        return None
    return _SCALES[key], _SCALES[value]


def dequantized(key, value, dtype):
    """An FP8KVCache layer's e4m3 key and value in `dtype` (a call the decode kernel does not take)."""
    from llmk.inference.kv_cache import dequantize_kv

    k_scale, v_scale = cache_scales(key, value)
    return dequantize_kv(key, k_scale, dtype), dequantize_kv(value, v_scale, dtype)


@functools.cache
def _layer_class():
    """FP8KVLayer, a transformers DynamicLayer (imported when a cache is made, not with this module)."""
    from transformers.cache_utils import DynamicLayer

    from llmk.inference.kv_cache import quantize_kv

    class FP8KVLayer(DynamicLayer):
        """One attention layer's e4m3 K and V and their scales (module docstring)."""

        def lazy_initialization(self, key_states, value_states):
            self.dtype, self.device = key_states.dtype, key_states.device
            self.keys = self.values = self.k_scale = self.v_scale = None
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            """Append (B, Hkv, t, D) 16-bit keys and values; returns the 16-bit ones themselves into an
            empty layer (the prefill), else the whole cache as e4m3 views."""
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            kq, ks = quantize_kv(key_states)
            vq, vs = quantize_kv(value_states)
            empty = self.get_seq_length() == 0
            if empty:
                self.keys, self.values, self.k_scale, self.v_scale = kq, vq, ks, vs
                return key_states, value_states
            self.keys = torch.cat([self.keys, kq], dim=-2)
            self.values = torch.cat([self.values, vq], dim=-2)
            self.k_scale = torch.cat([self.k_scale, ks], dim=-1)
            self.v_scale = torch.cat([self.v_scale, vs], dim=-1)
            keys, values = self.keys.view(FP8), self.values.view(FP8)
            _SCALES[keys], _SCALES[values] = self.k_scale, self.v_scale
            return keys, values

        def get_seq_length(self):
            return 0 if not self.is_initialized or self.keys is None else self.keys.shape[-2]

        def _apply(self, fn):
            """fn on the values and on the scales (the same token axis: the values' -2, the scales' -1)."""
            if self.get_seq_length():
                self.keys, self.values = fn(self.keys, False), fn(self.values, False)
                self.k_scale, self.v_scale = fn(self.k_scale, True), fn(self.v_scale, True)

        def crop(self, tokens_to_remove):
            """Drop the last -tokens_to_remove tokens (a negative count; 0 drops none), or, as
            transformers 5.17's DynamicLayer still reads a positive one, keep that many."""
            length = self.get_seq_length()
            keep = length + tokens_to_remove if tokens_to_remove <= 0 else tokens_to_remove
            if 0 <= keep < length:
                self._apply(lambda t, scale: t[..., :keep] if scale else t[..., :keep, :])

        def batch_repeat_interleave(self, repeats):
            self._apply(lambda t, scale: t.repeat_interleave(repeats, dim=0))

        def batch_select_indices(self, indices):
            self._apply(lambda t, scale: t[indices])

        def reorder_cache(self, beam_idx):
            self._apply(lambda t, scale: t.index_select(0, beam_idx.to(t.device)))

        def reset(self):
            if self.is_initialized:
                self.keys = self.values = self.k_scale = self.v_scale = None

        def offload(self):
            self._apply(lambda t, scale: t.to("cpu", non_blocking=True))

        def prefetch(self):
            if self.get_seq_length() and self.keys.device != self.device:
                self._apply(lambda t, scale: t.to(self.device, non_blocking=True))

    return FP8KVLayer


def FP8KVCache():  # noqa: N802 (a class to its callers)
    """A transformers Cache of e4m3 K and V (module docstring), one FP8KVLayer an attention layer,
    made as the model first writes each."""
    from transformers.cache_utils import Cache

    return Cache(layer_class_to_replicate=_layer_class())


__all__ = ["FP8KVCache", "cache_scales", "dequantized"]
