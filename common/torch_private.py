"""The private PyTorch APIs the runtime relies on, in one place, each read once at import: a torch
that renames one fails here, naming it, rather than inside a call. Tested with torch 2.11 (the
GPU's), 2.13 (the pinned CPU lane) and 2.14.1 (CI's newest lane).

    after_autograd_keyset   common/ops.py: a forward-only op's autograd kernel redispatches below
                            autograd with it
    dispatch_mode_depth()   common/ops.py, the fused loss: how many Python dispatch modes
                            (FakeTensorMode, TorchDispatchMode) are active; calls under one go
                            through the dispatcher
    functorch_active()      common/ops.py, the fused loss: a functorch transform (vmap, grad) is
                            active
    unwrap_dead_wrappers    common/ops.py: what autograd.Function.apply's Python layer does to
                            its arguments, for the eager path that skips that layer
    raw_cuda_stream(index)  common/workspace.py: the current CUDA stream's handle without building
                            a torch.cuda.Stream (~5 us of host time); None in a CPU build
    function_apply(fn)      common/ops.py: an autograd.Function's apply below its Python layer (the
                            C++ torch._C._FunctionBase.apply), for calls that pass every argument
    schema_arguments(op)    common/ops.py: an OpOverload's schema arguments (name, default), which
                            bind an operator's arguments by name
"""

import torch
import torch._functorch.utils

after_autograd_keyset = torch._C._after_autograd_keyset
dispatch_mode_depth = torch._C._len_torch_dispatch_stack
functorch_active = torch._C._are_functorch_transforms_active
unwrap_dead_wrappers = torch._functorch.utils.unwrap_dead_wrappers
raw_cuda_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # a CPU build has none


def function_apply(function):
    """autograd.Function `function`'s apply without the Python layer that binds its arguments to
    forward's signature (the bound C++ _FunctionBase.apply)."""
    return super(torch.autograd.Function, function).apply


def schema_arguments(overload):
    """The arguments of OpOverload `overload`'s schema (each with .name, .has_default_value(),
    .default_value)."""
    return overload._schema.arguments
