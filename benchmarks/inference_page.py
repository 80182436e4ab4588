"""The results page of the inference area (docs/results/inference.md): its title, intro, the groups of rows its
sentences sum up, and its notes (benchmarks/pages.py; scripts/report.py renders it)."""

from llmk.benchmarks.pages import Area, Group, dims

PAGE = Area(
    "Decode attention (one query token against a KV cache)",
    "Kernels in `inference/triton_inference_attention.py`: `decode_attention` on a contiguous "
    "(B, T, Hkv, D) cache and `paged_decode_attention` on 16-token pages (`triton-paged`), "
    "split-KV (flash-decoding) when B x Hkv programs cannot fill the SMs; the `splits` column "
    "gives the split count. The `-e4m3` ops read e4m3 caches (a scale a token and kv head) with the same kernels.",
    [
        Group(("decode-mha", "decode-gqa"), "all shapes, GPU time", graph=True),
        Group(
            ("decode-mha", "decode-gqa"),
            "B >= 8 and T >= 4096, GPU time",
            lambda s: len(dims(s)) == 5 and dims(s)[0] >= 8 and dims(s)[3] >= 4096,
            graph=True,
        ),
        Group(("decode-mha", "decode-gqa"), "paged, all shapes, GPU time", graph=True, ours="triton-paged"),
        Group(
            ("decode-mha", "decode-gqa"),
            "paged against contiguous, GPU time",
            graph=True,
            ours="triton-paged",
            peers=("triton",),
        ),
        Group(("decode-mha", "decode-gqa"), "all shapes, eager (do_bench)"),
        Group(
            ("decode-mha", "decode-gqa"),
            "head dims 80 and 96 (tiles padded to 128), GPU time",
            lambda s: len(dims(s)) == 5 and dims(s)[4] in (80, 96),
            graph=True,
        ),
        Group(
            ("decode-mha-e4m3", "decode-gqa-e4m3"),
            "e4m3 caches, paged against contiguous, GPU time",
            graph=True,
            ours="triton-paged-e4m3",
            peers=("triton-e4m3",),
        ),
    ],
    [
        "Decode reads the cache and writes almost nothing, while the copy bandwidth counts bytes "
        "read and written: a share of copy above 100% is possible.",
        "At batch 1 an eager call (do_bench) measures the host as much as the GPU: the wrapper and "
        "two Triton launches cost more CPU time than the kernel's GPU time. Serving engines replay "
        "decode steps from CUDA graphs, which the GPU-time tables measure.",
    ],
    {
        ("sdpa-flash", False): "At batch 1 the eager figure follows the host's launch cost, where "
        "SDPA's one C++ launch is cheaper than our Triton launches.",
        ("sdpa-efficient", False): "At batch 1 the eager figure follows the host's launch cost, "
        "where SDPA's one C++ launch is cheaper than our Triton launches.",
        ("triton", True): "The paged kernel's first K/V load of a block waits on one more "
        "dependent load, the page id, than the contiguous kernel's.",
    },
)
