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
#   rows of at most WARP_ROW_PACKS packs: one warp a row (32 threads x up to 4 packs), ROWS_PER_BLOCK
#       rows a block: a row this short is too little work for a block, and a warp needs no barrier.
#   up to CACHED_ROW_PACKS: the row in registers, 4 packs a thread (all loads issued before the sum),
#       at most 512 threads: with <= 57 registers two such blocks share an SM, so one row's
#       reduction and stores overlap the next row's loads (one 1024-thread block per SM would not).
#   wider rows: two passes, LOOPED_THREADS threads; the second read comes from L2 (N = 32768 bf16:
#       64 KB a row, a few rows an SM in flight, far below the 50 MB L2).
WARP_ROW_PACKS = 128         # N <= 1024 fp16 / bf16, 512 fp32
ROWS_PER_BLOCK = 4           # 128-thread blocks
CACHED_PACKS_PER_THREAD = 4  # 16 registers of row (in the storage type) a thread
CACHED_ROW_PACKS = 2048      # N <= 16384 fp16 / bf16, 8192 fp32: 512 threads x 4 packs
LOOPED_THREADS = 512         # 4 packs a trip each: 32 KB of a row in flight a block


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
        vpt = next(v for v in (1, 2, 4) if 32 * v >= packs)
        return RmsnormConfig(not vector, vpt, 32, ROWS_PER_BLOCK)
    if vector and packs <= CACHED_ROW_PACKS:
        threads = round_up(cdiv(packs, CACHED_PACKS_PER_THREAD), 32)
        vpt = next(v for v in (1, 2, 4) if threads * v >= packs)
        return RmsnormConfig(False, vpt, threads, 1)
    return RmsnormConfig(True, 1, min(LOOPED_THREADS, round_up(cdiv(packs, 4), 32)), 1)


# ---- SwiGLU ----
# A block moves SWIGLU_THREADS x SWIGLU_PACKS packs of y (and twice that read): 256 threads x 2 packs
# is 64 bytes of loads in flight a thread, ~1000 threads an SM at <= 60 registers: 64 KB an SM. The
# scalar path moves 2-byte values, so 4 a thread keep as many loads in flight as it can.
SWIGLU_THREADS = 256
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
# spread so that no thread idles in the last trip: Llama's 32 + 8 heads at D = 128 give 20 x 2
# heads, a 160-thread block. About ROPE_THREADS threads a block at most: the half layout's 16-bit
# kernels take 93-113 registers (four fp32 table columns, two heads' packs), so ~4 such blocks fill
# an SM, with ~40 KB of loads in flight.
ROPE_THREADS = 256
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
