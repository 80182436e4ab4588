"""The transformer MLP's elementwise kernels: bias + GELU and the gated units SwiGLU and GeGLU."""
