"""FlashAttention forward for Hopper (sm_90) in Gluon: TMA loads, warp specialization, async wgmma.

The same computation as attention/triton_flash_attention_fwd.py (read that first: the online
softmax, the masks, the conventions and LSE are the same), laid out as FlashAttention-3 lays it out:

- A producer warp (24 registers) issues the TMA copies: this program's q tiles once, then the key
  and value blocks into a ring of STAGES shared-memory stages. Each stage has a barrier a copy
  completes (k_ready, v_ready, so the scores can start before V lands) and release barriers the
  consumers arrive on when the products that read it are done (v_empty; k_empty too when K is
  handed back apart from V, SPLIT_RELEASE).
- The consumer warpgroups (240 registers a thread) run S = q k^T and O += P v as asynchronous
  wgmma, q and k from shared memory, P from registers. Within an iteration the next block's S is
  issued before this block's P v, so the softmax of one block runs while the tensor cores work on
  the other (FlashAttention-3's intra-warpgroup overlap). With PINGPONG the two warpgroups are
  partitions of their own, 64 rows each, and take turns issuing their products (a barrier each),
  so one's softmax runs under the other's products (FlashAttention-3's inter-warpgroup overlap);
  without it they share one partition and run in lockstep.
- Packed batches (VARLEN): the descriptors span the packed (1, H, total, D) views and a program
  starts at its sequence's first token (read from cu_seqlens on the device); the keys a block
  reads past its sequence's end belong to the next one and are masked as the end of the keys is,
  and the O of a sequence's last query block goes out by a masked store (a TMA store would write
  the next sequence's rows), its other blocks' by TMA as a dense call's. A tile past the last
  sequence's end (a total longer than cu_seqlens[-1]) has no rows: it writes nothing.
  The masked keys' values still enter P v with P = 0, so they must be finite: the next
  sequence's are (the tl kernel reads zeros there instead), and so is anything the packed
  tensors hold past cu_seqlens[-1] as long as it is data, not uninitialized memory.
- Tiles (a query block of one (batch, head) pair) are numbered on a one-dimensional grid, a pair's
  blocks one after another (a packed batch's: _tile_of). A program takes one tile, or on a
  persistent grid one program an SM takes tile after tile, the longest first under a mask: the
  ring's count runs on across tiles, so the producer loads the next tile's q (once the consumers'
  last S released it, q_empty) and first key blocks under this tile's last P v, and O goes out
  through a tile of its own whose TMA store overlaps the next tile. The deal (GRID): STATIC, program
  p takes tiles p, p + P, p + 2P, ...; DYNAMIC, program p takes tile p first and then, as its
  producer has issued a tile's last copies, the next from an atomic counter in global memory, and
  hands the number to its consumers through shared memory (FlashAttention-3's scheduler): under a
  mask a static deal leaves the busiest program 1.15-1.55x the mean's work, a dynamic one ~1.01x.
- Only the blocks a mask cuts (the causal diagonal, a window's edges, the end of the keys) run the
  masked softmax; the test is one uniform branch an iteration.
- O leaves through a shared tile and a TMA store (but a packed sequence's last block's); the copy
  clips the rows past the tensor's end. LSE is stored from registers.

The descriptors are 4-D, (batch, head, token, dim) with the tensors' own strides, so a tile that
runs past a head's last token reads zeros and writes nothing instead of touching the next head,
and a (B, T, H, D) tensor viewed as (B, H, T, D) is read in place. TMA needs the last stride 1,
the others and the base 16-byte aligned (gluon_layout_ok); the dispatch sends anything else to
the tl kernel.

Written against Triton 3.6's Gluon (triton.experimental.gluon), whose spelling changes between
releases: attention/attention_paths.py imports this module only on an sm_90 GPU with a Triton
version in GLUON_TRITON_VERSIONS. It does not run in the interpreter.
"""
import functools

import torch
from triton import knobs
from triton._utils import validate_block_shape
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from llmk.attention.attention_checks import NO_MASK
from llmk.attention.triton_flash_attention_fwd import kernel_mask, key_blocks
from llmk.common.device import sm_count
from llmk.common.direct_launch import run_compiled
from llmk.common.ints import cdiv
from llmk.common.triton_utils import LN2, softcap_scales, tanh_approx

# The grids: ONE_TILE, a program a tile (the hardware's block scheduler balances them); STATIC, one
# program an SM taking a fixed share of the tiles; DYNAMIC, one program an SM taking the next tile
# from a counter as it frees.
ONE_TILE, STATIC, DYNAMIC = gl.constexpr(0), gl.constexpr(1), gl.constexpr(2)
# (head dim, causal, BLOCK_M, BLOCK_N, STAGES, PINGPONG, SPLIT_RELEASE, GRID): the first row whose
# head dim and mask match wins (causal: kernel_mask's CAUSAL flag, the plain causal mask; a window,
# causal or not, takes the full row).
# Shared memory: q and O's staging tile (BLOCK_M x D each) + STAGES x (K and V blocks, BLOCK_N x D
# each), 2 bytes a value; hd 128 at 128 x 128 holds 64 KB + 2 x 64 KB (three stages would pass
# 227 KB). BLOCK_M / 64 consumer warpgroups split the block's rows, 64 each (wgmma's M): in
# lockstep (one partition of BLOCK_M / 16 warps) or, PINGPONG, two partitions of one warpgroup
# each that take turns on the tensor cores. SPLIT_RELEASE: K and V stages are handed back to the
# producer separately (K once S is done), so the next K can land during P v.
GLUON_CONFIG_TABLE = [
    # hd 64: the configs within 3% of each other, the deals too. The softmax's instruction issue bounds it, not
    # the MUFU's ex2s: half of them as FMA polynomials lost 5-10% (docs/tuning/attention.md, the seventh run)
    (64, False, 128, 128, 3, True, False, STATIC),
    (64, True, 128, 128, 3, True, False, STATIC),
    # 128-key blocks, K released apart from V: +7-16% over 64-key blocks at three stages. Without a
    # mask STATIC: +1-11% over one tile a program. Causal DYNAMIC: +1-8% over one tile a program at
    # T 1024-4096, +5% at T 16384, and +18-42% over STATIC (docs/tuning/attention.md, the sixth run)
    (128, False, 128, 128, 2, True, True, STATIC),
    (128, True, 128, 128, 2, True, True, DYNAMIC),
]
GLUON_HEAD_DIMS = tuple(sorted({row[0] for row in GLUON_CONFIG_TABLE}))
# Register budget: the producer warp is rounded up to a warpgroup, so 8 + 4 warps share the SM's
# 65536 registers: maxnreg 168 = 65536 / (12 x 32), rounded down to a multiple of 8. The producer
# drops to PRODUCER_REGS with setmaxnreg, and the consumers take what it gives up (240).
MAXNREG = 168
# A persistent grid's longest-first order takes (batch, head) pairs in groups whose K and V fit in
# this much of L2 (H100 and H200: 50 MB; FlashAttention-3's scheduler takes 32 MB the same way).
# Without a mask 8, 16 and 32 MB are within 3% of each other at hd 128 (docs/tuning/attention.md,
# the fifth run); a causal STATIC grid loses with smaller groups (its deal is the less even)
L2_BYTES = 8 << 20
# The grid of a packed batch and of a windowed call, whatever their row says: the dynamic deal. At hd
# 128 on the H200 (two runs) the packed benchmark batch (64 sequences of 128..8192 tokens) ran at
# 451-499 TFLOP/s against 434-461 one tile a program and 389-418 STATIC; a window of 4096 keys at T
# 16384 at 0.93-0.96x plain causal's TFLOP/s against 0.92-0.94x STATIC and 0.89-0.92x one tile a
# program (docs/tuning/attention.md, the eighth run)
VARIABLE_WORK_GRID = DYNAMIC
PRODUCER_REGS = gl.constexpr(24)
CONSUMER_REGS = gl.constexpr(240)  # a ping-pong schedule's second consumer warpgroup, a worker partition


def gluon_config(head_dim, causal=False):
    """GLUON_CONFIG_TABLE's (BLOCK_M, BLOCK_N, STAGES, PINGPONG, SPLIT_RELEASE, GRID) for
    head_dim (one of GLUON_HEAD_DIMS) and the kernel's causal flag."""
    for dim, row_causal, *config in GLUON_CONFIG_TABLE:
        if dim == head_dim and row_causal == bool(causal):
            return tuple(config)
    raise ValueError(f"the Gluon forward takes head dims {GLUON_HEAD_DIMS}, got {head_dim}")


@gluon.constexpr_function
def wgmma_layout(block_m, block_n, num_warps):
    """The accumulator layout of a (block_m, block_n) wgmma product on num_warps warps: warpgroups
    stacked along M (64 rows each for 8 warps and 128 rows), one instruction as wide as N allows."""
    warps = [4, 1]
    while warps[0] * warps[1] != num_warps:
        if block_m > 16 * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    n = 256
    while n > block_n or block_n % n:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, n, 16])


@gluon.jit
def packed_sequence(g, cu_seqlens, n_seqs, BLOCK: gl.constexpr):
    """The sequence i of packed block g, where sequence i's blocks are [first(i), first(i + 1)),
    first(i) = cu_seqlens[i] // BLOCK + i: its ceil(length / BLOCK) blocks of BLOCK tokens and at
    most one more, an empty one (so a grid of total // BLOCK + n_seqs blocks covers any lengths
    without the host reading them). A binary search over first(i) (strictly increasing); a g past
    the last sequence's blocks gives the last sequence, whose block g - first(i) is then empty."""
    seq = g * 0
    above = n_seqs
    while above - seq > 1:  # first(seq) <= g < first(above)
        mid = (seq + above) // 2
        before = (gl.load(cu_seqlens + mid) // BLOCK + mid <= g).to(gl.int32)
        seq = seq + before * (mid - seq)
        above = mid + before * (above - mid)
    return seq


@gluon.jit
def _tile_of(tile, n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, cu_seqlens_q, cu_seqlens_k, window_left,
             window_right, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, VARLEN: gl.constexpr, LPT: gl.constexpr,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """What tile `tile` covers: (descriptor batch, head, kv head, q_start, k_start, off_m,
    n_queries, n_keys, causal_shift, lo, unmasked_lo, unmasked_hi, n_iter).
    Dense, n_m query blocks x n_bh (batch, head) pairs: tiles take a pair's query blocks one after
    another (its K and V stay in L2), the longest first under a mask (the tl kernel's order); LPT,
    a persistent grid's order under a mask: the pairs in groups of l2_pairs, and in a group every
    pair's longest block before any pair's shorter ones, so the last tiles a program takes are
    short.
    Packed (VARLEN, n_bh = sequences x n_heads): sequence i's tiles are [n_heads * first(i),
    n_heads * first(i + 1)) with first(i) = cu_seqlens_q[i] // BLOCK_M + i, its heads one after
    another, each over first(i + 1) - first(i) query blocks: the sequence's ceil(length / BLOCK_M)
    and at most one more, an empty tile (n_iter 0). So the host knows the tile count, n_heads x
    (total // BLOCK_M + sequences), without reading the lengths, and a batch of short sequences
    is not a grid of max_seqlen_q's blocks each, most of them empty (packed_sequence finds the
    sequence), its bounds read from cu_seqlens."""
    if VARLEN:
        batch = packed_sequence(tile // n_heads, cu_seqlens_q, n_bh // n_heads, BLOCK_M)
        q_start = gl.load(cu_seqlens_q + batch)
        q_end = gl.load(cu_seqlens_q + batch + 1)
        first = q_start // BLOCK_M + batch
        span = q_end // BLOCK_M + batch + 1 - first
        rest = tile - first * n_heads
        head = rest // span
        start_m = rest % span
        if CAUSAL or WINDOW:
            start_m = span - 1 - start_m
        # sequence `batch` of the packed (1, H, total, D) views. Past cu_seqlens_q[-1] < total the
        # last sequence's tiles run on to heads >= n_heads: those get no rows, so no work and no store
        n_queries = (q_end - q_start) * (head < n_heads).to(gl.int32)
        k_start = gl.load(cu_seqlens_k + batch)
        n_keys = gl.load(cu_seqlens_k + batch + 1) - k_start
        desc_batch = 0
    else:
        if LPT:
            # l2_pairs pairs at a time, whose K and V fit in L2 together (taking all n_bh pairs at
            # once, each key block comes from HBM again: -10% causal at T 16384)
            group = tile // (l2_pairs * n_m)
            pairs = gl.minimum(l2_pairs, n_bh - group * l2_pairs)  # the last group may be short
            rest = tile - group * l2_pairs * n_m
            start_m = n_m - 1 - rest // pairs
            bh = group * l2_pairs + rest % pairs
        else:
            start_m = tile % n_m
            bh = tile // n_m
            if CAUSAL or WINDOW:
                start_m = n_m - 1 - start_m
        head = bh % n_heads
        q_start = 0
        k_start = 0
        desc_batch = bh // n_heads
    kv_head = head // kv_group
    off_m = start_m * BLOCK_M
    causal_shift = n_keys - n_queries  # query i sees keys j <= i + causal_shift
    # the key range, as the tl kernel takes it: [lo, hi) visited, [unmasked_lo, unmasked_hi)
    # wholly visible to every row, lo and the unmasked bounds multiples of BLOCK_N
    lo, unmasked_lo, unmasked_hi, hi = key_blocks(start_m, n_keys, causal_shift, window_left, window_right, CAUSAL,
                                                  WINDOW, True, BLOCK_M, BLOCK_N)
    n_iter = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N)
    if VARLEN:  # a tile past its sequence's last query block: no work (its rows would see keys)
        n_iter = n_iter * (off_m < n_queries).to(gl.int32)
    return (desc_batch, head, kv_head, q_start, k_start, off_m, n_queries, n_keys, causal_shift, lo, unmasked_lo,
            unmasked_hi, n_iter)


@gluon.jit
def _load_q(q_desc, q_smem, q_bar, q_empty, batch, head, q_row, t_local):
    """The tile's q tiles from token q_row, once every consumer has handed back the last tile's
    (q_empty; the first lap passes)."""
    N_Q: gl.constexpr = q_smem.type.shape[0]
    TILE_M: gl.constexpr = q_smem.type.shape[3]
    mbarrier.wait(q_empty, (t_local & 1) ^ 1)
    mbarrier.expect(q_bar, N_Q * q_desc.block_type.nbytes)
    for i in gl.static_range(N_Q):
        tma.async_copy_global_to_shared(q_desc, [batch, head, q_row + i * TILE_M, 0], q_bar, q_smem.index(i))


@gluon.jit
def _producer_tile(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty,
                   cu_seqlens_q, cu_seqlens_k, n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, window_left,
                   window_right, tile, kv_count, t_local, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                   VARLEN: gl.constexpr, LPT: gl.constexpr, SPLIT_RELEASE: gl.constexpr):
    """_producer's copies for one tile, its t_local-th, after kv_count key blocks: returns the
    count after it."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    N_Q: gl.constexpr = q_smem.type.shape[0]
    TILE_M: gl.constexpr = q_smem.type.shape[3]
    desc_batch, head, kv_head, q_start, k_start, off_m, n_q, n_k, shift, lo, u_lo, u_hi, n_iter = _tile_of(
        tile, n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, cu_seqlens_q, cu_seqlens_k, window_left,
        window_right, CAUSAL, WINDOW, VARLEN, LPT, N_Q * TILE_M, BLOCK_N)
    if n_iter == 0:
        _load_q(q_desc, q_smem, q_bar, q_empty, desc_batch, head, q_start + off_m, t_local)
    for it in range(n_iter):
        c = kv_count + it
        s = c % STAGES
        free = ((c // STAGES) & 1) ^ 1
        if SPLIT_RELEASE:
            mbarrier.wait(k_empty.index(s), free)
        else:
            mbarrier.wait(v_empty.index(s), free)
        start_n = k_start + lo + it * BLOCK_N
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [desc_batch, kv_head, start_n, 0], k_ready.index(s), k_bufs.index(s))
        if SPLIT_RELEASE:
            mbarrier.wait(v_empty.index(s), free)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [desc_batch, kv_head, start_n, 0], v_ready.index(s), v_bufs.index(s))
        if it == 0:  # the tile's first key block goes out before q, whose tile the last one may still hold
            _load_q(q_desc, q_smem, q_bar, q_empty, desc_batch, head, q_start + off_m, t_local)
    return kv_count + n_iter


@gluon.constexpr_function
def _one_value_layout(num_warps):
    """A layout of a (1, 1) tensor on num_warps warps (each thread holds the one value)."""
    return gl.BlockedLayout([1, 1], [32, 1], [num_warps, 1], [1, 0])


@gluon.jit
def _publish_tile(sched, sched_ready, sched_empty, tile, t_local):
    """DYNAMIC, the producer: this program's t_local-th tile number into shared memory, once both
    consumers have read the last one (sched_empty; the first wait passes). One slot is enough: a
    consumer reads a number as its tile starts, and the next is published only once that tile's
    copies are issued. A number >= n_tiles tells the consumers to stop."""
    mbarrier.wait(sched_empty, (t_local & 1) ^ 1)
    sched.store(gl.full([1, 1], tile, gl.int32, _one_value_layout(gl.num_warps())))
    gl.thread_barrier()  # every lane's store before the arrive
    mbarrier.arrive(sched_ready)


@gluon.jit
def _read_tile(sched, sched_ready, sched_empty, t_local):
    """DYNAMIC, a consumer: its t_local-th tile number, the slot handed back."""
    mbarrier.wait(sched_ready, t_local & 1)
    tile = gl.max(gl.max(sched.load(_one_value_layout(gl.num_warps())), axis=1), axis=0)
    gl.thread_barrier()  # every lane's load before the slot goes back
    mbarrier.arrive(sched_empty)
    return tile


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty,
              cu_seqlens_q, cu_seqlens_k, tile_counter, sched, sched_ready, sched_empty, n_tiles, n_m, n_bh, l2_pairs,
              n_heads, kv_group, n_queries, n_keys, window_left, window_right, CAUSAL: gl.constexpr,
              WINDOW: gl.constexpr, VARLEN: gl.constexpr, LPT: gl.constexpr, SPLIT_RELEASE: gl.constexpr,
              GRID: gl.constexpr):
    """One warp, for each of this program's tiles: its key and value blocks lo, lo + BLOCK_N, ...
    into the ring, and after the first of them its q tiles (one a consumer warpgroup group), once
    the consumers are done with the last tile's (q_empty). A stage is refilled once every consumer
    released it (its K and its V separately with SPLIT_RELEASE, else both at once on v_empty). The
    ring's count runs on across tiles; each wait's parity starts at 1, so the first lap passes.
    DYNAMIC: each tile's number goes to the consumers first (_publish_tile), and once its copies
    are issued the next comes from tile_counter, so a program asks for work as it frees."""
    if GRID == DYNAMIC:
        kv_count = 0
        t_local = 0
        tile = gl.program_id(0)
        while tile < n_tiles:
            _publish_tile(sched, sched_ready, sched_empty, tile, t_local)
            kv_count = _producer_tile(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready,
                                      v_ready, k_empty, v_empty, cu_seqlens_q, cu_seqlens_k, n_m, n_bh, l2_pairs,
                                      n_heads, kv_group, n_queries, n_keys, window_left, window_right, tile, kv_count,
                                      t_local, CAUSAL, WINDOW, VARLEN, LPT, SPLIT_RELEASE)
            # every program's first tile is its program id: the counter numbers the rest. Each program
            # ends on one grab past the last tile, so a launch makes n_tiles grabs in all: the one
            # that finds n_tiles - 1 is the last, and puts the counter back to zero for the next launch
            taken = gl.atomic_add(tile_counter, 1, sem="relaxed")
            if taken == n_tiles - 1:
                gl.atomic_xchg(tile_counter, 0, sem="relaxed")
            tile = gl.num_programs(0) + taken
            t_local += 1
        _publish_tile(sched, sched_ready, sched_empty, tile, t_local)  # past the last tile: stop
    elif GRID == STATIC:
        kv_count = 0
        t_local = 0
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            kv_count = _producer_tile(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready,
                                      v_ready, k_empty, v_empty, cu_seqlens_q, cu_seqlens_k, n_m, n_bh, l2_pairs,
                                      n_heads, kv_group, n_queries, n_keys, window_left, window_right, tile, kv_count,
                                      t_local, CAUSAL, WINDOW, VARLEN, LPT, SPLIT_RELEASE)
            t_local += 1
    else:
        _producer_tile(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty,
                       v_empty, cu_seqlens_q, cu_seqlens_k, n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys,
                       window_left, window_right, gl.program_id(0), 0, 0, CAUSAL, WINDOW, VARLEN, LPT,
                       SPLIT_RELEASE)


@gluon.jit
def _scores_to_p(qk, m_i, start_n, rows, n_keys, causal_shift, qk_scale, window_left, window_right, softcap_log2,
                 MASKED: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr):
    """(p, m_new, alpha) of one block of raw scores qk (BLOCK_M, BLOCK_N), in exp2's units: the
    same arithmetic as the tl kernel's _attend_key_blocks."""
    scale = qk_scale
    if SOFTCAP:
        qk = softcap_log2 * tanh_approx(qk * qk_scale)
        scale = 1.0
    if MASKED:
        keys = start_n + gl.arange(0, qk.shape[1], layout=gl.SliceLayout(0, qk.type.layout))
        visible = gl.expand_dims(keys < n_keys, 0)
        rel = gl.expand_dims(keys, 0) - gl.expand_dims(rows + causal_shift, 1)
        if CAUSAL:
            visible = visible & (rel <= 0)
        if WINDOW:
            visible = visible & (rel >= -window_left) & (rel <= window_right)
        qk = gl.where(visible, qk * scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(qk, axis=1))
        # a row that has seen no key yet keeps m = -inf: subtract 0 so -inf - -inf is not NaN
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(qk - gl.expand_dims(m_safe, 1))
    else:
        m_new = gl.maximum(m_i, gl.max(qk, axis=1) * scale)  # scale > 0: the max commutes with it
        m_safe = m_new
        if SOFTCAP:
            p = gl.exp2(qk - gl.expand_dims(m_new, 1))  # scale is 1 under a cap
        else:
            p = gl.exp2(qk * scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_safe)
    return p, m_new, alpha


@gluon.jit
def _softmax_block(qk, m_i, it, lo, unmasked_lo, unmasked_hi, rows, n_keys, causal_shift, qk_scale, window_left,
                   window_right, softcap_log2, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                   SOFTCAP: gl.constexpr):
    """_scores_to_p of iteration it's block, masked only when a mask cuts it (outside
    [unmasked_lo, unmasked_hi))."""
    start_n = lo + it * BLOCK_N
    if (start_n < unmasked_lo) | (start_n >= unmasked_hi):
        p, m_new, alpha = _scores_to_p(qk, m_i, start_n, rows, n_keys, causal_shift, qk_scale, window_left,
                                       window_right, softcap_log2, True, CAUSAL, WINDOW, SOFTCAP)
    else:
        p, m_new, alpha = _scores_to_p(qk, m_i, start_n, rows, n_keys, causal_shift, qk_scale, window_left,
                                       window_right, softcap_log2, False, CAUSAL, WINDOW, SOFTCAP)
    return p, m_new, alpha


@gluon.jit
def _take_turn(turn, k, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait until the other consumer warpgroup has issued its k-th products (warpgroup
    0 goes first: its wait's parity starts at 1)."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (k & 1) ^ (1 - WG))


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: this warpgroup's products are issued; the other's turn."""
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG))


@gluon.jit
def _consumer_tile(q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, o_desc,
                   o_ptr, stride_oh, stride_om, lse_ptr, stride_lb, stride_lh, cu_seqlens_q, cu_seqlens_k, n_m, n_bh,
                   l2_pairs, n_heads, kv_group, n_queries, n_keys, qk_scale, window_left, window_right, softcap_log2,
                   tile, kv_count, t_local, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
                   STORE_LSE: gl.constexpr, VARLEN: gl.constexpr, LPT: gl.constexpr, WG: gl.constexpr,
                   PINGPONG: gl.constexpr, SPLIT_RELEASE: gl.constexpr):
    """_consumer's work on one tile, this program's t_local-th, after kv_count key blocks: returns
    the count after it. The ping-pong turns taken before follow from the two: a tile takes
    n_iter + 1 turns, an empty one (n_iter = 0) one with no products, so that is kv_count +
    t_local (a count of its own would hold a register across the key loop)."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    N_Q: gl.constexpr = q_smem.type.shape[0]
    BLOCK_M: gl.constexpr = q_smem.type.shape[3]
    HEAD_D: gl.constexpr = q_smem.type.shape[4]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    NUM_WARPS: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, NUM_WARPS)
    o_layout: gl.constexpr = wgmma_layout(BLOCK_M, HEAD_D, NUM_WARPS)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype

    q_tile = q_smem.index(WG).reshape([BLOCK_M, HEAD_D])
    o_tile4 = o_smem.index(WG)
    o_tile = o_tile4.reshape([BLOCK_M, HEAD_D])
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    batch, head, kv_head, q_start, k_start, off_m, n_q, n_k, causal_shift, lo, unmasked_lo, unmasked_hi, \
        n_iter = _tile_of(tile, n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, cu_seqlens_q, cu_seqlens_k,
                          window_left, window_right, CAUSAL, WINDOW, VARLEN, LPT, N_Q * BLOCK_M, BLOCK_N)
    off_m = off_m + WG * BLOCK_M
    rows = off_m + gl.arange(0, BLOCK_M, layout=row_s)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
    mbarrier.wait(q_bar, t_local & 1)
    turns = kv_count + t_local  # ping-pong turns taken before this tile
    if n_iter > 0:
        # block 0's scores and probabilities: the loop below starts with a P ready for its P v
        s0 = kv_count % STAGES
        _take_turn(turn, turns, WG, PINGPONG)
        mbarrier.wait(k_ready.index(s0), (kv_count // STAGES) & 1)
        qk = warpgroup_mma(q_tile, k_bufs.index(s0).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), s_zero,
                           use_acc=False, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
        if SPLIT_RELEASE:
            mbarrier.arrive(k_empty.index(s0))
        p, m_i, alpha = _softmax_block(qk, m_i, 0, lo, unmasked_lo, unmasked_hi, rows, n_k, causal_shift,
                                       qk_scale, window_left, window_right, softcap_log2, BLOCK_N, CAUSAL,
                                       WINDOW, SOFTCAP)
        l_i = gl.sum(p, axis=1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)  # outside the turn: the products issue sooner
        for it in range(1, n_iter):
            c = kv_count + it
            s = c % STAGES
            prev = (c - 1) % STAGES
            # issue this block's S, then the previous block's P v behind it on the tensor cores
            _take_turn(turn, turns + it, WG, PINGPONG)
            mbarrier.wait(k_ready.index(s), (c // STAGES) & 1)
            qk = warpgroup_mma(q_tile, k_bufs.index(s).reshape([BLOCK_N, HEAD_D]).permute((1, 0)), s_zero,
                               use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(prev), ((c - 1) // STAGES) & 1)
            acc = warpgroup_mma(p_op, v_bufs.index(prev).reshape([BLOCK_N, HEAD_D]), acc, is_async=True)
            _pass_turn(turn, WG, PINGPONG)
            qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))  # S done; P v may still run
            if SPLIT_RELEASE:
                mbarrier.arrive(k_empty.index(s))
            p, m_i, alpha = _softmax_block(qk, m_i, it, lo, unmasked_lo, unmasked_hi, rows, n_k, causal_shift,
                                           qk_scale, window_left, window_right, softcap_log2, BLOCK_N, CAUSAL,
                                           WINDOW, SOFTCAP)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(v_empty.index(prev))  # P v of stage prev is done (and its S, before it)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        mbarrier.arrive(q_empty)  # every S of the tile is done: q's tile may take the next tile's q
        c_last = kv_count + n_iter - 1
        last = c_last % STAGES
        _take_turn(turn, turns + n_iter, WG, PINGPONG)
        mbarrier.wait(v_ready.index(last), (c_last // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_bufs.index(last).reshape([BLOCK_N, HEAD_D]), acc, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(last))
    else:
        mbarrier.arrive(q_empty)
        _take_turn(turn, turns, WG, PINGPONG)  # the tile's one turn, no products
        _pass_turn(turn, WG, PINGPONG)

    # a row with no visible key has l = 0 and acc = 0: dividing by 1 gives the zeros of the convention
    l_o = gl.convert_layout(l_i, row_o)
    out = acc / gl.expand_dims(gl.where(l_o == 0.0, 1.0, l_o), 1)
    if STORE_LSE:
        seen = l_i > 0.0
        lse = gl.where(seen, (m_i + gl.log2(gl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
        # 32-bit offsets: an LSE of 2^31 values would come with a q of 2^31 x D x 2 bytes (256 GB at hd 64)
        lse_base = lse_ptr + (batch * stride_lb + head * stride_lh + q_start)
        gl.store(lse_base + rows, lse, mask=rows < n_q)
    if VARLEN:
        if off_m + BLOCK_M <= n_q:  # rows of this sequence only
            _store_o(o_tile, o_tile4, o_desc, out.to(dtype), batch, head, q_start + off_m)
        else:
            # the rows past this sequence's end are the next one's: stored with a mask (a TMA store
            # clips at the tensor's end only)
            rows_o = off_m + gl.arange(0, BLOCK_M, layout=row_o)
            cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
            # 16-byte strides (gluon_layout_ok), said here since the ints are not value-specialized
            stride_oh = gl.multiple_of(stride_oh, 8)
            stride_om = gl.multiple_of(stride_om, 8)
            o_base = o_ptr + head.to(gl.int64) * stride_oh + q_start.to(gl.int64) * stride_om
            o_ptrs = o_base + gl.expand_dims(rows_o.to(gl.int64) * stride_om, 1) + gl.expand_dims(cols, 0)
            gl.store(o_ptrs, out.to(dtype), mask=gl.expand_dims(rows_o < n_q, 1))
    else:
        _store_o(o_tile, o_tile4, o_desc, out.to(dtype), batch, head, off_m)
    return kv_count + n_iter


@gluon.jit
def _store_o(o_tile, o_tile4, o_desc, out, batch, head, row):
    """O's tile out by TMA from o_tile, rows row.. of (batch, head), once the last tile's has left
    it; the copy runs on while the next tile starts."""
    tma.store_wait(pendings=0)
    o_tile.store(out)
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [batch, head, row, 0], o_tile4)


@gluon.jit
def _consumer(q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, o_desc, o_ptr,
              stride_oh, stride_om, lse_ptr, stride_lb, stride_lh, cu_seqlens_q, cu_seqlens_k, sched, sched_ready,
              sched_empty, n_tiles, n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, qk_scale, window_left,
              window_right, softcap_log2, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
              STORE_LSE: gl.constexpr, VARLEN: gl.constexpr, LPT: gl.constexpr, WG: gl.constexpr,
              PINGPONG: gl.constexpr, SPLIT_RELEASE: gl.constexpr, GRID: gl.constexpr):
    """For each of this program's tiles, consumer WG's rows of it (WG * BLOCK_M on from the tile's
    first): S and O by wgmma, the online softmax, then O and LSE out. PINGPONG: two consumers
    take turns issuing their products (_take_turn), so one's softmax runs while the other's
    products hold the tensor cores. SPLIT_RELEASE: a stage's K is handed back once S is done, its
    V once P v is (else both after P v). q's tile is handed back (q_empty) once the tile's last S
    is done, so the producer loads the next tile's q under this one's last P v and epilogue; the
    ring's and the turns' counts run on across tiles. DYNAMIC: the tiles' numbers come from the
    producer (_read_tile)."""
    if GRID == DYNAMIC:
        kv_count = 0
        t_local = 0
        tile = _read_tile(sched, sched_ready, sched_empty, 0)
        while tile < n_tiles:
            kv_count = _consumer_tile(
                q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, o_desc,
                o_ptr, stride_oh, stride_om, lse_ptr, stride_lb, stride_lh, cu_seqlens_q, cu_seqlens_k, n_m, n_bh,
                l2_pairs, n_heads, kv_group, n_queries, n_keys, qk_scale, window_left, window_right, softcap_log2,
                tile, kv_count, t_local, CAUSAL, WINDOW, SOFTCAP, STORE_LSE, VARLEN, LPT, WG, PINGPONG,
                SPLIT_RELEASE)
            t_local += 1
            tile = _read_tile(sched, sched_ready, sched_empty, t_local)
    elif GRID == STATIC:
        kv_count = 0  # key blocks consumed before this tile (the ring's stage and parity)
        for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            kv_count = _consumer_tile(
                q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn, o_desc,
                o_ptr, stride_oh, stride_om, lse_ptr, stride_lb, stride_lh, cu_seqlens_q, cu_seqlens_k, n_m, n_bh,
                l2_pairs, n_heads, kv_group, n_queries, n_keys, qk_scale, window_left, window_right, softcap_log2,
                tile, kv_count, (tile - gl.program_id(0)) // gl.num_programs(0), CAUSAL, WINDOW, SOFTCAP, STORE_LSE,
                VARLEN, LPT, WG, PINGPONG, SPLIT_RELEASE)
    else:
        _consumer_tile(q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                       o_desc, o_ptr, stride_oh, stride_om, lse_ptr, stride_lb, stride_lh, cu_seqlens_q, cu_seqlens_k,
                       n_m, n_bh, l2_pairs,
                       n_heads, kv_group, n_queries, n_keys, qk_scale, window_left, window_right, softcap_log2,
                       gl.program_id(0), 0, 0, CAUSAL, WINDOW, SOFTCAP, STORE_LSE, VARLEN, LPT, WG, PINGPONG,
                       SPLIT_RELEASE)
    tma.store_wait(pendings=0)


# The kernel's int arguments are not specialized on their values (a shape or a stride would
# otherwise compile a variant for each value of 1 and each multiple of 16, and the direct launch's
# key could not see them): only their width, int32 or int64, is part of the specialization
_INT_ARGS = ("stride_oh", "stride_om", "stride_lb", "stride_lh", "n_tiles", "n_m", "n_bh", "l2_pairs", "n_heads",
             "kv_group", "n_queries", "n_keys", "window_left", "window_right")


@gluon.jit(do_not_specialize=_INT_ARGS)
def _gluon_attention_fwd_kernel(
    q_desc, k_desc, v_desc, o_desc, o_ptr, lse_ptr, cu_seqlens_q, cu_seqlens_k, tile_counter,
    stride_oh, stride_om, stride_lb, stride_lh,
    n_tiles, n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, qk_scale,
    window_left, window_right, softcap_log2,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, STORE_LSE: gl.constexpr,
    VARLEN: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, SPLIT_RELEASE: gl.constexpr,
    GRID: gl.constexpr,
):
    """n_tiles: n_m query blocks x n_bh (batch, head) pairs, or a packed batch's count (_tile_of;
    n_bh = sequences x heads). GRID ONE_TILE: a grid of
    n_tiles, a tile a program; STATIC or DYNAMIC: a grid of one program an SM (its K and V ring,
    its barriers and its register split set up once), taking tiles program_id, + num_programs, ...
    (STATIC) or program_id and then the next of tile_counter (int32, zero at the launch, and
    zero again at its end) as it frees (DYNAMIC)."""
    N_Q: gl.constexpr = 2 if PINGPONG else 1  # consumer warpgroup groups, a q tile each
    BLOCK_M: gl.constexpr = N_Q * q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    LPT: gl.constexpr = (GRID != ONE_TILE) and (CAUSAL or WINDOW) and not VARLEN
    if VARLEN and GRID == ONE_TILE:  # a tile past its sequence's end returns at once
        _, _, _, _, _, off_m, n_q, _, _, _, _, _, _ = _tile_of(
            gl.program_id(0), n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, cu_seqlens_q, cu_seqlens_k,
            window_left, window_right, CAUSAL, WINDOW, VARLEN, LPT, BLOCK_M, BLOCK_N)
        if off_m >= n_q:
            return

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [N_Q] + q_desc.block_type.shape, q_desc.layout)
    o_smem = gl.allocate_shared_memory(o_desc.dtype, [N_Q] + o_desc.block_type.shape, o_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # DYNAMIC's tile number, producer to consumers (allocated whatever the grid: 20 bytes)
    sched = gl.allocate_shared_memory(gl.int32, [1, 1], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    sched_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    sched_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(sched_ready, count=1)
    mbarrier.init(sched_empty, count=N_Q)  # each consumer reads the number
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_empty, count=N_Q)  # each consumer hands q's tile back
    for st in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(st), count=1)
        mbarrier.init(v_ready.index(st), count=1)
        mbarrier.init(k_empty.index(st), count=N_Q)  # each consumer releases a stage
        mbarrier.init(v_empty.index(st), count=N_Q)
    for st in gl.static_range(2):
        mbarrier.init(turn.index(st), count=1)

    # worker partitions take scalars, descriptors and shared-memory handles; the argument lists are
    # spelled out in each branch (a jit function cannot go into a tuple)
    if PINGPONG:
        gl.warp_specialize([
            (_consumer, (q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                         o_desc, o_ptr, stride_oh, stride_om, lse_ptr, stride_lb, stride_lh, cu_seqlens_q,
                         cu_seqlens_k, sched, sched_ready, sched_empty, n_tiles, n_m, n_bh, l2_pairs, n_heads,
                         kv_group, n_queries, n_keys, qk_scale, window_left, window_right, softcap_log2, CAUSAL,
                         WINDOW, SOFTCAP, STORE_LSE, VARLEN, LPT, 0, True, SPLIT_RELEASE, GRID)),
            (_consumer, (q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                         o_desc, o_ptr, stride_oh, stride_om, lse_ptr, stride_lb, stride_lh, cu_seqlens_q,
                         cu_seqlens_k, sched, sched_ready, sched_empty, n_tiles, n_m, n_bh, l2_pairs, n_heads,
                         kv_group, n_queries, n_keys, qk_scale, window_left, window_right, softcap_log2, CAUSAL,
                         WINDOW, SOFTCAP, STORE_LSE, VARLEN, LPT, 1, True, SPLIT_RELEASE, GRID)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty,
                         v_empty, cu_seqlens_q, cu_seqlens_k, tile_counter, sched, sched_ready, sched_empty, n_tiles,
                         n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, window_left, window_right, CAUSAL,
                         WINDOW, VARLEN, LPT, SPLIT_RELEASE, GRID)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (q_smem, o_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                         o_desc, o_ptr, stride_oh, stride_om, lse_ptr, stride_lb, stride_lh, cu_seqlens_q,
                         cu_seqlens_k, sched, sched_ready, sched_empty, n_tiles, n_m, n_bh, l2_pairs, n_heads,
                         kv_group, n_queries, n_keys, qk_scale, window_left, window_right, softcap_log2, CAUSAL,
                         WINDOW, SOFTCAP, STORE_LSE, VARLEN, LPT, 0, False, SPLIT_RELEASE, GRID)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, q_empty, k_ready, v_ready, k_empty,
                         v_empty, cu_seqlens_q, cu_seqlens_k, tile_counter, sched, sched_ready, sched_empty, n_tiles,
                         n_m, n_bh, l2_pairs, n_heads, kv_group, n_queries, n_keys, window_left, window_right, CAUSAL,
                         WINDOW, VARLEN, LPT, SPLIT_RELEASE, GRID)),
        ], [1], [PRODUCER_REGS])


# the persistent grid's size for a tensor off the GPU (scripts/gluon_compile.py): an H100 SXM's or H200's SMs
HOPPER_SMS = 132


def gluon_layout_ok(*tensors):
    """Whether TMA can address each (B, H, T, D) tensor in place: unit last stride, the other
    strides and the base 16-byte aligned."""
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s * size % 16 for s in t.stride()[:-1]):
            return False
    return True


# DYNAMIC's tile counters, one a (device, stream): zero between launches (the kernel's last grab
# puts its counter back), so a launch costs no fill; launches on two streams may overlap, so they
# never share one. The counter counts on stream order: a stream handle CUDA reuses while a launch
# on the destroyed stream still runs would share it (and one left non-zero is never reset)
_TILE_COUNTERS = {}


def _tile_counter(device):
    """The int32 tile counter a DYNAMIC launch on `device`, the current device, takes on its
    current stream, zero. Under CUDA graph capture a fresh zeroed one: its fill is captured and
    replays with the graph, which a counter shared with eager launches could not count on."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():  # off the GPU: gluon_compile.py
        return torch.zeros(1, dtype=torch.int32, device=device)
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    counter = _TILE_COUNTERS.get(key)
    if counter is None:
        counter = _TILE_COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


@functools.cache
def _tile_layout(block, head_dim, dtype):
    """The shared-memory layout of a (1, 1, block, head_dim) tile of torch dtype `dtype`, its block
    shape checked as TensorDescriptor checks it: made once (get_default_for takes ~7 us of the
    host's time, and a launch builds four descriptors)."""
    validate_block_shape([1, 1, block, head_dim])
    return gl.NVMMASharedLayout.get_default_for([1, 1, block, head_dim],
                                                gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


class _Descriptor(TensorDescriptor):
    """A TensorDescriptor without the checks it runs at each construction (a quarter of a
    launch's host time on an H200's host, ~15 us for the four): what they check holds already,
    the tensors' alignment and strides by gluon_layout_ok, the block shape and layout by
    _tile_layout once, and the shapes are non-empty (the launchers return before an empty call)."""

    def __post_init__(self):
        pass


def _descriptor(t, block):
    """A 4-D TMA descriptor over t (B, H, T, D), in place, for (1, 1, block, D) tiles."""
    return _Descriptor(t, list(t.shape), list(t.stride()), [1, 1, block, t.shape[3]],
                       _tile_layout(block, t.shape[3], t.dtype))


def gluon_attention_args(q, k, v, out, causal, scale, lse=None, mask=NO_MASK, config=None, cu_seqlens=None):
    """(grid, args, meta) of the Gluon forward on validated arguments (launch_flash_attention's):
    q, out (B, H, Tq, D), k, v (B, Hkv, Tk, D), D in GLUON_HEAD_DIMS, laid out as gluon_layout_ok
    asks; lse None or fp32 (B, H, Tq) with unit token stride. cu_seqlens: None, or
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q) for a packed batch of (1, H, total, D) views, as
    launch_flash_attention takes it. config: (BLOCK_M, BLOCK_N, STAGES, PINGPONG, SPLIT_RELEASE,
    GRID) instead of gluon_config's (whose GRID is VARIABLE_WORK_GRID for a packed batch or a
    window). Also what scripts/gluon_compile.py compiles for sm_90 without a GPU."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    # a packed batch's totals bound each of its sequences
    causal, has_window, left, right = kernel_mask(causal, mask, tq, tk)
    cu_q = cu_k = None
    if cu_seqlens is not None:
        cu_q, cu_k, tq = cu_seqlens
        b = cu_q.shape[0] - 1
    block_m, block_n, stages, pingpong, split_release, grid = config or gluon_config(d, causal)
    if config is None and (cu_q is not None or has_window):
        grid = VARIABLE_WORK_GRID
    grid = int(grid)
    if grid not in (0, 1, 2):
        raise ValueError(f"config's GRID must be ONE_TILE, STATIC or DYNAMIC (0, 1, 2), got {grid}")
    tile_m = block_m // 2 if pingpong else block_m  # a consumer's q tile
    num_warps = 4 if pingpong else block_m // 16
    qk_scale, softcap_log2, has_softcap = softcap_scales(scale, mask.softcap)
    lse_strides = (lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
    n_m, n_bh = cdiv(tq, block_m), b * h
    # a packed batch: a tile a query block of each (sequence, head), and at most one more (_tile_of)
    n_tiles = n_m * n_bh if cu_q is None else h * (q.shape[2] // block_m + b)
    # LPT's group: the (batch, head) pairs whose K and V take L2_BYTES together, whole kv groups
    kv_bytes = 2 * max(tk, 1) * d * q.element_size()  # a kv head's K and V
    l2_pairs = max(1, min(n_bh, max(1, L2_BYTES // kv_bytes) * (h // hkv)))
    counter = _tile_counter(q.device) if grid == DYNAMIC else None
    args = (_descriptor(q, tile_m), _descriptor(k, block_n), _descriptor(v, block_n), _descriptor(out, tile_m), out,
            lse, cu_q, cu_k, counter, out.stride(1), out.stride(2), *lse_strides, n_tiles, n_m, n_bh, l2_pairs, h,
            h // hkv, tq, tk, qk_scale, left, right, softcap_log2)
    meta = dict(CAUSAL=causal, WINDOW=has_window, SOFTCAP=has_softcap, STORE_LSE=lse is not None,
                VARLEN=cu_q is not None, STAGES=stages, PINGPONG=bool(pingpong), SPLIT_RELEASE=bool(split_release),
                GRID=grid, num_warps=num_warps, maxnreg=MAXNREG)
    sms = sm_count(q.device, HOPPER_SMS) if q.device.type == "cuda" else HOPPER_SMS
    return (n_tiles if grid == ONE_TILE else min(n_tiles, sms),), args, meta


def launch_gluon_attention(q, k, v, out, causal, scale, lse=None, mask=NO_MASK, config=None, cu_seqlens=None):
    """Launch the Gluon forward (arguments as gluon_attention_args takes them: non-empty, laid out
    as gluon_layout_ok asks, which the descriptors no longer check); writes out and lse. On q's
    device as the current one (its stream's tile counter, its kernel)."""
    if q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):
            return launch_gluon_attention(q, k, v, out, causal, scale, lse, mask, config, cu_seqlens)
    if cu_seqlens is not None and cu_seqlens[0].shape[0] == 1:
        return  # no sequence: nothing to write (packed_sequence needs one)
    grid, args, meta = gluon_attention_args(q, k, v, out, causal, scale, lse, mask, config, cu_seqlens)
    _launch(q.device, grid, args, meta)


# compiled kernels by _launch_key: the second launch of a key on goes straight to the kernel
_COMPILED = {}
INT32_MAX = 2 ** 31 - 1


def _launch_key(device, args, meta):
    """What the kernel's specialization depends on, read off a launch's arguments: the constexprs
    and options; the descriptors' type (q's dtype, head dim and block rows: the tiles and their
    layout); the optional tensors' dtypes and whether their bases are 16-byte aligned (None where
    not given; out's base is aligned: gluon_layout_ok); each int argument's width, int32 or int64
    (_INT_ARGS are not value-specialized, and floats never are); the two knobs JITFunction.run
    folds into the compile options."""
    names = _arg_names()
    assert len(args) == len(names), f"{len(args)} arguments for the kernel's {len(names)}"
    named = dict(zip(names, args))
    q_desc, k_desc = named["q_desc"], named["k_desc"]
    optional = tuple(None if named[n] is None else (named[n].dtype, named[n].data_ptr() % 16 == 0)
                     for n in ("lse_ptr", "cu_seqlens_q", "cu_seqlens_k", "tile_counter"))
    narrow = tuple(-INT32_MAX - 1 <= named[n] <= INT32_MAX for n in _INT_ARGS)
    return (device, q_desc.base.dtype, q_desc.block_shape[2], k_desc.block_shape[2], q_desc.block_shape[3], optional,
            narrow, tuple(meta.items()), knobs.runtime.debug, knobs.compilation.instrumentation_mode)


def _launch(device, grid, args, meta):
    """_gluon_attention_fwd_kernel[grid](*args, **meta) on the current device, `device`; from a
    key's second launch on directly (common/direct_launch.py), without JITFunction.run's binding
    and specializing of 25 arguments: about a third of the launch's host time
    (docs/tuning/attention.md, the sixth run)."""
    key = _launch_key(device, args, meta)
    kernel = _COMPILED.get(key)
    if kernel is None:
        _COMPILED[key] = _gluon_attention_fwd_kernel[grid](*args, **meta)
        return
    run_compiled(kernel, grid, device.index, (*args, *(meta[name] for name in _constexpr_names())))


@functools.cache
def _constexpr_names():
    """The kernel's constexpr parameters in order: they follow its other arguments in the launch."""
    return tuple(p.name for p in _gluon_attention_fwd_kernel.params if p.is_constexpr)


@functools.cache
def _arg_names():
    """The kernel's other parameters in order, as gluon_attention_args lays out its arguments."""
    return tuple(p.name for p in _gluon_attention_fwd_kernel.params if not p.is_constexpr)


__all__ = ["DYNAMIC", "GLUON_CONFIG_TABLE", "GLUON_HEAD_DIMS", "ONE_TILE", "STATIC", "gluon_attention_args",
           "gluon_config", "gluon_layout_ok", "launch_gluon_attention"]
