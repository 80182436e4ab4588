"""What the model patch's parts share (models/hf_patch.py describes the patch): the state one patched
model carries, the test of whether the kernels take a call's tensors, the instance-forward hook,
and the KV cache argument's name, which transformers renamed."""
import dataclasses
import functools
import inspect
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from llmk.common.device import DEVICE
from llmk.common.validation import FLOAT_DTYPES

# the MLP activations (config.hidden_act, or Gemma's config.hidden_activation) -> (kernel, its GELU
# approximation): "gelu_pytorch_tanh" is Gemma's. The gated MLPs' table, and the experts' too.
MLP_KERNELS = {"silu": ("swiglu", None), "swish": ("swiglu", None), "gelu_pytorch_tanh": ("geglu", "tanh"),
               "gelu_new": ("geglu", "tanh"), "gelu": ("geglu", "none")}

STATE_ATTR = "_triton_patch"  # the model's PatchState; each patched attention module holds it too


@dataclass
class PatchState:
    """What patch_model changed on one model, so unpatch_model can put it back."""
    kernels: tuple
    norm_offset: float = 0.0                               # the family's RMSNorm offset
    mlp: tuple = ()                                        # MLP_KERNELS' entry of the model's activation
    moe_activation: str | None = None                      # moe_experts' activation of the model's experts
    moe_balance_loss: Callable | None = None               # its modeling file's load_balancing_loss_func
    fp8_producers: dict = field(default_factory=dict)      # id(norm or MLP) -> FP8 linears reading its output
    fp8_groups: dict = field(default_factory=dict)         # id(linear) -> (q, k, v linears of its layer, index)
    calls: Counter = field(default_factory=Counter)
    forwards: list = field(default_factory=list)           # (module, instance forward it had, or None)
    attention_modules: list = field(default_factory=list)
    original_attention: str | None = None                  # config._attn_implementation before
    attention_fallback: Callable | None = None             # that implementation's attention function
    decode_attention: Callable | None = None               # inference/'s kernel, set by the patch
    decode_head_dims: tuple = ()                           # the head dims it takes
    decode_lengths: tuple | None = None                    # ((B, T, device), lengths) of the last step
    rope_module: str | None = None                         # modeling module whose global is patched


def kernel_ready(*tensors, dtypes=FLOAT_DTYPES):
    """The kernels run on DEVICE, in `dtypes`: anything else takes the original path."""
    return all(t.device.type == DEVICE and t.dtype in dtypes for t in tensors)


def replace_forward(state, module, fn):
    state.forwards.append((module, module.__dict__.get("forward")))
    module.forward = functools.partial(fn, module, module.forward, state)


def cache_argument(model):
    """The name of the KV cache argument of `model`'s forward, for callers that pass one: `cache`
    where transformers has renamed it (`past_key_values` then warns, and goes at 5.40),
    `past_key_values` in the versions before the rename (5.17 among them)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def output_cache(outputs):
    """The KV cache a transformers model's outputs carry, under either version's name."""
    return getattr(outputs, cache_field(outputs))


def cache_field(outputs):
    return "cache" if "cache" in {f.name for f in dataclasses.fields(outputs)} else "past_key_values"
