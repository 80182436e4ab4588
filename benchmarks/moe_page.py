"""The results page of the moe area (docs/results/moe.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import TRAIN_NOTE, Area, Group, dims


def tokens(shape):
    d = dims(shape)
    return d[0] if d else 0


PAGE = Area(
    "Mixture-of-experts: the experts layer",
    "Kernels in `moe/`: `triton_moe_routing.py` (the router's top-k, the expert-sorted order), "
    "`triton_moe_gemm.py` (the grouped GEMMs: gather and SwiGLU fused into gate/up, the routing "
    "weight and the scatter back to token order into down; their backward), `triton_moe_rows_tma.py` "
    "(gate/up, down and dx on long runs: persistent, the weights read through TMA), `moe_experts_ops.py` (the "
    "operator and its autograd formula). Shapes are T x H x I x E x top-k. `eager` and `grouped_mm` "
    "are transformers' experts implementations of the same name on its Qwen3MoeExperts module; "
    "`torch.compile` compiles the grouped_mm form.",
    [
        Group(("qwen3-30b-a3b", "mixtral-8x7b"), "prefill, T >= 4096", lambda s: tokens(s) >= 4096),
        Group(("qwen3-30b-a3b",), "decode, T <= 64", lambda s: tokens(s) <= 64, graph=True),
        Group(
            ("qwen3-30b-a3b", "mixtral-8x7b"),
            "T >= 4096, GPU time",
            lambda s: tokens(s) >= 4096,
            graph=True,
            mode="fwd+bwd",
        ),
    ],
    [
        TRAIN_NOTE,
        "TFLOP/s count the routed rows only: 6 x T x top-k x H x I forward, 18 x forward and "
        "backward. `dense-per-expert` is cuBLAS on one expert's share of the Mixtral batch (T x top-k / E "
        "rows): the dense GEMM a grouped GEMM of those widths is measured against.",
    ],
)
