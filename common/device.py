"""Where kernels run: a CUDA GPU when one is present, otherwise Triton's interpreter on the CPU.

`TRITON_INTERPRET` is read when `triton` is first imported, so this module sets it before that.
Setting `TRITON_INTERPRET=1` by hand forces the interpreter even on a GPU machine.
"""

import functools
import os
import re
import sys
import warnings
from importlib import metadata

import torch

_TRITON_CAME_FIRST = "triton" in sys.modules  # imported by someone else (transformers, torch) before us
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"

# The oldest Triton whose interpreter runs these kernels: 3.8's and older mishandle loops whose
# bounds are runtime values (every looped kernel here), which gives wrong results, not errors.
MIN_INTERPRETER_TRITON = (3, 9)


def interpreter_problem():
    """Why Triton's interpreter here cannot run our kernels (a sentence naming what to install), or
    None: the GPU path, or an interpreter new enough. torch's CUDA wheels pin their own Triton
    (torch 2.14's pins 3.8), so a CPU machine can end up with one too old."""
    if not INTERPRET:
        return None
    try:
        have = metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None  # triton's own import error says more
    if tuple(int(p) for p in re.findall(r"\d+", have)[:2]) >= MIN_INTERPRETER_TRITON:
        return None
    need = ".".join(map(str, MIN_INTERPRETER_TRITON))
    return (
        f"Triton {have} is installed, and its interpreter (the CPU path: no CUDA device here) "
        f"runs loops with runtime bounds wrongly; install Triton {need} or newer: "
        f'pip install "triton>={need}"'
    )


@functools.lru_cache(maxsize=None)
def sm_count(device, interpreter_sms):
    """Streaming multiprocessors of `device` (a torch.device, an index, or None for the current
    one). The interpreter has none: it returns `interpreter_sms`, which each kernel picks so that
    its small test shapes reach every path of its heuristics (split or not, and so on)."""
    if INTERPRET:
        return interpreter_sms
    return torch.cuda.get_device_properties(device).multi_processor_count


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


def _widen_bf16(data):
    """bf16 bit patterns (uint16) -> fp32 values; exact, bf16 is the top half of an fp32."""
    import numpy as np

    return (np.ascontiguousarray(data).astype(np.uint32) << 16).view(np.float32)


def _bf16_dot_as_values():
    """The interpreter keeps bf16 tensors as their uint16 bit patterns, and its tl.dot multiplies
    those patterns as integers. Widen bf16 operands to fp32 first (exact), as a tensor core reads
    them; every other dot is left to the interpreter."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_bf16_dot", False) or not hasattr(builder, "create_dot"):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, *args):
        if a.dtype.scalar == tl.bfloat16:
            a = interpreter.TensorHandle(_widen_bf16(a.data), tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = interpreter.TensorHandle(_widen_bf16(b.data), tl.float32)
        return original(self, a, b, d, *args)

    builder.create_dot = create_dot
    builder._bf16_dot = True


def _interpret_triton_builtins():
    """Triton reads TRITON_INTERPRET when a function is decorated. If triton was imported before
    this module set it, the @triton.jit functions of triton.language itself (tl.sum's combine
    function, tl.cdiv, ...) were built for the GPU, and an interpreted kernel that calls them fails
    ("Cannot call @triton.jit'd outside of the scope of a kernel"). Rebuild them as interpreted
    functions, one object for each, in every triton module that holds them."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    rebuilt = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton" or name.startswith("triton.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction) and not isinstance(value, InterpretedFunction):
                if id(value) not in rebuilt:
                    rebuilt[id(value)] = InterpretedFunction(
                        value.fn, do_not_specialize=value.do_not_specialize, noinline=value.noinline
                    )
                setattr(module, attr, rebuilt[id(value)])


def quiet_interpreter():
    """Numpy warns from inside interpreted kernels where fp32 math overflows or meets inf on purpose
    (exp2 of a masked -inf score, GELU's 2^t past fp32's range, 0 * inf in a masked lane), where the
    GPU computes the same IEEE results silently. Only warnings raised by the interpreter's own numpy
    calls are silenced; every other warning still shows."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")


if INTERPRET:
    # at import, not in each entry point: a user's first kernel call in the interpreter (the README's
    # example) would print numpy's warnings otherwise; the filter names the interpreter's module only
    quiet_interpreter()
    _problem = interpreter_problem()  # one metadata read: wrong results later would be worse than a warning now
    if _problem:
        warnings.warn(_problem, RuntimeWarning, stacklevel=2)
    if _TRITON_CAME_FIRST:
        _interpret_triton_builtins()
    _match_gpu_bf16_rounding()
    _bf16_dot_as_values()
