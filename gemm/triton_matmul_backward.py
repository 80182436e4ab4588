"""The elementwise part of matmul's backward, in Triton: the activation's derivative and the bias
gradient in one pass over the output gradient.

    c = act(z),  z = a @ b + bias        (forward, gemm/matmul_ops.py)
    dz = dc * act'(z)                    (M, N), rounded once to dc's dtype
    dbias = sum over rows of dz          (N,), fp32 sums rounded once to bias's dtype

da = dz @ b^T and db = a^T @ dz are two GEMMs on matmul's own kernels (gemm/matmul_ops.py runs
them); this file only makes dz and dbias. Without an activation dz is dc itself (nothing written)
and the pass only sums dc's columns.

One program owns a strip of BLOCK_N columns over a band of rows: it walks the band BLOCK_M rows
at a time, writes dz and keeps fp32 column sums of its band, stored as one row of an fp32 partial
(bands, N). common.reduce.sum_partials then adds each column's partial rows: two stages with a fixed
order, so dbias is the same bits every run (no atomics). Traffic: read dc and z, write dz (3MNe
with an activation; MNe for dbias alone), plus the partial (bands * N * 4 bytes, about a MB at
8192 x 4096: 49 bands).

Numerics: dc and z are read in their dtype and the derivative and product run in fp32; dz is
rounded once. dbias sums the fp32 dz (not the rounded one), in fp32. z itself is the forward's
rounded pre-activation, as PyTorch's eager autograd keeps it.
"""

import torch
import triton
import triton.language as tl

from llmk.common.device import INTERPRET, sm_count
from llmk.common.ints import cdiv
from llmk.common.ops import define_op
from llmk.common.reduce import sum_partials
from llmk.common.triton_utils import activate_grad

# (BLOCK_M, BLOCK_N, num_warps): 8 rows of 256 columns a step, so each of 128 threads loads two
# 16-byte vectors of dc and two of z a step (16 bf16 elements of each), and every row segment is
# 512 contiguous bytes. 16 rows a step held 32 elements of dc, z and the sums a thread (~110
# registers), which left room for only 4 programs an SM; 8 rows leave room for about twice as many.
# The interpreter runs small blocks, so its small test shapes take several steps, bands and strips.
BLOCKS = (4, 16, 4) if INTERPRET else (8, 256, 4)
# Bands of rows: enough programs (bands x column strips) for PROGRAMS_PER_SM an SM, so that loads
# from several programs are in flight on each (the loop's loads are not pipelined: other programs
# hide a step's latency); 6 stays within what the registers let an SM hold at once (no second,
# partial wave); fewer, longer bands keep the partial small.
PROGRAMS_PER_SM = 6
# SMs the interpreter counts: few, so its small shapes make bands of several BLOCK_M steps
INTERPRET_SMS = 2


@triton.jit
def _epilogue_backward_kernel(
    # pointers: dc (M, N) any strides; z (M, N) contiguous; dz (M, N) contiguous; partial fp32 (bands, N)
    dc_ptr, z_ptr, dz_ptr, partial_ptr,
    # matrix dimensions; each band is BAND_STEPS steps of BLOCK_M rows
    M, N, BAND_STEPS,
    # strides, in elements
    stride_dcm, stride_dcn,
    # meta-parameters: ACTIVATION None (dz = dc, not written) or its name; BIAS_GRAD: store the band's column sums
    ACTIVATION: tl.constexpr, BIAS_GRAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Program (band, strip): dz over BAND_STEPS * BLOCK_M rows of BLOCK_N columns, and the
    band's fp32 column sums of dz."""
    band = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_n = cols < N
    # fp32 sums of each (row lane, column) of the band, reduced over the rows once after the loop:
    # a column sum every step would be a cross-warp reduction through shared memory (a barrier a
    # step), which stalls the pass's loads (docs/tuning/gemm.md)
    sums = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = band.to(tl.int64) * BAND_STEPS * BLOCK_M  # 64-bit: rows * stride can pass 2^31
    for step in range(0, BAND_STEPS):
        rows = first + step * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (rows < M)[:, None] & in_n[None, :]
        dz = tl.load(dc_ptr + rows[:, None] * stride_dcm + cols[None, :] * stride_dcn, mask=mask, other=0.0).to(
            tl.float32
        )
        if ACTIVATION is not None:
            offs = rows[:, None] * N + cols[None, :]
            z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dz = dz * activate_grad(z, ACTIVATION)  # masked lanes: 0 * act'(0), finite
            tl.store(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask=mask)
        if BIAS_GRAD:
            sums += dz  # masked rows and columns add 0
    if BIAS_GRAD:
        tl.store(partial_ptr + band * N + cols, tl.sum(sums, axis=0), mask=in_n)


def bands(m, n, num_sms):
    """(band steps, bands): rows split into bands of BLOCK_M-row steps, enough for PROGRAMS_PER_SM
    programs an SM over the cdiv(N, BLOCK_N) column strips."""
    block_m, block_n, _ = BLOCKS
    steps = cdiv(m, block_m)
    wanted = max(1, cdiv(PROGRAMS_PER_SM * num_sms, cdiv(n, block_n)))
    band_steps = cdiv(steps, min(wanted, steps))
    return band_steps, cdiv(steps, band_steps)


def launch_epilogue_backward(dc, z, activation, dz, dbias):
    """On validated arguments with M, N >= 1: dc (M, N) any strides; z (M, N) contiguous or None
    (activation None); dz (M, N) contiguous, written when activation is given; dbias (N,) or None,
    the bias gradient in the bias's dtype."""
    m, n = dc.shape
    block_m, block_n, warps = BLOCKS
    band_steps, n_bands = bands(m, n, sm_count(dc.device, INTERPRET_SMS))
    partial = torch.empty((n_bands, n) if dbias is not None else (1,), dtype=torch.float32, device=dc.device)
    _epilogue_backward_kernel[(n_bands, cdiv(n, block_n))](
        dc,
        z if z is not None else dc,
        dz if dz is not None else dc,
        partial,
        m,
        n,
        band_steps,
        dc.stride(0),
        dc.stride(1),
        ACTIVATION=activation,
        BIAS_GRAD=dbias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    if dbias is not None:
        sum_partials(partial, dbias)


def _empty_grads(dc, z, bias, activation, bias_grad):
    dz = dc.new_empty(dc.shape) if activation is not None else dc.new_empty((0,))
    dbias = bias.new_empty(bias.shape) if bias_grad else dc.new_empty((0,))
    return dz, dbias


def _epilogue_backward(dc, z, bias, activation, bias_grad):
    dz, dbias = _empty_grads(dc, z, bias, activation, bias_grad)
    if dc.numel():
        launch_epilogue_backward(
            dc, z, activation, dz if activation is not None else None, dbias if bias_grad else None
        )
    elif bias_grad:  # M = 0: a sum of no rows
        dbias.zero_()
    return dz, dbias


matmul_epilogue_backward_op = define_op(
    "matmul_epilogue_backward(Tensor dc, Tensor? z, Tensor? bias, str? activation, bool bias_grad) -> (Tensor, Tensor)",
    _epilogue_backward,
    _empty_grads,
)


def epilogue_backward(dc, z, bias, activation, bias_grad):
    """(dz, dbias) of c = act(z), z = a @ b + bias (operator llmk::matmul_epilogue_backward).

    dc: (M, N), any strides. z: (M, N) contiguous, the forward's pre-activation (None without an
    activation). bias: (N,), for its dtype (None without one). bias_grad: compute dbias.
    Returns dz (M, N) contiguous, dc's dtype, or dc itself without an activation (the operator
    returns an empty tensor then: an output may not alias an input); dbias (N,) in bias's dtype,
    or None."""
    dz, dbias = matmul_epilogue_backward_op(dc, z, bias, activation=activation, bias_grad=bias_grad)
    return (dz if activation is not None else dc), (dbias if bias_grad else None)
