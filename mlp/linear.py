"""PyTorch references for the MLP's linear layers, weight in nn.Linear's layout.

    y = x @ weight.T + bias        x (..., K), weight (N, K), bias (N,) or None -> y (..., N)

`linear_ref` is what nn.Linear computes (F.linear: one GEMM in x's dtype with fp32 accumulation,
the bias added in its epilogue). `linear_fp32` does the same math in fp32 (fp64 for fp64 inputs)
and leaves the result there, so a reference can apply an activation before its one rounding.
"""
import torch
import torch.nn.functional as F


def linear_ref(x, weight, bias=None):
    """nn.Linear's forward in x's dtype.   x (..., K), weight (N, K), bias (N,) -> (..., N)."""
    return F.linear(x, weight, bias)


def linear_fp32(x, weight, bias=None):
    """x @ weight.T + bias in fp32 (fp64 if any input is fp64), not rounded back to x's dtype.
    x (..., K), weight (N, K), bias (N,) or None -> (..., N) fp32 or fp64."""
    compute = torch.promote_types(torch.promote_types(x.dtype, weight.dtype), torch.float32)
    y = x.to(compute) @ weight.to(compute).T
    return y + bias.to(compute) if bias is not None else y
