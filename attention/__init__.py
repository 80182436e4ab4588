"""Attention: references, row softmax, rotary embeddings and the fused FlashAttention forward."""
