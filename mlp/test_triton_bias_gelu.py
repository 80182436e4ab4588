"""Tests for mlp/triton_bias_gelu.py against the fp64 reference and F.gelu(x + bias).

The tolerance is one rounding (mlp/mlp_cases.py: half an ulp, not common.testing's whole ulp), and
PyTorch's same-dtype result bounds the error too (the 2x rule); it rounds x + bias before the GELU,
the kernel does not.

    python mlp/test_triton_bias_gelu.py        (or: pytest mlp/test_triton_bias_gelu.py)
"""
import contextlib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common.device import DEVICE  # noqa: E402
from common.testing import (Case, Outcome, Tol, compare, dtype_name, expect_raises, main, poisoned, rand,  # noqa: E402
                            shape_case)
from mlp.gelu import APPROXIMATIONS, bias_gelu_ref  # noqa: E402
from mlp.mlp_cases import (DTYPES, ONE_ROUNDING, WIDTHS, every_value, forced_tile_cases, huge_rows,  # noqa: E402
                           overflow_expected)
from mlp.tiling import tile_config_for  # noqa: E402
from mlp.triton_bias_gelu import bias_gelu, launch_bias_gelu  # noqa: E402


def check(shape, dtype, approximate="none", pad=None, scale=1.0, bias_dtype=None, has_bias=True):
    x = rand(shape, dtype, pad=pad, scale=scale)
    b = rand((shape[-1],), bias_dtype or dtype) if has_bias else None
    with overflow_expected() if scale > 100 else contextlib.nullcontext():
        y = bias_gelu(x, b, approximate, out=poisoned(shape, dtype))
    ref = bias_gelu_ref(x.double(), None if b is None else b.double(), approximate)
    # PyTorch's own same-dtype result bounds our error; it needs x and bias in one dtype
    torch_out = None if bias_dtype else F.gelu(x + b if has_bias else x, approximate=approximate)
    # inf/NaN where the reference is finite fails too
    return [compare("y", y, ref, ONE_ROUNDING[dtype], torch_out=torch_out)]


def check_extremes(dtype, approximate):
    """gelu(-1e4) = 0 and gelu(1e4) = 1e4 exactly (as the value 1e4 rounds to in dtype); NaN in,
    NaN out."""
    pick = torch.randint(0, 3, (7, 129), device=DEVICE)
    x = torch.tensor([-1e4, 1e4, float("nan")], device=DEVICE)[pick].to(dtype)
    with overflow_expected():
        y = bias_gelu(x, None, approximate, out=poisoned(x.shape, dtype))
    return [Outcome("gelu(-1e4) == 0", bool((y[pick == 0] == 0).all())),
            Outcome("gelu(1e4) == 1e4", bool((y[pick == 1] == x[pick == 1]).all())),
            Outcome("gelu(NaN) is NaN", bool(y[pick == 2].isnan().all()))]


# The exact form's own error in fp32 (mlp/triton_bias_gelu.py): relative < 2e-6 where |y| > 1e-4,
# 3e-6 further out, absolute < 1.1e-7 below; with the GPU's exp2 (2 ulps) on top, twice that.
EXACT_FP32 = Tol(2.2e-7, 4e-6, "the exact form's measured fp32 error, doubled")


def check_every_value(dtype, approximate):
    """Every fp16 / bf16 value (fp32: a grid over [-8, 8]): both tails, the switch at |z| = 5.5,
    subnormals, and in bf16 values up to 3e38 (z^3 overflows in the tanh form)."""
    x = every_value(dtype, fp32_limit=8.0)
    with overflow_expected():
        y = bias_gelu(x, None, approximate, out=poisoned(x.shape, dtype))
    ref = bias_gelu_ref(x.double(), None, approximate)
    tol = EXACT_FP32 if dtype == torch.float32 and approximate == "none" else ONE_ROUNDING[dtype]
    with overflow_expected():
        torch_out = F.gelu(x, approximate=approximate)
    return [compare("y", y, ref, tol, torch_out=torch_out)]


def check_own_buffer():
    x, b = rand((9, 41), torch.float16), rand((41,), torch.float16)
    return [compare("y", bias_gelu(x, b), bias_gelu_ref(x.double(), b.double()), ONE_ROUNDING[x.dtype])]


def check_huge(n_cols):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    x, b = rand((rows, n_cols), torch.float16), rand((n_cols,), torch.float16)
    y = bias_gelu(x, b, out=poisoned((rows, n_cols), torch.float16))
    ref = bias_gelu_ref(x[-4:].double(), b.double())
    return [compare("last rows", y[-4:], ref, ONE_ROUNDING[torch.float16])]


def check_errors():
    x, b = rand((4, 64), torch.float16), rand((64,), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("bias size", lambda: bias_gelu(x, b[:63]), ValueError, "bias"),
        expect_raises("bias 2-D", lambda: bias_gelu(x, b[None]), ValueError, "bias"),
        expect_raises("approximate='exact'", lambda: bias_gelu(x, b, "exact"), ValueError, "approximate"),
        expect_raises("approximate=None", lambda: bias_gelu(x, b, None), ValueError, "approximate"),
        expect_raises("int x", lambda: bias_gelu(x.to(torch.int32), b), TypeError, "x"),
        expect_raises("int bias", lambda: bias_gelu(x, b.to(torch.int32)), TypeError, "bias"),
        expect_raises(f"x on {other}", lambda: bias_gelu(x.to(other), b.to(other)), ValueError, "x"),
        expect_raises("bias elsewhere", lambda: bias_gelu(x, b.to(other)), ValueError, "bias"),
        expect_raises("not a tensor", lambda: bias_gelu([1.0], b), TypeError, "x"),
        expect_raises("0-dim x", lambda: bias_gelu(x[0, 0], b), ValueError, "x"),
        expect_raises("out shape", lambda: bias_gelu(x, b, out=x[:2].clone()), ValueError, "out"),
        expect_raises("out dtype", lambda: bias_gelu(x, b, out=x.float()), ValueError, "out"),
        expect_raises("out strided", lambda: bias_gelu(x, b, out=x.clone().t().contiguous().t()),
                      ValueError, "out"),
    ]


def check_grad_mode():
    """Forward-only: in grad mode a bias that requires grad (an nn.Parameter) raises, naming the
    operator; under torch.no_grad() the call gives what it gives on a plain bias."""
    x, b = rand((4, 64), torch.float16), rand((64,), torch.float16)
    b_param = torch.nn.Parameter(b.clone())
    with torch.no_grad():
        y, y_out = bias_gelu(x, b_param), bias_gelu(x, b_param, out=poisoned(x.shape, x.dtype))
    return [expect_raises("bias requires grad", lambda: bias_gelu(x, b_param), RuntimeError,
                          "llmk::bias_gelu is forward-only"),
            expect_raises("bias requires grad, out=", lambda: bias_gelu(x, b_param, out=torch.empty_like(x)),
                          RuntimeError, "llmk::bias_gelu_out is forward-only"),
            Outcome("under no_grad: as with a plain bias", torch.equal(y, bias_gelu(x, b)) and torch.equal(y_out, y))]


def check_empty():
    outcomes = []
    for shape in ((0, 64), (2, 0, 64), (3, 0)):
        x, b = rand(shape, torch.bfloat16), rand((shape[-1],), torch.bfloat16)
        y = bias_gelu(x, b)
        outcomes.append(Outcome(f"{shape}: empty in, empty out", y.shape == x.shape and y.dtype == x.dtype))
    return outcomes


def cases():
    out = []

    def add(shape, dtype, approximate="none", gpu_only=False, **extra):
        out.append(shape_case(check, shape, dtype, gpu_only, approximate=approximate, **extra))

    for dtype in DTYPES:
        for approximate in APPROXIMATIONS:
            for n in WIDTHS:
                add((3, n), dtype, approximate)
            add((3, 5120), dtype, approximate, scale=1e4)          # large values: exp overflows, no NaN
            out.append(Case(f"extremes {dtype_name(dtype)} {approximate}", check_extremes,
                            dict(dtype=dtype, approximate=approximate)))
            out.append(Case(f"every value {dtype_name(dtype)} {approximate}", check_every_value,
                            dict(dtype=dtype, approximate=approximate)))
        add((1, 4096), dtype)
        add((37, 64), dtype)                                      # several row tiles, the last one partial
        add((257, 123), dtype, "tanh")                            # row and column masks together
        add((2, 3, 123), dtype)
        add((5, 760), dtype, pad=(0, 8))                          # row stride 768, a view, no copy
        add((2, 5, 1000), dtype, "tanh", pad=(0, 3, 0))           # leading dims that cannot merge
        add((4096, 16384), dtype, gpu_only=True)
        add((8192, 14336), dtype, "tanh", gpu_only=True)
        add((2049, 11008), dtype, gpu_only=True, pad=(0, 64))     # 11008 = 43 * 256: column tiles of 256
    add((2, 4096), torch.bfloat16, bias_dtype=torch.float32)      # a bias kept in fp32
    add((5, 1000), torch.float16, has_bias=False)                 # plain GELU
    add((5, 1000), torch.float32, "tanh", has_bias=False)
    return out + [Case("allocates its output", check_own_buffer), Case("bad input", check_errors),
                  Case("empty input", check_empty), Case("grad mode (forward-only)", check_grad_mode),
                  Case("2^31+ elements", check_huge, dict(n_cols=4096), gpu_only=True)]


CASES = cases()


def check_forced(row, shape, dtype):
    """A TILE_TABLE entry's whole tile, which the interpreter's small matrices otherwise halve."""
    x, b = rand(shape, dtype), rand((shape[-1],), dtype)
    cfg = tile_config_for(row, *shape, x.element_size(), min_programs=1)
    y = poisoned(shape, dtype)
    launch_bias_gelu(x, b, "none", y, cfg)
    return [Outcome("whole tile", cfg.BLOCK_M * cfg.BLOCK_N == row[1], note=str(cfg)),
            compare("y", y, bias_gelu_ref(x.double(), b.double()), ONE_ROUNDING[dtype], torch_out=F.gelu(x + b))]


CASES += forced_tile_cases("bias_gelu", check_forced)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("bias_gelu", CASES)
