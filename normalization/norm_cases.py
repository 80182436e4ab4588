"""The inputs every row-wise norm test runs, as keyword dicts for the test's check function.

One list for RMSNorm, residual RMSNorm and LayerNorm so the three cannot drift apart. Cases with
`gpu_only` are too large for the interpreter (seconds per case on 2 CPU cores is the budget there).
"""

import torch

from llmk.devtools.testing import TOLERANCES, Case, Outcome, Tol, dtype_name
from llmk.normalization.launch_config import (
    BACKWARD_FUSED_TABLE,
    BACKWARD_LOOP_TABLE,
    FUSED_TABLE,
    LAYERNORM_FUSED_TABLE,
    LOOP_CHUNK_TABLE,
    backward_table_row,
    table_row,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WIDTHS = (1, 7, 123, 760, 1000, 4096, 5120, 65537)


def norm_inputs():
    """[(name, kwargs, gpu_only)]: kwargs are shape, dtype, and optionally pad (strided view),
    scale (large, tiny or zero values) and weight_dtype (a weight kept in another dtype)."""
    cases = []

    def add(shape, dtype, gpu_only=False, **extra):
        label = " ".join(f"{k}={v if k != 'weight_dtype' else dtype_name(v)}" for k, v in extra.items())
        cases.append(
            (f"{tuple(shape)} {dtype_name(dtype)} {label}".strip(), dict(shape=shape, dtype=dtype, **extra), gpu_only)
        )

    for dtype in DTYPES:
        for n in WIDTHS:
            add((3, n), dtype)
        switches = (
            [b for b, _, _ in FUSED_TABLE]
            + [b for b, _ in LAYERNORM_FUSED_TABLE]
            + [b for b, _ in LOOP_CHUNK_TABLE if b]
        )
        for max_bytes in switches:  # either side of each row of the tables
            widest = max_bytes * 8 // torch.finfo(dtype).bits
            add((2, widest), dtype)
            add((2, widest + 1), dtype)
        add((1, 4096), dtype)
        add((2, 3, 123), dtype)
        add((5, 760), dtype, pad=(0, 8))  # row stride 768, a view, no copy
        add((2, 5, 1000), dtype, pad=(0, 3, 0))  # leading dims that cannot merge
        add((3, 5120), dtype, scale=1e4)  # squares overflow fp16: fp32 math
        for n in (123, 5120):  # where eps matters, through the fused and the looped kernel
            add((3, n), dtype, scale=0.0)  # all-zero rows: rsqrt(eps), not inf
            add((3, n), dtype, scale=1e-3)  # mean(x^2) ~ eps
        add((4096, 4096), dtype, gpu_only=True)
        add((2049, 5120), dtype, gpu_only=True, pad=(0, 64))
        add((1000, 65537), dtype, gpu_only=True)
        add((300, 131072), dtype, gpu_only=True)
    add((2, 4096), torch.bfloat16, weight_dtype=torch.float32)
    return cases


TABLES = {"fused": FUSED_TABLE, "layernorm_fused": LAYERNORM_FUSED_TABLE, "looped": LOOP_CHUNK_TABLE}


def check_table_rows():
    """Every row of every launch table is taken by some input of the interpreter tier (no gpu_only
    case): for RMSNorm's tables, and for LayerNorm's (which adds LAYERNORM_FUSED_TABLE). A row
    added to a table without an input that reaches it fails here."""
    inputs = [kwargs for _, kwargs, gpu_only in norm_inputs() if not gpu_only]
    outcomes = []
    for layernorm in (False, True):
        reached = {table_row(kw["shape"][-1], torch.finfo(kw["dtype"]).bits // 8, layernorm) for kw in inputs}
        for table, rows in TABLES.items():
            if table == "layernorm_fused" and not layernorm:
                continue
            missing = [rows[i] for i in range(len(rows)) if (table, i) not in reached]
            outcomes.append(
                Outcome(
                    f"{'layernorm' if layernorm else 'rmsnorm'} {table}: every row",
                    not missing,
                    note=f"no input reaches {missing}" if missing else f"{len(rows)} rows",
                )
            )
    return outcomes


def norm_cases(check, check_own_buffer, check_errors, check_empty, check_huge, huge_gb=None):
    """A norm test's cases from its check functions: every input of norm_inputs(), its own output
    allocation, bad input, empty input, tensors past 2^31 elements through each kernel (huge_gb:
    the GPU memory each of those needs, where it is a large share of a card), and that the inputs
    reach every row of the launch tables."""
    return (
        [Case(name, check, kwargs, gpu_only) for name, kwargs, gpu_only in norm_inputs()]
        + [
            Case("allocates its output", check_own_buffer),
            Case("bad input", check_errors),
            Case("empty input", check_empty),
            Case("every launch-table row reached", check_table_rows),
        ]
        + [
            Case(f"2^31+ elements, {kernel}", check_huge, dict(n_cols=n), gpu_only=True, gpu_gb=huge_gb)
            for kernel, n in (("fused", 1000), ("looped", 4096), ("wide rows", 65537))
        ]
    )


def huge_rows(n_cols):
    """A row count putting the tensor just past 2^31 elements: offsets must be 64-bit."""
    return (2**31) // n_cols + 3


# Backward cases. The widths reach every row of BACKWARD_FUSED_TABLE (BLOCK_M from 128 rows a step
# down to 1) and the looped kernel (check_backward_table_rows) at the fewest elements the
# interpreter must run: 40, 123 (short rows, many a step), 1000, 3000 (1-4 rows a step); one row
# of 8192 padded at 4500 in fp32; the looped kernel with a partial last chunk at 8300 in bf16 (7
# rows: a program with several), and RMSNorm's two-rows-a-step row at 40000 (3 rows: a partial
# block); fp16's looped rows are GPU cases: the interpreter's budget. GRAD_ROWS rows: more than
# the interpreter's 3 programs, so some program sums two steps' rows into its dweight partial.
GRAD_WIDTHS = (40, 123, 1000, 3000)
GRAD_WIDE = {torch.float32: ((4500, 4),), torch.bfloat16: ((8300, 7), (40000, 3)), torch.float16: ()}
GRAD_ROWS = 7


def grad_inputs():
    """[(name, kwargs, gpu_only)] for a norm's gradient check: kwargs are shape, dtype and
    optionally pad (strided views of x and dy), wrt ("x" or "weight": that gradient alone),
    weight_dtype."""
    cases = []

    def add(shape, dtype, gpu_only=False, **extra):
        label = " ".join(f"{k}={v if k != 'weight_dtype' else dtype_name(v)}" for k, v in extra.items())
        cases.append(
            (
                f"grad {tuple(shape)} {dtype_name(dtype)} {label}".strip(),
                dict(shape=shape, dtype=dtype, **extra),
                gpu_only,
            )
        )

    for dtype in DTYPES:
        for n in GRAD_WIDTHS:
            add((GRAD_ROWS, n), dtype)
        for n, rows in GRAD_WIDE[dtype]:
            add((rows, n), dtype)
        add((1, 4096), dtype)  # one row: one program, two idle
        add((5, 760), dtype, pad=(0, 8))  # row stride 768, a view
        add((2, 5, 100), dtype, pad=(0, 3, 0))  # leading dims that cannot merge
        add((4096, 4096), dtype, gpu_only=True)  # many rows a program: dweight's sum
        add((2049, 5120), dtype, gpu_only=True, pad=(0, 64))
        add((1000, 65537), dtype, gpu_only=True)
        add((300, 131072), dtype, gpu_only=True)
        add((64, 8300), dtype, gpu_only=True)  # the looped kernel in every dtype, partial chunk
    add((9, 41), torch.float16, wrt="x")  # dweight not wanted: None
    add((9, 41), torch.bfloat16, wrt="weight")  # dx not wanted: None
    add((4, 4500), torch.float32, wrt="weight")  # the widest fused row, dx not wanted
    add((2, 4096), torch.bfloat16, weight_dtype=torch.float32)
    return cases


def check_backward_table_rows():
    """Every row of each kernel's BACKWARD_FUSED_TABLE and BACKWARD_LOOP_TABLE is taken by an
    interpreter-tier gradient input."""
    inputs = [kw for _, kw, gpu_only in grad_inputs() if not gpu_only]
    missing, rows = [], 0
    for kernel in BACKWARD_FUSED_TABLE:
        reached = {backward_table_row(kw["shape"][-1], kernel) for kw in inputs}
        for name, table in (("fused", BACKWARD_FUSED_TABLE[kernel]), ("looped", BACKWARD_LOOP_TABLE[kernel])):
            rows += len(table)
            missing += [f"{kernel} {name} {table[i]}" for i in range(len(table)) if (name, i) not in reached]
    return [
        Outcome("backward: every row", not missing, note=f"no input reaches {missing}" if missing else f"{rows} rows")
    ]


def grad_cases(check_grad, check_grad_empty, check_grad_huge, huge_gb=None):
    """A norm test's backward cases: every input of grad_inputs(), empty input under grad, the
    backward table rows reached, and 2^31+ elements through the fused and the looped backward
    (huge_gb: the GPU memory each of those needs, as its peak printed on a GPU)."""
    return (
        [Case(name, check_grad, kwargs, gpu_only) for name, kwargs, gpu_only in grad_inputs()]
        + [
            Case("grad of empty input", check_grad_empty),
            Case("every backward-table row reached", check_backward_table_rows),
        ]
        + [
            Case(f"grad 2^31+ elements, {kernel}", check_grad_huge, dict(n_cols=n), gpu_only=True, gpu_gb=huge_gb)
            for kernel, n in (("fused", 1000), ("looped", 65537))
        ]
    )


def gemma_cases(check, check_grad):
    """RMSNorm's Gemma form, offset=1.0 (y = x * rstd * (1 + weight)), for check and check_grad
    taking offset and weight_scale: weights near 0 as Gemma's are (its init is 0: weight_scale 0),
    through the fused and the looped kernels, forward and backward."""
    cases = []

    def add(check_fn, prefix, shape, dtype, gpu_only=False, **extra):
        label = " ".join(f"{k}={v if k != 'weight_dtype' else dtype_name(v)}" for k, v in extra.items())
        cases.append(
            Case(
                f"{prefix}{tuple(shape)} {dtype_name(dtype)} offset=1 {label}".strip(),
                check_fn,
                dict(shape=shape, dtype=dtype, offset=1.0, **extra),
                gpu_only,
            )
        )

    for dtype in DTYPES:
        add(check, "", (3, 1000), dtype, weight_scale=0.1)
        add(check, "", (3, 65537), dtype, weight_scale=0.1)  # the looped kernel
        add(check, "", (2, 5, 256), dtype, weight_scale=0.1)  # q/k norms: one head's 256 values a row
        add(check_grad, "grad ", (GRAD_ROWS, 1000), dtype, weight_scale=0.1)
        add(check_grad, "grad ", (GRAD_ROWS, 123), dtype, weight_scale=0.0)
        add(check, "", (4096, 4096), dtype, gpu_only=True, weight_scale=0.1)
        add(check_grad, "grad ", (4096, 4096), dtype, gpu_only=True, weight_scale=0.1)
    add(check, "", (3, 123), torch.bfloat16, weight_scale=0.0)  # Gemma's init: y = x * rstd
    add(check, "", (2, 4096), torch.bfloat16, weight_dtype=torch.float32, weight_scale=0.1)
    add(check_grad, "grad ", (7, 8300), torch.bfloat16, weight_scale=0.1)  # the looped backward
    add(check_grad, "grad ", (4, 4500), torch.float32, weight_scale=0.1)
    return cases


def no_weight_cases(check, check_grad):
    """RMSNorm without an affine weight (weight None, y = x * rstd: torch.nn.RMSNorm with
    elementwise_affine=False), for check and check_grad taking affine (and offset, which a norm
    without a weight ignores): the fused and the looped kernels, forward and backward, strided
    rows, one row; Llama-sized rows on the GPU."""
    cases = []
    # x's scale for the forward cases: with unit-variance rows rstd is 1 within a few percent, and
    # y = x * (1 + d) rounds back to x's own bf16/fp16 grid point at most elements, an error of -x*d
    # of one sign that the rounding-bias check would take for truncation. Rows of scale 2.7 give
    # rstd ~0.37, which maps the grid's points to unrelated ones, as a weight does.
    forward_scale = 2.7

    def add(check_fn, prefix, shape, dtype, gpu_only=False, **extra):
        label = " ".join(f"{k}={v}" for k, v in extra.items())
        scale = dict(scale=forward_scale) if check_fn is check else {}
        cases.append(
            Case(
                f"{prefix}{tuple(shape)} {dtype_name(dtype)} weight=None {label}".strip(),
                check_fn,
                dict(shape=shape, dtype=dtype, affine=False, **scale, **extra),
                gpu_only,
            )
        )

    for dtype in DTYPES:
        add(check, "", (3, 123), dtype)
        add(check, "", (3, 65537), dtype)  # the looped kernel
        add(check_grad, "grad ", (GRAD_ROWS, 1000), dtype)
        add(check, "", (4096, 4096), dtype, gpu_only=True)
        add(check_grad, "grad ", (4096, 4096), dtype, gpu_only=True)
        add(check_grad, "grad ", (300, 131072), dtype, gpu_only=True)  # the looped backward, wide rows
    add(check, "", (5, 760), torch.float16, pad=(0, 8))  # row stride 768, a view
    add(check, "", (1, 4096), torch.bfloat16, offset=1.0)  # one row; offset ignored
    add(check, "", (2, 5, 1000), torch.bfloat16, pad=(0, 3, 0))  # leading dims that cannot merge
    add(check_grad, "grad ", (5, 760), torch.bfloat16, pad=(0, 8))
    add(check_grad, "grad ", (1, 4096), torch.float16, offset=1.0)
    add(check_grad, "grad ", (7, 8300), torch.bfloat16)  # the looped backward
    add(check_grad, "grad ", (4, 4500), torch.float32)
    return cases


# Rounding-error model of the gradients, fp32 math on inputs of any dtype. A sum of n fp32 terms
# carries an error of about sqrt(n) roundings of the sum of their magnitudes (random signs; the
# probabilistic bound of Higham and Mary, 2019, with lambda = 2); the tolerance adds that to the one
# rounding of the result (TOLERANCES[dtype]'s rtol): the atol is a tensor, each element's bound.
U32 = 2.0**-24


def sum_error(n):
    """Roundings, in units of fp32's unit roundoff times the sum of |terms|, of an fp32 sum of n
    terms (2 sqrt(n)), plus 8 for the products and the rsqrt that feed it."""
    return 2 * n**0.5 + 8


def grad_tol(dtype, atol):
    """The gradient's Tol: the fp32 error bound `atol` (a tensor) plus one rounding to dtype, which
    is relative (rtol) above the smallest normal and absolute below it: up to one subnormal ulp,
    tiny * eps (fp16's gradients of small rows reach its subnormals, from 6e-5 down)."""
    info = torch.finfo(dtype)
    return Tol(atol + info.tiny * info.eps, TOLERANCES[dtype].rtol, "fp32 sums (sum_error) + one rounding to the dtype")


def param_grad_atol(terms, term_error=None):
    """Bound for dweight or dbias = sum over rows of `terms` (fp64, (..., N)): their magnitudes
    summed, times sum_error(rows); plus each term's own error summed over rows, `term_error`
    (fp64, like terms), where a term is not one rounding (x̂ from a row's sums: see x_hat_error)."""
    rows = terms.reshape(-1, terms.shape[-1])
    atol = U32 * sum_error(rows.shape[0] + 1) * rows.abs().sum(0)
    if term_error is not None:
        atol = atol + term_error.reshape(-1, terms.shape[-1]).sum(0)
    return atol


def x_hat_error(x, x_hat, rstd, centred=False):
    """Absolute error of the kernel's fp32 x̂ (fp64 tensors, (..., N)): rstd from a sum of N
    squares (sum_error(N) roundings of |x̂|), and for LayerNorm the mean's error, sum_error(N)
    roundings of mean(|x|), times rstd: large against a small x̂ (x near its row's mean)."""
    n = x.shape[-1]
    error = sum_error(n) * x_hat.abs()
    if centred:
        error = error + sum_error(n) * x.abs().mean(-1, keepdim=True) * rstd
    return U32 * error


def dx_atol(x_hat, g, rstd, centred=False):
    """Bound for dx = rstd * (g - x̂ mean(g x̂) [- mean(g)]) from fp64 x̂ = the normalized input,
    g = dy * w, rstd (..., 1): the two row means' sum errors, carried through, plus a few roundings
    of each term. centred (LayerNorm): the mean of g, and the mean's own error in x̂."""
    n = x_hat.shape[-1]
    gx = (g * x_hat).abs().mean(-1, keepdim=True)
    bound = 8 * g.abs() + sum_error(n) * x_hat.abs() * gx
    if centred:
        bound = bound + sum_error(n) * (g.abs().mean(-1, keepdim=True) + (1 + x_hat.abs()) * gx)
    return U32 * rstd * bound


def chunked_param_grad(n_rows, terms, rows_per_chunk=2**16):
    """A parameter gradient over a tensor too large for fp64 whole: the sum over rows of
    terms(start, stop) (fp64, (stop - start, N)), a chunk of rows at a time, and its
    param_grad_atol bound. Returns (gradient, atol)."""
    total = magnitude = 0.0
    for start in range(0, n_rows, rows_per_chunk):
        chunk = terms(start, min(n_rows, start + rows_per_chunk))
        total, magnitude = total + chunk.sum(0), magnitude + chunk.abs().sum(0)
    return total, U32 * sum_error(n_rows + 1) * magnitude
