"""The results page of the softmax area (docs/results/softmax.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import TRAIN, TRAIN_NOTE, Area, Group, big

PAGE = Area(
    "Row softmax",
    "Kernel in `attention/triton_softmax.py`: rows up to 8192 in registers, wider rows in chunks "
    "(three passes), rows split across programs when there are fewer rows than SMs.",
    [
        Group(("softmax",), "16M elements", big),
        Group(("softmax",), "under 16M elements", lambda s: not big(s)),
        Group(("softmax",), TRAIN, big, graph=True, mode="fwd+bwd"),
        Group(("softmax",), "16M+ elements (do_bench)", big, mode="bwd"),
    ],
    [
        TRAIN_NOTE,
        "The looped and split paths read x twice (the second read mostly from L2) while the byte "
        "count has one read: their share of copy is the ideal count's.",
    ],
    {},
)
