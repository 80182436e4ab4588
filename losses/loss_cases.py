"""Targets shared by losses/test_cross_entropy.py and losses/test_fused_linear_cross_entropy.py."""

import torch

from llmk.common.device import DEVICE

IGNORE = -100  # the losses' default ignore_index, as F.cross_entropy's


def make_target(shape, v, ignored=0.25, all_ignored=False):
    """Class indices in [0, V), a share of them IGNORE (fresh each call)."""
    t = torch.randint(0, v, shape, device=DEVICE)
    if all_ignored:
        return torch.full_like(t, IGNORE)
    return torch.where(torch.rand(shape, device=DEVICE) < ignored, torch.full_like(t, IGNORE), t)


def with_hits(target, logits, share=0.5):
    """target with a random share of its rows not ignored set to the argmax of logits (..., V):
    a token accuracy near `share`, so that a kernel whose hits are all 0 or all 1 fails."""
    chosen = (torch.rand(target.shape, device=target.device) < share) & (target != IGNORE)
    return torch.where(chosen, logits.argmax(-1).to(target.dtype), target)


def target_of(*values, dtype=torch.int64):
    """A target of these class indices, on the device."""
    return torch.tensor(values, device=DEVICE, dtype=dtype)


def make_class_weight(v, dtype=torch.float32):
    """Class weights (V,) in [0.25, 2.0) (fresh each call): unequal, none zero (a weighted "mean"
    divides by the targets' weight sum)."""
    return (torch.rand(v, device=DEVICE) * 1.75 + 0.25).to(dtype)


def bad_target_message(value, v, ignore_index=IGNORE):
    """The losses' TargetError (ValueError, IndexError) for an out-of-range target: the argument,
    the value, V and ignore_index."""
    return f"target holds {value}, outside [0, V={v}) (and not ignore_index={ignore_index})"
