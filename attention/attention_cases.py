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
case where one p carries the error (a row of two keys: |error| <= u * S).
A bound tied to max|v| instead (u * max|v|) sits 4-11x above the real error of a long row, where
|O| ~ max|v| / sqrt(T): a 1% error in the softmax scale passed it in bf16. This one catches it.

The fp32 steps (the scores' sums, the sums of p and of p v, the division) add a few roundings of
2^-24 relative to the terms O sums: FP32_STEPS x sum_j p_j |v[j, c]| (eight roundings), plus
ATOL_FLOOR. Where |O| is large that is more than an absolute floor: a one-hot row of an e4m3
cache's spread values (|O| = 146) is 1.6e-5 off in fp32.

Scores far from 0 (keys whose scales spread over decades, as the e4m3 caches' tests make them: |s|
in the hundreds) carry the fp32 scores' own error: a sum of D products, off by ~sqrt(D) roundings
of sum_i |q_i k_ji| (times the scale), and the max subtracted, ~2^-24 (|s_j| + |m|). That moves
p_j relatively, and with it the sum of p, so O by p_j e_j (v_j - O); fp32_score_err gives e_j per
key, added in quadrature to p's rounding. On the e4m3 test's largest case an fp32 pipeline's O
(before its rounding, against the fp64 reference) sat up to 5-15x past the bound without the two
terms and at 0.25-0.33 of it with them; on an H200 one value in 4096 had gone past the whole
tolerance.
"""

import math

import torch

from llmk.devtools.testing import SUBNORMAL_HALF_SPACING, UNIT_ROUNDOFF, Tol

P_ROUNDING_BOUND = 4.0
ATOL_FLOOR = 1e-6
FP32_STEPS = 2.0**-21


def attention_tol(dtype, p, v, shape, score_err=None, weight_unit=None):
    """Tol for O (of `shape`) in `dtype`. p: (..., Tq, Tk) softmax probabilities in fp64, rows
    summing to 1 (or 0: a query with no key); v: (..., Tk, D), zero where p is masked. score_err:
    None, or (..., Tq, Tk) the relative error of each p from its fp32 score (fp32_score_err).
    weight_unit: None, or the relative rounding of every weight p v is summed with, the row's
    largest included (an e4m3 cache's products round p times its token's V scale, scaled into
    fp16's top binades, so no weight is exact and none is subnormal down to 2^-28 of the largest:
    inference/triton_inference_attention.py's module docstring)."""
    u = UNIT_ROUNDOFF[dtype]
    p_all, v = p.double(), v.double()
    o = p_all @ v
    # the fp32 steps' share, relative to the terms O sums
    fp32_share = FP32_STEPS * (p_all @ v.abs())
    if weight_unit is not None:
        err = weight_unit * p_all
    else:
        p = p_all.clone()
        p.scatter_(-1, p.argmax(-1, keepdim=True), 0.0)  # the row's largest p is exactly 1 before normalising
        # each p's rounding: relative u, or absolute (at most h, and at most p itself) where it is subnormal
        err = torch.maximum(u * p, p.clamp(max=SUBNORMAL_HALF_SPACING[dtype]))
    variance = err.pow(2) @ v.pow(2)
    if score_err is not None:
        # a score's error moves p_j in the sum of p too (p's rounding does not: the sum takes p
        # unrounded), so it moves O by p_j e_j (v_j - O): sum_j a_j (v_j - O)^2, a_j = (p_j e_j)^2.
        # The largest key's too: its own p stays 1, but its error shifts every other exponent,
        # which moves O by the same p_max e_max (v_max - O)
        a = (p_all * score_err).pow(2)
        variance = variance + a @ v.pow(2) - 2 * o * (a @ v) + o.pow(2) * a.sum(-1, keepdim=True)
    spread = variance.clamp_min(0.0).sqrt()
    return Tol(
        (P_ROUNDING_BOUND * spread + fp32_share + ATOL_FLOOR).reshape(shape),
        u,
        "p rounded to the input dtype before p @ v (a bound per element), O rounded once",
    )


def fp32_score_err(scores, magnitudes, d, softcap=None):
    """(..., Tq, Tk) relative error of each p from fp32 scores (the module's docstring): scores
    (..., Tq, Tk) in fp64, scaled as the softmax takes them but not capped (-inf where masked);
    magnitudes: the same with |q| . |k| for q . k; d: the products a score sums. softcap c: the
    scores become c tanh(s / c), which passes the products' error on times tanh's slope and adds
    its own few roundings, c 2^-22."""
    finite = scores.isfinite()
    s = scores.masked_fill(~finite, 0.0)
    extra = 0.0
    if softcap:
        t = torch.tanh(s / softcap)
        magnitudes, s, extra = magnitudes * (1.0 - t * t), softcap * t, softcap * 2.0**-22
    m = s.abs().amax(-1, keepdim=True)
    return (2.0**-24 * (math.sqrt(d) * magnitudes + s.abs() + m) + extra).masked_fill(~finite, 0.0)
