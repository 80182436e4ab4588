"""What the FP8 tests share (gemm/test_fp8.py, gemm/test_fp8_producers.py): e4m3 buffers poisoned
with NaN, and their comparison byte for byte."""

import torch

from llmk.common.device import DEVICE
from llmk.devtools.testing import Outcome
from llmk.gemm.fp8_ops import FP8

FP8_NAN = 0x7F  # e4m3fn's NaN byte: a poisoned q


def poisoned_fp8(shape):
    return torch.full(shape, FP8_NAN, dtype=torch.uint8, device=DEVICE).view(FP8)


def nan_as_one(t):
    """e4m3 bytes with both NaN encodings (0x7F, 0xFF: the sign of a NaN) as 0x7F."""
    b = t.view(torch.uint8)
    return torch.where(b & 0x7F == 0x7F, torch.full_like(b, 0x7F), b)


def same_bits(check, got, want):
    """EXACT comparison of e4m3 tensors by their bytes (a NaN's sign aside)."""
    if tuple(got.shape) != tuple(want.shape):
        return Outcome(check, False, note=f"shape {tuple(got.shape)} != {tuple(want.shape)}")
    bad = int((nan_as_one(got) != nan_as_one(want)).sum())
    return Outcome(check, bad == 0, bad=f"{bad}/{want.numel()}")
