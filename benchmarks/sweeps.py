"""Sweeps, byte formulas and inputs that more than one benchmark uses (the per-op benchmarks and
cuda_vs_triton_bench.py), so no benchmark imports another.

Bytes moved (e = element size, M rows of N):
    rmsnorm           read x, write y, read weight:            2*M*N*e + N*e
    layernorm         read x, write y, read weight and bias:   2*M*N*e + 2*N*e
    residual_rmsnorm  read x and residual, write u and y:      4*M*N*e + N*e
    bias_gelu         read x, write y, read bias:              2*M*N*e + N*e
    swiglu            read gate and up, write y:               3*M*N*e
    rope              q (B, H, T, D), k (B, Hkv, T, D) of e bytes, cos and sin (1, T, D) of e_c bytes:
                      read q, k, write q_out, k_out, read cos and sin once:
                      2*(B*H*T*D + B*Hkv*T*D)*e + 2*T*D*e_c
    rope backward     read dq_out, dk_out, write dq, dk, read cos and sin once: the same count;
                      forward and backward together twice it (rope_train_bytes)
"""

import torch

from llmk.common.device import DEVICE


def rmsnorm_bytes(m, n, e):
    return 2 * m * n * e + n * e


def layernorm_bytes(m, n, e):
    return 2 * m * n * e + 2 * n * e


def residual_rmsnorm_bytes(m, n, e):
    return 4 * m * n * e + n * e


def bias_gelu_bytes(m, n, e):
    return 2 * m * n * e + n * e


def swiglu_bytes(m, n, e):
    return 3 * m * n * e


def rope_bytes(batch, heads, kv_heads, seq_len, head_dim, e, e_table):
    return (
        2 * (batch * heads * seq_len * head_dim + batch * kv_heads * seq_len * head_dim) * e
        + 2 * seq_len * head_dim * e_table
    )


def rope_train_bytes(batch, heads, kv_heads, seq_len, head_dim, e, e_table, mode):
    """Bytes of a RoPE training call: "bwd" as many as the forward, "fwd+bwd" twice that."""
    return {"bwd": 1, "fwd+bwd": 2}[mode] * rope_bytes(batch, heads, kv_heads, seq_len, head_dim, e, e_table)


def shapes_of(sweeps):
    """The distinct shapes of [(xlabel, [(x, shape), ...]), ...], in order."""
    return list(dict.fromkeys(s for _, points in sweeps for _, s in points))


NORM_SWEEPS = [
    ("hidden size N (16384 rows)", [(n, (16384, n)) for n in (512, 1024, 2048, 4096, 5120, 8192, 16384)]),
    ("rows M (N = 4096)", [(m, (m, 4096)) for m in (1, 16, 256, 1024, 4096, 16384, 32768)]),
    ("wide rows N (4096 rows)", [(n, (4096, n)) for n in (32768, 65536, 131072)]),
]
NORM_SMOKE_SWEEPS = [("hidden size N", [(n, (4, n)) for n in (64, 1000)]), ("rows M", [(m, (m, 256)) for m in (1, 3)])]
# Training rows (fwd+bwd, bwd): the shapes (16384 x 4096, 16384 x 8192, 4096 x 32768), a
# short row, and the widest row; few, so the training part of the GPU run stays short. The medium
# rows at N = 5120 are where the host's time per call is near the GPU's (8192 x 5120: ~0.1 ms of
# GPU work a fwd+bwd), so there the wall time shows what a call costs the host against F.rms_norm.
NORM_TRAIN_SWEEPS = [
    ("hidden size N (16384 rows)", [(n, (16384, n)) for n in (1024, 4096, 8192)]),
    ("rows M (N = 5120)", [(m, (m, 5120)) for m in (2048, 8192)]),
    ("wide rows N (4096 rows)", [(n, (4096, n)) for n in (32768, 131072)]),
]
NORM_TRAIN_SMOKE_SWEEPS = [("hidden size N", [(n, (5, n)) for n in (64, 1000)])]

MLP_SWEEPS = [
    ("hidden size (4096 tokens)", [(n, (4096, n)) for n in (4096, 11008, 14336, 16384, 28672)]),
    ("tokens (hidden size 14336)", [(m, (m, 14336)) for m in (1, 64, 1024, 4096, 8192, 16384)]),
]
MLP_SMOKE_SWEEPS = [("hidden size", [(n, (4, n)) for n in (64, 1000)]), ("tokens", [(m, (m, 256)) for m in (1, 3)])]
# Training rows (fwd+bwd, bwd), by op: the shapes (SwiGLU 8192 x 14336, 4096 x 11008,
# 16384 x 14336; bias + GELU 4096 x 16384, 8192 x 16384) and one or two neighbours, few so that the
# training part of the GPU run stays short.
MLP_TRAIN_SWEEPS = {
    "swiglu": [
        ("tokens (I = 14336)", [(m, (m, 14336)) for m in (4096, 8192, 16384)]),
        ("intermediate size I (4096 tokens)", [(n, (4096, n)) for n in (11008, 14336, 28672)]),
    ],
    "bias_gelu": [
        ("tokens (O = 16384)", [(m, (m, 16384)) for m in (2048, 4096, 8192)]),
        ("hidden size O (4096 tokens)", [(n, (4096, n)) for n in (11008, 16384)]),
    ],
}
MLP_TRAIN_SMOKE_SWEEPS = {op: [("tokens", [(m, (m, 1000)) for m in (1, 5)])] for op in MLP_TRAIN_SWEEPS}


def llama_rope(batch, seq_len):
    """B x H x Hkv x T x D of Llama-3-8B's heads."""
    return (batch, 32, 8, seq_len, 128)


ROPE_SWEEPS = {
    "rope": [
        ("sequence length T (B1 H32 Hkv8 D128)", [(t, llama_rope(1, t)) for t in (512, 1024, 2048, 4096, 8192, 16384)]),
        ("batch B (T = 4096)", [(b, llama_rope(b, 4096)) for b in (1, 4)]),
    ],
    "rope_interleaved": [("sequence length T (B1 H32 Hkv8 D128)", [(t, llama_rope(1, t)) for t in (2048, 8192)])],
}
ROPE_SMOKE_SWEEPS = {
    "rope": [
        ("sequence length T", [(t, (1, 4, 1, t, 64)) for t in (8,)]),
        ("batch B", [(b, (b, 4, 1, 8, 64)) for b in (1, 2)]),
    ],
    "rope_interleaved": [("sequence length T", [(8, (1, 4, 1, 8, 64))])],
}
# training rows (forward and backward): the Llama shapes
ROPE_TRAIN_SWEEPS = [
    ("sequence length T (B1 H32 Hkv8 D128)", [(t, llama_rope(1, t)) for t in (4096, 8192, 16384)]),
    ("batch B (T = 4096)", [(b, llama_rope(b, 4096)) for b in (1, 4)]),
]
ROPE_TRAIN_SMOKE_SWEEPS = [
    ("sequence length T", [(8, (1, 4, 1, 8, 64))]),
    ("batch B", [(b, (b, 4, 1, 8, 64)) for b in (1, 2)]),
]


def rope_inputs(shape, dtype, layout="BHTD"):
    """q (B, H, T, D), k (B, Hkv, T, D) and a (1, T, D) cos and sin table as Hugging Face's, in dtype.
    layout "BTHD": q and k are (B, T, H, D) tensors seen as (B, H, T, D), as a Llama attention
    block's projections give them (x @ W_q viewed (B, T, H, D), then .transpose(1, 2))."""
    batch, heads, kv_heads, seq_len, head_dim = shape
    if layout == "BTHD":
        q = torch.randn(batch, seq_len, heads, head_dim, device=DEVICE).to(dtype).transpose(1, 2)
        k = torch.randn(batch, seq_len, kv_heads, head_dim, device=DEVICE).to(dtype).transpose(1, 2)
    else:
        q = torch.randn(batch, heads, seq_len, head_dim, device=DEVICE).to(dtype)
        k = torch.randn(batch, kv_heads, seq_len, head_dim, device=DEVICE).to(dtype)
    angles = torch.rand(1, seq_len, head_dim, device=DEVICE) * 100
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype)
