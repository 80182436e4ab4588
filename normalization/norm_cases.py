"""The inputs every row-wise norm test runs, as keyword dicts for the test's check function.

One list for RMSNorm, residual RMSNorm and LayerNorm so the three cannot drift apart. Cases with
`gpu_only` are too large for the interpreter (seconds per case on 2 CPU cores is the budget there).
"""
import torch

from common.testing import Case, Outcome, dtype_name
from normalization.launch_config import FUSED_TABLE, LAYERNORM_FUSED_TABLE, LOOP_CHUNK_TABLE, table_row

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WIDTHS = (1, 7, 123, 760, 1000, 4096, 5120, 65537)


def norm_inputs():
    """[(name, kwargs, gpu_only)]: kwargs are shape, dtype, and optionally pad (strided view),
    scale (large, tiny or zero values) and weight_dtype (a weight kept in another dtype)."""
    cases = []

    def add(shape, dtype, gpu_only=False, **extra):
        label = " ".join(f"{k}={v if k != 'weight_dtype' else dtype_name(v)}" for k, v in extra.items())
        cases.append((f"{tuple(shape)} {dtype_name(dtype)} {label}".strip(),
                      dict(shape=shape, dtype=dtype, **extra), gpu_only))

    for dtype in DTYPES:
        for n in WIDTHS:
            add((3, n), dtype)
        switches = ([b for b, _, _ in FUSED_TABLE] + [b for b, _ in LAYERNORM_FUSED_TABLE]
                    + [b for b, _ in LOOP_CHUNK_TABLE if b])
        for max_bytes in switches:  # either side of each row of the tables
            widest = max_bytes * 8 // torch.finfo(dtype).bits
            add((2, widest), dtype)
            add((2, widest + 1), dtype)
        add((1, 4096), dtype)
        add((2, 3, 123), dtype)
        add((5, 760), dtype, pad=(0, 8))                      # row stride 768, a view, no copy
        add((2, 5, 1000), dtype, pad=(0, 3, 0))               # leading dims that cannot merge
        add((3, 5120), dtype, scale=1e4)                      # squares overflow fp16: fp32 math
        for n in (123, 5120):  # where eps matters, through the fused and the looped kernel
            add((3, n), dtype, scale=0.0)                     # all-zero rows: rsqrt(eps), not inf
            add((3, n), dtype, scale=1e-3)                    # mean(x^2) ~ eps
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
            outcomes.append(Outcome(f"{'layernorm' if layernorm else 'rmsnorm'} {table}: every row", not missing,
                                    note=f"no input reaches {missing}" if missing else f"{len(rows)} rows"))
    return outcomes


def norm_cases(check, check_own_buffer, check_errors, check_empty, check_huge):
    """A norm test's cases from its check functions: every input of norm_inputs(), its own output
    allocation, bad input, empty input, tensors past 2^31 elements through each kernel, and that
    the inputs reach every row of the launch tables."""
    return ([Case(name, check, kwargs, gpu_only) for name, kwargs, gpu_only in norm_inputs()]
            + [Case("allocates its output", check_own_buffer), Case("bad input", check_errors),
               Case("empty input", check_empty), Case("every launch-table row reached", check_table_rows)]
            + [Case(f"2^31+ elements, {kernel}", check_huge, dict(n_cols=n), gpu_only=True)
               for kernel, n in (("fused", 1000), ("looped", 4096), ("wide rows", 65537))])


def huge_rows(n_cols):
    """A row count putting the tensor just past 2^31 elements: offsets must be 64-bit."""
    return (2 ** 31) // n_cols + 3
