"""Hand-written CUDA C++ RMSNorm, RoPE and SwiGLU, built at first use, to measure the Triton kernels against.

(The folder is not named `cuda`: that is the namespace package of NVIDIA's cuda-python, which torch
imports when present, and a folder of that name on the path would hide it.)
"""
