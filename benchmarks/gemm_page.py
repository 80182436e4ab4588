"""The results page of the gemm area (docs/results/gemm.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

import math

from llmk.benchmarks.pages import TRAIN_NOTE, Area, Group, dims, gemm_m

PAGE = Area(
    "GEMM: matmul, fused epilogues, rmsnorm_linear",
    "Kernels in `gemm/`: `matmul_ops.py` (tiled, split-K for decode, picks the kernel), "
    "`triton_matmul_tma.py` (persistent TMA kernel for M >= 1024 on Hopper), `triton_gemv.py` "
    "(M = 1 against an `nn.Linear` weight), `triton_rmsnorm_linear.py`, and FP8: `fp8_ops.py` "
    "(`triton_fp8_quant.py`, `triton_fp8_matmul.py`) and the FP8 producers (`triton_fp8_producers.py`). "
    "The `config` column names the kernel and tile that ran.",
    [
        Group(
            ("matmul",),
            "M >= 2048, N and K >= 4096",
            lambda s: gemm_m(s) >= 2048 and min(dims(s)[1:]) >= 4096,
            why="cuBLAS chooses among many precompiled kernels for each shape; ours picks from a "
            "small autotuned tile table.",
        ),
        Group(
            ("matmul",), "1024^3 and 2048^3, GPU time", lambda s: s in ("1024x1024x1024", "2048x2048x2048"), graph=True
        ),
        Group(("matmul", "matmul_linear"), "M <= 16, GPU time", lambda s: gemm_m(s) <= 16, graph=True),
        Group(("matmul",), "M = 128, GPU time", lambda s: gemm_m(s) == 128, graph=True),
        Group(
            ("matmul",),
            "M <= 2048, eager (do_bench)",
            lambda s: gemm_m(s) <= 2048 and gemm_m(s) * 64 < math.prod(dims(s)[1:]),
        ),
        Group(("matmul_bias_gelu", "matmul_bias_silu"), "all shapes"),
        Group(("rmsnorm_linear",), "M <= 16, GPU time", lambda s: gemm_m(s) <= 16, graph=True),
        Group(
            ("rmsnorm_linear",),
            "M = 32-64, GPU time",
            lambda s: 16 < gemm_m(s) <= 64,
            graph=True,
            why="From M = 32 `rmsnorm_linear` runs our RMSNorm then cuBLAS, the same work as the "
            "`triton-rmsnorm+cuBLAS` baseline.",
        ),
        Group(("rmsnorm_linear",), "M > 16, eager (do_bench)", lambda s: gemm_m(s) > 16),
        Group(
            ("matmul", "matmul_bias_gelu", "matmul_bias_silu"), "all shapes (do_bench)", mode="bwd", peers=("cuBLAS",)
        ),
        Group(("matmul", "matmul_bias_gelu", "matmul_bias_silu"), "all shapes, GPU time", graph=True, mode="fwd+bwd"),
        Group(("rmsnorm_linear",), "all shapes (do_bench)", mode="bwd"),
        Group(
            ("fp8_matmul",),
            "FP8 row-wise, M >= 1024",
            lambda s: gemm_m(s) >= 1024,
            peers=("torch-scaled-mm-rowwise", "torch-scaled-mm-tensorwise", "cuBLAS-bf16"),
        ),
        Group(
            ("fp8_matmul",),
            "FP8 row-wise, fast accumulation, M >= 1024",
            lambda s: gemm_m(s) >= 1024,
            ours="triton-fast-accum",
            peers=("torch-scaled-mm-rowwise-fast-accum", "torch-scaled-mm-rowwise"),
        ),
        Group(
            ("fp8_matmul",),
            "FP8 blocks, M >= 1024",
            lambda s: gemm_m(s) >= 1024,
            ours="triton-block",
            peers=("triton",),
        ),
        Group(
            ("fp8_matmul",),
            "FP8 row-wise, M <= 16, GPU time",
            lambda s: gemm_m(s) <= 16,
            graph=True,
            peers=("torch-scaled-mm-rowwise", "cuBLAS-bf16"),
        ),
        Group(("quantize_fp8",), "row-wise, all shapes", peers=("torch", "torch.compile")),
        Group(
            ("rmsnorm_fp8", "swiglu_fp8"),
            "FP8 producers, all shapes",
            peers=("triton+quantize", "torch", "torch.compile"),
        ),
    ],
    [
        TRAIN_NOTE,
        "Eager rows of 10-50 us carry the host's launch cost (a Triton launch costs the host more "
        "than cuBLAS's); the GPU-time tables (CUDA-graph replays) take the host out.",
        "`rmsnorm_linear` fuses the norm into the GEMM for M <= 16 only (`PATH_TABLE` in "
        "`gemm/triton_rmsnorm_linear.py`); above, it runs our RMSNorm then cuBLAS.",
    ],
    {
        ("cuBLAS", True): "cuBLAS chooses among many precompiled kernels for each shape; ours "
        "choose from a small autotuned tile table.",
        ("cuBLAS", False): "A call of tens of microseconds carries the host's launch cost, which is "
        "longer for a Triton launch (and longest for the TMA kernel, which "
        "builds its descriptors per call) than for cuBLAS's.",
        "torch.compile": "torch.compile runs the GEMM in cuBLAS and the bias and activation in one "
        "fused kernel after it: where cuBLAS's GEMM leads ours by more than that "
        "extra pass over the output costs, it is faster.",
    },
)
