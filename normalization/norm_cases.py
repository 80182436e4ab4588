"""The inputs every row-wise norm test runs, as keyword dicts for the test's check function.

One list for RMSNorm, residual RMSNorm and LayerNorm so the three cannot drift apart. Cases with
`gpu_only` are too large for the interpreter (seconds per case on 2 CPU cores is the budget there).
"""
import torch

from common.testing import Case, dtype_name
from normalization.launch_config import FUSED_TABLE, LAYERNORM_FUSED_TABLE, LOOP_CHUNK_TABLE

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WIDTHS = (1, 7, 123, 760, 1000, 4096, 5120, 65537)


def norm_inputs():
    """[(name, kwargs, gpu_only)]: kwargs are shape, dtype, and optionally pad (strided view),
    scale (large values) and weight_dtype (a weight kept in another dtype)."""
    cases = []

    def add(shape, dtype, gpu_only=False, **extra):
        label = " ".join(f"{k}={v if k != 'weight_dtype' else dtype_name(v)}" for k, v in extra.items())
        cases.append((f"{tuple(shape)} {dtype_name(dtype)} {label}".strip(),
                      dict(shape=shape, dtype=dtype, **extra), gpu_only))

    for dtype in DTYPES:
        for n in WIDTHS:
            add((3, n), dtype)
        switches = [FUSED_TABLE[-1][0], LAYERNORM_FUSED_TABLE[-1][0]] + [b for b, _ in LOOP_CHUNK_TABLE if b]
        for max_bytes in switches:  # either side of each change of kernel or chunk
            widest = max_bytes * 8 // torch.finfo(dtype).bits
            add((2, widest), dtype)
            add((2, widest + 1), dtype)
        add((1, 4096), dtype)
        add((2, 3, 123), dtype)
        add((5, 760), dtype, pad=(0, 8))                      # row stride 768, a view, no copy
        add((2, 5, 1000), dtype, pad=(0, 3, 0))               # leading dims that cannot merge
        add((3, 5120), dtype, scale=1e4)                      # squares overflow fp16: fp32 math
        add((4096, 4096), dtype, gpu_only=True)
        add((2049, 5120), dtype, gpu_only=True, pad=(0, 64))
        add((1000, 65537), dtype, gpu_only=True)
        add((300, 131072), dtype, gpu_only=True)
    add((2, 4096), torch.bfloat16, weight_dtype=torch.float32)
    return cases


def norm_cases(check, check_own_buffer, check_errors, check_empty, check_huge):
    """A norm test's cases from its check functions: every input of norm_inputs(), its own output
    allocation, bad input, empty input, and tensors past 2^31 elements through each kernel."""
    return ([Case(name, check, kwargs, gpu_only) for name, kwargs, gpu_only in norm_inputs()]
            + [Case("allocates its output", check_own_buffer), Case("bad input", check_errors),
               Case("empty input", check_empty)]
            + [Case(f"2^31+ elements, {kernel}", check_huge, dict(n_cols=n), gpu_only=True)
               for kernel, n in (("fused", 1000), ("looped", 4096), ("wide rows", 65537))])


def huge_rows(n_cols):
    """A row count putting the tensor just past 2^31 elements: offsets must be 64-bit."""
    return (2 ** 31) // n_cols + 3
