"""Argument checks of the gated MLP activations (SwiGLU and GeGLU; the Triton kernels and the CUDA
comparison in cuda_cpp/)."""

from llmk.common.validation import check_same_device, check_tensor


def check_swiglu_args(gate, up):
    """Argument checks of SwiGLU (Triton and CUDA): gate and up of one shape, dtype and device."""
    check_tensor("gate", gate)
    check_tensor("up", up)
    check_same_device("up", up, "gate", gate)
    if up.dtype != gate.dtype:
        raise TypeError(f"up must have gate's dtype {gate.dtype}; got {up.dtype}")
    if up.shape != gate.shape:
        raise ValueError(f"up must have gate's shape {tuple(gate.shape)}; got {tuple(up.shape)}")
