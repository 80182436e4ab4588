"""The results page of the attention area (docs/results/attention.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import Area, Group, dims

GLUON_WHY = (
    "the Gluon kernel has cuDNN's structure (TMA loads, a producer warp, two consumer warpgroups in "
    "ping-pong); where it trails, docs/tuning/attention.md has the measurements"
)

PAGE = Area(
    "FlashAttention (prefill): forward, backward, packed sequences",
    "Kernels in `attention/triton_flash_attention_fwd.py` (online softmax over key blocks, GQA, causal, "
    "any T, head dims up to 256, packed sequences) and `attention/triton_flash_attention_bwd.py` "
    "(FlashAttention-2's backward: dk/dv and dq passes, or one pass adding dq by TMA reductions where that wins); "
    "the Gluon forward and backward for sm_90 in `attention/gluon_flash_attention_fwd.py` and "
    "`attention/gluon_flash_attention_bwd.py` (TMA, warp-specialized, the default on sm_90 with Triton 3.6 where "
    "they are faster, attention/attention_paths.py; the `triton-gluon` rows, the `triton` rows forcing the tl "
    "kernels); the public functions in "
    "`attention/flash_attention_ops.py`. `naive` and `blocked` are the references in "
    "`attention/` (T x T scores in fp32; the online softmax in plain PyTorch).",
    [
        Group(("attention",), "full, all shapes"),
        Group(("attention-causal",), "causal, all shapes"),
        Group(("attention",), "T >= 1024, GPU time", lambda s: dims(s)[2] >= 1024, graph=True, mode="fwd+bwd"),
        Group(("attention-causal",), "T >= 1024, GPU time", lambda s: dims(s)[2] >= 1024, graph=True, mode="fwd+bwd"),
        Group(("attention", "attention-causal"), "T >= 1024 (do_bench)", lambda s: dims(s)[2] >= 1024, mode="bwd"),
        Group(("attention-varlen",), "packed batch, forward"),
        Group(("attention-varlen",), "packed batch, GPU time", graph=True, mode="fwd+bwd"),
        Group(("attention-window", "attention-window off"), "sliding window, forward"),
        Group(("attention-window", "attention-window off"), "sliding window, GPU time", graph=True, mode="fwd+bwd"),
        Group(("attention-softcap", "attention-softcap off"), "logit softcap, forward"),
        Group(("attention-softcap", "attention-softcap off"), "logit softcap, GPU time", graph=True, mode="fwd+bwd"),
        # the Gluon forward for sm_90 (attention/gluon_flash_attention_fwd.py, LLMK_ATTENTION_PATH=gluon)
        Group(("attention",), "full, all shapes, Gluon path", ours="triton-gluon", why=GLUON_WHY),
        Group(("attention-causal",), "causal, all shapes, Gluon path", ours="triton-gluon", why=GLUON_WHY),
        Group(("attention-varlen",), "packed batch, forward, Gluon path", ours="triton-gluon", why=GLUON_WHY),
        Group(
            ("attention-window", "attention-window off"),
            "sliding window, forward, Gluon path",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        Group(
            ("attention-softcap", "attention-softcap off"),
            "logit softcap, forward, Gluon path",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        # the training rows on the Gluon path: the Gluon forward and, where attention_paths dispatches it, backward
        Group(
            ("attention",),
            "T >= 1024, GPU time, Gluon path",
            lambda s: dims(s)[2] >= 1024,
            graph=True,
            mode="fwd+bwd",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        Group(
            ("attention-causal",),
            "T >= 1024, GPU time, Gluon path",
            lambda s: dims(s)[2] >= 1024,
            graph=True,
            mode="fwd+bwd",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        Group(
            ("attention", "attention-causal"),
            "T >= 1024 (do_bench), Gluon path",
            lambda s: dims(s)[2] >= 1024,
            mode="bwd",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        Group(
            ("attention-varlen",),
            "packed batch, GPU time, Gluon path",
            graph=True,
            mode="fwd+bwd",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        Group(
            ("attention-window", "attention-window off"),
            "sliding window, GPU time, Gluon path",
            graph=True,
            mode="fwd+bwd",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        Group(
            ("attention-softcap", "attention-softcap off"),
            "logit softcap, GPU time, Gluon path",
            graph=True,
            mode="fwd+bwd",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        # the llama-1.5b training step's attention (GQA 32/8, hd 64), both paths
        Group(("attention-causal-gqa",), "GQA causal (the llama step's), GPU time", graph=True, mode="fwd+bwd"),
        Group(("attention-causal-gqa",), "GQA causal (the llama step's) (do_bench)", mode="bwd"),
        Group(
            ("attention-causal-gqa",),
            "GQA causal (the llama step's), GPU time, Gluon path",
            graph=True,
            mode="fwd+bwd",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
        Group(
            ("attention-causal-gqa",),
            "GQA causal (the llama step's) (do_bench), Gluon path",
            mode="bwd",
            ours="triton-gluon",
            why=GLUON_WHY,
        ),
    ],
    [
        "Figures are TFLOP/s (compute-bound): no share of copy bandwidth applies. Training rows count "
        "the backward as 2.5x the forward's FLOPs, fwd+bwd as 3.5x (flash-attention's convention).",
        "Packed rows count the packed batch's own FLOPs for every provider: the padded providers do "
        "more work for the same result.",
        "Window rows count the visible pairs only, for every provider; the `off` rows are the same call "
        "without the window or the cap (plain causal, its own pairs).",
    ],
    {
        "sdpa-cudnn": "cuDNN's kernel loads tiles with TMA and specializes warps into producers "
        "and consumers; this kernel uses pointer loads and one warp role."
    },
)
