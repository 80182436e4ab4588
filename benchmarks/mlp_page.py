"""The results page of the mlp area (docs/results/mlp.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import TRAIN, TRAIN_NOTE, Area, Group, big

PAGE = Area(
    "MLP activations: bias + GELU, SwiGLU, GeGLU",
    "Kernels in `mlp/` (`triton_bias_gelu.py`, `triton_glu.py`; tile table in `launch_config.py`). "
    "`eager` is the op as a user writes it in the input dtype (two kernels); `torch.compile` "
    "compiles that function.",
    [
        Group(("bias_gelu", "bias_gelu_tanh"), "16M+ elements", big),
        Group(("swiglu", "geglu"), "16M+ elements", big),
        Group(("bias_gelu", "bias_gelu_tanh", "swiglu", "geglu"), "under 16M elements", lambda s: not big(s)),
        Group(("swiglu", "geglu"), TRAIN, big, graph=True, mode="fwd+bwd"),
        Group(("bias_gelu", "bias_gelu_tanh"), TRAIN, big, graph=True, mode="fwd+bwd"),
        Group(("swiglu", "geglu", "bias_gelu", "bias_gelu_tanh"), "16M+ elements (do_bench)", big, mode="bwd"),
    ],
    [
        TRAIN_NOTE,
        "Exact GELU uses a polynomial erf in exp2 (about 18 instructions a value), cheaper than "
        "libdevice's erf, so bias + GELU stays memory-bound.",
    ],
    {
        "torch.compile": "SwiGLU is one multiply of two loads: Inductor's fused kernel moves the "
        "same bytes, and both sit at the copy bandwidth."
    },
)
