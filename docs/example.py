"""The README's example as a script: a few kernels, a training step through two of them, then a
patched transformers model. The README's block is this file's code, line for line
(docs/test_docs.py checks it, and runs both: this file as a script, the block a line at a time at
an interactive prompt).

    python docs/example.py    (needs transformers: pip install -e ".[dev]"; on a CPU it runs in
                               Triton's interpreter, in seconds)
"""
import torch
from llmk.attention import flash_attention
from llmk.common.device import DEVICE
from llmk.gemm import matmul
from llmk.mlp import swiglu
from llmk.normalization import rmsnorm
dtype = torch.float16
with torch.inference_mode():  # inference: no autograd graph
    x = torch.randn(4, 64, device=DEVICE, dtype=dtype)
    y = rmsnorm(x, torch.ones(64, device=DEVICE, dtype=dtype), eps=1e-6)
    q = torch.randn(1, 4, 32, 64, device=DEVICE, dtype=dtype)   # (B, H, T, D)
    k = torch.randn(1, 2, 32, 64, device=DEVICE, dtype=dtype)   # (B, Hkv, T, D): GQA 4/2
    o = flash_attention(q, k, k.clone(), causal=True)
    gate, up = torch.randn(2, 4, 96, device=DEVICE, dtype=dtype).unbind(0)
    h = swiglu(gate, up)                                          # silu(gate) * up
    w = torch.randn(64, 48, device=DEVICE, dtype=dtype)
    z = matmul(x, w, bias=torch.zeros(48, device=DEVICE, dtype=dtype), activation="gelu")

# training: the norms, softmax, RoPE, SwiGLU, bias+GELU and the GEMM have a backward on our kernels
x = torch.randn(4, 64, device=DEVICE, dtype=dtype)
g = torch.ones(64, device=DEVICE, dtype=dtype, requires_grad=True)
w = torch.randn(64, 48, device=DEVICE, dtype=dtype, requires_grad=True)
loss = matmul(rmsnorm(x, g, eps=1e-6), w, activation="silu").float().square().mean()
loss.backward()                                                    # g.grad, w.grad
# a transformers model with our kernels in place
from transformers import LlamaConfig, LlamaForCausalLM
from llmk.models import kernel_calls, patch_model, unpatch_model
config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, vocab_size=256)  # head dim 64
model = LlamaForCausalLM(config).to(DEVICE, dtype).eval()          # random weights, nothing downloaded
model = patch_model(model)                                         # in place, every kernel it has
with torch.inference_mode():
    tokens = model.generate(torch.randint(0, 256, (1, 8), device=DEVICE), max_new_tokens=4,
                            do_sample=False)

print("generated", tokens.tolist(), "kernel calls", kernel_calls(model))
model = unpatch_model(model)                                       # the model as it was
