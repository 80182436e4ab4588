"""Tiled FP16/BF16 matrix multiply with an optional fused epilogue, in Triton.

    c = act(a @ b + bias)        a (M, K), b (K, N), bias (N,); fp32 accumulation, one rounding

matmul() runs one of three kernels (choose_kernel): this file's, described below; from TMA_MIN_M
rows on Hopper, the persistent TMA kernel of gemm/triton_matmul_tma.py; for one row against an
nn.Linear weight's transpose, the CUDA-core GEMV of gemm/triton_gemv.py.

Each program computes one BLOCK_M x BLOCK_N tile of c: it walks K in BLOCK_K steps, loading an
A tile (BLOCK_M x BLOCK_K) and a B tile (BLOCK_K x BLOCK_N) and feeding them to `tl.dot` (the
tensor cores) with an fp32 accumulator; the bias and the activation are applied to that fp32
accumulator, and the tile is rounded and stored once. Memory traffic with perfect reuse is
(M*K + K*N + M*N) * e bytes; each A row-panel is really read once per column of tiles and each B
column-panel once per row of tiles, which the grouped program order below turns into L2 hits.

Every stride is passed, so a transposed or padded view of a or b is read in place, with no copy.
Edges: rows and columns wrap (% M, % N) on load, so loads need no mask in those dimensions, and
the store is masked; the last K step is masked unless K divides by BLOCK_K (EVEN_K).

Block sizes are autotuned on the GPU over the small table CONFIGS below, keyed by (M rounded up
to a power of two, N, K, b's layout, dtype): one tuning per layer shape, not per batch size.
Triton's interpreter (no GPU) runs one small fixed config instead: autotuning there would only
time numpy.

Split-K, for one-token decode (M = 1) against N <= 8192, where the few output tiles leave SMs
idle: SPLIT_K programs share each tile, program s reducing the s-th slice of the BLOCK_K steps.
Each stores its fp32 partial tile in a scratch buffer and counts itself in the tile's arrival
counter (common/workspace.py); the last to arrive adds the slices in a fixed order (the result does
not depend on which finished first), then runs the epilogue (bias, activation, one rounding) on the
full sum. One launch; the partials (SPLIT_K * M * N * 4 bytes written and read back) are small
next to b's K * N * 2. SPLIT_TABLE picks it by M and output tiles per SM; it is not autotuned.
"""
import functools

import common  # noqa: F401  (interpreter switch before triton is imported)
import torch
import triton
import triton.language as tl

from common.bench import autotune_bench
from common.device import INTERPRET, sm_count as device_sm_count
from common.ints import cdiv, next_power_of_2
from common.validation import check_out, check_same_device, check_tensor
from common.workspace import split_k_buffers

DTYPES = (torch.float16, torch.bfloat16)
ACTIVATIONS = (None, "gelu", "gelu_tanh", "silu")

# Grouped program order: consecutive program ids walk GROUP_M row-tiles down one column of tiles
# before moving right, instead of along a whole row of tiles. The programs in flight together (one
# per SM with the large tiles) then need GROUP_M row-panels of A and (programs / GROUP_M)
# column-panels of B, rather than a few A panels and every B panel of their rows; a panel they
# share is read from DRAM once and from L2 after. At 8192^3 with 128x256 tiles, a wave of 132
# programs reads about 84 MB of panels instead of 136 MB. (The Triton matmul tutorial reports 220 ->
# 245 TFLOP/s on an A100 from this change alone.) The tutorial uses 8. On an H100 with 128x256
# tiles, 8 and 16 were within the run-to-run spread of each other (one config timed twice moves by
# up to 5-10% there), at 0.85-1.04x cuBLAS at 4096^3, 8192^3, 2048-8192 x 14336 x 4096 and
# 4096^2 x 14336 (scripts/tune/group_m.py); with 16, a wave of 132 programs reads about a fifth fewer
# panel bytes (16 A panels and 9 B panels of twice the size, against 8 and 17).
GROUP_M = 16

# Autotuned configs: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages).
# Shared memory per config is (BLOCK_M + BLOCK_N) * BLOCK_K * 2 bytes * num_stages; all fit the
# 227 KB an H100/H200 block may take.
CONFIGS = [
    # large M and N: the Hopper textbook tile; two warpgroups each hold a 64x256 fp32 accumulator
    # (128 registers a thread); 144 KB smem, one program per SM
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),  # one more stage (192 KB): 659 against 635 TFLOP/s at 4096^3 bf16 (H200)
    (128, 128, 64, 4, 4),  # twice the tiles of 128x256, for shapes where those leave SMs idle
    (64, 256, 32, 4, 4),   # the tutorial's config for moderate M against large N
    (64, 128, 64, 4, 4),   # M ~ 128-512: 4x the tiles of 128x256 (M = 128, N = 14336: 0.95-0.97x); 96 KB
    # 1024^3 (256 tiles, two a SM): GPU time on an H100 8.3 us against 9.2 for 64x128x64 and
    # 128x64x64, 11.2 for 128x128x64; cuBLAS 7.3-7.6 (CUDA graphs, scripts/tune/small_shapes.py 1024)
    (64, 128, 128, 4, 3),
    # M = 128 against N = 4096: 128 programs where 64x128 tiles leave half the SMs idle; six
    # stages of 32 KB (192 KB) keep 4-5 stages of loads in flight. H200 bf16, us (cuBLAS /
    # ours): K = 4096: 19.7 (0.95x; 5 stages 20.8, 4: 22.6; 64x128x64 29.0), K = 14336: 44.7
    # (0.99x; 5 stages 47.5; 64x128x64 76.9)
    (64, 64, 128, 4, 6),
    # M <= 64 is bound by reading b once (decode): small tiles, long K steps to keep loads in flight
    (32, 64, 128, 4, 4),   # 17 <= M <= 32
    # 17 <= M <= 32 against N = 4096: two row tiles of 64 programs. H100, GPU us (CUDA graphs,
    # scripts/tune/host_and_picks.py small), M = 32, b row-major / W.T: 14.7-14.8 / 15.4-15.6
    # against cuBLAS 14.5-14.6 / 15.2 (32x64x128: 17.8-18.3; 16x32x256: 16.0-16.6)
    (16, 64, 256, 4, 4),
    (16, 128, 128, 4, 4),  # M <= 16 against N = 14336 (112 tiles): 0.99-1.00x (16x64x128: 0.91-0.96x)
    (16, 32, 256, 4, 4),   # M <= 16 with N = 4096: 128 column tiles, about one per SM; 0.98-1.01x
]
# Small tiles are slow for large M (under 64 rows there is no wgmma, and each loaded B tile serves
# few rows), and large tiles are mostly padding for small M: prune_configs hands the autotuner
# only the part of the table that fits M. Up to SMALL_M rows every tile no taller than M competes.
SMALL_M = 256
# From TMA_MIN_M rows (where TMA descriptors fit the strides) gemm/triton_matmul_tma.py's
# persistent kernel runs instead. H100, do_bench, against cuBLAS (scripts/tune/tma_sweep.py): at
# M >= 2048 it is at 0.94-1.07x where this file's best config is at 0.84-1.00x; at M = 1024 and
# N = 4096, 0.90-0.99x against 0.90-0.94x; at M = 512 both are at 0.83-0.88x, and at 1024^3 both at
# ~0.93x in GPU time. Its three descriptors cost host time (~85 us a call there, against ~45 for
# this file's launch), which a GEMM of a few tens of microseconds would feel.
TMA_MIN_M = 1024
# Up to GEMV_MAX_M rows, with b an nn.Linear weight's transpose (read along K), gemm/triton_gemv.py's
# CUDA-core kernel runs: one row of a against b is a single pass over b, where a tensor-core tile
# would be 15/16 padding. H100, M = 1, bf16, GPU time: 0.97-1.35x cuBLAS against 0.92-0.99x for
# this file's kernels. For a row-major b the split-K kernel here stays faster (see its table).
GEMV_MAX_M = 1
# Below TINY_MACS multiply-adds (M rounded up x N x K; 2^27 is 128 x 1024 x 1024) a GEMM takes a few
# microseconds whatever its tiles, so timing candidates would only cost compile time: the fitting
# config with the smallest tile (the most programs) runs untimed.
TINY_MACS = 1 << 27

# Split-K, when the output tiles leave SMs idle: (largest M, largest tiles / SMs, SPLIT_K,
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)); the first row that M and the tile count
# (of the row's tile) satisfy wins; no row, no split. Not autotuned: the tile and SPLIT_K size
# the workspace before the launch. SPLIT_K is then lowered to keep MIN_SLICE_STEPS steps a slice.
# One-token decode is bound by reading b once, and with few 16 x 128 tiles (256 bytes of a
# row-major b a row) too few loads are in flight: the slices bring the grid to about one program
# per SM. H200 bf16, M = 1, K = 4096 unless said, us (cuBLAS / ours) from
# scripts/tune/matmul_small_sweep.py, against the best one-kernel config:
#   N = 2048 (16 tiles): cuBLAS 13.1; SPLIT_K 4: 14.4, 8: 14.5 (0.90x); one kernel 15.6 (0.84x)
#   N = 4096 (32 tiles): cuBLAS 18.5; SPLIT_K 2: 20.2, 4: 19.7 (0.94x), 8: 20.4; one kernel 21.0
#   N = 4096, K = 14336: cuBLAS 40.8; SPLIT_K 4: 43.5 (0.94x); one kernel 51.0 (0.80x)
#   N = 8192 (64 tiles): cuBLAS 27.0; SPLIT_K 2: 29.7 (0.91x), 4: 30.3; one kernel 30.3 (0.89x)
#   N = 14336 (112 tiles): cuBLAS 40.3; SPLIT_K 2: 44.7; one kernel 41.2 (0.98x): no split.
# Those were two launches (slices, then a summing kernel). In one launch (the last slice sums) the
# GPU time barely moves (H100, M = 1, N = K = 4096, CUDA graphs: 15.8 us against 16.1; cuBLAS 14.2)
# but the host's drops from ~80 to ~46 us a call (against the two-launch version of this file).
# M >= 4 loses (N = 4096: 20.6 against 18.7 at M = 4, 20.4 against 18.5 at M = 16; M = 2 ties),
# M = 128 is better served by 64 x 64 tiles (CONFIGS: 0.95x against 0.77x split at K = 4096), and
# 1024^3 loses at every SPLIT_K (15.6 us at best against 11.0 in one kernel).
# The one-launch version on an H100, bf16, M = 1, GPU us (CUDA graphs; cuBLAS / ours by config and
# SPLIT_K, scripts/tune/host_and_picks.py m1):
#   N = 2048: 10.5 / 16x128x128 s4 10.2, s8 10.7; 16x256x64 s8 10.6
#   N = 4096: 14.2 / 16x256x64 (8 warps) s4 15.7 (0.90x), s8 16.0; 16x128x128 s2 16.0, s4 16.2
#   N = 4096, K = 14336: 43.2 / 16x256x64 s4 42.3; 16x128x128 s4 42.9
#   N = 8192: 24.9 / 16x128x128 s1 26.4, s2 26.9; 16x256x64 s2 26.5
SPLIT_TABLE = [
    (1, 1 / 8, 4, (16, 128, 128, 4, 4)),  # N <= 2048: 16 tiles, 4 slices
    (1, 1 / 8, 4, (16, 256, 64, 8, 4)),   # N <= 4096: 16 tiles of 256 columns, 4 slices
    (1, 1 / 2, 2, (16, 128, 128, 4, 4)),  # N <= 8192: 64 tiles, 2 slices
]
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


def m_bucket(m):
    """The autotune key's M: a power of two, at least 16 (tl.dot's smallest tile)."""
    return max(16, next_power_of_2(m))


def prune_configs(configs, named_args, **kwargs):
    """Keep the configs whose BLOCK_M fits the key's M: no taller than M rounded up, and at least
    64 rows once M passes SMALL_M; only the smallest of them below TINY_MACS."""
    m = named_args["M_BUCKET"]
    fit = [c for c in configs if c.kwargs["BLOCK_M"] <= m and (m <= SMALL_M or c.kwargs["BLOCK_M"] >= 64)]
    if m * named_args["N"] * named_args["K"] < TINY_MACS:
        return [min(fit, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
    return fit


def autotune_configs():
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": GROUP_M},
                          num_warps=warps, num_stages=stages)
            for bm, bn, bk, warps, stages in CONFIGS]


def interpret_meta():
    bm, bn, bk = INTERPRET_CONFIG
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M)


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (pid_m, pid_n) in grouped order: GROUP_M row-tiles per column sweep (the last
    group may be shorter)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    """The epilogue's activation on an fp32 tile."""
    if ACTIVATION == "gelu":  # exact: x * Phi(x)
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))  # 1/sqrt(2)
    elif ACTIVATION == "gelu_tanh":
        # tanh from exp (tl has no tanh in every Triton version), as sign(u) (1 - t) / (1 + t)
        # with t = exp(-2|u|) <= 1: no overflow for any u
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # sqrt(2/pi)
        t = tl.exp(-2.0 * tl.abs(u))
        tanh_abs = (1.0 - t) / (1.0 + t)
        x = 0.5 * x * (1.0 + tl.where(u >= 0, tanh_abs, -tanh_abs))
    elif ACTIVATION == "silu":
        x = x * tl.sigmoid(x)
    return x


@triton.jit
def store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Round the fp32 tile to c's dtype once and store the part inside (M, N)."""
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows * stride can pass 2^31
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def epilogue_store(c_ptr, bias_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
                   HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The epilogue on a tile of the full fp32 sum: bias, activation, one rounding, the store."""
    if HAS_BIAS:
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N  # wrapped like the loads; the store masks
        acc += tl.load(bias_ptr + rn).to(tl.float32)[None, :]
    acc = activate(acc, ACTIVATION)
    store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


@triton.jit
def dot_tile(a_ptr, b_ptr, pid_m, pid_n, k_first, k_last, M, N, K,
             stride_am, stride_ak, stride_bk, stride_bn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
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
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:  # zeros past K add nothing to the dot
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit(do_not_specialize=["M_BUCKET"])
def _matmul_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr, bias_ptr,
    # matrix dimensions; M_BUCKET is only the autotune key (M rounded up to a power of two)
    M, N, K, M_BUCKET,
    # strides, in elements
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # meta-parameters
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """One program: tile tl.program_id(0) (grouped order) over all of K, then the epilogue."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = dot_tile(a_ptr, b_ptr, pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K), M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    epilogue_store(c_ptr, bias_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
                   HAS_BIAS, ACTIVATION, BLOCK_M, BLOCK_N)


@triton.jit
def _matmul_split_k_kernel(
    # pointers; partial: fp32 scratch (SPLIT_K * M, N), counter: int32 zeros (tiles,)
    a_ptr, b_ptr, c_ptr, bias_ptr, partial_ptr, counter_ptr,
    # matrix dimensions
    M, N, K,
    # strides, in elements
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # meta-parameters
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    """Program (tile, s): slice s of the K steps of one tile; the slice to finish last sums them."""
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_steps = tl.cdiv(K, BLOCK_K)
    slice_steps = tl.cdiv(k_steps, SPLIT_K)  # the launcher leaves no slice empty
    k_first = pid_k * slice_steps
    acc = dot_tile(a_ptr, b_ptr, pid_m, pid_n, k_first, tl.minimum(k_first + slice_steps, k_steps), M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)

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
        epilogue_store(c_ptr, bias_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
                       HAS_BIAS, ACTIVATION, BLOCK_M, BLOCK_N)


def even_k(args):
    """EVEN_K of a launch: K a multiple of BLOCK_K, so that no K step needs a mask."""
    return args["K"] % args["BLOCK_K"] == 0


@functools.lru_cache(maxsize=None)
def tuned(kernel):
    """`kernel` autotuned over CONFIGS, built on first use (never at import, never in the
    interpreter). Returns the same autotuner every call, so each key is tuned once per process.
    EVEN_K follows each config's BLOCK_K (a heuristic inside the autotuner); a direct launch
    passes it, which spares the heuristic's per-call work.

    Key: M rounded up (a batch size does not retune), N, K, b's layout (stride_bn is 1 for a
    row-major b and K for an nn.Linear weight's transpose, whose loads run along K) and, added by
    Triton, the dtypes. The epilogue is not in the key: it changes a tile's last step, not which
    tile is fastest, and keying on it would tune (and compile) every config once more per variant."""
    return triton.autotune(configs=autotune_configs(), key=["M_BUCKET", "N", "K", "stride_bn"],
                           prune_configs_by={"early_config_prune": prune_configs},
                           do_bench=autotune_bench)(triton.heuristics({"EVEN_K": even_k})(kernel))


# The autotuner's pick for each key, as launch arguments. After a key's first call the kernel is
# launched with its pick directly: the autotuner's own per-call work (building its key from the
# arguments, merging the config into them) costs ~10 us of host time, as much as the GPU time of a
# decode-size GEMM.
_PICKED = {}


def _picked_key(kernel, a, b, m, n, k):
    """The autotune key of tuned(kernel) (M bucket, N, K, b's layout, dtype), and the device."""
    return kernel, m_bucket(m), n, k, b.stride(1), a.dtype, a.device


def picked_config(kernel, a, b, m, n, k):
    """Launch arguments of the config the autotuner picked for this key, or None before its first call."""
    return _PICKED.get(_picked_key(kernel, a, b, m, n, k))


def pick_config(kernel, a, b, m, n, k, config):
    _PICKED[_picked_key(kernel, a, b, m, n, k)] = config.all_kwargs()


def check_matmul_args(a, b, bias, activation):
    """Argument checks of matmul; returns (M, N, K)."""
    check_tensor("a", a, DTYPES, min_dim=2)
    check_tensor("b", b, DTYPES, min_dim=2)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D, (M, K) and (K, N); got a {tuple(a.shape)}, b {tuple(b.shape)}")
    check_same_device("b", b, "a", a)
    if b.dtype != a.dtype:
        raise TypeError(f"b must have a's dtype {a.dtype}; got {b.dtype}")
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"b must have shape (K, N) with K = a.shape[1] = {k}; got {tuple(b.shape)}")
    if bias is not None:
        check_tensor("bias", bias, (a.dtype, torch.float32))
        check_same_device("bias", bias, "a", a)
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias must have shape ({n},) to match N of b {tuple(b.shape)}; got {tuple(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    return m, n, k


def sm_count(device):
    return device_sm_count(device, INTERPRET_SMS)


def fit_split(k, block_k, split_k):
    """SPLIT_K lowered until no slice of the cdiv(K, BLOCK_K) steps is empty (5 steps in 4 slices
    would be 2 + 2 + 1 + 0: 3 slices)."""
    k_steps = cdiv(k, block_k)
    if k_steps <= 1 or split_k <= 1:
        return 1
    return cdiv(k_steps, cdiv(k_steps, split_k))


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


def launch_split_k(a, b, bias, activation, c, config, split_k):
    """Split-K on validated arguments (see launch_matmul): split_k >= 2 programs a tile, one launch."""
    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk, warps, stages = config
    tiles = cdiv(m, bm) * cdiv(n, bn)
    partial, counters = split_k_buffers(a.device, split_k * m * n, tiles)
    _matmul_split_k_kernel[(tiles, split_k)](
        a, b, c, bias if bias is not None else c, partial, counters,
        m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        HAS_BIAS=bias is not None, ACTIVATION=activation, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M,
        SPLIT_K=split_k, EVEN_K=k % bk == 0, num_warps=warps, num_stages=stages)


@functools.lru_cache(maxsize=None)
def has_tma(device):
    """Whether `device` has TMA (compute capability 9.0, Hopper, and later). The interpreter
    emulates the descriptors, so its tests run that path too."""
    return INTERPRET or torch.cuda.get_device_capability(device)[0] >= 9


def choose_kernel(a, b, c, m):
    """Which kernel runs a call that forces none: "gemv" for M <= GEMV_MAX_M with b read along K,
    "tma" from TMA_MIN_M rows where the descriptors fit (on Hopper and later), else "tiled" (this
    file's kernels)."""
    if m <= GEMV_MAX_M and not triton_gemv.is_row_major(b):
        return "gemv"
    if m >= TMA_MIN_M and has_tma(a.device) and triton_matmul_tma.fits(a, b, c):
        return "tma"
    return "tiled"


def launch_matmul(a, b, bias, activation, c, config=None, split_k=None, kernel=None):
    """Launch on validated arguments with M, N >= 1: a (M, K), b (K, N), bias (N,) or None, c (M, N),
    any strides.
    kernel: "tiled" (this file), "tma" (gemm/triton_matmul_tma.py; the arguments must fit it) or
    "gemv" (gemm/triton_gemv.py; M = 1); None: choose_kernel(), or "tiled" when config or split_k
    is given.
    config: a row of the kernel's table to run as is (tiled: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps,
    num_stages)); None autotunes on the key's first call and runs the autotuner's pick after it
    (the interpreter runs INTERPRET_CONFIG), or with a forced split runs default_split_config().
    split_k: K slices a tile (lowered by fit_split until none is empty); 1 runs the one-kernel
    path; None: plan() from SPLIT_TABLE when config is None, else 1. (gemv: its own plan's.)"""
    (m, k), n = a.shape, b.shape[1]
    if kernel is None:
        kernel = "tiled" if config is not None or split_k is not None else choose_kernel(a, b, c, m)
    if kernel == "tma":
        triton_matmul_tma.launch_matmul_tma(a, b, bias, activation, c, triton_matmul_tma.sm_count(a.device), config)
        return
    if kernel == "gemv":
        triton_gemv.launch_gemv(a, b, bias, activation, c, config, split_k)
        return
    if split_k is None and config is None:
        config, split_k = plan(m, n, k, sm_count(a.device))
    elif (split_k or 1) > 1:
        config = config or default_split_config()
        split_k = fit_split(k, config[2], split_k)
    if (split_k or 1) > 1:
        launch_split_k(a, b, bias, activation, c, config, split_k)
        return
    if config is not None:
        bm, bn, bk, warps, stages = config
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, num_warps=warps, num_stages=stages)
    else:
        meta = interpret_meta() if INTERPRET else picked_config(_matmul_kernel, a, b, m, n, k)
    args = (a, b, c, bias if bias is not None else c,  # an unused pointer still needs a tensor
            m, n, k, m_bucket(m),
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    if meta is None:  # this key's first call: the autotuner times CONFIGS, then runs the fastest
        tuner = tuned(_matmul_kernel)
        tuner[lambda meta: (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)](
            *args, HAS_BIAS=bias is not None, ACTIVATION=activation)
        pick_config(_matmul_kernel, a, b, m, n, k, tuner.best_config)
        return
    _matmul_kernel[(cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)](
        *args, HAS_BIAS=bias is not None, ACTIVATION=activation, EVEN_K=k % meta["BLOCK_K"] == 0, **meta)


def kernel_choice(a, b):
    """What matmul(a, b) runs, in words: "gemv 4x1024 w4 s3 split 1" (BLOCK_N x BLOCK_K), "tiled
    64x128x64 w4 s4", "tiled split-K 4 16x256x64 w8 s4", "tma 128x256x64 w8 s3 epilogue split 2",
    or "tiled (untuned)" / "tma (untuned)" before a key's first call has tuned it. For benchmark
    rows and tuning logs: the config behind a time. It follows launch_matmul's choice (choose_kernel,
    plan, the autotuner's pick) without launching; "which kernel runs" in gemm/test_matmul.py
    checks each branch."""
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device="meta")  # matmul's own output's layout, nothing allocated
    kind = choose_kernel(a, b, c, m)
    if kind == "gemv":
        bn, bk, warps, stages, split = triton_gemv.gemv_plan(n, k, triton_gemv.is_row_major(b),
                                                              triton_gemv.sm_count(a.device))
        return f"gemv {bn}x{bk} w{warps} s{stages} split {split}"
    if kind == "tiled":
        config, split = plan(m, n, k, sm_count(a.device))
        if split > 1:
            return f"tiled split-K {split} {config[0]}x{config[1]}x{config[2]} w{config[3]} s{config[4]}"
    if INTERPRET:  # no tuning there: each kernel runs its INTERPRET_CONFIG
        meta = (triton_matmul_tma.meta_of(triton_matmul_tma.INTERPRET_CONFIG) if kind == "tma"
                else dict(interpret_meta(), num_warps=4, num_stages=1))
    else:
        kernel = triton_matmul_tma._matmul_tma_kernel if kind == "tma" else _matmul_kernel
        meta = picked_config(kernel, a, b, m, n, k)
    if meta is None:
        return f"{kind} (untuned)"
    extra = f" epilogue split {meta['EPILOGUE_SPLIT']}" if "EPILOGUE_SPLIT" in meta else ""
    return (f"{kind} {meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} w{meta['num_warps']} "
            f"s{meta['num_stages']}{extra}")


def matmul(a, b, bias=None, activation=None, out=None):
    """c = activation(a @ b + bias), accumulated in fp32 and rounded once to a's dtype.

    a: (M, K) fp16 or bf16, any strides (a transposed or padded view is read in place).
    b: (K, N), a's dtype, any strides (for an nn.Linear weight W (N, K), pass W.T).
    bias: optional (N,), a's dtype or fp32. activation: None, "gelu" (erf), "gelu_tanh" or "silu".
    out: optional contiguous (M, N) buffer of a's dtype.
    Returns c: (M, N), a's dtype. K = 0 gives activation(bias) (zeros without a bias).
    """
    m, n, _ = check_matmul_args(a, b, bias, activation)
    if out is not None:
        check_out("out", out, (m, n), a.dtype, a.device)
    c = out if out is not None else torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m and n:
        launch_matmul(a, b, bias, activation, c)
    return c


# the TMA and GEMV kernels reuse this module's helpers (grouped_tile, activate, fit_split), so
# they are imported once those exist
from gemm import triton_gemv, triton_matmul_tma  # noqa: E402
