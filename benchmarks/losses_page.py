"""The results page of the losses area (docs/results/losses.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import TRAIN_NOTE, Area, Group

PAGE = Area(
    "Losses: cross-entropy, and the LM head fused with it",
    "Kernels in `losses/`: `triton_cross_entropy.py` (one program a row, an online max and sum; the "
    "backward from the saved log-sum-exp) and `fused_linear_cross_entropy_ops.py` (chunks of "
    "tokens through cuBLAS GEMMs and the row kernel, gradients computed in the forward, no "
    "(tokens x vocab) logits in memory). `eager` computes the logits in bf16 and calls "
    "`F.cross_entropy`; `torch.compile` compiles that; `liger` is Liger-Kernel's.",
    [
        Group(("cross_entropy",), "BT 8192, GPU time", graph=True, mode="fwd+bwd"),
        Group(("cross_entropy",), "BT 8192, forward"),
        Group(("linear_cross_entropy",), "Llama 3 and Qwen2 heads, GPU time", graph=True, mode="fwd+bwd"),
    ],
    [TRAIN_NOTE],
    {},
)
