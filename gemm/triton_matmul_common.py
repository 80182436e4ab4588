"""What matmul's three kernels (gemm/triton_matmul_tiled.py, triton_matmul_tma.py, triton_gemv.py)
share: the argument checks, the grouped program order, the epilogue, the split-K slice count and
the cache of the autotuner's picks. Imports no kernel file, so each of them can import it.
"""

import torch
import triton
import triton.language as tl

from llmk.common.ints import cdiv, next_power_of_2
from llmk.common.triton_utils import activate
from llmk.common.validation import check_same_device, check_tensor

DTYPES = (torch.float16, torch.bfloat16)
ACTIVATIONS = (None, "gelu", "gelu_tanh", "silu")

# Grouped program order: consecutive program ids walk GROUP_M row-tiles down one column of tiles
# before moving right, so the programs in flight share a few A row-panels and B column-panels,
# read from DRAM once and from L2 after (the Triton matmul tutorial's scheme). 16 rather than the
# tutorial's 8: tied within the run-to-run spread on an H100 (scripts/tune/group_m.py) and a fifth
# fewer panel bytes a wave with 128x256 tiles; docs/tuning/gemm.md has the figures.
GROUP_M = 16


def m_bucket(m):
    """The autotune key's M: a power of two, at least 16 (tl.dot's smallest tile)."""
    return max(16, next_power_of_2(m))


def fit_split(k, block_k, split_k):
    """SPLIT_K lowered until no slice of the cdiv(K, BLOCK_K) steps is empty (5 steps in 4 slices
    would be 2 + 2 + 1 + 0: 3 slices)."""
    k_steps = cdiv(k, block_k)
    if k_steps <= 1 or split_k <= 1:
        return 1
    return cdiv(k_steps, cdiv(k_steps, split_k))


def check_matmul_args(a, b, bias, activation):
    """Argument checks of matmul; returns (M, N, K)."""
    check_tensor("a", a, DTYPES, min_dim=2)
    check_tensor("b", b, DTYPES, min_dim=2)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D, (M, K) and (K, N); got a {tuple(a.shape)}, b {tuple(b.shape)}")
    check_same_device("b", b, "a", a)
    if b.dtype != a.dtype:
        raise TypeError(f"b must have a's dtype {a.dtype}; got {b.dtype}")
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"b must have shape (K, N) with K = a.shape[1] = {k}; got {tuple(b.shape)}")
    check_bias(bias, n, (a.dtype, torch.float32), "a", a)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
    return m, n, k


# The autotuner's pick for each key, as launch arguments. After a key's first call the kernel is
# launched with its pick directly: the autotuner's own per-call work (building its key, merging the
# config into the arguments) costs as much host time as a decode-size GEMM takes on the GPU.
_PICKED = {}


def _picked_key(kernel, a, b, m, n, k, store_z):
    """The autotune key (M bucket, N, K, a's and b's layouts, dtype, whether z is stored too), the
    kernel and the device. a's layout: a backward GEMM reads an activation transposed (a.T, unit
    stride along M). store_z: the training forward's second output takes its own staging buffers,
    so a config picked without it may not fit with it, and is tuned apart."""
    return kernel, m_bucket(m), n, k, a.stride(1) == 1, b.stride(1), a.dtype, a.device, store_z


def picked_config(kernel, a, b, m, n, k, store_z=False):
    """Launch arguments of the config the autotuner picked for this key, or None before its first call."""
    return _PICKED.get(_picked_key(kernel, a, b, m, n, k, store_z))


def pick_config(kernel, a, b, m, n, k, config, store_z=False):
    _PICKED[_picked_key(kernel, a, b, m, n, k, store_z)] = config.all_kwargs()


def untuned_config(a, configs, prune, named_args):
    """Launch arguments for a key not tuned yet, or None where the autotuner may run: while a's
    device's current stream is captured into a CUDA graph, timing candidates would synchronize and
    break the capture, so the first config `prune` keeps runs, untimed and not recorded as the
    pick (the key's first eager call still tunes it)."""
    if a.device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        return None
    return prune(configs, named_args)[0].all_kwargs()


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (pid_m, pid_n) in grouped order: GROUP_M row-tiles per column sweep (the last
    group may be shorter)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Round the fp32 tile to c's dtype once and store the part inside (M, N)."""
    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # 64-bit: rows * stride can pass 2^31
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def load_k_step(a_ptrs, b_ptrs, rk, k_left, EVEN_K: tl.constexpr):
    """The (BLOCK_M, BLOCK_K) A and (BLOCK_K, BLOCK_N) B tiles of one step along K, k_left values
    of K left from it: unmasked when every step is whole (EVEN_K), else zeros past K, which add
    nothing to the dot."""
    if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
    return a, b


def check_bias(bias, n, dtypes, like_name, like):
    """An optional (N,) bias of one of `dtypes`, on the device of argument `like_name` (`like`)."""
    if bias is None:
        return
    check_tensor("bias", bias, dtypes)
    check_same_device("bias", bias, like_name, like)
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape ({n},) to match N = {n}; got {tuple(bias.shape)}")


@triton.jit
def epilogue_store(
    c_ptr,
    z_ptr,
    bias_ptr,
    acc,
    pid_m,
    pid_n,
    M,
    N,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The epilogue on a tile of the full fp32 sum: bias, activation, one rounding, the store.
    STORE_Z: also store the pre-activation z = acc + bias (rounded once) into z, laid out like c:
    the training forward keeps it for the backward's activation derivative."""
    if HAS_BIAS:
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N  # wrapped like the loads; the store masks
        acc += tl.load(bias_ptr + rn).to(tl.float32)[None, :]
    if STORE_Z:
        store_tile(z_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    acc = activate(acc, ACTIVATION)
    store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
