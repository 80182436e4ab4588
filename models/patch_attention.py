"""The model patch's attention (models/hf_patch.py describes the patch): an AttentionInterface function,
registered with its AttentionMaskInterface mask function, that runs the flash kernel, its packed
form on padded and padding-free prefills (the plans below), or the decode kernel, and hands any
other call to the model's own attention implementation."""

from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from llmk.attention.flash_attention_ops import MAX_HEAD_DIM, flash_attention, flash_attention_varlen
from llmk.common.ops import needs_grad
from llmk.models.fp8_kv_cache import FP8, cache_scales, dequantized
from llmk.models.patch_state import STATE_ATTR, count, kernel_ready

ATTENTION_NAME = "triton_attention"  # no "flash" in it: transformers treats such names as flash-attn builds
ATTENTION_DTYPES = (torch.float16, torch.bfloat16)  # what flash_attention takes
# id(config) -> attention implementation the model had before patching (read by the mask function,
# which gets the config but not the model; a config attribute would be saved with the model)
_ORIGINAL_ATTENTION = {}
# each mask the mask function returned -> _MaskInfo: what it was made from, for the attention calls
# that get it (weak keys: an entry lives as long as its forward's mask)
_MASKS = WeakIdKeyDictionary()
# position_ids of an unmasked prefill -> its packed-kernel plan, or False where no sequence restarts
_POSITIONS = WeakIdKeyDictionary()


@dataclass
class _MaskInfo:
    """What the mask function saw when it made a mask: padding, the 2-D attention mask (B, T) of
    bools, or None (then the mask is not plain causal because the batch is packed, position_ids
    restarting per sequence); the query and key lengths and offsets into the cache. varlen: the
    packed kernel's plan (_padded_plan, _packed_plan; False: the dense kernel's call; (): the
    original's), made by the first attention call that gets the mask and kept for the forward's
    other layers."""

    padding: torch.Tensor | None
    lengths: tuple
    varlen: tuple | bool | None = None
    window_only: bool | None = None  # a decode step's: _window_only_decode's answer, kept for the forward


def _flash_covers(module, query, key, value, kwargs):
    """Whether a causal (or one-query) attention call, its mask aside, is one our kernels compute
    exactly."""
    if not kernel_ready(query, key, value, dtypes=ATTENTION_DTYPES) or query.shape[-1] > MAX_HEAD_DIM:
        return False
    return not (module.training and kwargs.get("dropout", 0.0) > 0)


def _score_options(kwargs, n_keys):
    """The flash kernels' keyword arguments for the call's sliding window and logit softcap:
    window=(W - 1, 0) where a window of W is shorter than the keys (transformers' mask: query i
    sees key j when i - W < j <= i, aligned at the last key as the kernels align it), and
    softcap=c where the model caps its attention logits, c * tanh(s / c) (Gemma 2)."""
    options = {}
    window = kwargs.get("sliding_window")  # Mistral, Qwen2/3 and Gemma pass one on their sliding layers
    if window is not None and n_keys > window:
        options["window"] = (int(window) - 1, 0)
    if kwargs.get("softcap"):
        options["softcap"] = float(kwargs["softcap"])
    return options


def _decode_lengths(state, batch, n_keys, device):
    """(B,) int32 tensor of n_keys: every layer of a decode step has the same cache length, so one
    tensor (one fill launch) serves them all."""
    key = (batch, n_keys, device)
    if state.decode_lengths is None or state.decode_lengths[0] != key:
        state.decode_lengths = (key, torch.full((batch,), n_keys, dtype=torch.int32, device=device))
    return state.decode_lengths[1]


def _fp8_decode_covers(state, module, query, key, attention_mask, kwargs):
    """Whether decode_attention takes a decode step on an FP8KVCache: one query a sequence, no mask
    (a plain causal step), a head dim and dtype it takes, no autograd."""
    return (
        query.shape[2] == 1
        and attention_mask is None
        and query.shape[-1] in state.decode_head_dims
        and kernel_ready(query, dtypes=ATTENTION_DTYPES)
        and query.device == key.device
        and not needs_grad(query)
        and not (module.training and kwargs.get("dropout", 0.0) > 0)
    )


def _window_only_decode(query, key, attention_mask, kwargs):
    """Whether a decode step's mask is a sliding window's alone: transformers builds one whenever
    the keys reach the window (a decode step's mask is skipped otherwise) and the layer has a window,
    the query is the last key (not so in a StaticCache's unwritten slots, which only the mask keeps
    out), and no key it covers is padding. The decode kernels then take the step unmasked, with
    _score_options' window where the keys pass it (a cache that keeps every token), or none where
    the cache keeps the window's alone (DynamicSlidingWindowLayer, FP8KVCache(config)). One host sync
    a forward (the first sliding layer's; not under torch.compile or CUDA graph capture, where the
    step goes to the original)."""
    if (
        query.shape[2] != 1
        or kwargs.get("sliding_window") is None
        or torch.compiler.is_compiling()
        or (query.is_cuda and torch.cuda.is_current_stream_capturing())
    ):
        return False
    info = _MASKS.get(attention_mask)
    if info is None or info.lengths[:2] != (1, key.shape[2]):
        return False
    if info.window_only is None:
        _, kv_length, q_offset, kv_offset = info.lengths
        padding = info.padding
        info.window_only = int(q_offset) == int(kv_offset) + kv_length - 1 and (
            padding is None
            or (
                padding.dim() == 2
                and padding.shape[1] >= kv_offset + kv_length
                and bool(padding[:, kv_offset : kv_offset + kv_length].all())
            )
        )
    return info.window_only


def _padded_plan(padding):
    """((rows, columns) of the real tokens, cu_seqlens (B + 1,) int32, max_seqlen, whether no row's
    real tokens have gaps) of a padded batch, padding (B, T) bool: each row's real tokens, in order,
    are one sequence (causal among them is what the padded mask means, left, right or anywhere).
    False where every token is real: the mask is then causal (and a sliding window's, where the
    model has one), which the dense kernel computes without gathering the tokens. One host sync,
    and nonzero's where some token is padding."""
    lengths = padding.sum(1, dtype=torch.int32)
    # a row whose real tokens have gaps: positions in the packed sequence are not the mask's, so
    # a sliding window (counted in positions) cannot take this plan
    ends = padding.flip(1).int().argmax(1)
    gaps = ((padding.shape[1] - ends - padding.int().argmax(1)) != lengths) & (lengths > 0)
    longest, has_gaps, shortest = torch.stack([lengths.max(), gaps.any().to(lengths.dtype), lengths.min()]).tolist()
    if shortest == padding.shape[1]:  # no padding: transformers made the mask for a sliding window
        return False
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    # (N, 2) (row, column) pairs: the tokens gather straight from (B, T, H, D) views in one copy
    return padding.nonzero().unbind(1), cu_seqlens, longest, not has_gaps


def _packed_plan(position_ids, batch, n_tokens):
    """(None: every token is real, cu_seqlens (S + 1,) int32, max_seqlen) of a padding-free batch,
    position_ids (B or 1, T): a sequence starts wherever a position is not the one before plus 1,
    as transformers finds them; None where no row holds more than one sequence. A host sync, and
    two more where sequences restart (nonzero, max_seqlen)."""
    position_ids = position_ids.expand(batch, n_tokens)
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    if not starts[:, 1:].any():
        return None
    cu_seqlens = torch.nn.functional.pad(
        starts.flatten().nonzero().flatten().to(torch.int32), (0, 1), value=batch * n_tokens
    )
    return None, cu_seqlens, int(cu_seqlens.diff().max()), True


def _packed_call(module, query, key, attention_mask, kwargs):
    """(covered, plan) for a call whose mask, if any, our kernels can take. plan: the packed
    kernel's, for a causal prefill with no cache before it (as many keys as queries) of a padded
    batch (the mask our mask function made from a 2-D padding mask) or a padding-free one
    (position_ids restarting: transformers' mask of them, or no mask at all, as it makes none when
    a cache is passed); None for the dense kernel (no mask, or a sliding window's alone, with or
    without an all-ones padding mask). covered False: the original implementation takes the call.
    The plan is made once a forward."""
    batch, _, n_queries, _ = query.shape
    is_causal = kwargs.get("is_causal")
    prefill = (
        n_queries > 1
        and key.shape[2] == n_queries
        and (getattr(module, "is_causal", True) if is_causal is None else is_causal)
    )
    position_ids = kwargs.get("position_ids")
    if attention_mask is None:  # plain causal, unless position_ids restart
        if (
            not prefill
            or position_ids is None
            or torch.compiler.is_compiling()
            or (query.is_cuda and torch.cuda.is_current_stream_capturing())
        ):
            return True, None
        if position_ids not in _POSITIONS:
            _POSITIONS[position_ids] = _packed_plan(position_ids, batch, n_queries) or False
        return True, _POSITIONS[position_ids] or None
    info = _MASKS.get(attention_mask)
    if not prefill or info is None or info.lengths != (n_queries, n_queries, 0, 0):
        return False, None
    if info.varlen is None:
        if info.padding is not None:  # False where every row is full: the dense kernel, with the window
            info.varlen = _padded_plan(info.padding) if tuple(info.padding.shape) == (batch, n_queries) else ()
        else:  # packed, or else the mask is a sliding window's alone: the dense kernel with the window
            info.varlen = (position_ids is not None and _packed_plan(position_ids, batch, n_queries)) or False
    if info.varlen == ():
        return False, None
    return True, info.varlen or None


def _varlen_attention(query, key, value, plan, scaling, options):
    """Causal attention of the sequences of a padded or packed batch through the packed kernel.
    query (B, H, T, D), key, value (B, Hkv, T, D) -> (B, T, H, D), zeros at padding."""
    indices, cu_seqlens, max_seqlen, _ = plan
    batch, heads, n_tokens, head_dim = query.shape
    if indices is None:  # every token: (B * T, H, D), a view for one row (RoPE's output is (B, H, T, D)
        # contiguous, so rows > 1 copy once here; value, a view of (B, T, Hkv, D), never does)
        q, k, v = (t.transpose(1, 2).reshape(batch * n_tokens, t.shape[1], head_dim) for t in (query, key, value))
    else:  # the real tokens only, gathered by (row, column) from the (B, T, H, D) views: one copy each
        q, k, v = (t.transpose(1, 2)[indices] for t in (query, key, value))
    out = flash_attention_varlen(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True, sm_scale=scaling, **options
    )
    if indices is None:
        return out.view(batch, n_tokens, heads, head_dim)
    return out.new_zeros(batch, n_tokens, heads, head_dim).index_put_(indices, out)


def _attention(module, query, key, value, attention_mask, **kwargs):
    """AttentionInterface signature. query (B, H, Tq, D); key, value (B, Hkv, Tk, D), the whole KV
    cache on a decode step. Returns (output (B, Tq, H, D), None): attention weights are never built.
    """
    state = getattr(module, STATE_ATTR, None)
    if state is None:
        raise RuntimeError(
            f"attention implementation {ATTENTION_NAME!r} runs only in a model prepared by models.hf_patch.patch_model"
        )
    original_mask = attention_mask  # what a call the kernels do not take goes to the original with
    if attention_mask is not None and _window_only_decode(query, key, attention_mask, kwargs):
        attention_mask = None  # the window goes to the kernels as an option (_score_options)
    if key.dtype == FP8:  # an FP8KVCache's decode step: its scales, or the keys dequantized
        scales = cache_scales(key, value)
        if scales is None:
            raise TypeError("attention: e4m3 keys come only from models.fp8_kv_cache.FP8KVCache")
        if _fp8_decode_covers(state, module, query, key, attention_mask, kwargs):
            count(state, "decode_attention e4m3")
            batch = query.shape[0]
            lengths = _decode_lengths(state, batch, key.shape[2], query.device)
            scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
            k_scale, v_scale = (s.transpose(1, 2) for s in scales)  # (B, Hkv, T) -> (B, T, Hkv) views
            out = state.decode_attention(
                query[:, :, 0],
                key.transpose(1, 2),
                value.transpose(1, 2),
                lengths,
                scaling,
                k_scale=k_scale,
                v_scale=v_scale,
                **_score_options(kwargs, key.shape[2]),
            )
            return out.unsqueeze(1), None
        key, value = dequantized(key, value, query.dtype)
    # the kernels' own limits first: a call they cannot take anyway pays for no packed plan
    covered, plan, options = _flash_covers(module, query, key, value, kwargs), None, {}
    if covered:
        covered, plan = _packed_call(module, query, key, attention_mask, kwargs)
        options = _score_options(kwargs, key.shape[2])
        # a window counts positions, which a row with gaps in its real tokens does not keep when packed
        covered = covered and not (plan is not None and "window" in options and not plan[3])
    if not covered:
        count(state, "attention fallback")
        return state.attention_fallback(module, query, key, value, original_mask, **kwargs)
    batch, heads, n_queries, head_dim = query.shape
    scaling = kwargs.get("scaling") or head_dim**-0.5
    if plan is not None:
        count(state, "flash_attention_varlen")
        return _varlen_attention(query, key, value, plan, scaling, options), None
    training = needs_grad(query, key, value)
    if n_queries == 1 and head_dim in state.decode_head_dims and not training:  # the decode kernel: no backward
        count(state, "decode_attention")
        lengths = _decode_lengths(state, batch, key.shape[2], query.device)
        # (B, Hkv, T, D) cache -> (B, T, Hkv, D) view, no copy
        out = state.decode_attention(
            query[:, :, 0], key.transpose(1, 2), value.transpose(1, 2), lengths, scaling, **options
        )
        return out.unsqueeze(1), None
    is_causal = kwargs.get("is_causal")
    causal = (getattr(module, "is_causal", True) if is_causal is None else is_causal) and n_queries > 1
    if causal and key.shape[2] > n_queries:
        # No mask with more keys than queries happens only for a prefill into an empty StaticCache,
        # where the keys past the queries are unwritten slots: HF's SDPA path cuts them off too.
        key, value = key[:, :, :n_queries], value[:, :, :n_queries]
    count(state, "flash_attention")
    if training:  # the functional op (out= is forward-only); O comes back stored (B, Tq, H, D)
        return flash_attention(query, key, value, causal=causal, sm_scale=scaling, **options).transpose(1, 2), None
    # written as (B, Tq, H, D), the layout attention functions return: o_proj then reads it in place
    out = torch.empty(batch, n_queries, heads, head_dim, dtype=query.dtype, device=query.device)
    flash_attention(query, key, value, causal=causal, sm_scale=scaling, out=out.transpose(1, 2), **options)
    return out, None


def _mask_function(sdpa_mask, mask_functions):
    def attention_mask(**kwargs):
        """None where SDPA would skip the mask (plain causal); otherwise the original
        implementation's own mask, for the calls that go to that implementation, with what it was
        made from noted in _MASKS, for the calls the packed kernel takes (not under torch.compile,
        whose graph would not keep the note: there a masked call goes to the original)."""
        mask = sdpa_mask(**kwargs)
        if mask is None:
            return mask
        original = _ORIGINAL_ATTENTION.get(id(kwargs.get("config")), "sdpa")
        if original != "sdpa":
            mask = mask_functions[original](**kwargs)
        if not torch.compiler.is_compiling():
            lengths = tuple(kwargs.get(k, 0) for k in ("q_length", "kv_length", "q_offset", "kv_offset"))
            _MASKS[mask] = _MaskInfo(kwargs.get("attention_mask"), lengths)
        return mask

    return attention_mask


def _load_decode_attention():
    """(decode_attention, the head dims it takes), imported when a model is patched, not with this
    module."""
    from llmk.inference.triton_inference_attention import HEAD_DIMS, decode_attention

    return decode_attention, tuple(HEAD_DIMS)


def check_attention_implementation(original):
    """The attention kernel hands masked calls to the model's implementation, in that
    implementation's mask format: it must have a mask function."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if original not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise ValueError(
            f"kernels: 'attention' falls back to the model's attention implementation, which must "
            f"be one with a mask function ({', '.join(ALL_MASK_ATTENTION_FUNCTIONS)}); got "
            f"{original!r}. Leave 'attention' out of kernels to keep it."
        )


def select_attention(model, modeling, state):
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = model.config._attn_implementation
    AttentionInterface.register(ATTENTION_NAME, _attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _mask_function(sdpa_mask, ALL_MASK_ATTENTION_FUNCTIONS))
    state.original_attention = original
    # the lookup the modeling code does itself ("eager" is its own module's function)
    state.attention_fallback = ALL_ATTENTION_FUNCTIONS.get_interface(original, modeling.eager_attention_forward)
    state.decode_attention, state.decode_head_dims = _load_decode_attention()
    _ORIGINAL_ATTENTION[id(model.config)] = original
    model.set_attn_implementation(ATTENTION_NAME)
    if model.config._attn_implementation != ATTENTION_NAME:
        raise RuntimeError(f"{type(model).__name__} did not accept attention implementation {ATTENTION_NAME!r}")


def restore_attention(model, state):
    """Undo select_attention: the model's own attention implementation again."""
    model.set_attn_implementation(state.original_attention)
    _ORIGINAL_ATTENTION.pop(id(model.config), None)
