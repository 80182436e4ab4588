"""FP8 (e4m3) matrix multiply with row-wise scales as a persistent kernel with TMA loads and stores,
for large GEMMs on Hopper (sm_90) and later: gemm/triton_fp8_matmul.py's math on
gemm/triton_matmul_tma.py's schedule.

    c = act((a * scale_a) @ (b * scale_b) + bias)     a (M, K) row-major e4m3; b = W.T for W (N, K)
                                                      row-major e4m3; scale_a (M,), scale_b (N,)

The math is the pointer kernel's: each BLOCK_K-deep step's products summed in the tensor cores and
added into the fp32 accumulator (PROMOTE; without it the whole K loop stays in the tensor cores'
accumulator: fp8_matmul's fast_accum), the tile scaled once by scale_a[:, None] * scale_b[None, :], then
bias, activation, one rounding. What changes is the schedule, as in the bf16 TMA kernel: each tile
of a and W is one TMA copy into shared memory (zeros past the edges, no masks), NUM_SMS programs
walk the tiles in grouped order, and c leaves by TMA stores that clip at (M, N).

Layouts: FP8 wgmma reads both operands K-major, so a is read by rows and b as W's rows, each (M, K)
and (N, K) contiguous along K: what quantize_fp8 writes and fp8_linear passes. TMA asks for 16-byte
aligned bases and row strides (K a multiple of 16 at one byte a value; c's row a multiple of 8
values). `fits` says when a call qualifies; the others run the pointer kernel.

Bytes: (M * K + N * K) * 1 + M * N * 2 with perfect reuse, the grouped order turning the repeats
into L2 hits; FLOPs 2 M N K.
"""

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from llmk.common.device import INTERPRET
from llmk.common.direct_launch import Launcher
from llmk.common.ints import cdiv
from llmk.common.triton_utils import activate
from llmk.gemm.triton_fp8_matmul import row_for_m
from llmk.gemm.triton_matmul_common import GROUP_M, grouped_tile
from llmk.gemm.triton_matmul_tma import store_split

# (largest M, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, EPILOGUE_SPLIT): the first row whose M
# fits wins. Shared memory: (BLOCK_M + BLOCK_N) * BLOCK_K bytes a stage, plus c's staging tile,
# BLOCK_M * BLOCK_N * 2 / EPILOGUE_SPLIT bytes. Measured on the H200 from 1024 rows
# (scripts/tune/fp8_gemm_ab.py, docs/tuning/gemm.md), TFLOP/s at the llama-1.5b step's shapes and
# 8192^3 against torch._scaled_mm row-wise (precise / use_fast_accum):
# - promoted, 256 x 128 x 128 at 8 warps: 911-1039 (1081-1294); 128 x 128 ran 842-909, and
#   128 x 256 promoted holds a second 128-register accumulator and ran 856-894. At 4096^3 the
#   128 x 128 tile won (908 against 756): not kept, one shape against all the others;
# - not promoted, 128 x 256 x 128: 1259-1366 (fast accumulation 1281-1365), every shape's best.
FP8_TMA_TABLE = [
    (None, 256, 128, 128, 8, 3, 2),
]
FAST_TMA_TABLE = [  # promote=False
    (None, 128, 256, 128, 8, 3, 2),
]
# the interpreter's: small tiles, few programs, so that each program walks several test tiles
INTERPRET_CONFIG = (32, 32, 32, 4, 1, 2)
INTERPRET_SMS = 3


def fp8_tma_config(m, promote=True):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, EPILOGUE_SPLIT) for M rows (FP8_TMA_TABLE's,
    without promotion FAST_TMA_TABLE's, or the interpreter's)."""
    return INTERPRET_CONFIG if INTERPRET else row_for_m(FP8_TMA_TABLE if promote else FAST_TMA_TABLE, m)


def fits(a, b, c):
    """Whether TMA descriptors cover a (M, K) by rows, b as W.T (W (N, K) by rows) and c by rows:
    16-byte-aligned bases and row strides, a contiguous last dimension."""

    def aligned(t, row_stride):
        return t.data_ptr() % 16 == 0 and (row_stride * t.element_size()) % 16 == 0

    return (
        a.stride(1) == 1
        and aligned(a, a.stride(0))
        and b.stride(0) == 1
        and aligned(b, b.stride(1))
        and c.stride(1) == 1
        and aligned(c, c.stride(0))
    )


@triton.jit
def _fp8_matmul_tma_kernel(
    # TMA descriptors: a (M, K), w (N, K) (b = w.T), c (M, N); scale and bias pointers
    a_desc, w_desc, c_desc, sa_ptr, sb_ptr, bias_ptr,
    M, N, K, stride_sa, stride_sb,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, PROMOTE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M_: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr, NUM_SMS: tl.constexpr,
):  # fmt: skip
    """Program p computes tiles p, p + NUM_SMS, ... (grouped order), each over all of K."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M_)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_steps):  # past K, the copies read zeros, which add nothing
            a = a_desc.load([off_m, k * BLOCK_K])
            b = w_desc.load([off_n, k * BLOCK_K]).T
            if PROMOTE:  # the step's products join the fp32 sum (gemm/triton_fp8_matmul.py)
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
            else:
                acc = tl.dot(a, b, acc)
        rm = off_m + tl.arange(0, BLOCK_M)
        rn = off_n + tl.arange(0, BLOCK_N)
        sa = tl.load(sa_ptr + rm.to(tl.int64) * stride_sa, mask=rm < M, other=0.0)
        sb = tl.load(sb_ptr + rn.to(tl.int64) * stride_sb, mask=rn < N, other=0.0)
        acc = acc * (sa[:, None] * sb[None, :])
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        acc = activate(acc, ACTIVATION)
        store_split(c_desc, acc, off_m, off_n, BLOCK_M, BLOCK_N, EPILOGUE_SPLIT)


# direct launches from a specialization's second on (common/direct_launch.py): an FP8 training
# step makes hundreds of them, host-bound (docs/tuning/gemm.md, third GPU run)
_fp8_matmul_tma = Launcher(_fp8_matmul_tma_kernel)


def launch_fp8_matmul_tma(a, b, scale_a, scale_b, bias, activation, c, num_sms, config=None, promote=True):
    """Launch on validated arguments that `fit`: a (M, K) and b (K, N) = W.T e4m3, row-wise scales
    scale_a (M,) and scale_b (N,) fp32, bias (N,) or None, c (M, N) with M, N >= 1, on num_sms
    programs at most (the interpreter's INTERPRET_SMS). config: a FP8_TMA_TABLE row's last six
    instead of fp8_tma_config's; promote as launch_fp8_matmul takes it."""
    (m, k), n = a.shape, b.shape[1]
    if bias is not None:
        bias = bias.contiguous()  # the epilogue reads bias[n] at n: a strided (N,) view is copied
    bm, bn, bk, num_warps, num_stages, split = config or fp8_tma_config(m, promote)
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [bm, bk])
    w_desc = TensorDescriptor(b.T, [n, k], [b.stride(1), 1], [bn, bk])
    c_desc = TensorDescriptor(c, [m, n], [c.stride(0), 1], [bm, bn // split])
    programs = INTERPRET_SMS if INTERPRET else num_sms
    grid = (min(programs, cdiv(m, bm) * cdiv(n, bn)),)
    _fp8_matmul_tma[grid](
        a_desc,
        w_desc,
        c_desc,
        scale_a,
        scale_b,
        bias,
        m,
        n,
        k,
        scale_a.stride(0),
        scale_b.stride(0),
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        PROMOTE=promote,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M_=GROUP_M,
        EPILOGUE_SPLIT=split,
        NUM_SMS=programs,
        num_warps=num_warps,
        num_stages=num_stages,
    )
