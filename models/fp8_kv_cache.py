"""An e4m3 KV cache for a patched model's generation: FP8KVCache, a transformers Cache whose layers
keep K and V in e4m3 with an fp32 scale a (kv head, token), as inference/kv_cache.py's caches do
(quantize_kv: each head's D values of a token scaled by their own max).

    cache = FP8KVCache(model.config)
    model.generate(ids, past_key_values=cache, ...)    # or model(ids, past_key_values=cache, ...)

A decode step reads 2 * (D + 4) bytes a token and kv head instead of 4 * D (0.52 of bf16's at
hd 128): the patched attention (models/patch_attention.py) passes the e4m3 cache and its scales to
decode_attention, which dequantizes each block in registers. The prefill that fills an empty cache
attends over its own 16-bit keys and values (they are all the keys there are); the cache keeps
their e4m3 copies. Any other call that meets the e4m3 keys (a second prefill chunk, a padded
batch's decode step, a head dim the decode kernel lacks) gets them dequantized into the query's
dtype first, through an fp32 product (4 bytes a value for that call: a padded batch's decode steps
cost more than on a bf16 cache). Only a model patched with the "attention" kernel reads this
cache: transformers' own attention functions take no e4m3 keys. With the model's config, a
sliding-window layer (Gemma 2 and 3; Mistral and Qwen with a window) keeps its window's last
sliding_window - 1 tokens alone (FP8KVSlidingLayer, transformers' DynamicSlidingWindowLayer's
rules); without it every layer keeps its whole history, and the decode kernel takes a sliding
layer's steps with its window option. transformers 5.24 and later name the argument `cache=`.

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


@functools.cache
def _sliding_layer_class():
    """FP8KVSlidingLayer: FP8KVLayer with transformers' DynamicSlidingWindowLayer's bookkeeping."""

    class FP8KVSlidingLayer(_layer_class()):
        """A sliding-window layer's e4m3 K and V: it keeps the last sliding_window - 1 tokens (all of
        them while past states are recorded for a crop), as transformers' DynamicSlidingWindowLayer
        keeps its 16-bit ones, and returns those plus the step's own."""

        is_sliding = True

        def __init__(self, sliding_window):
            super().__init__()
            self.sliding_window = int(sliding_window)
            self.cumulative_length = 0
            self.record_past = False

        def activate_past_recording(self):
            self.record_past = True

        def update(self, key_states, value_states, *args, **kwargs):
            """Append (B, Hkv, t, D) 16-bit keys and values; returns the 16-bit ones into an empty layer
            (the prefill), else the visible keys, at most sliding_window - 1 + t, as e4m3 views."""
            empty = self.get_seq_length() == 0
            keys, values = super().update(key_states, value_states)  # appends the e4m3 rows and scales
            self.cumulative_length += key_states.shape[-2]
            visible = self.sliding_window - 1 + key_states.shape[-2]
            if not empty and self.keys.shape[-2] > visible:  # several forwards while recording
                keys, values = keys[:, :, -visible:], values[:, :, -visible:]
                _SCALES[keys], _SCALES[values] = self.k_scale[..., -visible:], self.v_scale[..., -visible:]
            if not self.record_past:
                self._keep_window()
            return keys, values

        def _keep_window(self):
            """The last sliding_window - 1 tokens (a start index, not -keep: keep may be 0)."""
            start = 0 if self.keys is None else self.keys.shape[-2] - (self.sliding_window - 1)
            if start > 0:
                self._apply(lambda t, scale: t[..., start:] if scale else t[..., start:, :])

        def get_seq_length(self):
            return self.cumulative_length if self.is_initialized else 0

        def get_max_length(self):
            return self.sliding_window

        def get_mask_sizes(self, query_length, *args, **kwargs):
            """(kv_length, kv_offset) of the mask, as transformers' sliding layer counts them."""
            kv_offset = max(self.cumulative_length - self.sliding_window + 1, 0)
            if self.cumulative_length >= self.sliding_window:
                return self.sliding_window - 1 + query_length, kv_offset
            return self.cumulative_length + query_length, kv_offset

        def crop(self, tokens_to_remove):
            """transformers' rules: before the window is full, as a full layer; after it, only with
            past states recorded, dropping -tokens_to_remove tokens (0: none) and keeping the window."""
            if self.cumulative_length < self.sliding_window:
                super().crop(tokens_to_remove)
                self.cumulative_length = 0 if self.keys is None else self.keys.shape[-2]
                return
            if not self.record_past:
                raise RuntimeError(
                    "crop: the sliding window is full and the layer kept no past states "
                    "(activate_past_recording() first)"
                )
            if tokens_to_remove > 0:
                raise RuntimeError("crop: a full sliding window is cropped by a negative count of tokens")
            if tokens_to_remove < 0:
                drop = -tokens_to_remove
                self._apply(lambda t, scale: t[..., :-drop] if scale else t[..., :-drop, :])
                self.cumulative_length -= drop
            self._keep_window()

        def reset(self):
            super().reset()
            self.cumulative_length = 0

    return FP8KVSlidingLayer


def FP8KVCache(config=None):  # noqa: N802 (a class to its callers)
    """A transformers Cache of e4m3 K and V (module docstring). config: the model's config, whose
    sliding-window layers then keep only their window (FP8KVSlidingLayer, as DynamicCache(config=)
    makes DynamicSlidingWindowLayer); without it every layer is an FP8KVLayer that keeps its whole
    history, made as the model first writes it."""
    from transformers.cache_utils import Cache, get_layer_types_and_kwargs

    if config is None:
        return Cache(layer_class_to_replicate=_layer_class())
    layer_types, layer_kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    if isinstance(layer_kwargs, dict):  # transformers before 5.24: one dict for every layer
        layer_kwargs = [layer_kwargs] * len(layer_types)
    layers = []
    for kind, kwargs in zip(layer_types, layer_kwargs):
        if kind == "full_attention":
            layers.append(_layer_class()())
        elif kind == "sliding_attention":
            layers.append(_sliding_layer_class()(kwargs["sliding_window"]))
        else:
            raise ValueError(
                f"FP8KVCache: config has a {kind!r} layer; it takes full_attention and sliding_attention layers"
            )
    return Cache(layers=layers)


__all__ = ["FP8KVCache", "cache_scales", "dequantized"]
