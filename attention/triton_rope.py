"""Rotary position embeddings (RoPE) on q and k in Triton, both in one launch.

Math as in attention/reference_rope.py (fp32 inside, one rounding to the input dtype). The table's
last dim is the rotary dim R (R = D, or R < D: partial rotary, as GPT-NeoX, Phi and GLM use it and
flash-attn's rotary_dim < headdim; D may then be odd). Pair i of the first R features of a head is
rotated by the table's column i (and, in the half layout, the second element of the pair by
column i + R/2); features R .. D-1 are copied:
    half:         (x[i], x[i + R/2])  ->  (x[i] cos[i] - x[i + R/2] sin[i],
                                           x[i + R/2] cos[i + R/2] + x[i] sin[i + R/2])
    interleaved:  (x[2i], x[2i + 1])  ->  (x[2i] cos[i] - x[2i + 1] sin[i],
                                           x[2i + 1] cos[i] + x[2i] sin[i])     (columns >= R/2 unread)

One program takes BLOCK_T consecutive (b, t) positions and a block of heads of q or of k: it loads
the positions' cos and sin once and applies them to every head of its block. Programs are numbered
head block fastest, so the programs sharing a tile of positions run together and read the table
from L2. Memory traffic (e = element size of q, k; e_c of the table):
    read q, k and write q_out, k_out:  2 * B*T*(H + Hkv)*D * e
    read cos and sin:                  2 * (rows of the table)*R * e_c from HBM once (half of it
                                       interleaved), and again from L2 for every head block.
Limits: D <= 1024 (a program holds a whole head); R even, 2 <= R <= D.

Backward (autograd of `apply_rope`): each pair's map is linear, [[c1, -s1], [s2, c2]] (c1 = c2 and
s1 = s2 in a true rotation table), so the gradient is its transpose applied to (dq_out, dk_out):
    (do[i], do[i + R/2])  ->  (do[i] c1 + do[i + R/2] s2,  do[i + R/2] c2 - do[i] s1)
the forward's formula with the sines swapped and negated (the inverse rotation, by -sin, when the
halves agree); the copied features' gradient is copied. The same kernel runs it under BACKWARD:
read dq_out, dk_out, write dq, dk, read the table as the forward does, so the bytes are the
forward's. No gradient for cos and sin (a Hugging Face table does not require grad): a table that
requires grad under grad mode raises.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llmk.attention.rope_checks import check_rope_args, rope_outputs
from llmk.common.direct_launch import Launcher
from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.ops import define_op, define_ops


@triton.jit
def _rope_heads(
    # pointers: this block's source (q or k) and its output
    x_ptr, o_ptr,
    # the block of heads and the positions of the program
    head0, n_heads, b, t, in_rows,
    # strides (in elements) of the source and of the contiguous output
    stride_xb, stride_xh, stride_xt, stride_xd, stride_ob, stride_oh, stride_ot,
    # the positions' table, fp32 (BLOCK_T, BLOCK_HALF): columns 0..R/2-1 (c1, s1) and R/2.. (c2, s2)
    c1, s1, c2, s2,
    # meta-parameters
    INTERLEAVED: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Rotate BLOCK_H heads x BLOCK_T positions x R of one tensor and copy the PASS = D - R columns
    after them; tiles are (heads, positions, cols)."""
    heads = head0 + tl.arange(0, BLOCK_H).to(tl.int64)
    rows_mask = (heads < n_heads)[:, None, None] & in_rows[None, :, None]
    x_rows = x_ptr + heads[:, None, None] * stride_xh + (b * stride_xb + t * stride_xt)[None, :, None]
    o_rows = o_ptr + heads[:, None, None] * stride_oh + (b * stride_ob + t * stride_ot)[None, :, None]
    # broadcast the positions' table over the heads of the block
    c1, s1 = c1[None, :, :], s1[None, :, :]
    if INTERLEAVED:
        # whole rows, split into (even, odd) in registers: one contiguous load instead of two
        # stride-2 gathers
        cols = tl.arange(0, 2 * BLOCK_HALF)[None, None, :]
        mask = rows_mask & (cols < 2 * HALF)
        x = tl.load(x_rows + cols * stride_xd, mask=mask, other=0.0, eviction_policy="evict_first")
        x_even, x_odd = tl.split(tl.reshape(x.to(tl.float32), [BLOCK_H, BLOCK_T, BLOCK_HALF, 2]))
        o = tl.join(x_even * c1 - x_odd * s1, x_odd * c1 + x_even * s1)
        o = tl.reshape(o, [BLOCK_H, BLOCK_T, 2 * BLOCK_HALF])
        tl.store(o_rows + cols, o.to(o_ptr.dtype.element_ty), mask=mask)
    else:
        # the two halves as two loads: D/2 need not be a power of two (D = 80, 96)
        cols = tl.arange(0, BLOCK_HALF)[None, None, :]
        mask = rows_mask & (cols < HALF)
        x1 = tl.load(x_rows + cols * stride_xd, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        x2 = tl.load(x_rows + (cols + HALF) * stride_xd, mask=mask, other=0.0, eviction_policy="evict_first").to(
            tl.float32
        )
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2[None, :, :] + x1 * s2[None, :, :]
        tl.store(o_rows + cols, o1.to(o_ptr.dtype.element_ty), mask=mask)
        tl.store(o_rows + cols + HALF, o2.to(o_ptr.dtype.element_ty), mask=mask)
    if PASS > 0:  # partial rotary: features R .. D-1 are copied (their gradient too: the identity)
        cols = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, None, :]
        mask = rows_mask & (cols < 2 * HALF + PASS)
        x = tl.load(x_rows + cols * stride_xd, mask=mask, other=0.0, eviction_policy="evict_first")
        tl.store(o_rows + cols, x, mask=mask)


@triton.jit
def _rope_kernel(
    # pointers
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    # dimensions: B*T positions, T, heads of q and k, head blocks (of q, of q and k together)
    n_rows, seq_len, n_q_heads, n_k_heads, n_q_blocks, n_blocks,
    # strides (in elements); stride_cb = stride_sb = 0 for a table shared by the batch
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_cb, stride_ct, stride_cd,
    stride_sb, stride_st, stride_sd,
    stride_qob, stride_qoh, stride_qot,
    stride_kob, stride_koh, stride_kot,
    # meta-parameters. HALF = R/2 is a compile-time constant (one compile per rotary dim): the
    # column masks and x[R/2:]'s offset then have known divisibility (a runtime 40, R = 80, would
    # carry none), so loads stay 16-byte vectors for R = 80 too. PASS = D - R copied features (0:
    # the whole head rotates). BACKWARD: q, k are dq_out, dk_out and the outputs dq, dk (the
    # transposed map, module docstring)
    INTERLEAVED: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr, BACKWARD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)  # 64-bit: head * stride_h and b * stride_b can pass 2^31
    head_block = pid % n_blocks
    rows = (pid // n_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)  # flat b*T + t: a tile may span batches
    in_rows = rows < n_rows
    b = rows // seq_len
    t = rows % seq_len
    # the table, once for every head of the block; kept in L2 for the other head blocks
    cols = tl.arange(0, BLOCK_HALF)
    mask = in_rows[:, None] & (cols < HALF)[None, :]
    c_rows = cos_ptr + (b * stride_cb + t * stride_ct)[:, None]
    s_rows = sin_ptr + (b * stride_sb + t * stride_st)[:, None]
    c1 = tl.load(c_rows + cols[None, :] * stride_cd, mask=mask, other=0.0, eviction_policy="evict_last")
    s1 = tl.load(s_rows + cols[None, :] * stride_sd, mask=mask, other=0.0, eviction_policy="evict_last")
    c1, s1 = c1.to(tl.float32), s1.to(tl.float32)
    if INTERLEAVED:  # columns R/2.. are not read
        c2, s2 = c1, s1
    else:
        c2 = tl.load(
            c_rows + (cols[None, :] + HALF) * stride_cd, mask=mask, other=0.0, eviction_policy="evict_last"
        ).to(tl.float32)
        s2 = tl.load(
            s_rows + (cols[None, :] + HALF) * stride_sd, mask=mask, other=0.0, eviction_policy="evict_last"
        ).to(tl.float32)
    if BACKWARD:  # the transpose: x1 c1 - x2 (-s2) and x2 c2 + x1 (-s1)
        s1, s2 = -s2, -s1
    # fmt: off
    if head_block < n_q_blocks:
        _rope_heads(q_ptr, q_out_ptr, head_block * BLOCK_HQ, n_q_heads, b, t, in_rows,
                    stride_qb, stride_qh, stride_qt, stride_qd, stride_qob, stride_qoh, stride_qot,
                    c1, s1, c2, s2, INTERLEAVED, HALF, PASS, BLOCK_HQ, BLOCK_T, BLOCK_HALF, BLOCK_PASS)
    else:
        _rope_heads(k_ptr, k_out_ptr, (head_block - n_q_blocks) * BLOCK_HK, n_k_heads, b, t, in_rows,
                    stride_kb, stride_kh, stride_kt, stride_kd, stride_kob, stride_koh, stride_kot,
                    c1, s1, c2, s2, INTERLEAVED, HALF, PASS, BLOCK_HK, BLOCK_T, BLOCK_HALF, BLOCK_PASS)
    # fmt: on


# Tile of one program: BLOCK_T positions x BLOCK_H heads x BLOCK_D (= next_power_of_2(D)) values
# (with partial rotary, R's and D - R's powers of two; the row is still keyed by D).
# The cos/sin rows are loaded once per program and reused by its BLOCK_H heads, so the widest head
# block, one position, wins: q's 16 heads (k's 8) of one position in a program. Heads per program
# are capped by the tensor's own head count (k with Hkv = 1 gets 1-head blocks).
# Measured by scripts/tune/rope_sweep.py on an H200 (B1 H32/8 T8192 bf16, half layout); the
# figures are in docs/tuning/attention.md.
#   (max BLOCK_D, BLOCK_T positions, BLOCK_H heads at most, num_warps)
# fmt: off
ROPE_TABLE = [
    (64, 2, 16, 4),    # D 64: two positions keep a tile of 2048 values; larger tiles lost
    (128, 1, 16, 4),   # D 128: one position of 16 heads beat more positions of fewer heads
    (256, 1, 16, 8),   # D 256: 8 warps keep 16 values a thread
    (512, 1, 8, 8),    # a position per program; 8 warps keep 32 values a thread
    (1024, 1, 4, 8),   # 4 heads of 1024: 4096 values
]
# fmt: on


@dataclass(frozen=True)
class RopeConfig:
    BLOCK_T: int
    BLOCK_HQ: int
    BLOCK_HK: int
    num_warps: int


def table_row(head_dim):
    """Index of the ROPE_TABLE row that heads of head_dim values take."""
    block_d = next_power_of_2(head_dim)
    return next(i for i, row in enumerate(ROPE_TABLE) if block_d <= row[0])


@functools.lru_cache(maxsize=1024)
def rope_config(n_rows, n_q_heads, n_k_heads, head_dim):
    """Tile and warps for B*T = n_rows positions of heads of head_dim values, from ROPE_TABLE."""
    _, block_t, block_h, warps = ROPE_TABLE[table_row(head_dim)]
    block_t = min(block_t, next_power_of_2(n_rows))  # decode (T = 1): no empty positions
    return RopeConfig(
        block_t,
        min(block_h, next_power_of_2(max(n_q_heads, 1))),
        min(block_h, next_power_of_2(max(n_k_heads, 1))),
        warps,
    )


def _table_strides(table):
    """(stride_b, stride_t, stride_d) of a (T, D) / (1, T, D) / (B, T, D) table; 0 for a shared batch."""
    if table.dim() == 2:
        return (0, *table.stride())
    return (0 if table.shape[0] == 1 else table.stride(0), table.stride(1), table.stride(2))


# a direct launch from a specialization's second on (common/direct_launch.py): RoPE runs on a
# decode step's one position, where its 32 runtime arguments cost JITFunction.run more than the GPU's work
_rope_launch = Launcher(_rope_kernel)


def launch_rope(q, k, cos, sin, q_out, k_out, interleaved, cfg=None, backward=False):
    """Launch on validated arguments (shapes as in apply_rope; the rotary dim R is the tables' last
    dim); writes q_out, k_out (contiguous). cfg: a RopeConfig, by default rope_config's. backward:
    q, k are dq_out, dk_out (any strides), q_out, k_out receive dq, dk."""
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_k_heads, rotary_dim = k.shape[1], cos.shape[-1]
    n_rows = batch * seq_len
    if n_rows == 0 or head_dim == 0 or n_q_heads + n_k_heads == 0:
        return
    cfg = cfg or rope_config(n_rows, n_q_heads, n_k_heads, head_dim)
    n_q_blocks = cdiv(n_q_heads, cfg.BLOCK_HQ)
    n_blocks = n_q_blocks + cdiv(n_k_heads, cfg.BLOCK_HK)
    grid = (cdiv(n_rows, cfg.BLOCK_T) * n_blocks,)
    _rope_launch[grid](
        q,
        k,
        cos,
        sin,
        q_out,
        k_out,
        n_rows,
        seq_len,
        n_q_heads,
        n_k_heads,
        n_q_blocks,
        n_blocks,
        *q.stride(),
        *k.stride(),
        *_table_strides(cos),
        *_table_strides(sin),
        *q_out.stride()[:3],
        *k_out.stride()[:3],
        INTERLEAVED=interleaved,
        HALF=rotary_dim // 2,
        PASS=head_dim - rotary_dim,
        BACKWARD=backward,
        BLOCK_T=cfg.BLOCK_T,
        BLOCK_HQ=cfg.BLOCK_HQ,
        BLOCK_HK=cfg.BLOCK_HK,
        BLOCK_HALF=next_power_of_2(rotary_dim) // 2,
        BLOCK_PASS=next_power_of_2(max(head_dim - rotary_dim, 1)),
        num_warps=cfg.num_warps,
    )


def _rope_backward(dq_out, dk_out, cos, sin, interleaved):
    """dq, dk (new, contiguous) from dq_out, dk_out of any strides."""
    dq, dk = rope_outputs(dq_out, dk_out, None)
    launch_rope(dq_out, dk_out, cos, sin, dq, dk, interleaved, backward=True)
    return dq, dk


apply_rope_backward_op = define_op(
    "apply_rope_backward(Tensor dq_out, Tensor dk_out, Tensor cos, Tensor sin, bool interleaved) -> (Tensor, Tensor)",
    _rope_backward,
    lambda dq_out, dk_out, cos, sin, interleaved: rope_outputs(dq_out, dk_out, None),
)


def table_grad_error(name):
    return ValueError(
        f"{name} requires grad: apply_rope gives no gradient for the cos/sin table (a Hugging Face "
        f"table does not require grad); pass {name}.detach()"
    )


def _save_table(ctx, inputs, output):
    ctx.save_for_backward(inputs.cos, inputs.sin)  # q and k are not needed: the map is linear in them
    ctx.interleaved = inputs.interleaved


def _rope_grad(ctx, dq_out, dk_out):
    for i, name in ((2, "cos"), (3, "sin")):
        if ctx.needs_input_grad[i]:  # reached through torch.ops directly; apply_rope raises first
            raise table_grad_error(name)
    cos, sin = ctx.saved_tensors
    dq, dk = apply_rope_backward_op(dq_out, dk_out, cos, sin, interleaved=ctx.interleaved)
    return dq if ctx.needs_input_grad[0] else None, dk if ctx.needs_input_grad[1] else None, None, None, None


def _rope_empty(q, k, cos, sin, interleaved):
    """The operator's new outputs (its fake implementation too)."""
    return rope_outputs(q, k, None)


def _rope_into(q, k, cos, sin, interleaved, q_out, k_out):
    """llmk::apply_rope_out's body: the kernel writing q_out and k_out."""
    launch_rope(q, k, cos, sin, q_out, k_out, interleaved)


apply_rope_op, apply_rope_out_op = define_ops(
    "apply_rope",
    "Tensor q, Tensor k, Tensor cos, Tensor sin, bool interleaved",
    _rope_empty,
    _rope_into,
    outs=("q_out", "k_out"),
    backward=_rope_grad,
    setup_context=_save_table,
)


def apply_rope(q, k, cos, sin, interleaved=False, out=None):
    """Rotary embeddings on q and k in one launch (operators llmk::apply_rope and llmk::apply_rope_out).

    q: (B, H, T, D), k: (B, Hkv, T, D), fp16, bf16 or fp32, one dtype, any strides (a (B, T, H, D)
       tensor's .transpose(1, 2) is read in place). H and Hkv are independent; D <= 1024.
    cos, sin: (T, R), (1, T, R) or (B, T, R), fp32 or q's dtype, any strides; the HF table of
       attention/reference_rope.py (rope_cos_sin(positions, R)). R, the rotary dim, is even,
       2 <= R <= D: the first R features of each head rotate and the other D - R are copied
       (partial rotary, HF's partial_rotary_factor; flash-attn's rotary_dim, whose half-width
       table t becomes cat(t, t)). R < D is how an odd head dim takes RoPE. interleaved=False
       pairs (x[i], x[i + R/2]) and uses every column; interleaved=True pairs (x[2i], x[2i + 1])
       and uses columns 0 .. R/2-1 only.
    out: optional (q_out, k_out), contiguous buffers shaped and typed like q and k. Forward-only:
       with out given, a q or k that requires grad raises under grad mode.
    Returns (q_out, k_out): contiguous (B, H, T, D) and (B, Hkv, T, D) tensors in q's dtype, new
    ones or the pair given as out. Differentiable in q and k (without out): the backward saves
    cos and sin and runs llmk::apply_rope_backward, whose dq, dk are contiguous. cos and sin get
    no gradient: one that requires grad under grad mode raises ValueError.
    """
    check_rope_args(q, k, cos, sin, interleaved, partial=True)
    if torch.is_grad_enabled():
        for name, table in (("cos", cos), ("sin", sin)):
            if table.requires_grad:
                raise table_grad_error(name)
    if out is None:
        return apply_rope_op(q, k, cos, sin, interleaved=interleaved)
    q_out, k_out = rope_outputs(q, k, out)
    apply_rope_out_op(q, k, cos, sin, interleaved=interleaved, q_out=q_out, k_out=k_out)
    return q_out, k_out
