"""RMSNorm checks for any implementation `impl(x, weight, eps, out=None)`: the Triton kernel
(normalization/test_rmsnorm.py) and the CUDA one (cuda_cpp/test_cuda_kernels.py)."""
import torch
import torch.nn.functional as F

from common.testing import compare, poisoned, rand
from normalization.norm_cases import huge_rows
from normalization.rmsnorm import rmsnorm_ref

EPS = 1e-6


def check(shape, dtype, impl, pad=None, scale=1.0, weight_dtype=None):
    x = rand(shape, dtype, pad=pad, scale=scale)
    w = rand((shape[-1],), weight_dtype or dtype)
    y = impl(x, w, EPS, out=poisoned(shape, dtype))
    ref = rmsnorm_ref(x.double(), w.double(), EPS)
    # PyTorch's own same-dtype result bounds our error; it needs weight and x in one dtype
    torch_out = F.rms_norm(x, (shape[-1],), w, EPS) if weight_dtype is None else None
    return [compare("y", y, ref, torch_out=torch_out)]  # inf/NaN where ref is finite fails too


def check_own_buffer(impl):
    x, w = rand((9, 41), torch.float16), rand((41,), torch.float16)
    return [compare("y", impl(x, w, EPS), rmsnorm_ref(x.double(), w.double(), EPS))]


def check_huge(n_cols, impl):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    x, w = rand((rows, n_cols), torch.float16), rand((n_cols,), torch.float16)
    y = impl(x, w, EPS, out=poisoned((rows, n_cols), torch.float16))
    return [compare("last rows", y[-4:], rmsnorm_ref(x[-4:].double(), w.double(), EPS))]
