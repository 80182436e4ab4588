"""Tests for mlp/triton_bias_gelu.py against the fp64 reference and F.gelu(x + bias).

The tolerance is one rounding (mlp/mlp_cases.py: half an ulp, not devtools.testing's whole ulp), and
PyTorch's same-dtype result bounds the error too (the 2x rule); it rounds x + bias before the GELU,
the kernel does not. The gradients: dx the same way (one rounding), against autograd through the
fp64 reference and PyTorch's own same-dtype gradients of F.gelu(x + bias); dbias, an fp32 sum
rounded once, within the error bound of its order of summation (dbias_tol).

    python mlp/test_bias_gelu.py        (or: pytest mlp/test_bias_gelu.py)
"""

import contextlib
import dataclasses

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE, sm_count
from llmk.common.reduce import INTERPRETER_SMS, sum_config
from llmk.devtools.testing import (
    UNIT_ROUNDOFF,
    Case,
    Outcome,
    Tol,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    grads_of,
    main,
    poisoned,
    rand,
    shape_case,
)
from llmk.mlp.launch_config import BAND_TABLE, band_config, band_config_for, tile_config_for
from llmk.mlp.mlp_cases import (
    DTYPES,
    ONE_ROUNDING,
    WIDTHS,
    every_value,
    forced_tile_cases,
    huge_rows,
    overflow_expected,
    upstream,
)
from llmk.mlp.reference_mlp import APPROXIMATIONS, bias_gelu_ref
from llmk.mlp.triton_bias_gelu import bias_gelu, launch_bias_gelu, launch_bias_gelu_backward

NAMES = ("x", "bias")
GELU_SLOPE_MAX = 1.13  # max |gelu'(z)| (1.129 at z = 1.41, either form): |dx| <= 1.13 |dy|


def reduce_step(n_bands, n_cols):
    """Bands the reduce (common.reduce.sum_partials) adds in one step, as its sum_config picks."""
    return sum_config(n_bands, n_cols, sm_count(DEVICE, INTERPRETER_SMS))[0]


def sum_depth(cfg, n_rows, n_cols):
    """Additions on the longest path of dbias's summation under launch config cfg: a tree over
    BLOCK_M rows, ROWS / BLOCK_M iterations a band, a tree over a step of bands in the reduce, and
    its steps. Recursive and tree summation of terms t_i in fp32 err by at most depth * 2^-24 *
    sum |t_i| (first order)."""
    block_b = min(reduce_step(cfg.n_bands, n_cols), cfg.n_bands)
    return (
        max(cfg.BLOCK_M, 2).bit_length()
        + min(cfg.ROWS, n_rows) // cfg.BLOCK_M
        + max(block_b, 2).bit_length()
        + -(-cfg.n_bands // block_b)
    )


def dbias_tol(dy, bias_dtype, cfg):
    """dbias's bound, per column: the fp32 summation's error over the terms |dx| <= 1.13 |dy|, plus
    each term's own fp32 error (the rounding of dy * gelu'(z), gelu''s polynomial, the rounding of
    x + bias: under 7e-7 |dy| together, so 2^-20 |dy|), plus the one rounding to bias's dtype."""
    dy2 = dy.detach().reshape(-1, dy.shape[-1])
    depth = sum_depth(cfg, *dy2.shape)
    info = torch.finfo(bias_dtype)
    # |dy| is exact in dy's dtype; summed in fp64 without an fp64 copy (2^31+ elements on the GPU)
    atol = (depth * 2**-24 * GELU_SLOPE_MAX + 2**-20) * dy2.abs().sum(0, dtype=torch.float64) + info.tiny * info.eps / 2
    return Tol(
        atol,
        UNIT_ROUNDOFF[bias_dtype],
        "fp32 summation of dx (depth * 2^-24 * sum |dx|), each term's "
        "fp32 error, one rounding to bias's dtype (half an ulp, of a "
        "subnormal too)",
    )


def grad_tol(dy, dtype, bias_dtype, cfg):
    """check_grads' tolerance by gradient: dx one rounding (mlp_cases.ONE_ROUNDING), dbias dbias_tol."""
    return lambda name, ref: ONE_ROUNDING[dtype] if name == "x" else dbias_tol(dy, bias_dtype, cfg)


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


def check_grad(
    shape,
    dtype,
    approximate="none",
    pad=None,
    scale=1.0,
    bias_dtype=None,
    has_bias=True,
    wrt=(0, 1),
    dy_layout="packed",
):
    """dx and dbias (or one of them, wrt) against autograd through the fp64 reference."""
    x = rand(shape, dtype, pad=pad, scale=scale)
    b = rand((shape[-1],), bias_dtype or dtype) if has_bias else None
    dy = upstream(shape, dtype, dy_layout)
    rows = x.numel() // shape[-1]
    cfg = band_config("bias_gelu_backward", rows, shape[-1], x.element_size(), has_bias and 1 in wrt)
    # PyTorch's own same-dtype gradients bound ours; it needs x and bias in one dtype
    torch_fn = None if bias_dtype else lambda x, b: F.gelu(x if b is None else x + b, approximate=approximate)
    with overflow_expected() if scale > 100 else contextlib.nullcontext():
        return check_grads(
            f"bias_gelu {approximate}",
            lambda x, b: bias_gelu(x, b, approximate),
            lambda x, b: bias_gelu_ref(x, b, approximate),
            (x, b),
            wrt if has_bias else (0,),
            NAMES,
            grad_tol(dy, dtype, bias_dtype or dtype, cfg),
            torch_fn=torch_fn,
            grad_outputs=[dy],
        )


def check_grad_every_value(dtype, approximate):
    """dx at every fp16 or bf16 value: both tails, the switch at |z| = 5.5, subnormals, and in bf16
    values up to 3e38, where z^2 and z^3 overflow: slopes 0 or 1, no NaN."""
    x = every_value(dtype, fp32_limit=8.0)
    dy = upstream(x.shape, dtype)
    with overflow_expected():
        return check_grads(
            f"bias_gelu {approximate}",
            lambda x: bias_gelu(x, None, approximate),
            lambda x: bias_gelu_ref(x, None, approximate),
            (x,),
            (0,),
            NAMES,
            ONE_ROUNDING[dtype],
            torch_fn=lambda x: F.gelu(x, approximate=approximate),
            grad_outputs=[dy],
        )


def check_extremes(dtype, approximate):
    """gelu(-1e4) = 0 and gelu(1e4) = 1e4 exactly (as the value 1e4 rounds to in dtype); NaN in,
    NaN out."""
    pick = torch.randint(0, 3, (7, 129), device=DEVICE)
    x = torch.tensor([-1e4, 1e4, float("nan")], device=DEVICE)[pick].to(dtype)
    with overflow_expected():
        y = bias_gelu(x, None, approximate, out=poisoned(x.shape, dtype))
    return [
        Outcome("gelu(-1e4) == 0", bool((y[pick == 0] == 0).all())),
        Outcome("gelu(1e4) == 1e4", bool((y[pick == 1] == x[pick == 1]).all())),
        Outcome("gelu(NaN) is NaN", bool(y[pick == 2].isnan().all())),
    ]


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


def check_many_bands():
    """More bands than the reduce's step (reduce_step): it adds them in two steps. One-row bands of
    8 columns keep the interpreter's work small."""
    shape, dtype = (reduce_step(2**20, 8) + 6, 8), torch.float16
    x, b, dy = rand(shape, dtype), rand((shape[-1],), dtype), rand(shape, dtype)
    cfg = band_config_for((8, 8, 1), *shape, x.element_size(), 1, min_programs=1)
    db = poisoned((shape[-1],), dtype)
    launch_bias_gelu_backward(dy, x, b, "none", None, db, cfg)
    _, want = grads_of(bias_gelu_ref, (x, b), (1,), [dy], dtype=torch.float64)
    return [
        Outcome("bands past one step", cfg.n_bands > reduce_step(cfg.n_bands, shape[-1]), note=str(cfg)),
        compare("dbias", db, want[0], dbias_tol(dy, dtype, cfg)),
    ]


def check_grad_huge(n_cols):
    """The gradients past 2^31 elements: dx's last rows, where a 32-bit offset would wrap, and
    dbias (its fp64 reference summed in slices of rows)."""
    rows = huge_rows(n_cols)
    x, b = rand((rows, n_cols), torch.float16), rand((n_cols,), torch.float16)
    dy = upstream((rows, n_cols), torch.float16)
    dx, db = grads_of(bias_gelu, (x, b), (0, 1), [dy])[1]
    _, want = grads_of(bias_gelu_ref, (x[-4:], b), (0,), [dy[-4:]], dtype=torch.float64)
    db_ref = sum(
        grads_of(bias_gelu_ref, (x[i : i + 2**16], b), (1,), [dy[i : i + 2**16]], dtype=torch.float64)[1][0]
        for i in range(0, rows, 2**16)
    )
    cfg = band_config("bias_gelu_backward", rows, n_cols, 2, True)
    return [
        compare("dx, last rows", dx[-4:], want[0], ONE_ROUNDING[torch.float16]),
        compare("dbias", db, db_ref, dbias_tol(dy, torch.float16, cfg)),
    ]


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
        expect_raises("out strided", lambda: bias_gelu(x, b, out=x.clone().t().contiguous().t()), ValueError, "out"),
    ]


def check_grad_mode():
    """Under grad (a bias that is an nn.Parameter) the call gives what it gives under
    torch.no_grad(), bit for bit; out= stays forward-only: it raises, naming the operator."""
    x, b = rand((4, 64), torch.float16), rand((64,), torch.float16)
    b_param = torch.nn.Parameter(b.clone())
    with torch.no_grad():
        y, y_out = bias_gelu(x, b_param), bias_gelu(x, b_param, out=poisoned(x.shape, x.dtype))
    y_grad = bias_gelu(x, b_param)
    return [
        expect_raises(
            "bias requires grad, out=",
            lambda: bias_gelu(x, b_param, out=torch.empty_like(x)),
            RuntimeError,
            "llmk::bias_gelu_out is forward-only",
        ),
        Outcome("under grad: as under no_grad", torch.equal(y_grad, y) and y_grad.requires_grad),
        Outcome("under no_grad: as with a plain bias", torch.equal(y, bias_gelu(x, b)) and torch.equal(y_out, y)),
    ]


def check_grad_empty():
    """Empty x: an empty dx, and dbias = 0 (a sum over no rows) where the bias is not empty."""
    outcomes = []
    for shape in ((0, 64), (2, 0, 64), (3, 0)):
        x = rand(shape, torch.bfloat16).requires_grad_()
        b = rand((shape[-1],), torch.bfloat16).requires_grad_()
        dx, db = torch.autograd.grad(bias_gelu(x, b), (x, b), torch.ones(shape, dtype=torch.bfloat16, device=DEVICE))
        ok = dx.shape == x.shape and db.shape == b.shape and bool((db == 0).all())
        outcomes.append(Outcome(f"{shape}: empty dx, zero dbias", ok))
    return outcomes


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
            add((3, 5120), dtype, approximate, scale=1e4)  # large values: exp overflows, no NaN
            out.append(
                Case(
                    f"extremes {dtype_name(dtype)} {approximate}",
                    check_extremes,
                    dict(dtype=dtype, approximate=approximate),
                )
            )
            out.append(
                Case(
                    f"every value {dtype_name(dtype)} {approximate}",
                    check_every_value,
                    dict(dtype=dtype, approximate=approximate),
                )
            )
        add((1, 4096), dtype)
        add((37, 64), dtype)  # several row tiles, the last one partial
        add((257, 123), dtype, "tanh")  # row and column masks together
        add((2, 3, 123), dtype)
        add((5, 760), dtype, pad=(0, 8))  # row stride 768, a view, no copy
        add((2, 5, 1000), dtype, "tanh", pad=(0, 3, 0))  # leading dims that cannot merge
        add((4096, 16384), dtype, gpu_only=True)
        add((8192, 14336), dtype, "tanh", gpu_only=True)
        add((2049, 11008), dtype, gpu_only=True, pad=(0, 64))  # 11008 = 43 * 256: column tiles of 256
    add((2, 4096), torch.bfloat16, bias_dtype=torch.float32)  # a bias kept in fp32
    add((5, 1000), torch.float16, has_bias=False)  # plain GELU
    add((5, 1000), torch.float32, "tanh", has_bias=False)

    def grad(shape, dtype, approximate="none", gpu_only=False, **extra):  # named apart from the forward's
        case = shape_case(check_grad, shape, dtype, gpu_only, approximate=approximate, **extra)
        out.append(dataclasses.replace(case, name=f"grad {case.name}"))

    for dtype in DTYPES:  # gradients
        for approximate in APPROXIMATIONS:
            grad((3, 1000), dtype, approximate)
        grad((257, 123), dtype, "tanh" if dtype == torch.bfloat16 else "none")  # row and column masks
        grad((1, 4096), dtype)  # one row
        grad((2, 3, 123), dtype, "tanh")  # dbias summed over two leading dims
        grad((2, 5, 1000), dtype, pad=(0, 3, 0))  # leading dims that cannot merge
        grad((33, 64), dtype, pad=(0, 8), dy_layout="transposed")  # x a view of row stride 72; dy copied
        grad((4096, 16384), dtype, gpu_only=True)
        grad((8192, 14336), dtype, "tanh", gpu_only=True)
        grad((2049, 11008), dtype, gpu_only=True, pad=(0, 64))
    # saturated GELU, slopes 0 or 1 and no NaN: every fp16 and bf16 value (to 3e38), fp32 values to ~4e4
    for approximate in APPROXIMATIONS:
        for dtype in (torch.float16, torch.bfloat16):
            out.append(
                Case(
                    f"grad every value {dtype_name(dtype)} {approximate}",
                    check_grad_every_value,
                    dict(dtype=dtype, approximate=approximate),
                )
            )
        grad((3, 5120), torch.float32, approximate, scale=1e4)
    grad((5, 1), torch.float16)  # one column: dbias sums a column
    grad((37, 64), torch.bfloat16, "tanh", dy_layout="expanded")  # dy with row stride 0 (a broadcast)
    grad((2, 4096), torch.bfloat16, bias_dtype=torch.float32)  # a bias kept in fp32: dbias in fp32
    grad((5, 1000), torch.float16, has_bias=False)  # plain GELU
    grad((7, 1000), torch.float16, wrt=(0,))  # dx only: no partial sums
    grad((7, 1000), torch.bfloat16, "tanh", wrt=(1,))  # dbias only: dx is not written
    return out + [
        Case("dbias over more bands than one reduce step", check_many_bands),
        Case("allocates its output", check_own_buffer),
        Case("bad input", check_errors),
        Case("empty input", check_empty),
        Case("grad mode", check_grad_mode),
        Case("grad of empty input", check_grad_empty),
        Case("2^31+ elements", check_huge, dict(n_cols=4096), gpu_only=True),
        Case("grad 2^31+ elements", check_grad_huge, dict(n_cols=4096), gpu_only=True, gpu_gb=38),
    ]  # 36.5 GB printed


CASES = cases()


def check_forced(row, shape, dtype):
    """A TILE_TABLE entry's whole tile, which the interpreter's small matrices otherwise halve."""
    x, b = rand(shape, dtype), rand((shape[-1],), dtype)
    cfg = tile_config_for(row, *shape, x.element_size(), min_programs=1)
    y = poisoned(shape, dtype)
    launch_bias_gelu(x, b, "none", y, cfg)
    return [
        Outcome("whole tile", cfg.BLOCK_M * cfg.BLOCK_N == row[1], note=str(cfg)),
        compare("y", y, bias_gelu_ref(x.double(), b.double()), ONE_ROUNDING[dtype], torch_out=F.gelu(x + b)),
    ]


CASES += forced_tile_cases("bias_gelu", check_forced)

FORCED_BAND_ROWS = 32  # with the table's BLOCK_M (16 or 8 rows at 1000 columns): 2 or 4 iterations a band


def check_forced_backward(row, shape, dtype):
    """A BAND_TABLE entry's whole tile, in bands of several iterations (which the interpreter's small
    matrices otherwise cut to one), the last band part-full and its last iteration masked."""
    x, b, dy = rand(shape, dtype), rand((shape[-1],), dtype), rand(shape, dtype)
    cfg = band_config_for(row, *shape, x.element_size(), FORCED_BAND_ROWS, min_programs=1)
    dx, db = poisoned(shape, dtype), poisoned((shape[-1],), dtype)
    launch_bias_gelu_backward(dy, x, b, "tanh", dx, db, cfg)
    _, want = grads_of(lambda x, b: bias_gelu_ref(x, b, "tanh"), (x, b), (0, 1), [dy], dtype=torch.float64)
    _, theirs = grads_of(lambda x, b: F.gelu(x + b, approximate="tanh"), (x, b), (0, 1), [dy])
    return [
        Outcome(
            "whole tile, several iterations a band",
            cfg.BLOCK_M * cfg.BLOCK_N == row[1] and cfg.ROWS > cfg.BLOCK_M and shape[0] % cfg.ROWS != 0,
            note=str(cfg),
        ),
        compare("dx", dx, want[0], ONE_ROUNDING[dtype], torch_out=theirs[0]),
        compare("dbias", db, want[1], dbias_tol(dy, dtype, cfg), torch_out=theirs[1]),
    ]


CASES += forced_tile_cases("bias_gelu_backward", check_forced_backward, shape=(37, 1000), table=BAND_TABLE)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("bias_gelu", CASES)
