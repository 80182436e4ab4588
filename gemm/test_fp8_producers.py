"""Tests for gemm/triton_fp8_producers.py: RMSNorm (with and without a residual) and the gated units
casting their output to e4m3 with a scale per row.

    python gemm/test_fp8_producers.py        (or: pytest gemm/test_fp8_producers.py)

Each call writes into buffers poisoned with NaN (q's NaN byte, NaN scales and y), with keep_y, so
that two things can be checked apart:
  y, the 16-bit output, against the fp64 reference (rmsnorm_ref, swiglu_ref, geglu_ref), with the
  tolerance of the unfused kernel's own test (one rounding of an fp32 result; normalization's
  default for the norm, mlp's ONE_ROUNDING for the gated units);
  q and scale against quantize_fp8's formula applied to that same y (gemm/reference_fp8.py), byte
  for byte: the cast reads y as rounded to the input's dtype, so it must be exact.
The public function is checked the same way (its path may differ from a forced one: in fp32 a
sum of squares in another order moves y, and so the scales), and without keep_y it must give the
bytes it gives with it. A scale from the unrounded fp32 values, a row's max taken over one block
only, or a block left unwritten fails.
"""

import torch

from llmk.devtools.testing import (
    EXACT,
    Case,
    Outcome,
    compare,
    dtype_name,
    expect_raises,
    main,
    opcheck,
    poisoned,
    rand,
)
from llmk.gemm.fp8_cases import FP8, poisoned_fp8, same_bits
from llmk.gemm.reference_fp8 import reference_quantize
from llmk.gemm.triton_fp8_producers import (
    geglu_fp8,
    glu_fp8_op,
    launch_glu_fp8,
    launch_rmsnorm_fp8,
    rmsnorm_fp8,
    rmsnorm_fp8_op,
    swiglu_fp8,
)
from llmk.mlp.mlp_cases import ONE_ROUNDING
from llmk.mlp.reference_mlp import geglu_ref, swiglu_ref
from llmk.mlp.triton_glu import geglu, swiglu
from llmk.normalization.reference_rmsnorm import residual_rmsnorm_ref, rmsnorm_ref
from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm
from llmk.normalization.triton_rmsnorm import rmsnorm

EPS = 1e-6
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
GLU = {
    "silu": lambda g, u: swiglu_ref(g, u),
    "gelu_tanh": lambda g, u: geglu_ref(g, u, "tanh"),
    "gelu": lambda g, u: geglu_ref(g, u, "none"),
}
PUBLIC = {
    "silu": lambda g, u, keep_y=True: swiglu_fp8(g, u, keep_y=keep_y),
    "gelu_tanh": lambda g, u, keep_y=True: geglu_fp8(g, u, "tanh", keep_y=keep_y),
    "gelu": lambda g, u, keep_y=True: geglu_fp8(g, u, "none", keep_y=keep_y),
}


def cast_checks(label, q, scale, y):
    """q and scale against quantize_fp8's formula on the y the same call wrote, byte for byte."""
    n = y.shape[-1]
    want_q, want_s = reference_quantize(y.reshape(-1, n), "row")
    return [
        same_bits(f"q = quantize_fp8(y){label}", q.reshape(-1, n), want_q),
        compare(f"scale = quantize_fp8(y)'s{label}", scale.reshape(-1), want_s, EXACT),
    ]


def source(shape, dtype, strided, scale=1.0):
    """rand(shape) or, strided, a view whose rows are 8 values longer (row stride N + 8)."""
    return rand(shape, dtype, scale=scale, pad=(0,) * (len(shape) - 1) + (8,) if strided else None)


def check_rmsnorm_fp8(
    shape,
    dtype,
    weight=True,
    offset=0.0,
    residual=False,
    one_pass=None,
    strided=False,
    scale=1.0,
    nan_at=None,
    zero_row=None,
):
    x = source(shape, dtype, strided, scale)
    if nan_at is not None:
        x[nan_at] = float("nan")
    if zero_row is not None:
        x[zero_row] = 0
    w = rand((shape[-1],), dtype) if weight else None
    r = rand(shape, dtype) if residual else None
    q, s, y = poisoned_fp8(shape), poisoned(shape[:-1], torch.float32), poisoned(shape, dtype)
    u = poisoned(shape, dtype) if residual else None
    launch_rmsnorm_fp8(x, r, w, EPS, offset, q, s, y, u, one_pass=one_pass)
    wd = w.double() if weight else None
    # u = x + residual rounded once to x's dtype (an fp32 sum of two 16-bit values is exact), and y
    # the norm of that rounded u
    want_u = (x.float() + r.float()).to(dtype) if residual else x
    want_y = rmsnorm_ref(want_u.double(), wd, EPS, offset)
    public = rmsnorm_fp8(x, w, EPS, offset=offset, residual=r, keep_y=True)
    plain = rmsnorm_fp8(x, w, EPS, offset=offset, residual=r)
    outcomes = (
        [compare("y", y, want_y)]
        + cast_checks("", q, s, y)
        + [compare("y, public", public.y, want_y)]
        + cast_checks(", public", public.q, public.scale, public.y)
        + [
            same_bits("q without keep_y", plain.q, public.q),
            compare("scale without keep_y", plain.scale, public.scale, EXACT),
        ]
    )
    if residual:
        outcomes += [
            compare("residual_out", u, want_u, EXACT),
            compare("residual_out, public", public.residual_out, want_u, EXACT),
        ]
    return outcomes


def check_glu_fp8(shape, dtype, activation, one_pass=None, strided=False, scale=1.0, nan_at=None, inf_at=None):
    """nan_at: a NaN in up there; inf_at: a gate there large enough that y overflows x's dtype to
    inf (its row's scale is then inf, its q NaN there and 0 elsewhere, as quantize_fp8 of that y
    gives them)."""
    gate, up = source(shape, dtype, strided, scale), source(shape, dtype, strided)
    if nan_at is not None:
        up[nan_at] = float("nan")
    if inf_at is not None:
        gate[inf_at], up[inf_at] = torch.finfo(dtype).max, 4.0
    q, s, y = poisoned_fp8(shape), poisoned(shape[:-1], torch.float32), poisoned(shape, dtype)
    launch_glu_fp8(gate, up, activation, q, s, y, one_pass=one_pass)
    want_y = GLU[activation](gate.double(), up.double())
    if inf_at is not None:  # the fp64 value, past the dtype's largest, rounds to inf there
        want_y[inf_at] = want_y[inf_at].to(dtype).double()
    public = PUBLIC[activation](gate, up)
    plain = PUBLIC[activation](gate, up, keep_y=False)
    return (
        [compare("y", y, want_y, ONE_ROUNDING[dtype])]
        + cast_checks("", q, s, y)
        + [compare("y, public", public.y, want_y, ONE_ROUNDING[dtype])]
        + cast_checks(", public", public.q, public.scale, public.y)
        + [
            same_bits("q without keep_y", plain.q, public.q),
            compare("scale without keep_y", plain.scale, public.scale, EXACT),
        ]
    )


def check_keep_y():
    """keep_y returns the y the cast read (the same bytes as a second call's q), and residual_out
    with a residual; empty rows give empty outputs with zero scales."""
    x, w, r = rand((6, 300), torch.bfloat16), rand((300,), torch.bfloat16), rand((6, 300), torch.bfloat16)
    kept = rmsnorm_fp8(x, w, EPS, residual=r, keep_y=True)
    plain = rmsnorm_fp8(x, w, EPS, residual=r)
    want_y, want_u = residual_rmsnorm_ref(x.double(), r.double(), w.double(), EPS)
    gate, up = rand((4, 96), torch.float16), rand((4, 96), torch.float16)
    glu = swiglu_fp8(gate, up, keep_y=True)
    outcomes = [
        compare("rmsnorm_fp8 keep_y: y", kept.y, want_y),
        compare("residual_out", kept.residual_out, want_u),
        same_bits("q with and without keep_y", kept.q, plain.q),
        compare("swiglu_fp8 keep_y: y", glu.y, swiglu_ref(gate.double(), up.double()), ONE_ROUNDING[torch.float16]),
    ]
    for name, out in (
        ("rmsnorm_fp8 (0, 64)", rmsnorm_fp8(rand((0, 64), torch.bfloat16), None)),
        ("rmsnorm_fp8 (2, 3, 0)", rmsnorm_fp8(rand((2, 3, 0), torch.bfloat16), None)),
        ("swiglu_fp8 (0, 64)", swiglu_fp8(rand((0, 64), torch.bfloat16), rand((0, 64), torch.bfloat16))),
    ):
        ok = out.q.dtype == FP8 and out.q.shape == out.scale.shape + out.q.shape[-1:] and bool((out.scale == 0).all())
        outcomes.append(Outcome(f"empty {name}", ok, note=f"q {tuple(out.q.shape)} scale {tuple(out.scale.shape)}"))
    return outcomes


def check_grads():
    """Gradients through y (keep_y) and residual_out are the 16-bit ops' backward kernels on the
    same saved inputs, so they equal rmsnorm's, residual_rmsnorm's, swiglu's and geglu's bit for bit.
    Without keep_y nothing 16-bit comes out: q and scale take no gradient."""
    bf16 = torch.bfloat16
    x, w, r = (t.requires_grad_() for t in (rand((6, 300), bf16), rand((300,), bf16), rand((6, 300), bf16)))
    dy, du = rand((6, 300), bf16), rand((6, 300), bf16)
    got = torch.autograd.grad(rmsnorm_fp8(x, w, EPS, keep_y=True).y, (x, w), dy)
    want = torch.autograd.grad(rmsnorm(x, w, EPS), (x, w), dy)
    outcomes = [compare(f"rmsnorm_fp8 d{n} = rmsnorm's", g, t, EXACT) for n, g, t in zip("xw", got, want)]
    out = rmsnorm_fp8(x, w, EPS, residual=r, keep_y=True)
    got = torch.autograd.grad((out.y, out.residual_out), (x, r, w), (dy, du))
    y, u = residual_rmsnorm(x, r, w, EPS)
    want = torch.autograd.grad((y, u), (x, r, w), (dy, du))
    outcomes += [
        compare(f"rmsnorm_fp8 residual: d{n} = residual_rmsnorm's", g, t, EXACT)
        for n, g, t in zip(("x", "residual", "weight"), got, want)
    ]
    gate, up = (rand((4, 96), bf16).requires_grad_() for _ in range(2))
    dy = rand((4, 96), bf16)
    for name, fused, plain in (
        ("swiglu_fp8", swiglu_fp8(gate, up, keep_y=True).y, swiglu(gate, up)),
        ("geglu_fp8 tanh", geglu_fp8(gate, up, keep_y=True).y, geglu(gate, up, "tanh")),
    ):
        got, want = torch.autograd.grad(fused, (gate, up), dy), torch.autograd.grad(plain, (gate, up), dy)
        outcomes += [
            compare(f"{name} d{n} = the 16-bit op's", g, t, EXACT) for n, g, t in zip(("gate", "up"), got, want)
        ]
    plain = rmsnorm_fp8(x, w, EPS)
    outcomes.append(
        Outcome(
            "without keep_y: q and scale take no gradient",
            not plain.q.requires_grad and not plain.scale.requires_grad and plain.y is None,
        )
    )
    return outcomes


def check_errors():
    x, w = rand((4, 64), torch.bfloat16), rand((64,), torch.bfloat16)
    return [
        expect_raises("int x", lambda: rmsnorm_fp8(x.to(torch.int32), w), TypeError, "x"),
        expect_raises("weight size", lambda: rmsnorm_fp8(x, w[:63]), ValueError, "weight"),
        expect_raises("residual shape", lambda: rmsnorm_fp8(x, w, residual=x[:3]), ValueError, "residual"),
        expect_raises("residual dtype", lambda: rmsnorm_fp8(x, w, residual=x.half()), ValueError, "residual"),
        expect_raises("negative eps", lambda: rmsnorm_fp8(x, w, -1.0), ValueError, "eps"),
        expect_raises("up shape", lambda: swiglu_fp8(x, x[:, :32]), ValueError, "up"),
        expect_raises("up dtype", lambda: swiglu_fp8(x, x.half()), TypeError, "up"),
        expect_raises("approximate", lambda: geglu_fp8(x, x, "erf"), ValueError, "approximate"),
        expect_raises("op: activation relu", lambda: glu_fp8_op(x, x, "relu", False), ValueError, "activation"),
        opcheck("opcheck llmk::rmsnorm_fp8", rmsnorm_fp8_op.overload, (x, x.clone(), w, EPS, 1.0, True)),
        opcheck("opcheck llmk::glu_fp8", glu_fp8_op.overload, (x, x.clone(), "silu", False)),
    ]


def cases():
    out = []

    def add(name, fn, gpu_only=False, gpu_gb=None, **kw):
        out.append(Case(name, fn, kw, gpu_only, gpu_gb))

    for dtype in DTYPES:
        dt = dtype_name(dtype)
        add(f"rmsnorm_fp8 (7, 100) {dt}", check_rmsnorm_fp8, shape=(7, 100), dtype=dtype, zero_row=3)
        add(
            f"rmsnorm_fp8 (5, 333) three passes, residual {dt}",
            check_rmsnorm_fp8,
            shape=(5, 333),
            dtype=dtype,
            one_pass=False,
            residual=True,
        )
        add(f"swiglu_fp8 (7, 100) {dt}", check_glu_fp8, shape=(7, 100), dtype=dtype, activation="silu")
        add(
            f"swiglu_fp8 (5, 333) two passes {dt}",
            check_glu_fp8,
            shape=(5, 333),
            dtype=dtype,
            activation="silu",
            one_pass=False,
        )
    bf16 = torch.bfloat16
    add("rmsnorm_fp8 (1, 1)", check_rmsnorm_fp8, shape=(1, 1), dtype=bf16)
    add(
        "rmsnorm_fp8 (2, 9, 64) no weight, row-strided view",
        check_rmsnorm_fp8,
        shape=(2, 9, 64),
        dtype=bf16,
        weight=False,
        strided=True,
    )
    add(
        "rmsnorm_fp8 (6, 200) Gemma offset 1, residual",
        check_rmsnorm_fp8,
        shape=(6, 200),
        dtype=bf16,
        offset=1.0,
        residual=True,
    )
    add(
        "rmsnorm_fp8 (5, 300) a NaN, three passes",
        check_rmsnorm_fp8,
        shape=(5, 300),
        dtype=bf16,
        one_pass=False,
        nan_at=(2, 17),
    )
    add("rmsnorm_fp8 (5, 300) a NaN", check_rmsnorm_fp8, shape=(5, 300), dtype=torch.float32, nan_at=(4, 299))
    # |y| ~ 1e-7 (rstd stops at eps^-1/2): amax just above AMAX_FLOOR, q on e4m3's subnormals too
    add("rmsnorm_fp8 (9, 40) x 1e-10 fp32", check_rmsnorm_fp8, shape=(9, 40), dtype=torch.float32, scale=1e-10)
    add(
        "geglu_fp8 tanh (3, 5, 70) row-strided view",
        check_glu_fp8,
        shape=(3, 5, 70),
        dtype=bf16,
        activation="gelu_tanh",
        strided=True,
    )
    add(
        "geglu_fp8 exact (6, 129) two passes",
        check_glu_fp8,
        shape=(6, 129),
        dtype=torch.float16,
        activation="gelu",
        one_pass=False,
    )
    add("swiglu_fp8 (4, 50) gate x 100", check_glu_fp8, shape=(4, 50), dtype=bf16, activation="silu", scale=100.0)
    add(
        "swiglu_fp8 (6, 300) a NaN, an inf, two passes",
        check_glu_fp8,
        shape=(6, 300),
        dtype=torch.float16,
        activation="silu",
        one_pass=False,
        nan_at=(1, 250),
        inf_at=(4, 3),
    )
    add(
        "geglu_fp8 tanh (6, 300) a NaN, an inf",
        check_glu_fp8,
        shape=(6, 300),
        dtype=bf16,
        activation="gelu_tanh",
        nan_at=(0, 0),
        inf_at=(5, 299),
    )
    add("keep_y, residual_out, empty inputs", check_keep_y)
    add("gradients through y and residual_out", check_grads)
    add("bad input, opcheck", check_errors)
    # model widths: one pass up to ONE_PASS_MAX values a row, passes over L2 past it
    add("rmsnorm_fp8 (4096, 4096) bf16", check_rmsnorm_fp8, True, shape=(4096, 4096), dtype=bf16)
    add(
        "rmsnorm_fp8 (2048, 16384) residual, three passes bf16",
        check_rmsnorm_fp8,
        True,
        shape=(2048, 16384),
        dtype=bf16,
        residual=True,
    )
    add(
        "swiglu_fp8 (4096, 14336) two passes bf16",
        check_glu_fp8,
        True,
        shape=(4096, 14336),
        dtype=bf16,
        activation="silu",
    )
    add("geglu_fp8 tanh (2048, 8192) bf16", check_glu_fp8, True, shape=(2048, 8192), dtype=bf16, activation="gelu_tanh")
    return out


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("FP8 producers: rmsnorm_fp8, swiglu_fp8, geglu_fp8", CASES)
