"""Targets shared by losses/test_cross_entropy.py and losses/test_fused_linear_cross_entropy.py."""
import torch

from common.device import DEVICE

IGNORE = -100  # the losses' default ignore_index, as F.cross_entropy's


def make_target(shape, v, ignored=0.25, all_ignored=False):
    """Class indices in [0, V), a share of them IGNORE (fresh each call)."""
    t = torch.randint(0, v, shape, device=DEVICE)
    if all_ignored:
        return torch.full_like(t, IGNORE)
    return torch.where(torch.rand(shape, device=DEVICE) < ignored, torch.full_like(t, IGNORE), t)
