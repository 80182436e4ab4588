"""PyTorch reference for LayerNorm over the last dim, as `F.layer_norm` defines it.

Biased variance, two passes (mean, then centred squares) so large offsets do not cancel; the math
runs in fp32 (fp64 for fp64 inputs) and is cast to the input dtype once.
"""

import torch


def layernorm_ref(x, weight=None, bias=None, eps=1e-5):
    """y = (x - mean) * rsqrt(var + eps) * weight + bias.   x (..., N); weight, bias (N,) or None."""
    compute = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(compute)
    centred = xf - xf.mean(-1, keepdim=True)
    y = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(compute)
    if bias is not None:
        y = y + bias.to(compute)
    return y.to(x.dtype)
