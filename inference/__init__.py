"""Inference decode: KV caches (contiguous and paged) and single-token attention against them."""
