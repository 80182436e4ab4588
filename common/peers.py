"""Peer libraries as benchmark providers, where they are installed.

Liger-Kernel is not a dependency: on a GPU machine without network it travels as a wheel
(`pip download liger-kernel==0.8.5 --no-deps`, installed with `pip install --no-deps --target`),
and where it is missing its rows are reported as skipped, with the reason.
"""
import importlib

LIGER = "liger"  # the provider name of Liger-Kernel's rows


def liger(module, attr):
    """Liger-Kernel's `liger_kernel.ops.<module>.<attr>` (an autograd.Function's apply, a function),
    or, where it cannot be imported, a one-line reason: the harness skips a provider given as a string."""
    try:
        mod = importlib.import_module(f"liger_kernel.ops.{module}")
    except Exception as e:  # not installed, or it needs what this machine lacks (a GPU, a Triton build)
        return f"liger-kernel unavailable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:90]
    return getattr(mod, attr)
