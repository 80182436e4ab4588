"""The runtime every kernel folder shares: device choice, operators, input checks, integer helpers,
Triton device code, workspaces and the autotuners' clock. The tests' and benchmarks' tooling lives
in devtools/.

Importing the package switches Triton's interpreter on when no CUDA device is present, so import
`common` before `triton` (scripts do it first thing). The submodules stay separate so that a kernel
module pulls in only `common.device`, `common.validation`, `common.ints` and (for an autotuner's
timer) `common.timing`, never tabulate or matplotlib.
"""

from llmk.common import device  # noqa: F401  (must run before anything imports triton)
