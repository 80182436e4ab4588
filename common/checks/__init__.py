"""Checks that more than one test script runs, so that no test module imports another: RMSNorm,
RoPE and SwiGLU checks for the Triton kernels' tests and cuda_cpp's (each takes the implementation
under test as `impl`), the product's reference and tolerance for matmul and gemv, and the attention
output's tolerance for FlashAttention, decode and the KV caches."""
