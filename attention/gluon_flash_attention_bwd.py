"""FlashAttention backward for Hopper (sm_90) in Gluon, the two-pass schedule's two kernels: dk, dv
and dq. TMA loads, warp specialization, async wgmma.

The same computation as the tl kernels of the two-pass schedule (attention/
triton_flash_attention_bwd.py: read its docstring first, for the formulas, LSE's and delta's
conventions and the masks), laid out as FlashAttention-3's backward lays out its dk/dv loop:

dk, dv (_gluon_dkdv_kernel):
- One program a block of 128 keys of one (batch, kv head). A producer warp (24 registers) loads
  the block's K and V once, then the query blocks that see them, over every query head of the GQA
  group in turn: each block's q and dO tiles and its LSE and delta values into a ring of STAGES
  shared-memory stages (one barrier a stage the copies complete, one the consumers release it on).
- Two consumer warpgroups, a partition each (64 keys each; 240 registers a thread), keep the fp32
  dk and dv accumulators of their keys and run, a query block at a time, transposed so the keys
  are wgmma's M:
      S^T = k q^T and dP^T = v dO^T    issued together, asynchronously
      P^T = exp2(S^T * scale - LSE)    once S^T is done, while dP^T runs
      dS^T = P^T * (dP^T - delta)      once dP^T is done
      dv += P^T dO, dk += dS^T q       issued together, P^T and dS^T from registers
  Nothing ties the two warpgroups but the ring: each releases a stage on its own, so they drift
  apart and one's softmax runs while the other's products do (in one partition, lockstep, the
  kernel ran 10-13% slower at one config). LSE and delta come from the stage as the math needs
  them (held in registers across the products, they spilled). The causal mask applies on the
  blocks the diagonal cuts only (query_blocks' lead).
- dk (times sm_scale) and dv leave through each warpgroup's rows of the K and V tiles by TMA
  stores; the copies clip the rows past the keys' end.

dq (_gluon_dq_kernel): the forward's shape. One program a block of 128 queries of one (batch,
head), two consumer warpgroups of 64 queries, a partition each; the producer loads its q and dO
tiles once, then the key blocks it sees into a ring of K and V stages; the consumers run S = q k^T
and dP = dO v^T together, then dq += dS k, and dq (times sm_scale) leaves through their rows of
q's tile. Only the blocks past the unmasked ones (the causal diagonal, the end of the keys:
key_blocks' tail) are masked.

In a dense call, rows past the end of the queries read LSE 0 or -inf (the latter taken as +inf, so
P is 0): q's and dO's tiles are zero there (the descriptors clip at a head's last token), so they
add nothing. Keys past the end have zero k and v rows, whose dk and dv are computed and never
stored, and which the dq kernel masks (a packed batch's rows past a sequence's end: below). The
dk/dv kernel caps P's exponent at 0, as the tl kernel does (a key row past the end, S = 0, stays
finite on a query whose scores are all very negative).

Two passes, seven products a query block where one pass has five: a one-pass dk/dv kernel adding
dq by fp32 atomics (dS^T shared between the warpgroups through shared memory; Triton 3.6's Gluon
has no TMA reduce) ran 0.67-0.74x this pair on the H200 (docs/tuning/attention.md, the Gluon
backward's third run, has its design and figures).

Both kernels take every mask of the dense call: causal, a sliding window (the tl kernels' block
ranges, query_blocks and key_blocks, and their masked edges) and a softcap (P from c * tanh(s / c),
dS times 1 - tanh^2; fewer queries a stage for the dk/dv kernel, GLUON_DKDV_SOFTCAP_CONFIG).

Packed batches (VARLEN): the descriptors span the packed (1, H, total, D) views, and a program
takes a block of one sequence (packed_sequence: a grid of total // BLOCK + sequences blocks, not
max_seqlen's for every sequence), its tokens from the sequence's first (read from cu_seqlens on
the device). A block that runs past its sequence's end reads the next sequence's rows: the dk/dv
kernel reads LSE +inf for those queries (packed_stats; P^T 0, no mask), the dq kernel masks those
keys as it masks the end of the keys, and the rows of dk, dv or dq past the end leave by a masked
store instead of TMA (_rows_out). As in the forward, what the packed tensors hold there must be
finite data.

delta comes from the tl preprocess: launch_flash_attention_backward runs it before them, into a
stats_buffer (whose rows TMA can copy from). Both kernels run where attention_paths.gluon_backward
and gluon_backward_supported take the call: dense or packed, any mask, head dims 64 and 128, at
most MAX_GRID_Y (batch, head) pairs, layouts TMA reads in place; launch_flash_attention_backward's
gluon also runs either alone, with the tl kernel for the other (tests and the A/B).

Written against Triton 3.6's Gluon, as the forward (attention/gluon_flash_attention_fwd.py, whose
layout helpers and descriptors they share). They do not run in the interpreter.
"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from llmk.attention.attention_checks import NO_MASK
from llmk.attention.gluon_flash_attention_fwd import (
    CONSUMER_REGS,
    MAXNREG,
    PRODUCER_REGS,
    _Descriptor,
    _descriptor,
    gluon_layout_ok,
    packed_sequence,
    wgmma_layout,
)
from llmk.attention.triton_flash_attention_bwd import query_blocks
from llmk.attention.triton_flash_attention_fwd import MAX_GRID_Y, kernel_mask, key_blocks
from llmk.common.ints import cdiv
from llmk.common.triton_utils import LOG2E, softcap_scales, tanh_approx

# A consumer warpgroup's rows (wgmma's M): 64 keys of the dk/dv kernel's BLOCK_N = 128, 64
# queries of the dq kernel's BLOCK_M = 128. Each warpgroup is a partition of its own: they share
# the producer's ring but not a barrier, so one's softmax runs while the other's products do.
WG_ROWS = 64
# head dim -> (BLOCK_M, BLOCK_N, STAGES): BLOCK_M queries a ring stage. Shared memory: K and V
# (128 x D each) + STAGES x (q and dO, BLOCK_M x D each), 2 bytes a value: 128 KB at hd 128 and
# BLOCK_M 64, two stages. Registers a consumer thread at hd 128: dk and dv 64 each, S^T and dP^T
# 32 each at BLOCK_M 64.
# On the H200 (scripts/tune/gluon_backward_ab.py, both kernels in Gluon): at hd 64, 128 queries a
# stage +5-9% over 64 though ptxas spills 24 bytes a thread; at hd 128, 64 queries +7-12% over 32,
# and three stages within -6..+6% of two (docs/tuning/attention.md, the Gluon backward). A packed
# batch takes the same configs: at hd 64 it keeps its sequence's bounds live beside the masks and
# ptxas spills 160 bytes a thread causal (8 under a window), yet 128 queries a stage ran +4% over
# 64, which spills nothing (attention_bench's packed batch, causal, GQA 32/8).
GLUON_DKDV_CONFIG = {
    64: (128, 128, 2),
    128: (64, 128, 2),
}
# Under a softcap the tanh values stay live beside P^T: fewer queries a stage, where ptxas spills
# nothing (hd 64 at 128 queries spilled 1.5 KB a thread, hd 128 at 64 84 bytes). On the H200 at hd
# 128, causal T 4096, softcap 50: 1.03x the tl kernels' best schedule.
GLUON_DKDV_SOFTCAP_CONFIG = {
    64: (64, 128, 2),
    128: (32, 128, 3),
}
# A causal grid's programs are not equal: the dk/dv kernel's key block 0 sees every query, its
# last block a few; the dq kernel's last query block sees every key. In the launch order (a
# (batch, head) row's blocks, then the next row's) the heaviest programs of the last rows start
# late, and where a grid is a few waves deep the SMs wait on them: modelled (a greedy deal of
# programs whose time is their blocks' count, onto 132 SMs), 1.28x the ideal time at the dk/dv
# grid of the llama-1.5b step's attention (hd 64, B 2, 8 KV heads, T 4096: 512 programs), 1.14x at
# hd 128 B4 H32/8 T4096, 1.03x at the dense MHA shapes. CAUSAL_ROW_GROUP > 0 deals the programs
# in groups of that many rows, block-major within a group, heaviest block first (modelled 1.00x
# at groups of 4 at both GQA shapes; a group's rows share their q and dO in L2 as neighbours do
# in the launch order). 0: the launch order. On the H200 (scripts/tune/gluon_backward_ab.py, bwd
# TFLOP/s, 0 -> 4 -> 8): the llama shape 338 -> 387 -> 377 (cuDNN 359), hd 128 GQA 416 -> 424 ->
# 432, hd 128 MHA T 4096 415 -> 430 -> 420, T 16384 457 -> 461 -> 444, T 1024 289 -> 293 -> 294,
# hd 64 B8 T 2048 317 -> 323 -> 325: 4 wins or ties everywhere, 8 loses at T 16384.
CAUSAL_ROW_GROUP = 4
# the other configs scripts/tune/gluon_backward_ab.py weighs (and scripts/gluon_compile.py compiles)
DKDV_AB_CONFIGS = {
    64: ((64, 128, 2), (64, 128, 3)),
    128: ((32, 128, 3), ),  # (64, 128, 3): within -6..+6% of two stages, spilling 68 bytes
}


@gluon.jit
def _lse_log2(lse):
    """LSE in scaled log2 units, +inf where a query sees no key (LSE -inf), so its P is 0 (the tl
    kernels' _row_stats). delta is 0 there already (the preprocess)."""
    return gl.where(lse == float("-inf"), float("inf"), lse * LOG2E)


@gluon.jit
def _query_stats(lse_ptr, delta_ptr, offset, queries, n_queries):
    """(LSE in scaled log2 units, delta) of `queries` from (batch, head) offset `offset`; past the
    end LSE -inf, so P is 0 there."""
    in_range = queries < n_queries
    lse = gl.load(lse_ptr + offset + queries, mask=in_range, other=float("-inf"))
    return _lse_log2(lse), gl.load(delta_ptr + offset + queries, mask=in_range, other=0.0)


@gluon.jit
def _rows_out(out, smem, smem4, desc, ptr, stride_h, stride_m, batch, head, start, first_row, n_rows,
              VARLEN: gl.constexpr):
    """A consumer warpgroup's rows first_row .. of (batch, head) out, tokens from start: by TMA from
    smem (its (M, D) rows of a tile, smem4 their (1, 1, M, D) view), whose copy clips at the
    tensor's end; or, where a packed sequence of n_rows tokens ends within them (the rows past it
    are the next sequence's), by a masked store to ptr (head and token strides stride_h, stride_m;
    unit feature stride). `out` in registers, 16-bit, every product that read smem's rows done."""
    if VARLEN:
        if first_row + out.type.shape[0] > n_rows:
            _masked_rows_out(out, ptr, stride_h, stride_m, head, start, first_row, n_rows)
        else:
            _tma_rows_out(out, smem, smem4, desc, batch, head, start + first_row)
    else:
        _tma_rows_out(out, smem, smem4, desc, batch, head, start + first_row)


@gluon.jit
def _tma_rows_out(out, smem, smem4, desc, batch, head, row):
    smem.store(out)
    fence_async_shared()
    tma.async_copy_shared_to_global(desc, [batch, head, row, 0], smem4)
    tma.store_wait(pendings=0)


@gluon.jit
def _masked_rows_out(out, ptr, stride_h, stride_m, head, start, first_row, n_rows):
    M: gl.constexpr = out.type.shape[0]
    D: gl.constexpr = out.type.shape[1]
    rows = gl.arange(0, M, layout=gl.SliceLayout(1, out.type.layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, out.type.layout))
    # the first row's offset in 64 bits (a packed batch's pass 2^31 values at 16M tokens x 128),
    # the tile's in 32 (64-bit offsets a value spilled)
    base = ptr + head.to(gl.int64) * stride_h + (start + first_row).to(gl.int64) * stride_m
    offsets = gl.expand_dims(rows * stride_m, 1) + gl.expand_dims(cols, 0)
    gl.store(base + offsets, out, mask=gl.expand_dims(first_row + rows < n_rows, 1))


@gluon.jit
def _dkdv_producer(q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs, delta_bufs,
                   k_tile, v_tile, kv_bar, ready, empty, batch, kv_head, kv_group, n_heads, q_start, k_start,
                   stats_start, start_n, lo, n_blocks):
    """One warp: the program's K and V blocks once, then for each query head of the group and each
    of its n_blocks query blocks from lo, q's and dO's tiles and their LSE and delta values into
    the ring, a stage once the consumers released it (the first lap's waits pass). Tokens count
    from q_start and k_start, LSE and delta values from stats_start (a packed sequence's first
    token and its place in packed_stats' layout; 0 dense)."""
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    BLOCK_N: gl.constexpr = k_tile.type.shape[2]
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [batch, kv_head, k_start + start_n * BLOCK_N, 0], kv_bar, k_tile)
    tma.async_copy_global_to_shared(v_desc, [batch, kv_head, k_start + start_n * BLOCK_N, 0], kv_bar, v_tile)
    for it in range(kv_group * n_blocks):
        s = it % STAGES
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        head = kv_head * kv_group + it // n_blocks
        row = lo + (it % n_blocks) * BLOCK_M
        mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes +
                        lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [batch, head, q_start + row, 0], ready.index(s), q_bufs.index(s))
        tma.async_copy_global_to_shared(do_desc, [batch, head, q_start + row, 0], ready.index(s), do_bufs.index(s))
        tma.async_copy_global_to_shared(lse_desc, [batch * n_heads + head, stats_start + row], ready.index(s),
                                        lse_bufs.index(s))
        tma.async_copy_global_to_shared(delta_desc, [batch * n_heads + head, stats_start + row], ready.index(s),
                                        delta_bufs.index(s))


@gluon.jit
def _dkdv_consumer(q_bufs, do_bufs, lse_bufs, delta_bufs, k_tile, v_tile, kv_bar, ready, empty, dk_desc, dv_desc,
                   dk_ptr, stride_dkh, stride_dkm, dv_ptr, stride_dvh, stride_dvm, batch, kv_head, kv_group, n_keys,
                   k_start, start_n, lo, lead_hi, unmasked_hi, n_blocks, causal_shift, qk_scale, sm_scale,
                   window_left, window_right, softcap_log2, CAUSAL: gl.constexpr, WINDOW: gl.constexpr,
                   SOFTCAP: gl.constexpr, VARLEN: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG: dk, dv of the program's keys WG * 64 .. WG * 64 + 63 over the
    producer's query blocks (module docstring), then out by TMA through its rows of K's and V's
    tiles. VARLEN: a packed sequence's keys from k_start: the query rows past its end (the next
    sequence's) read LSE +inf (packed_stats), so P^T is 0 there, and dk, dv rows past its end are
    left unwritten (_rows_out)."""
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    HEAD_D: gl.constexpr = q_bufs.type.shape[4]
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    WG_N: gl.constexpr = dk_desc.block_type.shape[2]  # a warpgroup's keys, wgmma's M
    s_layout: gl.constexpr = wgmma_layout(WG_N, BLOCK_M, 4)  # S^T, dP^T: keys x queries
    acc_layout: gl.constexpr = wgmma_layout(WG_N, HEAD_D, 4)  # dk, dv
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    keys_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    queries_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_bufs.dtype

    k_rows = k_tile.slice(WG * WG_N, WG_N, dim=2)  # (1, 1, WG_N, D) views for the TMA stores
    v_rows = v_tile.slice(WG * WG_N, WG_N, dim=2)
    k_t = k_tile.reshape([2 * WG_N, HEAD_D]).slice(WG * WG_N, WG_N)  # (WG_N, D) views for the products
    v_t = v_tile.reshape([2 * WG_N, HEAD_D]).slice(WG * WG_N, WG_N)
    dk = gl.zeros([WG_N, HEAD_D], gl.float32, acc_layout)
    dv = gl.zeros([WG_N, HEAD_D], gl.float32, acc_layout)
    first_key = start_n * 2 * WG_N + WG * WG_N
    mbarrier.wait(kv_bar, 0)
    for it in range(kv_group * n_blocks):
        s = it % STAGES
        start_m = lo + (it % n_blocks) * BLOCK_M
        q_t = q_bufs.index(s).reshape([BLOCK_M, HEAD_D])
        do_t = do_bufs.index(s).reshape([BLOCK_M, HEAD_D])
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        # use_acc=False: the zeros are never read (made here, they hold no registers across the loop)
        s_zero = gl.zeros([WG_N, BLOCK_M], gl.float32, s_layout)
        s_t = warpgroup_mma(k_t, q_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_t, do_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_t = warpgroup_mma_wait(num_outstanding=1, deps=(s_t, ))  # S^T done; dP^T may still run
        # the stats come from the stage as they are needed: held across the products they spill.
        # Rows past the head's end read LSE 0 (the copy clips there), as their q and dO rows do;
        # a packed sequence's, +inf (packed_stats)
        lse2 = _lse_log2(lse_bufs.index(s).reshape([BLOCK_M]).load(queries_l))
        if SOFTCAP:  # the scores capped, c * tanh(s / c), in exp2's units (softcap_scales)
            t = tanh_approx(s_t * qk_scale)
            p_t = gl.exp2(gl.minimum(softcap_log2 * t - gl.expand_dims(lse2, 0), 0.0))
        else:
            p_t = gl.exp2(gl.minimum(s_t * qk_scale - gl.expand_dims(lse2, 0), 0.0))
        if CAUSAL or WINDOW:
            # a block the diagonal cuts (the causal lead), or a window's edge: [lo, lead_hi), [unmasked_hi, hi)
            masked = start_m < lead_hi
            if WINDOW:
                masked = masked | (start_m >= unmasked_hi)
            if masked:
                # the indices are made here: hoisted out of the loop, they spill
                keys = first_key + gl.arange(0, WG_N, layout=keys_l)
                queries = start_m + gl.arange(0, BLOCK_M, layout=queries_l)
                # window_visible's, transposed: key j, query i' = i + causal_shift, j - i' in [-left, right]
                keys = gl.expand_dims(keys, 1)
                if WINDOW:
                    visible = ((keys >= gl.expand_dims(queries + (causal_shift - window_left), 0))
                               & (keys <= gl.expand_dims(queries + (causal_shift + window_right), 0)))
                else:
                    visible = keys <= gl.expand_dims(queries + causal_shift, 0)
                p_t = gl.where(visible, p_t, 0.0)
        # both products issued once P^T and dS^T are 16-bit: no fp32 tile is live beside them (at hd
        # 128 and 64 queries a stage, issuing dv before dS^T spilled)
        p16 = gl.convert_layout(p_t.to(dtype), a_layout)
        if SOFTCAP:  # dS^T = P^T (dP^T - delta) (1 - tanh^2): the factor folds into P^T's copy
            p_t = p_t * (1.0 - t * t)
        dp_t = warpgroup_mma_wait(num_outstanding=0, deps=(dp_t, ))
        delta = delta_bufs.index(s).reshape([BLOCK_M]).load(queries_l)  # 0 where LSE is -inf (the preprocess)
        ds_t = (p_t * (dp_t - gl.expand_dims(delta, 0))).to(dtype)
        dv = warpgroup_mma(p16, do_t, dv, is_async=True)
        dk = warpgroup_mma(gl.convert_layout(ds_t, a_layout), q_t, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(empty.index(s))  # every product of this warpgroup that read the stage is done
    # the last products that read its K and V rows are done: they take dk and dv on their way out
    _rows_out((dk * sm_scale).to(dtype), k_t, k_rows, dk_desc, dk_ptr, stride_dkh, stride_dkm, batch, kv_head, k_start,
              first_key, n_keys, VARLEN)
    _rows_out(dv.to(dtype), v_t, v_rows, dv_desc, dv_ptr, stride_dvh, stride_dvm, batch, kv_head, k_start, first_key,
              n_keys, VARLEN)


@gluon.jit
def _sequence_block(cu_seqlens, cu_seqlens_other, n_seqs, BLOCK: gl.constexpr):
    """A packed batch's program: (sequence, its block of BLOCK tokens, the sequence's first token
    and length in cu_seqlens, then in cu_seqlens_other) for program_id(0) over packed_sequence's
    blocks of cu_seqlens; a block at or past the length is empty (the caller returns)."""
    seq = packed_sequence(gl.program_id(0), cu_seqlens, n_seqs, BLOCK)
    start = gl.load(cu_seqlens + seq)
    length = gl.load(cu_seqlens + seq + 1) - start
    other_start = gl.load(cu_seqlens_other + seq)
    other_length = gl.load(cu_seqlens_other + seq + 1) - other_start
    return seq, gl.program_id(0) - (start // BLOCK + seq), start, length, other_start, other_length


@gluon.jit
def _heavy_first(ROWS: gl.constexpr):
    """(block, row) of this program of a (blocks, rows) grid dealt in groups of ROWS rows, block-major
    within a group: every row's block 0 of the group, then every row's block 1, ... (the last group
    may hold fewer rows). A bijection of the grid onto itself (CAUSAL_ROW_GROUP)."""
    n_blocks = gl.num_programs(0)
    dealt = gl.program_id(1) * n_blocks + gl.program_id(0)  # the launch order's place
    first_row = dealt // (ROWS * n_blocks) * ROWS
    rows = gl.minimum(gl.num_programs(1) - first_row, ROWS)
    within = dealt - first_row * n_blocks
    return within // rows, first_row + within % rows


# not value-specialized (the forward's _INT_ARGS says why)
_INT_ARGS = ("stride_dkh", "stride_dkm", "stride_dvh", "stride_dvm", "n_seqs", "n_kv_heads", "kv_group", "n_queries",
             "n_keys", "window_left", "window_right")


@gluon.jit(do_not_specialize=_INT_ARGS)
def _gluon_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_desc, delta_desc, dk_ptr, stride_dkh,
                       stride_dkm, dv_ptr, stride_dvh, stride_dvm, cu_seqlens_q, cu_seqlens_k, n_seqs, n_kv_heads,
                       kv_group, n_queries, n_keys, qk_scale, sm_scale, window_left, window_right, softcap_log2,
                       CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, STAGES: gl.constexpr,
                       VARLEN: gl.constexpr, STATS_BLOCK: gl.constexpr, ROW_GROUP: gl.constexpr):
    """A grid of (key blocks, batch x kv heads), dealt by _heavy_first where ROW_GROUP > 0. q, dO
    (B, H, Tq, D) and k, v (B, Hkv, Tk, D) through 4-D descriptors of (1, 1, BLOCK_M, D) and (1, 1,
    BLOCK_N, D) tiles, dk and dv of (1, 1, WG_ROWS, D) ones; lse and delta fp32 (B, H, Tq) through
    2-D descriptors over their (B * H, Tq) rows (stats_buffer's layout) of (1, BLOCK_M) blocks.
    CAUSAL, WINDOW (window_left, window_right) and SOFTCAP (softcap_log2, qk_scale as
    softcap_scales makes them): the tl kernels' masks. VARLEN: a packed batch of n_seqs sequences,
    (1, H, total, D) views, the grid's first axis packed_sequence's blocks of cu_seqlens_k (a block
    past a sequence's keys returns at once); dk_ptr, dv_ptr with their (head, token) strides take
    the rows where a sequence's keys end (n_queries, n_keys are then read from cu_seqlens); lse and
    delta laid out by packed_stats in blocks of STATS_BLOCK."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    if VARLEN:
        batch, start_n, k_start, n_keys, q_start, n_queries = _sequence_block(cu_seqlens_k, cu_seqlens_q, n_seqs,
                                                                              BLOCK_N)
        if start_n * BLOCK_N >= n_keys:
            return
        stats_start = (q_start // STATS_BLOCK + batch) * STATS_BLOCK  # packed_stats' place of the sequence
        batch = batch * 0  # the views' one batch
        kv_head = gl.program_id(1)
    else:
        start_n = gl.program_id(0)
        row = gl.program_id(1)
        if ROW_GROUP > 0:
            start_n, row = _heavy_first(ROW_GROUP)  # key block 0 the heaviest
        batch = row // n_kv_heads
        kv_head = row % n_kv_heads
        q_start = 0
        k_start = 0
        stats_start = 0
    causal_shift = n_keys - n_queries  # query i sees keys j <= i + causal_shift
    lo, lead_hi, _, unmasked_hi, hi = query_blocks(start_n, n_queries, causal_shift, window_left, window_right, CAUSAL,
                                                   WINDOW, BLOCK_M, BLOCK_N)
    n_blocks = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_M)

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES] + lse_desc.block_type.shape, lse_desc.layout)
    delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape, delta_desc.layout)
    k_tile = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_tile = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)
        mbarrier.init(empty.index(st), count=2)  # each consumer warpgroup releases a stage

    # two consumer warpgroups, a partition each (they drift apart: one's softmax runs under the
    # other's products); worker partitions take scalars, descriptors and shared-memory handles
    gl.warp_specialize([
        (_dkdv_consumer, (q_bufs, do_bufs, lse_bufs, delta_bufs, k_tile, v_tile, kv_bar, ready, empty, dk_desc,
                          dv_desc, dk_ptr, stride_dkh, stride_dkm, dv_ptr, stride_dvh, stride_dvm, batch, kv_head,
                          kv_group, n_keys, k_start, start_n, lo, lead_hi, unmasked_hi, n_blocks, causal_shift,
                          qk_scale, sm_scale, window_left, window_right, softcap_log2, CAUSAL, WINDOW, SOFTCAP, VARLEN,
                          0)),
        (_dkdv_consumer, (q_bufs, do_bufs, lse_bufs, delta_bufs, k_tile, v_tile, kv_bar, ready, empty, dk_desc,
                          dv_desc, dk_ptr, stride_dkh, stride_dkm, dv_ptr, stride_dvh, stride_dvm, batch, kv_head,
                          kv_group, n_keys, k_start, start_n, lo, lead_hi, unmasked_hi, n_blocks, causal_shift,
                          qk_scale, sm_scale, window_left, window_right, softcap_log2, CAUSAL, WINDOW, SOFTCAP, VARLEN,
                          1)),
        (_dkdv_producer, (q_desc, do_desc, k_desc, v_desc, lse_desc, delta_desc, q_bufs, do_bufs, lse_bufs,
                          delta_bufs, k_tile, v_tile, kv_bar, ready, empty, batch, kv_head, kv_group,
                          n_kv_heads * kv_group, q_start, k_start, stats_start, start_n, lo, n_blocks)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def gluon_backward_supported(q, k, v, do, dq, dk, dv):
    """Whether launch_gluon_dkdv and launch_gluon_dq take this backward: dense or packed, any mask
    (causal, a window, a softcap), a head dim of GLUON_DKDV_CONFIG (GLUON_DQ_CONFIG's), fp16 or
    bf16, at most MAX_GRID_Y (batch, head) pairs (their grids' y extent), every tensor laid out as
    TMA reads it in place."""
    return (q.shape[3] in GLUON_DKDV_CONFIG and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[0] * q.shape[1] <= MAX_GRID_Y and gluon_layout_ok(q, k, v, do, dq, dk, dv))


def _check_stats(lse, delta):
    """The kernels read lse and delta with one pair of (batch, head) strides and a unit token stride."""
    if lse.stride() != delta.stride() or lse.stride(-1) != 1:
        raise ValueError(f"lse and delta: the same strides with a unit last one, got {lse.stride()} and "
                         f"{delta.stride()}")


def stats_buffer(b, h, tq, device):
    """An fp32 (B, H, Tq) buffer for the dk/dv kernel's LSE or delta: rows of Tq rounded up to 4
    values, so that each (batch, head) row starts 16-byte aligned, as a TMA copy's start must (a
    copy from an unaligned value raised an illegal instruction on the H200)."""
    return torch.empty(b, h, cdiv(tq, 4) * 4, device=device, dtype=torch.float32)[..., :tq]


def as_stats_buffer(lse):
    """lse (B, H, Tq fp32) if laid out as stats_buffer lays out its values, else a copy that is."""
    if _stats_layout_ok(lse):
        return lse
    out = stats_buffer(*lse.shape, lse.device)
    out.copy_(lse)
    return out


# A packed batch's LSE and delta for the dk/dv kernel (packed_stats): a TMA copy's first value must
# sit on a 16-byte boundary (one that did not raised an illegal instruction on the H200) and a
# sequence may start at any token, so each sequence's values move to a place of their own, in
# packed_sequence's blocks of PACKED_STATS_BLOCK values; BLOCK_M must divide it (gluon_dkdv_args
# checks), so a query block never reads past its sequence's places.
PACKED_STATS_BLOCK = 128


def packed_stats(lse, delta, cu_seqlens_q):
    """A packed batch's lse and delta ((1, H, total) fp32 each, one pair of strides, unit token
    stride) laid out for the dk/dv kernel's TMA copies: sequence i's values from place
    (cu_seqlens_q[i] // 128 + i) * 128 (128 = PACKED_STATS_BLOCK), LSE +inf and delta 0 after them
    to the next sequence's place (so P^T is 0 on the rows a query block reads past its sequence's
    end). A gather a place: each place's sequence by searchsorted over the places, its token, and
    index_select; a few small device ops and no sync (CUDA-graph safe)."""
    total = lse.shape[2]
    n_seqs = cu_seqlens_q.shape[0] - 1
    span = (total // PACKED_STATS_BLOCK + n_seqs) * PACKED_STATS_BLOCK
    seqs = torch.arange(n_seqs, device=lse.device)
    first = cu_seqlens_q[:-1].long()
    starts = (first // PACKED_STATS_BLOCK + seqs) * PACKED_STATS_BLOCK  # each sequence's first place
    places = torch.arange(span, device=lse.device)
    seq = torch.searchsorted(starts, places, right=True) - 1  # starts[0] = 0: every place has one
    token = first[seq] + places - starts[seq]
    inside = token < cu_seqlens_q[1:].long()[seq]
    token = token.clamp_(max=total - 1)
    out_lse = torch.where(inside, lse.index_select(2, token), float("inf"))
    out_delta = torch.where(inside, delta.index_select(2, token), 0.0)
    return out_lse, out_delta


def _stats_layout_ok(t):
    b, h, tq = t.shape
    s = t.stride(1)
    return t.stride(2) == 1 and s % 4 == 0 and s >= tq and t.stride(0) == h * s and t.data_ptr() % 16 == 0


def _stats_descriptor(t, block):
    """A 2-D TMA descriptor over t's (B * H, Tq) rows (stats_buffer's layout) for (1, block) blocks."""
    if not _stats_layout_ok(t):
        raise ValueError(f"lse and delta: laid out as stats_buffer lays them out for the dk/dv kernel, got "
                         f"strides {t.stride()} at {t.data_ptr():#x}")
    b, h, tq = t.shape
    return _Descriptor(t, [b * h, tq], [t.stride(1), 1], [1, block], gl.NVMMASharedLayout(0, 32, rank=2))


def _mask_meta(causal, mask, n_queries, n_keys, scale):
    """((qk_scale, sm_scale, window_left, window_right, softcap_log2), {CAUSAL, WINDOW, SOFTCAP}):
    both kernels' mask arguments and flags for the call's causal and mask (kernel_mask's,
    softcap_scales')."""
    causal, window, left, right = kernel_mask(causal, mask, n_queries, n_keys)
    qk_scale, softcap_log2, softcap = softcap_scales(scale, mask.softcap)
    return (qk_scale, scale, left, right, softcap_log2), dict(CAUSAL=causal, WINDOW=window, SOFTCAP=softcap)


def _packed(cu_seqlens, block, total, b, heads):
    """(grid, (cu_seqlens_q, cu_seqlens_k, sequences)) of a kernel whose programs take blocks of
    `block` tokens of `total` (the grid's x: packed_sequence's blocks; y: heads) for a packed
    batch, or of a dense one (x: cdiv(total, block); y: b x heads; no sequences)."""
    if cu_seqlens is None:
        return (cdiv(total, block), b * heads), (None, None, 0)
    cu_q, cu_k = cu_seqlens[:2]
    n_seqs = cu_q.shape[0] - 1
    return (total // block + n_seqs, heads), (cu_q, cu_k, n_seqs)


def _row_group(mask_flags, cu_seqlens_q):
    """The kernels' ROW_GROUP: CAUSAL_ROW_GROUP for a dense causal grid without a window (a window's
    blocks are about equal, and the deal spilled 60 bytes there), else 0 (the launch order)."""
    causal = mask_flags["CAUSAL"] and not mask_flags["WINDOW"]
    return CAUSAL_ROW_GROUP if causal and cu_seqlens_q is None else 0


def gluon_dkdv_args(q, k, v, do, lse, delta, dk, dv, causal, scale, config=None, mask=NO_MASK, cu_seqlens=None):
    """(grid, args, meta) of the Gluon dk/dv kernel on validated arguments (gluon_backward_supported):
    q, do (B, H, Tq, D); k, v, dk, dv (B, Hkv, Tk, D); lse and delta fp32 (B, H, Tq) laid out as
    stats_buffer lays them out; causal and mask the call's (kernel_mask makes the kernels' flags);
    scale sm_scale. config: (BLOCK_M, BLOCK_N, STAGES) instead of GLUON_DKDV_CONFIG's
    (GLUON_DKDV_SOFTCAP_CONFIG's under a softcap).
    cu_seqlens: None, or a packed batch's (cu_seqlens_q, cu_seqlens_k, ...) over (1, H, total, D)
    views, as launch_flash_attention_backward takes it. Also what scripts/gluon_compile.py
    compiles without a GPU."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    _check_stats(lse, delta)
    mask_args, mask_flags = _mask_meta(causal, mask, tq, tk, scale)
    table = GLUON_DKDV_SOFTCAP_CONFIG if mask.softcap else GLUON_DKDV_CONFIG
    block_m, block_n, stages = config or table[d]
    if block_n != 2 * WG_ROWS:
        raise ValueError(f"config: the dk/dv kernel's BLOCK_N is {2 * WG_ROWS} (two warpgroups of {WG_ROWS} keys), "
                         f"got {config}")
    if cu_seqlens is not None and PACKED_STATS_BLOCK % block_m:
        raise ValueError(f"config: a packed batch's BLOCK_M divides {PACKED_STATS_BLOCK} (packed_stats' blocks), got "
                         f"{config}")
    grid, (cu_q, cu_k, n_seqs) = _packed(cu_seqlens, block_n, tk, b, hkv)
    if cu_q is not None:
        lse, delta = packed_stats(lse, delta, cu_q)
    args = (_descriptor(q, block_m), _descriptor(do, block_m), _descriptor(k, block_n), _descriptor(v, block_n),
            _descriptor(dk, WG_ROWS), _descriptor(dv, WG_ROWS), _stats_descriptor(lse, block_m),
            _stats_descriptor(delta, block_m), dk, dk.stride(1), dk.stride(2), dv, dv.stride(1), dv.stride(2), cu_q,
            cu_k, n_seqs, hkv, h // hkv, tq, tk, *mask_args)
    meta = dict(mask_flags, STAGES=stages, VARLEN=cu_q is not None, STATS_BLOCK=PACKED_STATS_BLOCK,
                ROW_GROUP=_row_group(mask_flags, cu_q), num_warps=4, maxnreg=MAXNREG)
    return grid, args, meta


def launch_gluon_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, config=None, mask=NO_MASK, cu_seqlens=None):
    """Write dk and dv (arguments as gluon_dkdv_args takes them, non-empty) on q's device as the
    current one."""
    if q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):
            return launch_gluon_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, config, mask, cu_seqlens)
    if cu_seqlens is not None and cu_seqlens[0].shape[0] == 1:
        return  # no sequence: nothing to write (packed_sequence needs one)
    grid, args, meta = gluon_dkdv_args(q, k, v, do, lse, delta, dk, dv, causal, scale, config, mask, cu_seqlens)
    _gluon_dkdv_kernel[grid](*args, **meta)


# head dim -> (BLOCK_M, BLOCK_N, STAGES) of the dq kernel: BLOCK_M = 128 queries a program over
# two consumer warpgroups, a ring of STAGES K and V blocks of BLOCK_N keys. Shared memory: q and dO
# (128 x D each) + STAGES x (K and V, BLOCK_N x D each): 192 KB at hd 128, 128 keys, two stages.
# Registers a consumer thread at hd 128: dq 64, S and dP 64 each. 128-key blocks measured 1-3% over
# 64-key ones with the two warpgroups in lockstep (docs/tuning/attention.md, the Gluon backward).
GLUON_DQ_CONFIG = {
    64: (128, 128, 2),
    128: (128, 128, 2),
}
# the other configs scripts/tune/gluon_backward_ab.py weighs (and scripts/gluon_compile.py compiles)
DQ_AB_CONFIGS = {
    64: ((128, 64, 3),),
    128: ((128, 64, 2),),
}


@gluon.jit
def _dq_producer(q_desc, do_desc, k_desc, v_desc, q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty, batch, head,
                 kv_head, q_start, k_start, start_m, lo, n_iter):
    """One warp: the program's q and dO tiles once, then its key blocks lo, lo + BLOCK_N, ...: each
    block's K and V into the ring, a stage once the consumers released it. Tokens count from
    q_start and k_start (a packed sequence's first; 0 dense)."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_tile.type.shape[2]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [batch, head, q_start + start_m * BLOCK_M, 0], q_bar, q_tile)
    tma.async_copy_global_to_shared(do_desc, [batch, head, q_start + start_m * BLOCK_M, 0], q_bar, do_tile)
    for it in range(n_iter):
        s = it % STAGES
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        row = k_start + lo + it * BLOCK_N
        tma.async_copy_global_to_shared(k_desc, [batch, kv_head, row, 0], ready.index(s), k_bufs.index(s))
        tma.async_copy_global_to_shared(v_desc, [batch, kv_head, row, 0], ready.index(s), v_bufs.index(s))


@gluon.jit
def _dq_consumer(q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty, dq_desc, dq_ptr, stride_dqh, stride_dqm,
                 lse_ptr, delta_ptr, stride_lb, stride_lh, batch, head, q_start, start_m, lo, unmasked_lo,
                 unmasked_hi, n_iter, n_queries, n_keys, causal_shift, qk_scale, sm_scale, window_left, window_right,
                 softcap_log2, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr,
                 VARLEN: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG: dq of the program's queries WG * 64 .. WG * 64 + 63 over the
    producer's key blocks, the tl dq kernel's arithmetic (_dq_key_blocks):
        S = q k^T and dP = dO v^T    issued together, asynchronously
        P = exp2(S * scale - LSE)    once S is done, while dP runs; the blocks outside
                                     [unmasked_lo, unmasked_hi) (the causal diagonal, a window's
                                     edges, the end of the keys) masked; SOFTCAP: S capped first
        dq += (P * (dP - delta)) k   from registers (SOFTCAP: times 1 - tanh^2)
    then dq (times sm_scale) out by TMA through its rows of q's tile (_rows_out: VARLEN, a packed
    sequence's queries from q_start, whose rows past its end are left unwritten; the keys past its
    end, the next sequence's, are masked as the end of the keys is)."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    HEAD_D: gl.constexpr = q_tile.type.shape[3]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    WG_M: gl.constexpr = dq_desc.block_type.shape[2]  # a warpgroup's queries, wgmma's M
    s_layout: gl.constexpr = wgmma_layout(WG_M, BLOCK_N, 4)  # S, dP: queries x keys
    acc_layout: gl.constexpr = wgmma_layout(WG_M, HEAD_D, 4)  # dq
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    keys_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_tile.dtype

    q_rows = q_tile.slice(WG * WG_M, WG_M, dim=2)  # a (1, 1, WG_M, D) view for the TMA store
    q_t = q_tile.reshape([2 * WG_M, HEAD_D]).slice(WG * WG_M, WG_M)  # (WG_M, D) views for the products
    do_t = do_tile.reshape([2 * WG_M, HEAD_D]).slice(WG * WG_M, WG_M)
    dq = gl.zeros([WG_M, HEAD_D], gl.float32, acc_layout)
    first_row = start_m * 2 * WG_M + WG * WG_M
    rows = first_row + gl.arange(0, WG_M, layout=rows_l)
    lse2, delta = _query_stats(lse_ptr, delta_ptr, batch * stride_lb + head * stride_lh + q_start, rows, n_queries)
    lse2 = gl.expand_dims(lse2, 1)
    delta = gl.expand_dims(delta, 1)
    cols = gl.arange(0, BLOCK_N, layout=keys_l)
    mbarrier.wait(q_bar, 0)
    for it in range(n_iter):
        s = it % STAGES
        start_n = lo + it * BLOCK_N
        k_t = k_bufs.index(s).reshape([BLOCK_N, HEAD_D])
        v_t = v_bufs.index(s).reshape([BLOCK_N, HEAD_D])
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        s_zero = gl.zeros([WG_M, BLOCK_N], gl.float32, s_layout)  # never read (use_acc=False)
        s_b = warpgroup_mma(q_t, k_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_t, v_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_b = warpgroup_mma_wait(num_outstanding=1, deps=(s_b, ))  # S done; dP may still run
        if SOFTCAP:  # P, then P (1 - tanh^2) in t's place: dS's one factor
            t = tanh_approx(s_b * qk_scale)
            p = gl.exp2(softcap_log2 * t - lse2) * (1.0 - t * t)
        else:
            p = gl.exp2(s_b * qk_scale - lse2)
        masked = start_n >= unmasked_hi  # a block the diagonal, a window or the end of the keys cuts
        if WINDOW:
            masked = masked | (start_n < unmasked_lo)
        if masked:
            keys = gl.expand_dims(start_n + cols, 0)
            rel = keys - gl.expand_dims(rows + causal_shift, 1)
            visible = keys < n_keys
            if CAUSAL:
                visible = visible & (rel <= 0)
            if WINDOW:
                visible = visible & (rel >= -window_left) & (rel <= window_right)
            p = gl.where(visible, p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        ds = p * (dp - delta)
        dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), a_layout), k_t, dq, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        mbarrier.arrive(empty.index(s))  # every product of this warpgroup that read the stage is done
    # every product that read its rows of q's tile is done: they take dq on its way out
    _rows_out((dq * sm_scale).to(dtype), q_t, q_rows, dq_desc, dq_ptr, stride_dqh, stride_dqm, batch, head, q_start,
              first_row, n_queries, VARLEN)


_DQ_INT_ARGS = ("stride_dqh", "stride_dqm", "stride_lb", "stride_lh", "n_seqs", "n_heads", "kv_group", "n_queries",
                "n_keys", "window_left", "window_right")


@gluon.jit(do_not_specialize=_DQ_INT_ARGS)
def _gluon_dq_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, dq_ptr, stride_dqh, stride_dqm, lse_ptr, delta_ptr,
                     stride_lb, stride_lh, cu_seqlens_q, cu_seqlens_k, n_seqs, n_heads, kv_group, n_queries, n_keys,
                     qk_scale, sm_scale, window_left, window_right, softcap_log2, CAUSAL: gl.constexpr,
                     WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, STAGES: gl.constexpr, VARLEN: gl.constexpr,
                     ROW_GROUP: gl.constexpr):
    """A grid of (query blocks, batch x heads), causal in the forward's order (the longest rows
    first), dealt by _heavy_first where ROW_GROUP > 0 (a packed batch's blocks in their sequences'
    order). q, dO, dq (B, H, Tq, D) and k, v (B, Hkv, Tk, D) through 4-D descriptors of (1, 1,
    BLOCK_M, D) and (1, 1, BLOCK_N, D) tiles; lse and delta as for _gluon_dkdv_kernel. VARLEN: a
    packed batch as for _gluon_dkdv_kernel, the grid (packed_sequence's blocks of cu_seqlens_q,
    heads), dq_ptr with its (head, token) strides taking the rows where a sequence ends."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    if VARLEN:
        batch, start_m, q_start, n_queries, k_start, n_keys = _sequence_block(cu_seqlens_q, cu_seqlens_k, n_seqs,
                                                                              BLOCK_M)
        if start_m * BLOCK_M >= n_queries:
            return
        batch = batch * 0  # the views' one batch
        head = gl.program_id(1)
    else:
        start_m = gl.program_id(0)
        if ROW_GROUP > 0:
            start_m, row = _heavy_first(ROW_GROUP)
        if CAUSAL:
            start_m = gl.num_programs(0) - 1 - start_m  # the last query block the heaviest
        if ROW_GROUP == 0:
            row = gl.program_id(1)
        batch = row // n_heads
        head = row % n_heads
        q_start = 0
        k_start = 0
    kv_head = head // kv_group
    causal_shift = n_keys - n_queries  # query i sees keys j <= i + causal_shift
    lo, unmasked_lo, unmasked_hi, hi = key_blocks(start_m, n_keys, causal_shift, window_left, window_right, CAUSAL,
                                                  WINDOW, True, BLOCK_M, BLOCK_N)
    n_iter = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N)

    q_tile = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    do_tile = gl.allocate_shared_memory(do_desc.dtype, do_desc.block_type.shape, do_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)
        mbarrier.init(empty.index(st), count=2)  # each consumer warpgroup releases a stage

    gl.warp_specialize([
        (_dq_consumer, (q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty, dq_desc, dq_ptr, stride_dqh,
                        stride_dqm, lse_ptr, delta_ptr, stride_lb, stride_lh, batch, head, q_start, start_m, lo,
                        unmasked_lo, unmasked_hi, n_iter, n_queries, n_keys, causal_shift, qk_scale, sm_scale,
                        window_left, window_right, softcap_log2, CAUSAL, WINDOW, SOFTCAP, VARLEN, 0)),
        (_dq_consumer, (q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty, dq_desc, dq_ptr, stride_dqh,
                        stride_dqm, lse_ptr, delta_ptr, stride_lb, stride_lh, batch, head, q_start, start_m, lo,
                        unmasked_lo, unmasked_hi, n_iter, n_queries, n_keys, causal_shift, qk_scale, sm_scale,
                        window_left, window_right, softcap_log2, CAUSAL, WINDOW, SOFTCAP, VARLEN, 1)),
        (_dq_producer, (q_desc, do_desc, k_desc, v_desc, q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty,
                        batch, head, kv_head, q_start, k_start, start_m, lo, n_iter)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def gluon_dq_args(q, k, v, do, lse, delta, dq, causal, scale, config=None, mask=NO_MASK, cu_seqlens=None):
    """(grid, args, meta) of the Gluon dq kernel on validated arguments (gluon_backward_supported):
    q, do, dq (B, H, Tq, D); k, v (B, Hkv, Tk, D); lse, delta, causal, scale, mask and cu_seqlens
    as gluon_dkdv_args takes them. config: (BLOCK_M, BLOCK_N, STAGES) instead of
    GLUON_DQ_CONFIG's."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    block_m, block_n, stages = config or GLUON_DQ_CONFIG[d]
    if block_m != 2 * WG_ROWS:
        raise ValueError(f"config: the dq kernel's BLOCK_M is {2 * WG_ROWS} (two warpgroups of {WG_ROWS} queries), "
                         f"got {config}")
    _check_stats(lse, delta)
    mask_args, mask_flags = _mask_meta(causal, mask, tq, tk, scale)
    grid, (cu_q, cu_k, n_seqs) = _packed(cu_seqlens, block_m, tq, b, h)
    args = (_descriptor(q, block_m), _descriptor(do, block_m), _descriptor(k, block_n), _descriptor(v, block_n),
            _descriptor(dq, WG_ROWS), dq, dq.stride(1), dq.stride(2), lse, delta, lse.stride(0), lse.stride(1), cu_q,
            cu_k, n_seqs, h, h // hkv, tq, tk, *mask_args)
    meta = dict(mask_flags, STAGES=stages, VARLEN=cu_q is not None, ROW_GROUP=_row_group(mask_flags, cu_q), num_warps=4,
                maxnreg=MAXNREG)
    return grid, args, meta


def launch_gluon_dq(q, k, v, do, lse, delta, dq, causal, scale, config=None, mask=NO_MASK, cu_seqlens=None):
    """Write dq (arguments as gluon_dq_args takes them, non-empty) on q's device as the current one."""
    if q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):
            return launch_gluon_dq(q, k, v, do, lse, delta, dq, causal, scale, config, mask, cu_seqlens)
    if cu_seqlens is not None and cu_seqlens[0].shape[0] == 1:
        return  # no sequence: nothing to write (packed_sequence needs one)
    grid, args, meta = gluon_dq_args(q, k, v, do, lse, delta, dq, causal, scale, config, mask, cu_seqlens)
    _gluon_dq_kernel[grid](*args, **meta)


__all__ = ["CAUSAL_ROW_GROUP", "DKDV_AB_CONFIGS", "DQ_AB_CONFIGS", "GLUON_DKDV_CONFIG", "GLUON_DQ_CONFIG",
           "as_stats_buffer", "gluon_backward_supported", "stats_buffer",
           "gluon_dkdv_args", "gluon_dq_args", "launch_gluon_dkdv", "launch_gluon_dq"]
