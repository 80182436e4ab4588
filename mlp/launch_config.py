"""The 2D tiling shared by the MLP's elementwise kernels (bias + GELU, the gated units SwiGLU and
GeGLU): the launch table and the map from a program to its tile.

Both kernels stream (rows, n_cols) matrices: each value is read once and written once, and only
the bias is reused (loaded once per tile, from L2). A program takes one tile of BLOCK_M rows by
BLOCK_N columns; the grid is one-dimensional and walks the column tiles of a band of rows first,
so consecutive programs touch consecutive memory. Tiles over (rows, cols) rather than a flat index
keep any row stride (a view of a wider buffer, the two halves of a fused gate/up projection) free
of copies, and give each column tile its bias without an integer modulo per element.

What the table has to get right for a streaming kernel:
- 16-byte accesses: BLOCK_N spans whole 16-byte vectors (the compiler vectorizes when the row
  stride is a multiple of 16 elements, as every real model width is);
- enough bytes in flight: at 3 TB/s and ~1 us of DRAM latency under load an H100 needs ~3 MB of
  loads outstanding, ~23 KB per SM; 4-8 KB tiles per input, several programs an SM, keep more
  than that in flight;
- whole waves: the last wave of programs runs part-full, so more, smaller tiles waste less of it
  (until the per-program overhead shows: 1024-value tiles lost 5% on the largest matrices);
- every SM busy: small matrices get smaller tiles, so that there are still several per SM;
- no predicates: BLOCK_N is chosen to divide n_cols when a nearby power of two does, and masks
  that are known true at compile time (EVEN_M, EVEN_N) are dropped by the compiler.
"""

import functools
from dataclasses import dataclass

import triton
import triton.language as tl

from llmk.common.ints import cdiv, next_power_of_2

# By kernel, then element size in bytes: (widest BLOCK_N, elements a program, num_warps).
# Measured by scripts/tune/mlp_sweep.py on an H200 (the mlp bench's shapes of 16M+ elements, fp16
# and bf16); the figures are in docs/tuning/mlp.md.
# - swiglu (two inputs): 2048 values a program, best or within 1% at most shapes; 8192 lost where
#   its programs make a part-full last wave, 1024 lost at the largest matrices. GeGLU launches with
#   this row too (mlp/triton_glu.py: one kernel for both): the same bytes a value, 3*M*I*e; its
#   GELU's few more FLOPs leave it memory-bound. Untuned for GeGLU.
# - bias_gelu (one input, more math a value): 4096 values, best or within 1% at most shapes.
# fp32 keeps the same bytes a program (half the values), untuned.
TILE_TABLE = {
    "swiglu": {2: (1024, 2048, 4), 4: (512, 1024, 4)},
    "bias_gelu": {2: (1024, 4096, 4), 4: (512, 2048, 4)},
}
# The backward kernels' tiles, untuned (scripts/tune/mlp_sweep.py times TILE_TABLE's kernels):
# - swiglu_backward (reads gate, up and dy, writes dgate and dup): swiglu's tile, 12 KB of loads a
#   program in 16-bit. GeGLU's backward too (the same bytes, 5*M*I*e).
BACKWARD_TILE_TABLE = {
    "swiglu_backward": {2: (1024, 2048, 4), 4: (512, 1024, 4)},
}
# Below MIN_PROGRAMS programs (four per SM of a 132-SM H100) tiles are halved, rows first, down to
# MIN_TILE values (2 KB of fp16, 8 values a thread of 4 warps): smaller tiles only add programs.
MIN_PROGRAMS = 528
MIN_TILE = 1024


@dataclass(frozen=True)
class TileConfig:
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    grid: int
    EVEN_M: bool  # BLOCK_M divides n_rows: no row mask
    EVEN_N: bool  # BLOCK_N divides n_cols: no column mask


@functools.lru_cache(maxsize=1024)
def tile_config(kernel, n_rows, n_cols, elem_size):
    """Tile and launch parameters of `kernel` (a TILE_TABLE or BACKWARD_TILE_TABLE key) for an
    (n_rows, n_cols) matrix of elem_size-byte values."""
    table = TILE_TABLE if kernel in TILE_TABLE else BACKWARD_TILE_TABLE
    return tile_config_for(table[kernel][elem_size], n_rows, n_cols, elem_size)


def tile_config_for(row, n_rows, n_cols, elem_size, min_programs=MIN_PROGRAMS):
    """tile_config from one table entry row = (widest BLOCK_N, elements a program, num_warps):
    what tile_config does with TILE_TABLE's entry, and what a tuning sweep does with a candidate.
    min_programs=1 keeps the entry's whole tile on a small matrix (the tests force it so)."""
    widest, tile, warps = row
    block_n = min(widest, next_power_of_2(n_cols))
    # of the widest block, its half and its quarter, the one that pads n_cols least (the larger on
    # a tie): 11008 = 43 * 256 takes 256 and no mask, where 1024 would leave a 3/4-empty last tile
    block_n = min((block_n, max(1, block_n // 2), max(1, block_n // 4)), key=lambda b: cdiv(n_cols, b) * b)
    block_m = max(1, min(tile // block_n, next_power_of_2(n_rows)))

    def n_tiles(bm, bn):
        return cdiv(n_rows, bm) * cdiv(n_cols, bn)

    while n_tiles(block_m, block_n) < min_programs and block_m * block_n > MIN_TILE:
        if block_m > 1:
            block_m //= 2
        else:
            block_n //= 2
    # at least one 16-byte vector a thread: fewer warps for small tiles
    warps = max(1, min(warps, block_m * block_n * elem_size // (32 * 16)))
    return TileConfig(block_m, block_n, warps, n_tiles(block_m, block_n), n_rows % block_m == 0, n_cols % block_n == 0)


@triton.jit
def tile_offsets(
    pid, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr
):
    """Program pid's tile -> (rows int64 (BLOCK_M,), cols (BLOCK_N,), mask (BLOCK_M, BLOCK_N) of
    the elements in the matrix, mask (BLOCK_N,) of the columns in it). A mask known to be all
    true is a constant, so the compiler drops it from every load and store."""
    n_col_tiles = tl.cdiv(n_cols, BLOCK_N)
    rows = (pid // n_col_tiles).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows * stride can pass 2^31
    cols = (pid % n_col_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    if EVEN_M:
        in_rows = tl.full((BLOCK_M,), True, tl.int1)
    else:
        in_rows = rows < n_rows
    if EVEN_N:
        in_cols = tl.full((BLOCK_N,), True, tl.int1)
    else:
        in_cols = cols < n_cols
    return rows, cols, in_rows[:, None] & in_cols[None, :], in_cols


# Kernels that also sum their output over rows (bias + GELU's dbias) take bands: a program loops over
# ROWS rows of one BLOCK_N column tile, BLOCK_M rows an iteration (the tile as tile_config_for makes
# it), and writes one fp32 partial sum of its band, reduced by a second kernel; the grid walks the
# column tiles of a band first. (widest BLOCK_N, elements an iteration, num_warps), untuned:
# - 128 columns (256 B of a 16-bit row, two 128-byte lines): narrow, so that bands of 128 rows still
#   make many programs. A program runs ROWS / BLOCK_M iterations, so a grid of few programs a slot
#   ends in a long, part-full last wave: at 72 registers a thread (ptxas for sm_90, 16-bit, with
#   dbias) an H100 holds seven programs an SM, 924 in all, and 2048 x 16384 makes 2048 programs
#   (2.2 waves) at 128 columns, 1024 (1.1) at 256;
# - 2048 values an iteration: x and dy, 8 KB of 16-bit loads in flight a program.
BAND_TABLE = {
    "bias_gelu_backward": {2: (128, 2048, 4), 4: (128, 1024, 4)},
}
# 128 rows a band: the partial sums (4 bytes, written and read once) add 8 / (128 * 3 * e) of the
# backward's traffic, 1% at e = 2 bytes. Bands are halved, down to one iteration, until there are
# MIN_PROGRAMS programs.
BAND_ROWS = 128


@dataclass(frozen=True)
class BandConfig:
    BLOCK_M: int
    BLOCK_N: int
    ROWS: int  # rows a program (a band), a multiple of BLOCK_M
    num_warps: int
    n_bands: int  # rows of the partial sums
    grid: int
    EVEN_M: bool  # BLOCK_M divides n_rows: no row mask
    EVEN_N: bool  # BLOCK_N divides n_cols: no column mask


@functools.lru_cache(maxsize=1024)
def band_config(kernel, n_rows, n_cols, elem_size, reduce_rows):
    """Launch parameters of `kernel` (a BAND_TABLE key); reduce_rows: whether the rows are summed
    (if not, a band is one iteration: the plain tiling)."""
    return band_config_for(BAND_TABLE[kernel][elem_size], n_rows, n_cols, elem_size, BAND_ROWS if reduce_rows else 1)


def band_config_for(row, n_rows, n_cols, elem_size, band_rows, min_programs=MIN_PROGRAMS):
    """band_config from one table entry (as tile_config_for takes) and a band height of up to
    band_rows rows (rounded up to whole iterations). min_programs=1 keeps the entry's whole tile
    and band on a small matrix (the tests force it so, to run several iterations a band)."""
    tile = tile_config_for(row, n_rows, n_cols, elem_size, min_programs)
    n_col_tiles = cdiv(n_cols, tile.BLOCK_N)
    rows = max(tile.BLOCK_M, min(next_power_of_2(band_rows), next_power_of_2(n_rows)))
    while rows > tile.BLOCK_M and cdiv(n_rows, rows) * n_col_tiles < min_programs:
        rows //= 2
    n_bands = cdiv(n_rows, rows)
    return BandConfig(
        tile.BLOCK_M, tile.BLOCK_N, rows, tile.num_warps, n_bands, n_bands * n_col_tiles, tile.EVEN_M, tile.EVEN_N
    )
