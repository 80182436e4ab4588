"""The results page of the train area (docs/results/train.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import Area, Group

PAGE = Area(
    "Training step of ~1-1.5B-parameter models",
    "`benchmarks/train_bench.py`: Llama-shaped models (hidden 2048, 16 layers, GQA 32/8) with "
    "vocabularies of 128256 and 151936, a Qwen3-shaped and a Gemma 2-shaped one, batch 2 x 4096 "
    "tokens, and the Llama model on mixed-length sequences padding-free and padded, bf16 parameters: transformers "
    "as it ships (`eager`), patched with `models/hf_patch.py` and trained with TritonAdamW "
    "(`triton`, fp32 m and v; `triton+bf16-state`, bf16 m and v as torch's AdamW keeps them), "
    "compiled per decoder layer, and Liger-Kernel's patch. Figures in ms a step; "
    "`tokens_per_s`, `peak_MB` and the peak of each phase in the tables.",
    [
        Group(("train_step",), "B2 x 4096"),
        Group(
            ("train_step",),
            "B2 x 4096, TritonAdamW with bf16 m and v (the peers' state dtype)",
            ours="triton+bf16-state",
        ),
        Group(("train_step",), "B2 x 4096, torch's AdamW for ours too", ours="triton+torch-adamw"),
        Group(("train_step_packed",), "mixed-length sequences, padding-free and padded (real tokens)"),
    ],
    [
        "`peak_MB` here is the whole process's peak over the timed steps (weights, gradients, "
        "optimizer state, activations), not a call's extra."
    ],
    {},
    lower_is_better=True,
)
