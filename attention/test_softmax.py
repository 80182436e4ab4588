"""Tests for attention/triton_softmax.py against torch.softmax in fp64 (the reference) and in the
input dtype (PyTorch's own error, which bounds ours at 2x).

    python attention/test_softmax.py        (or: pytest attention/test_softmax.py)

Every check names the path its shape took on this tier (fused, looped or split). Widths sit either
side of each row of the heuristics table; the looped/split switch is a row count per SM, so the
property checks build their shapes at run time from the device's SM count (the interpreter
counts 2), and each asserts that its shape takes the path it is meant to test.

Backward: dx against autograd through torch.softmax in fp64 and torch.softmax's own same-dtype dx
(check_grads), under the error model of grad_tol, on each path of SOFTMAX_BWD_TABLE, with strided,
transposed and expanded upstream gradients; the launcher on a poisoned dx; properties (rows of dx
sum to 0, dy + c per row gives the same dx). `out=` stays forward-only.
"""

import math

import torch

from llmk.attention.triton_softmax import (
    INTERPRET_SMS,
    SOFTMAX_BWD_TABLE,
    SOFTMAX_TABLE,
    SPLIT_BELOW_ROWS_PER_SM,
    launch_softmax_backward,
    softmax,
    softmax_backward_config,
    softmax_config,
    table_row,
)
from llmk.common.device import DEVICE, sm_count
from llmk.devtools.testing import (
    TOLERANCES,
    UNIT_ROUNDOFF,
    Case,
    Outcome,
    Tol,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    main,
    poisoned,
    rand,
    select_cases,
    shape_case,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WIDTHS = (1, 7, 123, 1000, 4096, 5120, 65537, 262144)
# either side of each row of the table: the last width of a row and the first of the next
SWITCH_WIDTHS = tuple(w for b, *_ in SOFTMAX_TABLE if b for w in (b, b + 1))
PATHS = ("fused", "looped", "split")
EXACT = Tol(0.0, 0.0, "exp(0) = 1 and exp(-inf) = 0 exactly, and the sum is 1")


def path_of(x, config=softmax_config):
    n_cols = x.shape[-1]
    return config(x.numel() // n_cols, n_cols, sm_count(x.device.index or 0, INTERPRET_SMS)).path


def bwd_path_of(x):
    return path_of(x, softmax_backward_config)


def shape_for(path):
    """A small shape that takes `path` on this device: the looped and split shapes sit either side
    of the row count where the split path takes over."""
    switch = SPLIT_BELOW_ROWS_PER_SM * sm_count(torch.device(DEVICE).index or 0, INTERPRET_SMS)
    return {"fused": (5, 1000), "looped": (switch, 8193), "split": (switch - 1, 20000)}[path]


def sums_to_one(y):
    """Each output is within rtol of its exact value (compare()'s per-element bound), so a row sums
    to 1 within rtol; outputs below the smallest normal number sit on a fixed grid instead, up to
    half its step (fp16: 2^-25) off each, which N of them can add up (N = 262144: 0.008)."""
    info = torch.finfo(y.dtype)
    limit = TOLERANCES[y.dtype].rtol + y.shape[-1] * info.smallest_normal * info.eps / 2
    err = (y.double().sum(-1) - 1).abs().max().item()
    return Outcome("rows sum to 1", err <= limit, max_abs=err, limit=f"{limit:.1e}")


def check(shape, dtype, pad=None):
    x = rand(shape, dtype, pad=pad)
    y = softmax(x, out=poisoned(shape, dtype))
    ref = torch.softmax(x.double(), -1)
    return [compare(f"y ({path_of(x)})", y, ref, torch_out=torch.softmax(x, -1)), sums_to_one(y)]


def check_column_stride():
    """Last dim not unit-stride (a transposed view): copied once, then the fused path."""
    x = rand((64, 9), torch.float16).t()
    y = softmax(x, out=poisoned(x.shape, x.dtype))
    return [compare("y", y, torch.softmax(x.double(), -1), torch_out=torch.softmax(x, -1))]


def check_own_buffer():
    x = rand((9, 41), torch.bfloat16)
    return [compare("y", softmax(x), torch.softmax(x.double(), -1), torch_out=torch.softmax(x, -1))]


def check_in_place(path):
    x = rand(shape_for(path), torch.float16)
    ref, torch_out = torch.softmax(x.double(), -1), torch.softmax(x, -1)
    y = softmax(x, out=x)
    return [
        Outcome(f"takes the {path} path", path_of(x) == path),
        Outcome("returns out", y is x),
        compare("y written over x", y, ref, torch_out=torch_out),
    ]


def check_shift(path, dtype):
    """softmax(x + c) = softmax(x) for a constant c per row. x and c are multiples of 1/2 with
    |x + c| < 64 (fp32: < 1e4 + 16), so x + c is exact in every dtype and both calls see the same
    differences x - max; only the same-dtype rounding of the result is allowed to differ."""
    shape = shape_for(path)
    c_max = 10000 if dtype == torch.float32 else 32
    x = (torch.randint(-32, 33, shape, device=DEVICE) / 2).to(dtype)
    c = torch.randint(-c_max, c_max + 1, (shape[0], 1), device=DEVICE).to(dtype)
    y = softmax(x)
    return [
        Outcome(f"takes the {path} path", path_of(x) == path),
        compare("softmax(x + c) vs softmax(x)", softmax(x + c), y),
        sums_to_one(y),
    ]


def check_neg_inf(path, dtype):
    """Even rows are -inf but for one element (-> exactly one-hot); odd rows about half -inf; the
    last row all -inf, which gives NaN, as torch.softmax does (we match it: 0 / 0)."""
    shape = shape_for(path)
    rows, n_cols = shape
    x = rand(shape, dtype)
    hot = torch.randint(0, n_cols, (rows,), device=DEVICE)
    masked = torch.rand(shape, device=DEVICE) < 0.5
    masked[torch.arange(rows, device=DEVICE), hot] = False  # every row keeps one finite value
    masked[0::2] = True
    masked[0::2].scatter_(1, hot[0::2, None], False)
    masked[-1] = True
    x = x.masked_fill(masked, float("-inf"))
    y = softmax(x, out=poisoned(shape, dtype))
    one_hot = torch.zeros(shape, dtype=dtype, device=DEVICE).scatter_(1, hot[:, None], 1.0)
    even, odd = slice(0, rows - 1, 2), slice(1, rows - 1, 2)
    return [
        Outcome(f"takes the {path} path", path_of(x) == path),
        compare("one-hot rows", y[even], one_hot[even], tol=EXACT),
        compare("half -inf rows", y[odd], torch.softmax(x[odd].double(), -1), torch_out=torch.softmax(x[odd], -1)),
        Outcome(
            "all -inf row is NaN like torch",
            bool(y[-1].isnan().all()) and bool(torch.softmax(x[-1:], -1).isnan().all()),
        ),
    ]


def check_extreme(path, dtype):
    """Values up to +-3e4, every fifth exactly +-1e4: fp32 math, no overflow to inf or NaN."""
    shape = shape_for(path)
    x = rand(shape, dtype, scale=1e4).clamp(-3e4, 3e4)
    x[:, ::5] = 1e4
    x[::2, ::5] = -1e4
    y = softmax(x, out=poisoned(shape, dtype))
    return [
        Outcome(f"takes the {path} path", path_of(x) == path),
        compare("y", y, torch.softmax(x.double(), -1), torch_out=torch.softmax(x, -1)),
        Outcome("no NaN or inf", bool(y.isfinite().all())),
        sums_to_one(y),
    ]


def check_huge(n_cols, path):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = (2**31) // n_cols + 3
    x = rand((rows, n_cols), torch.float16)
    y = softmax(x, out=poisoned((rows, n_cols), torch.float16))
    return [
        Outcome(f"takes the {path} path", path_of(x) == path),
        compare("last rows", y[-2:], torch.softmax(x[-2:].double(), -1)),
    ]


def softmax_ref(x):
    return torch.softmax(x, -1)


def grad_tol(y, dy):
    """Per-element bound on dx's error against the fp64 reference. The kernel works from the saved
    y rounded to the dtype: |y_hat - y| <= e = r*y + d, with r the forward's rtol (TOLERANCES) and d
    half the smallest subnormal step (a tiny fp16 y of a wide row is subnormal, off by up to that).
    Then dot = sum(dy * y) is off by up to sum(|dy| e) (plus its fp32 summation, (2 + log2 N)
    * 2^-24 * sum(|dy| y) at most), and dx = y * (dy - dot) by e * |dy - dot| + y * (the dot's
    error), plus one rounding of dx (rtol 2u: a flipped rounding of the fp32 result; one
    subnormal step where dx is subnormal, as fp16's 1e-6 of a wide row is). Not one rounding of an
    exact value, so no rounding-bias check."""
    info = torch.finfo(y.dtype)
    y64 = y.double()
    dy64 = dy.double()
    e = TOLERANCES[y.dtype].rtol * y64 + info.smallest_normal * info.eps / 2
    dot = (dy64 * y64).sum(-1, keepdim=True)
    n_cols = y.shape[-1]
    dot_err = (dy64.abs() * e).sum(-1, keepdim=True) + (2 + math.log2(max(n_cols, 1))) * 2**-24 * (
        dy64.abs() * y64
    ).sum(-1, keepdim=True)
    atol = 1.1 * (e * (dy64 - dot).abs() + y64 * dot_err) + info.smallest_normal * info.eps
    return Tol(
        atol,
        2 * UNIT_ROUNDOFF[y.dtype],
        "dx from the saved y rounded to the dtype: error model in grad_tol",
        rounding_check=False,
    )


def check_grad(shape, dtype, pad=None, dy_layout=None):
    """dx against autograd through torch.softmax in fp64, and torch.softmax's own same-dtype dx
    (2x rule). dy_layout: "padded" (a view with a wider row stride), "transposed" (last dim not
    unit-stride: copied once) or "expanded" (one row broadcast over all, row stride 0)."""
    x = rand(shape, dtype, pad=pad)
    if dy_layout == "padded":
        dy = rand(shape, dtype, pad=(0,) * (len(shape) - 1) + (8,))
    elif dy_layout == "transposed":
        dy = rand(shape[::-1], dtype).t()
    elif dy_layout == "expanded":
        dy = rand((1, shape[-1]), dtype).expand(shape)
    else:
        dy = rand(shape, dtype)
    y = torch.softmax(x.double(), -1).to(dtype)  # the saved y, as the forward's tests bound it
    tol = grad_tol(y, dy)
    outcomes = check_grads(
        "softmax", softmax, softmax_ref, (x,), (0,), ("x",), tol, torch_fn=softmax_ref, grad_outputs=[dy]
    )
    outcomes[0].note = f"backward path: {bwd_path_of(x)}; {outcomes[0].note}".rstrip("; ")
    return outcomes


def check_grad_writes_all(path):
    """The backward launcher on a poisoned dx: every element written, on each path."""
    shape, dtype = shape_for(path), torch.bfloat16
    y, dy = softmax(rand(shape, dtype)), rand(shape, dtype)
    dx = poisoned(shape, dtype)
    launch_softmax_backward(dy, y, dx)
    y64 = y.double()
    want = y64 * (dy.double() - (dy.double() * y64).sum(-1, keepdim=True))
    # y is the exact input here: fp32 math and one rounding of dx
    return [Outcome(f"backward takes the {path} path", bwd_path_of(y) == path), compare("dx", dx, want)]


def check_grad_properties(path):
    """fp32: rows of dx sum to 0 (y's rows sum to 1 whatever x is), and dy + c per row gives the
    same dx (the dot product absorbs c). Bounds: y's rows sum to 1 within the forward's rtol r,
    so sum(dx) = dot * (1 - sum(y)) is at most |dot| r plus one fp32 rounding of each dx; the
    shift moves dx by y * (|c| r + the fp32 summation error of both dot products, (2 + log2 N)
    * 2^-24 * sum(y * (|dy| + |c|)) each, + the rounding of dy + c), plus a rounding of each dx."""
    shape, f32 = shape_for(path), torch.float32
    x = rand(shape, f32).requires_grad_()
    dy = rand(shape, f32)
    c = torch.randint(-8, 9, (shape[0], 1), device=DEVICE).float()
    y = softmax(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx_shift,) = torch.autograd.grad(softmax(x), x, dy + c)
    y64, dy64, c64, dx64 = y.detach().double(), dy.double(), c.double(), dx.double()
    r, u = TOLERANCES[f32].rtol, UNIT_ROUNDOFF[f32]
    dot = (dy64 * y64).sum(-1)
    sum_limit = 1.1 * (dot.abs() * r + dx64.abs().sum(-1) * u)
    row_sums = dx64.sum(-1).abs()
    depth = 2 + math.log2(shape[-1])
    shift_atol = (
        1.1
        * y64
        * (
            c64.abs() * r
            + 2 * depth * u * (y64 * (dy64.abs() + c64.abs())).sum(-1, keepdim=True)
            + u * (dy64.abs() + c64.abs())
        )
    )
    return [
        Outcome(f"backward takes the {path} path", bwd_path_of(x) == path),
        Outcome(
            "rows of dx sum to 0",
            bool((row_sums <= sum_limit).all()),
            max_abs=row_sums.max().item(),
            limit=f"{sum_limit.max().item():.1e}",
        ),
        compare("dx(dy + c) vs dx(dy)", dx_shift, dx64, Tol(shift_atol, 2 * u, "see the docstring")),
    ]


def check_grad_huge(n_cols, path):
    """Past 2^31 elements: dx of the last rows, where a 32-bit offset would wrap."""
    rows = (2**31) // n_cols + 3
    x = rand((rows, n_cols), torch.float16).requires_grad_()
    dy = rand((rows, n_cols), torch.float16)
    y = softmax(x)
    (dx,) = torch.autograd.grad(y, x, dy)
    del y
    y64 = torch.softmax(x[-2:].detach().double(), -1)
    want = y64 * (dy[-2:].double() - (dy[-2:].double() * y64).sum(-1, keepdim=True))
    return [
        Outcome(f"backward takes the {path} path", bwd_path_of(x) == path),
        compare("dx last rows", dx[-2:], want, grad_tol(y64.half(), dy[-2:])),
    ]


def check_errors():
    x = rand((4, 64), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("int x", lambda: softmax(x.to(torch.int32)), TypeError, "x"),
        expect_raises(f"x on {other}", lambda: softmax(x.to(other)), ValueError, "x"),
        expect_raises("not a tensor", lambda: softmax([1.0, 2.0]), TypeError, "x"),
        expect_raises("0-dim x", lambda: softmax(x[0, 0]), ValueError, "x"),
        expect_raises("out shape", lambda: softmax(x, out=x[:2].clone()), ValueError, "out"),
        expect_raises("out dtype", lambda: softmax(x, out=x.float()), ValueError, "out"),
        expect_raises(
            "out not contiguous", lambda: softmax(x, out=torch.empty_like(x.t()).contiguous().t()), ValueError, "out"
        ),
        expect_raises("out not a tensor", lambda: softmax(x, out=[0.0]), TypeError, "out"),
    ]


def check_grad_mode():
    """With out= the call stays forward-only: in grad mode an x that requires grad raises, naming
    the operator; under torch.no_grad() both calls give what they give on a plain x, with no grad."""
    x = rand((4, 64), torch.float16)
    x_grad = x.clone().requires_grad_()
    with torch.no_grad():
        y, y_out = softmax(x_grad), softmax(x_grad, out=poisoned(x.shape, x.dtype))
    return [
        expect_raises(
            "x requires grad, out=",
            lambda: softmax(x_grad, out=torch.empty_like(x)),
            RuntimeError,
            "llmk::softmax_out is forward-only",
        ),
        Outcome(
            "under no_grad: as on a plain x",
            torch.equal(y, softmax(x)) and torch.equal(y_out, y) and not y.requires_grad,
        ),
    ]


def check_empty():
    outs = []
    for shape in ((0, 64), (3, 0), (2, 0, 5)):
        x = rand(shape, torch.bfloat16)
        y = softmax(x)
        outs.append(Outcome(f"{shape}: empty in, empty out", y.shape == x.shape and y.dtype == x.dtype))
        x_grad = x.clone().requires_grad_()
        (dx,) = torch.autograd.grad(softmax(x_grad), x_grad, torch.empty_like(x))
        outs.append(Outcome(f"{shape}: empty dx", dx.shape == x.shape and dx.dtype == x.dtype))
    return outs


def cases():
    out = []

    def add(shape, dtype, gpu_only=False, **extra):
        out.append(shape_case(check, shape, dtype, gpu_only, **extra))

    for dtype in DTYPES:
        for n in WIDTHS + SWITCH_WIDTHS:
            add((3, n), dtype)
        add((1, 4096), dtype)  # one row
        add((1, 65537), dtype)  # one wide row: split across programs
        add((4096,), dtype)  # 1-D input
        add((2, 3, 123), dtype)
        add((5, 1000), dtype, pad=(0, 8))  # row stride 1008, a view, no copy
        add((3, 20000), dtype, pad=(0, 8))  # split path through a view
        add((2, 5, 1000), dtype, pad=(0, 3, 0))  # leading dims that cannot merge
        add((16384, 1024), dtype, gpu_only=True)  # many rows
        add((4096, 4096), dtype, gpu_only=True)
        add((2049, 5120), dtype, gpu_only=True, pad=(0, 64))
        add((1000, 32768), dtype, gpu_only=True)  # looped on a GPU
        add((64, 262144), dtype, gpu_only=True)  # split: few wide rows
        add((300, 65537), dtype, gpu_only=True)
    for path in PATHS:
        for dtype in DTYPES:
            out.append(
                Case(f"shift invariance, {path}, {dtype_name(dtype)}", check_shift, dict(path=path, dtype=dtype))
            )
            out.append(Case(f"-inf rows, {path}, {dtype_name(dtype)}", check_neg_inf, dict(path=path, dtype=dtype)))
            out.append(Case(f"+-1e4 values, {path}, {dtype_name(dtype)}", check_extreme, dict(path=path, dtype=dtype)))
        out.append(Case(f"in place (out=x), {path}", check_in_place, dict(path=path)))
    out += [
        Case("column stride", check_column_stride),
        Case("allocates its output", check_own_buffer),
        Case("bad input", check_errors),
        Case("empty input", check_empty),
        Case("out= under grad (forward-only)", check_grad_mode),
    ]

    # backward: each path, non-powers-of-two, one row, 3-D, strided x and dy, wide rows on the GPU
    def add_grad(shape, dtype, gpu_only=False, **extra):
        case = shape_case(check_grad, shape, dtype, gpu_only, **extra)
        out.append(Case(f"backward {case.name}", check_grad, case.kwargs, gpu_only))

    for dtype in DTYPES:
        add_grad((5, 1000), dtype)  # fused
        add_grad(shape_for("looped"), dtype)  # looped
        add_grad(shape_for("split"), dtype)  # split
    add_grad((1, 7), torch.float16)  # one row
    add_grad((3, 4000), torch.float16)  # the backward table's 4096 row
    add_grad((2, 6000), torch.bfloat16)  # its 8192 row
    add_grad((2, 40000), torch.float32)  # its last row (looped, 16384 chunks)
    add_grad((2, 3, 123), torch.bfloat16, pad=(0, 1, 5))  # leading dims that cannot merge
    add_grad((3, 2000), torch.float16, dy_layout="padded")
    add_grad((6, 33), torch.float32, dy_layout="transposed")
    add_grad((2, 9000), torch.bfloat16, dy_layout="expanded")
    add_grad((3, 8193), torch.float16, pad=(0, 8))  # looped, odd width, row stride 8201
    for dtype in DTYPES:
        add_grad((16384, 1024), dtype, gpu_only=True)  # many short rows: two a program
        add_grad((4096, 4096), dtype, gpu_only=True)
        add_grad((2049, 5120), dtype, gpu_only=True, pad=(0, 64))
        add_grad((1024, 16384), dtype, gpu_only=True)
        add_grad((1000, 32768), dtype, gpu_only=True)  # looped on a GPU
        add_grad((300, 65537), dtype, gpu_only=True)
        add_grad((64, 262144), dtype, gpu_only=True)  # split: few wide rows
        add_grad((200, 262144), dtype, gpu_only=True)  # looped: 262144 wide, more rows than SMs
    for path in PATHS:
        out.append(Case(f"backward writes every element, {path}", check_grad_writes_all, dict(path=path)))
        out.append(Case(f"backward properties, {path}", check_grad_properties, dict(path=path)))
    out += [
        Case(
            f"2^31+ elements backward, {path}", check_grad_huge, dict(n_cols=n, path=path), gpu_only=True, gpu_gb=24
        )  # 22.0 GB printed
        for path, n in (("fused", 1000), ("looped", 16384), ("split", 2**24))
    ]
    # past 2^31 elements through each path (the split one: 131 rows of 2^24 on a GPU of 66+ SMs)
    out += [
        Case(f"2^31+ elements, {path}", check_huge, dict(n_cols=n, path=path), gpu_only=True)
        for path, n in (("fused", 1000), ("looped", 16384), ("split", 2**24))
    ]
    return out


CASES = cases()


def check_table_rows():
    """Every row and path of SOFTMAX_TABLE is taken by a width check of this tier, and every row
    and path of SOFTMAX_BWD_TABLE by a gradient check: a row added to a table without a width
    that reaches it fails here."""
    outcomes = []
    for fn, table, config, name in (
        (check, SOFTMAX_TABLE, softmax_config, "SOFTMAX_TABLE"),
        (check_grad, SOFTMAX_BWD_TABLE, softmax_backward_config, "SOFTMAX_BWD_TABLE"),
    ):
        shapes = [c.kwargs["shape"] for c in select_cases(CASES) if c.fn is fn]
        paths = {path_of(torch.empty(shape, device="meta"), config) for shape in shapes}
        outcomes.append(Outcome(f"every path of {name}", paths == set(PATHS), note=f"paths taken: {sorted(paths)}"))
        rows = {table_row(shape[-1], table) for shape in shapes}
        missing = [table[i] for i in range(len(table)) if i not in rows]
        outcomes.append(
            Outcome(f"every {name} row", not missing, note=f"no width reaches {missing}" if missing else "")
        )
    return outcomes


CASES.append(Case("every launch-table row reached", check_table_rows))


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("softmax", CASES)
