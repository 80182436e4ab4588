"""FlashAttention forward in Triton: softmax(q k^T * sm_scale) v without the T x T matrix.

One program owns BLOCK_M query rows of one (batch, head). It keeps those rows of q in registers
and streams the head's keys and values in blocks of BLOCK_N, with the online softmax of
attention/blocked_attention.py: a running max m and sum l per row, and the output accumulator
rescaled by exp(m_old - m_new) whenever the max grows. Scores live in registers only, so memory
holds O(T * D) per head instead of O(T^2), and q k^T and p v run on the tensor cores with fp32
accumulation (p is rounded to the input dtype for the second product, as FlashAttention does).

FLOPs: 4 * B * H * Tq * Tk * D for full attention (two matmuls of 2 * Tq * Tk * D each); causal
does the visible pairs only. Per program the key loop runs in two parts: key blocks every row of
the block sees run with no mask; the blocks cut by the causal diagonal or by the end of the keys
run masked. exp2 replaces exp with log2(e) folded into the scale (one multiply saved per score).

Conventions are those of attention/naive_attention.py: GQA by `h // (H // Hkv)`, causal aligned to
the bottom right when Tq != Tk, zeros for a query that sees no key.
"""
import math

import common  # noqa: F401  (interpreter switch before triton is imported)
import torch
import triton
import triton.language as tl

from common.device import INTERPRET
from common.ints import cdiv, next_power_of_2
from common.ops import define_ops
from common.triton_utils import LOG2E
from common.validation import check_same_device, check_tensor

MAX_HEAD_DIM = 256

# (largest head dim, longest Tq, BLOCK_M, BLOCK_N, num_warps, num_stages): the first row that
# fits wins. BLOCK_M rows of q and an fp32 accumulator of the same size live in registers; each
# pipeline stage holds a K and a V block in shared memory (2 * BLOCK_N * BLOCK_D * 2 bytes).
# Measured by scripts/tune/attention_sweep.py on an H200 (fp16, full and causal); the figures and
# the configs that lost are in docs/tuning/attention.md.
CONFIG_TABLE = [
    (64, None, 128, 64, 8, 3),    # small heads: a tall q block; 8 warps beat 4
    (128, 1024, 64, 64, 4, 3),    # short sequences: half-height q blocks make twice the programs
    (128, None, 128, 64, 8, 3),   # long sequences: 8 warps (4 lost 40%); 4 stages no better
    (256, None, 128, 64, 8, 2),   # wide heads: a stage is 64 KB of K and V, two fit; 64 x 32 lost
]
# The interpreter runs tl.dot in numpy: small blocks keep CPU tests quick and give short sequences
# several blocks, so the masked and unmasked loops and the causal diagonal are all exercised.
# The tests force every CONFIG_TABLE row as well (attention/test_flash_attention.py).
INTERPRET_CONFIG = (16, 16, 1, 1)


def table_config(head_dim, n_queries):
    """CONFIG_TABLE's (BLOCK_M, BLOCK_N, num_warps, num_stages) for a head dim of at most
    MAX_HEAD_DIM and n_queries queries: the GPU's choice, in either lane."""
    for max_dim, max_tq, *config in CONFIG_TABLE:
        if head_dim <= max_dim and (max_tq is None or n_queries <= max_tq):
            return tuple(config)
    raise ValueError(f"head dim {head_dim} has no config")  # unreachable past check_attention_args


def attention_config(head_dim, n_queries):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) to launch: INTERPRET_CONFIG in the interpreter."""
    return INTERPRET_CONFIG if INTERPRET else table_config(head_dim, n_queries)


@triton.jit
def _attend_key_blocks(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    offs_m, offs_d, lo, hi, n_keys, causal_shift, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Fold keys [lo, hi) into (acc, l_i, m_i). MASKED blocks check the causal diagonal and the
    end of the keys; the others are wholly visible to every row of the block."""
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
        if MASKED:
            visible = (keys < n_keys)[None, :]
            if CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None] + causal_shift)
            qk = tl.where(visible, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # a row that has seen no key yet keeps m = -inf: subtract 0 so -inf - -inf is not NaN
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(qk - m_safe[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # qk_scale > 0: max commutes
            m_safe = m_new
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_attention_fwd_kernel(
    # pointers
    q_ptr, k_ptr, v_ptr, o_ptr,
    # strides (in elements) of q, k, v, o as (batch, head, token, dim)
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    # sizes
    n_heads, kv_group, n_queries, n_keys, qk_scale,
    # meta-parameters
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks see the most keys: start them first, the short ones fill the tail
        start_m = tl.num_programs(0) - 1 - start_m
    bh = tl.program_id(1)
    batch = (bh // n_heads).to(tl.int64)  # 64-bit: batch * stride can pass 2^31
    head = (bh % n_heads).to(tl.int64)
    kv_head = head // kv_group
    q_base = q_ptr + batch * stride_qb + head * stride_qh
    k_base = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_base = v_ptr + batch * stride_vb + kv_head * stride_vh
    o_base = o_ptr + batch * stride_ob + head * stride_oh

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_mask = (offs_m < n_queries)[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    causal_shift = n_keys - n_queries  # query i sees keys j <= i + causal_shift
    if CAUSAL:
        # keys before the first row's diagonal are visible to every row of the block; keys past
        # the last row's diagonal to none
        first_row_end = tl.minimum(start_m * BLOCK_M + causal_shift + 1, n_keys)
        unmasked_end = tl.maximum(first_row_end, 0) // BLOCK_N * BLOCK_N
        hi = tl.maximum(tl.minimum((start_m + 1) * BLOCK_M + causal_shift, n_keys), 0)
    else:
        unmasked_end = n_keys // BLOCK_N * BLOCK_N
        hi = n_keys
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, 0, unmasked_end, n_keys, causal_shift, qk_scale,
        False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N)
    acc, l_i, m_i = _attend_key_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, unmasked_end, hi, n_keys, causal_shift, qk_scale,
        True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N)

    # a row with no visible key has l = 0 and acc = 0: dividing by 1 gives the zeros of the convention
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=q_mask)


def check_attention_args(q, k, v, sm_scale):
    """Validate before launch; returns (B, H, Hkv, Tq, Tk, D)."""
    dtypes = (torch.float16, torch.bfloat16)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dtypes, min_dim=4)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, tokens, head_dim), got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        check_same_device(name, t, "q", q)
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k must be (B={b}, Hkv, Tk, D={d}) to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if d > MAX_HEAD_DIM or d < 1:
        raise ValueError(f"head_dim (last dim of q) must be 1..{MAX_HEAD_DIM}, got {d}")
    if hkv < 1 or h % hkv:
        raise ValueError(f"q's head count {h} must be a multiple of k's head count {hkv} (MHA, GQA or MQA)")
    if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and sm_scale > 0 and math.isfinite(sm_scale)):
        raise ValueError(f"sm_scale must be a positive finite number or None, got {sm_scale!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        # batch and head offsets are 64-bit in the kernel; offsets inside one head are 32-bit
        span = sum((s - 1) * abs(st) for s, st in zip(t.shape[2:], t.stride()[2:]))
        if span >= 2 ** 31:
            raise ValueError(f"{name}: one head spans {span} elements; the kernel indexes within a head "
                             "with 32-bit offsets (at most 2^31 - 1)")
    return b, h, hkv, tq, tk, d


def check_config(config):
    """A forced launch config must be (BLOCK_M, BLOCK_N, num_warps, num_stages), positive ints, the
    blocks powers of two of at least 16 (tl.dot's smallest tile)."""
    if not (isinstance(config, tuple) and len(config) == 4 and all(isinstance(c, int) and c > 0 for c in config)):
        raise ValueError(f"config must be a (BLOCK_M, BLOCK_N, num_warps, num_stages) tuple of positive ints, "
                         f"got {config!r}")
    for name, block in zip(("BLOCK_M", "BLOCK_N"), config[:2]):
        if block < 16 or block & (block - 1):
            raise ValueError(f"config's {name} must be a power of two >= 16, got {block}")


def launch_flash_attention(q, k, v, out, causal, scale, config=None):
    """Launch on validated arguments (shapes as in flash_attention, Tk >= 1, out non-empty); writes
    out. scale: sm_scale as a float. config: (BLOCK_M, BLOCK_N, num_warps, num_stages) to launch
    instead of attention_config's choice (tests force each CONFIG_TABLE row; tuning sweeps)."""
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    block_m, block_n, num_warps, num_stages = config or attention_config(d, tq)
    grid = (cdiv(tq, block_m), b * h)
    _flash_attention_fwd_kernel[grid](
        q, k, v, out,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        h, h // hkv, tq, tk, scale * LOG2E.value,
        CAUSAL=bool(causal), HEAD_DIM=d, BLOCK_D=max(16, next_power_of_2(d)),
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, num_stages=num_stages,
    )


def _attend_into(q, k, v, causal, sm_scale, config, out):
    """O into out for checked arguments: the empty cases here, the kernel for the rest."""
    if out.numel() == 0:
        return
    if k.shape[2] == 0:  # no keys: every query sees nothing
        out.zero_()
        return
    scale = 1.0 / math.sqrt(q.shape[3]) if sm_scale is None else sm_scale
    launch_flash_attention(q, k, v, out, causal, scale, None if config is None else tuple(config))


flash_attention_op, flash_attention_out_op = define_ops(
    "flash_attention", "Tensor q, Tensor k, Tensor v, bool causal, float? sm_scale, int[]? config",
    lambda q, k, v, causal, sm_scale, config: torch.empty_like(q),  # laid out like a dense q
    _attend_into)


def flash_attention(q, k, v, causal=False, sm_scale=None, out=None, *, config=None):
    """Attention forward, fused (operators llmk::flash_attention and llmk::flash_attention_out).

    q: (B, H, Tq, D); k, v: (B, Hkv, Tk, D); fp16 or bf16, one dtype; H a multiple of Hkv; D up to
    256 (not a power of two: padded to one in registers and masked). Any strides: a (B, T, H, D)
    tensor passed as `.transpose(1, 2)` is read in place. causal (a bool) aligns the mask to the
    bottom right. sm_scale defaults to 1/sqrt(D).
    out: optional (B, H, Tq, D) buffer of q's dtype, any strides.
    config: optional (BLOCK_M, BLOCK_N, num_warps, num_stages) to launch instead of the table's
    choice (tests and tuning sweeps); it travels to the operator as its `int[]? config`.
    Returns O (B, H, Tq, D) in q's dtype (out itself when given), laid out like q when q is dense
    (so a transposed (B, T, H, D) q gives an O that is a (B, T, H, D) tensor viewed the same way).
    """
    check_attention_args(q, k, v, sm_scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if config is not None:
        check_config(config)
        config = list(config)
    if sm_scale is not None:
        sm_scale = float(sm_scale)
    if out is None:
        return flash_attention_op(q, k, v, causal, sm_scale, config)
    if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must be a tensor of q's shape {tuple(q.shape)}, dtype {q.dtype} and device "
                         f"{q.device}; got {out if not isinstance(out, torch.Tensor) else (tuple(out.shape), out.dtype, out.device)}")
    flash_attention_out_op(q, k, v, causal, sm_scale, config, out)
    return out
