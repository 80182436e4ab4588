"""FP8 (e4m3) quantization with scales, in Triton: what an FP8 GEMM (gemm/triton_fp8_matmul.py)
reads instead of a 16-bit operand.

    scale = max(amax(group), AMAX_FLOOR) / FP8_MAX        (fp32, one a group)
    q     = e4m3(clamp(x * (FP8_MAX / max(amax, AMAX_FLOOR)), -FP8_MAX, FP8_MAX))   x ~ q * scale

A NaN in a group makes its scale and all its values NaN (PyTorch's amax and clamp propagate it, and
so do these kernels: a diverging step shows in the FP8 products too). A group is a row (row-wise
scales, a scale per row: the activations' and weights' recipe of row-wise FP8 training), 1 x 128
values of a row (DeepSeek-V3's activation blocks) or 128 x 128 values (its weight blocks). FP8_MAX =
448 is e4m3's largest finite value, so a group's largest |x| lands on it and the rest keep e4m3's
3-bit significand relative to it; the clamp keeps a value that the fp32 multiply rounds past 448
from overflowing (e4m3 has no infinity). AMAX_FLOOR keeps an all-zero group at scale ~0 with zeros
for q instead of 0 * inf. Rounding to e4m3 is to nearest even, as torch's .to(torch.float8_e4m3fn),
and both divisions are IEEE (div_rn; Triton's `/` on fp32 is an approximate division on the GPU):
the tests compare bit for bit.

Bytes: x read once (M * K * e), q written (M * K), the scales (4 bytes a group). Row-wise with a
row of at most ONE_PASS_MAX values: a program keeps its rows in registers between the max and the
cast; a longer row is read twice, the second time from L2 (a program's BLOCK_M rows of a 16K-wide
bf16 row are 32 KB a row).

Row-wise on a column-major x (x.T contiguous: the transposed views fp8_linear's backward casts,
dy.T, x.T and W.T), a row's values lie M apart, and the row kernel would read a 32-byte sector for
each 2-byte value. There two kernels take tiles of x.T, contiguous along x's rows: the first adds
each tile's per-row max |x| into an int32 amax a row by atomic max (the bits of a non-negative
float order as the float does, and a NaN's bits top +inf's, so a NaN wins as PyTorch's amax lets
it), the second casts each tile with its rows' scales and stores it transposed (Triton moves the
tile between the two layouts through shared memory). x is read twice: 2 * M * K * e + M * K bytes.

Both layouts of one tensor (fp8_linear's backward casts dy by rows for dx and by columns for dW):
_both_amax_kernel adds each tile's per-row and per-column max |x| into one int32 amax of M + K
entries by atomic max, and _both_cast_kernel casts each tile twice, with its rows' scales into q
(M, K) and with its columns' into qt (K, M), stored transposed. x is read twice for both casts,
2 * M * K * e + 2 * M * K bytes, where the row kernel and the column kernels apart read it three
times; the same bytes as they give, bit for bit.
"""

import torch
import triton
import triton.language as tl

from llmk.common.device import INTERPRET
from llmk.common.direct_launch import Launcher
from llmk.common.ints import cdiv, next_power_of_2

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
AMAX_FLOOR = 1e-12  # an all-zero group's amax: scale 2.2e-15, q = 0
GROUP = 128  # the block side of the 1 x 128 and 128 x 128 groups
# Row-wise: rows of up to ONE_PASS_MAX values stay in registers between the max and the cast.
# Not yet measured on a GPU: 8192 values over BLOCK_M rows of 4 warps is 64 fp32 a thread at BLOCK_M 1.
ONE_PASS_MAX = 8192
# Row-wise tiles: (BLOCK_M, BLOCK_K) a program; the two-pass loop steps BLOCK_K. Interpreter:
# small tiles, so that the small test shapes run several row blocks and K steps.
ROW_TILE = (1, 2048)
INTERPRET_ROW_TILE = (4, 32)
# the interpreter's one-pass programs take rows up to this many values: its cost is a program's
# (an e4m3 KV cache of 2370 rows of 128 took 590 programs and 17 s a quantization at 4 rows)
INTERPRET_ONE_PASS_VALUES = 4096
# Column-major row-wise (module docstring): a tile is COL_TILE = (BLOCK_K values along x's rows, BLOCK_M
# rows, contiguous in memory); the amax kernel's programs take COL_AMAX_STEPS tiles along K each (an
# atomic a row and program), at COL_AMAX_WARPS warps. Swept on the H200 at the llama-1.5b step's
# x.T and dy.T (2048, 3072 and 8192 rows of 8192 tokens; docs/tuning/gemm.md):
# the amax kernel at 128 x 64 tiles, 2 steps and 4 warps read 1953-2995 GB/s, against 1406-2202 for
# the first 64 x 128, 4 steps, 8 warps (9.9 ms of the step at first, with a reduction across threads
# each step; 6.3 ms with one at the end); the cast kernel read 2550-3650 GB/s at every tile tried, 64 x 128
# kept. Interpreter: a program's cost is mostly its own (8 x 16 tiles made the smoke training
# step's FP8 casts 4x slower than the row kernel's), so tiles of 32 x 64, which the test shapes
# still cross in both directions.
COL_TILE = (64, 128)
COL_AMAX_TILE = (128, 64)
COL_AMAX_STEPS = 2
COL_AMAX_WARPS = 4
INTERPRET_COL_TILE = (32, 64)
INTERPRET_COL_AMAX_STEPS = 2
# Both layouts (module docstring): (BLOCK_M, BLOCK_K) a tile, x's rows by its columns; 4 warps for
# the amax kernel, 8 for the cast (two casts and a transposed store a tile). Not swept: 64 x 128
# bf16 is 16 KB a tile, the column kernels' size; in the llama-1.5b FP8 step on the H200 the amax
# kernel takes 2.8 ms and the cast 3.7 ms a step (docs/tuning/gemm.md, third GPU run).
BOTH_TILE = (64, 128)
INTERPRET_BOTH_TILE = (32, 64)
# 1 x 128 groups: rows a program (its tile is BLOCK_M x 128)
GROUP_ROWS = 32
INTERPRET_GROUP_ROWS = 8


@triton.jit
def quant_factor(amax, FP8_MAX_: tl.constexpr):
    """FP8_MAX / amax, the quantizing factor, an IEEE division."""
    return tl.math.div_rn(tl.zeros_like(amax) + FP8_MAX_, amax)


@triton.jit
def quant_scale(amax, FP8_MAX_: tl.constexpr):
    """amax / FP8_MAX, the scale stored (x ~ q * scale), an IEEE division."""
    return tl.math.div_rn(amax, tl.zeros_like(amax) + FP8_MAX_)


@triton.jit
def round_e4m3(x):
    """x (fp32, |x| <= 448) rounded to the nearest e4m3 value, ties to even, still in fp32: three
    significand bits kept by integer rounding of x's bits (a carry moves the exponent, as it
    should), a fixed step of 2^-9 below e4m3's smallest normal 2^-6 (x + 1.5 * 2^14 rounds there in
    fp32), zero keeping x's sign. The interpreter's own fp32 -> e4m3 cast misrounds (31.92 -> 16,
    ties away from even), so there the value is rounded here and e4m3_bits writes its byte."""
    bits = x.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    tiny = (x + 24576.0) - 24576.0
    tiny = tl.where(tiny == 0.0, x * 0.0, tiny)
    return tl.where(tl.abs(x) < 0.015625, tiny, normal)


@triton.jit
def group_amax(x, amax, AMAX_FLOOR_: tl.constexpr, AXIS: tl.constexpr):
    """max(amax, max |x| along AXIS (None: all of x), AMAX_FLOOR), NaN where x holds a NaN, as
    PyTorch's amax gives it (tl.max passes NaN over): the group's scale and values are then NaN."""
    if AXIS is None:
        big = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
        nan = tl.max(tl.max((x != x).to(tl.int32), axis=1), axis=0)
    else:
        big = tl.max(tl.abs(x), axis=AXIS)
        nan = tl.max((x != x).to(tl.int32), axis=AXIS)
    amax = tl.maximum(
        tl.maximum(amax, big, propagate_nan=tl.PropagateNan.ALL), AMAX_FLOOR_, propagate_nan=tl.PropagateNan.ALL
    )  # a NaN from an earlier step stays
    return tl.where(nan > 0, float("nan"), amax)


@triton.jit
def e4m3_bits(y):
    """The e4m3 bytes of y (fp32: an e4m3 value, as round_e4m3 gives, or NaN), as uint8: sign,
    4 exponent bits (bias 7), 3 significand bits; below 2^-6 the subnormal code |y| * 2^9; NaN
    0x7F. The interpreter's cast gets NaN wrong as well."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    normal = ((((bits >> 23) & 0xFF) - 120) << 3) | ((bits >> 20) & 0x7)
    code = tl.where(tl.abs(y) < 0.015625, (tl.abs(y) * 512.0).to(tl.int32), normal)
    return tl.where(y != y, 0x7F, code | sign).to(tl.uint8)


@triton.jit
def cast_e4m3(x, inv, FP8_MAX_: tl.constexpr, SOFT_ROUND: tl.constexpr):
    """x (fp32) times the quantizing factor inv, clamped to e4m3's range, rounded to e4m3 (with
    SOFT_ROUND, the interpreter's lane: by round_e4m3 and e4m3_bits instead of the cast)."""
    y = tl.clamp(x * inv, -FP8_MAX_, FP8_MAX_, propagate_nan=tl.PropagateNan.ALL)
    if SOFT_ROUND:
        return e4m3_bits(round_e4m3(y)).to(tl.float8e4nv, bitcast=True)
    return y.to(tl.float8e4nv)


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    K,
    stride_xm,
    stride_xk,
    stride_qm,
    FP8_MAX_: tl.constexpr,
    AMAX_FLOOR_: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
    ONE_PASS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Row-wise: BLOCK_M rows a program, a scale each. ONE_PASS (K <= BLOCK_K): one load, kept in
    registers; else the max over BLOCK_K steps, then the cast over them again."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    row_ok = rm < M
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    q_rows = q_ptr + rm[:, None].to(tl.int64) * stride_qm
    if ONE_PASS:
        ok = row_ok[:, None] & (rk < K)[None, :]
        x = tl.load(x_rows + rk[None, :].to(tl.int64) * stride_xk, mask=ok, other=0.0).to(tl.float32)
        amax = group_amax(x, tl.zeros([BLOCK_M], tl.float32), AMAX_FLOOR_, 1)
        q = cast_e4m3(x, quant_factor(amax, FP8_MAX_)[:, None], FP8_MAX_, SOFT_ROUND)
        tl.store(q_rows + rk[None, :], q, mask=ok)
    else:
        amax = tl.full([BLOCK_M], AMAX_FLOOR_, tl.float32)
        for k in range(0, K, BLOCK_K):
            ok = row_ok[:, None] & (k + rk < K)[None, :]
            x = tl.load(x_rows + (k + rk)[None, :].to(tl.int64) * stride_xk, mask=ok, other=0.0).to(tl.float32)
            amax = group_amax(x, amax, AMAX_FLOOR_, 1)
        inv = quant_factor(amax, FP8_MAX_)[:, None]
        for k in range(0, K, BLOCK_K):
            ok = row_ok[:, None] & (k + rk < K)[None, :]
            x = tl.load(x_rows + (k + rk)[None, :].to(tl.int64) * stride_xk, mask=ok, other=0.0).to(tl.float32)
            tl.store(q_rows + (k + rk)[None, :], cast_e4m3(x, inv, FP8_MAX_, SOFT_ROUND), mask=ok)
    tl.store(s_ptr + rm, quant_scale(amax, FP8_MAX_), mask=row_ok)


@triton.jit
def _col_amax_kernel(
    x_ptr, amax_ptr, M, K, stride_xk, STEPS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr
):
    """x (M, K) column-major (unit row stride, stride_xk between columns): the max |x| of BLOCK_M rows
    over STEPS * BLOCK_K columns joins amax_ptr's (M,) int32, the bits of a non-negative fp32 (zero
    before the launch; a NaN's bits top every other value's)."""
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(0) * (STEPS * BLOCK_K) + tl.arange(0, BLOCK_K)
    # elementwise over the steps, reduced across the tile's K once at the end (a reduction across
    # threads a step was twice the cast kernel's time on the H200)
    big = tl.zeros([BLOCK_K, BLOCK_M], tl.int32)
    for step in range(STEPS):
        k = rk + step * BLOCK_K
        ok = (k < K)[:, None] & (rm < M)[None, :]
        x = tl.load(x_ptr + k[:, None].to(tl.int64) * stride_xk + rm[None, :], mask=ok, other=0.0)
        bits = x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF  # |x|, a NaN stays one
        big = tl.maximum(big, bits)
    tl.atomic_max(amax_ptr + rm, tl.max(big, axis=0), mask=rm < M, sem="relaxed")


@triton.jit
def _col_cast_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    amax_ptr,
    M,
    K,
    stride_xk,
    stride_qm,
    FP8_MAX_: tl.constexpr,
    AMAX_FLOOR_: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """x (M, K) column-major, as _col_amax_kernel reads it: a BLOCK_K x BLOCK_M tile of x.T cast with
    its rows' amax (_col_amax_kernel's), stored into q (M, K) row-major; the first column of
    programs stores the rows' scales."""
    pid_k = tl.program_id(0)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok = rm < M
    ok = (rk < K)[:, None] & row_ok[None, :]
    bits = tl.load(amax_ptr + rm, mask=row_ok, other=0)
    amax = tl.maximum(bits.to(tl.float32, bitcast=True), AMAX_FLOOR_, propagate_nan=tl.PropagateNan.ALL)
    x = tl.load(x_ptr + rk[:, None].to(tl.int64) * stride_xk + rm[None, :], mask=ok, other=0.0).to(tl.float32)
    q = cast_e4m3(x, quant_factor(amax, FP8_MAX_)[None, :], FP8_MAX_, SOFT_ROUND)
    tl.store(q_ptr + rm[None, :].to(tl.int64) * stride_qm + rk[:, None], q, mask=ok)
    if pid_k == 0:
        tl.store(s_ptr + rm, quant_scale(amax, FP8_MAX_), mask=row_ok)


@triton.jit
def _both_amax_kernel(x_ptr, amax_ptr, M, K, stride_xm, stride_xk, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """x (M, K), any strides: the max |x| of each row and column of a BLOCK_M x BLOCK_K tile joins
    amax_ptr's int32 (M + K,), rows first (the bits of a non-negative fp32, zero before the launch,
    as _col_amax_kernel's)."""
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (rm < M)[:, None] & (rk < K)[None, :]
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :].to(tl.int64) * stride_xk, mask=ok, other=0.0)
    bits = x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF  # |x|, a NaN stays one
    tl.atomic_max(amax_ptr + rm, tl.max(bits, axis=1), mask=rm < M, sem="relaxed")
    tl.atomic_max(amax_ptr + M + rk, tl.max(bits, axis=0), mask=rk < K, sem="relaxed")


@triton.jit
def _both_cast_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    qt_ptr,
    st_ptr,
    amax_ptr,
    M,
    K,
    stride_xm,
    stride_xk,
    stride_qm,
    stride_qtk,
    FP8_MAX_: tl.constexpr,
    AMAX_FLOOR_: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """A BLOCK_M x BLOCK_K tile of x cast with its rows' amax into q (M, K) and with its columns'
    into qt (K, M), stored transposed (_both_amax_kernel's amax); the first column of programs
    stores the rows' scales, the first row the columns'."""
    pid_k = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    row_ok, col_ok = rm < M, rk < K
    ok = row_ok[:, None] & col_ok[None, :]
    x = tl.load(
        x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :].to(tl.int64) * stride_xk, mask=ok, other=0.0
    ).to(tl.float32)
    row_bits = tl.load(amax_ptr + rm, mask=row_ok, other=0)
    col_bits = tl.load(amax_ptr + M + rk, mask=col_ok, other=0)
    row_amax = tl.maximum(row_bits.to(tl.float32, bitcast=True), AMAX_FLOOR_, propagate_nan=tl.PropagateNan.ALL)
    col_amax = tl.maximum(col_bits.to(tl.float32, bitcast=True), AMAX_FLOOR_, propagate_nan=tl.PropagateNan.ALL)
    q = cast_e4m3(x, quant_factor(row_amax, FP8_MAX_)[:, None], FP8_MAX_, SOFT_ROUND)
    tl.store(q_ptr + rm[:, None].to(tl.int64) * stride_qm + rk[None, :], q, mask=ok)
    qt = cast_e4m3(x, quant_factor(col_amax, FP8_MAX_)[None, :], FP8_MAX_, SOFT_ROUND)
    tl.store(qt_ptr + rk[None, :].to(tl.int64) * stride_qtk + rm[:, None], qt, mask=ok)
    if pid_k == 0:
        tl.store(s_ptr + rm, quant_scale(row_amax, FP8_MAX_), mask=row_ok)
    if pid_m == 0:
        tl.store(st_ptr + rk, quant_scale(col_amax, FP8_MAX_), mask=col_ok)


@triton.jit
def _quantize_groups_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    M,
    K,
    stride_xm,
    stride_xk,
    stride_qm,
    stride_sm,
    FP8_MAX_: tl.constexpr,
    AMAX_FLOOR_: tl.constexpr,
    SOFT_ROUND: tl.constexpr,
    TILE_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    GROUP_K: tl.constexpr,
):
    """1 x GROUP_K groups (a scale for each row of the program's BLOCK_M x GROUP_K tile) or, with
    TILE_GROUP, one BLOCK_M x GROUP_K group (one scale for the tile). K divides by GROUP_K."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = pid_k * GROUP_K + tl.arange(0, GROUP_K)
    ok = (rm < M)[:, None]
    x = tl.load(
        x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :].to(tl.int64) * stride_xk, mask=ok, other=0.0
    ).to(tl.float32)
    if TILE_GROUP:
        amax = group_amax(x, 0.0, AMAX_FLOOR_, None)
        q = cast_e4m3(x, quant_factor(amax, FP8_MAX_), FP8_MAX_, SOFT_ROUND)
        tl.store(q_ptr + rm[:, None].to(tl.int64) * stride_qm + rk[None, :], q, mask=ok)
        tl.store(s_ptr + pid_m * stride_sm + pid_k, quant_scale(amax, FP8_MAX_))
    else:
        amax = group_amax(x, tl.zeros([BLOCK_M], tl.float32), AMAX_FLOOR_, 1)
        tl.store(
            q_ptr + rm[:, None].to(tl.int64) * stride_qm + rk[None, :],
            cast_e4m3(x, quant_factor(amax, FP8_MAX_)[:, None], FP8_MAX_, SOFT_ROUND),
            mask=ok,
        )
        tl.store(s_ptr + rm.to(tl.int64) * stride_sm + pid_k, quant_scale(amax, FP8_MAX_), mask=rm < M)


# direct launches from a specialization's second on (common/direct_launch.py): an FP8 training
# step makes hundreds of them, host-bound (docs/tuning/gemm.md, third GPU run)
_quantize_rows = Launcher(_quantize_rows_kernel)
_col_amax = Launcher(_col_amax_kernel)
_col_cast = Launcher(_col_cast_kernel)
_both_amax = Launcher(_both_amax_kernel)
_both_cast = Launcher(_both_cast_kernel)
_quantize_groups = Launcher(_quantize_groups_kernel)


def scale_shape(m, k, granularity):
    """The scales of an (m, k) tensor quantized with `granularity`: "row" (m,), "1x128"
    (m, k / 128), "128x128" (cdiv(m, 128), k / 128)."""
    if granularity == "row":
        return (m,)
    if granularity == "1x128":
        return (m, k // GROUP)
    return (cdiv(m, GROUP), k // GROUP)


def row_plan(k, one_pass=None):
    """(BLOCK_M, BLOCK_K, ONE_PASS) of a row-wise launch over rows of k values; one_pass forces
    the path (tests)."""
    block_m, block_k = INTERPRET_ROW_TILE if INTERPRET else ROW_TILE
    if one_pass is None:
        one_pass = k <= ONE_PASS_MAX
    if one_pass:
        block_k = max(16, next_power_of_2(k))
        block_m = max(block_m, INTERPRET_ONE_PASS_VALUES // block_k) if INTERPRET else 1
    return block_m, block_k, one_pass


def column_major(x):
    """Whether x (M, K)'s rows are its contiguous dimension (x.T row-major, as a transposed view of a
    contiguous tensor is): the row-wise cast then takes the column kernels."""
    m, k = x.shape
    return m > 1 and k > 1 and x.stride(0) == 1 and x.stride(1) >= m


def launch_quantize_columns(x, q, scale, amax=None):
    """The row-wise cast of a column-major x (M, K) (column_major) into q (M, K) row-major and scale
    (M,): _col_amax_kernel, then _col_cast_kernel (module docstring). amax: a zeroed int32 (M,) to
    use (one allocation for several casts), else one is made."""
    m, k = x.shape
    block_k, block_m = INTERPRET_COL_TILE if INTERPRET else COL_TILE
    amax_k, amax_m = INTERPRET_COL_TILE if INTERPRET else COL_AMAX_TILE
    steps = INTERPRET_COL_AMAX_STEPS if INTERPRET else COL_AMAX_STEPS
    if amax is None:
        amax = torch.zeros(m, dtype=torch.int32, device=x.device)
    # K's blocks on the grid's first axis (2^31 - 1 programs; the second takes 65535): K is the tokens
    _col_amax[(cdiv(k, steps * amax_k), cdiv(m, amax_m))](
        x, amax, m, k, x.stride(1), STEPS=steps, BLOCK_K=amax_k, BLOCK_M=amax_m, num_warps=COL_AMAX_WARPS
    )
    _col_cast[(cdiv(k, block_k), cdiv(m, block_m))](
        x,
        q,
        scale,
        amax,
        m,
        k,
        x.stride(1),
        q.stride(0),
        FP8_MAX_=FP8_MAX,
        AMAX_FLOOR_=AMAX_FLOOR,
        SOFT_ROUND=INTERPRET,
        BLOCK_K=block_k,
        BLOCK_M=block_m,
        num_warps=8,
    )


def launch_quantize_both(x, q, scale, qt, scale_t, amax=None):
    """Both row-wise casts of validated x (M, K) (any strides) at once (module docstring): q (M, K)
    and scale (M,) by x's rows, qt (K, M) and scale_t (K,) by its columns (x.T's rows), q and qt
    with unit column strides; the same bytes as launch_quantize_fp8 of x and of x.T. amax: a zeroed
    int32 (M + K,) to use, else one is made."""
    m, k = x.shape
    block_m, block_k = INTERPRET_BOTH_TILE if INTERPRET else BOTH_TILE
    if amax is None:
        amax = torch.zeros(m + k, dtype=torch.int32, device=x.device)
    grid = (cdiv(k, block_k), cdiv(m, block_m))  # K's blocks first: the second axis takes 65535
    _both_amax[grid](x, amax, m, k, x.stride(0), x.stride(1), BLOCK_M=block_m, BLOCK_K=block_k, num_warps=4)
    _both_cast[grid](
        x,
        q,
        scale,
        qt,
        scale_t,
        amax,
        m,
        k,
        x.stride(0),
        x.stride(1),
        q.stride(0),
        qt.stride(0),
        FP8_MAX_=FP8_MAX,
        AMAX_FLOOR_=AMAX_FLOOR,
        SOFT_ROUND=INTERPRET,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        num_warps=8,
    )


def launch_quantize_fp8(x, q, scale, granularity, one_pass=None, amax=None):
    """Quantize validated x (M, K) (fp16, bf16 or fp32, any strides) into q (M, K) e4m3 (unit
    column stride) and scale (fp32): granularity "row" (M,), "1x128" (M, K / 128) or "128x128"
    (cdiv(M, 128), K / 128), K a multiple of 128 for the last two. one_pass: force the row-wise
    kernel's path (tests); without it a column-major x takes the column kernels (column_major),
    with `amax` (a zeroed int32 (M,)) if given."""
    m, k = x.shape
    if granularity == "row" and one_pass is None and column_major(x):
        launch_quantize_columns(x, q, scale, amax)
        return
    if granularity == "row":
        block_m, block_k, one_pass = row_plan(k, one_pass)
        _quantize_rows[(cdiv(m, block_m),)](
            x,
            q,
            scale,
            m,
            k,
            x.stride(0),
            x.stride(1),
            q.stride(0),
            FP8_MAX_=FP8_MAX,
            AMAX_FLOOR_=AMAX_FLOOR,
            SOFT_ROUND=INTERPRET,
            ONE_PASS=one_pass,
            BLOCK_M=block_m,
            BLOCK_K=block_k,
            num_warps=4,
        )
        return
    tile = granularity == "128x128"
    block_m = GROUP if tile else (INTERPRET_GROUP_ROWS if INTERPRET else GROUP_ROWS)
    _quantize_groups[(cdiv(m, block_m), k // GROUP)](
        x,
        q,
        scale,
        m,
        k,
        x.stride(0),
        x.stride(1),
        q.stride(0),
        scale.stride(0),
        FP8_MAX_=FP8_MAX,
        AMAX_FLOOR_=AMAX_FLOOR,
        SOFT_ROUND=INTERPRET,
        TILE_GROUP=tile,
        BLOCK_M=block_m,
        GROUP_K=GROUP,
        num_warps=8 if tile else 4,
    )
