"""Matrix-vector product for one-token decode (M = 1), on the CUDA cores, in Triton.

    c = act(a @ b + bias)     a (1, K), b (K, N), bias (N,) or None, c (1, N); fp16/bf16,
                              fp32 products and sums, one rounding

With one row of a, a tensor-core tile is 15/16 padding (tl.dot's smallest M is 16) and there are
only 2*K*N FLOPs: the product is a single pass over b, and its speed is how well that pass
streams. Memory traffic:

    read  K*N*e (b) + K*e (a, from L2 after the first strip) + N*e (bias, if any)
    write N*e (c)
    split K: + SPLIT_K*N*4*2 (fp32 partial sums written, then read back by the last slice)

At N = K = 4096 in bf16 that is 32 MB of b against 8 KB of a and c and, with 16 slices, 0.5 MB of
partials (1.6%): about 10.7 us at an H100's 3.0 TB/s copy bandwidth.

Each program takes a strip of BLOCK_N columns of b and one slice of K, and walks the slice in
BLOCK_K steps, loading a (BLOCK_K, BLOCK_N) tile of b and BLOCK_K values of a. The fp32 products
accumulate elementwise in a tile-shaped accumulator, summed across K once, after the loop: the
loop itself is loads and FMAs, no cross-thread reduction. Both layouts of b load along memory:
- row-major b (K, N), stride_bn == 1: (BLOCK_K, BLOCK_N) tiles, BLOCK_N * e contiguous bytes a row;
- b = W.T for an nn.Linear weight W (N, K), stride_bk == 1: (BLOCK_N, BLOCK_K) tiles of W, BLOCK_K
  contiguous values of each of BLOCK_N rows.
The loop is a tl.range with NUM_STAGES: unlike the launch option num_stages, which pipelines only
loads that feed a tl.dot, that pipelines these loads too (16-byte cp.async into shared memory,
NUM_STAGES - 1 tiles ahead), so the bytes in flight are bounded by shared memory, not registers.

Split K, where the strips are too few to fill the GPU (a row-major b at N = 4096 in 256-wide strips
has 16): SPLIT_K slices of a strip are separate programs. Each stores its fp32 sums in scratch
(common/workspace.py) and counts itself in the strip's arrival counter; the last to arrive adds
the slices in a fixed order (the result does not depend on which finished first), sets the
counter back to zero, and runs the epilogue (bias, activation, one rounding) on the full sum. One
launch. A short K (fewer than 2 * MIN_SLICE_STEPS steps) is not split: the strip stores c directly.

Edges: columns past N wrap (% N) on load, so b's loads need no mask across N (the stores are
masked); the K tail is masked unless K divides by BLOCK_K (EVEN_K). Every stride of a, b, c and
bias is passed; offsets are 64-bit, since K * N (and a column view's K * stride) can pass 2^31.
"""

import functools

import triton
import triton.language as tl

from llmk.common.device import INTERPRET, sm_count
from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.triton_utils import activate
from llmk.common.workspace import split_k_buffers
from llmk.gemm.triton_matmul_common import fit_split

# b's layout -> (BLOCK_N, BLOCK_K, num_warps, NUM_STAGES, programs per SM). The split brings the
# strips (cdiv(N, BLOCK_N)) up to at most `programs per SM` x SMs programs, all resident at once,
# so none waits for a second wave. Each row is the candidate with the smallest geometric-mean GPU
# time over M = 1 at five decode shapes of a 4096-wide model, bf16, measured by
# scripts/tune/gemv_sweep.py on an H100; docs/tuning/gemm.md has the figures.
GEMV_CONFIGS = {
    # W.T (an nn.Linear weight, what a model passes; what matmul() runs here): 4 rows of W x 1024
    # values, 2 KB runs of each row a step (its bandwidth: docs/tuning/gemm.md)
    "linear": (4, 1024, 4, 3, 4),
    # row-major (K, N): 128 columns (256 bytes a row) x 64 rows a step. The tiled kernel's split-K
    # beats it at every shape swept, so matmul() runs that; this row serves launch_gemv called directly.
    "row_major": (128, 64, 4, 3, 2),
}
# A slice keeps at least this many BLOCK_K steps: its pipeline (NUM_STAGES - 1 tiles ahead) fills
# before it drains, and its partial sums (8 bytes a column, written and read) stay a few percent
# of the b bytes it reads (4 steps of 32 rows: 128 rows x 2 bytes a column).
MIN_SLICE_STEPS = 4

# The interpreter: small tiles and a small GPU, so that the test shapes (N and K up to a few
# hundred) have several strips, several K steps and a K tail, and split K with a few programs.
# (N = 17, K = 257 row-major: 2 strips x 4 slices of 5, 5, 5 and 2 steps.)
INTERPRET_CONFIGS = {"row_major": (16, 16, 4, 1, 2), "linear": (4, 16, 4, 1, 2)}
INTERPRET_SMS = 8


def is_row_major(b):
    """True unless b is laid out along K (stride_bk == 1, as W.T of an nn.Linear weight); a b
    contiguous in neither dimension takes row-major tiles, correct at any strides."""
    return not (b.stride(0) == 1 and b.stride(1) != 1)


def plan_for(n, k, config, n_sms):
    """(BLOCK_N, BLOCK_K, num_warps, NUM_STAGES, SPLIT_K) of a config row for an N x K product on
    n_sms SMs: the largest split whose programs fit in the row's programs per SM, with at least
    MIN_SLICE_STEPS K steps a slice and none empty."""
    block_n, block_k, warps, stages, programs_per_sm = config
    strips = cdiv(n, block_n)
    split = min(programs_per_sm * n_sms // strips, cdiv(k, block_k) // MIN_SLICE_STEPS)
    return block_n, block_k, warps, stages, fit_split(k, block_k, split)


@functools.lru_cache(maxsize=4096)
def gemv_plan(n, k, b_row_major, n_sms, config=None):
    """plan_for on GEMV_CONFIGS' row for b's layout (INTERPRET_CONFIGS' in the interpreter), or on
    `config`, a (BLOCK_N, BLOCK_K, num_warps, NUM_STAGES, programs per SM) row."""
    if config is None:
        config = (INTERPRET_CONFIGS if INTERPRET else GEMV_CONFIGS)["row_major" if b_row_major else "linear"]
    return plan_for(n, k, config, n_sms)


@triton.jit
def strip_sum(
    a_ptr,
    b_ptr,
    strip,
    k_first,
    k_end,
    N,
    stride_ak,
    stride_bk,
    stride_bn,
    B_ROW_MAJOR: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """fp32 (BLOCK_N,): sum over k in [k_first, k_end) of a[k] * b[k, n], for the columns n of the
    strip (columns past N wrap to valid ones)."""
    rn = ((strip * BLOCK_N + tl.arange(0, BLOCK_N)) % N).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    a_offs = rk.to(tl.int64) * stride_ak
    if B_ROW_MAJOR:
        b_offs = rk[:, None].to(tl.int64) * stride_bk + rn[None, :] * stride_bn
        acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    else:
        b_offs = rn[:, None] * stride_bn + rk[None, :].to(tl.int64) * stride_bk
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in tl.range(k_first, k_end, BLOCK_K, num_stages=NUM_STAGES):
        k_wide = tl.cast(k, tl.int64)  # (tl.cast: the interpreter's loop counter is a Python int)
        a_ptrs = a_ptr + k_wide * stride_ak + a_offs
        b_ptrs = b_ptr + k_wide * stride_bk + b_offs
        # b is read once: its lines should not push a, the partials and the counters out of L2
        if EVEN_K:
            x = tl.load(a_ptrs)
            w = tl.load(b_ptrs, eviction_policy="evict_first")
        else:  # zeros past the slice's end add nothing
            in_k = rk < k_end - k
            x = tl.load(a_ptrs, mask=in_k, other=0.0)
            if B_ROW_MAJOR:
                w = tl.load(b_ptrs, mask=in_k[:, None], other=0.0, eviction_policy="evict_first")
            else:
                w = tl.load(b_ptrs, mask=in_k[None, :], other=0.0, eviction_policy="evict_first")
        # products of two fp16/bf16 values are exact in fp32
        if B_ROW_MAJOR:
            acc += x.to(tl.float32)[:, None] * w.to(tl.float32)
        else:
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    if B_ROW_MAJOR:
        sums = tl.sum(acc, axis=0)
    else:
        sums = tl.sum(acc, axis=1)
    return sums


@triton.jit
def epilogue_store(
    c_ptr,
    z_ptr,
    bias_ptr,
    acc,
    cols,
    N,
    stride_cn,
    stride_bias,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    STORE_Z: tl.constexpr,
):
    """Bias and activation on the strip's full fp32 sums, one rounding to c's dtype, the store.
    STORE_Z: the pre-activation sums are stored too, into z (laid out like c), for the backward."""
    in_n = cols < N
    cols = cols.to(tl.int64)  # a column view's N * stride can pass 2^31
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols * stride_bias, mask=in_n, other=0.0).to(tl.float32)
    if STORE_Z:
        tl.store(z_ptr + cols * stride_cn, acc.to(z_ptr.dtype.element_ty), mask=in_n)
    acc = activate(acc, ACTIVATION)
    tl.store(c_ptr + cols * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=in_n)


@triton.jit(do_not_specialize=["SPLIT_K"])  # its value never helps the compiler: one build per SPLIT_BLOCK
def _gemv_kernel(
    # pointers: a (1, K), b (K, N), c (1, N), bias (N,); with SPLIT_BLOCK > 1 also fp32 scratch
    # (SPLIT_K, N) for the slices' sums and int32 zeros (strips,) that count the slices in
    a_ptr, b_ptr, c_ptr, z_ptr, bias_ptr, partial_ptr, counter_ptr,
    # matrix dimensions; slice s covers K values [s * SLICE_K, (s + 1) * SLICE_K), a multiple of BLOCK_K
    N, K, SLICE_K, SPLIT_K,
    # strides, in elements
    stride_ak, stride_bk, stride_bn, stride_cn, stride_bias,
    # meta-parameters; SPLIT_BLOCK: SPLIT_K rounded up to a power of two, 1 when K is not split
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_Z: tl.constexpr, B_ROW_MAJOR: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_BLOCK: tl.constexpr, NUM_STAGES: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """Program (slice, strip), strips fastest: the programs in flight together read whole rows of a
    row-major b, and adjacent rows of W."""
    pid = tl.program_id(0)
    strips = tl.cdiv(N, BLOCK_N)
    strip = pid % strips
    pid_k = pid // strips
    k_first = pid_k * SLICE_K
    acc = strip_sum(
        a_ptr,
        b_ptr,
        strip,
        k_first,
        tl.minimum(k_first + SLICE_K, K),
        N,
        stride_ak,
        stride_bk,
        stride_bn,
        B_ROW_MAJOR,
        BLOCK_N,
        BLOCK_K,
        NUM_STAGES,
        EVEN_K,
    )
    cols = strip * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT_BLOCK > 1:
        in_n = cols < N
        tl.store(partial_ptr + pid_k.to(tl.int64) * N + cols, acc, mask=in_n)
        tl.debug_barrier()  # every thread's stores are issued before the count says they are
        # release/acquire: the last slice to count itself in finds every other slice's sums stored
        if tl.atomic_add(counter_ptr + strip, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            rs = tl.arange(0, SPLIT_BLOCK)
            # one (SPLIT_BLOCK, BLOCK_N) load: every slice's sums in flight at once, added in one
            # fixed tree order; .cg: from L2, where the other SMs' stores are, never a stale L1 line
            parts = tl.load(
                partial_ptr + rs[:, None].to(tl.int64) * N + cols[None, :],
                mask=(rs < SPLIT_K)[:, None] & in_n[None, :],
                other=0.0,
                cache_modifier=".cg",
            )
            tl.atomic_xchg(counter_ptr + strip, 0)  # ready for the next launch
            epilogue_store(
                c_ptr,
                z_ptr,
                bias_ptr,
                tl.sum(parts, axis=0),
                cols,
                N,
                stride_cn,
                stride_bias,
                HAS_BIAS,
                ACTIVATION,
                STORE_Z,
            )
    else:
        epilogue_store(c_ptr, z_ptr, bias_ptr, acc, cols, N, stride_cn, stride_bias, HAS_BIAS, ACTIVATION, STORE_Z)


def launch_gemv(a, b, bias, activation, c, config=None, split_k=None, z=None):
    """c = activation(a @ b + bias) on validated arguments (gemm.triton_matmul_common.check_matmul_args),
    one launch.

    a: (1, K) fp16 or bf16, any strides (a row or a column view of a larger matrix). K >= 0.
    b: (K, N), a's dtype, any strides; row-major (K, N) and W.T of an nn.Linear weight W (N, K)
       load along memory, others are correct but slow. N >= 1.
    bias: (N,) in a's dtype or fp32, any stride, or None. activation: None, "gelu", "gelu_tanh", "silu".
    c: (1, N), a's dtype, any strides; written, never read.
    config: a (BLOCK_N, BLOCK_K, num_warps, NUM_STAGES, programs per SM) row to plan with; None
       takes GEMV_CONFIGS' row for b's layout.
    split_k: K slices a strip, lowered by fit_split until none is empty (1: no split); None: the plan's.
    z: None, or (1, N) with c's strides: receives the pre-activation a @ b + bias (training forward).
    """
    n, k = b.shape[1], a.shape[1]
    row_major = is_row_major(b)
    block_n, block_k, warps, stages, split = gemv_plan(n, k, row_major, sm_count(a.device, INTERPRET_SMS), config)
    if split_k is not None:
        split = fit_split(k, block_k, split_k)
    strips = cdiv(n, block_n)
    partial = counters = c  # unused pointers still need a tensor
    if split > 1:
        partial, counters = split_k_buffers(a.device, split * n, strips)
    _gemv_kernel[(strips * split,)](
        a,
        b,
        c,
        z if z is not None else c,
        bias if bias is not None else c,
        partial,
        counters,
        n,
        k,
        cdiv(cdiv(k, block_k), split) * block_k,
        split,
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(1),
        bias.stride(0) if bias is not None else 0,
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        STORE_Z=z is not None,
        B_ROW_MAJOR=row_major,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT_BLOCK=next_power_of_2(split),
        NUM_STAGES=stages,
        EVEN_K=k % block_k == 0,
        num_warps=warps,
    )
