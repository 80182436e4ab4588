"""Launch heuristics for the row-wise norms (RMSNorm, residual RMSNorm, LayerNorm): one table.

Every norm has two kernels:
- *fused*: BLOCK_M whole rows in registers; x crosses HBM once. Best for short rows, where one row
  is too little work for a program.
- *looped*: one program per row, the row in chunks, twice (statistics, then normalize); the second
  read is served from L1/L2. Holding one chunk instead of a row needs fewer registers, so more
  programs fit on an SM and more loads are in flight: on an H200 (bf16) it beat the fused kernel
  by 3-8% from N = 2048 up.

Figures in the comments are the best of sweeps over chunk, warps and grid (GB/s, bf16, 16384 rows
for N <= 16384 and 4096 rows above, on an H200 whose copy bandwidth measured 4245 GB/s).
"""
import functools
from dataclasses import dataclass

from common.ints import cdiv, next_power_of_2

# Fused kernel, by padded row bytes (next_power_of_2(N) * element size):
#   (max row bytes, BLOCK_M rows per program, num_warps)
FUSED_TABLE = [
    (128, 64, 4),   # N <= 64 fp16: many short rows a program, or launch count is the whole cost
    (512, 16, 4),   # N <= 256 fp16: 16 rows x 256 = 32 values a thread
    (1024, 4, 2),   # N = 512: 2570 GB/s (compile 2897: it wins here)
    (2048, 2, 4),   # N = 1024: 3178 GB/s (compile 3102-3272, run to run)
]

# LayerNorm keeps rows up to 4 KB in the fused kernel with 4 warps when they fill at least 3/4 of
# the padded block: N = 2048 bf16 fused 3792 GB/s, looped 3585. From N = 4096 its looped kernel
# (three passes, row length as a compile-time constant) is ahead: 3926 vs 3810 at 4096, 4080 vs
# 3817 at 8192, 3736 vs 2974 at 32768 (compile 3166 / 3995 / 3704).
#   (max row bytes, num_warps)
LAYERNORM_FUSED_TABLE = [(4096, 4)]

# Looped kernel, by padded row bytes: (max row bytes, chunk bytes). num_warps = chunk bytes / 512,
# one 16-byte load per thread per chunk (at most 32 warps). RMSNorm / residual RMSNorm GB/s with
# the row length as a compile-time constant (a later run, same H200):
LOOP_CHUNK_TABLE = [
    (4096, 2048),     # N = 2048:  3666 / 3762
    (8192, 4096),     # N = 4096:  3907 / 3961
    (32768, 8192),    # N = 8192, 16384: 4152, 4180 / 4002, 4044
    (65536, 16384),   # N = 32768: 4103 / 3999
    (None, 32768),    # N = 65536, 131072: 3825, 3255 / 4059, 3689
]
# A chunk that does not divide N leaves most of its last chunk masked: N = 5120 in 4096-value
# chunks ran 3090 GB/s, in 1024-value chunks 3875. So of the chunk, its half and its quarter, the
# one that pads N least is taken (the larger on a tie).
# Tried and left: a grid capped at one or two programs per SM striding over rows, to keep the rows
# in flight inside L2 for the second read, was no faster (RMSNorm N = 131072: 2933 vs 2890) and
# slower for the residual kernel (3580 vs 3694); num_stages 1 vs 3 made no difference.


@dataclass(frozen=True)
class RowConfig:
    looped: bool
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    grid: int


@functools.lru_cache(maxsize=1024)
def row_config(n_rows, n_cols, elem_size, layernorm=False):
    """Pick kernel and launch parameters for n_rows rows of n_cols values of elem_size bytes."""
    block_n = next_power_of_2(n_cols)
    row_bytes = block_n * elem_size
    for max_bytes, block_m, warps in FUSED_TABLE:
        if row_bytes <= max_bytes:
            return RowConfig(False, block_m, block_n, warps, cdiv(n_rows, block_m))
    if layernorm and 4 * n_cols >= 3 * block_n:
        for max_bytes, warps in LAYERNORM_FUSED_TABLE:
            if row_bytes <= max_bytes:
                return RowConfig(False, 1, block_n, warps, n_rows)
    chunk_bytes = next(c for max_bytes, c in LOOP_CHUNK_TABLE if max_bytes is None or row_bytes <= max_bytes)
    chunk = min(chunk_bytes // elem_size, block_n)
    chunk = min((chunk, chunk // 2, chunk // 4), key=lambda c: cdiv(n_cols, c) * c)
    return RowConfig(True, 1, chunk, min(32, max(4, chunk * elem_size // 512)), n_rows)
