"""The results page of the cuda_vs_triton area (docs/results/cuda_vs_triton.md): its title, intro, the groups of rows
its sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import Area, Group, big

PAGE = Area(
    "Triton against hand-written CUDA C++",
    "`cuda_cpp/csrc/*.cu`: RMSNorm, RoPE and SwiGLU in CUDA C++ (16-byte vector loads, fp32 "
    "math, warp-shuffle reductions), launch shapes from a sweep of every candidate "
    "(`scripts/tune/cuda_sweep.py`), against the same Triton kernels on the same tensors.",
    [
        Group(("rmsnorm",), "16M+ elements", big),
        Group(("rope", "rope_interleaved"), "all shapes"),
        Group(("swiglu",), "16M+ elements", big),
    ],
    [
        "Each Triton kernel is compiled for its row length and its pointers' alignment; the CUDA "
        "kernels take the row length at run time, so their loops and tails stay general."
    ],
    {},
)
