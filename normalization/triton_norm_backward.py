"""Backward kernels of the row-wise norms (RMSNorm, residual RMSNorm, LayerNorm) in Triton.

RMSNorm, per row of N values (x̂ = x * rstd, g = dy * w; w is offset + weight, Gemma's form with
offset 1, whose gradient is that of the weight; g = dy without a weight, and no dw):
    rstd = rsqrt(mean(x^2) + eps)                      recomputed from x: nothing saved but x
    dx   = rstd * (g - x̂ * mean(g * x̂))   (+ du, the gradient of u = x + residual, if given)
    dw   = sum over rows of dy * x̂
LayerNorm (x̂ = (x - mean) * rstd, g = dy * w, or dy without a weight):
    dx   = rstd * (g - x̂ * mean(g * x̂) - mean(g))
    dw   = sum over rows of dy * x̂,  db = sum over rows of dy

Memory traffic per row: read x and dy, write dx (3*N*e), plus du (N*e) for residual RMSNorm; the
weight and the dw/db partials are L2-resident. rstd (and the mean) are recomputed rather than
saved: a row held in registers costs no extra bytes for them, and the forward saves nothing but
its input (no (M,) fp32 buffer alive between the passes).

dw (and db) are a deterministic two-stage reduction: a persistent grid of P programs (one to four
per SM: tables in normalization/launch_config.py) loops over the rows, each summing its rows' dy * x̂
in fp32 into its own row of a (P, N) fp32 buffer; `common.reduce.sum_partials` then adds the P rows in a
fixed order and rounds once to the weight's dtype. Two kernels per norm, as in the forward:
- *fused*: BLOCK_M whole rows in registers, the dw partial in registers for the whole loop;
- *looped*: BLOCK_M rows at a time in BLOCK_N chunks, two passes (LayerNorm: one row, three
  passes, the mean first, so the centred values never cancel), the later ones served from L1/L2;
  the dw partial chunk is read, added to and written back in the program's own row of the buffer
  (L2-resident) once a step, or kept in registers when the row is one chunk.
"""

import torch
import triton
import triton.language as tl

from llmk.common.direct_launch import Launcher
from llmk.common.reduce import sum_partials
from llmk.common.triton_utils import col_mask
from llmk.common.validation import rows_of
from llmk.normalization.launch_config import backward_config


@triton.jit
def _load_block(ptr, rows, stride, cols, in_row, n_rows):
    """Rows `rows` of a (n_rows, N) tensor, in its dtype; rows past the end read nothing (masked).
    Read exactly once: evict_first, so they do not push the weight out of L2."""
    mask = (rows < n_rows)[:, None] & in_row[None, :]
    return tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")


@triton.jit
def _rmsnorm_bwd_fused_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, du_ptr, dx_ptr, dw_ptr,
    # matrix dimensions and strides (in elements)
    n_rows, n_cols, stride_dym, stride_xm, stride_dum, stride_dxm,
    eps, offset,
    # meta-parameters
    HAS_DU: tl.constexpr, HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """Persistent: program p takes row blocks p, p + P, p + 2P, ...; dw partial -> dw_ptr[p, :].
    PREFETCH: each step loads the next block's x and dy (raw, BLOCK_M * BLOCK_N values of each in
    flight) before computing on its own, for when one program an SM leaves nothing else to hide the
    loads' latency; without it the registers of the next block are free (wide rows, several programs
    an SM)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK_M
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32) + offset
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    rows = tl.cast(pid, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows*stride can pass 2^31
    if PREFETCH:
        x_next = _load_block(x_ptr, rows, stride_xm, cols, in_row, n_rows)
        dy_next = _load_block(dy_ptr, rows, stride_dym, cols, in_row, n_rows)
    for block in range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        rows = tl.cast(block, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & in_row[None, :]
        if PREFETCH:
            x, dy = x_next.to(tl.float32), dy_next.to(tl.float32)
            x_next = _load_block(x_ptr, rows + step, stride_xm, cols, in_row, n_rows)
            dy_next = _load_block(dy_ptr, rows + step, stride_dym, cols, in_row, n_rows)
        else:
            x = _load_block(x_ptr, rows, stride_xm, cols, in_row, n_rows).to(tl.float32)
            dy = _load_block(dy_ptr, rows, stride_dym, cols, in_row, n_rows).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        # rows past the end: 0, not 0 * rsqrt(eps = 0) = NaN, in the dw sum
        x_hat = tl.where(mask, x * rstd[:, None], 0.0)
        g = dy
        if HAS_WEIGHT:
            g = dy * w[None, :]
        c = tl.sum(g * x_hat, axis=1) / n_cols
        dx = (g - x_hat * c[:, None]) * rstd[:, None]
        if HAS_DU:
            dx += tl.load(
                du_ptr + rows[:, None] * stride_dum + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first"
            ).to(tl.float32)
        tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRAD:
            dw += tl.sum(dy * x_hat, axis=0)
    if WEIGHT_GRAD:
        tl.store(dw_ptr + pid * n_cols + cols, dw, mask=in_row)


@triton.jit
def _rmsnorm_bwd_looped_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, du_ptr, dx_ptr, dw_ptr,
    # matrix dimensions and strides (in elements); compile-time constants, as in the forward
    n_rows, n_cols: tl.constexpr, stride_dym: tl.constexpr, stride_xm: tl.constexpr,
    stride_dum: tl.constexpr, stride_dxm: tl.constexpr,
    eps, offset,
    # meta-parameters
    HAS_DU: tl.constexpr, HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr, ONE_CHUNK: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """Persistent, BLOCK_M rows at a time in (BLOCK_M, BLOCK_N) chunks: pass 1 sums x^2 and x * g,
    pass 2 re-reads x and dy (from L1/L2), writes dx and adds the chunk's dy * x̂, summed over the
    BLOCK_M rows, into this program's row dw_ptr[p, :] (zeroed by the launcher): one read-add-write
    of the partial (8 bytes a column, L2 traffic) per BLOCK_M rows. A chunk's elements belong to
    the same threads in every pass, so each thread reads back its own stores. ONE_CHUNK
    (N <= BLOCK_N): the dw partial stays in registers across rows and is stored once.
    PREFETCH: pass 1 (the HBM pass) loads one chunk ahead, past the rows' end into the first chunk
    of the program's next rows, so two chunks of x and dy are in flight instead of one."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK_M
    dw_row = dw_ptr + pid.to(tl.int64) * n_cols
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        rows = tl.cast(pid, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        ahead = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
        x_ahead = tl.load(
            x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=ahead, other=0.0, eviction_policy="evict_last"
        )
        dy_ahead = tl.load(
            dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=ahead, other=0.0, eviction_policy="evict_last"
        )
    for block in range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        rows = tl.cast(block, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows*stride can pass 2^31
        row_ok = (rows < n_rows)[:, None]
        x_rows, dy_rows = x_ptr + rows[:, None] * stride_xm, dy_ptr + rows[:, None] * stride_dym
        # pass 1: keep x and dy in L2 (evict_last) for pass 2
        sum_sq = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        sum_xg = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_ok & col_mask(cols, n_cols, EVEN_N)[None, :]
            if PREFETCH:
                x, dy = x_ahead.to(tl.float32), dy_ahead.to(tl.float32)
                # the next chunk: these rows' next one, or the first of the program's next rows (no
                # branch: a wrapped start of 0 and the rows stepped on)
                wrap = tl.where(start + BLOCK_N >= n_cols, 1, 0).to(tl.int64)
                next_rows = rows + wrap * step
                next_cols = (start + BLOCK_N) * (1 - wrap) + tl.arange(0, BLOCK_N)
                ahead = (next_rows < n_rows)[:, None] & (next_cols < n_cols)[None, :]
                x_ahead = tl.load(
                    x_ptr + next_rows[:, None] * stride_xm + next_cols[None, :],
                    mask=ahead,
                    other=0.0,
                    eviction_policy="evict_last",
                )
                dy_ahead = tl.load(
                    dy_ptr + next_rows[:, None] * stride_dym + next_cols[None, :],
                    mask=ahead,
                    other=0.0,
                    eviction_policy="evict_last",
                )
            else:
                x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
                dy = tl.load(dy_rows + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            if HAS_WEIGHT:  # the weight's load before the sums: the order the register allocator was tuned on
                w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_last")
                w = w.to(tl.float32) + offset
                sum_sq += x * x
                sum_xg += x * dy * w[None, :]
            else:
                sum_sq += x * x
                sum_xg += x * dy
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=1) / n_cols + eps)
        c = tl.sum(sum_xg, axis=1) * rstd * rstd / n_cols  # mean(g * x̂) / rstd
        # pass 2: the last read of x and dy
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_ok & col_mask(cols, n_cols, EVEN_N)[None, :]
            x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_rows + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            if HAS_WEIGHT:
                w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_last")
                w = w.to(tl.float32) + offset
                dx = (dy * w[None, :] - x * c[:, None]) * rstd[:, None]
            else:
                dx = (dy - x * c[:, None]) * rstd[:, None]
            if HAS_DU:
                dx += tl.load(
                    du_ptr + rows[:, None] * stride_dum + cols[None, :],
                    mask=mask,
                    other=0.0,
                    eviction_policy="evict_first",
                ).to(tl.float32)
            tl.store(
                dx_ptr + rows[:, None] * stride_dxm + cols[None, :],
                dx.to(dx_ptr.dtype.element_ty),
                mask=mask,
                eviction_policy="evict_first",
            )  # dx is not read again: keep L2 for x and dy
            if WEIGHT_GRAD:
                # rows past the end: 0, not 0 * rsqrt(eps = 0) = NaN
                dw_chunk = tl.sum(tl.where(mask, dy * (x * rstd[:, None]), 0.0), axis=0)
                if ONE_CHUNK:
                    dw_acc += dw_chunk
                else:
                    dw = tl.load(dw_row + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_last")
                    tl.store(dw_row + cols, dw + dw_chunk, mask=cols < n_cols, eviction_policy="evict_last")
    if WEIGHT_GRAD and ONE_CHUNK:
        cols = tl.arange(0, BLOCK_N)
        tl.store(dw_row + cols, dw_acc, mask=cols < n_cols)


@triton.jit
def _layernorm_bwd_fused_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, db_ptr,
    # matrix dimensions and strides (in elements)
    n_rows, n_cols, stride_dym, stride_xm, stride_dxm,
    eps,
    # meta-parameters
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """Persistent like the RMSNorm one (PREFETCH the same); dw and db partials -> dw_ptr[p, :],
    db_ptr[p, :]."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK_M
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < n_cols
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    rows = tl.cast(pid, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    if PREFETCH:
        x_next = _load_block(x_ptr, rows, stride_xm, cols, in_row, n_rows)
        dy_next = _load_block(dy_ptr, rows, stride_dym, cols, in_row, n_rows)
    for block in range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        rows = tl.cast(block, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < n_rows)[:, None] & in_row[None, :]
        if PREFETCH:
            x, dy = x_next.to(tl.float32), dy_next.to(tl.float32)
            x_next = _load_block(x_ptr, rows + step, stride_xm, cols, in_row, n_rows)
            dy_next = _load_block(dy_ptr, rows + step, stride_dym, cols, in_row, n_rows)
        else:
            x = _load_block(x_ptr, rows, stride_xm, cols, in_row, n_rows).to(tl.float32)
            dy = _load_block(dy_ptr, rows, stride_dym, cols, in_row, n_rows).to(tl.float32)
        mean = tl.sum(x, axis=1) / n_cols
        centred = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
        x_hat = centred * rstd[:, None]
        g = dy
        if HAS_WEIGHT:
            g = dy * w[None, :]
        c1 = tl.sum(g * x_hat, axis=1) / n_cols
        c2 = tl.sum(g, axis=1) / n_cols
        dx = (g - x_hat * c1[:, None] - c2[:, None]) * rstd[:, None]
        tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if WEIGHT_GRAD:
            dw += tl.sum(dy * x_hat, axis=0)
        if BIAS_GRAD:
            db += tl.sum(dy, axis=0)
    if WEIGHT_GRAD:
        tl.store(dw_ptr + pid * n_cols + cols, dw, mask=in_row)
    if BIAS_GRAD:
        tl.store(db_ptr + pid * n_cols + cols, db, mask=in_row)


@triton.jit
def _layernorm_bwd_looped_kernel(
    # pointers
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, db_ptr,
    # matrix dimensions and strides (in elements); compile-time constants, as in the forward
    n_rows, n_cols: tl.constexpr, stride_dym: tl.constexpr, stride_xm: tl.constexpr,
    stride_dxm: tl.constexpr,
    eps,
    # meta-parameters
    HAS_WEIGHT: tl.constexpr, WEIGHT_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
    BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr, ONE_CHUNK: tl.constexpr,
):  # fmt: skip
    """Persistent, one row at a time in BLOCK_N chunks, three passes: the mean of x; the squared
    deviations, g and g * (x - mean); then dx and the dw/db partials (read-add-write of this
    program's rows of dw_ptr and db_ptr, zeroed by the launcher; with ONE_CHUNK, N <= BLOCK_N,
    in registers across rows and stored once, as the RMSNorm one)."""
    pid = tl.program_id(0)
    dw_row = dw_ptr + pid.to(tl.int64) * n_cols
    db_row = db_ptr + pid.to(tl.int64) * n_cols
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in range(pid, n_rows, tl.num_programs(0)):
        row = tl.cast(i, tl.int64)  # 64-bit: row*stride can pass 2^31
        x_row, dy_row = x_ptr + row * stride_xm, dy_ptr + row * stride_dym
        # pass 1: the mean; keep x in L2 for passes 2 and 3
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = col_mask(cols, n_cols, EVEN_N)
            acc += tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        mean = tl.sum(acc, axis=0) / n_cols
        # pass 2: centred squares, g and g * (x - mean); dy kept in L2 for pass 3
        sum_sq = tl.zeros([BLOCK_N], dtype=tl.float32)
        sum_g = tl.zeros([BLOCK_N], dtype=tl.float32)
        sum_cg = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = col_mask(cols, n_cols, EVEN_N)
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            g = tl.load(dy_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            if HAS_WEIGHT:
                g *= tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            centred = tl.where(mask, x - mean, 0.0)
            sum_sq += centred * centred
            sum_g += g
            sum_cg += centred * g
        rstd = tl.rsqrt(tl.sum(sum_sq, axis=0) / n_cols + eps)
        c1 = tl.sum(sum_cg, axis=0) * rstd / n_cols  # mean(g * x̂)
        c2 = tl.sum(sum_g, axis=0) / n_cols  # mean(g)
        # pass 3: the last read of x and dy
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = col_mask(cols, n_cols, EVEN_N)
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            g = dy
            if HAS_WEIGHT:
                g = dy * tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
            x_hat = (x - mean) * rstd
            dx = (g - x_hat * c1 - c2) * rstd
            tl.store(
                dx_ptr + row * stride_dxm + cols,
                dx.to(dx_ptr.dtype.element_ty),
                mask=mask,
                eviction_policy="evict_first",
            )
            if WEIGHT_GRAD:
                if ONE_CHUNK:
                    dw_acc += dy * x_hat
                else:
                    dw = tl.load(dw_row + cols, mask=mask, other=0.0, eviction_policy="evict_last")
                    tl.store(dw_row + cols, dw + dy * x_hat, mask=mask, eviction_policy="evict_last")
            if BIAS_GRAD:
                if ONE_CHUNK:
                    db_acc += dy
                else:
                    db = tl.load(db_row + cols, mask=mask, other=0.0, eviction_policy="evict_last")
                    tl.store(db_row + cols, db + dy, mask=mask, eviction_policy="evict_last")
    if ONE_CHUNK:
        cols = tl.arange(0, BLOCK_N)
        if WEIGHT_GRAD:
            tl.store(dw_row + cols, dw_acc, mask=cols < n_cols)
        if BIAS_GRAD:
            tl.store(db_row + cols, db_acc, mask=cols < n_cols)


# direct launches from a specialization's second on (common/direct_launch.py): at micro-batch sizes
# a norm's backward costs the host more than the GPU
_rmsnorm_fused, _rmsnorm_looped = Launcher(_rmsnorm_bwd_fused_kernel), Launcher(_rmsnorm_bwd_looped_kernel)
_layernorm_fused, _layernorm_looped = Launcher(_layernorm_bwd_fused_kernel), Launcher(_layernorm_bwd_looped_kernel)


def _partials(cfg, n_cols, device, wanted):
    """A (P, N) fp32 buffer for one weight's per-program sums; zeroed for the looped kernel over
    several chunks, which adds into it row by row. A 0-size placeholder when the gradient is not
    wanted."""
    if not wanted:
        return torch.empty(0, dtype=torch.float32, device=device)
    alloc = torch.zeros if cfg.looped and n_cols > cfg.BLOCK_N else torch.empty
    return alloc((cfg.grid, n_cols), dtype=torch.float32, device=device)


def launch_rmsnorm_backward(dy, x, weight, du, eps, dx, dweight, cfg=None, sum_blocks=None, offset=0.0):
    """Launch on validated arguments: dy, x, du (or None) (..., N) any row strides; weight (N,) or
    None (no affine weight: g = dy); dx a contiguous output shaped like x; dweight (N,) in weight's
    dtype, or None (no weight grad; always None without a weight);
    offset added to the weight (the forward's: w stands for offset + weight in g = dy * w).
    Writes dx = the gradient of x (plus du), and dweight. cfg, sum_blocks: a RowConfig and a
    sum_partials blocks triple instead of the tables' choice (tuning sweeps)."""
    if x.numel() == 0:
        if dweight is not None:
            dweight.zero_()  # no rows: the sum over rows is 0
        return
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    (x2, stride_x), (dy2, stride_dy) = rows_of(x), rows_of(dy)
    du2, stride_du = rows_of(du) if du is not None else (dy2, stride_dy)
    if cfg is None:
        cfg = backward_config(
            n_rows, n_cols, x.element_size(), x.device, "rmsnorm" if du is None else "residual_rmsnorm"
        )
    partial = _partials(cfg, n_cols, x.device, dweight is not None)
    # dx is contiguous: row stride N
    args = (
        dy2,
        x2,
        weight.contiguous() if weight is not None else x2,
        du2,
        dx,
        partial,
        n_rows,
        n_cols,
        stride_dy,
        stride_x,
        stride_du,
        n_cols,
        eps,
        offset,
    )
    flags = dict(HAS_DU=du is not None, HAS_WEIGHT=weight is not None, WEIGHT_GRAD=dweight is not None)
    if cfg.looped:
        _rmsnorm_looped[(cfg.grid,)](
            *args,
            **flags,
            BLOCK_M=cfg.BLOCK_M,
            BLOCK_N=cfg.BLOCK_N,
            EVEN_N=n_cols % cfg.BLOCK_N == 0,
            ONE_CHUNK=n_cols <= cfg.BLOCK_N,
            PREFETCH=cfg.prefetch,
            num_warps=cfg.num_warps,
        )
    else:
        _rmsnorm_fused[(cfg.grid,)](
            *args, **flags, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, PREFETCH=cfg.prefetch, num_warps=cfg.num_warps
        )
    if dweight is not None:
        sum_partials(partial, dweight, sum_blocks)


def launch_layernorm_backward(dy, x, weight, eps, dx, dweight, dbias, cfg=None, sum_blocks=None):
    """Launch on validated arguments: dy, x (..., N) any row strides; weight (N,) or None; dx a
    contiguous output shaped like x; dweight, dbias (N,) outputs in the parameter's dtype, or None
    (that gradient not wanted). Writes dx, dweight, dbias. cfg, sum_blocks: as
    launch_rmsnorm_backward's."""
    if x.numel() == 0:
        for grad in (dweight, dbias):
            if grad is not None:
                grad.zero_()
        return
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    (x2, stride_x), (dy2, stride_dy) = rows_of(x), rows_of(dy)
    if cfg is None:
        cfg = backward_config(n_rows, n_cols, x.element_size(), x.device, "layernorm")
    dw_partial = _partials(cfg, n_cols, x.device, dweight is not None)
    db_partial = _partials(cfg, n_cols, x.device, dbias is not None)
    # dx is contiguous: row stride N
    args = (
        dy2,
        x2,
        weight.contiguous() if weight is not None else x2,
        dx,
        dw_partial,
        db_partial,
        n_rows,
        n_cols,
        stride_dy,
        stride_x,
        n_cols,
        eps,
    )
    flags = dict(HAS_WEIGHT=weight is not None, WEIGHT_GRAD=dweight is not None, BIAS_GRAD=dbias is not None)
    if cfg.looped:
        _layernorm_looped[(cfg.grid,)](
            *args,
            **flags,
            BLOCK_N=cfg.BLOCK_N,
            EVEN_N=n_cols % cfg.BLOCK_N == 0,
            ONE_CHUNK=n_cols <= cfg.BLOCK_N,
            num_warps=cfg.num_warps,
        )
    else:
        _layernorm_fused[(cfg.grid,)](
            *args, **flags, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, PREFETCH=cfg.prefetch, num_warps=cfg.num_warps
        )
    for grad, partial in ((dweight, dw_partial), (dbias, db_partial)):
        if grad is not None:
            sum_partials(partial, grad, sum_blocks)
