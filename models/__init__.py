"""Whole models: this repository's kernels swapped into Hugging Face transformers models."""
