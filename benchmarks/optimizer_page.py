"""The results page of the optimizer area (docs/results/optimizer.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import Area, Group, elements

PAGE = Area(
    "AdamW step",
    "`TritonAdamW` in `optimizers/triton_adam.py`: one launch a step updates every param of "
    "every group. torch keeps bf16 state for bf16 params, so the bf16 rows (fp32 m and v) have "
    "no baseline.",
    [
        Group(("adamw",), "16M+ params", lambda s: elements(s) >= 16e6),
        Group(("adamw",), "under 16M params", lambda s: elements(s) < 16e6),
    ],
    ["At 1M-4M params a step is bound by launch and host work, not by memory."],
    {},
)
