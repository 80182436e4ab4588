"""The reference, tolerance and PyTorch comparison of a product act(a @ b + bias), for
gemm/test_matmul.py and gemm/test_gemv.py.

Tolerance (per element, against the fp64 reference): the inputs are exact, and a product of two
fp16 or bf16 values is exact in fp32, so the only errors are the fp32 accumulation over K and the
one final rounding to the output dtype.
- rtol: that final rounding, half an ulp, and an ulp where summation order flips it: 2^-10
  (fp16), 2^-7 (bf16), as in common.testing.TOLERANCES.
- atol: for outputs near zero, where the relative bound means nothing. K fp32 additions each
  round by at most 2^-24 of a partial sum, and partial sums are of the size of a typical output,
  T = sqrt(K) * rms(a) * rms(b) for independent inputs; as a random walk they add up to about
  sqrt(K) * 2^-24 * T. The bound is 16x that, sqrt(K) * T * 2^-20: room for the tensor cores'
  internal alignment (truncating, not rounding) and for the maximum over many elements.
The 2x-PyTorch rule is the main guard: our largest error may be at most twice torch.matmul's
own (one more rounding for each separate bias or activation op) plus atol.
"""
import math

import torch
import torch.nn.functional as F

from common.testing import TOLERANCES, Tol

TORCH_ACTIVATIONS = {None: lambda y: y, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
                     "silu": F.silu}


def tolerance(a, b):
    """Tol for a @ b in a's dtype; see the module docstring."""
    k = a.shape[1]
    rms = lambda t: t.double().pow(2).mean().sqrt().item() if t.numel() else 0.0  # noqa: E731
    typical = math.sqrt(k) * rms(a) * rms(b)
    atol = max(1e-5, math.sqrt(k) * typical * 2 ** -20)
    return Tol(atol, TOLERANCES[a.dtype].rtol, "fp32 accumulation over K, one rounding")


def reference(a, b, bias, activation):
    """fp64 math on the same inputs: act(a @ b + bias)."""
    y = a.double() @ b.double()
    if bias is not None:
        y = y + bias.double()
    return TORCH_ACTIVATIONS[activation](y)


def torch_same_dtype(a, b, bias, activation):
    """PyTorch in the inputs' dtype: matmul, then the bias add and the activation as separate ops."""
    y = torch.matmul(a, b)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return TORCH_ACTIVATIONS[activation](y)
