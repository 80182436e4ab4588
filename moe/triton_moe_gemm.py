"""The experts' grouped GEMMs in Triton: every routed (token, slot) row multiplied by its own
expert's weights, the rows taken in expert order (moe_permute's order) so that one program's tile
holds one expert's rows.

Four kernels, the first launched in several forms (on long runs, gate/up, down and dx run in
moe/triton_moe_rows_tma.py's persistent form of it instead):

  _expert_rows_kernel: c[rows] = a[rows] @ b[e]^T, BLOCK_M rows of one expert a program
      a's rows are read through the order: GATHER reads token order[r] // top_k of a (T, K) input
      (the hidden states; no gathered copy is made), else sorted row r of an (S, K) one.
      EPILOGUE "glu":     b = [gate; up] (2N rows): BLOCK_N columns of each half in one tile,
                          h = act(gate) * up stored at sorted row r; with STORE_PRE also gate
                          and up (backward)
      EPILOGUE "scatter": c is stored at row order[r] (the flat t * top_k + slot, token order),
                          times the routing weight of that row with SCALE: the layer's output
                          is then a sum over each token's top_k rows
      EPILOGUE "store":   c stored at sorted row r as it is (the backward's dh)
      COPY_A: the programs of the first column tile also store the rows of a they read, in
      expert order (times the routing weight with SCALE): a weight gradient's operand, made
      while the GEMM reads it anyway
  _glu_backward_rows_kernel: the gated unit's backward over dh (S, N) in sorted rows, in place:
      d gate | d up, and the routing weights' gradient (a row's dh dotted with its h)
  _expert_weight_grad_kernel: c[e] = a[rows of e]^T @ b[rows of e], a BLOCK_P x BLOCK_Q tile of one
      expert's weight gradient a program, the expert's rows walked BLOCK_R at a time (their count
      is read on the device); both operands in expert order (S, .).
  _gather_rows_kernel: out[r] = a[order[r] // top_k], optionally times the routing weight of that
      row: the weight kernel's token-order operand x copied into expert order first. The weight
      kernel ran at half its rate reading rows through the order in its loop (279 against 505
      TFLOP/s for d w_gate_up at Qwen3-30B-A3B's widths, 228 against 602 for d w_down, the H200);
      the copy takes 0.23 ms, against 1.3 ms saved (docs/tuning/moe.md).

No host sync. Expert e owns sorted rows offsets[e]..offsets[e + 1] and cdiv(count_e, BLOCK_M) row
tiles, so the launch sizes its grid for the worst case, cdiv(S, BLOCK_M) + min(E, S) row tiles
(S = T * top_k), and each program finds its expert from the offsets (expert_runs, run_tile: a cumulative sum
over E values, in registers); a program past the last tile does nothing.

FLOPs of the layer on S routed rows, hidden H, expert width I: 2 S H (2 I) + 2 S I H = 6 S H I
forward, twice that backward (each GEMM gives an input and a weight gradient). Bytes: the experts'
weights (E * 3 I H elements) once if L2 keeps a band of an expert's columns while its row tiles
pass (the grouped program order, GROUP_M row tiles a band), plus the rows (S (H + 3 I + H)
elements forward): at decode sizes (S <= 512) the weights dominate.

Block sizes: MOE_CONFIGS (by the size of the row runs and the epilogue), WEIGHT_GRAD_CONFIGS,
GLU_ROWS / GLU_COLS and GATHER_ROWS / GATHER_COLS.
"""

import torch
import triton
import triton.language as tl

from llmk.common.device import INTERPRET
from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.triton_utils import activate, activate_grad

# (largest mean rows an expert, {epilogue: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)}):
# the first row whose bound the mean run S / E meets, its config for the launch's epilogue (glu:
# gate_up; scatter: down, dx; store: dh). BLOCK_N counts a GLU's half width: its epilogue holds two
# fp32 tiles of BLOCK_N columns (gate and up). Short runs (decode: S <= 512 over 128 experts) waste
# most of a tall tile on padding and are bound by reading the weights, so they take 16 rows and long
# K steps. Long runs (prefill, training): each launch's best of scripts/tune/moe_sweep.py at
# Qwen3-30B-A3B's widths, T 16384, on the H200, +9-33% over one 128 x 128 tile for all
# (docs/tuning/moe.md), spills included (gate_up 20 B). dh ("store") takes the scatter's tiles: the
# same plain epilogue, a row store, with its SwiGLU backward in a pass of its own.
# glu_tma / scatter_tma: the gate/up and the scatter launches' tile in moe/triton_moe_rows_tma.py's
# persistent kernel, which takes them where it has one (None: the row kernel). On long runs, over the
# row kernel at its own tile (Qwen3-30B-A3B T 4096 and 16384, Mixtral T 4096, the H200): gate/up
# +13-16%, down +11-19% (4 stages 1-2% ahead of 3), dx +3-10% (level on 3 or 4 stages). On decode
# runs the scatter form was 0.85-0.97x at the same tile, so short runs keep the row kernel
# (docs/tuning/moe.md).
MOE_CONFIGS = [
    (
        16,
        dict(
            glu=(16, 64, 128, 4, 4),
            store=(16, 64, 128, 4, 4),
            scatter=(16, 64, 128, 4, 4),
            glu_tma=None,
            scatter_tma=None,
        ),
    ),
    (
        64,
        dict(
            glu=(64, 32, 64, 4, 4), store=(64, 64, 64, 4, 4), scatter=(64, 64, 64, 4, 4), glu_tma=None, scatter_tma=None
        ),
    ),
    (
        None,
        dict(
            glu=(128, 128, 64, 8, 3),
            store=(128, 256, 64, 8, 3),
            scatter=(128, 256, 64, 8, 3),
            glu_tma=(128, 128, 64, 8, 3),
            scatter_tma=(128, 256, 64, 8, 4),
        ),
    ),
]
# Weight gradients: (BLOCK_P, BLOCK_Q, BLOCK_R, num_warps, num_stages), BLOCK_R rows of the
# expert's run a step; dw_gate_up (P = 2I, Q = H) and dw_down (P = H, Q = I). Over operands in
# expert order one tile is the sweep's best for both (545 and 512 TFLOP/s at Qwen3-30B-A3B's
# widths, T 16384, the H200; docs/tuning/moe.md)
WEIGHT_GRAD_CONFIGS = dict(gate_up=(128, 256, 64, 8, 3), down=(128, 256, 64, 8, 3))
# The row gather: GATHER_ROWS rows of up to GATHER_COLS columns a program (4 warps; 16 KB of bf16),
# a copy bound by bandwidth
GATHER_ROWS = 8
GATHER_COLS = 1024
# The gated unit's backward over sorted rows: GLU_ROWS rows a program, GLU_COLS columns a step (4
# warps), bound by bandwidth: dh and gate | up read, d gate | d up written (5 S I elements)
GLU_ROWS = 8
GLU_COLS = 256
# Row tiles that walk the output columns together (the program order; not yet measured)
GROUP_M = 8
# The interpreter: 16-row tiles, and columns and K steps of at most half the dimension (16 to 64),
# so that the tests' small shapes run edge tiles and several K steps, and a test model's widths
# (256) take few programs (each program of the interpreter costs host time whatever its size).
INTERPRET_ROWS = 16
INTERPRET_MAX_BLOCK = 64


def interpret_block(n):
    """The interpreter's tile width for a dimension of n: a power of two, at most n / 2, in 16..64."""
    return max(16, min(INTERPRET_MAX_BLOCK, 1 << max(0, (n // 2).bit_length() - 1)))


def dot_precision(a):
    """tl.dot's input_precision: fp32 inputs in full fp32 ("ieee"; Triton's default on NVIDIA is TF32,
    10-bit significands, where PyTorch's fp32 matmul keeps 23), 16-bit ones as they are."""
    return "ieee" if a.dtype == torch.float32 else "tf32"


def rows_config(n_rows, n_experts, epilogue, n, k):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of _expert_rows_kernel for S rows over E
    experts with `epilogue` ("glu", "store" or "scatter"; "glu_tma" and "scatter_tma": the
    persistent kernel's, None where the row kernel serves), N output columns (a GLU's half width) and a reduction of K:
    MOE_CONFIGS' row for the mean run."""
    if INTERPRET:
        return INTERPRET_ROWS, interpret_block(n), interpret_block(k), 1, 1
    mean = n_rows / n_experts
    return next(cfgs for bound, cfgs in MOE_CONFIGS if bound is None or mean <= bound)[epilogue]


def row_tiles(n_rows, n_experts, block_m):
    """The worst-case number of row tiles: every expert that gets a row may end on a partial tile."""
    return cdiv(n_rows, block_m) + min(n_experts, n_rows)


@triton.jit
def expert_runs(offsets_ptr, n_experts, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, INDEX: tl.constexpr):
    """The experts' row runs as (E_PAD,) vectors: (es, start, end, tiles, tile_end), expert e owning
    sorted rows start[e]..end[e] and row tiles tile_end[e] - tiles[e]..tile_end[e] of BLOCK_M rows
    (the padding past n_experts: none). offsets (E + 1,) int64; the tile counts in INDEX (int32
    where they become TMA coordinates)."""
    es = tl.arange(0, E_PAD)
    ok = es < n_experts
    start = tl.load(offsets_ptr + es, mask=ok, other=0)
    end = tl.load(offsets_ptr + es + 1, mask=ok, other=0)
    tiles = ((end - start + BLOCK_M - 1) // BLOCK_M).to(INDEX)
    return es, start, end, tiles, tl.cumsum(tiles, 0)


@triton.jit
def run_tile(es, start, end, tiles, tile_end, pid_m, BLOCK_M: tl.constexpr):
    """Row tile pid_m's (expert, first sorted row, end of the expert's rows) from expert_runs'
    vectors; expert >= n_experts when pid_m is past the last tile."""
    # experts whose tiles all come before pid_m (the padding's tile_end is the total: counted only
    # past the last tile, which makes e >= n_experts there)
    e = tl.sum((tile_end <= pid_m).to(tl.int32), 0)
    mine = es == e
    first_tile = tl.sum(tl.where(mine, tile_end - tiles, 0), 0)
    row0 = tl.sum(tl.where(mine, start, 0), 0) + (pid_m - first_tile) * BLOCK_M
    return e, row0, tl.sum(tl.where(mine, end, 0), 0)


@triton.jit
def grouped_order(pid, n_tiles_m, n_tiles_n, GROUP_M: tl.constexpr):
    """Tile pid's (row tile, column tile) in grouped order: GROUP_M row tiles walk the columns
    together, so that a band of an expert's weight columns is read once for them from HBM, then
    from L2 (Mixtral's gate | up is 235 MB an expert, past any L2)."""
    first_m = pid // (GROUP_M * n_tiles_n) * GROUP_M
    group_m = tl.minimum(n_tiles_m - first_m, GROUP_M)
    local = pid % (GROUP_M * n_tiles_n)
    return first_m + local % group_m, local // group_m


@triton.jit
def _expert_rows_kernel(
    # pointers: a (T or S, K); b (E, N or 2N, K) by strides; c (S, N) (glu: h; scatter: y in token
    # order; store: at sorted rows) by strides; order (S,) int64 and offsets (E + 1,) int64 from
    # moe_permute; scale (S,) fp32 routing weights in token order; pre (S, 2N) contiguous: gate | up
    # (glu with STORE_PRE); a_copy (S, K) contiguous: a's rows in expert order (COPY_A)
    a_ptr, b_ptr, c_ptr, order_ptr, offsets_ptr, scale_ptr, pre_ptr, a_copy_ptr,
    # sizes: N output columns (glu: the width of each half), K the reduction
    N, K, n_experts, top_k,
    # strides, in elements
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    # meta-parameters
    GATHER: tl.constexpr, EPILOGUE: tl.constexpr, ACTIVATION: tl.constexpr, SCALE: tl.constexpr,
    STORE_PRE: tl.constexpr, COPY_A: tl.constexpr, E_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_M sorted rows of one expert x BLOCK_N columns, all of K, then the epilogue."""
    tl.static_assert(
        EPILOGUE == "glu" or EPILOGUE == "scatter" or EPILOGUE == "store",
        "EPILOGUE must be 'glu', 'scatter' or 'store'",
    )
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    n_tiles_m = tl.num_programs(0) // n_tiles_n
    pid_m, pid_n = grouped_order(tl.program_id(0), n_tiles_m, n_tiles_n, GROUP_M)
    es, start, end, tiles, tile_end = expert_runs(offsets_ptr, n_experts, BLOCK_M, E_PAD, tl.int64)
    e, row0, row_end = run_tile(es, start, end, tiles, tile_end, pid_m, BLOCK_M)
    if e < n_experts:
        rows = row0 + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        rows64 = rows.to(tl.int64)
        pos = tl.load(order_ptr + rows, mask=row_ok, other=0)  # the flat (token, slot) index
        if SCALE:
            w = tl.load(scale_ptr + pos, mask=row_ok, other=0.0)
        a_rows = pos // top_k if GATHER else rows
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if EPILOGUE == "glu":
            # gate's BLOCK_N rows of b, then up's (rows N + n): one (BLOCK_K, 2 BLOCK_N) tile and one
            # dot a step, where two dots of BLOCK_N each read a's tile from shared memory twice
            # (5-8% faster on the H200, docs/tuning/moe.md); split back into gate and up after
            j = tl.arange(0, 2 * BLOCK_N)
            rn_b = (pid_n * BLOCK_N + j % BLOCK_N) % N + (j // BLOCK_N) * N
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        else:
            rn_b = rn % N  # edge columns re-read valid ones; the store drops them
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_rows[:, None] * stride_am + rk[None, :] * stride_ak
        b_ptrs = b_ptr + e.to(tl.int64) * stride_be + rn_b[None, :].to(tl.int64) * stride_bn + rk[:, None] * stride_bk
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_ok = rk < K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            if COPY_A:  # the first column tile's programs keep the rows they read (times the weight)
                if pid_n == 0:
                    # read again (an L2 hit), not `a`: the pipelined load's shared-memory stage is the
                    # dot's, and the GPU gave wrong rows and dh where this copy took it (docs/tuning/moe.md)
                    again = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                    copy = again.to(tl.float32) * w[:, None] if SCALE else again
                    tl.store(
                        a_copy_ptr + rows64[:, None] * K + (k * BLOCK_K + rk)[None, :],
                        copy.to(a_copy_ptr.dtype.element_ty),
                        mask=row_ok[:, None] & k_ok[None, :],
                    )
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        mask = row_ok[:, None] & (rn < N)[None, :]
        if EPILOGUE == "glu":
            # (BLOCK_M, [gate | up] x BLOCK_N) -> two (BLOCK_M, BLOCK_N); a thread's accumulator holds
            # column c and c + BLOCK_N alike, so no data moves (ptxas: no shared-memory traffic added)
            acc, acc_up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
            if STORE_PRE:
                pre_offs = rows64[:, None] * (2 * N) + rn[None, :]  # (S, 2N) contiguous: gate | up
                tl.store(pre_ptr + pre_offs, acc.to(pre_ptr.dtype.element_ty), mask=mask)
                tl.store(pre_ptr + pre_offs + N, acc_up.to(pre_ptr.dtype.element_ty), mask=mask)
            h = activate(acc, ACTIVATION) * acc_up
            tl.store(
                c_ptr + rows64[:, None] * stride_cm + rn[None, :] * stride_cn, h.to(c_ptr.dtype.element_ty), mask=mask
            )
        elif EPILOGUE == "scatter":
            if SCALE:
                acc = acc * w[:, None]
            tl.store(
                c_ptr + pos[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask
            )
        else:
            tl.store(
                c_ptr + rows64[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask
            )


@triton.jit
def _glu_backward_rows_kernel(
    # pointers: dpre (S, 2N) contiguous, its first N columns dh (the down projection's unweighted
    # gradient) on entry, d gate | d up on return; pre (S, 2N) contiguous: gate | up; order (S,)
    # int64; scale (S,) fp32 routing weights in token order; dweights (S,): their gradient, token order
    dpre_ptr, pre_ptr, order_ptr, scale_ptr, dweights_ptr,
    n_rows, N,
    ACTIVATION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """BLOCK_R sorted rows a program, all N columns BLOCK_N at a time: d weight = sum over the
    columns of dh * act(gate) * up (dh dotted with h, recomputed in fp32), then with dh' = dh * weight
    d gate = dh' * up * act'(gate) and d up = dh' * act(gate), in place of dh."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rows < n_rows
    pos = tl.load(order_ptr + rows, mask=ok, other=0)
    w = tl.load(scale_ptr + pos, mask=ok, other=0.0)
    base = rows.to(tl.int64)[:, None] * (2 * N)
    share = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = ok[:, None] & (cols < N)[None, :]
        offs = base + cols[None, :]
        dh = tl.load(dpre_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        gate = tl.load(pre_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(pre_ptr + offs + N, mask=mask, other=0.0).to(tl.float32)
        act = activate(gate, ACTIVATION)
        share += tl.sum(dh * act * up, axis=1)  # masked columns: act(0) * 0
        dh = dh * w[:, None]
        tl.store(dpre_ptr + offs, (dh * up * activate_grad(gate, ACTIVATION)).to(dpre_ptr.dtype.element_ty), mask=mask)
        tl.store(dpre_ptr + offs + N, (dh * act).to(dpre_ptr.dtype.element_ty), mask=mask)
    tl.store(dweights_ptr + pos, share.to(dweights_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _expert_weight_grad_kernel(
    # pointers: a (S, P), b (S, Q) by strides, both in expert order; c (E, P, Q) by strides;
    # offsets (E + 1,) int64
    a_ptr, b_ptr, c_ptr, offsets_ptr,
    # sizes
    P, Q,
    # strides, in elements
    stride_am, stride_ap, stride_bm, stride_bq, stride_ce, stride_cp, stride_cq,
    # meta-parameters
    DOT_PRECISION: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    """One program: a BLOCK_P x BLOCK_Q tile of expert e's gradient, summed over the expert's rows
    (none: a tile of zeros, the gradient of an expert that got no token)."""
    tiles_p = tl.cdiv(P, BLOCK_P)
    tiles_q = tl.cdiv(Q, BLOCK_Q)
    pid = tl.program_id(0)
    e = pid // (tiles_p * tiles_q)
    pid_p = pid % (tiles_p * tiles_q) // tiles_q
    pid_q = pid % tiles_q
    start = tl.load(offsets_ptr + e)
    end = tl.load(offsets_ptr + e + 1)
    rp = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    rq = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rp_a = rp % P  # edge tiles re-read valid columns; the store drops them
    rq_b = rq % Q
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
    for r0 in range(start, end, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        ok = rows < end
        a = tl.load(a_ptr + rows[None, :] * stride_am + rp_a[:, None] * stride_ap, mask=ok[None, :], other=0.0)
        b = tl.load(b_ptr + rows[:, None] * stride_bm + rq_b[None, :] * stride_bq, mask=ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    c_ptrs = c_ptr + e.to(tl.int64) * stride_ce + rp[:, None].to(tl.int64) * stride_cp + rq[None, :] * stride_cq
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rp < P)[:, None] & (rq < Q)[None, :])


@triton.jit
def _gather_rows_kernel(
    # pointers: a (T, N) by strides; out (S, N) contiguous; order (S,) int64; scale (S,) fp32
    # routing weights in token order
    a_ptr, out_ptr, order_ptr, scale_ptr,
    n_rows, N, top_k, stride_am, stride_an,
    SCALE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """out[r] = a[order[r] // top_k] (with SCALE: times scale[order[r]] in fp32, rounded once, as an
    eager product of dout and the weight would be): BLOCK_R rows x BLOCK_N columns a program."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = rows < n_rows
    mask = ok[:, None] & (cols < N)[None, :]
    pos = tl.load(order_ptr + rows, mask=ok, other=0)
    v = tl.load(a_ptr + (pos // top_k)[:, None] * stride_am + cols[None, :] * stride_an, mask=mask, other=0.0)
    if SCALE:
        v = v.to(tl.float32) * tl.load(scale_ptr + pos, mask=ok, other=0.0)[:, None]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], v.to(out_ptr.dtype.element_ty), mask=mask)


def launch_expert_rows(
    a,
    b,
    c,
    order,
    offsets,
    *,
    gather,
    epilogue,
    activation="silu",
    top_k=1,
    scale=None,
    pre=None,
    a_copy=None,
    config=None,
):
    """Launch _expert_rows_kernel on checked arguments. a (T, K) with gather else (S, K); b (E, N
    or 2N, K) by strides (glu: N is the half width); c (S, N) by strides; order (S,), offsets
    (E + 1,); scale (S,) fp32 (scatter: times the output; a_copy: times the copy); pre (S, 2N)
    contiguous (glu: gate | up stored too); a_copy (S, K) contiguous: a's rows stored in expert
    order as the loop reads them (the weight gradient's operand, without a gather of its own)."""
    n_rows, n_experts = order.shape[0], offsets.shape[0] - 1
    n = b.shape[1] // 2 if epilogue == "glu" else b.shape[1]
    k = b.shape[2]
    bm, bn, bk, warps, stages = config or rows_config(n_rows, n_experts, epilogue, n, k)
    dummy = order  # never read: pointers of the forms that take no such tensor
    grid = (row_tiles(n_rows, n_experts, bm) * cdiv(n, bn),)
    _expert_rows_kernel[grid](
        a,
        b,
        c,
        order,
        offsets,
        scale if scale is not None else dummy,
        pre if pre is not None else dummy,
        a_copy if a_copy is not None else dummy,
        n,
        k,
        n_experts,
        top_k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        c.stride(0),
        c.stride(1),
        GATHER=gather,
        EPILOGUE=epilogue,
        ACTIVATION=activation,
        SCALE=scale is not None,
        STORE_PRE=epilogue == "glu" and pre is not None,
        COPY_A=a_copy is not None,
        E_PAD=next_power_of_2(n_experts),
        DOT_PRECISION=dot_precision(a),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=GROUP_M,
        num_warps=warps,
        num_stages=stages,
    )


def launch_glu_backward_rows(dpre, pre, order, scale, dweights, activation, config=None):
    """Launch _glu_backward_rows_kernel: dpre (S, 2N) holds dh in its first N columns, and d gate |
    d up on return; pre (S, 2N) gate | up; order (S,); scale (S,) fp32; dweights (T, top_k)
    contiguous, written whole (each flat (token, slot) index is one sorted row). config: (BLOCK_R,
    BLOCK_N, num_warps), by default GLU_ROWS x GLU_COLS."""
    n_rows, n = pre.shape[0], pre.shape[1] // 2
    if config is None:
        config = (INTERPRET_ROWS, interpret_block(n), 1) if INTERPRET else (GLU_ROWS, GLU_COLS, 4)
    block_r, block_n, warps = config
    block_n = min(block_n, next_power_of_2(n))
    _glu_backward_rows_kernel[(cdiv(n_rows, block_r),)](
        dpre,
        pre,
        order,
        scale,
        dweights,
        n_rows,
        n,
        ACTIVATION=activation,
        BLOCK_R=block_r,
        BLOCK_N=block_n,
        num_warps=warps,
    )


def launch_expert_weight_grad(a, b, c, offsets, *, kind, config=None):
    """Launch _expert_weight_grad_kernel: c (E, P, Q) = per expert a[rows]^T @ b[rows]; a (S, P) and
    b (S, Q) in expert order (launch_gather_rows). kind: "gate_up" (c = d w_gate_up) or "down"
    (d w_down), the WEIGHT_GRAD_CONFIGS entry."""
    n_experts, p, q = c.shape
    if config is None:
        config = (
            (interpret_block(p), interpret_block(q), INTERPRET_ROWS, 1, 1) if INTERPRET else WEIGHT_GRAD_CONFIGS[kind]
        )
    bp, bq, br, warps, stages = config
    _expert_weight_grad_kernel[(n_experts * cdiv(p, bp) * cdiv(q, bq),)](
        a,
        b,
        c,
        offsets,
        p,
        q,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        c.stride(0),
        c.stride(1),
        c.stride(2),
        DOT_PRECISION=dot_precision(a),
        BLOCK_P=bp,
        BLOCK_Q=bq,
        BLOCK_R=br,
        num_warps=warps,
        num_stages=stages,
    )


def launch_gather_rows(a, order, top_k, scale=None):
    """-> (S, N) contiguous, a's dtype: row r is a[order[r] // top_k] (a (T, N), any strides), times
    scale[order[r]] (S,) fp32 where given."""
    n_rows, n = order.shape[0], a.shape[1]
    out = a.new_empty((n_rows, n))
    if out.numel():
        block_n = min(GATHER_COLS, next_power_of_2(n))
        _gather_rows_kernel[(cdiv(n_rows, GATHER_ROWS), cdiv(n, block_n))](
            a,
            out,
            order,
            scale if scale is not None else order,
            n_rows,
            n,
            top_k,
            a.stride(0),
            a.stride(1),
            SCALE=scale is not None,
            BLOCK_R=GATHER_ROWS,
            BLOCK_N=block_n,
            num_warps=4,
        )
    return out


__all__ = [
    "launch_expert_rows",
    "launch_expert_weight_grad",
    "launch_gather_rows",
    "launch_glu_backward_rows",
    "rows_config",
]
