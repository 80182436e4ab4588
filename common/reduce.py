"""The second stage of a deterministic column sum: out (N,) = partial (P, N) summed over P.

The backward kernels that reduce over rows (dweight and dbias of the norms, dbias of bias+GELU and
of matmul's epilogue) write one fp32 row of partial sums per program (or band of rows) instead of
adding into one vector with atomics; this kernel then adds the P rows of each column in a fixed
order, in fp32, and rounds once to out's dtype: the same bits every run.
"""

import triton
import triton.language as tl

from llmk.common.device import sm_count
from llmk.common.direct_launch import Launcher
from llmk.common.ints import cdiv, next_power_of_2

# The interpreter's SM count: 3, so the small test shapes split N into several strips
INTERPRETER_SMS = 3


@triton.jit
def _sum_partials_kernel(
    # pointers
    partial_ptr, out_ptr,
    # matrix dimensions
    n_partials, n_cols,
    # meta-parameters
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[j] = sum over p of partial[p, j], in fp32 in a fixed order, rounded once to out's dtype."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_row = cols < n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_P):
        rows = start + tl.arange(0, BLOCK_P)
        acc += tl.load(
            partial_ptr + rows[:, None] * n_cols + cols[None, :],
            mask=(rows < n_partials)[:, None] & in_row[None, :],
            other=0.0,
        )
    tl.store(out_ptr + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=in_row)


# direct launches from a specialization's second on (common/direct_launch.py): the reduce follows
# every norm backward, whose host time is its cost at micro-batch sizes
_sum_partials = Launcher(_sum_partials_kernel)


def sum_config(n_partials, n_cols, sms):
    """(BLOCK_P, BLOCK_N, num_warps) of the reduce over a (P, N) fp32 partial buffer: one program a
    BLOCK_N column strip, BLOCK_P partial rows a trip. The loop's loads wait one trip at a time, so
    few, tall trips: all of P (up to 8192 values a program) in one or two; and strips narrow enough
    for about one program an SM (N = 1024 on 132 SMs: 32 strips of 32). Measured for the norms'
    dweight by scripts/tune/norm_bwd_sweep.py (docs/tuning/normalization.md): 3.2 us at 132 x 1024."""
    block_n = min(256, max(32, next_power_of_2(cdiv(n_cols, sms))))
    block_p = min(next_power_of_2(n_partials), max(8, 8192 // block_n))
    return block_p, block_n, 8


def sum_partials(partial, out, blocks=None):
    """out (N,) = partial (P, N) contiguous fp32 summed over P, in out's dtype (deterministic).
    blocks: (BLOCK_P, BLOCK_N, num_warps) instead of sum_config's choice (tuning sweeps)."""
    n_partials, n_cols = partial.shape
    block_p, block_n, warps = blocks or sum_config(n_partials, n_cols, sm_count(partial.device, INTERPRETER_SMS))
    _sum_partials[(cdiv(n_cols, block_n),)](
        partial, out, n_partials, n_cols, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=warps
    )
