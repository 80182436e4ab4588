"""RMSNorm fused into the linear layer that follows it, in Triton.

    y = rmsnorm(x) @ W^T,   rmsnorm(x) = x * rstd * norm_weight,   rstd = rsqrt(mean(x^2) + eps)

rstd is one scalar per row, so it factors out of every dot product of that row:

    y = rstd[:, None] * ((x * norm_weight) @ W^T)

The fused kernel is the matmul's K loop (gemm/triton_matmul.py) with two additions: each A tile
(BLOCK_M x BLOCK_K of x) is multiplied by its slice of norm_weight before tl.dot, and its squares
are summed per row in fp32 on the way; after the loop the accumulator rows are scaled by rstd.
Normalized x never exists in memory, and there is one launch instead of two. Traffic:
read x (M*K*e, once per column of tiles, from L2 after the first), W (N*K*e), norm_weight, write
y (M*N*e). The unfused path writes rmsnorm(x) (M*K*e) and reads it back, and pays a second launch.

That saving matters while the GEMM is memory-bound on W (decode: M of 1 to a few dozen), where
the launch and the extra pass are a visible share of ~10 us. For large M the GEMM is compute-bound,
the rmsnorm pass is a few percent of it, and the speed of the GEMM itself decides; the unfused path
then uses cuBLAS. PATH_TABLE picks by M.

Numerics: the fused kernel rounds x * norm_weight to x's dtype before the dot, where the unfused
path rounds x * rstd * norm_weight: one rounding of each input either way, the same error. In fp16
the unnormalized product must fit fp16's range (|x * norm_weight| < 65504), or it becomes inf;
bf16 has fp32's range. rstd is computed from x in fp32, like rmsnorm's.
"""
import common  # noqa: F401  (interpreter switch before triton is imported)
import torch
import triton
import triton.language as tl

from common.device import INTERPRET
from common.validation import check_same_device, check_tensor
from gemm.triton_matmul import DTYPES, grouped_tile, interpret_meta, m_bucket, store_tile, tuned
from normalization.triton_rmsnorm import check_norm_args, rmsnorm

PATHS = ("fused", "unfused")

# The path by rows M = x.numel() // K: (largest M, path), first match wins. The fused kernel
# belongs up to the largest M at which it beats rmsnorm + cuBLAS at every M, for K = 4096 and N =
# 4096 and 14336. Measured on an H200 (bf16, microseconds, fused / unfused): N = 4096: M = 1
# 32.4 / 21.0, M = 16 34.1 / 20.5, M = 64 54.4 / 20.7; N = 14336: M = 1 65.2 / 42.9, M = 64
# 57.6 / 44.2. It lost at every M: its tiles leave too few programs to stream W at the memory's
# speed (128 at N = 4096, M = 1), so the launch it saves is worth less than the bandwidth it
# loses. Until a split-K decode kernel closes that gap, the unfused path runs everywhere and the
# fused one is reachable with path="fused".
PATH_TABLE = [
    (None, "unfused"),  # our rmsnorm, then cuBLAS
]


def choose_path(m):
    return next(path for max_m, path in PATH_TABLE if max_m is None or m <= max_m)


@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M_BUCKET"])
def _rmsnorm_matmul_kernel(
    # pointers: x (M, K), norm weight (K,), b = W^T (K, N), c (M, N)
    x_ptr, norm_w_ptr, b_ptr, c_ptr,
    # matrix dimensions; M_BUCKET is only the autotune key (M rounded up to a power of two)
    M, N, K, M_BUCKET,
    # strides, in elements
    stride_xm, stride_xk, stride_bk, stride_bn, stride_cm, stride_cn,
    eps,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # edge tiles re-read valid rows/columns instead of masking loads (see _matmul_kernel); a
    # wrapped row repeats a real row's sum of squares, and its output is never stored
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :] * stride_xk
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :].to(tl.int64) * stride_bn
    norm_w_ptrs = norm_w_ptr + rk

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            x = tl.load(x_ptrs)
            norm_w = tl.load(norm_w_ptrs)
            b = tl.load(b_ptrs)
        else:  # zeros past K add nothing to the dot or to the squares
            k_left = K - k * BLOCK_K
            x = tl.load(x_ptrs, mask=rk[None, :] < k_left, other=0.0)
            norm_w = tl.load(norm_w_ptrs, mask=rk < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        xf = x.to(tl.float32)
        sum_sq += tl.sum(xf * xf, axis=1)
        a = (xf * norm_w.to(tl.float32)[None, :]).to(x.dtype)  # the tensor cores take x's dtype
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_bk
        norm_w_ptrs += BLOCK_K

    rstd = tl.rsqrt(sum_sq / K + eps)
    store_tile(c_ptr, acc * rstd[:, None], pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


def check_rmsnorm_linear_args(x, norm_weight, weight, eps, path):
    """Argument checks of rmsnorm_linear; returns (K, N)."""
    check_tensor("x", x, DTYPES)
    k = check_norm_args(x, norm_weight, eps, "x", "norm_weight")
    check_tensor("weight", weight, DTYPES, min_dim=2)
    check_same_device("weight", weight, "x", x)
    if weight.dtype != x.dtype:
        raise TypeError(f"weight must have x's dtype {x.dtype}; got {weight.dtype}")
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight must have shape (N, K) with K = x.shape[-1] = {k} (nn.Linear layout); "
                         f"got {tuple(weight.shape)}")
    if path is not None and path not in PATHS:
        raise ValueError(f"path must be None (choose by M), 'fused' or 'unfused'; got {path!r}")
    return k, weight.shape[0]


def launch_fused(x2, norm_weight, weight, eps, c):
    """The fused kernel on validated arguments: x2 (M, K) any strides, norm_weight (K,), weight
    (N, K) any strides, c (M, N) contiguous; M, N, K >= 1."""
    (m, k), n = x2.shape, weight.shape[0]
    b = weight.t()  # (K, N): a view, W's strides swapped
    kernel, meta = (_rmsnorm_matmul_kernel, interpret_meta()) if INTERPRET else (tuned(_rmsnorm_matmul_kernel), {})

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    kernel[grid](
        x2, norm_weight.contiguous(), b, c,  # the kernel steps norm_weight with unit stride
        m, n, k, m_bucket(m),
        x2.stride(0), x2.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        eps, **meta)


def rmsnorm_linear_fused(x, norm_weight, weight, eps):
    """One kernel: rstd and the normalized A tiles are made inside the GEMM's K loop."""
    k, n = x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, k)  # a view unless the leading dims cannot merge; any strides go to the kernel
    c = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    launch_fused(x2, norm_weight, weight, eps, c)
    return c.view(*x.shape[:-1], n)


def rmsnorm_linear_unfused(x, norm_weight, weight, eps):
    """Two kernels: our rmsnorm writes normalized x, cuBLAS multiplies it by W^T."""
    return torch.matmul(rmsnorm(x, norm_weight, eps), weight.t())


def rmsnorm_linear(x, norm_weight, weight, eps=1e-6, path=None):
    """y = rmsnorm(x, norm_weight, eps) @ weight.T, fused into one GEMM for small M.

    x: (..., K) fp16 or bf16, any strides. norm_weight: (K,) fp16, bf16 or fp32.
    weight: (N, K), x's dtype (nn.Linear's layout; read in place through its transposed view).
    path: None picks by M = x.numel() // K from PATH_TABLE; "fused" or "unfused" forces one.
    Returns y: (..., N), x's dtype. M = 0 or N = 0 give an empty y; K = 0 gives zeros.
    """
    k, n = check_rmsnorm_linear_args(x, norm_weight, weight, eps, path)
    m = x.numel() // k if k else 0
    out_shape = (*x.shape[:-1], n)
    if k == 0:  # rmsnorm of an empty row is empty, and an empty dot product is 0
        return torch.zeros(out_shape, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return torch.empty(out_shape, dtype=x.dtype, device=x.device)
    if (path or choose_path(m)) == "fused":
        return rmsnorm_linear_fused(x, norm_weight, weight, eps)
    return rmsnorm_linear_unfused(x, norm_weight, weight, eps)
