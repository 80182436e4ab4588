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

# Looped kernel with one program per row, by padded row bytes:
#   (max row bytes, chunk bytes, num_warps): each thread loads 8-16 B per chunk
LOOPED_TABLE = [
    (4096, 2048, 4),     # N = 2048 fp16: 3694 GB/s (fused 3579, compile 3209)
    (8192, 4096, 8),     # N = 4096: 3948 (fused 3743, compile 3567)
    (65536, 8192, 16),   # N = 8192 / 16384 / 32768: 4177 / 4169 / 3836 (compile 4174 / 4126 / 4106)
]

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


@functools.lru_cache(maxsize=None)
def _sm_count():
    if INTERPRET:
        return 4  # the interpreter runs programs one after another; a few exercise the row loop
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@functools.lru_cache(maxsize=1024)
def row_config(n_rows, n_cols, elem_size):
    """Pick kernel and launch parameters for n_rows rows of n_cols values of elem_size bytes."""
    block_n = triton.next_power_of_2(n_cols)
    row_bytes = block_n * elem_size
    for max_bytes, block_m, warps in FUSED_TABLE:
        if row_bytes <= max_bytes:
            return RowConfig(False, block_m, block_n, warps, triton.cdiv(n_rows, block_m))
    for max_bytes, chunk_bytes, warps in LOOPED_TABLE:
        if row_bytes <= max_bytes:
            return RowConfig(True, 1, min(block_n, chunk_bytes // elem_size), warps, n_rows)
    return RowConfig(True, 1, WIDE_CHUNK_BYTES // elem_size, WIDE_WARPS, min(n_rows, _sm_count()))
