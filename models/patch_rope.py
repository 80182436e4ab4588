"""The model patch's RoPE (models/hf_patch.py describes the patch): the attention modules call their
modeling file's global apply_rotary_pos_emb, which is replaced by a dispatcher (reference counted
over the patched models of that file). The dispatcher runs attention/triton_rope.py only inside
the forward of a patched attention module, which marks itself in a thread-local."""

import functools
import sys
import threading

import torch

from llmk.attention.triton_rope import apply_rope
from llmk.models.patch_state import count, kernel_ready

# the patched attention module whose forward is running in this thread (read by the RoPE dispatcher)
_running = threading.local()
# set in the importing thread, so that its first call does not add the attribute: torch.compile's
# guards would see it appear, and compile that call's frame again
_running.state = None
# modeling module name -> [its original apply_rotary_pos_emb, number of patched models using it]
_ROPE_PATCHES = {}


def attention_module_forward(module, original, state, *args, **kwargs):
    """The attention module's own forward, with `state` marked as running for the RoPE dispatcher."""
    outer = getattr(_running, "state", None)
    _running.state = state
    try:
        return original(*args, **kwargs)
    finally:
        _running.state = outer


def _rope_dispatcher(original):
    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        """q (B, H, T, D), k (B, Hkv, T, D); cos, sin (B or 1, T, D) from the rotary embedding."""
        state = getattr(_running, "state", None)
        if state is None:  # not called from a patched attention module
            return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        if (
            unsqueeze_dim == 1
            and cos.dtype in (torch.float32, q.dtype)
            and sin.dtype == cos.dtype
            and kernel_ready(q, k, cos, sin)
        ):
            count(state, "rope")
            return apply_rope(q, k, cos, sin)
        count(state, "rope fallback")
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    return apply_rotary_pos_emb


def install_rope(modeling):
    entry = _ROPE_PATCHES.get(modeling.__name__)
    if entry is None:
        entry = _ROPE_PATCHES[modeling.__name__] = [modeling.apply_rotary_pos_emb, 0]
        modeling.apply_rotary_pos_emb = _rope_dispatcher(entry[0])
    entry[1] += 1


def release_rope(module_name):
    entry = _ROPE_PATCHES[module_name]
    entry[1] -= 1
    if entry[1] == 0:
        sys.modules[module_name].apply_rotary_pos_emb = entry[0]
        del _ROPE_PATCHES[module_name]
