"""Launch heuristics for the row-wise norms (RMSNorm, residual RMSNorm, LayerNorm): one table.

Every norm has two kernels:
- *fused*: BLOCK_M whole rows in registers; x crosses HBM once. Best for short rows, where one row
  is too little work for a program.
- *looped*: one program per row, the row in chunks, twice (statistics, then normalize); the second
  read is served from L1/L2. Holding one chunk instead of a row needs fewer registers, so more
  programs fit on an SM and more loads are in flight: from N = 2048 up it beats the fused kernel.

The tables were measured by scripts/tune/norm_sweep.py on an H200 (bf16); the figures, and what
was tried and lost, are in docs/tuning/normalization.md.
"""
import functools
from dataclasses import dataclass

from common.device import sm_count
from common.ints import cdiv, next_power_of_2

# Fused kernel, by padded row bytes (next_power_of_2(N) * element size):
#   (max row bytes, BLOCK_M rows per program, num_warps)
FUSED_TABLE = [
    (128, 64, 4),   # N <= 64 fp16: many short rows a program, or launch count is the whole cost
    (512, 16, 4),   # N <= 256 fp16: 16 rows x 256 = 32 values a thread
    (1024, 4, 2),   # N = 512: 4 rows of 2 warps, the best of the sweep
    (2048, 2, 4),   # N = 1024: 2 rows of 4 warps; wider rows go to the looped kernel
]

# LayerNorm keeps rows up to 4 KB in the fused kernel (4 warps) when they fill at least 3/4 of the
# padded block: its looped kernel makes three passes, and at N = 2048 the one read wins; from
# N = 4096 the looped kernel is ahead.
#   (max row bytes, num_warps)
LAYERNORM_FUSED_TABLE = [(4096, 4)]

# Looped kernel, by padded row bytes: (max row bytes, chunk bytes). num_warps = chunk bytes / 512,
# one 16-byte load per thread per chunk (at most 32 warps). Wider rows take wider chunks: fewer
# trips of the loop, until a chunk's registers cost programs per SM.
LOOP_CHUNK_TABLE = [
    (4096, 2048),     # N = 2048 bf16
    (8192, 4096),     # N = 4096
    (32768, 8192),    # N = 8192, 16384
    (65536, 16384),   # N = 32768
    (None, 32768),    # N = 65536 and up
]
# A chunk that does not divide N leaves most of its last chunk masked (N = 5120 in 4096-value
# chunks lost a fifth of its bandwidth), so of the chunk, its half and its quarter, the one that
# pads N least is taken (the larger on a tie).


@dataclass(frozen=True)
class RowConfig:
    looped: bool
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    grid: int


def table_row(n_cols, elem_size, layernorm=False):
    """(table name, row index) that row_config reads for rows of n_cols values of elem_size bytes:
    "fused" (FUSED_TABLE), "layernorm_fused" (LAYERNORM_FUSED_TABLE) or "looped" (LOOP_CHUNK_TABLE)."""
    block_n = next_power_of_2(n_cols)
    row_bytes = block_n * elem_size
    for i, (max_bytes, _, _) in enumerate(FUSED_TABLE):
        if row_bytes <= max_bytes:
            return "fused", i
    if layernorm and 4 * n_cols >= 3 * block_n:
        for i, (max_bytes, _) in enumerate(LAYERNORM_FUSED_TABLE):
            if row_bytes <= max_bytes:
                return "layernorm_fused", i
    return "looped", next(i for i, (max_bytes, _) in enumerate(LOOP_CHUNK_TABLE)
                          if max_bytes is None or row_bytes <= max_bytes)


@functools.lru_cache(maxsize=1024)
def row_config(n_rows, n_cols, elem_size, layernorm=False):
    """Pick kernel and launch parameters for n_rows rows of n_cols values of elem_size bytes."""
    block_n = next_power_of_2(n_cols)
    table, i = table_row(n_cols, elem_size, layernorm)
    if table == "fused":
        _, block_m, warps = FUSED_TABLE[i]
        return RowConfig(False, block_m, block_n, warps, cdiv(n_rows, block_m))
    if table == "layernorm_fused":
        return RowConfig(False, 1, block_n, LAYERNORM_FUSED_TABLE[i][1], n_rows)
    return looped_config(n_rows, n_cols, elem_size, LOOP_CHUNK_TABLE[i][1])


def looped_config(n_rows, n_cols, elem_size, chunk_bytes):
    """The looped kernel's launch for chunks of up to chunk_bytes (a LOOP_CHUNK_TABLE entry)."""
    chunk = min(chunk_bytes // elem_size, next_power_of_2(n_cols))
    chunk = min((chunk, chunk // 2, chunk // 4), key=lambda c: cdiv(n_cols, c) * c)
    return RowConfig(True, 1, chunk, min(32, max(4, chunk * elem_size // 512)), n_rows)


# Backward kernels (normalization/triton_norm_backward.py). The grid is persistent, one program per
# SM (at most): each program keeps an (N,) fp32 dweight partial, so P programs cost a (P, N) fp32
# buffer and a reduce over P; one an SM keeps the buffer no larger than Liger's. Latency hiding
# then rests on each program's own loads: the fused kernel loads the next step's x and dy while it
# computes on this step's, a tile of BLOCK_M = tile / padded N rows. Keyed by padded N, not bytes:
# the registers hold fp32 whatever the input dtype. Every row compiles without spills for sm_90
# (ptxas -v, bf16 and fp32 inputs, HAS_DU on); not yet timed on a GPU.
#   (max padded N, tile values, num_warps)
BACKWARD_FUSED_TABLE = [
    (512, 4096, 8),     # short rows, 8 to 128 a step: 150-190 registers a thread; a tile of 8192
                        # spilled at 8 warps and at 16 (128 registers a thread)
    (4096, 8192, 16),   # N = 1024..4096: 1-4 rows, 16 KB of x and of dy in bf16 a step, 128
                        # registers; N = 8192 (one row) spilled at 16 and 32 warps: looped
]
# Wider rows: the looped backward, chunks of up to 8192 values (of them, their half and their
# quarter, the one that pads N least, as looped_config), one 16-byte load a thread of x and of dy
# per chunk: num_warps = chunk bytes / 512, at most 32 (8 values a thread of each of x, dy, w and
# two fp32 accumulators, inside the 64 registers a thread of 1024 threads).
BACKWARD_LOOP_CHUNK = 8192
# The interpreter's SM count: 3 programs, so small test shapes give each program several rows
# (and some programs none) and the reduce sums several partials.
INTERPRETER_SMS = 3


def backward_table_row(n_cols):
    """Index of BACKWARD_FUSED_TABLE that backward_config reads, or None for the looped kernel."""
    block_n = next_power_of_2(n_cols)
    return next((i for i, (max_n, _, _) in enumerate(BACKWARD_FUSED_TABLE) if block_n <= max_n), None)


def backward_config(n_rows, n_cols, elem_size, device):
    """Kernel and launch of the norms' backward for n_rows rows of n_cols values of elem_size bytes."""
    return _backward_config(n_rows, n_cols, elem_size, sm_count(device, INTERPRETER_SMS))


@functools.lru_cache(maxsize=1024)
def _backward_config(n_rows, n_cols, elem_size, sms):
    block_n = next_power_of_2(n_cols)
    i = backward_table_row(n_cols)
    if i is not None:
        _, tile, warps = BACKWARD_FUSED_TABLE[i]
        block_m = min(128, tile // block_n)  # 128 rows a step: the most compiled (N = 32) and checked
        return RowConfig(False, block_m, block_n, warps, min(sms, cdiv(n_rows, block_m)))
    chunk = min(BACKWARD_LOOP_CHUNK, block_n)
    chunk = min((chunk, chunk // 2, chunk // 4), key=lambda c: cdiv(n_cols, c) * c)  # as looped_config
    return RowConfig(True, 1, chunk, min(32, max(4, chunk * elem_size // 512)), min(sms, n_rows))
