"""FlashAttention forward kernel: softmax(q k^T * sm_scale) v without the T x T matrix.

One program owns BLOCK_M query rows of one (batch, head). It keeps those rows of q in registers
and streams the head's keys and values in blocks of BLOCK_N, with the online softmax of
attention/reference_blocked_attention.py: a running max m and sum l per row, and the output accumulator
rescaled by exp(m_old - m_new) whenever the max grows. Scores live in registers only, so memory
holds O(T * D) per head instead of O(T^2), and q k^T and p v run on the tensor cores with fp32
accumulation (p is rounded to the input dtype for the second product, as FlashAttention does).

FLOPs: 4 * B * H * Tq * Tk * D for full attention (two matmuls of 2 * Tq * Tk * D each); causal
and windowed attention count the visible pairs only, 4 * D * (number of (query, key) pairs a mask
lets through) per (batch, head), and that is the work done up to the blocks the mask cuts. Per
program the key loop runs in two parts: key blocks every row of the block sees run with no mask;
the blocks cut by the causal diagonal or by the end of the keys run masked. exp2 replaces exp with
log2(e) folded into the scale (one multiply saved per score).

Sliding window (WINDOW): query i sees keys j with i' - left <= j <= i' + right, i' = i + Tk - Tq
(aligned to the bottom right like the causal mask, which the host folds in as right <= 0; an
unbounded side is passed as a bound no key reaches). Key blocks outside every row's window are not
visited: the loop runs [lo, hi) (window_key_range), masked at both ends and unmasked in between.
Logit softcapping (SOFTCAP, Gemma 2): scores s = q k^T * sm_scale become c * tanh(s / c) before the
softmax; qk_scale is then sm_scale / c, the tanh's argument, and softcap_log2 = c * log2(e) takes
the capped score to exp2's units; LSE is then that of the capped scores. tanh is
common.triton_utils.tanh_approx: the GPU's tanh.approx.f32, one MUFU instruction beside the softmax's
exp2 where tanh by an exp2 and a division takes two (docs/tuning/attention.md), relative error at
most TANH_APPROX_REL (2^-10.987): a capped score is off by at most c times that, as in
FlashAttention's own softcap.

Conventions are those of attention/reference_attention.py: GQA by `h // (H // Hkv)`, causal aligned to
the bottom right when Tq != Tk, zeros for a query that sees no key.

For training the kernel also writes each query's log-sum-exp of its scaled scores,
LSE = m + log(l) (fp32; -inf for a query that sees no key), from which the backward recomputes the
probabilities (attention/triton_flash_attention_bwd.py): 4 bytes a query, next to the 2 * D bytes of O.

Packed sequences (VARLEN): q (total_q, H, D), k and v (total_k, Hkv, D) are passed as the views
(1, H, total, D); sequence b owns tokens cu_seqlens[b] .. cu_seqlens[b + 1] - 1, and the grid's
second axis runs over (sequence, head) instead of (batch, head). Each program reads its
sequence's bounds on the device, so the host never waits for them; a program whose query block
lies past its sequence's end returns at once. The public functions and their checks are in
attention/flash_attention_ops.py.
"""
import triton
import triton.language as tl

from llmk.attention.attention_checks import NO_MASK
from llmk.common.device import INTERPRET
from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.triton_utils import LN2, softcap_scales, tanh_approx

MAX_HEAD_DIM = 256

# (largest head dim, longest Tq or None, windowed launches only, BLOCK_M, BLOCK_N, num_warps,
# num_stages): the first row that fits wins. BLOCK_M rows of q and an fp32 accumulator of the same
# size live in registers; each pipeline stage holds a K and a V block in shared memory
# (2 * BLOCK_N * BLOCK_D * 2 bytes).
# Measured by scripts/tune/attention_sweep.py on an H200 (fp16, full and causal), the windowed row
# by scripts/tune/attention_options_sweep.py on an H100 (bf16); the figures and the configs that
# lost are in docs/tuning/attention.md.
CONFIG_TABLE = [
    (64, None, False, 128, 64, 8, 3),    # small heads: a tall q block; 8 warps beat 4
    (128, 1024, False, 64, 64, 4, 3),    # short sequences: half-height q blocks make twice the programs
    # a window's query block visits window + BLOCK_M keys for a window's worth of pairs: half-height
    # blocks waste half as many (+5-7% at a window of 1024, a tie at 4096)
    (128, None, True, 64, 64, 4, 3),
    (128, None, False, 128, 64, 8, 3),   # long sequences: 8 warps (4 lost 40%); 4 stages no better
    (256, None, False, 128, 64, 8, 2),   # wide heads: a stage is 64 KB of K and V, two fit; 64 x 32 lost
]
# The interpreter runs tl.dot in numpy: small blocks keep CPU tests quick and give short sequences
# several blocks, so the masked and unmasked loops and the causal diagonal are all exercised.
# The tests force every CONFIG_TABLE row as well (attention/test_flash_attention.py).
INTERPRET_CONFIG = (16, 16, 1, 1)


def table_config(head_dim, n_queries, windowed=False):
    """CONFIG_TABLE's (BLOCK_M, BLOCK_N, num_warps, num_stages) for a head dim of at most
    MAX_HEAD_DIM, n_queries queries and a launch with (windowed) or without a bounded window
    (kernel_mask's has_window): the GPU's choice, in either lane."""
    for max_dim, max_tq, window_only, *config in CONFIG_TABLE:
        if head_dim <= max_dim and (max_tq is None or n_queries <= max_tq) and (windowed or not window_only):
            return tuple(config)
    raise ValueError(f"head dim {head_dim} has no config")  # unreachable past check_attention_args


def attention_config(head_dim, n_queries, windowed=False):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) to launch: INTERPRET_CONFIG in the interpreter."""
    return INTERPRET_CONFIG if INTERPRET else table_config(head_dim, n_queries, windowed)


@triton.jit
def window_visible(keys, queries, causal_shift, window_left, window_right):
    """(len(queries), len(keys)) mask: query i sees key j when i' - left <= j <= i' + right,
    i' = i + causal_shift."""
    rel = keys[None, :] - (queries[:, None] + causal_shift)
    return (rel >= -window_left) & (rel <= window_right)


@triton.jit
def _attend_key_blocks(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, lo, hi, n_keys, causal_shift, qk_scale,
    window_left, window_right, softcap_log2,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Fold keys [lo, hi) into (acc, l_i, m_i). MASKED blocks check the causal diagonal (or the
    window) and the end of the keys; the others are wholly visible to every row of the block.
    SOFTCAP: scores softcap_log2 * tanh(qk * qk_scale), in exp2's units, instead of qk * qk_scale."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM  # all True, and folded away, when BLOCK_D == HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        if MASKED:
            kv_mask = (keys < n_keys)[:, None] & d_ok[None, :]
        else:
            kv_mask = d_ok[None, :]
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k))
        scale = qk_scale
        if SOFTCAP:
            qk = softcap_log2 * tanh_approx(qk * qk_scale)  # the capped score, in exp2's units already
            scale = 1.0
        if MASKED:
            visible = (keys < n_keys)[None, :]
            if CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None] + causal_shift)
            if WINDOW:
                visible = visible & window_visible(keys, offs_m, causal_shift, window_left, window_right)
            qk = tl.where(visible, qk * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # a row that has seen no key yet keeps m = -inf: subtract 0 so -inf - -inf is not NaN
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(qk - m_safe[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)  # scale > 0: max commutes
            m_safe = m_new
            p = tl.math.exp2(qk * scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


# CUDA caps a grid's y and z extents at 65535: the (batch, head) pairs, on axis 1, spill onto axis 2
# past it (a packed batch of 2048 sequences x 32 heads has 65536)
MAX_GRID_Y = 65535


def attention_grid(n_blocks, n_bh, grid_y=MAX_GRID_Y):
    """(n_blocks, pairs on axis 1, axis 2) for n_bh (batch, head) pairs; the kernels read their pair
    with program_pair and skip the pairs past n_bh that the last axis-2 slice adds."""
    return (n_blocks, min(n_bh, grid_y), cdiv(n_bh, grid_y))


@triton.jit
def program_pair(GRID_Y: tl.constexpr):
    """This program's (batch, head) pair index: axis 1, plus GRID_Y per step of axis 2."""
    return tl.program_id(1) + tl.program_id(2) * GRID_Y


@triton.jit
def query_program(LONGEST_FIRST: tl.constexpr, GRID_Y: tl.constexpr):
    """(query block, (batch, head) pair) of a forward or dq program. LONGEST_FIRST (causal or
    windowed): the grid's blocks in reverse, so that the longest query blocks run first and the
    short ones fill the tail: causal's last ones, and a window's when it reaches further left than
    right, as causal windows do (its first ones are cut at key 0). One reaching further right
    (non-causal, say (left, -1)) gets its short ones first: only its tail is slower, the result is
    the same."""
    start_m = tl.program_id(0)
    if LONGEST_FIRST:
        start_m = tl.num_programs(0) - 1 - start_m
    return start_m, program_pair(GRID_Y)


@triton.jit
def query_sequences(cu_seqlens_q, cu_seqlens_k, bh, n_heads, kv_group, n_queries, n_keys, VARLEN: tl.constexpr):
    """(batch, head, kv_head, q_start, n_queries, k_start, n_keys) of a forward or dq program's
    (batch, head) pair bh < n_bh: its sequence's first query and key tokens and their counts
    (sequence_bounds). batch, head, kv_head and the starts are 64-bit: they multiply strides, and
    batch * stride can pass 2^31."""
    batch = bh // n_heads
    q_start, n_queries = sequence_bounds(cu_seqlens_q, batch, n_queries, VARLEN)
    k_start, n_keys = sequence_bounds(cu_seqlens_k, batch, n_keys, VARLEN)
    batch = batch.to(tl.int64)
    head = (bh % n_heads).to(tl.int64)
    return batch, head, head // kv_group, q_start.to(tl.int64), n_queries, k_start.to(tl.int64), n_keys


@triton.jit
def sequence_bounds(cu_seqlens_ptr, batch, n_dense, VARLEN: tl.constexpr):
    """(first token, length) of sequence `batch`: (0, n_dense) for a dense batch, else read from
    the cumulative lengths (int32, B + 1 of them) on the device."""
    if VARLEN:
        start = tl.load(cu_seqlens_ptr + batch)
        return start, tl.load(cu_seqlens_ptr + batch + 1) - start
    else:
        return tl.full([], 0, tl.int32), n_dense


@triton.jit
def key_range(start_m, n_keys, causal_shift, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(unmasked_end, hi) of query block start_m: keys [0, unmasked_end) are whole blocks every row
    of the block sees (no mask); [unmasked_end, hi) are cut by the causal diagonal or the end of
    the keys (masked); keys past hi are seen by no row."""
    if CAUSAL:
        # keys before the first row's diagonal are visible to every row of the block; keys past
        # the last row's diagonal to none
        first_row_end = tl.minimum(start_m * BLOCK_M + causal_shift + 1, n_keys)
        unmasked_end = tl.maximum(first_row_end, 0) // BLOCK_N * BLOCK_N
        hi = tl.maximum(tl.minimum((start_m + 1) * BLOCK_M + causal_shift, n_keys), 0)
    else:
        unmasked_end = n_keys // BLOCK_N * BLOCK_N
        hi = n_keys
    return unmasked_end, hi


@triton.jit
def window_key_range(start_m, n_keys, causal_shift, window_left, window_right,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """key_range under a sliding window: (lo, unmasked_lo, unmasked_hi, hi) of query block
    start_m. Keys [unmasked_lo, unmasked_hi) are whole blocks inside every row's window (no mask);
    [lo, unmasked_lo) and [unmasked_hi, hi) are cut by some row's window or by the end of the keys
    (masked); keys outside [lo, hi) are in no row's window and never visited. lo, unmasked_lo and
    unmasked_hi are multiples of BLOCK_N, or hi (the masked loops step from them)."""
    first = start_m * BLOCK_M + causal_shift  # i' of the block's first and last rows
    last = first + BLOCK_M - 1
    lo = tl.maximum(first - window_left, 0) // BLOCK_N * BLOCK_N
    hi = tl.maximum(tl.minimum(last + window_right + 1, n_keys), 0)
    # every row sees keys [last - left, first + right]
    unmasked_lo = tl.cdiv(tl.maximum(last - window_left, 0), BLOCK_N) * BLOCK_N
    unmasked_hi = tl.maximum(tl.minimum(first + window_right + 1, n_keys), 0) // BLOCK_N * BLOCK_N
    unmasked_lo = tl.minimum(tl.maximum(unmasked_lo, lo), hi)
    unmasked_hi = tl.minimum(tl.maximum(unmasked_hi, unmasked_lo), hi)
    return lo, unmasked_lo, unmasked_hi, hi


@triton.jit
def key_blocks(start_m, n_keys, causal_shift, window_left, window_right, CAUSAL: tl.constexpr,
               WINDOW: tl.constexpr, WINDOW_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, unmasked_lo, unmasked_hi, hi) of query block start_m, for the forward and the dq kernel:
    keys [unmasked_lo, unmasked_hi) are whole blocks every row sees (no mask), [lo, unmasked_lo) and
    [unmasked_hi, hi) are masked, keys outside [lo, hi) are seen by no row. A window's
    (window_key_range; without WINDOW_SPLIT every block masked, in the lead); else key_range's,
    with no lead (lo = unmasked_lo = 0)."""
    if WINDOW:
        lo, unmasked_lo, unmasked_hi, hi = window_key_range(start_m, n_keys, causal_shift, window_left,
                                                            window_right, BLOCK_M, BLOCK_N)
        if not WINDOW_SPLIT:  # window_split's alternative: every block in the lead
            unmasked_lo = hi
            unmasked_hi = hi
    else:
        unmasked_hi, hi = key_range(start_m, n_keys, causal_shift, CAUSAL, BLOCK_M, BLOCK_N)
        lo = 0
        unmasked_lo = 0
    return lo, unmasked_lo, unmasked_hi, hi


@triton.jit
def _flash_attention_fwd_kernel(
    # pointers: lse (STORE_LSE, else None); cu_seqlens_q/k (VARLEN, else None)
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_seqlens_q, cu_seqlens_k,
    # strides (in elements) of q, k, v, o as (batch, head, token, dim), and of lse as (batch, head)
    # with unit token stride; a packed (VARLEN) batch passes 0 for the batch strides
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh,
    # sizes: n_queries, n_keys are the dense lengths (unused when VARLEN); n_bh (batch, head) pairs
    n_heads, kv_group, n_queries, n_keys, qk_scale, n_bh,
    # the window's bounds (WINDOW, else unused) and c * log2(e) (SOFTCAP, else unused)
    window_left, window_right, softcap_log2,
    # meta-parameters
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, STORE_LSE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GRID_Y: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW_SPLIT: tl.constexpr,
):
    start_m, bh = query_program(CAUSAL or WINDOW, GRID_Y)
    if bh >= n_bh:
        return
    batch, head, kv_head, q_start, n_queries, k_start, n_keys = query_sequences(
        cu_seqlens_q, cu_seqlens_k, bh, n_heads, kv_group, n_queries, n_keys, VARLEN)
    if VARLEN:
        if start_m * BLOCK_M >= n_queries:  # a packed sequence shorter than the grid's longest
            return
    q_base = q_ptr + batch * stride_qb + head * stride_qh + q_start * stride_qm
    k_base = k_ptr + batch * stride_kb + kv_head * stride_kh + k_start * stride_kn
    v_base = v_ptr + batch * stride_vb + kv_head * stride_vh + k_start * stride_vn
    o_base = o_ptr + batch * stride_ob + head * stride_oh + q_start * stride_om

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m < n_queries)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    causal_shift = n_keys - n_queries  # query i sees keys j <= i + causal_shift
    # masked lead (a window's left edge), unmasked middle, masked tail: keys outside [lo, hi) skipped
    lo, unmasked_lo, unmasked_hi, hi = key_blocks(start_m, n_keys, causal_shift, window_left, window_right,
                                                  CAUSAL, WINDOW, WINDOW_SPLIT, BLOCK_M, BLOCK_N)
    DIAGONAL: tl.constexpr = CAUSAL and not WINDOW  # a window's mask holds the causal bound itself
    if WINDOW:
        acc, l_i, m_i = _attend_key_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, offs_d, lo, unmasked_lo, n_keys, causal_shift, qk_scale, window_left, window_right,
            softcap_log2, True, DIAGONAL, HEAD_DIM, BLOCK_D, BLOCK_N, WINDOW, SOFTCAP)
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, unmasked_lo, unmasked_hi, n_keys, causal_shift, qk_scale, window_left, window_right,
        softcap_log2, False, DIAGONAL, HEAD_DIM, BLOCK_D, BLOCK_N, WINDOW, SOFTCAP)
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, unmasked_hi, hi, n_keys, causal_shift, qk_scale, window_left, window_right,
        softcap_log2, True, DIAGONAL, HEAD_DIM, BLOCK_D, BLOCK_N, WINDOW, SOFTCAP)

    # a row with no visible key has l = 0 and acc = 0: dividing by 1 gives the zeros of the convention
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=q_mask)
    if STORE_LSE:
        # m and log2(l) are in units of scaled log2: LSE = (m + log2(l)) * ln(2); -inf where l = 0
        seen = l_i > 0.0
        lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
        lse_base = lse_ptr + batch * stride_lb + head * stride_lh + q_start
        tl.store(lse_base + offs_m, lse, mask=offs_m < n_queries)


def kernel_mask(causal, mask, n_queries, n_keys):
    """(CAUSAL, WINDOW, left, right) the kernels take for `causal` and mask's window (an
    AttentionMask: left, right, -1 an unbounded side), on sequences of at most n_queries queries
    and n_keys keys. causal caps right at 0. A side that reaches past every key is unbounded
    (left >= n_keys, right >= n_queries: i' runs over [n_keys - n_queries, n_keys - 1]); a window
    bounded on neither side is no window, and one bounded only by right = 0 is the causal mask,
    whose loop is today's. The bounds of a window come back finite, at most n_keys and n_queries."""
    left, right = mask.window_left, mask.window_right
    if causal:
        right = 0
    left = n_keys if left < 0 or left >= n_keys else left
    right = n_queries if right < 0 or right >= n_queries else right
    if left == n_keys and right == n_queries:
        return False, False, 0, 0
    if left == n_keys and right == 0:
        return True, False, 0, 0
    return False, True, left, right


def launch_flash_attention(q, k, v, out, causal, scale, lse=None, cu_seqlens=None, config=None,
                           grid_y=MAX_GRID_Y, mask=NO_MASK, window_split=True):
    """Launch on validated arguments; writes out and, when given, lse.
    q, out (B, H, Tq, D); k, v (B, Hkv, Tk, D), any strides, Tq >= 1. lse: None or fp32 (B, H, Tq)
    with unit token stride. scale: sm_scale as a float.
    cu_seqlens: None, or (cu_seqlens_q, cu_seqlens_k, max_seqlen_q) for a packed batch: then B = 1,
    the tensors are the (1, H, total, D) views of (total, H, D) ones, lse is (1, H, total_q), and
    the grid covers len(cu_seqlens_q) - 1 sequences of at most max_seqlen_q queries.
    config: (BLOCK_M, BLOCK_N, num_warps, num_stages) to launch instead of attention_config's
    choice (tests force each CONFIG_TABLE row; tuning sweeps). grid_y: the grid's y extent
    (MAX_GRID_Y; a test passes a small one to run the axis-2 spill on small shapes).
    mask: the checked window and softcap (attention_checks.AttentionMask; kernel_mask reads the
    window, softcap_scales the cap).
    window_split: a window's key loop split into masked edges and an unmasked middle (the default);
    False runs one loop with every block masked (tests and scripts/tune/attention_options_sweep.py)."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    cu_q = cu_k = None
    batch_strides = [q.stride(0), k.stride(0), v.stride(0), out.stride(0)]
    if cu_seqlens is not None:
        cu_q, cu_k, tq = cu_seqlens
        b = cu_q.shape[0] - 1
        batch_strides = [0, 0, 0, 0]
    # a packed batch's totals bound each of its sequences
    causal, has_window, left, right = kernel_mask(causal, mask, q.shape[2], k.shape[2])
    block_m, block_n, num_warps, num_stages = config or attention_config(d, tq, has_window)
    lse_strides = (0 if cu_q is not None else lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
    qk_scale, softcap_log2, has_softcap = softcap_scales(scale, mask.softcap)
    _flash_attention_fwd_kernel[attention_grid(cdiv(tq, block_m), b * h, grid_y)](
        q, k, v, out, lse, cu_q, cu_k,
        batch_strides[0], *q.stride()[1:], batch_strides[1], *k.stride()[1:],
        batch_strides[2], *v.stride()[1:], batch_strides[3], *out.stride()[1:], *lse_strides,
        h, h // hkv, tq, tk, qk_scale, b * h, left, right, softcap_log2,
        CAUSAL=causal, VARLEN=cu_q is not None, STORE_LSE=lse is not None,
        HEAD_DIM=d, BLOCK_D=max(16, next_power_of_2(d)), BLOCK_M=block_m, BLOCK_N=block_n, GRID_Y=grid_y,
        WINDOW=has_window, SOFTCAP=has_softcap, WINDOW_SPLIT=window_split, num_warps=num_warps,
        num_stages=num_stages,
    )
