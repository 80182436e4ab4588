"""FlashAttention backward for Hopper (sm_90) in Gluon, the two-pass schedule's two kernels: dk, dv
and dq. TMA loads, warp specialization, async wgmma.

The same computation as the tl kernels of the two-pass schedule (attention/
triton_flash_attention_bwd.py: read its docstring first, for the formulas, LSE's and delta's
conventions and the masks), laid out as FlashAttention-3's backward lays out its dk/dv loop:

dk, dv (_gluon_dkdv_kernel):
- One program a block of BLOCK_N keys of one (batch, kv head). A producer warp (24 registers)
  loads the block's K and V once, then the query blocks that see them, over every query head of
  the GQA group in turn: each block's q and dO tiles into a ring of STAGES shared-memory stages
  (one barrier a stage the copies complete, one the consumers release it on).
- The consumer warpgroups (BLOCK_N / 64, 64 keys each; 240 registers a thread) keep the fp32 dk
  and dv accumulators and run, a query block at a time, transposed so the keys are wgmma's M:
      S^T = k q^T and dP^T = v dO^T    issued together, asynchronously
      P^T = exp2(S^T * scale - LSE)    once S^T is done, while dP^T runs
      dv += P^T dO                     issued, then dS^T = P^T * (dP^T - delta) once dP^T is done
      dk += dS^T q
  P^T and dS^T go to the tensor cores from registers; LSE and delta (a value a query) are read
  from global memory while the products run. The causal mask applies on the blocks the diagonal
  cuts only (query_blocks' lead).
- dk (times sm_scale) and dv leave through the K and V tiles' shared memory by TMA stores; the
  copies clip the rows past the keys' end.

dq (_gluon_dq_kernel): the forward's shape. One program a block of BLOCK_M queries of one (batch,
head); the producer loads its q and dO tiles once, then the key blocks it sees into a ring of K
and V stages; the consumers run S = q k^T and dP = dO v^T together, then dq += dS k, and dq
(times sm_scale) leaves through q's tile. Only the blocks past the unmasked ones (the causal
diagonal, the end of the keys: key_blocks' tail) are masked.

Rows past the end of the queries read LSE -inf, taken as +inf so their P is 0 (q's and dO's tiles
are zero there: the 4-D descriptors clip at a head's last token); keys past the end have zero k
and v rows, whose dk and dv are computed and never stored, and which the dq kernel masks. The dk/dv
kernel caps P's exponent at 0, as the tl kernel does (a key row past the end, S = 0, stays finite
on a query whose scores are all very negative).

delta comes from the tl preprocess: launch_flash_attention_backward(..., gluon=("dkdv", "dq")) runs
it before them (either alone, with the tl kernel for the other). Dense calls, head dims 64 and 128,
no window or softcap, layouts TMA reads in place (gluon_backward_supported); the dispatch does not
take them yet (they have not been measured against the tl kernels).

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

from llmk.attention.gluon_flash_attention_fwd import MAXNREG, PRODUCER_REGS, _descriptor, gluon_layout_ok, wgmma_layout
from llmk.attention.triton_flash_attention_bwd import query_blocks
from llmk.attention.triton_flash_attention_fwd import key_blocks
from llmk.common.ints import cdiv
from llmk.common.triton_utils import LOG2E

# head dim -> (BLOCK_M, BLOCK_N, STAGES): BLOCK_N keys a program over BLOCK_N / 64 consumer
# warpgroups, BLOCK_M queries a ring stage. Shared memory: K and V (BLOCK_N x D each) + STAGES x
# (q and dO, BLOCK_M x D each), 2 bytes a value: 128 KB at hd 128. Registers a consumer thread
# at hd 128: dk and dv 64 each, S^T and dP^T 16 each at BLOCK_M 32.
# Not yet measured (scripts/gluon_compile.py compiles them without spills).
GLUON_DKDV_CONFIG = {
    64: (64, 128, 2),
    128: (32, 128, 3),
}
# the other configs scripts/tune/gluon_backward_ab.py weighs (and scripts/gluon_compile.py compiles)
DKDV_AB_CONFIGS = {
    64: ((32, 128, 3), (64, 128, 3), (64, 64, 3)),
    128: ((32, 128, 2), (16, 128, 4)),  # (64, 128, 2) and (64, 64, 2) spill
}


@gluon.jit
def _query_stats(lse_ptr, delta_ptr, offset, queries, n_queries):
    """(LSE in scaled log2 units, delta) of `queries` from (batch, head) offset `offset`: LSE +inf
    where a query sees no key or is past the end, so its P is 0, and delta 0 there (the tl
    kernels' _row_stats)."""
    in_range = queries < n_queries
    lse = gl.load(lse_ptr + offset + queries, mask=in_range, other=float("-inf"))
    unseen = lse == float("-inf")
    delta = gl.load(delta_ptr + offset + queries, mask=in_range, other=0.0)
    return gl.where(unseen, float("inf"), lse * LOG2E), gl.where(unseen, 0.0, delta)


@gluon.jit
def _dkdv_producer(q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_tile, v_tile, kv_bar, ready, empty, batch,
                   kv_head, kv_group, start_n, lo, n_blocks):
    """One warp: the program's K and V blocks once, then for each query head of the group and each
    of its n_blocks query blocks from lo, q's and dO's tiles into the ring, a stage once the
    consumers released it (the first lap's waits pass)."""
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    BLOCK_N: gl.constexpr = k_tile.type.shape[2]
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [batch, kv_head, start_n * BLOCK_N, 0], kv_bar, k_tile)
    tma.async_copy_global_to_shared(v_desc, [batch, kv_head, start_n * BLOCK_N, 0], kv_bar, v_tile)
    for it in range(kv_group * n_blocks):
        s = it % STAGES
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        head = kv_head * kv_group + it // n_blocks
        row = lo + (it % n_blocks) * BLOCK_M
        mbarrier.expect(ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [batch, head, row, 0], ready.index(s), q_bufs.index(s))
        tma.async_copy_global_to_shared(do_desc, [batch, head, row, 0], ready.index(s), do_bufs.index(s))


@gluon.jit
def _dkdv_consumer(q_bufs, do_bufs, k_tile, v_tile, kv_bar, ready, empty, dk_desc, dv_desc, lse_ptr, delta_ptr,
                   stride_lb, stride_lh, batch, kv_head, kv_group, start_n, lo, lead_hi, n_blocks, n_queries,
                   causal_shift, qk_scale, sm_scale, CAUSAL: gl.constexpr):
    """The consumer warpgroups: dk, dv of the program's keys over the producer's query blocks
    (module docstring), then out by TMA through K's and V's tiles."""
    STAGES: gl.constexpr = q_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.type.shape[3]
    HEAD_D: gl.constexpr = q_bufs.type.shape[4]
    BLOCK_N: gl.constexpr = k_tile.type.shape[2]
    NUM_WARPS: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N, BLOCK_M, NUM_WARPS)  # S^T, dP^T: keys x queries
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_N, HEAD_D, NUM_WARPS)  # dk, dv
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    keys_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    queries_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_bufs.dtype

    k_t = k_tile.reshape([BLOCK_N, HEAD_D])
    v_t = v_tile.reshape([BLOCK_N, HEAD_D])
    s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([BLOCK_N, HEAD_D], gl.float32, acc_layout)
    dv = gl.zeros([BLOCK_N, HEAD_D], gl.float32, acc_layout)
    keys = start_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=keys_l)
    cols = gl.arange(0, BLOCK_M, layout=queries_l)
    mbarrier.wait(kv_bar, 0)
    for it in range(kv_group * n_blocks):
        s = it % STAGES
        head = kv_head * kv_group + it // n_blocks
        start_m = lo + (it % n_blocks) * BLOCK_M
        q_t = q_bufs.index(s).reshape([BLOCK_M, HEAD_D])
        do_t = do_bufs.index(s).reshape([BLOCK_M, HEAD_D])
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        s_t = warpgroup_mma(k_t, q_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_t = warpgroup_mma(v_t, do_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        queries = start_m + cols  # their stats are read while the products run
        lse2, delta = _query_stats(lse_ptr, delta_ptr, batch * stride_lb + head * stride_lh, queries, n_queries)
        s_t = warpgroup_mma_wait(num_outstanding=1, deps=(s_t, ))  # S^T done; dP^T may still run
        p_t = gl.exp2(gl.minimum(s_t * qk_scale - gl.expand_dims(lse2, 0), 0.0))
        if CAUSAL:
            if start_m < lead_hi:  # a block the diagonal cuts
                visible = gl.expand_dims(keys, 1) <= gl.expand_dims(queries + causal_shift, 0)
                p_t = gl.where(visible, p_t, 0.0)
        dv = warpgroup_mma(gl.convert_layout(p_t.to(dtype), a_layout), do_t, dv, is_async=True)
        dp_t = warpgroup_mma_wait(num_outstanding=1, deps=(dp_t, ))  # dP^T done; the dv product may run
        ds_t = p_t * (dp_t - gl.expand_dims(delta, 0))
        dk = warpgroup_mma(gl.convert_layout(ds_t.to(dtype), a_layout), q_t, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(empty.index(s))  # every product that read the stage is done
    # the last products that read K and V are done: their tiles take dk and dv on their way out
    k_t.store((dk * sm_scale).to(dtype))
    v_t.store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [batch, kv_head, start_n * BLOCK_N, 0], k_tile)
    tma.async_copy_shared_to_global(dv_desc, [batch, kv_head, start_n * BLOCK_N, 0], v_tile)
    tma.store_wait(pendings=0)


# not value-specialized (the forward's _INT_ARGS says why)
_INT_ARGS = ("stride_lb", "stride_lh", "n_kv_heads", "kv_group", "n_queries", "n_keys")


@gluon.jit(do_not_specialize=_INT_ARGS)
def _gluon_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, lse_ptr, delta_ptr, stride_lb, stride_lh,
                       n_kv_heads, kv_group, n_queries, n_keys, qk_scale, sm_scale, CAUSAL: gl.constexpr,
                       STAGES: gl.constexpr):
    """A grid of (key blocks, batch x kv heads). q, dO (B, H, Tq, D) and k, v, dk, dv (B, Hkv, Tk,
    D) through 4-D descriptors of (1, 1, BLOCK_M, D) and (1, 1, BLOCK_N, D) tiles; lse and delta
    fp32 (B, H, Tq) with (batch, head) strides stride_lb, stride_lh and a unit token stride."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    start_n = gl.program_id(0)
    batch = gl.program_id(1) // n_kv_heads
    kv_head = gl.program_id(1) % n_kv_heads
    causal_shift = n_keys - n_queries  # query i sees keys j <= i + causal_shift
    lo, lead_hi, _, _, hi = query_blocks(start_n, n_queries, causal_shift, 0, 0, CAUSAL, False, BLOCK_M, BLOCK_N)
    n_blocks = gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_M)

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    k_tile = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_tile = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)
        mbarrier.init(empty.index(st), count=1)  # the consumer partition arrives once, all its warps

    gl.warp_specialize([
        (_dkdv_consumer, (q_bufs, do_bufs, k_tile, v_tile, kv_bar, ready, empty, dk_desc, dv_desc, lse_ptr,
                          delta_ptr, stride_lb, stride_lh, batch, kv_head, kv_group, start_n, lo, lead_hi, n_blocks,
                          n_queries, causal_shift, qk_scale, sm_scale, CAUSAL)),
        (_dkdv_producer, (q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_tile, v_tile, kv_bar, ready, empty,
                          batch, kv_head, kv_group, start_n, lo, n_blocks)),
    ], [1], [PRODUCER_REGS])


def gluon_backward_supported(q, k, v, do, dq, dk, dv, cu_seqlens, has_window, has_softcap):
    """Whether launch_gluon_dkdv and launch_gluon_dq take this backward: dense, no window or
    softcap, a head dim of GLUON_DKDV_CONFIG (GLUON_DQ_CONFIG's), fp16 or bf16, every tensor laid
    out as TMA reads it in place."""
    return (cu_seqlens is None and not has_window and not has_softcap and q.shape[3] in GLUON_DKDV_CONFIG
            and q.dtype in (torch.float16, torch.bfloat16) and gluon_layout_ok(q, k, v, do, dq, dk, dv))


def _check_stats(lse, delta):
    """The kernels read lse and delta with one pair of (batch, head) strides and a unit token stride."""
    if lse.stride() != delta.stride() or lse.stride(-1) != 1:
        raise ValueError(f"lse and delta: the same strides with a unit last one, got {lse.stride()} and "
                         f"{delta.stride()}")


def gluon_dkdv_args(q, k, v, do, lse, delta, dk, dv, causal, scale, config=None):
    """(grid, args, meta) of the Gluon dk/dv kernel on validated arguments (gluon_backward_supported):
    q, do (B, H, Tq, D); k, v, dk, dv (B, Hkv, Tk, D); lse and delta fp32 (B, H, Tq) with the same
    strides and a unit token stride; causal the kernels' CAUSAL flag (kernel_mask's); scale
    sm_scale. config: (BLOCK_M, BLOCK_N, STAGES) instead of GLUON_DKDV_CONFIG's. Also what
    scripts/gluon_compile.py compiles without a GPU."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    block_m, block_n, stages = config or GLUON_DKDV_CONFIG[d]
    _check_stats(lse, delta)
    args = (_descriptor(q, block_m), _descriptor(do, block_m), _descriptor(k, block_n), _descriptor(v, block_n),
            _descriptor(dk, block_n), _descriptor(dv, block_n), lse, delta, lse.stride(0), lse.stride(1), hkv,
            h // hkv, tq, tk, scale * LOG2E.value, scale)
    meta = dict(CAUSAL=bool(causal), STAGES=stages, num_warps=block_n // 16, maxnreg=MAXNREG)
    return (cdiv(tk, block_n), b * hkv), args, meta


def launch_gluon_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, config=None):
    """Write dk and dv (arguments as gluon_dkdv_args takes them, non-empty) on q's device as the
    current one."""
    if q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):
            return launch_gluon_dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale, config)
    grid, args, meta = gluon_dkdv_args(q, k, v, do, lse, delta, dk, dv, causal, scale, config)
    _gluon_dkdv_kernel[grid](*args, **meta)


# head dim -> (BLOCK_M, BLOCK_N, STAGES) of the dq kernel: BLOCK_M queries a program over BLOCK_M / 64
# consumer warpgroups, a ring of STAGES K and V blocks of BLOCK_N keys. Shared memory: q and dO
# (BLOCK_M x D each) + STAGES x (K and V, BLOCK_N x D each): 128 KB at hd 128. Registers a consumer
# thread at hd 128: dq 64, S and dP 16 each. Not yet measured.
GLUON_DQ_CONFIG = {
    64: (128, 64, 3),
    128: (128, 64, 2),
}
# the other configs scripts/tune/gluon_backward_ab.py weighs (and scripts/gluon_compile.py compiles)
DQ_AB_CONFIGS = {
    64: ((128, 128, 2),),
    128: ((128, 64, 3), (128, 128, 2)),
}


@gluon.jit
def _dq_producer(q_desc, do_desc, k_desc, v_desc, q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty, batch, head,
                 kv_head, start_m, lo, n_iter):
    """One warp: the program's q and dO tiles once, then its key blocks lo, lo + BLOCK_N, ...: each
    block's K and V into the ring, a stage once the consumers released it."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_tile.type.shape[2]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [batch, head, start_m * BLOCK_M, 0], q_bar, q_tile)
    tma.async_copy_global_to_shared(do_desc, [batch, head, start_m * BLOCK_M, 0], q_bar, do_tile)
    for it in range(n_iter):
        s = it % STAGES
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        row = lo + it * BLOCK_N
        tma.async_copy_global_to_shared(k_desc, [batch, kv_head, row, 0], ready.index(s), k_bufs.index(s))
        tma.async_copy_global_to_shared(v_desc, [batch, kv_head, row, 0], ready.index(s), v_bufs.index(s))


@gluon.jit
def _dq_consumer(q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty, dq_desc, lse_ptr, delta_ptr, stride_lb,
                 stride_lh, batch, head, start_m, lo, unmasked_hi, n_iter, n_queries, n_keys, causal_shift, qk_scale,
                 sm_scale, CAUSAL: gl.constexpr):
    """The consumer warpgroups: dq of the program's queries over the producer's key blocks, the tl
    dq kernel's arithmetic (_dq_key_blocks):
        S = q k^T and dP = dO v^T    issued together, asynchronously
        P = exp2(S * scale - LSE)    once S is done, while dP runs; the blocks past unmasked_hi
                                     (the causal diagonal, the end of the keys) masked
        dq += (P * (dP - delta)) k   from registers
    then dq (times sm_scale) out by TMA through q's tile."""
    STAGES: gl.constexpr = k_bufs.type.shape[0]
    BLOCK_M: gl.constexpr = q_tile.type.shape[2]
    HEAD_D: gl.constexpr = q_tile.type.shape[3]
    BLOCK_N: gl.constexpr = k_bufs.type.shape[3]
    NUM_WARPS: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, NUM_WARPS)  # S, dP: queries x keys
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, HEAD_D, NUM_WARPS)  # dq
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, s_layout)
    keys_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    dtype: gl.constexpr = q_tile.dtype

    q_t = q_tile.reshape([BLOCK_M, HEAD_D])
    do_t = do_tile.reshape([BLOCK_M, HEAD_D])
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([BLOCK_M, HEAD_D], gl.float32, acc_layout)
    rows = start_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=rows_l)
    lse2, delta = _query_stats(lse_ptr, delta_ptr, batch * stride_lb + head * stride_lh, rows, n_queries)
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
        s_b = warpgroup_mma(q_t, k_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_t, v_t.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_b = warpgroup_mma_wait(num_outstanding=1, deps=(s_b, ))  # S done; dP may still run
        p = gl.exp2(s_b * qk_scale - lse2)
        if start_n >= unmasked_hi:  # a block the diagonal or the end of the keys cuts
            keys = gl.expand_dims(start_n + cols, 0)
            visible = keys < n_keys
            if CAUSAL:
                visible = visible & (keys <= gl.expand_dims(rows + causal_shift, 1))
            p = gl.where(visible, p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        ds = p * (dp - delta)
        dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), a_layout), k_t, dq, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        mbarrier.arrive(empty.index(s))  # every product that read the stage is done
    # every product that read q's tile is done: it takes dq on its way out
    q_t.store((dq * sm_scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dq_desc, [batch, head, start_m * BLOCK_M, 0], q_tile)
    tma.store_wait(pendings=0)


_DQ_INT_ARGS = ("stride_lb", "stride_lh", "n_heads", "kv_group", "n_queries", "n_keys")


@gluon.jit(do_not_specialize=_DQ_INT_ARGS)
def _gluon_dq_kernel(q_desc, do_desc, k_desc, v_desc, dq_desc, lse_ptr, delta_ptr, stride_lb, stride_lh, n_heads,
                     kv_group, n_queries, n_keys, qk_scale, sm_scale, CAUSAL: gl.constexpr, STAGES: gl.constexpr):
    """A grid of (query blocks, batch x heads), causal in the forward's order (the longest rows
    first). q, dO, dq (B, H, Tq, D) and k, v (B, Hkv, Tk, D) through 4-D descriptors of (1, 1,
    BLOCK_M, D) and (1, 1, BLOCK_N, D) tiles; lse and delta as for _gluon_dkdv_kernel."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    start_m = gl.program_id(0)
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - start_m
    batch = gl.program_id(1) // n_heads
    head = gl.program_id(1) % n_heads
    kv_head = head // kv_group
    causal_shift = n_keys - n_queries  # query i sees keys j <= i + causal_shift
    lo, _, unmasked_hi, hi = key_blocks(start_m, n_keys, causal_shift, 0, 0, CAUSAL, False, True, BLOCK_M, BLOCK_N)
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
        mbarrier.init(empty.index(st), count=1)

    gl.warp_specialize([
        (_dq_consumer, (q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty, dq_desc, lse_ptr, delta_ptr, stride_lb,
                        stride_lh, batch, head, start_m, lo, unmasked_hi, n_iter, n_queries, n_keys, causal_shift,
                        qk_scale, sm_scale, CAUSAL)),
        (_dq_producer, (q_desc, do_desc, k_desc, v_desc, q_tile, do_tile, k_bufs, v_bufs, q_bar, ready, empty,
                        batch, head, kv_head, start_m, lo, n_iter)),
    ], [1], [PRODUCER_REGS])


def gluon_dq_args(q, k, v, do, lse, delta, dq, causal, scale, config=None):
    """(grid, args, meta) of the Gluon dq kernel on validated arguments (gluon_backward_supported):
    q, do, dq (B, H, Tq, D); k, v (B, Hkv, Tk, D); lse, delta, causal and
    scale as gluon_dkdv_args takes them. config: (BLOCK_M, BLOCK_N, STAGES) instead of
    GLUON_DQ_CONFIG's."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    block_m, block_n, stages = config or GLUON_DQ_CONFIG[d]
    _check_stats(lse, delta)
    args = (_descriptor(q, block_m), _descriptor(do, block_m), _descriptor(k, block_n), _descriptor(v, block_n),
            _descriptor(dq, block_m), lse, delta, lse.stride(0), lse.stride(1), h, h // hkv, tq, tk,
            scale * LOG2E.value, scale)
    meta = dict(CAUSAL=bool(causal), STAGES=stages, num_warps=block_m // 16, maxnreg=MAXNREG)
    return (cdiv(tq, block_m), b * h), args, meta


def launch_gluon_dq(q, k, v, do, lse, delta, dq, causal, scale, config=None):
    """Write dq (arguments as gluon_dq_args takes them, non-empty) on q's device as the current one."""
    if q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):
            return launch_gluon_dq(q, k, v, do, lse, delta, dq, causal, scale, config)
    grid, args, meta = gluon_dq_args(q, k, v, do, lse, delta, dq, causal, scale, config)
    _gluon_dq_kernel[grid](*args, **meta)


__all__ = ["DKDV_AB_CONFIGS", "DQ_AB_CONFIGS", "GLUON_DKDV_CONFIG", "GLUON_DQ_CONFIG", "gluon_backward_supported",
           "gluon_dkdv_args", "gluon_dq_args", "launch_gluon_dkdv", "launch_gluon_dq"]
