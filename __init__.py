"""llmk: Triton kernels for the primitives of large language models, each beside a PyTorch
reference, its tests and its benchmark.

The subpackages are the repository's folders (pyproject.toml maps `llmk` to the checkout's root):

    llmk.normalization   RMSNorm, LayerNorm, residual + RMSNorm
    llmk.attention       FlashAttention (packed and padded), softmax, RoPE
    llmk.mlp             SwiGLU, bias + GELU
    llmk.gemm            matmul with fused epilogues, GEMV, RMSNorm + linear
    llmk.losses          cross-entropy, the LM head fused with it
    llmk.inference       decode attention over contiguous and paged KV caches
    llmk.optimizers      AdamW
    llmk.models          the Hugging Face model patch, FSDP2 helpers
    llmk.cuda_cpp        CUDA C++ versions of three kernels, for comparison
    llmk.common          the runtime the folders share: device choice, operators, checks, timing
    llmk.devtools        the tests' and benchmarks' tooling: PASS/FAIL tables, timing, results
    llmk.benchmarks      the benchmarks behind docs/results

Importing `llmk` imports nothing else; a kernel module pulls in what it uses when it is imported.
"""

__version__ = "0.2.0"  # CHANGELOG.md says what each release changed
