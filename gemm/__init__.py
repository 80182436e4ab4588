"""Tiled FP16/BF16 GEMM with a fused epilogue, and RMSNorm fused into a linear layer."""
