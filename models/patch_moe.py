"""The model patch's mixture-of-experts parts (models/hf_patch.py describes the patch): instance
forwards of a sparse MoE block's router (moe/triton_moe_routing.py: softmax, top-k and the
renormalization in one kernel) and of its experts (moe/moe_experts_ops.py: the grouped GEMMs, forward
and backward), and the same experts kernel as a transformers experts implementation, EXPERTS_NAME,
for models selected with `experts_implementation="llmk_moe"` without the rest of the patch."""

import torch

from llmk.mlp.triton_glu import GELU_ACTIVATION
from llmk.models.patch_state import MLP_KERNELS, count, kernel_ready
from llmk.moe.moe_experts_ops import moe_experts
from llmk.moe.triton_moe_routing import MAX_EXPERTS, MAX_TOP_K, moe_route

EXPERTS_NAME = "llmk_moe"
MOE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def expert_activation(hidden_act):
    """moe_experts' activation for config.hidden_act (MLP_KERNELS' entry: SiLU, or GELU by its
    approximation), or None for one the kernel lacks."""
    kernel, approximate = MLP_KERNELS.get(hidden_act, (None, None))
    return "silu" if kernel == "swiglu" else GELU_ACTIVATION.get(approximate)


def router_forward(router, original, state, hidden_states):
    """A TopKRouter (Qwen3-MoE's, Mixtral's): hidden_states (..., H) -> (logits (T, E), weights
    (T, top_k) fp32, ids (T, top_k) int64). The logits are the router's linear, unchanged (the
    auxiliary loss reads them); the weights are kept in fp32, where Qwen3-MoE's own router rounds
    them to the logits' dtype."""
    hidden_states = hidden_states.reshape(-1, router.hidden_dim)
    renormalize = bool(getattr(router, "norm_topk_prob", True))  # Mixtral's router always renormalizes
    if (
        kernel_ready(hidden_states, router.weight, dtypes=MOE_DTYPES)
        and router.top_k <= min(MAX_TOP_K, router.num_experts)
        and router.num_experts <= MAX_EXPERTS
    ):
        count(state, "moe_route")
        logits = torch.nn.functional.linear(hidden_states, router.weight)
        weights, ids = moe_route(logits, router.top_k, "softmax", renormalize)
        return logits, weights, ids.long()  # int64: the original experts' one_hot takes no other
    count(state, "moe_route fallback")
    return original(hidden_states)


def _covered(experts, activation, hidden_states, top_k_index):
    """Whether moe_experts computes this experts module's call: transformers' default layout (gate
    and up concatenated, not transposed, no biases) and gate (act(gate) * up: models that clamp or
    scale it override _apply_gate), a known activation, top_k within MAX_TOP_K and the experts, the
    kernels' device and one dtype, no autocast (whose products would run in another dtype)."""
    from transformers.integrations.moe import _default_apply_gate

    return (
        activation is not None
        and getattr(experts, "has_gate", True)
        and not getattr(experts, "has_bias", False)
        and not getattr(experts, "is_transposed", False)
        and getattr(experts, "is_concatenated", True)
        and getattr(type(experts), "_apply_gate", _default_apply_gate) is _default_apply_gate
        and hidden_states.dim() == 2
        and top_k_index.dim() == 2
        and top_k_index.shape[1] <= min(MAX_TOP_K, experts.gate_up_proj.shape[0])
        and hidden_states.dtype == experts.gate_up_proj.dtype == experts.down_proj.dtype
        and not torch.is_autocast_enabled(hidden_states.device.type)
        and kernel_ready(hidden_states, experts.gate_up_proj, experts.down_proj, dtypes=MOE_DTYPES)
    )


def experts_forward(experts, original, state, hidden_states, top_k_index, top_k_weights):
    """An Experts module (transformers' `@use_experts_implementation` classes): hidden_states (T, H),
    top_k_index and top_k_weights (T, top_k) -> (T, H), through moe_experts where it covers the call."""
    if _covered(experts, state.moe_activation, hidden_states, top_k_index):
        count(state, "moe_experts")
        return moe_experts(
            hidden_states, top_k_weights, top_k_index, experts.gate_up_proj, experts.down_proj, state.moe_activation
        )
    count(state, "moe_experts fallback")
    return original(hidden_states, top_k_index, top_k_weights)


def _interface_forward(self, hidden_states, top_k_index, top_k_weights):
    """The ExpertsInterface entry: moe_experts where it covers the call, else the module's own eager
    forward (the class's, below transformers' dispatching wrapper)."""
    activation = expert_activation(getattr(self.config, "hidden_act", None))
    if _covered(self, activation, hidden_states, top_k_index):
        return moe_experts(hidden_states, top_k_weights, top_k_index, self.gate_up_proj, self.down_proj, activation)
    return type(self).forward.__wrapped__(self, hidden_states, top_k_index, top_k_weights)


def register_experts_implementation():
    """Register moe_experts as transformers' experts implementation EXPERTS_NAME (once; later calls
    do nothing). Then `from_pretrained(..., experts_implementation="llmk_moe")` or
    `model.set_experts_implementation("llmk_moe")` selects it. Returns EXPERTS_NAME."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

    if EXPERTS_NAME not in ALL_EXPERTS_FUNCTIONS:
        ExpertsInterface.register(EXPERTS_NAME, _interface_forward)
    return EXPERTS_NAME


__all__ = ["EXPERTS_NAME", "expert_activation", "experts_forward", "register_experts_implementation", "router_forward"]
