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

from llmk.common.device import sm_count
from llmk.common.ints import cdiv, next_power_of_2

# Fused kernel, by padded row bytes (next_power_of_2(N) * element size):
#   (max row bytes, BLOCK_M rows per program, num_warps)
# fmt: off
FUSED_TABLE = [
    (128, 64, 4),   # N <= 64 fp16: many short rows a program, or launch count is the whole cost
    (512, 16, 4),   # N <= 256 fp16: 16 rows x 256 = 32 values a thread
    (1024, 4, 2),   # N = 512: 4 rows of 2 warps, the best of the sweep
    (2048, 2, 4),   # N = 1024: 2 rows of 4 warps; wider rows go to the looped kernel
]
# fmt: on

# LayerNorm keeps rows up to 4 KB in the fused kernel (4 warps) when they fill at least 3/4 of the
# padded block: its looped kernel makes three passes, and at N = 2048 the one read wins; from
# N = 4096 the looped kernel is ahead.
#   (max row bytes, num_warps)
LAYERNORM_FUSED_TABLE = [(4096, 4)]

# Looped kernel, by padded row bytes: (max row bytes, chunk bytes). num_warps = chunk bytes / 512,
# one 16-byte load per thread per chunk (at most 32 warps). Wider rows take wider chunks: fewer
# trips of the loop, until a chunk's registers cost programs per SM.
# fmt: off
LOOP_CHUNK_TABLE = [
    (4096, 2048),     # N = 2048 bf16
    (8192, 4096),     # N = 4096
    (32768, 8192),    # N = 8192, 16384
    (65536, 16384),   # N = 32768
    (None, 32768),    # N = 65536 and up
]
# fmt: on
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
    prefetch: bool = True  # the backward's fused kernel: load the next block ahead (see its docstring)


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
    return "looped", next(
        i for i, (max_bytes, _) in enumerate(LOOP_CHUNK_TABLE) if max_bytes is None or row_bytes <= max_bytes
    )


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


# Backward kernels (normalization/triton_norm_backward.py). The grid is persistent: each program
# keeps an (N,) fp32 dweight partial, so P programs cost a (P, N) buffer and a reduce over P
# (common.reduce.sum_partials). The fused kernel holds a tile of BLOCK_M = tile / padded N rows and
# loads the next tile while it computes on this one; short rows want small programs, several an SM,
# whose waits overlap. Keyed by padded N, not bytes: the registers hold fp32 whatever the dtype;
# LayerNorm and residual RMSNorm (du) keep more values live a row, hence their own rows. The
# sweep behind every entry: docs/tuning/normalization.md (scripts/tune/norm_bwd_sweep.py).
#   kernel -> [(max padded N, tile values, num_warps, programs an SM)]
BACKWARD_FUSED_TABLE = {
    "rmsnorm": [(512, 4096, 8, 1), (1024, 4096, 4, 2), (4096, 4096, 8, 2), (8192, 8192, 16, 1)],
    "residual_rmsnorm": [(512, 4096, 8, 1), (1024, 4096, 4, 4), (4096, 4096, 8, 2), (8192, 8192, 32, 1)],
    "layernorm": [(512, 4096, 8, 1), (1024, 4096, 4, 4), (4096, 4096, 8, 2), (8192, 8192, 32, 1)],
}
# Wider rows: the looped backward, BLOCK_M rows a step in chunks of up to `chunk` values (that, its
# half or its quarter, whichever pads N least), one program an SM. Each step reads, adds to and
# writes back the program's dw partial in L2 and keeps its rows there for the second pass, so the
# choice turns on what fits in L2: one row a step while the partials and rows fit (N = 32768), two
# rows with the next chunk loaded ahead once they do not (131072), which halves the partials' traffic.
#   kernel -> [(max padded N or None, BLOCK_M rows a step, chunk values, prefetch)]
BACKWARD_LOOP_TABLE = {
    "rmsnorm": [(32768, 1, 16384, False), (None, 2, 8192, True)],
    "residual_rmsnorm": [(32768, 1, 8192, False), (None, 2, 8192, True)],
    "layernorm": [(None, 1, 8192, False)],
}
# The interpreter's SM count: 3 (programs, per programs-an-SM), so small test shapes give each program several rows
# (and some programs none) and the reduce sums several partials.
INTERPRETER_SMS = 3


def backward_table_row(n_cols, kernel="rmsnorm"):
    """(table, index) that backward_config reads: ("fused", i) of BACKWARD_FUSED_TABLE[kernel] or
    ("looped", i) of BACKWARD_LOOP_TABLE[kernel]."""
    block_n = next_power_of_2(n_cols)
    for i, (max_n, _, _, _) in enumerate(BACKWARD_FUSED_TABLE[kernel]):
        if block_n <= max_n:
            return "fused", i
    return "looped", next(
        i for i, (max_n, _, _, _) in enumerate(BACKWARD_LOOP_TABLE[kernel]) if max_n is None or block_n <= max_n
    )


def backward_config(n_rows, n_cols, elem_size, device, kernel="rmsnorm"):
    """Kernel and launch of the norms' backward for n_rows rows of n_cols values of elem_size bytes;
    kernel: "rmsnorm", "residual_rmsnorm" (the RMSNorm backward with du) or "layernorm"."""
    return _backward_config(n_rows, n_cols, elem_size, sm_count(device, INTERPRETER_SMS), kernel)


@functools.lru_cache(maxsize=1024)
def _backward_config(n_rows, n_cols, elem_size, sms, kernel):
    block_n = next_power_of_2(n_cols)
    table, i = backward_table_row(n_cols, kernel)
    if table == "fused":
        _, tile, warps, per_sm = BACKWARD_FUSED_TABLE[kernel][i]
        block_m = min(128, tile // block_n)  # 128 rows a step: the most compiled (N = 32) and checked
        return RowConfig(False, block_m, block_n, warps, min(per_sm * sms, cdiv(n_rows, block_m)))
    _, block_m, chunk, prefetch = BACKWARD_LOOP_TABLE[kernel][i]
    chunk = min(chunk, block_n)
    chunk = min((chunk, chunk // 2, chunk // 4), key=lambda c: cdiv(n_cols, c) * c)  # as looped_config
    return RowConfig(
        True,
        block_m,
        chunk,
        min(32, max(4, block_m * chunk * elem_size // 512)),
        min(sms, cdiv(n_rows, block_m)),
        prefetch,
    )
