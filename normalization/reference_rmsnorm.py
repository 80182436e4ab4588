"""PyTorch references for RMSNorm and residual-add + RMSNorm.

The math runs in fp32 (or fp64 when given fp64 inputs, as the tests do) and is cast to the input
dtype once, as Hugging Face's GemmaRMSNorm does (its LlamaRMSNorm rounds x * rstd before the
weight multiplies it). These are the `eager` baselines of the benchmark too.
"""

import torch


def rmsnorm_ref(x, weight, eps=1e-6, offset=0.0):
    """y = x * rsqrt(mean(x^2, last dim) + eps) * (offset + weight), offset 1 being Gemma's form;
    y = x * rsqrt(...) when weight is None (offset ignored). x (..., N), weight (N,) -> y like x."""
    compute = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(compute)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (offset + weight.to(compute))
    return y.to(x.dtype)


def residual_rmsnorm_ref(x, residual, weight, eps=1e-6, offset=0.0):
    """u = x + residual rounded to x's dtype (the next block's skip), y = rmsnorm(u) -> (y, u)."""
    compute = torch.promote_types(x.dtype, torch.float32)
    u = (x.to(compute) + residual.to(compute)).to(x.dtype)
    return rmsnorm_ref(u, weight, eps, offset), u
