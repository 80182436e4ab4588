"""RMSNorm fused into the linear layer that follows it, in Triton.

    y = rmsnorm(x) @ W^T,   rmsnorm(x) = x * rstd * norm_weight,   rstd = rsqrt(mean(x^2) + eps)

rstd is one scalar per row, so it factors out of every dot product of that row:

    y = rstd[:, None] * ((x * norm_weight) @ W^T)

The decode kernels run a K loop that multiplies each x tile (BLOCK_M x BLOCK_K) by its slice of
norm_weight before the dot and sums its squares per row in fp32 on the way; after the loop the
accumulator rows are scaled by rstd. Normalized x never exists in memory, and there is one launch
instead of two. Traffic: read W (N*K*e) once, x (M*K*e) once per column of tiles (from L2 after
the first), norm_weight, write y (M*N*e). The unfused path writes rmsnorm(x) (M*K*e), reads it
back, and pays a second launch. Two paths, picked by M from PATH_TABLE:

- "decode", for M up to 16 rows. The GEMM is then one pass over W (32 MB at 4096 x 4096
  bf16), and what decides its speed is how well that pass streams. `_rmsnorm_linear_decode_kernel`
  swaps the operands: it computes y^T tiles, W_tile (BLOCK_N x BLOCK_K, read in its nn.Linear
  layout, K contiguous) @ a^T (BLOCK_K x BLOCK_M), so that W's rows are the MMA's 64-row side
  (Hopper's wgmma) and the few rows of x its narrow side. Loads go straight to registers
  (num_stages 1): a few programs per SM overlap each other's loads better than a cp.async
  pipeline. Where the column tiles are too few for that, K is split (SPLIT_K programs a tile);
  each split stores fp32 partial sums and partial sums of squares, counts itself in a per-tile
  counter, and the last to arrive adds them up, applies rstd and stores y: one launch. For M = 1
  a GEMV kernel without tensor cores (`_rmsnorm_gemv_kernel`) streams W faster still.
- "unfused": our rmsnorm, then cuBLAS. From 32 rows every column tile of a fused kernel re-reads
  and normalizes all of x, and the GEMM soon becomes compute-bound, where the rmsnorm pass is a
  few percent of it and cuBLAS's GEMM is the fastest there is. A fused kernel on
  gemm/triton_matmul_tiled.py's big autotuned tiles lost to this pair at every M measured
  (docs/tuning/gemm.md), and is not kept.

Numerics: the tensor-core kernel rounds x * norm_weight to x's dtype before the dot, where the
unfused path rounds x * rstd * norm_weight: one rounding of each input either way, the same error
(the GEMV kernel keeps it in fp32). In fp16 the unnormalized product must fit fp16's range
(|x * norm_weight| < 65504), or it becomes inf; bf16 has fp32's range. rstd is computed from x in
fp32, like rmsnorm's. Split K adds its fp32 partial sums in a fixed order: the result does not
depend on which split finishes last.

Backward (the operator's autograd formula), whichever path ran the forward:

    h = rmsnorm(x, norm_weight)          recomputed (read x, write h: 2MKe), not saved
    dweight = dy^T @ h                   (N, K), a GEMM on matmul's kernels, dy read transposed
    dh = dy @ weight                     (M, K), a GEMM on matmul's kernels
    dx, dnorm_weight = rmsnorm_backward(dh, x, norm_weight)   (normalization/triton_rmsnorm.py)

Only x, norm_weight and weight are saved (inputs: no extra memory); each GEMM runs only when a
gradient needs it (h only for dweight, dh only for dx or dnorm_weight).
"""

import functools

import torch
import triton
import triton.language as tl

from llmk.common.device import sm_count
from llmk.common.ints import cdiv
from llmk.common.ops import define_op
from llmk.common.validation import check_same_device, check_tensor
from llmk.common.workspace import split_k_buffers
from llmk.gemm.matmul_ops import matmul_op, product_like
from llmk.gemm.triton_matmul_common import DTYPES
from llmk.normalization.checks import check_norm_args
from llmk.normalization.triton_rmsnorm import rmsnorm_backward, rmsnorm_op

PATHS = ("decode", "unfused")

# The path by rows M = x.numel() // K: (largest M, path), first match wins. Each path belongs where
# it beats both F.rms_norm + cuBLAS and our rmsnorm + cuBLAS for K = 4096 (N = 4096 and 14336),
# bf16, in GPU time (scripts/tune/small_shapes.py rl on an H100; in benchmarks/results/gemm.json,
# op "rmsnorm_linear", graph_ms, the decode path leads triton-rmsnorm+cuBLAS at M = 1, 4 and 16).
# fmt: off
PATH_TABLE = [
    (16, "decode"),     # a pass over W, bound by memory
    (None, "unfused"),  # from 32 rows each column tile re-reads all of x: our rmsnorm, then cuBLAS
]
# fmt: on

# Decode launch table, by M: (largest M, BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). BLOCK_M 1
# is the GEMV kernel; the others are the MMA kernel's row tile (16 is tl.dot's smallest). Each row
# is the best of the candidates scripts/tune/small_shapes.py swept on an H200 at (K, N) = 4096^2,
# (4096, 14336), (14336, 4096); docs/tuning/gemm.md has the figures.
# fmt: off
DECODE_TABLE = [
    (1, 1, 8, 512, 4, 2),        # no tensor cores: 8 rows of W a program, 1 KB of each a step
    (16, 16, 128, 128, 8, 1),    # 128 rows of W a program (two warpgroups of 64), K split to ~2 programs an SM
    (32, 32, 128, 128, 8, 1),    # reached only with path="decode"
    (None, 64, 64, 128, 4, 1),   # reached only with path="decode"
]
# fmt: on
# Split K until the tiles fill DECODE_PROGRAMS_PER_SM programs per SM (2 beat 1 and 4 at every
# shape swept), keeping at least MIN_SPLIT_STEPS K steps a split; the split divides the K steps
# when it can, so that no load needs a mask.
DECODE_PROGRAMS_PER_SM = 2
MIN_SPLIT_STEPS = 4
# the interpreter has no SMs; a count that makes the small test shapes split K
INTERPRET_SMS = 4


def choose_path(m):
    return next(path for max_m, path in PATH_TABLE if max_m is None or m <= max_m)


def split_k(tiles, k_steps, programs):
    """How many splits of k_steps K steps bring `tiles` output tiles to about `programs` programs:
    at most MIN_SPLIT_STEPS steps a split, and the largest such count that divides k_steps."""
    most = max(1, min(cdiv(programs, tiles), k_steps // MIN_SPLIT_STEPS))
    return next(split for split in range(most, 0, -1) if k_steps % split == 0 or split == 1)


@functools.lru_cache(maxsize=4096)
def decode_config(m, n, k, n_sms):
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) of the decode path."""
    _, block_m, block_n, block_k, warps, stages = next(r for r in DECODE_TABLE if r[0] is None or m <= r[0])
    if block_m == 1:  # the GEMV kernel does not split K
        return block_m, block_n, block_k, 1, warps, stages
    tiles = cdiv(m, block_m) * cdiv(n, block_n)
    split = split_k(tiles, cdiv(k, block_k), DECODE_PROGRAMS_PER_SM * n_sms)
    return block_m, block_n, block_k, split, warps, stages


@triton.jit
def store_rows(
    y_ptr, acc_t, sum_sq, pid_m, pid_n, M, N, K, eps, stride_ym, stride_yn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """y[rows, cols] = rstd[rows] * acc_t^T, rounded once, for the y^T tile acc_t (BLOCK_N, BLOCK_M)
    and the rows' sums of squares over all of K."""
    rstd = tl.rsqrt(sum_sq / K + eps)
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows * stride can pass 2^31
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    y_ptrs = y_ptr + rm[None, :] * stride_ym + rn[:, None] * stride_yn
    tl.store(y_ptrs, (acc_t * rstd[None, :]).to(y_ptr.dtype.element_ty), mask=(rm < M)[None, :] & (rn < N)[:, None])


@triton.jit(do_not_specialize=["M", "K_STEPS"])  # M changes every decode step: one compile for all
def _rmsnorm_linear_decode_kernel(
    # pointers: x (M, K), norm weight (K,), W (N, K), y (M, N); with SPLIT_K > 1 also fp32 scratch
    # for the partial y^T tiles (tiles * SPLIT_K, BLOCK_N, BLOCK_M) followed by the partial sums of
    # squares (tiles * SPLIT_K, BLOCK_M), and counter (tiles,) int32, zeros
    x_ptr, norm_w_ptr, w_ptr, y_ptr, partial_ptr, counter_ptr,
    # matrix dimensions; each split of K covers K_STEPS steps of BLOCK_K
    M, N, K, K_STEPS,
    # strides, in elements
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    eps,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """One program: the y^T tile of columns [pid_n * BLOCK_N, +BLOCK_N) x rows [pid_m * BLOCK_M,
    +BLOCK_M) over one split of K. The splits of a tile are adjacent programs, then the row tiles of
    a column tile, so a tile of W read by one row tile is in L2 for the next."""
    pid = tl.program_id(0)
    pid_k = pid % SPLIT_K
    tile = pid // SPLIT_K
    num_pid_m = tl.cdiv(M, BLOCK_M)
    pid_m = tile % num_pid_m
    pid_n = tile // num_pid_m
    # rows past M are masked (no bytes fetched: M = 1 loads one row of x, not 16); columns past N
    # re-read valid rows of W (% N) so that W's loads need no mask, and the store drops them
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    in_m = rm < M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    k_start = pid_k * K_STEPS * BLOCK_K
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k_start + rk)[None, :] * stride_xk
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + (k_start + rk)[None, :] * stride_wk
    norm_w_ptrs = norm_w_ptr + k_start + rk

    acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # y^T
    squares = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)  # summed over K once, after the loop
    for step in range(0, K_STEPS):
        # x and norm_weight are read by every column tile: keep them in L2; W is read once
        if EVEN_K:
            x = tl.load(x_ptrs, mask=in_m[:, None], other=0.0, eviction_policy="evict_last")
            norm_w = tl.load(norm_w_ptrs, eviction_policy="evict_last")
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:  # zeros past K (or past this split) add nothing to the dot or to the squares
            in_k = rk < K - k_start - step * BLOCK_K
            x = tl.load(x_ptrs, mask=in_m[:, None] & in_k[None, :], other=0.0, eviction_policy="evict_last")
            norm_w = tl.load(norm_w_ptrs, mask=in_k, other=0.0, eviction_policy="evict_last")
            w = tl.load(w_ptrs, mask=in_k[None, :], other=0.0, eviction_policy="evict_first")
        xf = x.to(tl.float32)
        squares += xf * xf
        a = (xf * norm_w.to(tl.float32)[None, :]).to(x.dtype)  # the tensor cores take x's dtype
        acc_t = tl.dot(w, tl.trans(a), acc_t)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
        norm_w_ptrs += BLOCK_K
    sum_sq = tl.sum(squares, axis=1)

    if SPLIT_K > 1:
        # store this split's sums, then count it in; the last split of the tile to arrive finds
        # every other split's sums stored (release/acquire on the counter) and finishes the tile
        first = tile.to(tl.int64) * SPLIT_K
        partial_sq_ptr = partial_ptr + tl.num_programs(0).to(tl.int64) * (BLOCK_N * BLOCK_M)
        offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        tl.store(partial_ptr + (first + pid_k) * (BLOCK_N * BLOCK_M) + offs, acc_t)
        tl.store(partial_sq_ptr + (first + pid_k) * BLOCK_M + tl.arange(0, BLOCK_M), sum_sq)
        tl.debug_barrier()  # every thread's stores are issued before the count says they are
        if tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for split in range(0, SPLIT_K):  # in split order: the sum does not depend on arrival order
                # .cg: from L2, where the other SMs' stores are, never a stale L1 line
                acc_t += tl.load(partial_ptr + (first + split) * (BLOCK_N * BLOCK_M) + offs, cache_modifier=".cg")
                sum_sq += tl.load(
                    partial_sq_ptr + (first + split) * BLOCK_M + tl.arange(0, BLOCK_M), cache_modifier=".cg"
                )
            tl.atomic_xchg(counter_ptr + tile, 0)  # ready for the next launch
            store_rows(y_ptr, acc_t, sum_sq, pid_m, pid_n, M, N, K, eps, stride_ym, stride_yn, BLOCK_M, BLOCK_N)
    else:
        store_rows(y_ptr, acc_t, sum_sq, pid_m, pid_n, M, N, K, eps, stride_ym, stride_yn, BLOCK_M, BLOCK_N)


@triton.jit
def _rmsnorm_gemv_kernel(
    # pointers: x (M, K), norm weight (K,), W (N, K), y (M, N)
    x_ptr, norm_w_ptr, w_ptr, y_ptr,
    N, K,
    # strides, in elements
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
    eps,
    # meta-parameters
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """One row of x (program_id(1)) against BLOCK_N rows of W on the CUDA cores: fp32 products
    accumulate elementwise in a (BLOCK_N, BLOCK_K) tile and are summed over K once, after the loop.
    Meant for M = 1, where an MMA would be 15/16 padding: each program streams BLOCK_N rows of W in
    BLOCK_K-long runs (1 KB of each row a step), and the normalized x stays fp32."""
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N  # wrapped columns re-read valid rows of W
    rk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :] * stride_wk
    x_ptrs = x_ptr + row * stride_xm + rk * stride_xk
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs + k * stride_xk, eviction_policy="evict_last")
            norm_w = tl.load(norm_w_ptr + k + rk, eviction_policy="evict_last")
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:  # zeros past K add nothing
            in_k = rk < K - k
            x = tl.load(x_ptrs + k * stride_xk, mask=in_k, other=0.0, eviction_policy="evict_last")
            norm_w = tl.load(norm_w_ptr + k + rk, mask=in_k, other=0.0, eviction_policy="evict_last")
            w = tl.load(w_ptrs, mask=in_k[None, :], other=0.0, eviction_policy="evict_first")
        xf = x.to(tl.float32)
        squares += xf * xf
        acc += w.to(tl.float32) * (xf * norm_w.to(tl.float32))[None, :]
        w_ptrs += BLOCK_K * stride_wk
    rstd = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(
        y_ptr + row * stride_ym + cols * stride_yn,
        (tl.sum(acc, axis=1) * rstd).to(y_ptr.dtype.element_ty),
        mask=cols < N,
    )


def check_rmsnorm_linear_args(x, norm_weight, weight, eps, path):
    """Argument checks of rmsnorm_linear; returns (K, N)."""
    check_tensor("x", x, DTYPES)
    if norm_weight is None:  # the decode kernel always scales by it
        raise TypeError("norm_weight must be a tensor (K,); for a norm without a weight, pass ones")
    k = check_norm_args(x, norm_weight, eps, "x", "norm_weight")
    check_tensor("weight", weight, DTYPES, min_dim=2)
    check_same_device("weight", weight, "x", x)
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype {x.dtype}; got {weight.dtype}")
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(
            f"weight must have shape (N, K) with K = x.shape[-1] = {k} (nn.Linear layout); got {tuple(weight.shape)}"
        )
    if path is not None and path not in PATHS:
        raise ValueError(f"path must be None (choose by M), 'decode' or 'unfused'; got {path!r}")
    return k, weight.shape[0]


def launch_decode(x2, norm_weight, weight, eps, y, config=None):
    """The decode path on validated arguments: x2 (M, K) any strides, norm_weight (K,), weight
    (N, K) any strides, y (M, N) any strides; M, N, K >= 1. config: (BLOCK_M, BLOCK_N, BLOCK_K,
    SPLIT_K, num_warps, num_stages) to run as is (BLOCK_M 1: the GEMV kernel, which ignores
    SPLIT_K); None takes decode_config's."""
    (m, k), n = x2.shape, weight.shape[0]
    block_m, block_n, block_k, split, warps, stages = config or decode_config(
        m, n, k, sm_count(x2.device.index, INTERPRET_SMS)
    )
    norm_weight = norm_weight.contiguous()  # the kernels step norm_weight with unit stride
    strides = (x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1))
    if block_m == 1:
        _rmsnorm_gemv_kernel[(cdiv(n, block_n), m)](
            x2,
            norm_weight,
            weight,
            y,
            n,
            k,
            *strides,
            eps,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            EVEN_K=k % block_k == 0,
            num_warps=warps,
            num_stages=stages,
        )
        return
    k_steps = cdiv(cdiv(k, block_k), split)  # per split
    split = cdiv(cdiv(k, block_k), k_steps)  # no split left without a step
    tiles = cdiv(m, block_m) * cdiv(n, block_n)
    partial = counters = y  # unused pointers still need a tensor
    if split > 1:
        partial, counters = split_k_buffers(x2.device, tiles * split * (block_n + 1) * block_m, tiles)
    _rmsnorm_linear_decode_kernel[(tiles * split,)](
        x2,
        norm_weight,
        weight,
        y,
        partial,
        counters,
        m,
        n,
        k,
        k_steps,
        *strides,
        eps,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT_K=split,
        EVEN_K=k == k_steps * split * block_k,
        num_warps=warps,
        num_stages=stages,
    )


def rmsnorm_linear_decode(x, norm_weight, weight, eps):
    """The decode path (launch_decode) on x (..., K)."""
    k, n = x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, k)  # a view unless the leading dims cannot merge; any strides go to the kernel
    y = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    launch_decode(x2, norm_weight, weight, eps, y)
    return y.view(*x.shape[:-1], n)


def rmsnorm_linear_unfused(x, norm_weight, weight, eps):
    """Two kernels: our rmsnorm writes normalized x, cuBLAS multiplies it by W^T. The rmsnorm
    operator's implementation is called directly: this runs inside llmk::rmsnorm_linear already."""
    return torch.matmul(rmsnorm_op.impl(x, norm_weight, eps, 0.0), weight.t())


def _rmsnorm_linear(x, norm_weight, weight, eps, path):
    k, n = x.shape[-1], weight.shape[0]
    m = x.numel() // k if k else 0
    out_shape = (*x.shape[:-1], n)
    if k == 0:  # rmsnorm of an empty row is empty, and an empty dot product is 0
        return torch.zeros(out_shape, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return torch.empty(out_shape, dtype=x.dtype, device=x.device)
    path = path or choose_path(m)
    if path == "decode":
        return rmsnorm_linear_decode(x, norm_weight, weight, eps)
    # contiguous like the fake's output: a no-op on torch.matmul's (..., N) result
    return rmsnorm_linear_unfused(x, norm_weight, weight, eps).contiguous()


def _setup_rmsnorm_linear(ctx, inputs, output):
    ctx.save_for_backward(inputs.x, inputs.norm_weight, inputs.weight)
    ctx.eps = inputs.eps


def _rmsnorm_linear_backward(ctx, dy):
    """(dx, dnorm_weight, dweight, None, None); module docstring. The forward's path does not
    matter here: every path computes the same y."""
    x, norm_weight, weight = ctx.saved_tensors
    x_grad, norm_grad, weight_grad = ctx.needs_input_grad[:3]
    k, n = x.shape[-1], weight.shape[0]
    if x.numel() == 0 or n == 0:  # no rows, no columns or K = 0: every gradient is zero (or empty)
        return (
            torch.zeros_like(x) if x_grad else None,
            torch.zeros_like(norm_weight) if norm_grad else None,
            torch.zeros_like(weight) if weight_grad else None,
            None,
            None,
        )
    x2, dy2 = x.reshape(-1, k), dy.reshape(-1, n)  # views unless the leading dims cannot merge
    dx = dnorm_weight = dweight = None
    if weight_grad:
        dweight = product_like(weight, dy2.T, rmsnorm_op(x2, norm_weight, eps=ctx.eps, offset=0.0))
    if x_grad or norm_grad:
        dh = matmul_op(dy2, weight, bias=None, activation=None)
        dx, dnorm_weight = rmsnorm_backward(dh, x2, norm_weight, ctx.eps, weight_grad=norm_grad)
        dx = dx.view(x.shape) if x_grad else None
    return dx, dnorm_weight, dweight, None, None


rmsnorm_linear_op = define_op(
    "rmsnorm_linear(Tensor x, Tensor norm_weight, Tensor weight, float eps, str? path) -> Tensor",
    _rmsnorm_linear,
    lambda x, norm_weight, weight, eps, path: x.new_empty((*x.shape[:-1], weight.shape[0])),
    backward=_rmsnorm_linear_backward,
    setup_context=_setup_rmsnorm_linear,
)


def rmsnorm_linear(x, norm_weight, weight, eps=1e-6, path=None):
    """y = rmsnorm(x, norm_weight, eps) @ weight.T, fused into one pass over weight for small M
    (operator llmk::rmsnorm_linear).

    x: (..., K) fp16 or bf16, any strides. norm_weight: (K,) fp16, bf16 or fp32.
    weight: (N, K), x's dtype (nn.Linear's layout, read in place), any strides.
    path: None picks by M = x.numel() // K from PATH_TABLE; "decode" or "unfused" forces one (the
    forward's; the backward is the same for every path).
    Returns y: (..., N), x's dtype, contiguous. M = 0 or N = 0 give an empty y; K = 0 gives zeros.
    Differentiable in x, norm_weight and weight (module docstring).
    """
    check_rmsnorm_linear_args(x, norm_weight, weight, eps, path)
    return rmsnorm_linear_op(x, norm_weight, weight, eps=float(eps), path=path)
