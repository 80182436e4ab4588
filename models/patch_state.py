"""What the model patch's parts share (models/hf_patch.py describes the patch): the state one patched
model carries, the test of whether the kernels take a call's tensors, the instance-forward hook,
and the KV cache argument's name, which transformers renamed."""

import dataclasses
import functools
import inspect
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from llmk.common.device import DEVICE
from llmk.common.validation import FLOAT_DTYPES

# the MLP activations (config.hidden_act, or Gemma's config.hidden_activation) -> (kernel, its GELU
# approximation): "gelu_pytorch_tanh" is Gemma's. The gated MLPs' table, and the experts' too.
MLP_KERNELS = {
    "silu": ("swiglu", None),
    "swish": ("swiglu", None),
    "gelu_pytorch_tanh": ("geglu", "tanh"),
    "gelu_new": ("geglu", "tanh"),
    "gelu": ("geglu", "none"),
}

STATE_ATTR = "_triton_patch"  # the model's PatchState; each patched attention module holds it too


@dataclass
class PatchState:
    """What patch_model changed on one model, so unpatch_model can put it back."""

    kernels: tuple
    norm_offset: float = 0.0  # the family's RMSNorm offset
    mlp: tuple = ()  # MLP_KERNELS' entry of the model's activation
    moe_activation: str | None = None  # moe_experts' activation of the model's experts
    moe_balance_loss: Callable | None = None  # its modeling file's load_balancing_loss_func
    fp8_producers: dict = field(default_factory=dict)  # id(norm or MLP) -> FP8 linears reading its output
    fp8_groups: dict = field(default_factory=dict)  # id(linear) -> (q, k, v linears of its layer, index)
    calls: Counter = field(default_factory=Counter)
    forwards: list = field(default_factory=list)  # (module, instance forward it had, or None)
    attention_modules: list = field(default_factory=list)
    original_attention: str | None = None  # config._attn_implementation before
    attention_fallback: Callable | None = None  # that implementation's attention function
    decode_attention: Callable | None = None  # inference/'s kernel, set by the patch
    decode_head_dims: tuple = ()  # the head dims it takes
    decode_lengths: tuple | None = None  # ((B, T, device), lengths) of the last step
    rope_module: str | None = None  # modeling module whose global is patched


def kernel_ready(*tensors, dtypes=FLOAT_DTYPES):
    """The kernels run on DEVICE, in `dtypes`: anything else takes the original path."""
    return all(t.device.type == DEVICE and t.dtype in dtypes for t in tensors)


PREVIOUS_ATTR = "_triton_patch_previous_forward"  # an instance forward the module had before ours
FORWARD_ATTR = "_triton_patch_forward"  # (fn, state) of the module's patched forward


def count(state, name, n=1):
    """state.calls[name] += n (kernel_calls' counts), in eager calls: under torch.compile the count
    would be traced as a guard on its value, and every call would compile again."""
    if not torch.compiler.is_compiling():
        state.calls[name] += n


def replace_forward(state, module, fn):
    """Set `module`'s forward to fn(module, original forward, state, *args, **kwargs).

    The instance forward is patched_forward bound to the module, the same function for every
    module, which reads fn and state from the module (FORWARD_ATTR) and finds its original forward
    when called: its class's, or the instance forward it had before (PREVIOUS_ATTR). torch.compile's
    guards then name no module, and one graph serves every layer compiled on its own
    (layer.compile()); with a functools.partial binding each module, each layer compiled anew, and
    the layers past Dynamo's recompile limit (8) ran uncompiled."""
    previous = module.__dict__.get("forward")
    state.forwards.append((module, previous))
    if previous is not None:
        module.__dict__[PREVIOUS_ATTR] = previous
    module.__dict__[FORWARD_ATTR] = (fn, state)
    module.forward = types.MethodType(patched_forward, module)


def patched_forward(module, *args, **kwargs):
    """A patched module's forward (replace_forward)."""
    fn, state = module.__dict__[FORWARD_ATTR]
    return fn(module, original_forward(module), state, *args, **kwargs)


def original_forward(module):
    """`module`'s forward before the patch: the instance forward it had, or its class's."""
    previous = module.__dict__.get(PREVIOUS_ATTR)
    # a partial, not type(module).forward.__get__(module): torch 2.11's Dynamo does not trace a
    # function's __get__ (a graph break in every patched forward)
    return previous if previous is not None else functools.partial(type(module).forward, module)


def restore_forward(module, previous):
    """Undo replace_forward: `previous` is the instance forward it found (None: the class's)."""
    module.__dict__.pop(PREVIOUS_ATTR, None)
    module.__dict__.pop(FORWARD_ATTR, None)
    if previous is None:
        del module.forward
    else:
        module.forward = previous


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
