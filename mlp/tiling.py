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
  loads outstanding, ~23 KB per SM; a 16 KB tile per input keeps several times that in flight,
  as the kernels compile to 56-70 registers a thread at 4 warps (sm_90), so 7 programs fit an SM;
- every SM busy: small matrices get smaller tiles, so that there are still several per SM;
- no predicates: BLOCK_N is chosen to divide n_cols when a nearby power of two does, and masks
  that are known true at compile time (EVEN_M, EVEN_N) are dropped by the compiler.
"""
import functools
from dataclasses import dataclass

import triton
import triton.language as tl

# By element size in bytes: (widest BLOCK_N, elements a program, num_warps).
TILE_TABLE = {
    # fp16/bf16: 8192 values = 16 KB of each input a program; 4 warps -> 64 values a thread,
    # eight 16-byte loads in flight per input; BLOCK_N up to 1024 keeps 2 KB contiguous per row
    2: (1024, 8192, 4),
    # fp32: the same 16 KB a program (4096 values, 32 a thread: eight 16-byte loads)
    4: (512, 4096, 4),
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
def tile_config(n_rows, n_cols, elem_size):
    """Tile and launch parameters for an (n_rows, n_cols) matrix of elem_size-byte values."""
    widest, tile, warps = TILE_TABLE[elem_size]
    block_n = min(widest, triton.next_power_of_2(n_cols))
    # of the widest block, its half and its quarter, the one that pads n_cols least (the larger on
    # a tie): 11008 = 43 * 256 takes 256 and no mask, where 1024 would leave a 3/4-empty last tile
    block_n = min((block_n, max(1, block_n // 2), max(1, block_n // 4)),
                  key=lambda b: triton.cdiv(n_cols, b) * b)
    block_m = max(1, min(tile // block_n, triton.next_power_of_2(n_rows)))

    def n_tiles(bm, bn):
        return triton.cdiv(n_rows, bm) * triton.cdiv(n_cols, bn)

    while n_tiles(block_m, block_n) < MIN_PROGRAMS and block_m * block_n > MIN_TILE:
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
