"""The reference, tolerance and PyTorch comparison of a product act(a @ b + bias), for
gemm/test_matmul.py and gemm/test_gemv.py.

Tolerance (per element, against the fp64 reference): the inputs are exact, and a product of two
fp16 or bf16 values is exact in fp32, so the only errors are the fp32 accumulation over K and the
one final rounding to the output dtype.
- rtol: that final rounding, half an ulp, and an ulp where summation order flips it: 2^-10
  (fp16), 2^-7 (bf16), as in devtools.testing.TOLERANCES.
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

from llmk.devtools.testing import TOLERANCES, UNIT_ROUNDOFF, Tol

TORCH_ACTIVATIONS = {
    None: lambda y: y,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "silu": F.silu,
}


def tolerance(a, b):
    """Tol for a @ b in a's dtype; see the module docstring."""
    k = a.shape[1]
    rms = lambda t: t.double().pow(2).mean().sqrt().item() if t.numel() else 0.0  # noqa: E731
    typical = math.sqrt(k) * rms(a) * rms(b)
    atol = max(1e-5, math.sqrt(k) * typical * 2**-20)
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


def sum_scale(ref, min_count=16):
    """The typical size of each element of `ref`, a matrix of sums (a gradient), as a tensor of its
    shape: the root-sum-square of an element's terms, which the element itself is on average.
    Its rows and columns carry the scales of the operands (a norm weight scales a column of h, so
    dweight = dy^T @ h has columns that much larger than the rest), so the estimate is
    rms(row) * rms(column) / rms(all), floored at rms(all). A row or column of fewer than
    `min_count` values is too few to estimate from; that side uses rms(all). 1-D: rms(all)."""
    r = ref.detach().double()
    overall = r.pow(2).mean().sqrt()
    if r.dim() < 2 or overall == 0:
        return overall.expand(r.shape)
    m = r.reshape(-1, r.shape[-1])
    rows = m.pow(2).mean(1, keepdim=True).sqrt() if m.shape[1] >= min_count else overall.expand(m.shape[0], 1)
    cols = m.pow(2).mean(0, keepdim=True).sqrt() if m.shape[0] >= min_count else overall.expand(1, m.shape[1])
    return torch.maximum(rows * cols / overall, overall).reshape(r.shape)


def grad_tolerance(dtype, scales=None):
    """Tol of a gradient of `dtype` against its fp64 reference (check_grads calls it per gradient).
    scales: {gradient name: T, per element} where the caller computes each element's T itself
    (moe/reference_moe.py's experts_grad_scales); else T is sum_scale's estimate.
    da = dz @ b^T and db = a^T @ dz are products whose K-long inputs each carry a rounding or two
    of relative size u (2^-11 fp16, 2^-8 bf16): dz's own, and z's in the forward, which moves
    act'(z) by about as much. With random signs these add up to about u / sqrt(3) times the
    root-sum-square of an element's terms, T (sum_scale: the element's row and column scale):
    sqrt(2/3) u T for two roundings, whose largest of a million is near 5.5 standard deviations,
    4.5 u T. atol = 8 u T per element; rtol the final rounding (one ulp, devtools.testing.TOLERANCES).
    dbias is such a sum over the rows; so are rmsnorm_linear's gradients (dweight = dy^T @ h, whose
    columns norm_weight scales; dh = dy @ weight, then the RMSNorm backward's sums over dh * x).
    fp32 accumulation (sqrt(K) 2^-24 T, tolerance() above) is below 2^-8 u T for any K up to 2^32.
    The 2x-PyTorch rule is the tighter guard."""

    def tol(name, ref):
        if not ref.numel():
            return Tol(1e-5, TOLERANCES[dtype].rtol, "empty")
        scale = sum_scale(ref) if scales is None else scales[name]
        atol = (8 * UNIT_ROUNDOFF[dtype] * scale).clamp_min(1e-5)
        return Tol(atol, TOLERANCES[dtype].rtol, "one or two roundings of each input of the sums, one of the output")

    return tol
