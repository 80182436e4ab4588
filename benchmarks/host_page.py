"""The results page of the host area (docs/results/host.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import Area

PAGE = Area(
    "Host time a call: the operator layer, the launchers and PyTorch",
    "Every public kernel function calls an operator of the `llmk` namespace (`common/ops.py`), "
    "which torch.compile puts into its graphs. An eager call on plain tensors runs the "
    "operator's implementation directly; a compiled graph calls it through the dispatcher "
    "(`torch.ops.llmk.<name>.default`). This page gives the CPU time of each way, of the bare "
    "launch under it, and of the PyTorch call each kernel stands in for, at decode sizes, where "
    "a call's host time is as long as its GPU time.",
    [],
    render="host_figures",
)
