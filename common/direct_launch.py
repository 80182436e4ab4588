"""Launching a kernel Triton has already compiled, without JITFunction.run's binding and
specializing of every argument: on the H200's host a 13-argument kernel costs 15 us through
JITFunction.run and 7.5 launched directly, plus the key (docs/tuning/host.md).

Two ways in:
- run_compiled: for launchers that keep the compiled kernel of each specialization themselves, by
  a key that fixes everything the specialization depends on (optimizers/triton_adam.py,
  attention/gluon_flash_attention_fwd.py);
- Launcher: `Launcher(kernel)[grid](*args, **constexprs, num_warps=...)`, the same call as
  `kernel[grid](...)`, with the key read off the arguments by specialization_key (the FP8 kernels
  in gemm/, which run a few hundred launches a training step; the norms, whose host time is their
  cost at decode and micro-batch sizes).

The call is the one JITFunction.run makes once it has found the kernel in its cache (Triton 3.6 to
3.9). In the interpreter every launch goes through the kernel as usual.
"""

import inspect

import torch
from triton import knobs
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from llmk.common.device import INTERPRET

INT32 = (-(2**31), 2**31)
INT64_MAX = 2**63 - 1


def run_compiled(kernel, grid, device_index, args):
    """Launch compiled `kernel` (what `jit_fn[grid](...)` returned) on `grid` (1 to 3 dims) on the
    current stream of device `device_index`, the current device. args: every parameter's value
    in the kernel's order, constexprs included (they follow the others in this repository's
    kernels), as JITFunction.run passes its bound arguments."""
    stream = driver.active.get_current_stream(device_index)
    gx, gy, gz = (*grid, 1, 1)[:3]
    kernel.run(
        gx,
        gy,
        gz,
        stream,
        kernel.function,
        kernel.packed_metadata,
        kernel.launch_metadata(grid, stream, *args),
        knobs.runtime.launch_enter_hook,
        knobs.runtime.launch_exit_hook,
        *args,
    )


_TENSORS = (torch.Tensor, torch.nn.Parameter)


def arg_key(x):
    """What Triton 3.6-3.9 specializes a kernel on for one non-constexpr argument, or finer: a
    tensor's dtype and whether its base is 16-byte aligned; an int's width (int32, int64 or
    uint64), whether it is 1 and whether 16 divides it; a descriptor's dtype, block shape and
    padding; the type of anything else (a float, numpy's too, is fp32, a bool u1, None a constexpr
    None).
    common/test_direct_launch.py holds it against Triton's own specializer. The checks run in the
    order the arguments are most common (a launch keys a dozen of them: its host time counts)."""
    kind = type(x)
    if kind is int:  # width, == 1 and divisible by 16, as one small int
        width = 0 if INT32[0] <= x < INT32[1] else 4 if x <= INT64_MAX else 8
        return width | (x == 1) | (not x & 15) << 1
    if kind in _TENSORS or isinstance(x, torch.Tensor):
        return x.dtype, not x.data_ptr() & 15
    if kind is TensorDescriptor:
        return x.base.dtype, tuple(x.block_shape), x.padding
    if isinstance(x, float):  # numpy's float64 too: Triton passes every float as fp32
        return float
    if kind is bool or x is None:
        return kind
    raise TypeError(f"a direct launch takes tensors, ints, floats, bools, None and TensorDescriptors; got {kind}")


def specialization_key(args):
    """arg_key of each of `args`, as one tuple. The two commonest kinds, a size or stride below 2^31
    and a plain tensor, are keyed inline as arg_key keys them: without a call an argument, a
    30-argument launch's key costs a fifth less."""
    return tuple(
        [
            (a == 1) | (not a & 15) << 1
            if type(a) is int and 0 <= a < INT32[1]
            else (a.dtype, not a.data_ptr() & 15)
            if type(a) is torch.Tensor
            else arg_key(a)
            for a in args
        ]
    )


class Launcher:
    """`Launcher(kernel)[grid](*args, **keywords)` launches `kernel` as `kernel[grid](*args,
    **keywords)` does: args its first parameters in order (constexprs among them too, as the norms'
    looped kernels take their row length), keywords the parameters after those (constexprs) and
    compile options. The first launch of a specialization (arg_key of each non-constexpr argument,
    the type and value of each constexpr among them, the keywords, the device, the two knobs
    JITFunction.run folds into its options) goes through Triton and keeps what it compiled; the
    next ones are run_compiled's. Every non-constexpr parameter must be passed by position (checked at the
    first launch of each count of positional arguments)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled = {}  # key -> (compiled kernel, the values of the parameters after args)
        self._layouts = {}  # len(args) -> the positions of the constexprs among args, a frozenset

    def __getitem__(self, grid):
        return lambda *args, **keywords: self.launch(grid, args, keywords)

    def launch(self, grid, args, keywords):
        fixed = self._layouts.get(len(args))
        if fixed is None:  # checked in the interpreter too, so that CI sees a call a GPU would refuse
            fixed = self._layout(len(args))
        if INTERPRET:
            self.kernel[grid](*args, **keywords)
            return
        device = driver.active.get_current_device()
        # a constexpr among args is keyed by its type and value (a str, which arg_key refuses; True,
        # which Triton compiles apart from 1)
        spec = (
            tuple([(type(a), a) if i in fixed else arg_key(a) for i, a in enumerate(args)])
            if fixed
            else specialization_key(args)
        )
        key = (device, spec, tuple(keywords.items()), knobs.runtime.debug, knobs.compilation.instrumentation_mode)
        found = self._compiled.get(key)
        if found is None:
            # the values of the parameters after args, in the kernel's order: the key fixes them
            rest = tuple(keywords.get(p.name, p.default) for p in self.kernel.params[len(args) :])
            self._compiled[key] = self.kernel[grid](*args, **keywords), rest
            return
        compiled, rest = found
        run_compiled(compiled, grid, device, (*args, *rest))

    def _layout(self, n_args):
        params = _parameters(self.kernel)
        late = [name for name, constexpr in params[n_args:] if not constexpr]
        if late or n_args > len(params):
            raise TypeError(
                f"Launcher({self.kernel.fn.__name__}): pass every non-constexpr parameter by position "
                f"({n_args} given; {', '.join(late) or 'too many'} after them)"
            )
        self._layouts[n_args] = fixed = frozenset(i for i, (_, constexpr) in enumerate(params[:n_args]) if constexpr)
        return fixed


def _parameters(kernel):
    """(name, whether a constexpr) of each of kernel's parameters, in order: from a JITFunction's
    params, or from the signature of the function the interpreter's InterpretedFunction wraps
    (it has no params), read as Triton reads it (an annotation that names constexpr)."""
    if hasattr(kernel, "params"):
        return [(p.name, p.is_constexpr) for p in kernel.params]
    return [(name, "constexpr" in str(p.annotation)) for name, p in inspect.signature(kernel.fn).parameters.items()]
