"""A pre-norm SwiGLU MLP block for training, built from our operators beside the same block in
PyTorch: the smallest model that exercises the backward of RMSNorm, the GEMM and SwiGLU together.

    y = x + swiglu(h Wg^T, h Wu^T) Wd^T,    h = rmsnorm(x, g)

Parameters are fp32 master weights (what an optimizer updates); the forward casts them to the
compute dtype (bf16), as mixed-precision training does, so the gradients reach the fp32 masters
through the casts. `forward(params, x, ops)` runs on ours ("llmk": rmsnorm, matmul, swiglu) or on
PyTorch's ("torch": F.rms_norm, F.linear = cuBLAS, F.silu(g) * u) with the same parameters.
"""

import torch
import torch.nn.functional as F

from llmk.gemm.matmul_ops import matmul
from llmk.mlp.triton_glu import swiglu
from llmk.normalization.triton_rmsnorm import rmsnorm

EPS = 1e-6


def make_params(hidden, intermediate, device, seed=0):
    """fp32 leaves that require grad: norm weight g (hidden,), Wg and Wu (intermediate, hidden),
    Wd (hidden, intermediate), in nn.Linear's (N, K) layout, scaled as nn.Linear initializes."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def linear(n, k):
        return ((torch.rand(n, k, generator=gen) * 2 - 1) / k**0.5).to(device).requires_grad_()

    return {
        "norm": (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device).requires_grad_(),
        "gate": linear(intermediate, hidden),
        "up": linear(intermediate, hidden),
        "down": linear(hidden, intermediate),
    }


def forward(params, x, ops, dtype=torch.bfloat16):
    """The block on x (T, hidden) of `dtype`, parameters cast to `dtype`; ops "llmk" or "torch"."""
    w = {name: p.to(dtype) for name, p in params.items()}
    if ops == "llmk":
        h = rmsnorm(x, w["norm"], EPS)
        return x + matmul(swiglu(matmul(h, w["gate"].T), matmul(h, w["up"].T)), w["down"].T)
    if ops == "torch":
        h = F.rms_norm(x, (x.shape[-1],), w["norm"], EPS)
        return x + F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
    raise ValueError(f"ops: expected 'llmk' or 'torch', got {ops!r}")
