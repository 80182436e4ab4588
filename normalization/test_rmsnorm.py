"""Tests for normalization/triton_rmsnorm.py against the fp64 reference and F.rms_norm.

    python normalization/test_rmsnorm.py        (or: pytest normalization/test_rmsnorm.py)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common.device import DEVICE  # noqa: E402
from common.testing import Outcome, compare, expect_raises, main, poisoned, rand  # noqa: E402
from normalization.norm_cases import huge_rows, norm_cases  # noqa: E402
from normalization.rmsnorm import rmsnorm_ref  # noqa: E402
from normalization.triton_rmsnorm import rmsnorm  # noqa: E402

EPS = 1e-6


def check(shape, dtype, pad=None, scale=1.0, weight_dtype=None, impl=rmsnorm):
    """impl: the RMSNorm under test (cuda_cpp/test_cuda_kernels.py passes the CUDA one)."""
    x = rand(shape, dtype, pad=pad, scale=scale)
    w = rand((shape[-1],), weight_dtype or dtype)
    y = impl(x, w, EPS, out=poisoned(shape, dtype))
    ref = rmsnorm_ref(x.double(), w.double(), EPS)
    # PyTorch's own same-dtype result bounds our error; it needs weight and x in one dtype
    torch_out = F.rms_norm(x, (shape[-1],), w, EPS) if weight_dtype is None else None
    return [compare("y", y, ref, torch_out=torch_out)]  # inf/NaN where ref is finite fails too


def check_own_buffer(impl=rmsnorm):
    x, w = rand((9, 41), torch.float16), rand((41,), torch.float16)
    return [compare("y", impl(x, w, EPS), rmsnorm_ref(x.double(), w.double(), EPS))]


def check_huge(n_cols, impl=rmsnorm):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    x, w = rand((rows, n_cols), torch.float16), rand((n_cols,), torch.float16)
    y = impl(x, w, EPS, out=poisoned((rows, n_cols), torch.float16))
    return [compare("last rows", y[-4:], rmsnorm_ref(x[-4:].double(), w.double(), EPS))]


def check_errors():
    x, w = rand((4, 64), torch.float16), rand((64,), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("weight size", lambda: rmsnorm(x, w[:63]), ValueError, "weight"),
        expect_raises("int x", lambda: rmsnorm(x.to(torch.int32), w), TypeError, "x"),
        expect_raises("int weight", lambda: rmsnorm(x, w.to(torch.int32)), TypeError, "weight"),
        expect_raises(f"x on {other}", lambda: rmsnorm(x.to(other), w.to(other)), ValueError, "x"),
        expect_raises("weight elsewhere", lambda: rmsnorm(x, w.to(other)), ValueError, "weight"),
        expect_raises("not a tensor", lambda: rmsnorm([1.0], w), TypeError, "x"),
        expect_raises("eps < 0", lambda: rmsnorm(x, w, -1.0), ValueError, "eps"),
        expect_raises("out shape", lambda: rmsnorm(x, w, out=x[:2].clone()), ValueError, "out"),
    ]


def check_empty():
    x, w = rand((0, 64), torch.bfloat16), rand((64,), torch.bfloat16)
    y = rmsnorm(x, w)
    return [Outcome("empty in, empty out", y.shape == x.shape and y.dtype == x.dtype)]


CASES = norm_cases(check, check_own_buffer, check_errors, check_empty, check_huge)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("rmsnorm", CASES)
