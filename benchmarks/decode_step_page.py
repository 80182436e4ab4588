"""The results page of the decode_step area (docs/results/decode_step.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import DECODE_STEP_LAYERS, Area, Group

PAGE = Area(
    "Decode step of one decoder layer: Llama-3-8B and Qwen2-7B shapes",
    "`models/llama_layer.py`: `decode_step` from our operators (rmsnorm_linear, apply_rope, "
    "decode_attention, matmul, residual_rmsnorm, swiglu) against `torch_decode_step` (F.rms_norm, "
    "F.linear on cuBLAS, Hugging Face's RoPE, SDPA's flash backend), each run eager, replayed from "
    'one CUDA graph (`-graph`) and under torch.compile(mode="reduce-overhead"). Shapes are B x T: '
    "B sequences of T tokens each; figures in ms a step.",
    [
        Group(DECODE_STEP_LAYERS, "CUDA graphs", ours="ours-graph", peers=("torch-graph",)),
        Group(
            DECODE_STEP_LAYERS,
            "torch.compile reduce-overhead",
            ours="ours-reduce-overhead",
            peers=("torch-reduce-overhead",),
        ),
        Group(DECODE_STEP_LAYERS, "eager", ours="ours-eager", peers=("torch-eager",)),
    ],
    [
        "Eager, a step launches over a dozen kernels, and at small B the host's launch cost exceeds their GPU "
        "time for either side: the graph rows measure the GPU work a serving engine replays.",
        "The share of copy bandwidth counts the bytes a step must move (weights once, the KV cache "
        "read); at B = 1 the weights dominate, at B = 32 and T = 16384 the cache does.",
    ],
    {},
    lower_is_better=True,
    render="decode_step_figures",
)
