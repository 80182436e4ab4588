"""The results page of the e2e area (docs/results/e2e.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import Area, Group, dims

PAGE = Area(
    "End to end: Llama-3-8B- and Qwen2.5-7B-shaped models",
    "Hugging Face models with random bf16 weights, as transformers ships them (`eager`), patched "
    "with `models/hf_patch.py` (`triton`), and compiled per decoder layer (`torch.compile`). "
    "Prefill shapes are B x T; decode shapes B x prompt x steps, in ms a step.",
    [
        Group(("llama3-8b prefill", "qwen2.5-7b prefill"), "prefill T >= 1024", lambda s: dims(s)[-1] >= 1024),
        Group(("llama3-8b prefill", "qwen2.5-7b prefill"), "prefill T < 1024", lambda s: dims(s)[-1] < 1024),
        Group(("llama3-8b decode", "qwen2.5-7b decode"), "decode"),
        # the patched model with LLMK_ATTENTION_PATH=gluon (the Gluon attention forward, sm_90)
        Group(
            ("llama3-8b prefill", "qwen2.5-7b prefill"),
            "prefill T >= 1024, Gluon attention",
            lambda s: dims(s)[-1] >= 1024,
            ours="triton-gluon",
        ),
    ],
    [
        "Our kernels replace everything but the GEMMs, so the GEMMs' share of a patched prefill "
        "bounds what they can still win (the GEMM share above).",
        "A short prefill and every decode step are bound by the Python of 28-32 decoder layers; "
        "compilation or CUDA graphs, not kernels, remove that.",
    ],
    {},
    lower_is_better=True,
)
