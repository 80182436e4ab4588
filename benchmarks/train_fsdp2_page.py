"""The results page of the train_fsdp2 area (docs/results/train_fsdp2.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import Area, Group

PAGE = Area(
    "Training step under FSDP2 on two GPUs",
    "`benchmarks/train_fsdp2.py`: the llama-1.5b model "
    "of the training page sharded with `fully_shard` (each decoder layer, then the root) over two GPUs "
    "of one host, one process each, B2 x 4096 tokens a GPU: transformers as it ships, patched with "
    "`models/hf_patch.py` (with TritonAdamW, and with torch's fused AdamW), and Liger-Kernel's patch. "
    "Figures in ms a step; `tokens_per_s` (over both GPUs) and `peak_MB` (the fuller GPU) in the tables.",
    [
        Group(("train_step_fsdp2",), "B2 x 4096 a GPU, two GPUs"),
        Group(
            ("train_step_fsdp2",), "B2 x 4096 a GPU, two GPUs, torch's AdamW for ours too", ours="triton+torch-adamw"
        ),
    ],
    [
        "`peak_MB` is the largest of the two processes' peaks over the timed steps.",
        "The GPUs are named in the run table: a two-GPU machine may be two H200s.",
    ],
    {},
    lower_is_better=True,
)
