"""The transformer MLP's elementwise kernels: bias + GELU and SwiGLU."""
