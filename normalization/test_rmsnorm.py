"""Tests for normalization/triton_rmsnorm.py against the fp64 reference and F.rms_norm: the
output, and the gradients (dx, dweight) against autograd through the fp64 reference; with a
weight (Llama's and Gemma's forms) and without one (weight None).

    python normalization/test_rmsnorm.py        (or: pytest normalization/test_rmsnorm.py)
"""

import functools

import torch

import llmk.normalization.rmsnorm_cases as checks
from llmk.common.device import DEVICE
from llmk.devtools.testing import Case, Outcome, expect_raises, grads_of, main, rand
from llmk.normalization.norm_cases import gemma_cases, grad_cases, no_weight_cases, norm_cases
from llmk.normalization.triton_rmsnorm import rmsnorm, rmsnorm_backward


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
        expect_raises("offset a string", lambda: rmsnorm(x, w, offset="1"), TypeError, "offset"),
        expect_raises("offset a bool", lambda: rmsnorm(x, w, offset=True), TypeError, "offset"),
        expect_raises("offset inf", lambda: rmsnorm(x, w, offset=float("inf")), ValueError, "offset"),
        expect_raises("out shape", lambda: rmsnorm(x, w, out=x[:2].clone()), ValueError, "out"),
        expect_raises(
            "out= under grad (forward-only)",
            lambda: rmsnorm(x, w.clone().requires_grad_(), out=torch.empty_like(x)),
            RuntimeError,
            "without out",
        ),
    ]


def check_backward_function():
    """rmsnorm_backward (the op other kernels' backwards call) gives autograd's gradients bit for
    bit, on a strided dy, with a weight and without one; weight_grad=False gives dweight None; bad
    dy raises naming it."""
    x, w, dy = rand((5, 300), torch.bfloat16), rand((300,), torch.bfloat16), rand((5, 300), torch.bfloat16, pad=(0, 4))
    _, (dx, dw) = grads_of(lambda x, w: rmsnorm(x, w, 1e-6), (x, w), (0, 1), [dy])
    got_dx, got_dw = rmsnorm_backward(dy, x, w, 1e-6)
    only_dx, none = rmsnorm_backward(dy, x, w, 1e-6, weight_grad=False)
    _, gemma = grads_of(lambda x, w: rmsnorm(x, w, 1e-6, offset=1.0), (x, w), (0, 1), [dy])
    got_gemma = rmsnorm_backward(dy, x, w, 1e-6, offset=1.0)
    _, (dx_plain,) = grads_of(lambda x: rmsnorm(x, None, 1e-6), (x,), (0,), [dy])
    got_plain = rmsnorm_backward(dy, x, None, 1e-6, offset=1.0)
    return [
        Outcome("dx = autograd's", torch.equal(got_dx, dx) and got_dx.is_contiguous()),
        Outcome("dweight = autograd's", torch.equal(got_dw, dw)),
        Outcome(
            "offset=1.0: autograd's dx and dweight",
            all(map(torch.equal, got_gemma, gemma)) and not torch.equal(got_gemma[0], dx),
        ),
        Outcome("weight_grad=False: dweight None, same dx", none is None and torch.equal(only_dx, dx)),
        Outcome(
            "weight None: autograd's dx, dweight None",
            torch.equal(got_plain[0], dx_plain) and got_plain[1] is None and not torch.equal(dx_plain, dx),
        ),
        expect_raises("dy shape", lambda: rmsnorm_backward(dy[:2], x, w), ValueError, "dy"),
        expect_raises("dy dtype", lambda: rmsnorm_backward(dy.float(), x, w), ValueError, "dy"),
        expect_raises("int dy", lambda: rmsnorm_backward(dy.to(torch.int32), x, w), TypeError, "dy"),
    ]


def check_empty():
    x, w = rand((0, 64), torch.bfloat16), rand((64,), torch.bfloat16)
    y = rmsnorm(x, w)
    return [Outcome("empty in, empty out", y.shape == x.shape and y.dtype == x.dtype)]


# the checks of outputs are shared with cuda_cpp's RMSNorm: normalization/rmsnorm_cases.py
CASES = norm_cases(
    functools.partial(checks.check, impl=rmsnorm),
    functools.partial(checks.check_own_buffer, impl=rmsnorm),
    check_errors,
    check_empty,
    functools.partial(checks.check_huge, impl=rmsnorm),
)
CASES += grad_cases(
    functools.partial(checks.check_grad, impl=rmsnorm),
    functools.partial(checks.check_grad_empty, impl=rmsnorm),
    functools.partial(checks.check_grad_huge, impl=rmsnorm),
    huge_gb=23,
)  # 21.5 GB printed
CASES.append(Case("grad: rmsnorm_backward", check_backward_function))
CASES += gemma_cases(functools.partial(checks.check, impl=rmsnorm), functools.partial(checks.check_grad, impl=rmsnorm))
CASES += no_weight_cases(
    functools.partial(checks.check, impl=rmsnorm), functools.partial(checks.check_grad, impl=rmsnorm)
)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("rmsnorm", CASES)
