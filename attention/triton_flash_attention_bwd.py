"""FlashAttention backward kernels: dq, dk, dv of O = softmax(q k^T * sm_scale) v, by the
FlashAttention-2 algorithm, without the T x T matrix.

With S = q k^T * sm_scale, P = softmax(S) (row-wise), O = P v and dO the upstream gradient:

    dv = P^T dO            dP = dO v^T            dS = P * (dP - delta),  delta = rowsum(dO * O) - dLSE
    dq = dS k * sm_scale   dk = dS^T q * sm_scale

P is never stored: each kernel recomputes a block of it from q, k and the forward's per-query
log-sum-exp, P = exp(S - LSE) (exp2 with log2(e) folded into the scale, as in the forward).
delta is rowsum(dP * P) written as rowsum(dO * O), one number a query computed once up front
(`_preprocess_kernel`). dLSE, the gradient of the LSE output when a caller used it, enters there.

Two schedules. Both start with the preprocess launch, delta (fp32, laid out like LSE) from O and dO.

The two-pass schedule (`deterministic=True`, and the default wherever the other does not win):
1. dk, dv: one program per BLOCK_N keys of one (batch, kv head). It keeps its k and v blocks and
   the fp32 dk, dv accumulators in registers and streams q, dO, LSE and delta in blocks of BLOCK_M
   queries, over every query head of its GQA group in turn (dk, dv of a shared kv head are the sums
   over the group: summed in registers, written once). Causal: the query blocks before the diagonal
   see none of the block's keys and are skipped; those the diagonal cuts run masked.
2. dq: one program per BLOCK_M queries of one (batch, head), streaming k and v blocks as the
   forward does, with the same unmasked/masked split of the key loop.
P and dP are recomputed in both passes (7 products of 2 * T^2 * D per head: k q^T, P^T dO, v dO^T
and dS^T q for dk/dv; q k^T, dO v^T and dS k for dq), and nothing is added atomically: the same
gradients, bit for bit, on every run.

The one-pass schedule (FlashAttention-2's; `deterministic=False` where one_pass_when says): the dk,
dv launch alone, each program also adding its key block's share of each query block's dq, dS k,
into an fp32 buffer the preprocess zeroed (4 bytes a value of q), rounded into dq at the end. Five
products instead of seven, but the adds' order follows the scheduler, so dq's last bits can differ
between runs. On Hopper a share leaves as one TMA bulk reduction of the (BLOCK_M, BLOCK_D) tile;
elsewhere (and in the interpreter) as one fp32 atomic a value, which measured no faster than the
two-pass schedule on an H100 and so is not the default there (docs/tuning/attention.md).

Sliding windows and logit softcapping (attention/triton_flash_attention_fwd.py): WINDOW masks as the
forward does, and each launch visits only the blocks some pair of the window falls in (the dk/dv
kernel's queries by window_query_range, the dq kernel's keys by window_key_range), masked at both
ends, unmasked in between. SOFTCAP recomputes t = tanh(S / c) (by tanh_approx, as the forward) and
the capped score c * t; the gradient of the uncapped S is then dS * (1 - t^2) (the chain rule
through c * tanh(S / c)), which dq and dk take in place of dS.

FLOPs, counted as the forward's 2.5x (the convention of FlashAttention's benchmarks): the
backward's four products of 2 * Tq * Tk * D each plus the recomputed q k^T, over the visible
pairs only under a causal mask or a window. Memory: q, k, v, O,
dO read, dq, dk, dv written, LSE and delta, and the one-pass schedule's fp32 dq: O(T * D) per head.

Rows past the end of the queries load LSE = -inf, which the kernels treat like a query that sees
no key: LSE is replaced by +inf so its recomputed probabilities are exp2(-inf) = 0. Keys past the
end are masked in the dq pass; in the dk/dv pass their rows are computed and never stored.
Packed sequences (VARLEN) are read as in the forward (attention/triton_flash_attention_fwd.py).
"""
import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from llmk.attention.attention_checks import NO_MASK
from llmk.attention.attention_paths import gluon_backward
from llmk.attention.triton_flash_attention_fwd import (
    MAX_GRID_Y,
    attention_grid,
    kernel_mask,
    key_blocks,
    program_pair,
    query_program,
    query_sequences,
    sequence_bounds,
    window_visible,
)
from llmk.common.device import INTERPRET
from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.triton_utils import LOG2E, softcap_scales, tanh_approx

# (largest head dim, two-pass dk/dv config, two-pass dq config, one-pass config or None), each
# config (BLOCK_M, BLOCK_N, num_warps, num_stages); the first row whose head dim fits wins. A
# dk/dv program holds two fp32 accumulators of BLOCK_N x BLOCK_D (the one-pass program also a
# BLOCK_M x BLOCK_D share of dq); the dq program one of BLOCK_M x BLOCK_D. Measured by
# scripts/tune/attention_backward_sweep.py on an H100 (docs/tuning/attention.md has the figures
# and the configs that lost).
BACKWARD_TABLE = [
    # 32-query steps of 128-key blocks, one warpgroup, beat 64 x 128 over 8 warps; one pass lost causal
    (64, (32, 128, 4, 3), (128, 64, 8, 3), None),
    # 128-key blocks over two warpgroups (255 registers, no spill); one pass with TMA wins where no
    # query heads share a kv head and loses under GQA (one_pass_when)
    (128, (64, 128, 8, 3), (128, 64, 8, 2), (64, 128, 8, 3)),
    # 32 x 64 blocks, stages as the 256-wide rows fit; one pass beats two at this width
    (256, (32, 64, 8, 1), (64, 32, 4, 2), (32, 64, 8, 2)),
]
# The interpreter: small blocks, so the short test sequences span several of them; its default
# takes the one-pass schedule (pointer atomics) at every head dim, and deterministic=True the other
INTERPRET_BACKWARD = ((16, 16, 1, 1), (16, 16, 1, 1), (16, 16, 1, 1))
# Values (queries x padded head dim) a preprocess program reduces: O and dO in fp32 are then 128
# registers a thread over its 4 warps. 16 queries a program in the interpreter.
PREPROCESS_VALUES = 8192

# How the dk/dv launch adds a key block's share of dq into the fp32 buffer (its DQ_ADD); constexprs,
# so the kernels may read them
DQ_TWO_PASS = tl.constexpr(0)  # none: the two-pass schedule's dq launch makes dq
DQ_ATOMICS = tl.constexpr(1)   # fp32 atomic adds, one a value (every GPU, and the interpreter)
DQ_TMA = tl.constexpr(2)       # one TMA bulk reduction a (BLOCK_M, BLOCK_D) tile (Hopper and later)
DQ_ADDS = {"atomics": DQ_ATOMICS.value, "tma": DQ_TMA.value}  # the launcher's dq_add names


@functools.lru_cache(maxsize=None)
def tma_reduce_available(device):
    """Whether the one-pass schedule can add dq with TMA reductions on `device`: compute capability
    9.0 and later. The interpreter emulates TMA loads and stores but not reductions."""
    return not INTERPRET and torch.cuda.get_device_capability(device)[0] >= 9


def one_pass_when(kv_group, tma_reduce):
    """Where the default takes the one-pass schedule (a row that has one): with TMA reductions, and
    no query heads sharing a kv head. Under GQA a dk/dv program walks its whole group's queries, a
    grid of 1/group as many programs, and the two-pass dq launch's parallelism won (Llama's 32/8
    causal: 292 against 273 TFLOP/s); with one fp32 atomic a value, the two schedules tied."""
    return tma_reduce and kv_group == 1


def dp_first_when(head_dim):
    """Whether the dk/dv loop issues dP^T = v dO^T beside S^T = k q^T (then forms dS^T while the
    dv product runs on the tensor cores) rather than after the dv product. Measured on an H100:
    2-8% ahead at head dim 128, both schedules, with and without GQA (ties at B16 T1024 causal);
    at 64 +1.5% full but -4% causal."""
    return 64 < head_dim <= 128


def backward_table_config(head_dim):
    """BACKWARD_TABLE's (two-pass dk/dv config, two-pass dq config, one-pass config or None) for a
    head dim of at most MAX_HEAD_DIM."""
    for max_dim, *configs in BACKWARD_TABLE:
        if head_dim <= max_dim:
            return tuple(configs)
    raise ValueError(f"head dim {head_dim} has no backward config")  # unreachable past the checks


def backward_config(head_dim, deterministic, kv_group, tma_reduce):
    """The launch the backward takes: (dk/dv config, dq config), the dq config None for the
    one-pass schedule (dq added into fp32 in the dk/dv launch). deterministic: two-pass always;
    kv_group: query heads a kv head serves; tma_reduce: whether dq may be added by TMA."""
    if INTERPRET:
        dkdv, dq, one_pass = INTERPRET_BACKWARD
        return (dkdv, dq) if deterministic else (one_pass, None)
    dkdv, dq, one_pass = backward_table_config(head_dim)
    if deterministic or one_pass is None or not one_pass_when(kv_group, tma_reduce):
        return dkdv, dq
    return one_pass, None


@triton.jit
def _preprocess_kernel(
    o_ptr, do_ptr, lse_ptr, dlse_ptr, delta_ptr, dq_acc_ptr,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh,  # of lse, delta and dlse, unit token stride
    stride_ab, stride_ah, stride_am,  # of the one-pass schedule's fp32 dq (unit dim stride)
    n_heads, n_queries, n_bh,
    HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, GRID_Y: tl.constexpr,
):
    """delta = rowsum(dO * O) - dLSE for BLOCK_M queries of one (batch, head), 0 where a query sees
    no key (LSE -inf: its P is 0, and a non-finite O or dLSE there would make 0 * NaN in dS), and
    (ZERO_DQ) zeros into their rows of the fp32 dq the one-pass schedule adds into. A packed batch
    is one sequence of all its tokens here: 64-bit token offsets."""
    bh = program_pair(GRID_Y)
    if bh >= n_bh:
        return
    batch = (bh // n_heads).to(tl.int64)
    head = (bh % n_heads).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = offs_m.to(tl.int64)[:, None]
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < n_queries)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(o_ptr + batch * stride_ob + head * stride_oh + rows * stride_om
                + offs_d[None, :] * stride_od, mask=mask, other=0.0)
    do = tl.load(do_ptr + batch * stride_dob + head * stride_doh + rows * stride_dom
                 + offs_d[None, :] * stride_dod, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    row = batch * stride_lb + head * stride_lh + offs_m
    if HAS_DLSE:
        delta -= tl.load(dlse_ptr + row, mask=offs_m < n_queries, other=0.0)
    lse = tl.load(lse_ptr + row, mask=offs_m < n_queries, other=0.0)
    delta = tl.where(lse == float("-inf"), 0.0, delta)
    tl.store(delta_ptr + row, delta, mask=offs_m < n_queries)
    if ZERO_DQ:
        tl.store(dq_acc_ptr + batch * stride_ab + head * stride_ah + rows * stride_am + offs_d[None, :],
                 tl.zeros([BLOCK_M, BLOCK_D], tl.float32), mask=mask)


@triton.jit
def _row_stats(lse_base, delta_base, offs_m, n_queries):
    """(LSE in scaled log2 units, +inf where no key is seen or past the end; delta) of rows offs_m."""
    m_ok = offs_m < n_queries
    lse = tl.load(lse_base + offs_m, mask=m_ok, other=float("-inf"))
    unseen = lse == float("-inf")
    lse2 = tl.where(unseen, float("inf"), lse * LOG2E)
    # P = 0 on such a row, and delta 0 (the preprocess's): a non-finite dLSE there (a merge of two
    # -inf LSEs) cannot make 0 * NaN in dS
    return lse2, tl.load(delta_base + offs_m, mask=m_ok, other=0.0)


@triton.jit
def _dkdv_query_blocks(
    dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_acc_base, dq_desc, dq_row0,
    stride_qm, stride_qd, stride_dom, stride_dod, stride_am,
    offs_n, offs_d, lo, hi, n_queries, causal_shift, qk_scale, sm_scale,
    window_left, window_right, softcap_log2,
    MASKED: tl.constexpr, DQ_ADD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    DP_FIRST: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Add queries [lo, hi) of one head to the dk, dv accumulators of keys offs_n (transposed
    products: pT = P^T is (BLOCK_N, BLOCK_M)). MASKED blocks apply the causal diagonal, or the
    window (WINDOW). SOFTCAP: P from the capped scores, and dS times 1 - tanh^2.
    DQ_ADD (one-pass): also add these keys' share of the queries' dq, dS k * sm_scale, into the
    fp32 dq: at dq_acc_base by atomics, or through dq_desc (rows from dq_row0) by TMA.
    DP_FIRST: the products' order (dp_first_when)."""
    offs_m0 = tl.arange(0, BLOCK_M)
    d_ok = (offs_d < HEAD_DIM)[None, :]
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        row_mask = (offs_m < n_queries)[:, None] & d_ok
        q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=row_mask, other=0.0)
        lse2, delta = _row_stats(lse_base, delta_base, offs_m, n_queries)
        if DP_FIRST:  # dP^T issued beside S^T: dS^T is then formed while the dv product runs
            do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod, mask=row_mask,
                         other=0.0)
            sT = tl.dot(k, tl.trans(q))
            dpT = tl.dot(v, tl.trans(do))
        else:
            sT = tl.dot(k, tl.trans(q))
        # P <= 1, so the exponent is <= 0 but for rounding; capping it there keeps a key row past
        # the end (k = 0, so S = 0 and P = 2^-lse2) finite where every score of the query is very
        # negative: uncapped, its dS overflows (2^-lse2 past 65504 in fp16, past fp32 below LSE
        # -88) and dq's product with its zero k row is inf x 0 = NaN
        if SOFTCAP:
            tT = tanh_approx(sT * qk_scale)
            pT = tl.math.exp2(tl.minimum(softcap_log2 * tT - lse2[None, :], 0.0))
        else:
            pT = tl.math.exp2(tl.minimum(sT * qk_scale - lse2[None, :], 0.0))
        if MASKED:
            if WINDOW:
                rel = offs_n[:, None] - (offs_m[None, :] + causal_shift)  # window_visible, transposed
                pT = tl.where((rel >= -window_left) & (rel <= window_right), pT, 0.0)
            else:
                pT = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_shift, pT, 0.0)
        if not DP_FIRST:
            do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod, mask=row_mask,
                         other=0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        if not DP_FIRST:
            dpT = tl.dot(v, tl.trans(do))
        if SOFTCAP:  # the gradient of the uncapped score: through c * tanh(s / c)
            dsT = (pT * (dpT - delta[None, :]) * (1.0 - tT * tT)).to(q.dtype)
        else:
            dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk)
        if DQ_ADD != DQ_TWO_PASS:
            if BLOCK_M >= 64:
                dq = tl.dot(tl.trans(dsT), k) * sm_scale
            else:  # a product of fewer than 64 rows misses Hopper's wgmma: make dq^T (D rows)
                dq = tl.trans(tl.dot(tl.trans(k), dsT) * sm_scale)
            if DQ_ADD == DQ_TMA:
                # rows past the queries' end hold zeros (P = 0 there): adding them to the next
                # head's rows changes nothing, and the copy clips at the buffer's end
                dq_desc.atomic_add([dq_row0 + start_m, 0], dq)
            else:
                # relaxed: nothing in this launch reads dq, so no ordering is needed, only the sum
                tl.atomic_add(dq_acc_base + offs_m[:, None] * stride_am + offs_d[None, :], dq, mask=row_mask,
                              sem="relaxed")
    return dk, dv


@triton.jit
def window_query_range(start_n, n_queries, causal_shift, window_left, window_right,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The dk/dv kernel's window_key_range: (lo, unmasked_lo, unmasked_hi, hi) of key block
    start_n. Query i sees key j when j - right <= i' <= j + left (i' = i + causal_shift): queries
    [unmasked_lo, unmasked_hi) see every key of the block (no mask; the last, ragged block of the
    queries included, whose rows past the end the LSE zeroes), [lo, unmasked_lo) and
    [unmasked_hi, hi) some (masked), the others none (skipped)."""
    first = start_n * BLOCK_N - causal_shift  # key j - causal_shift of the block's first and last keys
    last = first + BLOCK_N - 1
    lo = tl.maximum(first - window_right, 0) // BLOCK_M * BLOCK_M
    hi = tl.maximum(tl.minimum(last + window_left + 1, n_queries), 0)
    unmasked_lo = tl.cdiv(tl.maximum(last - window_right, 0), BLOCK_M) * BLOCK_M
    unmasked_end = first + window_left + 1  # queries before it see the block's first key
    unmasked_hi = tl.where(unmasked_end >= n_queries, n_queries, tl.maximum(unmasked_end, 0) // BLOCK_M * BLOCK_M)
    unmasked_lo = tl.minimum(tl.maximum(unmasked_lo, lo), hi)
    unmasked_hi = tl.minimum(tl.maximum(unmasked_hi, unmasked_lo), hi)
    return lo, unmasked_lo, unmasked_hi, hi


@triton.jit
def query_blocks(start_n, n_queries, causal_shift, window_left, window_right, CAUSAL: tl.constexpr,
                 WINDOW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, lead_hi, unmasked_lo, unmasked_hi, hi) of key block start_n, for the dk/dv kernel:
    queries [unmasked_lo, unmasked_hi) see every key of the block (no mask), [lo, lead_hi) and,
    under a window, [unmasked_hi, hi) some of them (masked), the others none (skipped). A
    window's (window_query_range; lead_hi = unmasked_lo); causal's, whose lead runs from the first
    query that sees the block's first key to where every query sees all of it (lead_hi: that, or
    the queries' end) and whose middle runs to the end; without either, every query unmasked."""
    if WINDOW:
        lo, unmasked_lo, unmasked_hi, hi = window_query_range(start_n, n_queries, causal_shift, window_left,
                                                              window_right, BLOCK_M, BLOCK_N)
        lead_hi = unmasked_lo
    elif CAUSAL:
        lo = tl.maximum(start_n * BLOCK_N - causal_shift, 0) // BLOCK_M * BLOCK_M
        unmasked_lo = tl.maximum(start_n * BLOCK_N + BLOCK_N - 1 - causal_shift, 0)
        unmasked_lo = tl.maximum(tl.cdiv(unmasked_lo, BLOCK_M) * BLOCK_M, lo)
        lead_hi = tl.minimum(unmasked_lo, n_queries)
        unmasked_hi = n_queries
        hi = n_queries
    else:
        lo = 0
        lead_hi = 0
        unmasked_lo = 0
        unmasked_hi = n_queries
        hi = n_queries
    return lo, lead_hi, unmasked_lo, unmasked_hi, hi


@triton.jit
def _dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_acc_ptr, dq_desc, cu_seqlens_q, cu_seqlens_k,
    # strides (batch, head, token, dim); dO has q's, dk has k's and dv has v's shape; lse and
    # delta share (batch, head) strides and a unit token stride; the fp32 dq (one-pass, else None)
    # has q's shape and a unit dim stride, and dq_desc (DQ_TMA, else None) covers its rows;
    # packed batches pass batch strides 0
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_lb, stride_lh,
    stride_ab, stride_ah, stride_am,
    n_kv_heads, kv_group, n_queries, n_keys, qk_scale, sm_scale, n_bh,
    window_left, window_right, softcap_log2,  # as the forward takes them
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, DQ_ADD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GRID_Y: tl.constexpr,
    DP_FIRST: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):
    start_n = tl.program_id(0)
    bh = program_pair(GRID_Y)
    if bh >= n_bh:
        return
    batch = bh // n_kv_heads
    q_start, n_queries = sequence_bounds(cu_seqlens_q, batch, n_queries, VARLEN)
    k_start, n_keys = sequence_bounds(cu_seqlens_k, batch, n_keys, VARLEN)
    if VARLEN:
        if start_n * BLOCK_N >= n_keys:
            return
    batch = batch.to(tl.int64)
    kv_head = (bh % n_kv_heads).to(tl.int64)
    q_start = q_start.to(tl.int64)
    k_start = k_start.to(tl.int64)

    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n < n_keys)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(k_ptr + batch * stride_kb + kv_head * stride_kh + (k_start + offs_n[:, None]) * stride_kn
                + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + batch * stride_vb + kv_head * stride_vh + (k_start + offs_n[:, None]) * stride_vn
                + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    causal_shift = n_keys - n_queries  # query i sees keys j <= i + causal_shift
    # masked lead (causal's diagonal, a window's edge), unmasked middle, masked tail (a window's)
    lo, lead_hi, unmasked_lo, unmasked_hi, hi = query_blocks(start_n, n_queries, causal_shift, window_left,
                                                             window_right, CAUSAL, WINDOW, BLOCK_M, BLOCK_N)
    for g in range(kv_group):  # the query heads that share this kv head
        head = kv_head * kv_group + g
        q_base = q_ptr + batch * stride_qb + head * stride_qh + q_start * stride_qm
        do_base = do_ptr + batch * stride_dob + head * stride_doh + q_start * stride_dom
        lse_base = lse_ptr + batch * stride_lb + head * stride_lh + q_start
        delta_base = delta_ptr + batch * stride_lb + head * stride_lh + q_start
        if DQ_ADD != DQ_TWO_PASS:
            dq_acc_base = dq_acc_ptr + batch * stride_ab + head * stride_ah + q_start * stride_am
            # the row of the buffer's (rows, D) view where this head's token q_start sits
            dq_row0 = ((batch * stride_ab + head * stride_ah) // stride_am + q_start).to(tl.int32)
        else:
            dq_acc_base = dq_acc_ptr  # None: the dq launch makes dq
            dq_row0 = 0
        if CAUSAL or WINDOW:
            dk, dv = _dkdv_query_blocks(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_acc_base, dq_desc, dq_row0,
                stride_qm, stride_qd, stride_dom, stride_dod, stride_am,
                offs_n, offs_d, lo, lead_hi, n_queries, causal_shift, qk_scale, sm_scale,
                window_left, window_right, softcap_log2, True, DQ_ADD, HEAD_DIM, BLOCK_M, DP_FIRST, WINDOW, SOFTCAP)
        dk, dv = _dkdv_query_blocks(
            dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_acc_base, dq_desc, dq_row0,
            stride_qm, stride_qd, stride_dom, stride_dod, stride_am,
            offs_n, offs_d, unmasked_lo, unmasked_hi, n_queries, causal_shift, qk_scale, sm_scale,
            window_left, window_right, softcap_log2, False, DQ_ADD, HEAD_DIM, BLOCK_M, DP_FIRST, WINDOW, SOFTCAP)
        if WINDOW:
            dk, dv = _dkdv_query_blocks(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_acc_base, dq_desc, dq_row0,
                stride_qm, stride_qd, stride_dom, stride_dod, stride_am,
                offs_n, offs_d, unmasked_hi, hi, n_queries, causal_shift, qk_scale, sm_scale,
                window_left, window_right, softcap_log2, True, DQ_ADD, HEAD_DIM, BLOCK_M, DP_FIRST, WINDOW, SOFTCAP)

    dk *= sm_scale
    tl.store(dk_ptr + batch * stride_dkb + kv_head * stride_dkh + (k_start + offs_n[:, None]) * stride_dkn
             + offs_d[None, :] * stride_dkd, dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + batch * stride_dvb + kv_head * stride_dvh + (k_start + offs_n[:, None]) * stride_dvn
             + offs_d[None, :] * stride_dvd, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_key_blocks(
    dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, lo, hi, n_keys, causal_shift, qk_scale, window_left, window_right, softcap_log2,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Add keys [lo, hi) to the dq accumulator of queries offs_m. MASKED blocks check the causal
    diagonal (or the window) and the end of the keys. SOFTCAP as in _dkdv_query_blocks."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = (offs_d < HEAD_DIM)[None, :]
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        if MASKED:
            kv_mask = (keys < n_keys)[:, None] & d_ok
        else:
            kv_mask = d_ok
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        if SOFTCAP:
            t = tanh_approx(tl.dot(q, tl.trans(k)) * qk_scale)
            p = tl.math.exp2(softcap_log2 * t - lse2[:, None])
        else:
            p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if MASKED:
            visible = (keys < n_keys)[None, :]
            if CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None] + causal_shift)
            if WINDOW:
                visible = visible & window_visible(keys, offs_m, causal_shift, window_left, window_right)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_seqlens_q, cu_seqlens_k,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_lb, stride_lh,
    n_heads, kv_group, n_queries, n_keys, qk_scale, sm_scale, n_bh,
    window_left, window_right, softcap_log2,  # as the forward takes them
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GRID_Y: tl.constexpr, WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    start_m, bh = query_program(CAUSAL or WINDOW, GRID_Y)  # the forward's prologue, its block order
    if bh >= n_bh:
        return
    batch, head, kv_head, q_start, n_queries, k_start, n_keys = query_sequences(
        cu_seqlens_q, cu_seqlens_k, bh, n_heads, kv_group, n_queries, n_keys, VARLEN)
    if VARLEN:
        if start_m * BLOCK_M >= n_queries:
            return

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m < n_queries)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + batch * stride_qb + head * stride_qh + (q_start + offs_m[:, None]) * stride_qm
                + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    do = tl.load(do_ptr + batch * stride_dob + head * stride_doh + (q_start + offs_m[:, None]) * stride_dom
                 + offs_d[None, :] * stride_dod, mask=q_mask, other=0.0)
    row = batch * stride_lb + head * stride_lh + q_start
    lse2, delta = _row_stats(lse_ptr + row, delta_ptr + row, offs_m, n_queries)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = k_ptr + batch * stride_kb + kv_head * stride_kh + k_start * stride_kn
    v_base = v_ptr + batch * stride_vb + kv_head * stride_vh + k_start * stride_vn

    causal_shift = n_keys - n_queries
    # the forward's blocks: masked lead (a window's left edge), unmasked middle, masked tail
    lo, unmasked_lo, unmasked_hi, hi = key_blocks(start_m, n_keys, causal_shift, window_left, window_right,
                                                  CAUSAL, WINDOW, True, BLOCK_M, BLOCK_N)
    DIAGONAL: tl.constexpr = CAUSAL and not WINDOW  # a window's mask holds the causal bound itself
    if WINDOW:
        dq = _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                            offs_m, offs_d, lo, unmasked_lo, n_keys, causal_shift, qk_scale, window_left,
                            window_right, softcap_log2, True, DIAGONAL, HEAD_DIM, BLOCK_N, WINDOW, SOFTCAP)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                        offs_m, offs_d, unmasked_lo, unmasked_hi, n_keys, causal_shift, qk_scale, window_left,
                        window_right, softcap_log2, False, DIAGONAL, HEAD_DIM, BLOCK_N, WINDOW, SOFTCAP)
    dq = _dq_key_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                        offs_m, offs_d, unmasked_hi, hi, n_keys, causal_shift, qk_scale, window_left,
                        window_right, softcap_log2, True, DIAGONAL, HEAD_DIM, BLOCK_N, WINDOW, SOFTCAP)
    dq *= sm_scale
    tl.store(dq_ptr + batch * stride_dqb + head * stride_dqh + (q_start + offs_m[:, None]) * stride_dqm
             + offs_d[None, :] * stride_dqd, dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


def launch_flash_attention_backward(do, q, k, v, o, lse, dq, dk, dv, causal, scale, dlse=None,
                                    cu_seqlens=None, config=None, deterministic=False, dq_add=None,
                                    dp_first=None, grid_y=MAX_GRID_Y, mask=NO_MASK, gluon=None):
    """Write dq, dk, dv (shaped and typed like q, k, v; any strides) on validated arguments.
    do, o: like q (B, H, Tq, D); k, v (B, Hkv, Tk, D); lse: fp32 (B, H, Tq), unit token stride,
    as the forward wrote it; dlse: None or lse's gradient, shaped like it. scale: sm_scale.
    cu_seqlens: None, or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) for a packed
    batch of (1, H, total, D) views (attention/triton_flash_attention_fwd.launch_flash_attention).
    deterministic: the two-pass schedule (bit-identical gradients on every run); else
    backward_config's choice for the head dim and GQA group.
    config: (dk/dv (BLOCK_M, BLOCK_N, num_warps, num_stages), dq's or None) to launch instead of
    backward_config's choice; a dq config of None is the one-pass schedule.
    dq_add: how the one-pass schedule adds dq, "atomics" or "tma" (tests and sweeps); None: "tma"
    where tma_reduce_available, the head dim's fp32 rows are 16-byte aligned and the buffer's rows
    have 32-bit coordinates.
    dp_first: the dk/dv loop's order, dP^T issued beside S^T or after the dv product (sweeps);
    None: dp_first_when's choice for the head dim.
    grid_y, mask: as for the forward's launcher.
    gluon: the two-pass schedule's kernels to run in Gluon for sm_90 (attention/
    gluon_flash_attention_bwd.py): "dkdv", "dq", both or neither (a call they support, else
    ValueError); None: both where attention_paths.gluon_backward takes the call and no config,
    dq_add or dp_first forces a tl kernel, and TMA reads every tensor in place, else neither. Both
    in Gluon is a two-pass schedule too: deterministic whatever `deterministic` asks.
    Returns the compiled kernels launched after the preprocess (their n_regs and n_spills are the
    tuning sweep's), None in the interpreter or with a Gluon kernel."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if gluon is None:  # the dispatch: both kernels where they run and nothing forces a tl one
        gluon = ()
        if gluon_backward(q, (config, dq_add, dp_first) != (None,) * 3):
            from llmk.attention.gluon_flash_attention_bwd import gluon_backward_supported

            if gluon_backward_supported(q, k, v, do, dq, dk, dv):
                gluon = ("dkdv", "dq")
    elif gluon:  # asked for: checked
        gluon = tuple(gluon)
        if not set(gluon) <= {"dkdv", "dq"}:
            raise ValueError(f"gluon: kernel names from ('dkdv', 'dq'), got {gluon}")
        if not INTERPRET:  # Gluon is imported on a GPU only
            from llmk.attention.gluon_flash_attention_bwd import gluon_backward_supported
        if INTERPRET or not gluon_backward_supported(q, k, v, do, dq, dk, dv):
            raise ValueError("gluon: the Gluon backward kernels take fp16/bf16 calls on a GPU with head dims 64 or "
                             "128 and layouts TMA reads in place")
        if config is not None and config[1] is None:
            raise ValueError("gluon: the two-pass schedule's config, (dk/dv config, dq config), got a "
                             "one-pass one")
    if gluon:
        deterministic = True  # the schedule the Gluon kernels make
    block_d = max(16, next_power_of_2(d))
    # TMA wants 16-byte rows (D fp32 values) and 32-bit row coordinates
    tma = d % 4 == 0 and q.numel() // d < 2 ** 31 and tma_reduce_available(q.device)
    (dkdv_m, dkdv_n, dkdv_warps, dkdv_stages), dq_config = config or backward_config(d, deterministic, h // hkv, tma)
    one_pass = dq_config is None
    if dq_add is None:
        dq_add = "tma" if tma else "atomics"
    dq_add = DQ_ADDS[dq_add] if one_pass else DQ_TWO_PASS.value
    # the Gluon dk/dv kernel's TMA copies want each (batch, head) row of LSE and delta 16-byte aligned
    # (a packed batch's are laid out anew by packed_stats)
    if "dkdv" in gluon and cu_seqlens is None:
        from llmk.attention.gluon_flash_attention_bwd import as_stats_buffer

        lse = as_stats_buffer(lse)
    # delta and dLSE laid out as LSE: the kernels read the three with LSE's (batch, head) strides
    delta = torch.empty_strided(lse.shape, lse.stride(), device=lse.device, dtype=torch.float32)
    if dlse is not None and dlse.stride() != delta.stride():
        dlse = torch.empty_strided(delta.shape, delta.stride(), device=delta.device, dtype=delta.dtype).copy_(dlse)
    # the one-pass schedule's fp32 dq sums, zeroed by the preprocess: 4 bytes a value of q
    dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32) if one_pass else None
    acc_strides = dq_acc.stride()[:3] if one_pass else (0, 0, 0)
    pre_block = 16 if INTERPRET else PREPROCESS_VALUES // block_d
    _preprocess_kernel[attention_grid(cdiv(tq, pre_block), b * h, grid_y)](
        o, do, lse, dlse, delta, dq_acc, *o.stride(), *do.stride(), delta.stride(0), delta.stride(1), *acc_strides,
        h, tq, b * h, HAS_DLSE=dlse is not None, ZERO_DQ=one_pass, HEAD_DIM=d, BLOCK_D=block_d,
        BLOCK_M=pre_block, GRID_Y=grid_y)

    cu_q = cu_k = None
    max_q, max_k = tq, tk
    if cu_seqlens is not None:
        cu_q, cu_k, max_q, max_k = cu_seqlens
        b = cu_q.shape[0] - 1
    batch = (lambda t: 0) if cu_q is not None else (lambda t: t.stride(0))
    strides = [(batch(t), *t.stride()[1:]) for t in (q, k, v, do)]
    lse_strides = (batch(lse), lse.stride(1))
    call_causal = causal  # the Gluon launchers make their flags from the call's
    causal, has_window, left, right = kernel_mask(causal, mask, tq, tk)  # the forward's
    qk_scale, softcap_log2, has_softcap = softcap_scales(scale, mask.softcap)
    dq_desc = None
    if one_pass:
        acc_strides = (batch(dq_acc), *acc_strides[1:])
        if dq_add == DQ_TMA.value:  # over the buffer's (B * H * Tq, D) rows, a (BLOCK_M, BLOCK_D) tile a copy
            rows = dq_acc.view(-1, d)
            dq_desc = TensorDescriptor(rows, list(rows.shape), list(rows.stride()), [dkdv_m, block_d])
    if "dkdv" in gluon:
        from llmk.attention.gluon_flash_attention_bwd import launch_gluon_dkdv

        launch_gluon_dkdv(q, k, v, do, lse, delta, dk, dv, call_causal, scale, mask=mask, cu_seqlens=cu_seqlens)
        dkdv_kernel = None
    else:
        dkdv_kernel = _dkdv_kernel[attention_grid(cdiv(max_k, dkdv_n), b * hkv, grid_y)](
            q, k, v, do, lse, delta, dk, dv, dq_acc, dq_desc, cu_q, cu_k,
            *strides[0], *strides[1], *strides[2], *strides[3], batch(dk), *dk.stride()[1:],
            batch(dv), *dv.stride()[1:], *lse_strides, *acc_strides,
            hkv, h // hkv, tq, tk, qk_scale, scale, b * hkv, left, right, softcap_log2,
            CAUSAL=causal, VARLEN=cu_q is not None, DQ_ADD=dq_add, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=dkdv_m,
            BLOCK_N=dkdv_n, GRID_Y=grid_y, DP_FIRST=dp_first_when(d) if dp_first is None else dp_first,
            WINDOW=has_window, SOFTCAP=has_softcap, num_warps=dkdv_warps, num_stages=dkdv_stages)
    if one_pass:
        dq.copy_(dq_acc)  # one rounding of the fp32 sums
        return None if INTERPRET else (dkdv_kernel,)
    if "dq" in gluon:
        from llmk.attention.gluon_flash_attention_bwd import launch_gluon_dq

        launch_gluon_dq(q, k, v, do, lse, delta, dq, call_causal, scale, mask=mask, cu_seqlens=cu_seqlens)
        return None
    dq_m, dq_n, dq_warps, dq_stages = dq_config
    dq_kernel = _dq_kernel[attention_grid(cdiv(max_q, dq_m), b * h, grid_y)](
        q, k, v, do, lse, delta, dq, cu_q, cu_k,
        *strides[0], *strides[1], *strides[2], *strides[3], batch(dq), *dq.stride()[1:], *lse_strides,
        h, h // hkv, tq, tk, qk_scale, scale, b * h, left, right, softcap_log2,
        CAUSAL=causal, VARLEN=cu_q is not None, HEAD_DIM=d, BLOCK_D=block_d,
        BLOCK_M=dq_m, BLOCK_N=dq_n, GRID_Y=grid_y, WINDOW=has_window, SOFTCAP=has_softcap,
        num_warps=dq_warps, num_stages=dq_stages)
    return None if INTERPRET or gluon else (dkdv_kernel, dq_kernel)
