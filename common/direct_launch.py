"""Launching a kernel Triton has already compiled, without JITFunction.run's binding and
specializing of every argument (tens of microseconds of host time a launch on a Hopper's host):
for launchers that keep the compiled kernel of each specialization themselves, by a key that
fixes everything the specialization depends on (optimizers/triton_adam.py,
attention/gluon_flash_attention_fwd.py). The call is the one JITFunction.run makes once it has
found the kernel in its cache (Triton 3.6 to 3.9).
"""
from triton import knobs
from triton.runtime import driver


def run_compiled(kernel, grid, device_index, args):
    """Launch compiled `kernel` (what `jit_fn[grid](...)` returned) on `grid` (a 1-tuple) on the
    current stream of device `device_index`, the current device. args: every parameter's value
    in the kernel's order, constexprs included (they follow the others in this repository's
    kernels), as JITFunction.run passes its bound arguments."""
    stream = driver.active.get_current_stream(device_index)
    kernel.run(grid[0], 1, 1, stream, kernel.function, kernel.packed_metadata,
               kernel.launch_metadata(grid, stream, *args), knobs.runtime.launch_enter_hook,
               knobs.runtime.launch_exit_hook, *args)
