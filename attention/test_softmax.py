"""Tests for attention/triton_softmax.py against torch.softmax in fp64 (the reference) and in the
input dtype (PyTorch's own error, which bounds ours at 2x).

    python attention/test_softmax.py        (or: pytest attention/test_softmax.py)

Every check names the path its shape took on this tier (fused, looped or split). Widths sit either
side of each row of the heuristics table; the looped/split switch is a row count per SM, so the
property checks build their shapes at run time from the device's SM count (the interpreter
counts 2), and each asserts that its shape takes the path it is meant to test.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402

from attention.triton_softmax import (INTERPRET_SMS, SOFTMAX_TABLE, SPLIT_BELOW_ROWS_PER_SM, softmax,  # noqa: E402
                                      softmax_config, table_row)
from common.device import DEVICE, sm_count  # noqa: E402
from common.testing import (TOLERANCES, Case, Outcome, Tol, compare, dtype_name, expect_raises, main,  # noqa: E402
                            poisoned, rand, shape_case)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WIDTHS = (1, 7, 123, 1000, 4096, 5120, 65537, 262144)
# either side of each row of the table: the last width of a row and the first of the next
SWITCH_WIDTHS = tuple(w for b, *_ in SOFTMAX_TABLE if b for w in (b, b + 1))
PATHS = ("fused", "looped", "split")
EXACT = Tol(0.0, 0.0, "exp(0) = 1 and exp(-inf) = 0 exactly, and the sum is 1")


def path_of(x):
    n_cols = x.shape[-1]
    return softmax_config(x.numel() // n_cols, n_cols, sm_count(x.device.index or 0, INTERPRET_SMS)).path


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
    return [Outcome(f"takes the {path} path", path_of(x) == path),
            Outcome("returns out", y is x), compare("y written over x", y, ref, torch_out=torch_out)]


def check_shift(path, dtype):
    """softmax(x + c) = softmax(x) for a constant c per row. x and c are multiples of 1/2 with
    |x + c| < 64 (fp32: < 1e4 + 16), so x + c is exact in every dtype and both calls see the same
    differences x - max; only the same-dtype rounding of the result is allowed to differ."""
    shape = shape_for(path)
    c_max = 10000 if dtype == torch.float32 else 32
    x = (torch.randint(-32, 33, shape, device=DEVICE) / 2).to(dtype)
    c = torch.randint(-c_max, c_max + 1, (shape[0], 1), device=DEVICE).to(dtype)
    y = softmax(x)
    return [Outcome(f"takes the {path} path", path_of(x) == path),
            compare("softmax(x + c) vs softmax(x)", softmax(x + c), y), sums_to_one(y)]


def check_neg_inf(path, dtype):
    """Even rows are -inf but for one element (-> exactly one-hot); odd rows about half -inf; the
    last row all -inf, which gives NaN, as torch.softmax does (we match it: 0 / 0)."""
    shape = shape_for(path)
    rows, n_cols = shape
    x = rand(shape, dtype)
    hot = torch.randint(0, n_cols, (rows,), device=DEVICE)
    masked = torch.rand(shape, device=DEVICE) < 0.5
    masked[torch.arange(rows, device=DEVICE), hot] = False      # every row keeps one finite value
    masked[0::2] = True
    masked[0::2].scatter_(1, hot[0::2, None], False)
    masked[-1] = True
    x = x.masked_fill(masked, float("-inf"))
    y = softmax(x, out=poisoned(shape, dtype))
    one_hot = torch.zeros(shape, dtype=dtype, device=DEVICE).scatter_(1, hot[:, None], 1.0)
    even, odd = slice(0, rows - 1, 2), slice(1, rows - 1, 2)
    return [Outcome(f"takes the {path} path", path_of(x) == path),
            compare("one-hot rows", y[even], one_hot[even], tol=EXACT),
            compare("half -inf rows", y[odd], torch.softmax(x[odd].double(), -1),
                    torch_out=torch.softmax(x[odd], -1)),
            Outcome("all -inf row is NaN like torch", bool(y[-1].isnan().all())
                    and bool(torch.softmax(x[-1:], -1).isnan().all()))]


def check_extreme(path, dtype):
    """Values up to +-3e4, every fifth exactly +-1e4: fp32 math, no overflow to inf or NaN."""
    shape = shape_for(path)
    x = rand(shape, dtype, scale=1e4).clamp(-3e4, 3e4)
    x[:, ::5] = 1e4
    x[::2, ::5] = -1e4
    y = softmax(x, out=poisoned(shape, dtype))
    return [Outcome(f"takes the {path} path", path_of(x) == path),
            compare("y", y, torch.softmax(x.double(), -1), torch_out=torch.softmax(x, -1)),
            Outcome("no NaN or inf", bool(y.isfinite().all())), sums_to_one(y)]


def check_huge(n_cols, path):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = (2 ** 31) // n_cols + 3
    x = rand((rows, n_cols), torch.float16)
    y = softmax(x, out=poisoned((rows, n_cols), torch.float16))
    return [Outcome(f"takes the {path} path", path_of(x) == path),
            compare("last rows", y[-2:], torch.softmax(x[-2:].double(), -1))]


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
        expect_raises("out not contiguous", lambda: softmax(x, out=torch.empty_like(x.t()).contiguous().t()),
                      ValueError, "out"),
        expect_raises("out not a tensor", lambda: softmax(x, out=[0.0]), TypeError, "out"),
    ]


def check_grad_mode():
    """Forward-only: in grad mode an x that requires grad raises, naming the operator; under
    torch.no_grad() the call gives what it gives on a plain x."""
    x = rand((4, 64), torch.float16)
    x_grad = x.clone().requires_grad_()
    with torch.no_grad():
        y, y_out = softmax(x_grad), softmax(x_grad, out=poisoned(x.shape, x.dtype))
    return [expect_raises("x requires grad", lambda: softmax(x_grad), RuntimeError, "llmk::softmax is forward-only"),
            expect_raises("x requires grad, out=", lambda: softmax(x_grad, out=torch.empty_like(x)), RuntimeError,
                          "llmk::softmax_out is forward-only"),
            Outcome("under no_grad: as on a plain x", torch.equal(y, softmax(x)) and torch.equal(y_out, y))]


def check_empty():
    outs = []
    for shape in ((0, 64), (3, 0), (2, 0, 5)):
        x = rand(shape, torch.bfloat16)
        y = softmax(x)
        outs.append(Outcome(f"{shape}: empty in, empty out", y.shape == x.shape and y.dtype == x.dtype))
    return outs


def cases():
    out = []

    def add(shape, dtype, gpu_only=False, **extra):
        out.append(shape_case(check, shape, dtype, gpu_only, **extra))

    for dtype in DTYPES:
        for n in WIDTHS + SWITCH_WIDTHS:
            add((3, n), dtype)
        add((1, 4096), dtype)                         # one row
        add((1, 65537), dtype)                        # one wide row: split across programs
        add((4096,), dtype)                           # 1-D input
        add((2, 3, 123), dtype)
        add((5, 1000), dtype, pad=(0, 8))             # row stride 1008, a view, no copy
        add((3, 20000), dtype, pad=(0, 8))            # split path through a view
        add((2, 5, 1000), dtype, pad=(0, 3, 0))       # leading dims that cannot merge
        add((16384, 1024), dtype, gpu_only=True)      # many rows
        add((4096, 4096), dtype, gpu_only=True)
        add((2049, 5120), dtype, gpu_only=True, pad=(0, 64))
        add((1000, 32768), dtype, gpu_only=True)      # looped on a GPU
        add((64, 262144), dtype, gpu_only=True)       # split: few wide rows
        add((300, 65537), dtype, gpu_only=True)
    for path in PATHS:
        for dtype in DTYPES:
            out.append(Case(f"shift invariance, {path}, {dtype_name(dtype)}", check_shift,
                            dict(path=path, dtype=dtype)))
            out.append(Case(f"-inf rows, {path}, {dtype_name(dtype)}", check_neg_inf, dict(path=path, dtype=dtype)))
            out.append(Case(f"+-1e4 values, {path}, {dtype_name(dtype)}", check_extreme,
                            dict(path=path, dtype=dtype)))
        out.append(Case(f"in place (out=x), {path}", check_in_place, dict(path=path)))
    out += [Case("column stride", check_column_stride), Case("allocates its output", check_own_buffer),
            Case("bad input", check_errors), Case("empty input", check_empty),
            Case("grad mode (forward-only)", check_grad_mode)]
    # past 2^31 elements through each path (the split one: 131 rows of 2^24 on a GPU of 66+ SMs)
    out += [Case(f"2^31+ elements, {path}", check_huge, dict(n_cols=n, path=path), gpu_only=True)
            for path, n in (("fused", 1000), ("looped", 16384), ("split", 2 ** 24))]
    return out


CASES = cases()


def check_table_rows():
    """Every row of SOFTMAX_TABLE, and the split path, is taken by a width check of this tier: a row
    added to the table without a width that reaches it fails here."""
    shapes = [c.kwargs["shape"] for c in common.testing.select_cases(CASES) if c.fn is check]
    rows = {table_row(shape[-1]) for shape in shapes}
    missing = [SOFTMAX_TABLE[i] for i in range(len(SOFTMAX_TABLE)) if i not in rows]
    paths = {path_of(torch.empty(shape, device="meta")) for shape in shapes}
    return [Outcome("every SOFTMAX_TABLE row", not missing, note=f"no width reaches {missing}" if missing else ""),
            Outcome("every path", paths == set(PATHS), note=f"paths taken: {sorted(paths)}")]


CASES.append(Case("every launch-table row reached", check_table_rows))


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("softmax", CASES)
