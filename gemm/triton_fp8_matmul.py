"""FP8 (e4m3) matrix multiply with scales and the matmul epilogues, in Triton.

    c = act((a * scale_a) @ (b * scale_b) + bias)     a (M, K), b (K, N) e4m3; c bf16 or fp16

Row-wise scales (ROW): scale_a (M,), a scale per row of a, and scale_b (N,), a scale per column
of b (per row of an nn.Linear weight W, for b = W.T): a tile's fp32 sum over K is scaled once,
acc * scale_a[:, None] * scale_b[None, :], in the epilogue. Block scales (DeepSeek-V3's recipe):
scale_a (M, K / 128), a scale per row and 128 values of K (an activation's 1 x 128 groups), and
scale_b (K / 128, cdiv(N, 128)), a scale per 128 x 128 block of b (a weight's, transposed with it):
a scale changes every 128 values of K, so each BLOCK_K = 128 step's product is scaled on its own
before it joins the fp32 sum. gemm/triton_fp8_quant.py makes both kinds.

The products of two e4m3 values are exact, and the tensor cores sum them (Hopper's FP8 wgmma runs at
twice the bf16 rate) in an accumulator of about 14 significant bits, not fp32's 24: Triton's default
on sm_90 keeps the whole K loop there. Here every BLOCK_K = 128 values of K go into the fp32 sum on
their own (max_num_imprecise_acc = BLOCK_K for row-wise scales; block scales add each step's scaled
product into fp32 anyway), DeepSeek-V3's promotion interval: the error is matmul's (fp32
accumulation across steps, one rounding) plus the short sums' own, about 2^-14 of a 128-product
partial sum each (gemm/test_fp8.py bounds it), and one fp32 rounding a scaling. fp8_matmul's
fast_accum (PROMOTE off) keeps the whole K loop in the tensor cores' accumulator instead, as
torch._scaled_mm's use_fast_accum does: on the H200 1.1-1.4x faster, its error growing with K
(against torch._scaled_mm's promoted sums: 0.6% of the largest output at K 4096, 0.8% at 8192, 1.2% at
14336, where promotion leaves bf16's rounding, 0.3%). The epilogue (bias,
activation, the rounding, the masked store) is matmul's own (gemm/triton_matmul_common.py), and so
is the grouped program order. Edges: rows and columns wrap on load (% M, % N), the K tail is masked.

FP8 tl.dot on a GPU needs compute capability 8.9 (Ada) or 9.0 (Hopper) and later; the interpreter
runs it in numpy.
"""

import triton
import triton.language as tl

from llmk.common.device import INTERPRET
from llmk.common.direct_launch import Launcher
from llmk.common.ints import cdiv
from llmk.gemm.triton_matmul_common import GROUP_M, epilogue_store, grouped_tile, load_k_step

SCALE_BLOCK = 128  # the block scales' side: BLOCK_K is this when the scales are blocks
# (largest M, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): the first row whose M fits wins.
# Shared memory is (BLOCK_M + BLOCK_N) * BLOCK_K bytes a stage (one byte a value). Measured on the
# H200 (scripts/tune/fp8_gemm_ab.py, docs/tuning/gemm.md), TFLOP/s promoted / not:
# - below 1024 rows (fp8_matmul's range for this kernel on Hopper), 64 x 128 x 128 at 4 warps won
#   both ways: M 128 215 / 243 (torch._scaled_mm 244 / 255), M 512 746 / 854 (887 / 938), where
#   the 128-row tiles leave SMs idle;
# - from 1024 rows (this kernel's there where TMA does not fit, or on a GPU without it), 256 x 128
#   promoted (941 at 4096^3; 128 x 256 spills its second accumulator and ran 427) and 128 x 256
#   not promoted (1268). The first table's 128 x 256 x 128 promoted for every M ran 0.35-0.39x
#   torch._scaled_mm (704 bytes a thread spilled).
CONFIG_TABLE = [
    (1023, 64, 128, 128, 4, 4),
    (None, 256, 128, 128, 8, 3),
]
FAST_CONFIG_TABLE = [  # promote=False: the whole K loop in the tensor cores' accumulator
    (1023, 64, 128, 128, 4, 4),
    (None, 128, 256, 128, 8, 3),
]
# Block scales: each step's scaled product is a second fp32 tile beside the accumulator (128 x 256
# would be 256 fp32 registers a thread at 8 warps), and CONFIG_TABLE's 256 x 128 spills there
# (187-217 TFLOP/s on the H200 at M >= 1024, against 523-586 for 128 x 128 at 8 warps)
BLOCK_CONFIG_TABLE = [
    (1023, 64, 128, 128, 4, 4),
    (None, 128, 128, 128, 8, 4),
]
# Interpreter: tiles small enough that the test shapes have edge tiles in M and N and several K steps;
# from INTERPRET_LARGE_MN outputs (above every test of this kernel: the model tests' and the smoke
# benchmark's weight gradients) a quarter of the programs, each op of a program costing the
# interpreter the same Python time whatever its tile
INTERPRET_CONFIG = (32, 32, 128, 4, 1)
INTERPRET_LARGE_CONFIG = (64, 64, 128, 4, 1)
INTERPRET_LARGE_MN = 16384


def row_for_m(table, m):
    """The config of `table`'s first (largest M or None, *config) row that takes M rows (the last
    row, None, takes every M)."""
    return next(tuple(config) for max_m, *config in table if max_m is None or m <= max_m)


def fp8_config(m, n, promote=True, block_scaled=False):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for an (M, N) output (CONFIG_TABLE's by M,
    without promotion FAST_CONFIG_TABLE's, with block scales BLOCK_CONFIG_TABLE's, or the
    interpreter's)."""
    if INTERPRET:
        return INTERPRET_LARGE_CONFIG if m * n >= INTERPRET_LARGE_MN else INTERPRET_CONFIG
    return row_for_m(BLOCK_CONFIG_TABLE if block_scaled else CONFIG_TABLE if promote else FAST_CONFIG_TABLE, m)


@triton.jit
def _fp8_matmul_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # scale strides: ROW scale_a (M,) and scale_b (N,) take stride_sam and stride_sbn only
    stride_sam, stride_sak, stride_sbk, stride_sbn,
    BLOCK_SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M_: tl.constexpr,
    EVEN_K: tl.constexpr, PROMOTE: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M_)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a, b = load_k_step(a_ptrs, b_ptrs, rk, K - k * BLOCK_K, EVEN_K)
        if BLOCK_SCALED:
            # this step's 128 values of K have a scale of their own in each row of a and each
            # 128-column block of b: its product is scaled before it joins the sum
            sa = tl.load(sa_ptr + rm.to(tl.int64) * stride_sam + k * stride_sak)
            sb = tl.load(sb_ptr + k * stride_sbk + (rn // BLOCK_K) * stride_sbn)
            acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
        elif PROMOTE:  # the 128 products' sum joins the fp32 sum (module docstring)
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        else:  # the whole K loop in the tensor cores' accumulator (scripts/tune/fp8_gemm_ab.py weighs it)
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if not BLOCK_SCALED:
        sa = tl.load(sa_ptr + rm.to(tl.int64) * stride_sam)
        sb = tl.load(sb_ptr + rn.to(tl.int64) * stride_sbn)
        acc = acc * (sa[:, None] * sb[None, :])
    epilogue_store(
        c_ptr,
        None,
        bias_ptr,
        acc,
        pid_m,
        pid_n,
        M,
        N,
        stride_cm,
        stride_cn,
        HAS_BIAS,
        ACTIVATION,
        False,
        BLOCK_M,
        BLOCK_N,
    )


# direct launches from a specialization's second on (common/direct_launch.py): an FP8 training
# step makes hundreds of them, host-bound (docs/tuning/gemm.md, third GPU run)
_fp8_matmul = Launcher(_fp8_matmul_kernel)


def launch_fp8_matmul(a, b, scale_a, scale_b, bias, activation, c, config=None, promote=True):
    """Launch on validated arguments with M, N >= 1: a (M, K), b (K, N) e4m3, any strides; scales
    fp32, row-wise (scale_a (M,), scale_b (N,)) or blocks (scale_a (M, K / 128), scale_b (K / 128,
    cdiv(N, 128)), K a multiple of 128), told apart by scale_a's dims; bias (N,) or None; c (M, N).
    config: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) instead of fp8_config's (BLOCK_K
    is SCALE_BLOCK with block scales whatever it says). promote=False: row-wise sums stay in the
    tensor cores' accumulator over the whole K loop (fp8_matmul's fast_accum; block scales promote
    whatever it says)."""
    (m, k), n = a.shape, b.shape[1]
    if bias is not None:
        bias = bias.contiguous()  # the epilogue reads bias[n] at n: a strided (N,) view is copied
    block_scaled = scale_a.dim() == 2
    block_m, block_n, block_k, num_warps, num_stages = config or fp8_config(m, n, promote, block_scaled)
    if block_scaled:
        block_k = SCALE_BLOCK
    sa_strides = (scale_a.stride(0), scale_a.stride(1) if block_scaled else 0)
    sb_strides = (scale_b.stride(0), scale_b.stride(1)) if block_scaled else (0, scale_b.stride(0))
    grid = (cdiv(m, block_m) * cdiv(n, block_n),)
    _fp8_matmul[grid](
        a,
        b,
        c,
        scale_a,
        scale_b,
        bias,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        *sa_strides,
        *sb_strides,
        BLOCK_SCALED=block_scaled,
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M_=GROUP_M,
        EVEN_K=k % block_k == 0,
        PROMOTE=promote,
        num_warps=num_warps,
        num_stages=num_stages,
    )
