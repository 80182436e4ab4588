"""What the bias + GELU and SwiGLU tests share: dtypes, widths, the one-rounding tolerance (of
outputs and of gradients), every value of a 16-bit type as one input, upstream gradients of several
layouts, the quiet context for inputs whose exp overflows on purpose, and the cases forcing each
launch-table entry (mlp/launch_config.py)."""

import contextlib
import warnings

import torch

from llmk.common.device import DEVICE
from llmk.devtools.testing import TOLERANCES, Case, Outcome, Tol, dtype_name
from llmk.mlp.launch_config import TILE_TABLE

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WIDTHS = (1, 7, 123, 1000, 4096, 5120)  # tiny, odd, unaligned, and model widths

# Both kernels compute each output from its own inputs in fp32 and round once, with no sum whose
# order could flip a rounding: the error is half an ulp (2^-11 relative for fp16, 2^-8 for bf16)
# plus the fp32 math's own (up to 2e-6 relative for the exact GELU's polynomial, a few 2^-24 for
# exp and the division), for which 2^-16 leaves 7x room. A second rounding (of x + bias, or of
# silu(gate), as eager PyTorch does) reaches up to a whole ulp, and over a few thousand values some
# exceed that: it fails here, where devtools.testing's one-ulp rtol would let it pass. fp32 keeps
# its table row.
ONE_ROUNDING = {
    torch.float16: Tol(
        1e-5, 2**-11 + 2**-16, "one rounding of an fp32 result: half an fp16 ulp (2^-11) plus the fp32 math's error"
    ),
    torch.bfloat16: Tol(
        1e-5, 2**-8 + 2**-16, "one rounding of an fp32 result: half a bf16 ulp (2^-8) plus the fp32 math's error"
    ),
    torch.float32: TOLERANCES[torch.float32],
}
# The gradients (dgate, dup; dx) are the same kind of value: a product of the fp32 upstream gradient
# and an fp32 derivative, rounded once, so ONE_ROUNDING holds for them too. Near a zero of the
# derivative (silu' at -1.28, gelu' at -0.75) its fp32 error is absolute, a few 2^-24 (5e-7 for the
# exact GELU's polynomial) times |dy| (and |up|): atol 1e-5 covers |dy * up| up to ~20, past the
# largest product of two normal samples in these tests' sizes.


def upstream(shape, dtype, layout="packed", scale=1.0):
    """An upstream gradient dy of `shape`, normal(0, scale): packed; "expanded", one row broadcast
    over the others (row stride 0); or "transposed", 2-D with a strided last dim (copied once by
    the launchers)."""
    if layout == "expanded":
        return (torch.randn(shape[-1], device=DEVICE) * scale).to(dtype).expand(shape)
    if layout == "transposed":
        return (torch.randn(shape[::-1], device=DEVICE) * scale).to(dtype).t()
    return (torch.randn(shape, device=DEVICE) * scale).to(dtype)


@contextlib.contextmanager
def overflow_expected():
    """Where exp overflows to inf on purpose (|x| ~ 1e4 gives gelu = 0 or x, silu = 0 or gate),
    the interpreter's numpy warns; the result is right, so the warning is noise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def every_value(dtype, fp32_limit):
    """Every finite fp16 or bf16 value once, as (rows, 256): the whole input range in one call,
    subnormals and the largest values included. fp32: a grid of 2^16 points over
    [-fp32_limit, fp32_limit], as (256, 256)."""
    if dtype == torch.float32:
        return torch.linspace(-fp32_limit, fp32_limit, 2**16, device=DEVICE).reshape(256, 256)
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    return x[x.isfinite()].reshape(-1, 256).to(DEVICE)


def huge_rows(n_cols):
    """A row count putting the tensor just past 2^31 elements: offsets must be 64-bit."""
    return 2**31 // n_cols + 3


def forced_tile_cases(kernel, check_forced, shape=(7, 1000), table=TILE_TABLE):
    """Cases running check_forced(row, shape, dtype) on every table[kernel] entry (TILE_TABLE,
    BACKWARD_TILE_TABLE or BAND_TABLE), once per dtype of its element size, plus one that fails for
    an entry no dtype of DTYPES reaches."""
    cases = [
        Case(
            f"forced {kernel} {row} {shape} {dtype_name(dtype)}", check_forced, dict(row=row, shape=shape, dtype=dtype)
        )
        for dtype in DTYPES
        for size, row in table[kernel].items()
        if torch.finfo(dtype).bits // 8 == size
    ]
    forced = frozenset(c.kwargs["row"] for c in cases)
    return cases + [
        Case(
            f"every {kernel} launch-table row forced", check_table_rows, dict(kernel=kernel, forced=forced, table=table)
        )
    ]


def check_table_rows(kernel, forced, table):
    """Every table[kernel] entry is among the forced rows: an entry added without a case fails here."""
    missing = [row for row in table[kernel].values() if row not in forced]
    return [
        Outcome(
            f"every launch-table entry of {kernel!r}", not missing, note=f"not forced: {missing}" if missing else ""
        )
    ]
