"""Tests for normalization/triton_residual_rmsnorm.py: u against x + residual, y against the fp64
RMSNorm of u as stored (rounded to the input dtype), and both against PyTorch's add + F.rms_norm.

    python normalization/test_residual_rmsnorm.py   (or: pytest normalization/test_residual_rmsnorm.py)
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
from normalization.triton_residual_rmsnorm import residual_rmsnorm  # noqa: E402

EPS = 1e-6


def outcomes(x, r, w, y, u, with_torch=True):
    u_ref = x.double() + r.double()
    y_ref = rmsnorm_ref(u.double(), w.double(), EPS)  # normalize u as it was stored
    torch_u = x + r
    torch_y = F.rms_norm(torch_u, (x.shape[-1],), w, EPS) if with_torch else None
    return [compare("u", u, u_ref, torch_out=torch_u),
            compare("y", y, y_ref, torch_out=torch_y)]


def check(shape, dtype, pad=None, scale=1.0, weight_dtype=None):
    # Large-value cases halve each input so x + residual stays inside fp16's range (65504; past it
    # u = inf is the right answer, as in PyTorch) while the squares still overflow fp16.
    scale = scale / 2 if scale > 1 else scale
    x = rand(shape, dtype, pad=pad, scale=scale)
    r = rand(shape, dtype, pad=pad, scale=scale)
    w = rand((shape[-1],), weight_dtype or dtype)
    y, u = residual_rmsnorm(x, r, w, EPS, out=poisoned(shape, dtype), residual_out=poisoned(shape, dtype))
    return outcomes(x, r, w, y, u, with_torch=weight_dtype is None)


def check_own_buffer():
    x, r, w = rand((9, 41), torch.float16), rand((9, 41), torch.float16), rand((41,), torch.float16)
    y, u = residual_rmsnorm(x, r, w, EPS)
    return outcomes(x, r, w, y, u)


def check_huge(n_cols):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    x, r = rand((rows, n_cols), torch.float16), rand((rows, n_cols), torch.float16)
    w = rand((n_cols,), torch.float16)
    y, u = residual_rmsnorm(x, r, w, EPS, out=poisoned(x.shape, x.dtype), residual_out=poisoned(x.shape, x.dtype))
    return outcomes(x[-4:], r[-4:], w, y[-4:], u[-4:])


def check_errors():
    x, w = rand((4, 64), torch.float16), rand((64,), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("residual shape", lambda: residual_rmsnorm(x, x[:3], w), ValueError, "residual"),
        expect_raises("residual dtype", lambda: residual_rmsnorm(x, x.float(), w), ValueError, "residual"),
        expect_raises("int residual", lambda: residual_rmsnorm(x, x.to(torch.int16), w), TypeError, "residual"),
        expect_raises("residual elsewhere", lambda: residual_rmsnorm(x, x.to(other), w), ValueError, "residual"),
        expect_raises("weight size", lambda: residual_rmsnorm(x, x, w[:32]), ValueError, "weight"),
        expect_raises("int x", lambda: residual_rmsnorm(x.to(torch.int32), x, w), TypeError, "x"),
        expect_raises("residual_out shape", lambda: residual_rmsnorm(x, x, w, residual_out=x[:1].clone()),
                      ValueError, "residual_out"),
        expect_raises("residual requires grad (forward-only)",
                      lambda: residual_rmsnorm(x, x.clone().requires_grad_(), w), RuntimeError,
                      "llmk::residual_rmsnorm is forward-only"),
    ]


def check_empty():
    x, w = rand((0, 64), torch.float16), rand((64,), torch.float16)
    y, u = residual_rmsnorm(x, x, w)
    return [Outcome("empty in, empty out", y.shape == x.shape and u.shape == x.shape)]


CASES = norm_cases(check, check_own_buffer, check_errors, check_empty, check_huge)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("residual_rmsnorm", CASES)
