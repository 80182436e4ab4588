"""This repository's Triton kernels swapped into a Hugging Face Llama, Qwen2, Qwen3, Mistral, Gemma 2 or
Gemma 3 (text) model, in place.

    patch_model(model, kernels=("rmsnorm", "residual_rmsnorm", "swiglu", "rope", "attention",
                                "cross_entropy"))                           -> model
    unpatch_model(model)                                                    -> model, as it was
    kernel_calls(model)                                                     -> {"rmsnorm": 9, ...}

transformers stays an optional dependency: it is imported inside patch_model, never on import.
Tested with transformers 5.17 and the newest release (CI's two lanes; 5.24 at this writing): later
releases call the KV cache argument `cache` where 5.17 says `past_key_values`, and the patched
forwards pass it on under the caller's name (cache_argument() says which a model takes). Written
against 5.17 (models/{llama,qwen2,qwen3,mistral,gemma2,gemma3}/modeling_*.py),
whose decoder layer runs RMSNorm -> attention (q/k/v projections, Qwen3's and Gemma 3's RMSNorm of
each head's q and k, RoPE, KV cache update, attention function, o_proj) -> residual add -> RMSNorm ->
MLP -> residual add; Gemma's also norms the attention's and the MLP's outputs (post_attention_layernorm,
post_feedforward_layernorm) before their adds, and its RMSNorms scale by (1 + weight) in fp32 (the
kernels' offset=1.0). What is replaced, and through which hook:

  rmsnorm    each of the family's RMSNorm modules (Qwen3's and Gemma 3's q_norm and k_norm, over
             each head's D values, too) gets an instance `forward` that calls
             normalization/triton_rmsnorm.py (offset=1.0 for Gemma). HF's Llama-style norms round
             x * rstd to x's dtype before the weight multiply; the kernel rounds once, after it,
             as Gemma's do.
  residual_rmsnorm  each decoder layer gets an instance `forward`, the layer's own steps in its
             order, with the add after attention and post_attention_layernorm in one pass
             (normalization/triton_residual_rmsnorm.py: u = attention output + residual, rounded as
             HF's add rounds it, and rmsnorm(u)). The add after the MLP feeds the next layer's
             input_layernorm, across the decoder loop, so it stays PyTorch's. Gemma's layer fuses
             the add after post_attention_layernorm with pre_feedforward_layernorm instead.
  swiglu, geglu  each MLP gets an instance `forward`, down_proj(swiglu(gate_proj(x), up_proj(x))):
             silu(gate) * up in one pass (mlp/triton_glu.py), for hidden_act "silu"; or geglu,
             gelu(gate) * up, for Gemma's "gelu_pytorch_tanh" (and "gelu", "gelu_new"). Its
             backward writes dgate and dup over gate_proj's and up_proj's outputs (grad_in_place:
             2 x (B, T, I) less at the backward's peak); a forward hook that keeps those outputs
             sees gradients there after the backward.
  attention  registered as "triton_attention" in transformers' AttentionInterface and
             AttentionMaskInterface, and selected with model.set_attn_implementation. A prefill runs
             attention/triton_flash_attention.py (causal, GQA); a padded or padding-free batch's
             prefill runs its packed form, flash_attention_varlen (below); a decode step (one query) runs
             decode_attention from inference/triton_inference_attention.py (the (B, Hkv, T, D)
             cache read through .transpose(1, 2), no copy) when that module imports and takes the
             head dim, otherwise the same flash kernel with Tq = 1. A sliding window shorter than
             the keys (Mistral's, Gemma's and Qwen's sliding layers; transformers' convention,
             query i sees key j when i - W < j <= i) and Gemma 2's attention logit softcap,
             c * tanh(s / c), go to the kernels as window=(W - 1, 0) and softcap=c. transformers'
             SDPA implementation drops that softcap (only its eager one applies it): a Gemma 2
             model whose implementation is SDPA computes without the cap unpatched and with it
             patched.
  rope       the attention modules call the module-level `apply_rotary_pos_emb` of their modeling
             file directly, and transformers has no per-model hook for it (its `use_kernelized_func`
             decorator acts only with the `kernels` package and hub repositories). So that global is
             replaced by a dispatcher while any model of that file is patched (reference counted;
             the last unpatch puts the original back), and the dispatcher runs
             attention/triton_rope.py only inside the forward of a patched attention module (an
             instance forward wrapper marks it in a thread-local). Every other caller, e.g. an
             unpatched model in the same process, gets the original function. A patched model that
             is dropped without unpatch_model leaves the dispatcher installed, still inert for others.
  cross_entropy  a *ForCausalLM gets an instance `forward`: in a training step (model.train(),
             grad enabled, labels given, every position's logits) it runs the base
             model and then losses/triton_fused_linear_cross_entropy.py on the final hidden states and
             lm_head's weight (Gemma 2's final logit softcap inside it), with HF's ForCausalLMLoss
             semantics (labels shifted left unless
             shift_labels are given, ignore_index -100 or the one passed, "mean", or "sum" over
             num_items_in_batch when the Trainer passes it; an fp32 loss). The (tokens x vocab)
             logits are never made, and the output's `logits` is None. The loss's gradient of the
             final hidden states is written over them (grad_in_place), unless the output returns
             them (output_hidden_states); a forward hook that keeps the final norm's output would
             see it so overwritten. An lm_head that is not a
             plain nn.Linear without hooks (LoRA, ZeRO-3, FSDP wrap it), or autocast, keeps the
             original forward, as does every call that is not a training step.

Training: rmsnorm, residual_rmsnorm, swiglu, rope and attention (flash_attention, prefill) have a
backward, so a patched model trains on them: with grad enabled the hooks call the functional
kernels (no out= buffers), and loss.backward() runs the kernels' backward. A decode step (one query
against a cache) takes the decode kernel only without grad.

The original code runs instead of a kernel whenever the kernel does not cover the call:
  - autograd where a kernel has none: the decode kernel (one query against a cache) runs without
    grad only; with grad the flash kernel takes that step.
  - a tensor off the kernels' device (common.device.DEVICE) or of a dtype a kernel lacks (the flash
    kernel takes fp16 and bf16 only, so an fp32 model keeps its original attention), or an RMSNorm
    weight whose dtype differs from its input's (HF then returns the promoted dtype); a
    post_attention_layernorm with hooks of its own (the fused pass would skip them).
  - an attention mask other than padding or packing. The mask function is transformers' SDPA one,
    which returns None for a plain causal mask: a prefill with no padding (attention_mask absent or
    all ones; also into an empty StaticCache, whose unwritten slots are cut off as HF's SDPA path
    does) and an unpadded decode step on a DynamicCache. Two masked prefills (no cache before them)
    run the packed kernel, as transformers' flash-attn integration does: a padded batch (a 2-D
    attention_mask, left, right or anywhere: each row's real tokens are one sequence, gathered into
    (total, H, D), and the output is zero at the padding) and a padding-free batch (one row of
    sequences, position_ids restarting at 0 for each, as DataCollatorWithFlattening builds it:
    cu_seqlens from where the positions restart, no copy). transformers masks the restarts only
    without a cache (use_cache=False); with one it makes no mask, and the restarts are found from
    position_ids here (one host sync a forward for each prefill, a second where sequences restart;
    none under torch.compile or CUDA graph capture, where the call takes the plain kernel as
    transformers' own would). The plan (the real tokens' indices, cu_seqlens) is made by the first
    layer and kept for the others (two host syncs for a padded batch's; one where every row is full,
    as with a sliding window shorter than the prompt, whose mask transformers builds even then: that
    call takes the plain kernel with the window).
    This reads the masks as transformers builds them for these model families, with no extra mask
    functions (or_mask_function / and_mask_function) in play. Anything else masked, a prefill chunk
    appended to a non-empty cache, a decode step of a padded batch or of a sliding window's mask,
    dropout in training, or a StaticCache decode step (transformers always builds that mask) runs
    the model's original attention implementation, with the mask built in that implementation's
    own format.
kernel_calls(model) counts the kernel calls and the fallbacks, so a caller can see which path ran.
The attention registry entry stays after unpatching: it is inert unless a config selects it.
"""
import dataclasses
import functools
import importlib
import inspect
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from llmk.attention.triton_flash_attention import MAX_HEAD_DIM, flash_attention, flash_attention_varlen
from llmk.attention.triton_rope import apply_rope
from llmk.common.device import DEVICE
from llmk.common.ops import needs_grad
from llmk.common.validation import FLOAT_DTYPES
from llmk.losses.triton_fused_linear_cross_entropy import fused_linear_cross_entropy
from llmk.mlp.triton_glu import geglu, swiglu
from llmk.models.packing import IGNORE_INDEX
from llmk.normalization.triton_residual_rmsnorm import residual_rmsnorm
from llmk.normalization.triton_rmsnorm import rmsnorm

KERNELS = ("rmsnorm", "residual_rmsnorm", "swiglu", "geglu", "rope", "attention", "cross_entropy")
ATTENTION_NAME = "triton_attention"  # no "flash" in it: transformers treats such names as flash-attn builds
ATTENTION_DTYPES = (torch.float16, torch.bfloat16)  # what flash_attention takes
# the MLP activations (config.hidden_act, or Gemma's config.hidden_activation) -> (kernel, its GELU
# approximation): "gelu_pytorch_tanh" is Gemma's
MLP_KERNELS = {"silu": ("swiglu", None), "swish": ("swiglu", None), "gelu_pytorch_tanh": ("geglu", "tanh"),
               "gelu_new": ("geglu", "tanh"), "gelu": ("geglu", "none")}


@dataclass(frozen=True)
class _Family:
    """A supported model family: its modeling module; the prefix of its RMSNorm / MLP / Attention /
    DecoderLayer class names; its RMSNorm's offset (Gemma's x * rstd * (1 + weight)); whether its
    decoder layer also norms the attention's and the MLP's outputs (Gemma's four norms a layer)."""
    module: str
    prefix: str
    norm_offset: float = 0.0
    sandwich: bool = False


# config.model_type -> _Family
SUPPORTED = {
    "llama": _Family("transformers.models.llama.modeling_llama", "Llama"),
    "qwen2": _Family("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
    "qwen3": _Family("transformers.models.qwen3.modeling_qwen3", "Qwen3"),
    "mistral": _Family("transformers.models.mistral.modeling_mistral", "Mistral"),
    "gemma2": _Family("transformers.models.gemma2.modeling_gemma2", "Gemma2", norm_offset=1.0, sandwich=True),
    "gemma3_text": _Family("transformers.models.gemma3.modeling_gemma3", "Gemma3", norm_offset=1.0, sandwich=True),
}
_STATE_ATTR = "_triton_patch"  # the model's _PatchState; each patched attention module holds it too

# the patched attention module whose forward is running in this thread (read by the RoPE dispatcher)
_running = threading.local()
# modeling module name -> [its original apply_rotary_pos_emb, number of patched models using it]
_ROPE_PATCHES = {}
# id(config) -> attention implementation the model had before patching (read by the mask function,
# which gets the config but not the model; a config attribute would be saved with the model)
_ORIGINAL_ATTENTION = {}
# each mask the mask function returned -> _MaskInfo: what it was made from, for the attention calls
# that get it (weak keys: an entry lives as long as its forward's mask)
_MASKS = WeakIdKeyDictionary()
# position_ids of an unmasked prefill -> its packed-kernel plan, or False where no sequence restarts
_POSITIONS = WeakIdKeyDictionary()


@dataclass
class _PatchState:
    """What patch_model changed on one model, so unpatch_model can put it back."""
    kernels: tuple
    norm_offset: float = 0.0                               # the family's RMSNorm offset
    mlp: tuple = ()                                        # MLP_KERNELS' entry of the model's activation
    calls: Counter = field(default_factory=Counter)
    forwards: list = field(default_factory=list)           # (module, instance forward it had, or None)
    attention_modules: list = field(default_factory=list)
    original_attention: str | None = None                  # config._attn_implementation before
    attention_fallback: Callable | None = None             # that implementation's attention function
    decode_attention: Callable | None = None               # inference/'s kernel, set by the patch
    decode_head_dims: tuple = ()                           # the head dims it takes
    decode_lengths: tuple | None = None                    # ((B, T, device), lengths) of the last step
    rope_module: str | None = None                         # modeling module whose global is patched


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


def _kernel_ready(*tensors, dtypes=FLOAT_DTYPES):
    """The kernels run on DEVICE, in `dtypes`: anything else takes the original path."""
    return all(t.device.type == DEVICE and t.dtype in dtypes for t in tensors)


# ---------------------------------------------------------------------------------------------
# instance forwards: functools.partial(fn, module, original_forward, state) is set as module.forward


def _norm_eps(norm):
    """The RMSNorm's epsilon: Llama-style modules call it variance_epsilon, Gemma's eps."""
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


def _rmsnorm_forward(norm, original, state, hidden_states):
    """The model's RMSNorm: hidden_states (..., N) -> (..., N), same dtype."""
    if hidden_states.dtype == norm.weight.dtype and _kernel_ready(hidden_states, norm.weight):
        state.calls["rmsnorm"] += 1
        return rmsnorm(hidden_states, norm.weight, _norm_eps(norm), offset=state.norm_offset)
    state.calls["rmsnorm fallback"] += 1
    return original(hidden_states)


def _add_and_norm(state, hidden_states, residual, norm):
    """(norm(residual + hidden_states), residual + hidden_states): one residual_rmsnorm pass where
    it covers the call, else the add and the module."""
    if (hidden_states.shape == residual.shape and hidden_states.dtype == residual.dtype == norm.weight.dtype
            and not (norm._forward_hooks or norm._forward_pre_hooks)
            and _kernel_ready(hidden_states, residual, norm.weight)):
        state.calls["residual_rmsnorm"] += 1
        return residual_rmsnorm(hidden_states, residual, norm.weight, _norm_eps(norm), offset=state.norm_offset)
    state.calls["residual_rmsnorm fallback"] += 1
    residual = residual + hidden_states
    return norm(residual), residual


def _decoder_layer_forward(layer, original, state, hidden_states, attention_mask=None, position_ids=None,
                           use_cache=False, position_embeddings=None, **kwargs):
    """The decoder layer (transformers 5.17 and newer, every supported family): hidden_states
    (B, T, N) -> (B, T, N), the layer's steps with the add after attention fused into
    post_attention_layernorm. The KV cache stays in kwargs under the name the caller gave it
    (`cache`, or `past_key_values` before transformers renamed it), so no version warns."""
    residual = hidden_states
    hidden_states, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states),
                                       attention_mask=attention_mask, position_ids=position_ids,
                                       use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    hidden_states, residual = _add_and_norm(state, hidden_states, residual, layer.post_attention_layernorm)
    return residual + layer.mlp(hidden_states)


def _sandwich_layer_forward(layer, original, state, hidden_states, position_embeddings=None, attention_mask=None,
                            position_ids=None, **kwargs):
    """Gemma 2 / Gemma 3's decoder layer (transformers 5.17 and newer), whose attention and MLP
    outputs are normed too: hidden_states (B, T, N) -> (B, T, N), the add after
    post_attention_layernorm fused into pre_feedforward_layernorm. The cache travels in kwargs, as
    in _decoder_layer_forward."""
    residual = hidden_states
    hidden_states, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states),
                                       position_embeddings=position_embeddings, attention_mask=attention_mask,
                                       position_ids=position_ids, **kwargs)
    hidden_states, residual = _add_and_norm(state, layer.post_attention_layernorm(hidden_states), residual,
                                            layer.pre_feedforward_layernorm)
    return residual + layer.post_feedforward_layernorm(layer.mlp(hidden_states))


def _checkpointed(layer_forward):
    """layer_forward, run through the layer's activation checkpointing when the model turned it on.

    transformers 5.17 checkpoints a GradientCheckpointingLayer in its __call__, around whatever
    forward the instance has, ours included. Later versions checkpoint inside the class's forward,
    which an instance forward replaces: there this wrapper does what that class forward would (the
    cache left out, use_cache off, the layer's checkpoint function around the call)."""
    @functools.wraps(layer_forward)
    def forward(layer, original, state, *args, **kwargs):
        if (getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled()
                and _checkpoints_in_forward()):
            if kwargs.get("use_cache"):
                kwargs["use_cache"] = False
            if not getattr(layer, "_can_checkpoint_with_cache", False):
                kwargs.update({name: None for name in ("cache", "past_key_values") if kwargs.get(name) is not None})
            return layer._gradient_checkpointing_func(
                functools.partial(layer_forward, layer, original, state, **kwargs), *args)
        return layer_forward(layer, original, state, *args, **kwargs)
    return forward


@functools.lru_cache(maxsize=None)
def _checkpoints_in_forward():
    """Whether this transformers checkpoints its layers inside their class's forward (no __call__ of
    its own on GradientCheckpointingLayer: 5.24 does, 5.17 does not) rather than around it."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return "__call__" not in vars(GradientCheckpointingLayer)


def _mlp_forward(mlp, original, state, x):
    """Gated MLP: x (B, T, N) -> down_proj(act(gate_proj(x)) * up_proj(x)), (B, T, N), act SiLU
    (swiglu) or GELU (geglu, Gemma's tanh form)."""
    kernel, approximate = state.mlp
    if _kernel_ready(x, mlp.gate_proj.weight, mlp.up_proj.weight):
        state.calls[kernel] += 1
        # the projections are this call's own temporaries: the backward may write over them
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        if kernel == "swiglu":
            return mlp.down_proj(swiglu(gate, up, grad_in_place=True))
        return mlp.down_proj(geglu(gate, up, approximate, grad_in_place=True))
    state.calls[f"{kernel} fallback"] += 1
    return original(x)


def _attention_module_forward(module, original, state, *args, **kwargs):
    """The attention module's own forward, with `state` marked as running for the RoPE dispatcher."""
    outer = getattr(_running, "state", None)
    _running.state = state
    try:
        return original(*args, **kwargs)
    finally:
        _running.state = outer


def cache_argument(model):
    """The name of the KV cache argument of `model`'s forward, for callers that pass one: `cache`
    where transformers has renamed it (`past_key_values` then warns, and goes at 5.40),
    `past_key_values` in the versions before the rename (5.17 among them)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def output_cache(outputs):
    """The KV cache a transformers model's outputs carry, under either version's name."""
    return getattr(outputs, _cache_field(outputs))


def _cache_field(outputs):
    return "cache" if "cache" in {f.name for f in dataclasses.fields(outputs)} else "past_key_values"


def _replace_forward(state, module, fn):
    state.forwards.append((module, module.__dict__.get("forward")))
    module.forward = functools.partial(fn, module, module.forward, state)


def _fused_head(head):
    """Whether the LM head is a plain nn.Linear without hooks, so that its .weight is what its
    forward would use (PEFT's LoRA, DeepSpeed ZeRO-3's gathers and FSDP act through wrappers or
    hooks, which the fused loss would bypass)."""
    return type(head) is torch.nn.Linear and not (head._forward_hooks or head._forward_pre_hooks)


def _causal_lm_forward(model, original, state, input_ids=None, attention_mask=None, position_ids=None,
                       inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """*ForCausalLM.forward: a training step (model.train(), grad enabled, labels, every position's
    logits) runs the base model, then the fused linear cross-entropy with HF's
    ForCausalLMLoss semantics; anything else, the original forward (module docstring). The KV
    cache, if any, stays in kwargs under the caller's name for it (cache_argument)."""
    def run_original():
        return original(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        inputs_embeds=inputs_embeds, labels=labels, use_cache=use_cache,
                        logits_to_keep=logits_to_keep, **kwargs)

    every_position = isinstance(logits_to_keep, int) and logits_to_keep == 0
    # HF computes a loss only with labels (shift_labels then replace their shifted copy)
    if not (labels is not None and every_position and model.training and torch.is_grad_enabled()):
        return run_original()  # not a training step
    head = model.lm_head
    if not _fused_head(head) or torch.is_autocast_enabled(head.weight.device.type):
        # autocast would run the head's GEMM in its dtype, which the fused op's GEMMs do not follow
        state.calls["cross_entropy fallback"] += 1
        return run_original()
    from transformers.modeling_outputs import CausalLMOutputWithPast

    options = dict(kwargs)
    num_items = options.pop("num_items_in_batch", None)
    ignore_index = options.pop("ignore_index", IGNORE_INDEX)
    shift_labels = options.pop("shift_labels", None)
    return_dict = options.pop("return_dict", None)
    as_dict = getattr(model.config, "return_dict", True) if return_dict is None else return_dict
    outputs = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          inputs_embeds=inputs_embeds, use_cache=use_cache, return_dict=True, **options)
    hidden = outputs.last_hidden_state
    # HF's ForCausalLMLoss: token t predicts label t + 1 (the last position none), unless the
    # caller shifted them already (sequence parallelism, packed batches)
    target = shift_labels if shift_labels is not None else \
        torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = target.to(hidden.device)
    softcap = getattr(model.config, "final_logit_softcapping", None)  # Gemma 2's c * tanh(logits / c)
    if _kernel_ready(hidden, head.weight) and head.weight.dtype == hidden.dtype and target.shape == hidden.shape[:2]:
        state.calls["cross_entropy"] += 1
        # grad_hidden may take the final hidden states' memory unless the output returns them
        loss, logits = fused_linear_cross_entropy(hidden, head.weight, target, head.bias, ignore_index,
                                                  "mean" if num_items is None else "sum", softcap=softcap,
                                                  loss_dtype=torch.float32,
                                                  grad_in_place=outputs.hidden_states is None), None
        if num_items is not None:
            loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    else:
        state.calls["cross_entropy fallback"] += 1
        logits = head(hidden)
        if softcap is not None:  # as the model's own forward caps them
            logits = torch.tanh(logits / softcap) * softcap
        loss = model.loss_function(logits=logits, labels=labels, vocab_size=model.config.vocab_size,
                                   num_items_in_batch=num_items, ignore_index=ignore_index,
                                   shift_labels=shift_labels)
    cache_field = _cache_field(outputs)
    out = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                 attentions=outputs.attentions, **{cache_field: getattr(outputs, cache_field)})
    return out if as_dict else out.to_tuple()


# ---------------------------------------------------------------------------------------------
# RoPE: the modeling module's global apply_rotary_pos_emb


def _rope_dispatcher(original):
    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        """q (B, H, T, D), k (B, Hkv, T, D); cos, sin (B or 1, T, D) from the rotary embedding."""
        state = getattr(_running, "state", None)
        if state is None:  # not called from a patched attention module
            return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        if (unsqueeze_dim == 1 and cos.dtype in (torch.float32, q.dtype) and sin.dtype == cos.dtype
                and _kernel_ready(q, k, cos, sin)):
            state.calls["rope"] += 1
            return apply_rope(q, k, cos, sin)
        state.calls["rope fallback"] += 1
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    return apply_rotary_pos_emb


def _install_rope(modeling):
    entry = _ROPE_PATCHES.get(modeling.__name__)
    if entry is None:
        entry = _ROPE_PATCHES[modeling.__name__] = [modeling.apply_rotary_pos_emb, 0]
        modeling.apply_rotary_pos_emb = _rope_dispatcher(entry[0])
    entry[1] += 1


def _release_rope(module_name):
    entry = _ROPE_PATCHES[module_name]
    entry[1] -= 1
    if entry[1] == 0:
        sys.modules[module_name].apply_rotary_pos_emb = entry[0]
        del _ROPE_PATCHES[module_name]


# ---------------------------------------------------------------------------------------------
# attention: an AttentionInterface function and its AttentionMaskInterface mask


def _flash_covers(module, query, key, value, kwargs):
    """Whether a causal (or one-query) attention call, its mask aside, is one our kernels compute
    exactly."""
    if not _kernel_ready(query, key, value, dtypes=ATTENTION_DTYPES) or query.shape[-1] > MAX_HEAD_DIM:
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
    cu_seqlens = torch.nn.functional.pad(starts.flatten().nonzero().flatten().to(torch.int32), (0, 1),
                                         value=batch * n_tokens)
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
    prefill = (n_queries > 1 and key.shape[2] == n_queries
               and (getattr(module, "is_causal", True) if is_causal is None else is_causal))
    position_ids = kwargs.get("position_ids")
    if attention_mask is None:  # plain causal, unless position_ids restart
        if (not prefill or position_ids is None or torch.compiler.is_compiling()
                or (query.is_cuda and torch.cuda.is_current_stream_capturing())):
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
    out = flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True,
                                 sm_scale=scaling, **options)
    if indices is None:
        return out.view(batch, n_tokens, heads, head_dim)
    return out.new_zeros(batch, n_tokens, heads, head_dim).index_put_(indices, out)


def _attention(module, query, key, value, attention_mask, **kwargs):
    """AttentionInterface signature. query (B, H, Tq, D); key, value (B, Hkv, Tk, D), the whole KV
    cache on a decode step. Returns (output (B, Tq, H, D), None): attention weights are never built.
    """
    state = getattr(module, _STATE_ATTR, None)
    if state is None:
        raise RuntimeError(f"attention implementation {ATTENTION_NAME!r} runs only in a model prepared "
                           "by models.hf_patch.patch_model")
    # the kernels' own limits first: a call they cannot take anyway pays for no packed plan
    covered, plan, options = _flash_covers(module, query, key, value, kwargs), None, {}
    if covered:
        covered, plan = _packed_call(module, query, key, attention_mask, kwargs)
        options = _score_options(kwargs, key.shape[2])
        # a window counts positions, which a row with gaps in its real tokens does not keep when packed
        covered = covered and not (plan is not None and "window" in options and not plan[3])
    if not covered:
        state.calls["attention fallback"] += 1
        return state.attention_fallback(module, query, key, value, attention_mask, **kwargs)
    batch, heads, n_queries, head_dim = query.shape
    scaling = kwargs.get("scaling") or head_dim ** -0.5
    if plan is not None:
        state.calls["flash_attention_varlen"] += 1
        return _varlen_attention(query, key, value, plan, scaling, options), None
    training = needs_grad(query, key, value)
    if n_queries == 1 and head_dim in state.decode_head_dims and not training:  # the decode kernel: no backward
        state.calls["decode_attention"] += 1
        lengths = _decode_lengths(state, batch, key.shape[2], query.device)
        # (B, Hkv, T, D) cache -> (B, T, Hkv, D) view, no copy
        out = state.decode_attention(query[:, :, 0], key.transpose(1, 2), value.transpose(1, 2), lengths, scaling,
                                     **options)
        return out.unsqueeze(1), None
    is_causal = kwargs.get("is_causal")
    causal = (getattr(module, "is_causal", True) if is_causal is None else is_causal) and n_queries > 1
    if causal and key.shape[2] > n_queries:
        # No mask with more keys than queries happens only for a prefill into an empty StaticCache,
        # where the keys past the queries are unwritten slots: HF's SDPA path cuts them off too.
        key, value = key[:, :, :n_queries], value[:, :, :n_queries]
    state.calls["flash_attention"] += 1
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


def _check_attention_implementation(original):
    """The attention kernel hands masked calls to the model's implementation, in that
    implementation's mask format: it must have a mask function."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if original not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise ValueError(f"kernels: 'attention' falls back to the model's attention implementation, which must "
                         f"be one with a mask function ({', '.join(ALL_MASK_ATTENTION_FUNCTIONS)}); got "
                         f"{original!r}. Leave 'attention' out of kernels to keep it.")


def _select_attention(model, modeling, state):
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


# ---------------------------------------------------------------------------------------------
# public API


def _check_kernels(kernels):
    if isinstance(kernels, str) or not isinstance(kernels, (tuple, list, set, frozenset)) \
            or not all(isinstance(k, str) for k in kernels):
        raise TypeError(f"kernels must be a tuple of names from {KERNELS}, got {kernels!r}")
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        raise ValueError(f"kernels: unknown name(s) {unknown}; choose from {KERNELS}")
    return tuple(k for k in KERNELS if k in kernels)


def _modeling_module(model):
    """(modeling module, _Family) of a supported model; raises for anything else."""
    try:
        from transformers import PreTrainedModel
    except ImportError as e:
        raise ImportError("patch_model needs transformers (pip install transformers)") from e
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a transformers model (LlamaForCausalLM, Qwen3ForCausalLM, ...), "
                        f"got {type(model).__name__}")
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED:
        raise ValueError(f"model: patch_model supports config.model_type {', '.join(map(repr, SUPPORTED))}; "
                         f"got {model_type!r} ({type(model).__name__})")
    family = SUPPORTED[model_type]
    return importlib.import_module(family.module), family


def _mlp_kernel(config, kernels):
    """MLP_KERNELS' (kernel, approximation) for the model's activation, or None where none of
    `kernels` covers it; raises where an MLP kernel was asked for and none covers it."""
    activation = getattr(config, "hidden_activation", None) or config.hidden_act
    entry = MLP_KERNELS.get(activation)
    if entry is not None and entry[0] in kernels:
        return entry
    asked = [k for k in ("swiglu", "geglu") if k in kernels]
    if asked:
        raise ValueError(f"kernels: {' and '.join(map(repr, asked))} cover the activations "
                         f"{', '.join(a for a, e in MLP_KERNELS.items() if e[0] in asked)}, but the model's is "
                         f"{activation!r}; leave {'them' if len(asked) > 1 else 'it'} out")
    return None


def patch_model(model, kernels=KERNELS):
    """Swap the kernels named in `kernels` into `model` in place; returns `model`.

    model: a transformers Llama, Qwen2, Qwen3, Mistral, Gemma 2 or Gemma 3 (text) *ForCausalLM (or
       its base model), on any device and dtype: the kernels run where they can, the original code
       elsewhere (see the module docstring). kernels: any of "rmsnorm", "residual_rmsnorm",
       "swiglu" (a SiLU MLP), "geglu" (a GELU one, Gemma's), "rope", "attention", "cross_entropy"
       (the last acts on a *ForCausalLM only, in training).
    Raises TypeError / ValueError, with the model untouched, for another model type, an unknown
    kernel name, a model that is already patched, MLP kernels of which none covers the model's
    activation, or an attention implementation with no mask function when "attention" is asked for.
    """
    kernels = _check_kernels(kernels)
    modeling, family = _modeling_module(model)
    prefix = family.prefix
    if _STATE_ATTR in model.__dict__:
        raise ValueError("model is already patched; call unpatch_model(model) first")
    mlp = _mlp_kernel(model.config, kernels)
    if "attention" in kernels:
        _check_attention_implementation(model.config._attn_implementation)
    norm_cls, mlp_cls, attention_cls, layer_cls = (getattr(modeling, prefix + name)
                                                   for name in ("RMSNorm", "MLP", "Attention", "DecoderLayer"))
    modules = list(model.modules())
    if not any(isinstance(m, attention_cls) for m in modules):
        raise ValueError(f"model: found no {attention_cls.__name__} modules in {type(model).__name__}")

    state = _PatchState(kernels, norm_offset=family.norm_offset, mlp=mlp or ())
    setattr(model, _STATE_ATTR, state)
    try:
        for module in modules:
            if isinstance(module, norm_cls) and "rmsnorm" in kernels:
                _replace_forward(state, module, _rmsnorm_forward)
            elif isinstance(module, layer_cls) and "residual_rmsnorm" in kernels:
                _replace_forward(state, module, _checkpointed(_sandwich_layer_forward if family.sandwich
                                                              else _decoder_layer_forward))
            elif isinstance(module, mlp_cls) and mlp is not None:
                _replace_forward(state, module, _mlp_forward)
            elif isinstance(module, attention_cls):
                state.attention_modules.append(module)
                setattr(module, _STATE_ATTR, state)
                if "rope" in kernels:
                    _replace_forward(state, module, _attention_module_forward)
        if "cross_entropy" in kernels and hasattr(model, "lm_head") and hasattr(model, "model"):
            _replace_forward(state, model, _causal_lm_forward)
        if "rope" in kernels:
            _install_rope(modeling)
            state.rope_module = modeling.__name__
        if "attention" in kernels:
            _select_attention(model, modeling, state)
    except BaseException:
        unpatch_model(model)  # undoes what was done so far
        raise
    return model


def unpatch_model(model):
    """Undo patch_model: the instance forwards, the attention implementation and (with the last
    patched model of its modeling file) the RoPE global are as they were. Returns `model`."""
    state = model.__dict__.get(_STATE_ATTR) if isinstance(model, torch.nn.Module) else None
    if state is None:
        raise ValueError("model is not patched (patch_model was not called on it, or it was unpatched)")
    for module, previous in reversed(state.forwards):
        if previous is None:
            del module.forward
        else:
            module.forward = previous
    for module in state.attention_modules:
        delattr(module, _STATE_ATTR)
    if state.original_attention is not None:
        model.set_attn_implementation(state.original_attention)
        _ORIGINAL_ATTENTION.pop(id(model.config), None)
    if state.rope_module is not None:
        _release_rope(state.rope_module)
    delattr(model, _STATE_ATTR)
    return model


def kernel_calls(model):
    """{name: count} of kernel calls ("rmsnorm", "residual_rmsnorm", "swiglu", "geglu", "rope",
    "flash_attention", "flash_attention_varlen", "decode_attention", "cross_entropy") and of
    fallbacks ("rmsnorm fallback", ...) since patch_model."""
    state = model.__dict__.get(_STATE_ATTR) if isinstance(model, torch.nn.Module) else None
    if state is None:
        raise ValueError("model is not patched")
    return dict(state.calls)
