"""FP8 on the tensor cores: quantize_fp8 (e4m3 values and fp32 scales, gemm/triton_fp8_quant.py) and
fp8_matmul (their product with matmul's epilogues: gemm/triton_fp8_matmul.py, and for row-wise
scales from FP8_TMA_MIN_M rows on Hopper gemm/triton_fp8_matmul_tma.py's persistent TMA kernel), as
operators llmk::quantize_fp8 and llmk::fp8_matmul.

    q, s = quantize_fp8(x)                          row-wise: s (M,)
    qw, sw = quantize_fp8(weight)                   W (N, K): sw (N,)
    y = fp8_matmul(q, qw.T, s, sw, bias)            ~ x @ W.T + bias, in bf16

    q, s = quantize_fp8(x, "1x128")                 s (M, K / 128)
    qw, sw = quantize_fp8(weight, "128x128")        sw (cdiv(N, 128), K / 128)
    y = fp8_matmul(q, qw.T, s, sw.T)                DeepSeek-V3's block scales

Both operators are forward-only: a training linear in FP8 (gradients in FP8 too) is a module of
its own, built on them.
"""

import torch

from llmk.common.device import sm_count
from llmk.common.ops import define_op
from llmk.common.validation import check_same_device, check_tensor
from llmk.gemm import triton_fp8_matmul_tma
from llmk.gemm.matmul_ops import has_tma
from llmk.gemm.triton_fp8_matmul import SCALE_BLOCK, launch_fp8_matmul
from llmk.gemm.triton_fp8_quant import GROUP, launch_quantize_both, launch_quantize_fp8, scale_shape
from llmk.gemm.triton_matmul_common import ACTIVATIONS, check_bias

FP8 = torch.float8_e4m3fn
GRANULARITIES = ("row", "1x128", "128x128")
OUT_DTYPES = (torch.bfloat16, torch.float16)
REMEDY = "FP8 products have no backward here: train through llmk.gemm.matmul in bf16"
# From FP8_TMA_MIN_M rows, row-wise products whose operands fit TMA (a by rows, b = W.T) run the
# persistent TMA kernel. Measured on the H200 (scripts/tune/fp8_gemm_ab.py), promoted: at M 512 the
# pointer kernel's 64-row tiles win (746 TFLOP/s against the TMA kernel's 696), at M 1024 the TMA
# kernel (1039 against 997).
FP8_TMA_MIN_M = 1024


def check_quantize_args(x, granularity):
    check_tensor("x", x, (torch.float16, torch.bfloat16, torch.float32), min_dim=2)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K); got shape {tuple(x.shape)}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}; got {granularity!r}")
    if granularity != "row" and x.shape[1] % GROUP:
        raise ValueError(f"granularity {granularity!r}: K = x.shape[1] must be a multiple of {GROUP}; got {x.shape[1]}")


def _quantize_empty(x, granularity):
    m, k = x.shape
    return x.new_empty((m, k), dtype=FP8), x.new_empty(scale_shape(m, k, granularity), dtype=torch.float32)


def quantize_impl(x, granularity, amax=None):
    """quantize_fp8's implementation (below the operator layer: for other operators' own, which
    run on real tensors already). amax: a zeroed int32 (M,) for a column-major x's column kernels."""
    q, scale = _quantize_empty(x, granularity)
    if q.numel():
        launch_quantize_fp8(x, q, scale, granularity, amax=amax)
    else:
        scale.zero_()  # no values: no amax (K = 0 rows, or no rows)
    return q, scale


def quantize_both_impl(x, amax=None):
    """(q, scale, qt, scale_t): x (M, K) cast by its rows and by its columns at once
    (launch_quantize_both, x read twice), as quantize_impl(x, "row") and quantize_impl(x.T, "row")
    give them; below the operator layer, as quantize_impl. amax: a zeroed int32 (M + K,)."""
    (q, scale), (qt, scale_t) = _quantize_empty(x, "row"), _quantize_empty(x.T, "row")
    launch_quantize_both(x, q, scale, qt, scale_t, amax)
    return q, scale, qt, scale_t


quantize_fp8_op = define_op(
    "quantize_fp8(Tensor x, str granularity) -> (Tensor, Tensor)", quantize_impl, _quantize_empty, remedy=REMEDY
)


def quantize_fp8(x, granularity="row"):
    """(q, scale): x quantized to e4m3 with fp32 scales, x ~ q * scale (operator llmk::quantize_fp8).

    x: (M, K) fp16, bf16 or fp32, any strides, finite. granularity: "row" (a scale a row: scale
    (M,)), "1x128" (a scale per 128 values of a row: (M, K / 128)) or "128x128" (a scale per
    128 x 128 block: (cdiv(M, 128), K / 128)); K a multiple of 128 for the blocks.
    Each group's largest |x| maps to e4m3's 448 (scale = amax / 448), values round to nearest
    even; an all-zero group gets scale ~0 and zeros. Returns q (M, K) float8_e4m3fn, contiguous,
    and scale, fp32, contiguous. Forward-only."""
    check_quantize_args(x, granularity)
    return quantize_fp8_op(x, granularity=granularity)


def check_fp8_matmul_args(a, b, scale_a, scale_b, bias, activation, out_dtype):
    """Argument checks of fp8_matmul; returns (M, N, K)."""
    check_tensor("a", a, (FP8,), min_dim=2)
    check_tensor("b", b, (FP8,), min_dim=2)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D, (M, K) and (K, N); got a {tuple(a.shape)}, b {tuple(b.shape)}")
    check_same_device("b", b, "a", a)
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"b must have shape (K, N) with K = a.shape[1] = {k}; got {tuple(b.shape)}")
    check_tensor("scale_a", scale_a, (torch.float32,))
    check_tensor("scale_b", scale_b, (torch.float32,))
    check_same_device("scale_a", scale_a, "a", a)
    check_same_device("scale_b", scale_b, "a", a)
    if scale_a.dim() == 1:  # row-wise
        want_a, want_b = (m,), (n,)
    else:
        if k % SCALE_BLOCK:
            raise ValueError(f"block scales: K = a.shape[1] must be a multiple of {SCALE_BLOCK}; got {k}")
        want_a, want_b = (m, k // SCALE_BLOCK), (k // SCALE_BLOCK, (n + SCALE_BLOCK - 1) // SCALE_BLOCK)
    if tuple(scale_a.shape) != want_a:
        raise ValueError(
            f"scale_a must have shape {want_a} (row-wise (M,), or blocks (M, K / {SCALE_BLOCK})); "
            f"got {tuple(scale_a.shape)}"
        )
    if tuple(scale_b.shape) != want_b:
        kind = "row-wise (N,)" if scale_a.dim() == 1 else f"blocks (K / {SCALE_BLOCK}, cdiv(N, {SCALE_BLOCK}))"
        raise ValueError(f"scale_b must have shape {want_b} ({kind}, as scale_a is); got {tuple(scale_b.shape)}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}; got {out_dtype}")
    check_bias(bias, n, (out_dtype, torch.float32), "a", a)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    return m, n, k


def _fp8_matmul_empty(a, b, scale_a, scale_b, bias, activation, out_dtype, fast_accum=False):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def uses_tma(a, b, scale_a, c):
    """Whether fp8_matmul runs the persistent TMA kernel: row-wise scales, FP8_TMA_MIN_M rows or
    more, a GPU with TMA (the interpreter emulates it), operands and c that fit its descriptors."""
    return (
        scale_a.dim() == 1
        and a.shape[0] >= FP8_TMA_MIN_M
        and a.shape[1] > 0
        and has_tma(a.device)
        and triton_fp8_matmul_tma.fits(a, b, c)
    )


def fp8_matmul_impl(a, b, scale_a, scale_b, bias, activation, out_dtype, fast_accum=False):
    """fp8_matmul's implementation (below the operator layer, as quantize_impl)."""
    c = _fp8_matmul_empty(a, b, scale_a, scale_b, bias, activation, out_dtype)
    if not c.numel():
        return c
    if uses_tma(a, b, scale_a, c):
        triton_fp8_matmul_tma.launch_fp8_matmul_tma(
            a,
            b,
            scale_a,
            scale_b,
            bias,
            activation,
            c,
            sm_count(a.device, triton_fp8_matmul_tma.INTERPRET_SMS),
            promote=not fast_accum,
        )
    else:  # K = 0 runs: the epilogue on zero sums
        launch_fp8_matmul(a, b, scale_a, scale_b, bias, activation, c, promote=not fast_accum)
    return c


fp8_matmul_op = define_op(
    "fp8_matmul(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, str? activation, "
    "ScalarType out_dtype, bool fast_accum=False) -> Tensor",
    fp8_matmul_impl,
    _fp8_matmul_empty,
    remedy=REMEDY,
)


def fp8_matmul(a, b, scale_a, scale_b, bias=None, activation=None, out_dtype=torch.bfloat16, fast_accum=False):
    """c = activation((a * scale_a) @ (b * scale_b) + bias): the tensor cores' sums of 128 products
    added in fp32, one rounding to out_dtype (operator llmk::fp8_matmul).

    a: (M, K) float8_e4m3fn, any strides. b: (K, N) float8_e4m3fn, any strides (for a weight W
    (N, K) quantized by quantize_fp8, pass W.T; read along K, the tensor cores' fast layout).
    scale_a, scale_b: fp32, row-wise: (M,) and (N,) (a per row of a, b per column); or blocks:
    (M, K / 128) and (K / 128, cdiv(N, 128)) (quantize_fp8's "1x128" of a, "128x128" of W
    transposed), K then a multiple of 128.
    bias: optional (N,), out_dtype or fp32. activation: None, "gelu", "gelu_tanh" or "silu".
    out_dtype: torch.bfloat16 (default) or torch.float16.
    fast_accum: row-wise scales only: keep the whole K loop in the tensor cores' accumulator (about
    14 significant bits), as torch._scaled_mm's use_fast_accum: faster (1.1-1.4x on the H200), its
    error growing with K (gemm/triton_fp8_matmul.py). Block scales ignore it: each 128-deep step is
    scaled, and so added in fp32, anyway.
    Returns c (M, N), contiguous. Forward-only."""
    check_fp8_matmul_args(a, b, scale_a, scale_b, bias, activation, out_dtype)
    if not isinstance(fast_accum, bool):
        raise TypeError(f"fast_accum must be a bool; got {type(fast_accum).__name__}")
    return fp8_matmul_op(
        a, b, scale_a, scale_b, bias, activation=activation, out_dtype=out_dtype, fast_accum=fast_accum
    )
