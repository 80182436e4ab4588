"""Launch heuristics of the CUDA kernels (cuda_cpp/csrc): one small rule per op, the reason beside it.

The unit is the 16-byte pack (8 fp16 / bf16 values, 4 fp32) a thread moves with one instruction;
"packs" below counts them. What an H100 needs in flight to reach its bandwidth is about 3.35 TB/s x
~0.7 us = 2.3 MB, 18 KB per SM (Little's law): a few packs per thread for a few hundred threads
an SM, which every rule below leaves room for. A kernel that cannot use packs (misaligned data, a
row stride that is not a multiple of 16 bytes, RoPE with a strided head dim) runs its scalar
variant with the same shape of launch.
"""

import functools
from dataclasses import dataclass

PACK_BYTES = 16


def cdiv(a, b):
    return -(-a // b)


def round_up(a, b):
    return cdiv(a, b) * b


def pack_size(elem_size, vector):
    """Values per pack: 16 bytes of them, or 1 on the scalar path."""
    return PACK_BYTES // elem_size if vector else 1


# ---- RMSNorm ----
# Measured by scripts/tune/cuda_sweep.py on an H200 (16-bit rows); the figures: docs/tuning/cuda_cpp.md.
#   rows of at most WARP_ROW_PACKS packs: one warp a row (32 threads x up to 2 packs), ROWS_PER_BLOCK
#       rows a block: a row this short is too little work for a block, and a warp needs no barrier.
#   up to CACHED_ROW_PACKS: the row in registers, all loads issued before the sum. Two packs a
#       thread while that takes at most 512 threads (N <= 8192): more threads in flight beat more
#       packs a thread there; four beyond, where 1024 threads with two spill in bf16.
#   wider rows: two passes, a thread moving 4 packs a trip; the second read comes from L2 (a few
#       64 KB rows an SM in flight, far below the 50 MB L2). At least two trips a thread, at most
#       1024 threads.
# fmt: off
WARP_ROW_PACKS = 64           # N <= 512 fp16 / bf16, 256 fp32
ROWS_PER_BLOCK = 4            # 128-thread blocks
CACHED_SMALL_PACKS = 2        # packs a thread of the register-cached kernel while threads <= 512
CACHED_THREADS = 512
CACHED_ROW_PACKS = 2048       # N <= 16384 fp16 / bf16, 8192 fp32: 512 threads x 4 packs
LOOPED_PACKS_PER_THREAD = 8   # two trips of 4 packs
LOOPED_MAX_THREADS = 1024
# fmt: on


@dataclass(frozen=True)
class RmsnormConfig:
    looped: bool
    vectors_per_thread: int  # the register-cached kernel's packs a thread (1, 2, 4)
    threads_per_row: int
    rows_per_block: int


@functools.lru_cache(maxsize=1024)
def rmsnorm_config(n_cols, elem_size, vector):
    """Kernel and launch shape for rows of n_cols values of elem_size bytes (vector: 16-byte packs)."""
    packs = max(1, n_cols // pack_size(elem_size, vector))  # a tail of < 1 pack rides along
    if packs <= WARP_ROW_PACKS:
        vpt = next(v for v in (1, 2) if 32 * v >= packs)
        return RmsnormConfig(not vector, vpt, 32, ROWS_PER_BLOCK)
    if vector and packs <= CACHED_ROW_PACKS:
        threads = round_up(cdiv(packs, CACHED_SMALL_PACKS), 32)
        if threads > CACHED_THREADS:
            threads = round_up(cdiv(packs, 4), 32)
        vpt = next(v for v in (1, 2, 4) if threads * v >= packs)
        return RmsnormConfig(False, vpt, threads, 1)
    return RmsnormConfig(True, 1, min(LOOPED_MAX_THREADS, round_up(cdiv(packs, LOOPED_PACKS_PER_THREAD), 32)), 1)


# ---- SwiGLU ----
# A block moves SWIGLU_THREADS x SWIGLU_PACKS packs of y (and twice that read): 2 packs are 64 bytes
# of loads in flight a thread. 128-thread blocks: the finer grid evens out the last wave; 4 packs a
# thread were slower (scripts/tune/cuda_sweep.py on an H200; docs/tuning/cuda_cpp.md). The scalar
# path moves 2-byte values, so 4 a thread keep as many loads in flight as it can.
SWIGLU_THREADS = 128
SWIGLU_PACKS = 2
SWIGLU_SCALARS = 4


@dataclass(frozen=True)
class SwigluConfig:
    vectors_per_thread: int
    threads: int


def swiglu_config(vector):
    return SwigluConfig(SWIGLU_PACKS if vector else SWIGLU_SCALARS, SWIGLU_THREADS)


# ---- RoPE ----
# One block a (b, t) position: threads_pairs = D/2 / pairs-a-thread threads along the pairs (8 for
# D = 128 fp16), and threads along the heads, each rotating HEADS_PER_TRIP heads a trip. Heads are
# spread so that no thread idles in the last trip: Llama's 32 + 8 heads at D = 128 give 7 threads
# x 3 trips x 2 heads, a 56-thread block. About ROPE_THREADS threads a block at most: the half
# layout's 16-bit kernels take about a hundred registers (four fp32 table columns, two heads'
# packs). Small blocks, each looping over its position's heads, win at D = 128 and 256: more blocks
# an SM, and the cos/sin row loaded once serves more heads a thread (scripts/tune/cuda_sweep.py on
# an H200; docs/tuning/cuda_cpp.md).
ROPE_THREADS = 64
HEADS_PER_TRIP = 2  # as in csrc/rope.cu


@dataclass(frozen=True)
class RopeConfig:
    threads_pairs: int
    threads_heads: int


def rope_config(head_dim, n_heads, elem_size, vector, max_threads=ROPE_THREADS):
    """Block shape for heads of head_dim values; n_heads = H + Hkv, the heads of q and of k."""
    threads_pairs = head_dim // 2 // pack_size(elem_size, vector)
    most = max(1, max_threads // threads_pairs)
    trips = cdiv(n_heads, HEADS_PER_TRIP * most)
    return RopeConfig(threads_pairs, max(1, cdiv(n_heads, HEADS_PER_TRIP * trips)))
