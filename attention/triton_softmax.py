"""Row softmax in Triton.

    y = exp(x - max(x)) / sum(exp(x - max(x)))        over the last dim, math in fp32, one cast

exp(t) is taken as exp2(t * log2(e)) of the difference t = x - max: subtracting first keeps every
bit of a large |x| (scaling x first would round x * log2(e) to half an fp32 ulp, 5e-4 at 1e4).

Memory traffic per row of N values of e bytes: read x (N*e), write y (N*e). That is the ideal; the
looped and split paths read x a second time, served from L1/L2 when it is still there.

Three paths, picked by `softmax_config` from the table below:
- fused: BLOCK_M whole rows a program, in registers; x crosses the memory bus once.
- looped: one program a row, in chunks, three passes: the row max, the sum of exp(x - max), then
  the write; passes 2 and 3 are served from L1/L2. Any N: a chunk, not the row, lives in
  registers, so nothing spills and no width is refused.
- split: for rows too few to fill the GPU. Each row is cut into segments of SPLIT_SEG values,
  one program each, held in registers: kernel 1 writes each segment's (max, sum of exp), kernel 2
  combines its row's partials and writes its segment. Two launches stand in for a barrier across
  programs; kernel 2's read of x comes mostly from L2.

A row of only -inf gives NaN, as torch.softmax does (0 / 0: every exp is 0).

Backward (autograd of `softmax`), from the saved output y and the upstream gradient dy:

    dx = y * (dy - sum(dy * y))        per row, math in fp32, one cast

Memory traffic per row: read y and dy, write dx (3*N*e); forward and backward together 5*N*e
(x read, y written, y and dy read, dx written). The same three paths, from SOFTMAX_BWD_TABLE:
fused (rows in registers, y and dy read once), looped (two passes: the dot product, then dx last
chunk first, re-read from L1/L2), split (kernel 1 writes each segment's partial dot product,
kernel 2 sums its row's partials and writes its segment of dx).
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llmk.common.device import sm_count
from llmk.common.direct_launch import Launcher
from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.ops import define_op, define_ops
from llmk.common.triton_utils import LOG2E, col_mask
from llmk.common.validation import check_out, check_tensor, contiguous_like, rows_of

# A lane's running max starts at -FLT_MAX, not -inf, so a lane that has seen only -inf computes
# x - m = -inf (exp 0) instead of -inf - (-inf) = NaN, and keeps s = 0.
NEG_FLT_MAX = tl.constexpr(-3.4028234663852886e38)

# ---------------------------------------------------------------------------------------------
# Heuristics, measured by scripts/tune/softmax_sweep.py on an H200 (bf16, 16M elements); the
# figures, and what was tried and lost, are in docs/tuning/attention.md. Keyed by
# BLOCK_N = next_power_of_2(N), the fp32 values a row takes in registers (what limits the fused
# path, whatever the input dtype):
#   (max BLOCK_N, path, values a program, num_warps)
# fused: rows a program = values // BLOCK_N (at least 1); looped/split: values = the chunk.
# fmt: off
SOFTMAX_TABLE = [
    (1024, "fused", 2048, 4),     # short rows: two a program (four or eight lost)
    (2048, "fused", 2048, 4),     # one row, 4 warps (8 lost)
    (4096, "fused", 4096, 8),     # one row, 8 warps: 16 values a thread (4 warps lost)
    (8192, "fused", 8192, 4),     # one row, 4 warps (16 lost)
    (16384, "looped", 4096, 16),  # from here the looped kernel: a chunk, not the row, in registers
    (32768, "looped", 8192, 32),  # wider rows, wider chunks: fewer trips of the loop
    (None, "looped", 16384, 32),  # the largest chunk; the split path lost at 256 rows of 65536
]
# fmt: on
# The looped kernel makes three passes over its row (max; sum of exp; write), the row length a
# compile-time constant; the second and third read come from L1/L2. A one-pass online (max, sum)
# kernel lost to it at every width: its extra exp and dependence chain cost more than re-reading a
# row still in cache.
# A chunk that does not divide N leaves its last chunk mostly masked, so of the chunk, its half and
# its quarter the one that pads N least is taken (the larger on a tie), as the norms do.
#
# Looped rows go to the split path when there are fewer than SPLIT_BELOW_ROWS_PER_SM rows an SM:
# with one program a row, 64 rows of 262144 would keep 64 of 132 SMs busy; at two rows an SM the
# looped kernel is ahead again. The split path gives each program one segment of SPLIT_SEG values
# in registers (32 fp32 values a thread at 8 warps), so kernel 1 reads x once and computes the
# segment's max and sum from registers, and kernel 2 reads it once more (from L2 when x fits
# there) and writes y.
SPLIT_BELOW_ROWS_PER_SM = 1
SPLIT_SEG, SPLIT_STATS_WARPS, SPLIT_WRITE_WARPS = 8192, 8, 4
MAX_SPLITS = 4096  # kernel 2 loads a row's partials as one block; wider rows take the looped path
INTERPRET_SMS = 2  # the interpreter has no SMs; 2 keeps its split grids small

# Backward: the same rows, chosen from first principles (not yet measured). A program holds y and
# dy, two fp32 values per column where the forward holds one, so the fused rows take twice the
# forward's warps, at most 64 live values a thread as the forward's best 8192 row has. Looped
# chunks hold both tensors too: the forward's chunk widths at its warps keep 16-32 values a thread.
#   (max BLOCK_N, path, values a program, num_warps)
# fmt: off
SOFTMAX_BWD_TABLE = [
    (1024, "fused", 2048, 4),     # short rows: two or more a program, 16 values of y and of dy a thread
    (2048, "fused", 2048, 4),     # one row, 16 + 16 values a thread
    (4096, "fused", 4096, 8),     # one row, 16 + 16 values a thread
    (8192, "fused", 8192, 8),     # one row, 32 + 32: the forward's 64 live values a thread
    (16384, "looped", 4096, 16),  # a chunk in registers; pass 2 re-reads the row (64 KB in bf16) from L2
    (32768, "looped", 8192, 32),
    (None, "looped", 16384, 32),  # 16 + 16 values a thread; a 262144 row of y and dy is 1 MB in bf16,
                                  # so pass 2 finds only the row's tail (read last) in L2
]
# fmt: on
SPLIT_BWD_WARPS = 8  # both split kernels hold a segment of y and dy: 32 + 32 values a thread
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxConfig:
    path: str  # "fused", "looped" or "split"
    BLOCK_M: int  # rows a program (fused)
    BLOCK_N: int  # the padded row (fused) or one chunk of it (looped, split)
    num_warps: int
    n_splits: int  # programs a row (split; 1 otherwise)
    seg_len: int  # columns a program (split: SPLIT_SEG, held in registers; n_cols otherwise)


def _chunk(values, block_n, n_cols):
    """Of `values` (capped at the padded row), its half and its quarter: the one that pads N least."""
    chunk = min(values, block_n)
    return min((chunk, chunk // 2, chunk // 4), key=lambda c: cdiv(n_cols, c) * c)


def table_row(n_cols, table=SOFTMAX_TABLE):
    """Index of the row of `table` (SOFTMAX_TABLE or SOFTMAX_BWD_TABLE) that rows of n_cols values take."""
    block_n = next_power_of_2(n_cols)
    return next(i for i, row in enumerate(table) if row[0] is None or block_n <= row[0])


def _config(table, split_warps, n_rows, n_cols, n_sms):
    block_n = next_power_of_2(n_cols)
    _, path, values, warps = table[table_row(n_cols, table)]
    if path == "fused":
        return SoftmaxConfig("fused", max(1, values // block_n), block_n, warps, 1, n_cols)
    n_splits = cdiv(n_cols, SPLIT_SEG)
    if n_rows >= SPLIT_BELOW_ROWS_PER_SM * n_sms or n_splits > MAX_SPLITS:
        return SoftmaxConfig("looped", 1, _chunk(values, block_n, n_cols), warps, 1, n_cols)
    return SoftmaxConfig("split", 1, SPLIT_SEG, split_warps, n_splits, SPLIT_SEG)


@functools.lru_cache(maxsize=1024)
def softmax_config(n_rows, n_cols, n_sms):
    """Path and launch parameters of the forward for n_rows rows of n_cols values on a GPU with n_sms SMs."""
    return _config(SOFTMAX_TABLE, SPLIT_STATS_WARPS, n_rows, n_cols, n_sms)


@functools.lru_cache(maxsize=1024)
def softmax_backward_config(n_rows, n_cols, n_sms):
    """The same for the backward, from SOFTMAX_BWD_TABLE (both split kernels take SPLIT_BWD_WARPS)."""
    return _config(SOFTMAX_BWD_TABLE, SPLIT_BWD_WARPS, n_rows, n_cols, n_sms)


@triton.jit
def _softmax_fused_kernel(
    # pointers
    x_ptr, y_ptr,
    # matrix dimensions and strides (in elements)
    n_rows, n_cols, stride_xm, stride_ym,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """BLOCK_M whole rows in registers: x is read once, y written once."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows*stride can pass 2^31
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    # padding is -inf: exp 0, so it adds nothing to the sum
    x = tl.load(
        x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=float("-inf"), eviction_policy="evict_first"
    ).to(tl.float32)
    row_max = tl.max(x, axis=1)
    p = tl.exp2((x - row_max[:, None]) * LOG2E)
    inv_sum = 1.0 / tl.sum(p, axis=1)
    tl.store(
        y_ptr + rows[:, None] * stride_ym + cols[None, :], (p * inv_sum[:, None]).to(y_ptr.dtype.element_ty), mask=mask
    )


@triton.jit
def _write_softmax(
    x_row_ptr, y_row_ptr, col_start, col_end, n_cols, row_max, inv_sum, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr
):
    """y = exp(x - row_max) * inv_sum over x[col_start:col_end] of one row, last chunk first: the
    first pass read it last, so it is the likeliest to be still in L1/L2."""
    n_chunks = (col_end - col_start + BLOCK_N - 1) // BLOCK_N
    for i in range(0, n_chunks):
        cols = col_start + (n_chunks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        x = tl.load(x_row_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = tl.exp2((x - row_max) * LOG2E) * inv_sum
        tl.store(
            y_row_ptr + cols, y.to(y_row_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first"
        )  # y is not read again: keep L2 for x


@triton.jit
def _softmax_looped_kernel(
    # pointers
    x_ptr, y_ptr,
    # matrix dimensions and strides (in elements), compile-time constants: one compile per width
    n_cols: tl.constexpr, stride_xm: tl.constexpr, stride_ym: tl.constexpr,
    # meta-parameters
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """One row a program in BLOCK_N chunks, three passes: the max, the sum of exp(x - max), then
    y = exp(x - max) / sum. Passes 2 and 3 re-read the row from L1/L2 (evict_last keeps it)."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(
            x_row + cols, mask=col_mask(cols, n_cols, EVEN_N), other=float("-inf"), eviction_policy="evict_last"
        )
        m = tl.maximum(m, x.to(tl.float32))
    row_max = tl.max(m, axis=0)  # -inf only for a row of -inf: then every exp below is NaN, as in torch
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(
            x_row + cols, mask=col_mask(cols, n_cols, EVEN_N), other=float("-inf"), eviction_policy="evict_last"
        )
        s += tl.exp2((x.to(tl.float32) - row_max) * LOG2E)
    _write_softmax(x_row, y_ptr + row * stride_ym, 0, n_cols, n_cols, row_max, 1.0 / tl.sum(s, axis=0), BLOCK_N, EVEN_N)


@triton.jit
def _softmax_split_stats_kernel(
    # pointers: stats is (2, n_rows * n_splits) fp32, the maxes then the sums
    x_ptr, stats_ptr,
    # matrix dimensions and strides (in elements), compile-time constants: one compile per width
    n_cols: tl.constexpr, stride_xm: tl.constexpr, n_splits: tl.constexpr, n_tiles,
    # meta-parameters
    SEG: tl.constexpr,
):  # fmt: skip
    """Kernel 1 of the split path: program `tile` = (row, split) writes the (max, sum of exp(x -
    max)) of columns [split * SEG, (split + 1) * SEG) of its row, from one read into registers."""
    tile = tl.program_id(0)
    row = tile // n_splits
    cols = (tile % n_splits) * SEG + tl.arange(0, SEG)
    # evict_last: kernel 2 reads the segment again
    x = tl.load(
        x_ptr + row.to(tl.int64) * stride_xm + cols,
        mask=cols < n_cols,
        other=float("-inf"),
        eviction_policy="evict_last",
    ).to(tl.float32)
    # a segment of only -inf (padding past the row's end included) has max -inf; replacing it by
    # -FLT_MAX gives exp(-inf) = 0 instead of exp(-inf - (-inf)) = NaN, so the segment adds nothing
    seg_max = tl.maximum(tl.max(x, axis=0), NEG_FLT_MAX)
    tl.store(stats_ptr + tile, seg_max)
    tl.store(stats_ptr + n_tiles + tile, tl.sum(tl.exp2((x - seg_max) * LOG2E), axis=0))


@triton.jit
def _softmax_split_write_kernel(
    # pointers
    x_ptr, y_ptr, stats_ptr,
    # matrix dimensions and strides (in elements), compile-time constants
    n_cols: tl.constexpr, stride_xm: tl.constexpr, stride_ym: tl.constexpr, n_splits: tl.constexpr, n_tiles,
    # meta-parameters
    SPLITS: tl.constexpr, SEG: tl.constexpr,
):  # fmt: skip
    """Kernel 2 of the split path: combine the row's n_splits partials (SPLITS = their padded
    count) into its max and sum, then write the segment."""
    tile = tl.program_id(0)
    row = tile // n_splits
    parts = tl.arange(0, SPLITS)
    in_row = parts < n_splits
    seg_max = tl.load(stats_ptr + row * n_splits + parts, mask=in_row, other=NEG_FLT_MAX)
    seg_sum = tl.load(stats_ptr + n_tiles + row * n_splits + parts, mask=in_row, other=0.0)
    # -inf only for a row of -inf (every segment max is -FLT_MAX then): NaN below, as in torch
    row_max = tl.max(seg_max, axis=0)
    row_max = tl.where(row_max == NEG_FLT_MAX, float("-inf"), row_max)
    inv_sum = 1.0 / tl.sum(seg_sum * tl.exp2((seg_max - row_max) * LOG2E), axis=0)
    row64 = row.to(tl.int64)
    cols = (tile % n_splits) * SEG + tl.arange(0, SEG)
    mask = cols < n_cols
    x = tl.load(x_ptr + row64 * stride_xm + cols, mask=mask, other=0.0, eviction_policy="evict_first")
    y = tl.exp2((x.to(tl.float32) - row_max) * LOG2E) * inv_sum
    tl.store(
        y_ptr + row64 * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first"
    )  # y is not read again: keep L2 for x


# direct launches from a specialization's second on (common/direct_launch.py): one step's attention
# scores at decode are a few rows, where the host's cost of a launch is the softmax's
_fused, _looped = Launcher(_softmax_fused_kernel), Launcher(_softmax_looped_kernel)
_split_stats, _split_write = Launcher(_softmax_split_stats_kernel), Launcher(_softmax_split_write_kernel)


def launch_softmax(x, y, cfg=None):
    """Launch on validated arguments: x (..., N), N >= 1, any strides (rows_of: a contiguous x as
    it is, another as rows of unit column stride, a view or one copy); y contiguous, shaped like
    x, written in place (it may be x itself: each element is read before the program that writes
    it writes it). cfg: a SoftmaxConfig to use instead of softmax_config's choice (for tuning
    sweeps)."""
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    x, stride_x = rows_of(x)
    if cfg is None:
        cfg = softmax_config(n_rows, n_cols, sm_count(x.device.index or 0, INTERPRET_SMS))
    if cfg.path == "fused":
        _fused[(cdiv(n_rows, cfg.BLOCK_M),)](
            x, y, n_rows, n_cols, stride_x, n_cols, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, num_warps=cfg.num_warps
        )
    elif cfg.path == "looped":
        _looped[(n_rows,)](
            x,
            y,
            n_cols,
            stride_x,
            n_cols,
            BLOCK_N=cfg.BLOCK_N,
            EVEN_N=n_cols % cfg.BLOCK_N == 0,
            num_warps=cfg.num_warps,
        )
    else:
        n_tiles = n_rows * cfg.n_splits
        stats = torch.empty((2, n_tiles), dtype=torch.float32, device=x.device)
        _split_stats[(n_tiles,)](
            x, stats, n_cols, stride_x, cfg.n_splits, n_tiles, SEG=cfg.seg_len, num_warps=cfg.num_warps
        )
        _split_write[(n_tiles,)](
            x,
            y,
            stats,
            n_cols,
            stride_x,
            n_cols,
            cfg.n_splits,
            n_tiles,
            SPLITS=next_power_of_2(cfg.n_splits),
            SEG=cfg.seg_len,
            num_warps=SPLIT_WRITE_WARPS,
        )


@triton.jit
def _softmax_bwd_fused_kernel(
    # pointers
    y_ptr, dy_ptr, dx_ptr,
    # matrix dimensions and strides (in elements)
    n_rows, n_cols, stride_ym, stride_dym, stride_dxm,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """BLOCK_M whole rows in registers: y and dy are read once, dx written once."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows*stride can pass 2^31
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    # padding is 0: it adds nothing to the dot product
    y = tl.load(
        y_ptr + rows[:, None] * stride_ym + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
    ).to(tl.float32)
    dy = tl.load(
        dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
    ).to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    tl.store(
        dx_ptr + rows[:, None] * stride_dxm + cols[None, :],
        (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def _softmax_bwd_looped_kernel(
    # pointers
    y_ptr, dy_ptr, dx_ptr,
    # matrix dimensions and strides (in elements), compile-time constants: one compile per width
    n_cols: tl.constexpr, stride_ym: tl.constexpr, stride_dym: tl.constexpr, stride_dxm: tl.constexpr,
    # meta-parameters
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """One row a program in BLOCK_N chunks, two passes: sum(dy * y), then dx = y * (dy - sum),
    re-reading y and dy from L1/L2 (evict_last keeps them) last chunk first: pass 1 read it last,
    so it is the likeliest to be still there."""
    row = tl.program_id(0).to(tl.int64)
    y_row, dy_row, dx_row = y_ptr + row * stride_ym, dy_ptr + row * stride_dym, dx_ptr + row * stride_dxm
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        y = tl.load(y_row + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        dy = tl.load(dy_row + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        acc += y.to(tl.float32) * dy.to(tl.float32)
    dot = tl.sum(acc, axis=0)
    n_chunks = (n_cols + BLOCK_N - 1) // BLOCK_N
    for i in range(0, n_chunks):
        cols = (n_chunks - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        y = tl.load(y_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        tl.store(
            dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first"
        )  # dx is not read again: keep L2 for y and dy


@triton.jit
def _softmax_bwd_split_dot_kernel(
    # pointers: dots is (n_rows * n_splits,) fp32
    y_ptr, dy_ptr, dots_ptr,
    # matrix dimensions and strides (in elements), compile-time constants: one compile per width
    n_cols: tl.constexpr, stride_ym: tl.constexpr, stride_dym: tl.constexpr, n_splits: tl.constexpr,
    # meta-parameters
    SEG: tl.constexpr,
):  # fmt: skip
    """Kernel 1 of the split backward: program `tile` = (row, split) writes sum(dy * y) over
    columns [split * SEG, (split + 1) * SEG) of its row."""
    tile = tl.program_id(0)
    row = (tile // n_splits).to(tl.int64)
    cols = (tile % n_splits) * SEG + tl.arange(0, SEG)
    mask = cols < n_cols
    # evict_last: kernel 2 reads the segment again
    y = tl.load(y_ptr + row * stride_ym + cols, mask=mask, other=0.0, eviction_policy="evict_last")
    dy = tl.load(dy_ptr + row * stride_dym + cols, mask=mask, other=0.0, eviction_policy="evict_last")
    tl.store(dots_ptr + tile, tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=0))


@triton.jit
def _softmax_bwd_split_write_kernel(
    # pointers
    y_ptr, dy_ptr, dx_ptr, dots_ptr,
    # matrix dimensions and strides (in elements), compile-time constants
    n_cols: tl.constexpr, stride_ym: tl.constexpr, stride_dym: tl.constexpr, stride_dxm: tl.constexpr,
    n_splits: tl.constexpr, n_tiles,
    # meta-parameters
    SPLITS: tl.constexpr, SEG: tl.constexpr,
):  # fmt: skip
    """Kernel 2 of the split backward: sum the row's n_splits partial dot products (SPLITS = their
    padded count; the same sum in every program of the row, so dx is deterministic), then write
    the segment's dx. Tiles run last first: kernel 1 read those last, so they are the ones still in
    L2 when y and dy together outgrow it (in order, a scan larger than L2 would find none there)."""
    tile = n_tiles - 1 - tl.program_id(0)
    row = tile // n_splits
    parts = tl.arange(0, SPLITS)
    dot = tl.sum(tl.load(dots_ptr + row * n_splits + parts, mask=parts < n_splits, other=0.0), axis=0)
    row64 = row.to(tl.int64)
    cols = (tile % n_splits) * SEG + tl.arange(0, SEG)
    mask = cols < n_cols
    y = tl.load(y_ptr + row64 * stride_ym + cols, mask=mask, other=0.0, eviction_policy="evict_first")
    dy = tl.load(dy_ptr + row64 * stride_dym + cols, mask=mask, other=0.0, eviction_policy="evict_first")
    dx = y.to(tl.float32) * (dy.to(tl.float32) - dot)
    tl.store(dx_ptr + row64 * stride_dxm + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)


_bwd_fused, _bwd_looped = Launcher(_softmax_bwd_fused_kernel), Launcher(_softmax_bwd_looped_kernel)
_bwd_split_dot, _bwd_split_write = Launcher(_softmax_bwd_split_dot_kernel), Launcher(_softmax_bwd_split_write_kernel)


def launch_softmax_backward(dy, y, dx, cfg=None):
    """Launch the backward on validated arguments: y (..., N), N >= 1, and dx contiguous, dy shaped
    like them with any strides (rows_of, as launch_softmax's x); dx written. cfg: a SoftmaxConfig
    to use instead of softmax_backward_config's choice (for tuning sweeps)."""
    n_cols = y.shape[-1]
    n_rows = y.numel() // n_cols
    dy, stride_dy = rows_of(dy)
    if cfg is None:
        cfg = softmax_backward_config(n_rows, n_cols, sm_count(y.device.index or 0, INTERPRET_SMS))
    strides = (n_cols, stride_dy, n_cols)  # y, dy, dx
    if cfg.path == "fused":
        _bwd_fused[(cdiv(n_rows, cfg.BLOCK_M),)](
            y, dy, dx, n_rows, n_cols, *strides, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, num_warps=cfg.num_warps
        )
    elif cfg.path == "looped":
        _bwd_looped[(n_rows,)](
            y,
            dy,
            dx,
            n_cols,
            *strides,
            BLOCK_N=cfg.BLOCK_N,
            EVEN_N=n_cols % cfg.BLOCK_N == 0,
            num_warps=cfg.num_warps,
        )
    else:
        n_tiles = n_rows * cfg.n_splits
        dots = torch.empty((n_tiles,), dtype=torch.float32, device=y.device)
        _bwd_split_dot[(n_tiles,)](
            y, dy, dots, n_cols, *strides[:2], cfg.n_splits, SEG=cfg.seg_len, num_warps=cfg.num_warps
        )
        _bwd_split_write[(n_tiles,)](
            y,
            dy,
            dx,
            dots,
            n_cols,
            *strides,
            cfg.n_splits,
            n_tiles,
            SPLITS=next_power_of_2(cfg.n_splits),
            SEG=cfg.seg_len,
            num_warps=cfg.num_warps,
        )


def _softmax_backward(dy, y):
    """dx for the saved output y (contiguous, (..., N)) and the upstream gradient dy shaped like
    it, any strides: one that as_rows cannot view as rows of unit column stride (an expanded
    gradient, as y.sum()'s) is copied once."""
    dx = contiguous_like(y)
    if y.numel():
        launch_softmax_backward(dy, y, dx)
    return dx


softmax_backward_op = define_op(
    "softmax_backward(Tensor dy, Tensor y) -> Tensor",
    _softmax_backward,
    lambda dy, y: contiguous_like(y),
)


def _save_output(ctx, inputs, output):
    ctx.save_for_backward(output)  # y, not x: dx needs only y (and no exp is recomputed)


def _softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return softmax_backward_op(dy, y)


def _softmax_into(x, y):
    """y = softmax(x) for a checked x and a contiguous y shaped like it (it may be x itself)."""
    if x.numel():  # no rows, or rows of no values: nothing to write
        launch_softmax(x, y)


def _softmax_empty(x):
    """The operator's new output (its fake implementation too)."""
    return contiguous_like(x)


softmax_op, softmax_out_op = define_ops(
    "softmax", "Tensor x", _softmax_empty, _softmax_into, backward=_softmax_grad, setup_context=_save_output
)


def softmax(x, out=None):
    """Softmax over the last dim (operators llmk::softmax and llmk::softmax_out).

    x: (..., N) fp16, bf16 or fp32, any strides (a view whose leading dims cannot merge, or whose
       last dim is not unit-stride, is copied once). N >= 1 any size.
    out: optional contiguous buffer shaped like x in x's dtype; it may be x itself (in place).
       Forward-only: with out given, an x that requires grad raises under grad mode.
    Returns y: (..., N), x's dtype, contiguous (out itself when given). A row of only -inf gives
    NaN, as torch.softmax does. Differentiable (without out): the backward saves y and runs
    llmk::softmax_backward, dx = y * (dy - sum(dy * y)).
    """
    check_tensor("x", x)
    if out is None:
        return softmax_op(x)
    check_out("out", out, x.shape, x.dtype, x.device)
    softmax_out_op(x, out)
    return out
