"""Decode attention in Triton: one new query token per sequence against its KV cache.

    O[b, h] = softmax_t(q[b, h] . k[b, t, h // G] * sm_scale) @ v[b, t, h // G]   over t < lengths[b]

(G = H / Hkv query heads share one kv head; the reference is inference/reference_decode_attention.py.)

Decode is a stream over the cache: each K and V value is read once and used for G multiply-adds,
so the kernel is memory-bound and its figure of merit is bytes of K and V read per second,
2 * sum(lengths) * Hkv * D * e (e = 2 bytes), against the device's copy bandwidth.

One program owns one (sequence, kv head) and all G query heads of that kv head, so a K/V block is
read from memory once per group, not once per query head. It streams the sequence's tokens in
blocks of BLOCK_N with the online softmax of attention/flash_attention_ops.py (running max m and
sum l per query head in fp32, exp2 with log2(e) folded into the scale). Both products of a block,
q k^T and p v, are tl.dot of the group padded to 16 rows (the MMA's smallest M) against the K/V
block: the padding costs FLOPs only, and at 16 FLOPs per KV byte even with G = 1 the tensor cores
are far from busy. What decides is the loads: feeding a dot, they are staged through shared memory
by cp.async, num_stages deep, so the next blocks stream in while one is computed on (compiled for
sm_90 with 4 warps: no spills over hd 64-256 and G 1-32). The G == 1 alternative, a broadcast
multiply and sum over D in registers (no padding, no shared memory), has no such staging; it stays
selectable (DecodeConfig.use_dot).
The last, partial block of a range runs masked; the others run without masks.

Split-KV (flash-decoding): B * Hkv programs cannot fill the GPU at small batch (8 programs for 132
SMs at B1 H32/8), so each sequence is cut into num_splits ranges, one program each. Those write
their partial (m, l, acc) in fp32, and a second, small kernel merges the splits of each query head:
    M = max_s m_s,  w_s = exp2(m_s - M),  O = sum_s w_s * acc_s / sum_s w_s * l_s
(extra traffic B * H * splits * (D + 2) * 4 bytes written and read: under 1% of the cache at the
shapes that split). The unsplit path writes O directly.

Paged caches map a token to (page, slot) through a block table, page = block_table[b, t // PAGE_SIZE],
slot = t % PAGE_SIZE; everything else is the same kernel (PAGED constexpr). The loop loads the next
block's page ids while it works on the current block, so a K/V load never waits on a table load
(2-9% at B1 on an H100, docs/tuning/inference.md).

Sliding window (WINDOW, Mistral's and Gemma's sliding layers): the query, the sequence's last token,
sees its window's last left + 1 tokens only, so the range starts at max(length - 1 - left, 0) and the
bytes read are the window's (the splits cut that range). Logit softcapping (SOFTCAP, Gemma 2): the
scores s = q k^T * sm_scale become c * tanh(s / c); qk_scale is then sm_scale / c, tanh's argument,
and softcap_log2 = c * log2(e) takes the capped score to exp2's units.

Head dims: any D in 1..256, in one or two power-of-two parts (head_dim_parts). hd 64, 128 and 256
are one tile exactly D wide. A dim between two powers of two runs as the lower one and a second,
narrower part where the two are narrower than one padded tile: hd 80 and 96 = 64 + 32, hd 160 =
128 + 32, hd 192 = 128 + 64; the scores sum two dots and the output keeps two accumulators. A
block then does about the work of its D columns, where one 128-wide tile ran hd 128's instructions
for 5/8 (hd 80) or 3/4 (hd 96) of its bytes. That pays on grids of at most PARTS_MAX_WAVES (2)
programs an SM, where each program's chain of blocks is the time; on larger grids the padded tile
is as fast or faster, and decode_config keeps it (DecodeConfig.head_parts, docs/tuning/inference.md).
Any other dim runs one tile BLOCK_D = max(16, next power of two >= D) wide (one_tile; 112: 128).
Columns past D (hd 80's last 16 of 64 + 32, 112's last 16) are masked on every load and store (a
constexpr per part), so every head dim reads D columns only.

e4m3 caches (KV_SCALED; inference/kv_cache.py's KVCache(dtype=torch.float8_e4m3fn) and the paged
one): K and V hold one byte a value and an fp32 scale a (token, kv head). Bytes read a token and kv
head: 2 * (D + 4) instead of 2 * 2 * D. Half the bytes leave the kernel's instructions as the
limit, so the scales stay off the [BLOCK_N, D] tiles: every e4m3 value is exact in fp16 (one
conversion a pair of bytes), and the products run in fp16 whatever q's dtype, with each scale
applied where it costs a row, not a tile:
- q K^T: q is multiplied by a power of two that puts its largest value in [2^14, 2^15) (FP16_TOP:
  exact) and rounded to fp16 (exact for a bf16 q down to 2^-28 of its largest, fp16's 10 bits
  holding bf16's 7); a block's scores are multiplied by their tokens' K scales, and by the power
  of two's inverse in qk_scale.
- p V: p (<= 1) times its tokens' V scales times FP16_TOP over the block's largest V scale, in
  fp16 (rounded as a 16-bit cache's p is, relative 2^-11, down to 2^-28 of the block's largest
  weight, where the weights of a block span its scales' range times p's), and the product times
  that largest scale over FP16_TOP in fp32.
A token-major e4m3 V's bytes are gathered one at a time for p V: the operand pair a thread
multiplies is two tokens, D bytes apart, and ldmatrix moves 16-bit pairs. KVCache and PagedKVCache
store an e4m3 v token-minor (inference/kv_cache.py's token_minor: stride 1 along T, which Triton
specializes on), where the pair is adjacent and V loads as K does; any strides still work. The
loop's instructions a block at hd 128 (PTX, sm_90): 1559 with the tiles dequantized (an fp32
multiply a value and two conversions), 872 with the fp16 products, 679 with v token-minor (all
at two stages; E4M3_BLOCK_TABLE's three take 734). The GPU times are in
docs/tuning/inference.md. A window's first token is not a whole block's, so a window's
token-minor v loads byte by byte (correct, slower).

Limits: head dim 1..256; q fp16 or bf16, the cache q's dtype or e4m3 with scales; lengths are read
on the device (no host sync) and clamped to [0, T_max] (or to the block table's span), so a bad
length cannot read out of bounds. The interpreter reads e4m3's NaN byte as 480: an e4m3 cache
holds no NaN there (its values come from finite K and V).
"""
import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llmk.attention.attention_checks import check_softcap, check_window
from llmk.common.device import INTERPRET, sm_count
from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.ops import define_ops, forward_only_error, needs_grad
from llmk.common.triton_utils import softcap_scales, tanh
from llmk.common.validation import check_out, check_same_device, check_tensor
from llmk.common.workspace import split_k_buffers

MAX_HEAD_DIM = 256
FP8 = torch.float8_e4m3fn  # an e4m3 cache's values (with a scale a token and kv head)
HEAD_DIMS = range(1, MAX_HEAD_DIM + 1)  # every head dim the kernels take

# ---------------------------------------------------------------------------------------------
# Heuristics.
# Blocks, by head dim: (largest head dim, BLOCK_N, num_warps, num_stages). Every row loads a K and
# a V block of BLOCK_N * D = 8192 values (16 KB each in fp16): large enough for full 128-byte
# transactions and many loads in flight, small enough that the G == 1 broadcast product
# (BLOCK_N x D fp32) stays at 64 values a thread with 4 warps. Three stages keep two K/V block
# pairs in flight while one is computed on: 72 KB of shared memory, three programs an SM.
# Any other head dim takes the first row whose head dim is at least D (hd 32 the 64 row, hd 80 and 96
# the 128 row, hd 129-255 the 256 row): its tiles are at most that wide, so the row's footprint is an
# upper bound, while a block reads BLOCK_N * D * e bytes (hd 80: 10 KB of K a block against hd 128's
# 16 KB).
BLOCK_TABLE = [
    (64, 128, 4, 3),
    (128, 64, 4, 3),
    (256, 32, 4, 3),
]
# The paged kernel's own blocks (paged_blocks), with fewer programs than SMs; with one program an
# SM or more, split or not, it runs the contiguous kernel's blocks (halved blocks lost there).
# Measured by scripts/tune/decode_configs.py (and its `waves` sweep) on an H100, hd 128, 16-token
# pages; docs/tuning/inference.md has the figures.
# A split of several blocks runs blocks of half the tokens, down to PAGED_SPLIT_MIN_BLOCK_N: more
# blocks a program, a deeper pipeline.
PAGED_SPLIT_MIN_BLOCK_N = 32
# A split of one block keeps the full block with two stages: no loads needed ahead of it, and one
# K/V block pair in shared memory instead of two fits more programs an SM.
PAGED_ONE_BLOCK_STAGES = 2
# Unsplit, from PAGED_LONG_TOKENS on, one program has to keep an SM's loads in flight by itself:
# twice the tokens a block with twice the warps. Shorter, the larger block's start costs what it saves.
PAGED_LONG_TOKENS = 2048
# The interpreter runs every op in numpy: small blocks keep the CPU tests quick and give short
# sequences several blocks, so the unmasked loop, the masked tail and split boundaries all run.
INTERPRET_BLOCK = (16, 1, 1)
# G == 1 (MHA) takes tl.dot too (see the module docstring); False selects the broadcast product.
# Groups of two or more always take tl.dot: a broadcast [G, BLOCK_N, D] fp32 product spills (G = 4,
# hd 128, BLOCK_N 64: 255 registers and 1.5 KB of stack a thread).
MHA_USE_DOT = True

# Split-KV, from the shapes: B * Hkv programs a split, n_sms SMs, the longest sequence T.
#   (B * Hkv below this many per SM, split to this many programs per SM, the same for a paged
#    cache, tokens per split at least)
# The first row that applies sets num_splits = min(floor(target * n_sms / (B * Hkv)),
# T // max(min_tokens, BLOCK_N), MAX_SPLITS), at least 1; at or past the last row the sequence is
# not split. Measured in GPU time by scripts/tune/small_shapes.py split and
# scripts/tune/decode_configs.py on an H100 (H32 hd128 fp16; the last row on an H200);
# docs/tuning/inference.md has the figures. Contiguous, with fewer programs than SMs, one program
# an SM is best; paged, whose K/V addresses wait on block-table loads, two where there are few.
# The table counts programs and tokens, not bytes: every head dim splits (B, Hkv, T) as its
# BLOCK_TABLE row's own dim does (hd 80 and 96 as hd 128), a program's share of the cache in bytes
# scaling with D.
SPLIT_TABLE = [
    (1 / 2, 1, 2, 64),  # under half a program an SM (B1..B8 at Hkv 8, B1..B2 at Hkv 32): one
                        # contiguous or two paged programs an SM, down to one block a program
    (1, 1, 1, 64),      # half a program an SM up to one: one program an SM (no split past
                        # n_sms / 2 programs, where a target of one rounds down to 1)
    (4, 16, 16, 512),   # one to four programs an SM: finer splits even out the last wave
]
# Head dims in parts (head_dim_parts): a D between two powers of two runs as the lower power and a
# second part, its remainder rounded up to a power of two of at least MIN_PART, where the two together
# are narrower than the one padded tile (hd 80 and 96: 64 + 32 against 128). The second part is a
# second dot into the scores and a second accumulator: fewer columns loaded, multiplied and stored a
# block. MIN_PART is 32, not tl.dot's 16, and the second part must be wider than the padded group:
# Triton lays out a chain of dots (q k^T, then p v) with the warps of one dot's shape, and a p v whose
# N is no more than its M (the group's rows) puts the warps along M, where 16 or 32 rows give each of
# 4 warps the same rows: hd 80 as 64 + 16 ran 2.5x hd 128's mma instructions and 194 registers
# (ptxas for sm_90 on Triton 3.9), 64 + 32 runs 0.75x and 107.
# Where: grids of at most PARTS_MAX_WAVES programs an SM (B * Hkv * splits; the small-batch split
# rows give one, or two paged). There each program's chain of blocks is the time, and the shorter
# steps gain 3-12% at hd 80 and 96 (B1, B16 at Hkv 8 on an H200). On larger grids the reads' pattern
# is the limit and two parts cost 4-7% (B64), so one padded tile stays there.
# scripts/tune/decode_head_dims.py measures both; docs/tuning/inference.md has the figures.
PARTS_MAX_WAVES = 2
MIN_PART = 32
# e4m3 caches (KV_SCALED): a value is one byte, so a block of twice the tokens moves the 16-bit
# block's bytes, and a program its share in half the time. (smallest head dim, largest head dim,
# BLOCK_N, num_warps, num_stages, num_stages for a group of one), both kernels; split targets as
# SPLIT_TABLE's (twice the programs an SM under one an SM, a quarter from one to four). Measured on
# the H200 with the fp16 products and a token-minor v (scripts/tune/decode_configs.py e4m3, hd 128
# and hd=96; docs/tuning/inference.md): three stages beat two at every GQA shape swept (3-21%)
# (B16 x Hkv 8 x T 8192: 75 against 89 us, 1.71x the 16-bit cache's 129), two stages win for MHA
# (group 1, whose padded product does 16 rows of work for one: B16 x Hkv 32 at 343 against 360 us).
# hd 96 picks as hd 128 (0.75x the 16-bit cache with BLOCK_TABLE's 64-token blocks, 1.1-1.8x
# with these); hd 80, between them in bytes and parts, takes the row unswept.
E4M3_BLOCK_TABLE = [
    (65, 128, 128, 4, 3, 2),
]
E4M3_SPLIT_TABLE = [
    (1 / 2, 2, 2, 64),
    (1, 2, 2, 64),
    (4, 4, 4, 512),
]
# the e4m3 products' fp16 operands (module docstring) are scaled so that their largest is in
# [2^14, 2^15): fp16's normal range then reaches 2^-28 of it, and 65504 is fp16's largest
FP16_TOP = tl.constexpr(16384.0)
# and the block's largest V scale they divide by is at least 2^-64: acc, rescaled into its units for
# the product, then stays below fp32's largest unless |V| passes 2^50 beside a block that small
V_SCALE_FLOOR = tl.constexpr(2.0 ** -64)
MAX_SPLITS = 64  # the merge kernel holds one head's partials as a [MAX_SPLITS, one_tile(D)] tile
INTERPRET_SMS = 2  # the interpreter has no SMs: 2 keeps its split grids small; the tests force splits
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeConfig:
    BLOCK_N: int      # tokens a block
    num_warps: int
    num_stages: int
    use_dot: bool     # tl.dot on the padded group (True) or broadcast multiply-sum (False: G == 1 only)
    num_splits: int   # programs a (sequence, kv head); 1 is the unsplit path
    head_parts: bool = True  # the head dim in two parts where head_dim_parts splits it (else one tile)


def one_tile(head_dim):
    """The width of one tile over the head dim: max(16, next power of two >= D), 16 being tl.dot's
    smallest K (q k^T) and N (p v)."""
    return max(16, next_power_of_2(head_dim))


def head_dim_parts(head_dim, group_pad=16):
    """(BLOCK_D, BLOCK_D2): the widths of the head dim's first tile and of its second (0: none), for a
    group padded to group_pad rows. hd 80 and 96 -> (64, 32), 160 -> (128, 32), 72 -> (64, 32) with 24
    columns masked, 112 -> (128, 0); at group_pad 32, hd 80 -> (128, 0), 192 -> (128, 64)."""
    whole = one_tile(head_dim)
    low = whole // 2
    if head_dim <= low:
        return whole, 0
    rest = max(MIN_PART, next_power_of_2(head_dim - low))
    return (low, rest) if low + rest < whole and rest > group_pad else (whole, 0)


def split_count(n_programs, max_length, n_sms, block_n, paged=False, table=SPLIT_TABLE):
    """num_splits for n_programs = B * Hkv programs over sequences of at most max_length tokens, by
    `table` (SPLIT_TABLE, or E4M3_SPLIT_TABLE)."""
    for below_per_sm, target_per_sm, paged_target_per_sm, min_tokens in table:
        if n_programs < below_per_sm * n_sms:
            by_sms = int((paged_target_per_sm if paged else target_per_sm) * n_sms / max(n_programs, 1))
            by_length = max_length // max(min_tokens, block_n)
            return max(1, min(by_sms, by_length, MAX_SPLITS))
    return 1


@functools.lru_cache(maxsize=1024)
def decode_config(batch, n_kv_heads, group, head_dim, max_length, n_sms, paged=False, num_splits=None, e4m3=False):
    """Launch parameters for B = batch sequences of at most max_length tokens, Hkv = n_kv_heads,
    G = group query heads a kv head, on a GPU with n_sms SMs; paged: a paged cache; num_splits: a
    split count to use instead of the table's (the paged blocks follow it); e4m3: an e4m3 cache
    (E4M3_BLOCK_TABLE's rows where one takes the head dim)."""
    e4m3_row = None if INTERPRET or not e4m3 else \
        next((row[2:] for row in E4M3_BLOCK_TABLE if row[0] <= head_dim <= row[1]), None)
    if e4m3_row is not None:  # its own blocks for both kernels, and its own split targets
        block_n, num_warps, num_stages, mha_stages = e4m3_row
        num_stages = mha_stages if group == 1 else num_stages
    elif INTERPRET:
        block_n, num_warps, num_stages = INTERPRET_BLOCK
    else:
        block_n, num_warps, num_stages = next(row[1:] for row in BLOCK_TABLE if head_dim <= row[0])
    splits = num_splits or split_count(batch * n_kv_heads, max_length, n_sms, block_n, paged,
                                       SPLIT_TABLE if e4m3_row is None else E4M3_SPLIT_TABLE)
    if paged and e4m3_row is None:
        block_n, num_warps, num_stages = paged_blocks(block_n, num_warps, num_stages, splits, max_length,
                                                      batch * n_kv_heads < n_sms)
    return DecodeConfig(block_n, num_warps, num_stages, group > 1 or MHA_USE_DOT, splits,
                        batch * n_kv_heads * splits <= PARTS_MAX_WAVES * n_sms)


def paged_blocks(block_n, num_warps, num_stages, num_splits, max_length, under_one_per_sm):
    """(BLOCK_N, num_warps, num_stages) of the paged kernel from the contiguous one's, which it keeps
    unless the B * Hkv programs are fewer than the SMs (under_one_per_sm). Then, unsplit: twice the
    block and the warps for sequences of PAGED_LONG_TOKENS or more; split: the full block with
    PAGED_ONE_BLOCK_STAGES where a split is one block, else blocks of half the tokens (down to
    PAGED_SPLIT_MIN_BLOCK_N, never up)."""
    if not under_one_per_sm:
        return block_n, num_warps, num_stages
    if num_splits <= 1:
        if max_length >= PAGED_LONG_TOKENS:
            return 2 * block_n, 2 * num_warps, num_stages
        return block_n, num_warps, num_stages
    if cdiv(max_length, num_splits) <= block_n:
        return block_n, num_warps, PAGED_ONE_BLOCK_STAGES
    return min(block_n, max(PAGED_SPLIT_MIN_BLOCK_N, block_n // 2)), num_warps, num_stages


@triton.jit
def _tile_mask(rows_ok, cols_ok, PAD_D: tl.constexpr):
    """The mask of a [rows, width] tile: rows_ok, and the head dim's columns (cols_ok) where the tile
    runs past D (PAD_D); a tile within D keeps the row mask alone."""
    mask = rows_ok[:, None]
    if PAD_D:
        mask = mask & cols_ok[None, :]
    return mask


@triton.jit
def _load_part(base, rows, rows_ok, stride_d, COL0: tl.constexpr, WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr,
               MASK_ROWS: tl.constexpr):
    """Columns COL0 .. COL0 + WIDTH of the rows at offsets `rows` [R] (elements) from base: [R, WIDTH],
    zeros in the rows not rows_ok (MASK_ROWS) and in the columns past HEAD_DIM; a whole tile within D
    loads with no mask at all."""
    cols = COL0 + tl.arange(0, WIDTH)
    ptrs = base + rows[:, None] + cols[None, :] * stride_d
    PAD_D: tl.constexpr = COL0 + WIDTH > HEAD_DIM
    if MASK_ROWS:
        tile = tl.load(ptrs, mask=_tile_mask(rows_ok, cols < HEAD_DIM, PAD_D), other=0.0)
    elif PAD_D:
        tile = tl.load(ptrs, mask=(cols < HEAD_DIM)[None, :], other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_part(base, rows, rows_ok, stride_d, tile, COL0: tl.constexpr, WIDTH: tl.constexpr,
                HEAD_DIM: tl.constexpr):
    """Store tile [R, WIDTH] to columns COL0 .. COL0 + WIDTH of the rows at offsets `rows` [R] from base,
    in the rows rows_ok and the columns within HEAD_DIM."""
    cols = COL0 + tl.arange(0, WIDTH)
    mask = _tile_mask(rows_ok, cols < HEAD_DIM, COL0 + WIDTH > HEAD_DIM)
    tl.store(base + rows[:, None] + cols[None, :] * stride_d, tile.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _pow2_floor(x):
    """2^floor(log2 x) of a finite fp32 x > 0, read off its exponent bits (exact); 1.0 where x is 0,
    subnormal, inf or NaN (the products then round as they are)."""
    exponent = (x.to(tl.int32, bitcast=True) >> 23) & 0xFF
    exponent = tl.where((exponent == 0) | (exponent == 0xFF), 127, exponent)
    return (exponent << 23).to(tl.float32, bitcast=True)


@triton.jit
def _scores(q, k, qk, USE_DOT: tl.constexpr):
    """qk + q k^T for one head-dim part: q [GROUP_PAD, W], k [BLOCK_N, W] -> [GROUP_PAD, BLOCK_N] fp32
    (USE_DOT: tl.dot on the padded group, k converted to q's dtype (an e4m3 k to fp16 exactly);
    else G == 1, q [1, W] fp32, a [BLOCK_N, W] product summed over W, kept 2-D)."""
    if USE_DOT:
        qk = tl.dot(q, tl.trans(k.to(q.dtype)), qk)
    else:
        qk += tl.sum(q * k.to(tl.float32), 1)[None, :]
    return qk


@triton.jit
def _accumulate(acc, p, v, alpha, v_scale, KV_SCALED: tl.constexpr, USE_DOT: tl.constexpr):
    """acc * alpha + p v for one head-dim part: acc [GROUP_PAD, W] fp32, p [GROUP_PAD, BLOCK_N] fp32,
    v [BLOCK_N, W]. p is rounded to v's dtype for the tensor cores, as FlashAttention does; the
    broadcast product (G == 1) sums p's one row, then [BLOCK_N, W] over the tokens. KV_SCALED: v
    e4m3 with v_scale [BLOCK_N], the product in fp16 with p scaled by v_scale / its largest
    (module docstring)."""
    if KV_SCALED and USE_DOT:
        # floored: acc / unit must stay finite (a block of zero scales adds zeros; the caches'
        # scales are at least 2.2e-15, quantize_fp8's AMAX_FLOOR / 448)
        v_max = tl.maximum(tl.max(v_scale, 0), V_SCALE_FLOOR)
        unit = v_max / FP16_TOP  # acc in units of it for the product, which adds to it in place
        pv = (p * (v_scale / unit)[None, :]).to(tl.float16)
        acc = tl.dot(pv, v.to(tl.float16), acc * (alpha / unit)[:, None]) * unit
    elif USE_DOT:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    else:
        weights = tl.sum(p, 0)  # [BLOCK_N], times each token's V scale for an e4m3 v
        if KV_SCALED:
            weights = weights * v_scale
        acc = acc * alpha[:, None] + tl.sum(weights[:, None] * v.to(tl.float32), 0)[None, :]
    return acc


@triton.jit
def _attend_kv_blocks(
    acc, acc2, l_i, m_i, q, q2,
    k_base, v_base, table_base, ks_base, vs_base,
    stride_kp, stride_kt, stride_kd, stride_vp, stride_vt, stride_vd, stride_sp, stride_st,
    lo, hi, qk_scale, softcap_log2,
    MASKED: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, USE_DOT: tl.constexpr,
    SOFTCAP: tl.constexpr, KV_SCALED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_D2: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Fold tokens [lo, hi) of one sequence and kv head into the group's (acc, acc2, l_i, m_i).

    The head dim runs in two parts where BLOCK_D2 > 0: columns [0, BLOCK_D) in q, acc and
    [BLOCK_D, BLOCK_D + BLOCK_D2) in q2, acc2 (which are unused otherwise).
    q, q2: [GROUP_PAD, width] (the input dtype for tl.dot, fp32 for the broadcast product; zeros past
    D); acc, acc2 [GROUP_PAD, width] and l_i, m_i [GROUP_PAD] fp32, m in log2 units (scores times
    qk_scale = sm_scale * log2(e)). K and V columns past D load as zeros, so they add nothing.
    Unmasked calls get whole blocks; a MASKED call gets the one partial block at the end of a range,
    which holds at least one token, so m stays finite there and needs no -inf guard. SOFTCAP: the
    scores are capped first (module docstring), and are then in exp2's units already. KV_SCALED:
    K and V are e4m3 with a scale a (token, kv head) at ks_base, vs_base (token strides stride_sp,
    stride_st as K's page and token strides), read as fp16 with the scales on the scores and on p
    (module docstring); q, q2 are then fp16, scaled as the kernel's prologue says.
    """
    offs_n = tl.arange(0, BLOCK_N)
    if PAGED:  # the first block's page ids (a token's page is block_table[b, t // PAGE_SIZE])
        first = lo + offs_n
        pages = tl.load(table_base + first // PAGE_SIZE, mask=first < hi, other=0)
    for start in range(lo, hi, BLOCK_N):
        tokens = start + offs_n
        valid = tokens < hi
        if PAGED:  # token -> (page, slot in the page)
            page = pages.to(tl.int64)  # 64-bit: page * stride can pass 2^31 in a large pool
            # the next block's page ids, loaded a block ahead: this block's K/V loads never wait
            # on a block-table load
            upcoming = tokens + BLOCK_N
            pages = tl.load(table_base + upcoming // PAGE_SIZE, mask=upcoming < hi, other=0)
            slot = tokens % PAGE_SIZE
            k_rows = page * stride_kp + slot * stride_kt
            v_rows = page * stride_vp + slot * stride_vt
            s_rows = page * stride_sp + slot * stride_st
        else:
            k_rows = tokens.to(tl.int64) * stride_kt
            v_rows = tokens.to(tl.int64) * stride_vt
            s_rows = tokens.to(tl.int64) * stride_st
        k_scale = qk_scale  # k_scale and v_scale: unused without KV_SCALED
        v_scale = qk_scale
        if KV_SCALED:
            if MASKED:
                k_scale = tl.load(ks_base + s_rows, mask=valid, other=0.0)
                v_scale = tl.load(vs_base + s_rows, mask=valid, other=0.0)
            else:
                k_scale = tl.load(ks_base + s_rows)
                v_scale = tl.load(vs_base + s_rows)
        qk = tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32)
        k = _load_part(k_base, k_rows, valid, stride_kd, 0, BLOCK_D, HEAD_DIM, MASKED)
        qk = _scores(q, k, qk, USE_DOT)
        if BLOCK_D2 > 0:
            k2 = _load_part(k_base, k_rows, valid, stride_kd, BLOCK_D, BLOCK_D2, HEAD_DIM, MASKED)
            qk = _scores(q2, k2, qk, USE_DOT)
        if KV_SCALED:
            qk = qk * k_scale[None, :]
        scale = qk_scale
        if SOFTCAP:
            qk = tanh(qk * qk_scale) * softcap_log2
            scale = 1.0
        if MASKED:
            qk = tl.where(valid[None, :], qk * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * scale)  # scale > 0: max commutes with it
            p = tl.math.exp2(qk * scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)  # 0 on the first block (m_i = -inf)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_part(v_base, v_rows, valid, stride_vd, 0, BLOCK_D, HEAD_DIM, MASKED)
        acc = _accumulate(acc, p, v, alpha, v_scale, KV_SCALED, USE_DOT)
        if BLOCK_D2 > 0:
            v2 = _load_part(v_base, v_rows, valid, stride_vd, BLOCK_D, BLOCK_D2, HEAD_DIM, MASKED)
            acc2 = _accumulate(acc2, p, v2, alpha, v_scale, KV_SCALED, USE_DOT)
        m_i = m_new
    return acc, acc2, l_i, m_i


@triton.jit
def _decode_attention_kernel(
    # pointers: o is the output (unsplit) or unused; part is fp32 scratch for the partials (split)
    # or unused: m (B*H, splits), then l (B*H, splits), then acc (B*H, splits, D)
    # ks, vs: K's and V's scales (KV_SCALED), or unused
    q_ptr, k_ptr, v_ptr, lengths_ptr, table_ptr, o_ptr, part_ptr, ks_ptr, vs_ptr,
    # strides (in elements). q and o: (batch, head, dim). k and v: (batch, token, kv head, dim)
    # contiguous, or (page, slot, kv head, dim) paged; ks and vs: (batch or page, token or slot,
    # kv head); table: the block table's row stride (paged)
    stride_qb, stride_qh, stride_qd,
    stride_kp, stride_kt, stride_kh, stride_kd,
    stride_vp, stride_vt, stride_vh, stride_vd,
    stride_sp, stride_st, stride_sh,
    stride_table,
    stride_ob, stride_oh, stride_od,
    # sizes; window_left (WINDOW): the keys before the query its window sees; softcap_log2 (SOFTCAP)
    n_kv_heads, max_tokens, qk_scale, window_left, softcap_log2,
    # meta-parameters; BLOCK_D, BLOCK_D2: the head dim's parts (head_dim_parts; BLOCK_D2 0: one part)
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_D2: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, USE_DOT: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    KV_SCALED: tl.constexpr,
):
    """Program (sequence * Hkv + kv head, split): the G query heads of one kv head over one range."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    batch = (pid // n_kv_heads).to(tl.int64)  # 64-bit: batch * stride can pass 2^31
    kv_head = (pid % n_kv_heads).to(tl.int64)
    # clamped to the cache: a length past it would otherwise read out of bounds
    length = tl.minimum(tl.maximum(tl.load(lengths_ptr + batch), 0), max_tokens)

    if PAGED:
        k_base = k_ptr + kv_head * stride_kh
        v_base = v_ptr + kv_head * stride_vh
        ks_base = ks_ptr + kv_head * stride_sh
        vs_base = vs_ptr + kv_head * stride_sh
        table_base = table_ptr + batch * stride_table
    else:
        k_base = k_ptr + batch * stride_kp + kv_head * stride_kh
        v_base = v_ptr + batch * stride_vp + kv_head * stride_vh
        ks_base = ks_ptr + batch * stride_sp + kv_head * stride_sh
        vs_base = vs_ptr + batch * stride_sp + kv_head * stride_sh
        table_base = table_ptr
    first = tl.zeros([], tl.int32)  # the first token the query sees
    if WINDOW:
        first = tl.maximum(length - 1 - window_left, 0)
    if SPLIT:
        # this sequence's own split length, whole blocks, so only the sequence's last block is masked
        num_splits = tl.num_programs(1)
        split_len = tl.cdiv(tl.cdiv(length - first, num_splits), BLOCK_N) * BLOCK_N
        lo = first + split * split_len
        hi = tl.maximum(tl.minimum(lo + split_len, length), lo)  # lo past the end: an empty range
    else:
        lo = first
        hi = length
    full_end = lo + (hi - lo) // BLOCK_N * BLOCK_N

    offs_g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + offs_g
    in_group = offs_g < GROUP  # padding rows (and columns past D) load zeros and are never stored
    q_rows = batch * stride_qb + heads * stride_qh
    q = _load_part(q_ptr, q_rows, in_group, stride_qd, 0, BLOCK_D, HEAD_DIM, True)
    q2 = q  # unused with one part
    if BLOCK_D2 > 0:
        q2 = _load_part(q_ptr, q_rows, in_group, stride_qd, BLOCK_D, BLOCK_D2, HEAD_DIM, True)
    if not USE_DOT:
        q = q.to(tl.float32)
        q2 = q2.to(tl.float32)
    elif KV_SCALED:  # fp16 products: q times a power of two, its largest in [2^14, 2^15) (module docstring)
        q_max = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
        if BLOCK_D2 > 0:
            q_max = tl.maximum(q_max, tl.max(tl.max(tl.abs(q2.to(tl.float32)), 1), 0))
        q_unit = _pow2_floor(q_max) / FP16_TOP
        q = (q.to(tl.float32) / q_unit).to(tl.float16)
        q2 = (q2.to(tl.float32) / q_unit).to(tl.float16)
        qk_scale = qk_scale * q_unit

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], dtype=tl.float32)
    acc2 = acc  # unused with one part
    if BLOCK_D2 > 0:
        acc2 = tl.zeros([GROUP_PAD, BLOCK_D2], dtype=tl.float32)
    acc, acc2, l_i, m_i = _attend_kv_blocks(
        acc, acc2, l_i, m_i, q, q2, k_base, v_base, table_base, ks_base, vs_base,
        stride_kp, stride_kt, stride_kd, stride_vp, stride_vt, stride_vd, stride_sp, stride_st, lo, full_end,
        qk_scale, softcap_log2, False, PAGED, PAGE_SIZE, USE_DOT, SOFTCAP, KV_SCALED, HEAD_DIM, BLOCK_D, BLOCK_D2,
        BLOCK_N)
    acc, acc2, l_i, m_i = _attend_kv_blocks(
        acc, acc2, l_i, m_i, q, q2, k_base, v_base, table_base, ks_base, vs_base,
        stride_kp, stride_kt, stride_kd, stride_vp, stride_vt, stride_vd, stride_sp, stride_st, full_end, hi,
        qk_scale, softcap_log2, True, PAGED, PAGE_SIZE, USE_DOT, SOFTCAP, KV_SCALED, HEAD_DIM, BLOCK_D, BLOCK_D2,
        BLOCK_N)

    if SPLIT:  # an empty range writes m = -inf, l = 0, acc = 0: weight 0 in the merge
        n_parts = tl.num_programs(0).to(tl.int64) * GROUP * tl.num_programs(1)  # B * H * splits
        part = (batch * n_kv_heads * GROUP + heads) * tl.num_programs(1) + split
        tl.store(part_ptr + part, m_i, mask=in_group)
        tl.store(part_ptr + n_parts + part, l_i, mask=in_group)
        acc_base = part_ptr + 2 * n_parts
        _store_part(acc_base, part * HEAD_DIM, in_group, 1, acc, 0, BLOCK_D, HEAD_DIM)
        if BLOCK_D2 > 0:
            _store_part(acc_base, part * HEAD_DIM, in_group, 1, acc2, BLOCK_D, BLOCK_D2, HEAD_DIM)
    else:
        # a sequence of length 0 has l = 0 and acc = 0: dividing by 1 gives the zeros of the convention
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_rows = batch * stride_ob + heads * stride_oh
        _store_part(o_ptr, o_rows, in_group, stride_od, acc / l_safe, 0, BLOCK_D, HEAD_DIM)
        if BLOCK_D2 > 0:
            _store_part(o_ptr, o_rows, in_group, stride_od, acc2 / l_safe, BLOCK_D, BLOCK_D2, HEAD_DIM)


@triton.jit
def _merge_splits_kernel(
    # pointers: the partials of _decode_attention_kernel's split path (m, l, acc), and the output
    part_ptr, o_ptr,
    # strides (in elements) of o: (batch, head, dim)
    stride_ob, stride_oh, stride_od,
    # sizes
    n_heads, num_splits,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """Program (sequence * H + head): O = sum_s w_s acc_s / sum_s w_s l_s, w_s = exp2(m_s - max m)."""
    row = tl.program_id(0).to(tl.int64)
    batch = row // n_heads
    head = row % n_heads
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    in_range = offs_s < num_splits
    n_parts = tl.num_programs(0).to(tl.int64) * num_splits  # B * H * splits
    parts = row * num_splits + offs_s
    m = tl.load(part_ptr + parts, mask=in_range, other=float("-inf"))
    l_s = tl.load(part_ptr + n_parts + parts, mask=in_range, other=0.0)
    acc = tl.load(part_ptr + 2 * n_parts + parts[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=_tile_mask(in_range, d_ok, PAD_D), other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # length 0: every split empty, every weight 0
    w = tl.math.exp2(m - m_max)
    l_sum = tl.sum(l_s * w, axis=0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.where(l_sum == 0.0, 1.0, l_sum)
    o_ptrs = o_ptr + batch * stride_ob + head * stride_oh + offs_d * stride_od
    if PAD_D:
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=d_ok)
    else:
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty))


def _check_common(q, k, v, lengths, sm_scale, k_name, v_name, k_scale=None, v_scale=None):
    """Checks shared by the contiguous and paged entry points; returns (B, H, D)."""
    dtypes = (torch.float16, torch.bfloat16)
    check_tensor("q", q, dtypes)
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D (batch, heads, head_dim), one token per sequence; got shape {tuple(q.shape)}")
    for name, t in ((k_name, k), (v_name, v)):
        check_tensor(name, t, dtypes + (FP8,))
        check_same_device(name, t, "q", q)
        if t.dtype != q.dtype and t.dtype != FP8:
            raise TypeError(f"{name} must have q's dtype {q.dtype} (or be float8_e4m3fn with scales), got {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{v_name} must have {k_name}'s shape {tuple(k.shape)}, got {tuple(v.shape)}")
    b, h, d = q.shape
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim (last dim of q) must be 1..{MAX_HEAD_DIM}, got {d}")
    if k.shape[3] != d:
        raise ValueError(f"{k_name}'s last dim must be q's head_dim {d}, got shape {tuple(k.shape)}")
    hkv = k.shape[2]
    if hkv < 1 or h % hkv:
        raise ValueError(f"q's head count {h} must be a multiple of {k_name}'s kv head count {hkv} "
                         "(MHA, GQA or MQA)")
    _check_scales(k, v, k_scale, v_scale, q, k_name, v_name)
    check_tensor("lengths", lengths, (torch.int32,))
    check_same_device("lengths", lengths, "q", q)
    if tuple(lengths.shape) != (b,):
        raise ValueError(f"lengths must have shape (B,) = ({b},), got {tuple(lengths.shape)}")
    if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and not isinstance(sm_scale, bool)
                                     and sm_scale > 0 and math.isfinite(sm_scale)):
        raise ValueError(f"sm_scale must be a positive finite number or None, got {sm_scale!r}")
    return b, h, d


def _check_scales(k, v, k_scale, v_scale, q, k_name, v_name):
    """An e4m3 cache comes with its scales, fp32, one a (token, kv head): k_scale and v_scale of
    k's first three dims and one layout; a 16-bit cache with none."""
    if k.dtype != FP8 and v.dtype != FP8:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale and v_scale go with a float8_e4m3fn cache; {k_name} is {k.dtype}")
        return
    if k.dtype != v.dtype:
        raise TypeError(f"{v_name} must have {k_name}'s dtype {k.dtype}, got {v.dtype}")
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            raise ValueError(f"a float8_e4m3fn cache needs k_scale and v_scale; {name} is None")
        check_tensor(name, t, (torch.float32,))
        check_same_device(name, t, "q", q)
        if tuple(t.shape) != tuple(k.shape[:3]):
            raise ValueError(f"{name} must be {tuple(k.shape[:3])}, a scale a (token, kv head) of {k_name}, "
                             f"got shape {tuple(t.shape)}")
    if [st for st, n in zip(k_scale.stride(), k_scale.shape) if n > 1] != \
            [st for st, n in zip(v_scale.stride(), v_scale.shape) if n > 1]:
        raise ValueError(f"k_scale and v_scale must have one layout, got strides {k_scale.stride()} and "
                         f"{v_scale.stride()}")


def _is_int(value):
    """An int that is not a bool: True would pass as 1 and False as 0."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_options(num_splits, max_length, out, config, q):
    if config is not None and not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig or None, got {type(config).__name__}")
    if config is not None and not (all(_is_int(v) for v in (config.BLOCK_N, config.num_warps, config.num_stages,
                                                                config.num_splits))
                                   and isinstance(config.use_dot, bool) and isinstance(config.head_parts, bool)):
        raise TypeError(f"config must have int BLOCK_N, num_warps, num_stages, num_splits and bool use_dot and "
                        f"head_parts, got {config}")
    if config is not None and not (config.BLOCK_N >= 16 and config.BLOCK_N & (config.BLOCK_N - 1) == 0
                                   and 1 <= config.num_splits <= MAX_SPLITS):
        raise ValueError(f"config must have a power-of-two BLOCK_N >= 16 (tl.dot's smallest) and num_splits in "
                         f"1..{MAX_SPLITS}, got {config}")
    if num_splits is not None and not (_is_int(num_splits) and 1 <= num_splits <= MAX_SPLITS):
        raise ValueError(f"num_splits must be None or an int in 1..{MAX_SPLITS}, got {num_splits!r}")
    if max_length is not None and not (_is_int(max_length) and max_length >= 0):
        raise ValueError(f"max_length must be None or a non-negative int, got {max_length!r}")
    if out is not None:
        check_out("out", out, q.shape, q.dtype, q.device)


def _launch(q, k, v, lengths, table, page_size, max_tokens, out, sm_scale, num_splits, max_length, cfg=None,
            window_left=-1, softcap=0.0, k_scale=None, v_scale=None):
    """Launch on validated arguments. k, v: (B, T_max, Hkv, D) (table None) or pages
    (P, PAGE_SIZE, Hkv, D) with table (B, max_pages) int32. max_tokens: the tokens a sequence can
    hold. cfg: a DecodeConfig to use instead of decode_config's choice. window_left: the keys
    before the query its window sees (-1: all); softcap: c of c * tanh(s / c) (0: none). k_scale,
    v_scale: for an e4m3 k and v, fp32 (B or P, T_max or PAGE_SIZE, Hkv) of one layout, else None."""
    b, h, d = q.shape
    hkv = k.shape[2]
    group = h // hkv
    if out is None:
        out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    if max_tokens == 0:  # no cache at all: every sequence has length 0
        return out.zero_()
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    paged = table is not None
    if cfg is None:
        longest = max_tokens if max_length is None else min(max_length, max_tokens)
        if window_left >= 0:  # the split heuristic counts the tokens a program reads
            longest = min(longest, window_left + 1)
        cfg = decode_config(b, hkv, group, d, longest, sm_count(q.device.index or 0, INTERPRET_SMS), paged, num_splits,
                            k_scale is not None)
    splits = num_splits or cfg.num_splits
    use_dot = cfg.use_dot or group > 1  # the broadcast product is written for one query head
    part = split_k_buffers(q.device, b * h * splits * (d + 2))[0] if splits > 1 else out  # out: unused
    qk_scale, softcap_log2, has_softcap = softcap_scales(scale, softcap)
    group_pad = max(16 if use_dot else 1, next_power_of_2(group))  # 16: the MMA's smallest M
    block_d, block_d2 = head_dim_parts(d, group_pad) if cfg.head_parts else (one_tile(d), 0)
    scaled = k_scale is not None
    _decode_attention_kernel[(b * hkv, splits)](
        q, k, v, lengths, table if paged else lengths, out, part, k_scale if scaled else part,
        v_scale if scaled else part, *q.stride(), *k.stride(), *v.stride(),
        *(k_scale.stride() if scaled else (0, 0, 0)), table.stride(0) if paged else 0, *out.stride(),
        hkv, max_tokens, qk_scale, window_left, softcap_log2,
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=d, BLOCK_D=block_d,
        BLOCK_D2=block_d2, BLOCK_N=cfg.BLOCK_N, SPLIT=splits > 1, PAGED=paged, PAGE_SIZE=page_size, USE_DOT=use_dot,
        WINDOW=window_left >= 0, SOFTCAP=has_softcap, KV_SCALED=scaled,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        splits_pad = next_power_of_2(splits)
        block_d = one_tile(d)  # the merge moves (D + 2) * 4 bytes a split: one tile serves
        _merge_splits_kernel[(b * h,)](
            part, out, *out.stride(), h, splits,
            HEAD_DIM=d, BLOCK_D=block_d, SPLITS_PAD=splits_pad, num_warps=4 if splits_pad * block_d <= 4096 else 8,
        )
    return out


def _launch_paged(q, k_pages, v_pages, block_table, lengths, sm_scale, num_splits, max_length, out, cfg=None,
                  window_left=-1, softcap=0.0, k_scale=None, v_scale=None):
    page_size = k_pages.shape[1]
    max_tokens = block_table.shape[1] * page_size if k_pages.shape[0] else 0
    return _launch(q, k_pages, v_pages, lengths, block_table, page_size, max_tokens, out, sm_scale, num_splits,
                   max_length, cfg, window_left, softcap, k_scale, v_scale)


def _decode_options(window_left, softcap):
    """The operators' window_left and softcap, checked (direct calls of the operators come here too,
    past decode_attention's checks): (window_left, softcap) as _launch takes them."""
    return check_window((window_left, -1), "(window_left, -1)")[0], check_softcap(softcap)


def _decode_attention_into(q, k_cache, v_cache, lengths, sm_scale, num_splits, max_length, out, window_left=-1,
                           softcap=0.0, k_scale=None, v_scale=None):
    """llmk::decode_attention_out: out comes before the options in its schema (the calls written
    before them pass it eighth)."""
    window_left, softcap = _decode_options(window_left, softcap)
    _check_scales(k_cache, v_cache, k_scale, v_scale, q, "k_cache", "v_cache")
    _launch(q, k_cache, v_cache, lengths, None, 1, k_cache.shape[1], out, sm_scale, num_splits, max_length,
            window_left=window_left, softcap=softcap, k_scale=k_scale, v_scale=v_scale)


def _paged_decode_attention_into(q, k_pages, v_pages, block_table, lengths, sm_scale, num_splits, max_length, out,
                                 window_left=-1, softcap=0.0, k_scale=None, v_scale=None):
    """llmk::paged_decode_attention_out, out before the options as in decode_attention_out."""
    window_left, softcap = _decode_options(window_left, softcap)
    _check_scales(k_pages, v_pages, k_scale, v_scale, q, "k_pages", "v_pages")
    _launch_paged(q, k_pages, v_pages, block_table, lengths, sm_scale, num_splits, max_length, out,
                  window_left=window_left, softcap=softcap, k_scale=k_scale, v_scale=v_scale)


_DECODE_ARGS = "Tensor lengths, float? sm_scale, int? num_splits, int? max_length"
# decode_attention's window, softcap and an e4m3 cache's scales, defaulted to off and after an _out
# twin's buffer (define_ops' options). window_left -1: no window; softcap 0.0: none; k_scale,
# v_scale None: a 16-bit cache.
_DECODE_OPTIONS = "int window_left=-1, float softcap=0.0, Tensor? k_scale=None, Tensor? v_scale=None"
decode_attention_op, decode_attention_out_op = define_ops(
    "decode_attention", f"Tensor q, Tensor k_cache, Tensor v_cache, {_DECODE_ARGS}",
    lambda q, *_: q.new_empty(q.shape), _decode_attention_into, options=_DECODE_OPTIONS)
paged_decode_attention_op, paged_decode_attention_out_op = define_ops(
    "paged_decode_attention", f"Tensor q, Tensor k_pages, Tensor v_pages, Tensor block_table, {_DECODE_ARGS}",
    lambda q, *_: q.new_empty(q.shape), _paged_decode_attention_into, options=_DECODE_OPTIONS)


def _check_forced_grad(name, *tensors):
    """The forward-only check of operator `name`, for a forced config, which launches past the operator."""
    if needs_grad(*tensors):
        raise forward_only_error(name)


def decode_attention(q, k_cache, v_cache, lengths, sm_scale=None, *, window=None, softcap=None, num_splits=None,
                     max_length=None, out=None, config=None, k_scale=None, v_scale=None):
    """Attention of one new token per sequence against a contiguous KV cache (operators
    llmk::decode_attention and llmk::decode_attention_out).

    q: (B, H, D) fp16 or bf16, any strides. k_cache, v_cache: (B, T_max, Hkv, D), q's dtype, any
       strides (a (B, Hkv, T, D) cache passed as `.transpose(1, 2)` is read in place). H a multiple
       of Hkv; D in 1..256 (head_dim_parts: one or two power-of-two tiles, masked past D).
       Or float8_e4m3fn with k_scale, v_scale: fp32 (B, T_max, Hkv), one layout, a scale a (token,
       kv head) (K ~ k_cache * k_scale[..., None]): the kernel reads one byte a value and
       dequantizes into q's dtype (inference/kv_cache.py's KVCache(dtype=torch.float8_e4m3fn)).
    lengths: (B,) int32 on q's device, tokens of each sequence (0..T_max; clamped to it); a
       sequence of length 0 gets zeros.
    sm_scale: defaults to 1/sqrt(D).
    window: None, or (left, right) as flash_attention takes it (ints >= -1, -1 unbounded): the
       query, its sequence's last token, sees the last left + 1 tokens (right has no key to limit).
       The kernel reads those tokens only.
    softcap: None (off) or c > 0: the scores s = q k^T * sm_scale become c * tanh(s / c) (Gemma 2).
    num_splits: None picks from the heuristics table; 1 forces the unsplit path, 2..MAX_SPLITS the
       split path with that many programs a sequence.
    max_length: a hint for the split heuristic, the longest length if the caller knows it without
       a sync (otherwise T_max is assumed); it never changes the result.
    out: optional contiguous (B, H, D) buffer of q's dtype.
    config: a DecodeConfig that replaces the heuristics' whole choice (tuning sweeps, tests);
       num_splits, when given, still overrides its split count. It launches the kernel directly,
       not through the operator (eager only: torch.compile does not trace the launcher).
    Returns O (B, H, D) in q's dtype, contiguous (out itself when given).
    """
    _check_common(q, k_cache, v_cache, lengths, sm_scale, "k_cache", "v_cache", k_scale, v_scale)
    if k_cache.shape[0] != q.shape[0]:
        raise ValueError(f"k_cache must be (B={q.shape[0]}, T_max, Hkv, D) to match q {tuple(q.shape)}, "
                         f"got {tuple(k_cache.shape)}")
    _check_options(num_splits, max_length, out, config, q)
    window_left, softcap = check_window(window)[0], check_softcap(softcap)
    if config is not None:
        _check_forced_grad("decode_attention", q, k_cache, v_cache, k_scale, v_scale)
        return _launch(q, k_cache, v_cache, lengths, None, 1, k_cache.shape[1], out, sm_scale, num_splits,
                       max_length, config, window_left, softcap, k_scale, v_scale)
    options = dict(sm_scale=None if sm_scale is None else float(sm_scale), num_splits=num_splits,
                   max_length=max_length, window_left=window_left, softcap=softcap, k_scale=k_scale, v_scale=v_scale)
    if out is None:
        return decode_attention_op(q, k_cache, v_cache, lengths, **options)
    decode_attention_out_op(q, k_cache, v_cache, lengths, out=out, **options)
    return out


def paged_decode_attention(q, k_pages, v_pages, block_table, lengths, sm_scale=None, *, window=None, softcap=None,
                           num_splits=None, max_length=None, out=None, config=None, k_scale=None, v_scale=None):
    """Attention of one new token per sequence against a paged KV cache (same kernel as
    decode_attention; token t of sequence b is slot t % PAGE_SIZE of page block_table[b, t // PAGE_SIZE];
    operators llmk::paged_decode_attention and llmk::paged_decode_attention_out).

    q: (B, H, D) fp16 or bf16, any strides. k_pages, v_pages: (num_pages, PAGE_SIZE, Hkv, D), q's
       dtype, any strides. block_table: (B, max_pages) int32 page ids, any row stride; the entries
       that cover a sequence's tokens must be valid pages (not checked: that would need a sync),
       entries past its length are never read. lengths: (B,) int32, 0..max_pages * PAGE_SIZE.
       An e4m3 pool takes k_scale, v_scale fp32 (num_pages, PAGE_SIZE, Hkv), as decode_attention.
    sm_scale, window, softcap, num_splits, max_length, out, config: as in decode_attention.
    Returns O (B, H, D) in q's dtype, contiguous (out itself when given).
    """
    b, _, _ = _check_common(q, k_pages, v_pages, lengths, sm_scale, "k_pages", "v_pages", k_scale, v_scale)
    check_tensor("block_table", block_table, (torch.int32,))
    check_same_device("block_table", block_table, "q", q)
    if block_table.dim() != 2 or block_table.shape[0] != b:
        raise ValueError(f"block_table must be (B={b}, max_pages), got shape {tuple(block_table.shape)}")
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise ValueError(f"block_table's rows must be unit-stride, got strides {block_table.stride()}")
    if k_pages.shape[1] < 1:
        raise ValueError(f"k_pages must have a page size (dim 1) of at least 1, got shape {tuple(k_pages.shape)}")
    _check_options(num_splits, max_length, out, config, q)
    window_left, softcap = check_window(window)[0], check_softcap(softcap)
    if config is not None:
        _check_forced_grad("paged_decode_attention", q, k_pages, v_pages, k_scale, v_scale)
        return _launch_paged(q, k_pages, v_pages, block_table, lengths, sm_scale, num_splits, max_length, out,
                             config, window_left, softcap, k_scale, v_scale)
    options = dict(sm_scale=None if sm_scale is None else float(sm_scale), num_splits=num_splits,
                   max_length=max_length, window_left=window_left, softcap=softcap, k_scale=k_scale, v_scale=v_scale)
    if out is None:
        return paged_decode_attention_op(q, k_pages, v_pages, block_table, lengths, **options)
    paged_decode_attention_out_op(q, k_pages, v_pages, block_table, lengths, out=out, **options)
    return out
