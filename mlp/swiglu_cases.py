"""SwiGLU inputs shared by mlp/test_swiglu.py and cuda_cpp/test_cuda_kernels.py."""
from llmk.common.testing import rand


def inputs(shape, dtype, layout, pad, gate_scale, up_scale):
    """gate, up of `shape` laid out as:
    separate    two tensors (gate a strided view when pad is given)
    fused       the two halves of one (..., 2I) buffer, as a fused gate/up projection returns them
    transposed  2-D views whose last dim is strided (copied once by the launcher)"""
    n = shape[-1]
    if layout == "fused":
        h = rand((*shape[:-1], 2 * n), dtype)
        return h[..., :n], h[..., n:]
    if layout == "transposed":
        return rand(shape[::-1], dtype).t(), rand(shape[::-1], dtype).t()
    return rand(shape, dtype, pad=pad, scale=gate_scale), rand(shape, dtype, scale=up_scale)
