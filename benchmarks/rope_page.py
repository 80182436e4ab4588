"""The results page of the rope area (docs/results/rope.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import TRAIN_NOTE, Area, Group, dims

PAGE = Area(
    "Rotary embedding (RoPE)",
    "Kernel in `attention/triton_rope.py`: q and k in one launch, one program a position and 16 "
    "heads so each cos/sin row is loaded once for them; `rope_interleaved` is the GPT-J / Meta "
    "pair layout. `eager` is `attention/reference_rope.py`'s Hugging Face-style reference.",
    [
        Group(("rope", "rope_interleaved"), "T >= 2048", lambda s: len(dims(s)) == 5 and dims(s)[3] >= 2048),
        Group(("rope",), "T < 2048", lambda s: len(dims(s)) == 5 and dims(s)[3] < 2048),
        Group(
            ("rope",),
            "T >= 4096, GPU time",
            lambda s: len(dims(s)) == 5 and dims(s)[3] >= 4096,
            graph=True,
            mode="fwd+bwd",
        ),
        Group(("rope",), "T >= 4096 (do_bench)", lambda s: len(dims(s)) == 5 and dims(s)[3] >= 4096, mode="bwd"),
    ],
    [TRAIN_NOTE, "At T < 2048 a call moves a few MB in a few microseconds: launch-bound for every provider."],
    {},
)
