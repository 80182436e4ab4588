"""Tiled FP16/BF16 matrix multiply with an optional fused epilogue, in Triton: the kernel matmul
(gemm/matmul_ops.py) runs unless a call suits the TMA or the GEMV kernel better.

    c = act(a @ b + bias)        a (M, K), b (K, N), bias (N,); fp32 accumulation, one rounding

Each program computes one BLOCK_M x BLOCK_N tile of c: it walks K in BLOCK_K steps, loading an
A tile (BLOCK_M x BLOCK_K) and a B tile (BLOCK_K x BLOCK_N) and feeding them to `tl.dot` (the
tensor cores) with an fp32 accumulator; the bias and the activation are applied to that fp32
accumulator, and the tile is rounded and stored once. Memory traffic with perfect reuse is
(M*K + K*N + M*N) * e bytes; each A row-panel is really read once per column of tiles and each B
column-panel once per row of tiles, which the grouped program order (gemm/triton_matmul_common.py)
turns into L2 hits.

Every stride is passed, so a transposed or padded view of a or b is read in place, with no copy.
Edges: rows and columns wrap (% M, % N) on load, so loads need no mask in those dimensions, and
the store is masked; the last K step is masked unless K divides by BLOCK_K (EVEN_K).

Block sizes are autotuned on the GPU over CONFIGS, keyed by (M rounded up to a power of two, N, K,
b's layout, dtype): one tuning per layer shape, not per batch size. Triton's interpreter (no GPU)
runs INTERPRET_CONFIG instead: autotuning there would only time numpy.

Split-K, for one-token decode (M = 1) against N <= 8192, where the few output tiles leave SMs
idle: SPLIT_K programs share each tile, program s reducing the s-th slice of the BLOCK_K steps.
Each stores its fp32 partial tile in a scratch buffer and counts itself in the tile's arrival
counter (common/workspace.py); the last to arrive adds the slices in a fixed order (the result does
not depend on which finished first), then runs the epilogue (bias, activation, one rounding) on the
full sum. One launch; the partials (SPLIT_K * M * N * 4 bytes written and read back) are small
next to b's K * N * 2. SPLIT_TABLE picks it by M and output tiles per SM; it is not autotuned.
"""

import functools

import triton
import triton.language as tl

from llmk.common.device import INTERPRET
from llmk.common.ints import cdiv
from llmk.common.timing import autotune_bench
from llmk.common.workspace import split_k_buffers
from llmk.gemm.triton_matmul_common import (
    GROUP_M,
    epilogue_store,
    fit_split,
    grouped_tile,
    load_k_step,
    m_bucket,
    pick_config,
    picked_config,
    untuned_config,
)

# Autotuned configs: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). Shared memory is
# (BLOCK_M + BLOCK_N) * BLOCK_K * 2 bytes a stage; all fit the 227 KB an H100/H200 block may take.
# Rows measured by scripts/tune/small_shapes.py, host_and_picks.py small and matmul_small_sweep.py
# on an H100/H200; docs/tuning/gemm.md has the figures.
# fmt: off
CONFIGS = [
    # large M and N: the Hopper tile; two warpgroups each hold a 64x256 fp32 accumulator; one program an SM
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),  # one more stage (192 KB): a few percent at 4096^3 bf16
    (128, 128, 64, 4, 4),  # twice the tiles of 128x256, for shapes where those leave SMs idle
    (64, 256, 32, 4, 4),   # the Triton tutorial's config for moderate M against large N
    (64, 128, 64, 4, 4),   # M ~ 128-512: 4x the tiles of 128x256
    (64, 128, 128, 4, 3),  # 1024^3: 256 tiles, two an SM; long K steps beat 64x128x64 and 128x128x64
    (64, 64, 128, 4, 6),   # M = 128 against N = 4096: 128 programs; six 32 KB stages keep loads in flight
    # M <= 64 is bound by reading b once (decode): small tiles, long K steps to keep loads in flight
    (32, 64, 128, 4, 4),   # 17 <= M <= 32
    (16, 64, 256, 4, 4),   # 17 <= M <= 32 against N = 4096: two row tiles of 64 programs
    (16, 128, 128, 4, 4),  # M <= 16 against N = 14336: 112 tiles
    (16, 32, 256, 4, 4),   # M <= 16 with N = 4096: 128 column tiles, about one an SM
]
# fmt: on
# Small tiles are slow for large M (under 64 rows there is no wgmma, and each loaded B tile serves
# few rows), and large tiles are mostly padding for small M: prune_configs hands the autotuner
# only the part of the table that fits M. Up to SMALL_M rows every tile no taller than M competes.
SMALL_M = 256
# Below TINY_MACS multiply-adds (M rounded up x N x K; 2^27 is 128 x 1024 x 1024) a GEMM takes a few
# microseconds whatever its tiles, so timing candidates would only cost compile time: the fitting
# config with the smallest tile (the most programs) runs untimed.
TINY_MACS = 1 << 27

# Split-K, when the output tiles leave SMs idle: (largest M, largest tiles / SMs, SPLIT_K,
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)); the first row that M and the tile count
# (of the row's tile) satisfy wins; no row, no split. Not autotuned: the tile and SPLIT_K size the
# workspace before the launch. One-token decode is bound by reading b once, and with few tiles too
# few loads are in flight: the slices bring the grid to about one program an SM. M >= 2, M = 128
# and 1024^3 lose to one kernel. Measured by scripts/tune/matmul_small_sweep.py (H200) and
# scripts/tune/host_and_picks.py m1 (H100); docs/tuning/gemm.md has the figures.
# fmt: off
SPLIT_TABLE = [
    (1, 1 / 8, 4, (16, 128, 128, 4, 4)),  # N <= 2048: 16 tiles, 4 slices
    (1, 1 / 8, 4, (16, 256, 64, 8, 4)),   # N <= 4096: 16 tiles of 256 columns, 4 slices
    (1, 1 / 2, 2, (16, 128, 128, 4, 4)),  # N <= 8192: 64 tiles, 2 slices; from 112 tiles one kernel wins
]
# fmt: on
# A slice keeps at least this many BLOCK_K steps, so its software pipeline (num_stages - 1 loads
# in flight) fills before it drains, and the fp32 partials stay small against what it reads.
MIN_SLICE_STEPS = 4
# SMs that plan() counts in the interpreter, which has none: a small GPU, so that the small test
# shapes (32x32 tiles) reach every row of SPLIT_TABLE with a few dozen programs.
INTERPRET_SMS = 16
# Interpreter: one config with several tiles in every dimension of the small test shapes, so edge
# tiles, the K tail and the grouped order all run. (BLOCK_M, BLOCK_N, BLOCK_K); the split-K path
# runs it too.
INTERPRET_CONFIG = (32, 32, 32)


def prune_configs(configs, named_args, **kwargs):
    """Keep the configs whose BLOCK_M fits the key's M: no taller than M rounded up, and at least
    64 rows once M passes SMALL_M; only the smallest of them below TINY_MACS."""
    m = named_args["M_BUCKET"]
    fit = [c for c in configs if c.kwargs["BLOCK_M"] <= m and (m <= SMALL_M or c.kwargs["BLOCK_M"] >= 64)]
    if m * named_args["N"] * named_args["K"] < TINY_MACS:
        return [min(fit, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
    return fit


def autotune_configs():
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": GROUP_M}, num_warps=warps, num_stages=stages
        )
        for bm, bn, bk, warps, stages in CONFIGS
    ]


def interpret_meta():
    bm, bn, bk = INTERPRET_CONFIG
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M)


@triton.jit
def dot_tile(
    a_ptr,
    b_ptr,
    pid_m,
    pid_n,
    k_first,
    k_last,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """The fp32 (BLOCK_M, BLOCK_N) tile (pid_m, pid_n) of a @ b summed over BLOCK_K steps
    [k_first, k_last)."""
    # Edge tiles re-read valid rows/columns (% M, % N) instead of masking every load; the store
    # drops them. The wrap keeps the 16-element contiguity the compiler needs for vector loads
    # whenever M or N divides by 16.
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    k_start = tl.cast(k_first, tl.int64) * BLOCK_K  # 64-bit: K * stride_ak can pass 2^31 (a transposed)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + (k_start + rk[None, :]) * stride_ak
    b_ptrs = b_ptr + (k_start + rk[:, None]) * stride_bk + rn[None, :].to(tl.int64) * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        a, b = load_k_step(a_ptrs, b_ptrs, rk, K - k * BLOCK_K, EVEN_K)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit(do_not_specialize=["M_BUCKET"])
def _matmul_kernel(
    # pointers; z: the pre-activation output (STORE_Z), laid out like c
    a_ptr, b_ptr, c_ptr, z_ptr, bias_ptr,
    # matrix dimensions; M_BUCKET is only the autotune key (M rounded up to a power of two)
    M, N, K, M_BUCKET,
    # strides, in elements
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # meta-parameters
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """One program: tile tl.program_id(0) (grouped order) over all of K, then the epilogue."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = dot_tile(
        a_ptr,
        b_ptr,
        pid_m,
        pid_n,
        0,
        tl.cdiv(K, BLOCK_K),
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        EVEN_K,
    )
    epilogue_store(
        c_ptr,
        z_ptr,
        bias_ptr,
        acc,
        pid_m,
        pid_n,
        M,
        N,
        stride_cm,
        stride_cn,
        HAS_BIAS,
        ACTIVATION,
        STORE_Z,
        BLOCK_M,
        BLOCK_N,
    )


@triton.jit
def _matmul_split_k_kernel(
    # pointers; z: the pre-activation output (STORE_Z), laid out like c; partial: fp32 scratch
    # (SPLIT_K * M, N), counter: int32 zeros (tiles,)
    a_ptr, b_ptr, c_ptr, z_ptr, bias_ptr, partial_ptr, counter_ptr,
    # matrix dimensions
    M, N, K,
    # strides, in elements
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # meta-parameters
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """Program (tile, s): slice s of the K steps of one tile; the slice to finish last sums them."""
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_steps = tl.cdiv(K, BLOCK_K)
    slice_steps = tl.cdiv(k_steps, SPLIT_K)  # the launcher leaves no slice empty
    k_first = pid_k * slice_steps
    acc = dot_tile(
        a_ptr,
        b_ptr,
        pid_m,
        pid_n,
        k_first,
        tl.minimum(k_first + slice_steps, k_steps),
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        EVEN_K,
    )

    # this slice's fp32 sum, unrounded, into rows pid_k * M ... of the scratch (rows past M, as
    # with M = 1 in a 16-row tile, are neither written nor read)
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: SPLIT_K * M * N can pass 2^31
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs = rm[:, None] * N + rn[None, :]
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(partial_ptr + pid_k * M * N + offs, acc, mask=mask)
    tl.debug_barrier()  # every thread's stores are issued before the count says they are
    # release/acquire: the last slice to count itself in finds every other slice's sum stored
    if tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):  # slice order, unrolled: every load in flight at once
            # .cg: from L2, where the other SMs' stores are, never a stale L1 line
            acc += tl.load(partial_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(counter_ptr + tile, 0)  # ready for the next launch
        epilogue_store(
            c_ptr,
            z_ptr,
            bias_ptr,
            acc,
            pid_m,
            pid_n,
            M,
            N,
            stride_cm,
            stride_cn,
            HAS_BIAS,
            ACTIVATION,
            STORE_Z,
            BLOCK_M,
            BLOCK_N,
        )


def even_k(args):
    """EVEN_K of a launch: K a multiple of BLOCK_K, so that no K step needs a mask."""
    return args["K"] % args["BLOCK_K"] == 0


@functools.lru_cache(maxsize=None)
def tuned():
    """_matmul_kernel autotuned over CONFIGS, built on first use (never at import, never in the
    interpreter). Returns the same autotuner every call, so each key is tuned once per process.
    EVEN_K follows each config's BLOCK_K (a heuristic inside the autotuner); a direct launch
    passes it, which spares the heuristic's per-call work.

    Key: M rounded up (a batch size does not retune), N, K, b's layout (stride_bn is 1 for a
    row-major b and K for an nn.Linear weight's transpose, whose loads run along K) and, added by
    Triton, the dtypes. The epilogue is not in the key: it changes a tile's last step, not which
    tile is fastest, and keying on it would tune (and compile) every config once more per variant.
    STORE_Z is (the training forward's second output): its stores take registers and shared
    memory that a config at the limit may not have, so a training shape is tuned once more."""
    return triton.autotune(
        configs=autotune_configs(),
        key=["M_BUCKET", "N", "K", "stride_bn", "STORE_Z"],
        prune_configs_by={"early_config_prune": prune_configs},
        do_bench=autotune_bench,
    )(triton.heuristics({"EVEN_K": even_k})(_matmul_kernel))


def split_plan(m, n, k, num_sms, table):
    """(config, SPLIT_K) from a SPLIT_TABLE-like table for an (M, N, K) product, or (None, 1): no
    split, the autotuned one-kernel path."""
    for max_m, max_tiles_per_sm, split_k, config in table:
        tiles = cdiv(m, config[0]) * cdiv(n, config[1])
        if m <= max_m and tiles <= max_tiles_per_sm * num_sms:
            split_k = fit_split(k, config[2], min(split_k, cdiv(k, config[2]) // MIN_SLICE_STEPS))
            return (config, split_k) if split_k > 1 else (None, 1)
    return None, 1


@functools.lru_cache(maxsize=4096)
def plan(m, n, k, num_sms):
    """split_plan on SPLIT_TABLE; the interpreter counts tiles of, and runs, INTERPRET_CONFIG."""
    table = SPLIT_TABLE
    if INTERPRET:
        table = [(*row[:-1], (*INTERPRET_CONFIG, 4, 1)) for row in SPLIT_TABLE]
    return split_plan(m, n, k, num_sms, table)


def default_split_config():
    """The tile of a forced split without a config: SPLIT_TABLE's (the interpreter's config there)."""
    return (*INTERPRET_CONFIG, 4, 1) if INTERPRET else SPLIT_TABLE[0][-1]


def launch_split_k(a, b, bias, activation, c, config, split_k, z=None):
    """Split-K on validated arguments (see launch_tiled): split_k >= 2 programs a tile, one launch."""
    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk, warps, stages = config
    tiles = cdiv(m, bm) * cdiv(n, bn)
    partial, counters = split_k_buffers(a.device, split_k * m * n, tiles)
    _matmul_split_k_kernel[(tiles, split_k)](
        a,
        b,
        c,
        z if z is not None else c,
        bias if bias is not None else c,
        partial,
        counters,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        STORE_Z=z is not None,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=GROUP_M,
        SPLIT_K=split_k,
        EVEN_K=k % bk == 0,
        num_warps=warps,
        num_stages=stages,
    )


def launch_tiled(a, b, bias, activation, c, num_sms, config=None, split_k=None, z=None):
    """Launch on validated arguments with M, N >= 1: a (M, K), b (K, N), bias (N,) or None, c (M, N),
    any strides; num_sms: the SMs plan() counts. z: None, or a buffer with c's shape and strides
    that receives the pre-activation a @ b + bias (the training forward's).
    config: a CONFIGS-like row (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) to run as is; None
    autotunes on the key's first call and runs the autotuner's pick after it (the interpreter runs
    INTERPRET_CONFIG), or with a forced split runs default_split_config().
    split_k: K slices a tile (lowered by fit_split until none is empty); 1 runs the one-kernel
    path; None: plan() from SPLIT_TABLE when config is None, else 1."""
    (m, k), n = a.shape, b.shape[1]
    if split_k is None and config is None:
        config, split_k = plan(m, n, k, num_sms)
    elif (split_k or 1) > 1:
        config = config or default_split_config()
        split_k = fit_split(k, config[2], split_k)
    if (split_k or 1) > 1:
        launch_split_k(a, b, bias, activation, c, config, split_k, z)
        return
    if config is not None:
        bm, bn, bk, warps, stages = config
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, num_warps=warps, num_stages=stages)
    else:
        meta = interpret_meta() if INTERPRET else picked_config(_matmul_kernel, a, b, m, n, k, z is not None)
    if meta is None:
        meta = untuned_config(a, autotune_configs(), prune_configs, dict(M_BUCKET=m_bucket(m), N=n, K=k))
    args = (
        a,
        b,
        c,
        z if z is not None else c,
        bias if bias is not None else c,  # unused pointers still need a tensor
        m,
        n,
        k,
        m_bucket(m),
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
    )
    if meta is None:  # this key's first call: the autotuner times CONFIGS, then runs the fastest
        tuner = tuned()
        tuner[lambda meta: (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)](
            *args, HAS_BIAS=bias is not None, ACTIVATION=activation, STORE_Z=z is not None
        )
        pick_config(_matmul_kernel, a, b, m, n, k, tuner.best_config, z is not None)
        return
    _matmul_kernel[(cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)](
        *args,
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        STORE_Z=z is not None,
        EVEN_K=k % meta["BLOCK_K"] == 0,
        **meta,
    )
