"""This repository's Triton kernels swapped into a Hugging Face Llama, Qwen2, Qwen3, Mistral, Gemma 2,
Gemma 3 (text), Qwen3-MoE or Mixtral model, in place.

    patch_model(model, kernels=("rmsnorm", "residual_rmsnorm", "swiglu", "rope", "attention",
                                "cross_entropy", "moe"))                    -> model
    unpatch_model(model)                                                    -> model, as it was
    kernel_calls(model)                                                     -> {"rmsnorm": 9, ...}

transformers stays an optional dependency: it is imported inside patch_model, never on import.
Tested with transformers 5.17 and the newest release (CI's two lanes; 5.24 at this writing): later
releases call the KV cache argument `cache` where 5.17 says `past_key_values`, and the patched
forwards pass it on under the caller's name (cache_argument() says which a model takes). Written
against 5.17 (models/{llama,qwen2,qwen3,mistral,gemma2,gemma3,qwen3_moe,mixtral}/modeling_*.py),
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
             (normalization/residual_rmsnorm_ops.py: u = attention output + residual, rounded as
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
             attention/flash_attention_ops.py (causal, GQA); a padded or padding-free batch's
             prefill runs its packed form, flash_attention_varlen (below); a decode step (one query) runs
             decode_attention from inference/triton_inference_attention.py (the (B, Hkv, T, D)
             cache read through .transpose(1, 2), no copy; e4m3 with its scales from
             models/fp8_kv_cache.py's FP8KVCache) where it takes the head dim, otherwise
             the same flash kernel with Tq = 1. A sliding window shorter than
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
             model and then losses/fused_linear_cross_entropy_ops.py on the final hidden states and
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
  moe        Qwen3-MoE's and Mixtral's sparse MoE blocks (models/patch_moe.py): the router
             (TopKRouter) gets an instance `forward` that keeps its linear and runs the softmax,
             top-k and renormalization in one kernel (moe/triton_moe_routing.py; the weights stay
             fp32, where Qwen3-MoE's router rounds them to bf16), and the experts module (the
             `@use_experts_implementation` class) one that runs moe/moe_experts_ops.py: gate/up, the
             activation, down and the weighted sum back to the tokens as grouped GEMMs, with their
             backward. The router's logits, which the auxiliary load-balancing loss reads through
             the router's output, are unchanged. Qwen3-MoE's dense layers (mlp_only_layers) are
             plain MLPs and take swiglu. Apart from the patch, patch_moe.register_experts_implementation()
             registers the experts kernel as transformers' experts implementation "llmk_moe", for
             models that select it (`experts_implementation="llmk_moe"`).
  fp8_linear (opt-in: never in the default kernels) each nn.Linear inside a decoder layer (the
             attention's q/k/v/o and the MLP's gate/up/down projections) gets an instance `forward`
             that calls gemm/fp8_linear_ops.py: its forward, input-gradient and weight-gradient
             products in FP8 (e4m3, row-wise scales). The LM head and the loss stay 16-bit. The
             module's parameters are untouched (the FP8 copies are made each call, from the weight
             the forward sees, as FSDP2's unsharded one would be). The input norm, the norm before
             a dense MLP and the gated unit run their FP8 producer kernels (the norm or unit and
             the cast in one pass), and the linears that read their output take those e4m3 rows
             instead of casting it again (models/patch_layers.py); the gated unit's backward then
             makes new dgate and dup rather than writing over the projections. q, k and v run as
             one FP8 product against their weights concatenated (one set of casts and launches
             for the three, which are small at a training step's sizes and wait on the host).

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
    A decode step whose mask is a sliding window's alone (transformers builds one once the keys
    reach the window; no padding among the keys it covers) runs the decode kernel unmasked, with
    the window as the kernel's option where the cache keeps more than the window (one host sync a
    step, none under torch.compile or CUDA graph capture, where the step goes to the original).
    This reads the masks as transformers builds them for these model families, with no extra mask
    functions (or_mask_function / and_mask_function) in play. Anything else masked, a prefill chunk
    appended to a non-empty cache, a decode step of a padded batch (padding in a window's keys),
    dropout in training, or a StaticCache decode step (transformers always builds that mask; a full
    sliding layer's, whose query is its last key, aside) runs
    the model's original attention implementation, with the mask built in that implementation's
    own format.
kernel_calls(model) counts the kernel calls and the fallbacks, so a caller can see which path ran.
The attention registry entry stays after unpatching: it is inert unless a config selects it.
"""

import importlib
from dataclasses import dataclass

import torch

from llmk.models.patch_attention import check_attention_implementation, restore_attention, select_attention
from llmk.models.patch_layers import (
    checkpointed,
    decoder_layer_forward,
    linear_forward,
    mlp_forward,
    rmsnorm_forward,
    sandwich_layer_forward,
)
from llmk.models.patch_loss import causal_lm_forward
from llmk.models.patch_moe import expert_activation, experts_forward, router_forward
from llmk.models.patch_rope import attention_module_forward, install_rope, release_rope
from llmk.models.patch_state import (
    MLP_KERNELS,
    STATE_ATTR,
    PatchState,
    cache_argument,
    output_cache,
    replace_forward,
    restore_forward,
)

__all__ = [
    "KERNELS",
    "OPT_IN",
    "SUPPORTED",
    "patch_model",
    "unpatch_model",
    "kernel_calls",
    "cache_argument",
    "output_cache",
]

KERNELS = ("rmsnorm", "residual_rmsnorm", "swiglu", "geglu", "rope", "attention", "cross_entropy", "moe")
# asked for by name only, never by default: they change the numbers by design (FP8's rounding)
OPT_IN = ("fp8_linear",)


@dataclass(frozen=True)
class _Family:
    """A supported model family: its modeling module; the prefix of its RMSNorm / MLP / Attention /
    DecoderLayer (and TopKRouter / Experts) class names; its RMSNorm's offset (Gemma's x * rstd *
    (1 + weight)); whether its decoder layer also norms the attention's and the MLP's outputs
    (Gemma's four norms a layer); whether it has sparse MoE blocks."""

    module: str
    prefix: str
    norm_offset: float = 0.0
    sandwich: bool = False
    moe: bool = False


# config.model_type -> _Family
SUPPORTED = {
    "llama": _Family("transformers.models.llama.modeling_llama", "Llama"),
    "qwen2": _Family("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
    "qwen3": _Family("transformers.models.qwen3.modeling_qwen3", "Qwen3"),
    "mistral": _Family("transformers.models.mistral.modeling_mistral", "Mistral"),
    "gemma2": _Family("transformers.models.gemma2.modeling_gemma2", "Gemma2", norm_offset=1.0, sandwich=True),
    "gemma3_text": _Family("transformers.models.gemma3.modeling_gemma3", "Gemma3", norm_offset=1.0, sandwich=True),
    "qwen3_moe": _Family("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3Moe", moe=True),
    "mixtral": _Family("transformers.models.mixtral.modeling_mixtral", "Mixtral", moe=True),
}


def _check_kernels(kernels):
    if (
        isinstance(kernels, str)
        or not isinstance(kernels, (tuple, list, set, frozenset))
        or not all(isinstance(k, str) for k in kernels)
    ):
        raise TypeError(f"kernels must be a tuple of names from {KERNELS}, got {kernels!r}")
    unknown = [k for k in kernels if k not in KERNELS + OPT_IN]
    if unknown:
        raise ValueError(f"kernels: unknown name(s) {unknown}; choose from {KERNELS + OPT_IN}")
    return tuple(k for k in KERNELS + OPT_IN if k in kernels)


def _modeling_module(model):
    """(modeling module, _Family) of a supported model; raises for anything else."""
    try:
        from transformers import PreTrainedModel
    except ImportError as e:
        raise ImportError("patch_model needs transformers (pip install transformers)") from e
    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"model must be a transformers model (LlamaForCausalLM, Qwen3ForCausalLM, ...), got {type(model).__name__}"
        )
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED:
        raise ValueError(
            f"model: patch_model supports config.model_type {', '.join(map(repr, SUPPORTED))}; "
            f"got {model_type!r} ({type(model).__name__})"
        )
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
        raise ValueError(
            f"kernels: {' and '.join(map(repr, asked))} cover the activations "
            f"{', '.join(a for a, e in MLP_KERNELS.items() if e[0] in asked)}, but the model's is "
            f"{activation!r}; leave {'them' if len(asked) > 1 else 'it'} out"
        )
    return None


def patch_model(model, kernels=KERNELS):
    """Swap the kernels named in `kernels` into `model` in place; returns `model`.

    model: a transformers Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3 (text), Qwen3-MoE or
       Mixtral *ForCausalLM (or its base model), on any device and dtype: the kernels run where
       they can, the original code elsewhere (see the module docstring). kernels: any of "rmsnorm",
       "residual_rmsnorm", "swiglu" (a SiLU MLP), "geglu" (a GELU one, Gemma's), "rope",
       "attention", "cross_entropy" (the last acts on a *ForCausalLM only, in training), "moe" (the
       MoE families' routers and experts); and, by name only (OPT_IN),
       "fp8_linear": the decoder layers' linears in FP8, forward and backward.
    Raises TypeError / ValueError, with the model untouched, for another model type, an unknown
    kernel name, a model that is already patched, MLP kernels of which none covers the model's
    activation, or an attention implementation with no mask function when "attention" is asked for.
    """
    kernels = _check_kernels(kernels)
    modeling, family = _modeling_module(model)
    prefix = family.prefix
    if STATE_ATTR in model.__dict__:
        raise ValueError("model is already patched; call unpatch_model(model) first")
    mlp = _mlp_kernel(model.config, kernels)
    if "attention" in kernels:
        check_attention_implementation(model.config._attn_implementation)
    # Mixtral has no dense MLP class; only the MoE families have routers and experts
    norm_cls, mlp_cls, attention_cls, layer_cls, router_cls, experts_cls = (
        getattr(modeling, prefix + name, None)
        for name in ("RMSNorm", "MLP", "Attention", "DecoderLayer", "TopKRouter", "Experts")
    )
    moe = family.moe and "moe" in kernels
    modules = list(model.modules())
    # the decoder layers' own linears (attention and MLP projections): the LM head stays 16-bit
    layer_linears = {
        id(m)
        for layer in modules
        if isinstance(layer, layer_cls)
        for m in layer.modules()
        if type(m) is torch.nn.Linear
    }
    if not any(isinstance(m, attention_cls) for m in modules):
        raise ValueError(f"model: found no {attention_cls.__name__} modules in {type(model).__name__}")

    state = PatchState(kernels, norm_offset=family.norm_offset, mlp=mlp or ())
    if "fp8_linear" in kernels:  # the norms and gated units that cast their output for FP8 linears
        for layer in (m for m in modules if isinstance(m, layer_cls)):
            qkv = [getattr(layer.self_attn, name, None) for name in ("q_proj", "k_proj", "v_proj")]
            readers = sum(id(m) in layer_linears for m in qkv)
            if readers:
                state.fp8_producers[id(layer.input_layernorm)] = readers
            if readers == 3:  # one FP8 product for the three (models/patch_layers.py's linear_forward)
                state.fp8_groups.update({id(m): (tuple(qkv), i) for i, m in enumerate(qkv)})
            if mlp_cls is not None and isinstance(layer.mlp, mlp_cls):
                norm = layer.pre_feedforward_layernorm if family.sandwich else layer.post_attention_layernorm
                state.fp8_producers[id(norm)] = 2  # gate_proj and up_proj
                if mlp is not None:
                    state.fp8_producers[id(layer.mlp)] = 1  # down_proj
    if family.moe:  # the experts' activation, and the auxiliary loss the fused-loss forward adds
        state.moe_activation = expert_activation(model.config.hidden_act)
        state.moe_balance_loss = modeling.load_balancing_loss_func
    setattr(model, STATE_ATTR, state)
    layer_forward = checkpointed(sandwich_layer_forward if family.sandwich else decoder_layer_forward)  # one for all
    try:
        for module in modules:
            if isinstance(module, norm_cls) and "rmsnorm" in kernels:
                replace_forward(state, module, rmsnorm_forward)
            elif isinstance(module, layer_cls) and "residual_rmsnorm" in kernels:
                replace_forward(state, module, layer_forward)
            elif mlp_cls is not None and isinstance(module, mlp_cls) and mlp is not None:
                replace_forward(state, module, mlp_forward)
            elif moe and router_cls is not None and isinstance(module, router_cls):
                replace_forward(state, module, router_forward)
            elif moe and experts_cls is not None and isinstance(module, experts_cls):
                replace_forward(state, module, experts_forward)
            elif id(module) in layer_linears and "fp8_linear" in kernels:
                replace_forward(state, module, linear_forward)
            elif isinstance(module, attention_cls):
                state.attention_modules.append(module)
                setattr(module, STATE_ATTR, state)
                if "rope" in kernels:
                    replace_forward(state, module, attention_module_forward)
        if "cross_entropy" in kernels and hasattr(model, "lm_head") and hasattr(model, "model"):
            replace_forward(state, model, causal_lm_forward)
        if "rope" in kernels:
            install_rope(modeling)
            state.rope_module = modeling.__name__
        if "attention" in kernels:
            select_attention(model, modeling, state)
    except BaseException:
        unpatch_model(model)  # undoes what was done so far
        raise
    return model


def unpatch_model(model):
    """Undo patch_model: the instance forwards, the attention implementation and (with the last
    patched model of its modeling file) the RoPE global are as they were. Returns `model`."""
    state = model.__dict__.get(STATE_ATTR) if isinstance(model, torch.nn.Module) else None
    if state is None:
        raise ValueError("model is not patched (patch_model was not called on it, or it was unpatched)")
    for module, previous in reversed(state.forwards):
        restore_forward(module, previous)
    for module in state.attention_modules:
        delattr(module, STATE_ATTR)
    if state.original_attention is not None:
        restore_attention(model, state)
    if state.rope_module is not None:
        release_rope(state.rope_module)
    delattr(model, STATE_ATTR)
    return model


def kernel_calls(model):
    """{name: count} of kernel calls ("rmsnorm", "residual_rmsnorm", "swiglu", "geglu", "rope",
    "flash_attention", "flash_attention_varlen", "decode_attention", "decode_attention e4m3" (an
    FP8KVCache's steps), "cross_entropy", "moe_route", "moe_experts", "fp8_linear" and, of those,
    "fp8_linear, input cast by its producer") and of
    fallbacks ("rmsnorm fallback", ...) since patch_model, in eager calls (under torch.compile a
    count would be a guard on its value: compiled calls go uncounted)."""
    state = model.__dict__.get(STATE_ATTR) if isinstance(model, torch.nn.Module) else None
    if state is None:
        raise ValueError("model is not patched")
    return dict(state.calls)
