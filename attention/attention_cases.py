"""The tolerance of an attention output O = softmax(s) @ v computed as our kernels do, for
attention/test_flash_attention.py and, through inference/decode_cases.py, the decode tests.

Error model: scores and the softmax statistics are fp32, and p = exp(s - m) (m the running
max) is rounded to the input dtype before p @ v: each p_j gains a relative error d_j, |d_j| <= u
(unit roundoff: 2^-11 fp16, 2^-8 bf16), except the row's largest, exp(0) = 1, which is exact. So
the error of O[i, c] is sum_j p_j d_j v[j, c] (p normalised), with standard deviation
(u / sqrt(3)) * S[i, c] for independent roundings, S[i, c] = sqrt(sum_j p_j^2 v[j, c]^2) over all
j but the largest. Then O is rounded once: half an ulp, u * |O|.

Below the dtype's smallest normal number (fp16: 2^-14, a key about 10 units of score below the
row's max) p_j is subnormal and its rounding is absolute: at most half the subnormal spacing, h
(2^-25 in fp16; SUBNORMAL_HALF_SPACING), which is more than u * p_j there (a key of p_j = 1e-5
carries 0.3% error, not 0.05%). So each term's bound is e_j = max(u * p_j, min(p_j, h)), and
S[i, c] = sqrt(sum_j e_j^2 v[j, c]^2) / u: the same as above wherever p_j is normal. It matters
where a small p meets a large v (e4m3 caches whose scales spread over decades: one key of p 1e-5
and v -60 moved O by 2e-6 against a bound of 2.4e-6 without the subnormal term).

Tolerance: atol = P_ROUNDING_BOUND * u * S per element, rtol = u. The bound of 4 is 7 standard
deviations (no false alarm over the 10^7 values of the largest GPU cases), and at least the worst
case where one p carries the error (a row of two keys: |error| <= u * S). The fp32 steps add
~2^-24 relative: ATOL_FLOOR covers them where S is 0 (one key, or a one-hot row).
A bound tied to max|v| instead (u * max|v|) sits 4-11x above the real error of a long row, where
|O| ~ max|v| / sqrt(T): a 1% error in the softmax scale passed it in bf16. This one catches it.
"""
import torch

from llmk.devtools.testing import SUBNORMAL_HALF_SPACING, UNIT_ROUNDOFF, Tol

P_ROUNDING_BOUND = 4.0
ATOL_FLOOR = 1e-6


def attention_tol(dtype, p, v, shape):
    """Tol for O (of `shape`) in `dtype`. p: (..., Tq, Tk) softmax probabilities in fp64, rows
    summing to 1 (or 0: a query with no key); v: (..., Tk, D), zero where p is masked."""
    u = UNIT_ROUNDOFF[dtype]
    p = p.double().clone()
    p.scatter_(-1, p.argmax(-1, keepdim=True), 0.0)  # the row's largest p is exactly 1 before normalising
    # each p's rounding: relative u, or absolute (at most h, and at most p itself) where it is subnormal
    err = torch.maximum(u * p, p.clamp(max=SUBNORMAL_HALF_SPACING[dtype]))
    spread = (err.pow(2) @ v.double().pow(2)).sqrt()
    return Tol((P_ROUNDING_BOUND * spread + ATOL_FLOOR).reshape(shape), u,
               "p rounded to the input dtype before p @ v (a bound per element), O rounded once")
