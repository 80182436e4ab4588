"""The results page of the norm area (docs/results/norm.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import TRAIN, TRAIN_NOTE, Area, Group, big, dims

PAGE = Area(
    "Normalization: RMSNorm, LayerNorm, residual add + RMSNorm",
    "Kernels in `normalization/` (`triton_rmsnorm.py`, `triton_layernorm.py`, "
    "`residual_rmsnorm_ops.py`; launch table in `launch_config.py`). `eager` is the fp32 "
    "reference in plain PyTorch, as Hugging Face's modules compute it; `torch.compile` compiles "
    "that reference with static shapes; `F.rms_norm`, `F.layer_norm` are PyTorch's own ops.",
    [
        Group(("rmsnorm",), "16M+ elements", big),
        Group(("layernorm",), "16M+ elements", big),
        Group(("residual_rmsnorm",), "16M+ elements", big),
        Group(("rmsnorm", "layernorm", "residual_rmsnorm"), "under 16M elements", lambda s: not big(s)),
        Group(("rmsnorm",), TRAIN, big, graph=True, mode="fwd+bwd"),
        Group(("layernorm",), TRAIN, big, graph=True, mode="fwd+bwd"),
        Group(("residual_rmsnorm",), TRAIN, big, graph=True, mode="fwd+bwd"),
        Group(("rmsnorm", "layernorm", "residual_rmsnorm"), "16M+ elements (do_bench)", big, mode="bwd"),
        # at N = 5120 a fwd+bwd is ~0.1 ms of GPU work, near a call's host time: the wall time
        # (do_bench, the host in the loop) against PyTorch's own op is what a training step sees
        Group(
            ("rmsnorm",),
            "medium rows (N = 5120), wall time (do_bench)",
            lambda s: dims(s)[-1:] == (5120,),
            mode="fwd+bwd",
            peers=("F.rms_norm",),
        ),
    ],
    [
        TRAIN_NOTE,
        "Under 16M elements launch and tail effects weigh in for every provider: the smallest "
        "calls last a few microseconds, too short to reach the copy bandwidth.",
        "Rows past 64 KB run the looped kernel, which reads each row twice (the second read mostly "
        "from L2); the byte count includes one read only.",
    ],
    {
        "torch.compile": "Inductor fuses the same reference into one kernel of the same traffic, "
        "so it ties where both reach the copy bandwidth."
    },
)
