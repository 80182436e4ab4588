"""Triton device code that kernels of every folder share: column masks, math constants and the
activations (GELU, SiLU) a fused epilogue or a gated unit applies, and their derivatives. One
definition each, so every kernel rounds the same way. The SM count the launch heuristics take is
host code: common.device.sm_count.

LOG2E and LN2 are tl.constexpr so a kernel can use them as globals (Triton compiles no other
global); host code takes .value, as softcap_scales does (the softcap's launch arguments, one
definition for the attention and decode launchers).
"""

import triton
import triton.language as tl

from llmk.common.device import INTERPRET

LOG2E = tl.constexpr(1.4426950408889634)  # exp(t) = exp2(t * log2(e)): exp2 is one instruction
LN2 = tl.constexpr(0.6931471805599453)  # log(t) = log2(t) * ln(2)


def softcap_scales(scale, softcap):
    """(qk_scale, softcap_log2, SOFTCAP) the kernels take: without softcap, qk_scale = sm_scale *
    log2(e) (scores in exp2's units); with it, qk_scale = sm_scale / c (tanh's argument) and
    softcap_log2 = c * log2(e)."""
    if softcap:
        return scale / softcap, softcap * LOG2E.value, True
    return scale * LOG2E.value, 0.0, False


@triton.jit
def col_mask(cols, n_cols, EVEN_N: tl.constexpr):
    """cols < n_cols, or a constant True when every chunk is full: the compiler then drops the
    predicate from every load and store (worth 5-10% on the looped norm and softmax kernels)."""
    if EVEN_N:
        return tl.full(cols.shape, True, tl.int1)
    return cols < n_cols


@triton.jit
def gelu(z, TANH: tl.constexpr):
    """GELU of fp32 values: exact (z * Phi(z)) or the tanh approximation. Neither calls erf or tanh:
    0.5 * z * (1 + erf(z / sqrt(2))) loses most of its digits to 1 + erf(.) for z < -2, and
    libdevice's erf doubles the instruction count of a bandwidth-bound kernel."""
    if TANH:
        # 0.5 * (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + 2^(z * (K1 + K3 * z^2))) with the constants
        # folded: K1 = -2 * sqrt(2/pi) * log2(e), K3 = 0.044715 * K1. No cancellation where
        # tanh(u) -> -1, and for large finite |z|, where 2^(.) or z^3 overflows to inf, the
        # result is exactly -0 or z.
        t = z * tl.fma(-0.1029432395800235, z * z, -2.302208198144325)
        return z / (1.0 + tl.exp2(t))
    else:
        # z * Phi(z) = relu(z) - |z| * Phi(-|z|) for either sign of z, and Phi(-a) = 2^q(a) with
        # q(a) ~ log2(Phi(-a)) a degree-9 polynomial on [0, 5.5] (least squares at Chebyshev points,
        # reweighted towards minimax): |error| < 1.3e-6 in q, 9e-7 relative in Phi(-a); in fp32
        # the relative error of y stays under 3e-6 where |y| > 1e-4. Past a = 5.5,
        # |z| * Phi(-|z|) < 1.1e-7 and y = relu(z) exactly. Explicit fma: one instruction a step.
        a = tl.abs(z)
        relu = tl.maximum(z, 0.0)
        # a NaN z fails the test and takes the second branch, where a * 2^q(a) carries it to y
        return tl.where(a >= 5.5, relu, tl.fma(-a, tl.exp2(_log2_normal_tail(a)), relu))


@triton.jit
def _log2_normal_tail(a):
    """q(a) ~ log2(Phi(-a)) for fp32 a in [0, 5.5] (gelu's exact form, and its derivative)."""
    q = tl.fma(7.855826e-08, a, -2.0426723e-06)
    q = tl.fma(q, a, 2.0293202e-05)
    q = tl.fma(q, a, -6.755226e-05)
    q = tl.fma(q, a, -0.0004920478)
    q = tl.fma(q, a, 0.0076362845)
    q = tl.fma(q, a, -0.052991785)
    q = tl.fma(q, a, -0.45899916)
    q = tl.fma(q, a, -1.1511385)
    return tl.fma(q, a, -0.9999991)


@triton.jit
def gelu_grad(z, TANH: tl.constexpr):
    """d gelu(z) / dz of fp32 values, for gelu's two forms (the same polynomial and constants).
        exact: Phi(z) + z * phi(z), phi(z) = exp(-z^2 / 2) / sqrt(2 pi)
        tanh:  s + z * s * (1 - s) * 2 * sqrt(2/pi) * (1 + 3 * 0.044715 * z^2), s = sigmoid(2u)
    Large finite |z| gives exactly 0 or 1, never NaN; a NaN z gives NaN."""
    if TANH:
        e = tl.exp2(z * tl.fma(-0.1029432395800235, z * z, -2.302208198144325))
        s = 1.0 / (1.0 + e)
        # s * (1 - s) as e * s * s: no cancellation in 1 - s where s -> 1. Where s saturates w is 0
        # (or NaN, inf * 0, where e = inf) and z^3 may be inf: the slope term is then 0, not NaN
        w = e * s * s
        slope = tl.where(w > 0.0, z * w * tl.fma(0.21406444881780073, z * z, 1.5957691216057308), 0.0)
        return s + slope
    else:
        a = tl.abs(z)
        # Phi(-a) = 2^q(a); past a = 5.5 it is below 1.9e-8 and taken as 0 (q is fitted to 5.5 only)
        tail = tl.where(a >= 5.5, 0.0, tl.exp2(_log2_normal_tail(a)))
        cdf = tl.where(z >= 0.0, 1.0 - tail, tail)
        # phi(z) = 2^(-z^2 * log2(e) / 2) / sqrt(2 pi); z^2 = inf gives 0, not NaN
        return tl.fma(z * tl.exp2(z * z * -0.7213475204444817), 0.3989422804014327, cdf)


@triton.jit
def silu(x):
    """x * sigmoid(x) of fp32 values; a large negative x gives exp(-x) = inf and -0, never NaN."""
    return x / (1.0 + tl.exp(-x))


@triton.jit
def silu_grad(x):
    """d silu(x) / dx = s * (1 + x * (1 - s)), s = sigmoid(x), of fp32 values; a large negative x
    gives s = 0 and -0 (as silu does), a large positive one 1."""
    s = 1.0 / (1.0 + tl.exp(-x))
    return s * (1.0 + x * (1.0 - s))


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    """A fused epilogue's activation on an fp32 tile: None, "gelu", "gelu_tanh" or "silu"."""
    if ACTIVATION == "gelu":
        x = gelu(x, False)
    elif ACTIVATION == "gelu_tanh":
        x = gelu(x, True)
    elif ACTIVATION == "silu":
        x = silu(x)
    return x


@triton.jit
def activate_grad(x, ACTIVATION: tl.constexpr):
    """d activate(x, ACTIVATION) / dx of an fp32 tile, for "gelu", "gelu_tanh" or "silu" (a gated
    unit's backward); any other ACTIVATION fails to compile."""
    if ACTIVATION == "gelu":
        d = gelu_grad(x, False)
    elif ACTIVATION == "gelu_tanh":
        d = gelu_grad(x, True)
    else:
        tl.static_assert(ACTIVATION == "silu", "activate_grad: ACTIVATION must be 'gelu', 'gelu_tanh' or 'silu'")
        d = silu_grad(x)
    return d


@triton.jit
def tanh(x):
    """tanh of fp32 values by one exp2: 1 - 2 / (e^(2x) + 1). Past |x| ~ 44 e^(2x) is inf or 0 and
    the result exactly 1 or -1, never NaN; near 0 the absolute error is an fp32 unit of 1 (~6e-8),
    which c * tanh turns into c * 6e-8 of a score. (Triton's libdevice tanh moved between
    versions, and the interpreter lacks it.)"""
    return 1.0 - 2.0 / (tl.math.exp2(x * (2.0 * LOG2E)) + 1.0)


# tanh.approx.f32 (PTX, sm_75 and later) is one MUFU instruction where tanh() spends two (an exp2
# and the division's reciprocal) and a few ALU ones. Its largest relative error is 2^-10.987 (the
# PTX ISA's figure): TANH_APPROX_REL, which the tests' bounds take. FlashAttention 2 and 3 cap
# their scores with the same instruction (cutlass::fast_tanh). The interpreter runs no PTX.
TANH_APPROX_REL = 2.0**-10.987
FAST_TANH = tl.constexpr(not INTERPRET)


@triton.jit
def tanh_approx(x):
    """tanh of fp32 values for a kernel bound by its MUFU instructions (attention's softcap): the
    hardware's tanh.approx.f32 on a GPU, relative error at most TANH_APPROX_REL; tanh() in the
    interpreter. A bandwidth-bound kernel has the cycles for tanh() and keeps its accuracy."""
    if FAST_TANH:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tanh(x)
