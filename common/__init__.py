"""Shared harness for every kernel folder: device choice, input checks, comparison and the
PASS/FAIL report, timing, bandwidth math, and the JSON/PNG results.

Importing the package switches Triton's interpreter on when no CUDA device is present, so import
`common` before `triton` (scripts do it first thing). The submodules stay separate so that a kernel
module pulls in only `common.device`, `common.validation`, `common.ints` and (for an autotuner's
timer) `common.bench`, never tabulate or matplotlib.
"""
from llmk.common import device  # noqa: F401  (must run before anything imports triton)
