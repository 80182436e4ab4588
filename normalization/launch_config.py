"""Launch heuristics for the row-wise norms (RMSNorm, residual RMSNorm, LayerNorm): one table.

Every norm has two kernels:
- *fused*: BLOCK_M whole rows in registers; x crosses HBM once. Best for short rows, where one row
  is too little work for a program.
- *looped*: a row in chunks, twice (statistics, then normalize); the second read is served from
  L1/L2. Holding one chunk instead of a row needs fewer registers, so more programs fit on an SM
  and more loads are in flight: on an H200 (fp16) it beat the fused kernel by 3-8% from N = 2048 up.

Figures in the comments are the best of sweeps over block shape and warps (GB/s, fp16, 16384 rows
on an H200 whose copy bandwidth measured 4245 GB/s; torch.compile for comparison).
"""
import functools
from dataclasses import dataclass

import torch
import triton

from common.device import INTERPRET

# Fused kernel, by padded row bytes (next_power_of_2(N) * element size):
#   (max row bytes, BLOCK_M rows per program, num_warps)
FUSED_TABLE = [
    (128, 64, 4),   # N <= 64 fp16: many short rows a program, or launch count is the whole cost
    (512, 16, 4),   # N <= 256 fp16: 16 rows x 256 = 32 values a thread
    (1024, 4, 2),   # N = 512: 2570 GB/s (compile 2897: it wins here)
    (2048, 2, 4),   # N = 1024: 3178 GB/s (compile 3102-3272, run to run)
]

# LayerNorm keeps rows up to 32 KB in the fused kernel: its looped pass 1 carries a Welford update
# per value, and measured 2620 / 2795 / 2747 / 3166 GB/s at N = 2048 / 4096 / 8192 / 16384 bf16
# where the fused kernel did 3670 / 3843 / 3782 / 3749 (compile 2708 / 3159 / 4007 / 4120).
#   (max row bytes, BLOCK_M, num_warps), after FUSED_TABLE
LAYERNORM_FUSED_TABLE = [
    (4096, 1, 4),
    (8192, 1, 8),
    (16384, 1, 8),
    (32768, 1, 16),
]

# Looped kernel with one program per row, for padded rows up to LOOPED_MAX_ROW_BYTES. The chunk is
# half the row, clamped to 2-8 KB, and num_warps gives each thread one 16-byte load per chunk:
#   N = 2048 fp16: 1024-value chunks, 4 warps: 3694 GB/s (fused 3579, compile 3209)
#   N = 4096:      2048, 8 warps:              3948 (fused 3743, compile 3567)
#   N >= 8192:     4096, 16 warps:             4177 at 8192, 4169 at 16384 (compile 4174, 4126)
# A chunk that does not divide N leaves most of its last chunk masked: N = 5120 in 4096-value
# chunks ran 3090 GB/s, in 1024-value chunks 3875. So of the chunk, its half and its quarter, the
# one that pads N least is taken (the larger on a tie).
LOOPED_MAX_ROW_BYTES = 65536
LOOP_CHUNK_BYTES = (2048, 8192)

# Rows wider than 64 KB: one program per SM, striding over rows, so the rows in flight (SMs x row
# bytes: 33 MB at N = 131072 fp16) stay inside L2 for the second read. More programs per SM, or
# uncapped, measured slower: the second read then misses L2. N = 65536 / 131072 at 4096 rows:
# 3438 / 2961 GB/s (compile 2853 / 2721).
WIDE_CHUNK_BYTES = 16384
WIDE_WARPS = 32


@dataclass(frozen=True)
class RowConfig:
    looped: bool
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    grid: int
    grid_stride: bool = False  # the grid is smaller than the row count: programs loop over rows


@functools.lru_cache(maxsize=None)
def _sm_count():
    if INTERPRET:
        return 2  # fewer programs than rows in the tests' shapes, so the row loop runs
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@functools.lru_cache(maxsize=1024)
def row_config(n_rows, n_cols, elem_size, layernorm=False):
    """Pick kernel and launch parameters for n_rows rows of n_cols values of elem_size bytes."""
    block_n = triton.next_power_of_2(n_cols)
    row_bytes = block_n * elem_size
    for max_bytes, block_m, warps in FUSED_TABLE + (LAYERNORM_FUSED_TABLE if layernorm else []):
        if row_bytes <= max_bytes:
            return RowConfig(False, block_m, block_n, warps, triton.cdiv(n_rows, block_m))
    if row_bytes <= LOOPED_MAX_ROW_BYTES:
        lo, hi = LOOP_CHUNK_BYTES
        chunk = min(max(row_bytes // 2, lo), hi) // elem_size
        chunk = min((chunk, chunk // 2, chunk // 4), key=lambda c: triton.cdiv(n_cols, c) * c)
        return RowConfig(True, 1, chunk, max(4, chunk * elem_size // 512), n_rows)
    grid = min(n_rows, _sm_count())
    return RowConfig(True, 1, WIDE_CHUNK_BYTES // elem_size, WIDE_WARPS, grid, grid_stride=True)
