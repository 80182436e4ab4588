"""LayerNorm over the last dim in Triton, matching `F.layer_norm` (biased variance).

    y = (x - mean) * rsqrt(var + eps) * weight + bias       math in fp32, one cast

Traffic per row: read x (N*e), write y (N*e); weight and bias stay in L2.
The fused kernel (short rows, in registers) takes the variance of the centred values, so there is
no E[x^2] - E[x]^2 cancellation. The looped kernel sums values shifted by its first chunk's mean,
which bounds that cancellation (see its docstring), then re-reads the row from L1/L2 to normalize.
normalization/launch_config.py picks the kernel and its launch.
"""
import common  # noqa: F401  (interpreter switch before triton is imported)
import torch
import triton
import triton.language as tl

from common.validation import as_rows, check_out
from normalization.launch_config import row_config
from normalization.triton_rmsnorm import check_norm_args, col_mask


@triton.jit
def _layernorm_fused_kernel(
    # pointers
    x_ptr, w_ptr, b_ptr, y_ptr,
    # matrix dimensions and strides (in elements)
    n_rows, n_cols, stride_xm, stride_ym,
    eps,
    # meta-parameters
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    in_row = cols < n_cols
    mask = (rows < n_rows)[:, None] & in_row[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        y *= tl.load(w_ptr + cols, mask=in_row, other=0.0, eviction_policy="evict_last").to(tl.float32)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=in_row, other=0.0, eviction_policy="evict_last").to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm_looped_kernel(
    # pointers
    x_ptr, w_ptr, b_ptr, y_ptr,
    # matrix dimensions and strides (in elements)
    n_rows, n_cols, stride_xm, stride_ym,
    eps,
    # meta-parameters
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
):
    """One row per program in BLOCK_N chunks: shifted sums, then normalize from L1/L2.

    Pass 1 sums d = x - c and d^2 with c the mean of the first chunk, then var = E[d^2] - E[d]^2.
    That difference cancels only as far as the row mean is from c, and the mean of any k of the
    row's n values lies within std * sqrt((n - k) / k) of the row mean, so at most log2(n / k)
    bits are lost (7 for 131072 values in chunks of 1024), whatever the offset of the data.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = col_mask(cols, n_cols, EVEN_N)
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    shift = tl.sum(x, axis=0) / tl.minimum(n_cols, BLOCK_N)
    d = tl.where(mask, x - shift, 0.0)
    sum_d, sum_d2 = d, d * d
    # pass 1 (rest of the row): keep the row in L2 (evict_last) for pass 2
    for start in range(BLOCK_N, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        d = tl.where(mask, x - shift, 0.0)
        sum_d += d
        sum_d2 += d * d
    mean_d = tl.sum(sum_d, axis=0) / n_cols
    rstd = tl.rsqrt(tl.maximum(tl.sum(sum_d2, axis=0) / n_cols - mean_d * mean_d, 0.0) + eps)
    mean = shift + mean_d
    # pass 2: normalize, reading the row for the last time
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = col_mask(cols, n_cols, EVEN_N)
        x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y *= tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(y_ptr + row * stride_ym + cols, y.to(y_ptr.dtype.element_ty), mask=mask,
                 eviction_policy="evict_first")  # y is not read again: keep L2 for x


def layernorm(x, weight=None, bias=None, eps=1e-5, out=None):
    """LayerNorm over the last dim.

    x: (..., N) fp16, bf16 or fp32, any row stride. weight, bias: (N,) any float dtype, or None.
    out: optional contiguous buffer shaped like x. Returns y: (..., N), x's dtype.
    """
    n_cols = check_norm_args(x, weight, eps)
    if bias is not None:
        check_norm_args(x, bias, eps, weight_name="bias")
    if out is not None:
        check_out("out", out, x.shape, x.dtype, x.device)
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    x2 = as_rows(x)
    y2 = y.view(-1, n_cols)
    n_rows = x2.shape[0]
    cfg = row_config(n_rows, n_cols, x.element_size(), layernorm=True)
    # absent weight/bias: pass x as a never-read placeholder pointer
    args = (x2, weight.contiguous() if weight is not None else x2, bias.contiguous() if bias is not None else x2, y2,
            n_rows, n_cols, x2.stride(0), y2.stride(0), eps)
    flags = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None)
    if cfg.looped:
        _layernorm_looped_kernel[(cfg.grid,)](*args, **flags, BLOCK_N=cfg.BLOCK_N,
                                              EVEN_N=n_cols % cfg.BLOCK_N == 0, num_warps=cfg.num_warps)
    else:
        _layernorm_fused_kernel[(cfg.grid,)](*args, **flags, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                                             num_warps=cfg.num_warps)
    return y
