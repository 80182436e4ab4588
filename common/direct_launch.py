"""Launching a kernel Triton has already compiled, without JITFunction.run's binding and
specializing of every argument (tens of microseconds of host time a launch on a Hopper's host).

Two ways in:
- run_compiled: for launchers that keep the compiled kernel of each specialization themselves, by
  a key that fixes everything the specialization depends on (optimizers/triton_adam.py,
  attention/gluon_flash_attention_fwd.py);
- Launcher: `Launcher(kernel)[grid](*args, **constexprs, num_warps=...)`, the same call as
  `kernel[grid](...)`, with the key read off the arguments by specialization_key (the FP8 kernels
  in gemm/, which run a few hundred launches a training step).

The call is the one JITFunction.run makes once it has found the kernel in its cache (Triton 3.6 to
3.9). In the interpreter every launch goes through the kernel as usual.
"""
import torch
from triton import knobs
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from llmk.common.device import INTERPRET

INT32 = (-2 ** 31, 2 ** 31)
INT64_MAX = 2 ** 63 - 1


def run_compiled(kernel, grid, device_index, args):
    """Launch compiled `kernel` (what `jit_fn[grid](...)` returned) on `grid` (1 to 3 dims) on the
    current stream of device `device_index`, the current device. args: every parameter's value
    in the kernel's order, constexprs included (they follow the others in this repository's
    kernels), as JITFunction.run passes its bound arguments."""
    stream = driver.active.get_current_stream(device_index)
    gx, gy, gz = (*grid, 1, 1)[:3]
    kernel.run(gx, gy, gz, stream, kernel.function, kernel.packed_metadata,
               kernel.launch_metadata(grid, stream, *args), knobs.runtime.launch_enter_hook,
               knobs.runtime.launch_exit_hook, *args)


def arg_key(x):
    """What Triton 3.6-3.9 specializes a kernel on for one non-constexpr argument, or finer: a
    tensor's dtype and whether its base is 16-byte aligned; an int's width (int32, int64 or
    uint64), whether it is 1 and whether 16 divides it; a descriptor's dtype, block shape and
    padding; the type of anything else (a float, numpy's too, is fp32, a bool u1, None a constexpr
    None).
    common/test_direct_launch.py holds it against Triton's own specializer."""
    if isinstance(x, torch.Tensor):
        return x.dtype, x.data_ptr() % 16 == 0
    kind = type(x)
    if kind is int:
        width = 32 if INT32[0] <= x < INT32[1] else 64 if x <= INT64_MAX else 65
        return width, x == 1, x % 16 == 0
    if kind is TensorDescriptor:
        return x.base.dtype, tuple(x.block_shape), x.padding
    if isinstance(x, float):  # numpy's float64 too: Triton passes every float as fp32
        return float
    if kind is bool or x is None:
        return kind
    raise TypeError(f"a direct launch takes tensors, ints, floats, bools, None and TensorDescriptors; got {kind}")


def specialization_key(args):
    """arg_key of each of `args`, as one tuple."""
    return tuple(map(arg_key, args))


class Launcher:
    """`Launcher(kernel)[grid](*args, **keywords)` launches `kernel` as `kernel[grid](*args,
    **keywords)` does: args its non-constexpr parameters in order, keywords its constexprs and
    compile options. The first launch of a specialization (specialization_key of args, the
    keywords, the device, the two knobs JITFunction.run folds into its options) goes through
    Triton and keeps what it compiled; the next ones are run_compiled's. The kernel's constexpr
    parameters must follow its others (checked at the first launch)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled = {}
        self._constexprs = None  # ((name, default), ...) of the constexpr parameters, in order

    def __getitem__(self, grid):
        return lambda *args, **keywords: self.launch(grid, args, keywords)

    def launch(self, grid, args, keywords):
        if INTERPRET:
            self.kernel[grid](*args, **keywords)
            return
        device = driver.active.get_current_device()
        key = (device, specialization_key(args), tuple(keywords.items()), knobs.runtime.debug,
               knobs.compilation.instrumentation_mode)
        compiled = self._compiled.get(key)
        if compiled is None:
            self._check_order(len(args))
            self._compiled[key] = self.kernel[grid](*args, **keywords)
            return
        constexprs = tuple(keywords.get(name, default) for name, default in self._constexprs)
        run_compiled(compiled, grid, device, (*args, *constexprs))

    def _check_order(self, n_args):
        if self._constexprs is not None:
            return
        params = self.kernel.params
        n_plain = sum(not p.is_constexpr for p in params)
        if any(p.is_constexpr for p in params[:n_plain]) or n_args != n_plain:
            raise TypeError(f"Launcher({self.kernel.fn.__name__}): pass the {n_plain} non-constexpr parameters by "
                            f"position ({n_args} given) and the constexprs, which must follow them, by name")
        self._constexprs = tuple((p.name, p.default) for p in params[n_plain:])
