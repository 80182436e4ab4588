"""The 2D tiling shared by the MLP's elementwise kernels (bias + GELU, SwiGLU): the launch table and
the map from a program to its tile.

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

from common.ints import cdiv, next_power_of_2

# By kernel, then element size in bytes: (widest BLOCK_N, elements a program, num_warps).
# Measured by scripts/tune/mlp_sweep.py on an H200 (the mlp bench's shapes of 16M+ elements, fp16
# and bf16); the figures are in docs/tuning/mlp.md.
# - swiglu (two inputs): 2048 values a program, best or within 1% at most shapes; 8192 lost where
#   its programs make a part-full last wave, 1024 lost at the largest matrices.
# - bias_gelu (one input, more math a value): 4096 values, best or within 1% at most shapes.
# fp32 keeps the same bytes a program (half the values), untuned.
TILE_TABLE = {
    "swiglu": {2: (1024, 2048, 4), 4: (512, 1024, 4)},
    "bias_gelu": {2: (1024, 4096, 4), 4: (512, 2048, 4)},
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
    """Tile and launch parameters of `kernel` (a TILE_TABLE key) for an (n_rows, n_cols) matrix of
    elem_size-byte values."""
    return tile_config_for(TILE_TABLE[kernel][elem_size], n_rows, n_cols, elem_size)


def tile_config_for(row, n_rows, n_cols, elem_size, min_programs=MIN_PROGRAMS):
    """tile_config from one table entry row = (widest BLOCK_N, elements a program, num_warps):
    what tile_config does with TILE_TABLE's entry, and what a tuning sweep does with a candidate.
    min_programs=1 keeps the entry's whole tile on a small matrix (the tests force it so)."""
    widest, tile, warps = row
    block_n = min(widest, next_power_of_2(n_cols))
    # of the widest block, its half and its quarter, the one that pads n_cols least (the larger on
    # a tie): 11008 = 43 * 256 takes 256 and no mask, where 1024 would leave a 3/4-empty last tile
    block_n = min((block_n, max(1, block_n // 2), max(1, block_n // 4)),
                  key=lambda b: cdiv(n_cols, b) * b)
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
    return TileConfig(block_m, block_n, warps, n_tiles(block_m, block_n),
                      n_rows % block_m == 0, n_cols % block_n == 0)


@triton.jit
def tile_offsets(pid, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 EVEN_M: tl.constexpr, EVEN_N: tl.constexpr):
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
