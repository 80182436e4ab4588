"""Where kernels run: a CUDA GPU when one is present, otherwise Triton's interpreter on the CPU.

`TRITON_INTERPRET` is read when `triton` is first imported, so this module sets it before that.
Setting `TRITON_INTERPRET=1` by hand forces the interpreter even on a GPU machine.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"


def describe() -> str:
    """One line naming the device the tests and benchmarks run on."""
    if INTERPRET:
        return "Triton interpreter on the CPU (small shapes only)"
    return torch.cuda.get_device_name()


def _round_fp32_to_bf16(data):
    """fp32 array -> bf16 bit patterns (uint16), rounded to nearest even as the GPU's cvt.rn does."""
    import numpy as np

    bits = np.ascontiguousarray(data, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(data), np.uint16(0x7FC0), rounded)


def _match_gpu_bf16_rounding():
    """Triton's interpreter truncates fp32 -> bf16 where the GPU rounds to nearest even, which puts
    every bf16 result up to a whole ulp off in the CPU lane. Route that one cast through
    `_round_fp32_to_bf16`; every other cast is left to the interpreter."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_bf16_rne", False) or not hasattr(builder, "cast_impl"):
        return
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_round_fp32_to_bf16(src.data), tl.bfloat16)
        return original(self, src, dst_type)

    builder.cast_impl = cast_impl
    builder._bf16_rne = True


if INTERPRET:
    _match_gpu_bf16_rounding()
