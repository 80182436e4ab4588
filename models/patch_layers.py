"""The model patch's instance forwards of RMSNorm modules, decoder layers, MLPs and linears (models/hf_patch.py
describes the patch): each is fn(module, original_forward, state, ...), set as the module's forward
by patch_state.replace_forward.

With fp8_linear, the norms and gated units whose output only FP8 linears read (a decoder layer's
input norm feeding q/k/v, the norm before a dense MLP feeding gate/up, the gated unit feeding
down) run their FP8 producer kernels (gemm/triton_fp8_producers.py): the same output, plus its
e4m3 rows and scales, which the linears then take instead of casting it again (the bytes are the
same as their own cast's). The cast rows wait in _FP8_INPUTS, keyed by the output tensor, until
their last reader has taken them; outside eager mode (torch.compile) the linears cast for
themselves.

An attention layer's q, k and v projections read the same x: with fp8_linear the first call (q's)
runs one FP8 product against the three weights concatenated and splits its output, and k's and v's
calls take their parts from _FP8_FUSED (keyed by x, like _FP8_INPUTS). One product in place of
three: the backward's casts of x and the launches of both passes once, not three times (at the
llama-1.5b step each of these small products waits on the host more than on the GPU). The
concatenated weight is a copy made each call (12 MB at the llama-1.5b layer, saved for the
backward), its gradient split back by autograd; the split's backward joins dq, dk and dv into one
tensor."""

import functools

import torch
from torch.utils.weak import WeakIdKeyDictionary

from llmk.gemm.fp8_linear_ops import fp8_linear
from llmk.gemm.triton_fp8_producers import geglu_fp8, rmsnorm_fp8, swiglu_fp8
from llmk.mlp.triton_glu import geglu, swiglu
from llmk.models.patch_state import count, kernel_ready
from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm
from llmk.normalization.triton_rmsnorm import rmsnorm

# a norm's or gated unit's output -> [its e4m3 rows, their scales, readers left, its version then]
# (the value must not hold the key: the entry lives as long as the output tensor does, or until
# its last reader)
_FP8_INPUTS = WeakIdKeyDictionary()
# x -> [{id(linear): its part of the fused q/k/v product}, x's version then], until each part is taken
_FP8_FUSED = WeakIdKeyDictionary()
FP8_DTYPES = (torch.float16, torch.bfloat16)  # what fp8_linear takes


def _casts_for_fp8(state, module, x):
    """Whether `module` (a norm or an MLP) should emit its output's e4m3 rows for FP8 linears: the
    patch marked it (state.fp8_producers: module -> how many linears read its output), eager mode.
    is_compiling first: under torch.compile it is a constant, and the module's id is not read (a guard
    on it would compile every layer of a model anew)."""
    return not torch.compiler.is_compiling() and id(module) in state.fp8_producers and x.dtype in FP8_DTYPES


def _keep_for_linears(state, module, made):
    """Hold an FP8Rows' q and scale for the linears that read made.y; returns made.y."""
    _FP8_INPUTS[made.y] = [made.q, made.scale, state.fp8_producers[id(module)], made.y._version]
    return made.y


def _cast_input(x, readers=1):
    """(q, scale) a producer made for x, counting `readers` readers off; None where there are none,
    or where x changed in place since (a hook's edit: the rows would be stale)."""
    entry = _FP8_INPUTS.get(x) if not torch.compiler.is_compiling() else None
    if entry is None:
        return None
    entry[2] -= readers
    if entry[2] <= 0:
        del _FP8_INPUTS[x]
    return (entry[0], entry[1]) if x._version == entry[3] else None


def _norm_eps(norm):
    """The RMSNorm's epsilon: Llama-style modules call it variance_epsilon, Gemma's eps."""
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


def rmsnorm_forward(norm, original, state, hidden_states):
    """The model's RMSNorm: hidden_states (..., N) -> (..., N), same dtype."""
    if hidden_states.dtype == norm.weight.dtype and kernel_ready(hidden_states, norm.weight):
        count(state, "rmsnorm")
        if _casts_for_fp8(state, norm, hidden_states):
            return _keep_for_linears(
                state,
                norm,
                rmsnorm_fp8(hidden_states, norm.weight, _norm_eps(norm), offset=state.norm_offset, keep_y=True),
            )
        return rmsnorm(hidden_states, norm.weight, _norm_eps(norm), offset=state.norm_offset)
    count(state, "rmsnorm fallback")
    return original(hidden_states)


def _add_and_norm(state, hidden_states, residual, norm):
    """(norm(residual + hidden_states), residual + hidden_states): one residual_rmsnorm pass where
    it covers the call, else the add and the module."""
    if (
        hidden_states.shape == residual.shape
        and hidden_states.dtype == residual.dtype == norm.weight.dtype
        and not (norm._forward_hooks or norm._forward_pre_hooks)
        and kernel_ready(hidden_states, residual, norm.weight)
    ):
        count(state, "residual_rmsnorm")
        if _casts_for_fp8(state, norm, hidden_states):
            made = rmsnorm_fp8(
                hidden_states, norm.weight, _norm_eps(norm), offset=state.norm_offset, residual=residual, keep_y=True
            )
            return _keep_for_linears(state, norm, made), made.residual_out
        return residual_rmsnorm(hidden_states, residual, norm.weight, _norm_eps(norm), offset=state.norm_offset)
    count(state, "residual_rmsnorm fallback")
    residual = residual + hidden_states
    return norm(residual), residual


def decoder_layer_forward(
    layer,
    original,
    state,
    hidden_states,
    attention_mask=None,
    position_ids=None,
    use_cache=False,
    position_embeddings=None,
    **kwargs,
):
    """The decoder layer (transformers 5.17 and newer, every supported family): hidden_states
    (B, T, N) -> (B, T, N), the layer's steps with the add after attention fused into
    post_attention_layernorm. The KV cache stays in kwargs under the name the caller gave it
    (`cache`, or `past_key_values` before transformers renamed it), so no version warns."""
    residual = hidden_states
    hidden_states, _ = layer.self_attn(
        hidden_states=layer.input_layernorm(hidden_states),
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    hidden_states, residual = _add_and_norm(state, hidden_states, residual, layer.post_attention_layernorm)
    return residual + layer.mlp(hidden_states)


def sandwich_layer_forward(
    layer, original, state, hidden_states, position_embeddings=None, attention_mask=None, position_ids=None, **kwargs
):
    """Gemma 2 / Gemma 3's decoder layer (transformers 5.17 and newer), whose attention and MLP
    outputs are normed too: hidden_states (B, T, N) -> (B, T, N), the add after
    post_attention_layernorm fused into pre_feedforward_layernorm. The cache travels in kwargs, as
    in decoder_layer_forward."""
    residual = hidden_states
    hidden_states, _ = layer.self_attn(
        hidden_states=layer.input_layernorm(hidden_states),
        position_embeddings=position_embeddings,
        attention_mask=attention_mask,
        position_ids=position_ids,
        **kwargs,
    )
    hidden_states, residual = _add_and_norm(
        state, layer.post_attention_layernorm(hidden_states), residual, layer.pre_feedforward_layernorm
    )
    return residual + layer.post_feedforward_layernorm(layer.mlp(hidden_states))


def checkpointed(layer_forward):
    """layer_forward, run through the layer's activation checkpointing when the model turned it on.

    transformers 5.17 checkpoints a GradientCheckpointingLayer in its __call__, around whatever
    forward the instance has, ours included. Later versions checkpoint inside the class's forward,
    which an instance forward replaces: there this wrapper does what that class forward would (the
    cache left out, use_cache off, the layer's checkpoint function around the call)."""

    @functools.wraps(layer_forward)
    def forward(layer, original, state, *args, **kwargs):
        if (
            getattr(layer, "gradient_checkpointing", False)
            and layer.training
            and torch.is_grad_enabled()
            and _checkpoints_in_forward()
        ):
            if kwargs.get("use_cache"):
                kwargs["use_cache"] = False
            if not getattr(layer, "_can_checkpoint_with_cache", False):
                kwargs.update({name: None for name in ("cache", "past_key_values") if kwargs.get(name) is not None})
            return layer._gradient_checkpointing_func(
                functools.partial(layer_forward, layer, original, state, **kwargs), *args
            )
        return layer_forward(layer, original, state, *args, **kwargs)

    return forward


@functools.lru_cache(maxsize=None)
def _checkpoints_in_forward():
    """Whether this transformers checkpoints its layers inside their class's forward (no __call__ of
    its own on GradientCheckpointingLayer: 5.24 does, 5.17 does not) rather than around it."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return "__call__" not in vars(GradientCheckpointingLayer)


def mlp_forward(mlp, original, state, x):
    """Gated MLP: x (B, T, N) -> down_proj(act(gate_proj(x)) * up_proj(x)), (B, T, N), act SiLU
    (swiglu) or GELU (geglu, Gemma's tanh form)."""
    kernel, approximate = state.mlp
    if kernel_ready(x, mlp.gate_proj.weight, mlp.up_proj.weight):
        count(state, kernel)
        # the projections are this call's own temporaries: the backward may write over them
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        if _casts_for_fp8(state, mlp, gate):  # the gated unit casts for down_proj (its backward makes new dgate, dup)
            made = (
                swiglu_fp8(gate, up, keep_y=True)
                if kernel == "swiglu"
                else geglu_fp8(gate, up, approximate, keep_y=True)
            )
            return mlp.down_proj(_keep_for_linears(state, mlp, made))
        if kernel == "swiglu":
            return mlp.down_proj(swiglu(gate, up, grad_in_place=True))
        return mlp.down_proj(geglu(gate, up, approximate, grad_in_place=True))
    count(state, f"{kernel} fallback")
    return original(x)


def _fp8_ready(linear, x):
    """Whether fp8_linear takes linear(x): 16-bit x of the weight's dtype (and the bias's), on the
    kernels' device, no hooks on the module."""
    weight, bias = linear.weight, linear.bias
    return (
        x.dtype == weight.dtype
        and (bias is None or bias.dtype == weight.dtype)
        and not (linear._forward_hooks or linear._forward_pre_hooks)
        and kernel_ready(x, weight, dtypes=FP8_DTYPES)
    )


def _fused_part(linear, x):
    """linear's part of the q/k/v product an earlier member's call made from x (module docstring),
    taken; None where there is none, or where x changed in place since."""
    entry = _FP8_FUSED.get(x) if not torch.compiler.is_compiling() else None
    part = None if entry is None else entry[0].pop(id(linear), None)
    if entry is not None and not entry[0]:
        del _FP8_FUSED[x]
    return part if part is not None and x._version == entry[1] else None


def _fused_qkv(state, members, x):
    """q's output of one FP8 product of x against q's, k's and v's weights (and biases) concatenated;
    k's and v's parts wait in _FP8_FUSED. None where a member's call would not take fp8_linear, or
    the biases are not all there or all absent (then each runs on its own)."""
    biases = [m.bias for m in members]
    if (
        torch.compiler.is_compiling()
        or not all(_fp8_ready(m, x) for m in members)
        or len({b is None for b in biases}) > 1
    ):
        return None
    cast = _cast_input(x, readers=len(members))
    if cast is not None:
        count(state, "fp8_linear, input cast by its producer", len(members))
    weight = torch.cat([m.weight for m in members])
    bias = None if biases[0] is None else torch.cat(biases)
    parts = list(fp8_linear(x, weight, bias, x_fp8=cast).split([m.weight.shape[0] for m in members], dim=-1))
    # v reaches attention as it is and stays saved for its backward (RoPE makes new q and k): as a
    # view it would keep the whole output alive, q's and k's parts too (the llama-1.5b step's peak
    # grew 0.87 GB with views); its own copy lets them go
    parts[-1] = parts[-1].contiguous()
    _FP8_FUSED[x] = [{id(m): p for m, p in zip(members[1:], parts[1:])}, x._version]
    count(state, "fp8_linear, q/k/v as one product")
    count(state, "fp8_linear", len(members))
    return parts[0]


def linear_forward(linear, original, state, x):
    """A decoder layer's nn.Linear: x (..., K) -> (..., N) with its three training products in FP8
    (gemm/fp8_linear_ops.py), where the kernel takes the call (_fp8_ready); q, k and v of an
    attention layer as one product (module docstring); the original forward elsewhere."""
    part = _fused_part(linear, x)
    if part is not None:
        return part
    # under torch.compile each linear runs on its own: a lookup by the module's id would make
    # Dynamo guard on it, and compile every layer anew
    group = None if torch.compiler.is_compiling() else state.fp8_groups.get(id(linear))
    if group is not None and group[1] == 0:
        y = _fused_qkv(state, group[0], x)
        if y is not None:
            return y
    if _fp8_ready(linear, x):
        count(state, "fp8_linear")
        cast = _cast_input(x)
        if cast is not None:
            count(state, "fp8_linear, input cast by its producer")
        return fp8_linear(x, linear.weight, linear.bias, x_fp8=cast)
    count(state, "fp8_linear fallback")
    return original(x)
