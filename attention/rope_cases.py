"""RoPE inputs, tables and checks for any implementation `impl(q, k, cos, sin, interleaved=False,
out=None)`: the Triton kernel (attention/test_rope.py) and the CUDA one (cuda_cpp/test_cuda_kernels.py)."""

import torch

from llmk.attention.reference_rope import apply_rope_ref, rope_cos_sin
from llmk.common.device import DEVICE
from llmk.devtools.testing import Outcome, compare, rand


def make_qk(batch, heads, kv_heads, seq_len, head_dim, dtype, strided=None):
    """q (B, H, T, D), k (B, Hkv, T, D). strided "BTHD": the projection's (B, T, H, D) layout seen as
    (B, H, T, D), read in place; "every other feature": stride 2 along D."""
    if strided == "BTHD":
        return (
            rand((batch, seq_len, heads, head_dim), dtype).transpose(1, 2),
            rand((batch, seq_len, kv_heads, head_dim), dtype).transpose(1, 2),
        )
    if strided == "every other feature":
        return (
            rand((batch, heads, seq_len, 2 * head_dim), dtype)[..., ::2],
            rand((batch, kv_heads, seq_len, 2 * head_dim), dtype)[..., 1::2],
        )
    return rand((batch, heads, seq_len, head_dim), dtype), rand((batch, kv_heads, seq_len, head_dim), dtype)


def make_table(batch, seq_len, head_dim, layout, kind, dtype):
    """cos, sin for the test.

    layout: "T,D" (one table for the batch), "1,T,D", "B,T,D", "B,T,D expanded" (a (1, T, D) table
    expanded, batch stride 0) or "T,D strided" (columns of a wider cache). kind: "rope" is
    rope_cos_sin at random positions (each sequence its own for B,T,D); "random" is normal noise
    whose two halves differ, so a kernel reading the wrong column of the table fails.
    """
    rows = batch if layout == "B,T,D" else 1
    if kind == "rope":
        positions = torch.randint(0, 8192, (rows, seq_len), device=DEVICE)
        cos, sin = rope_cos_sin(positions, head_dim, dtype=dtype)
    else:
        cos, sin = rand((rows, seq_len, head_dim), dtype), rand((rows, seq_len, head_dim), dtype)
    if layout in ("T,D", "T,D strided"):
        cos, sin = cos[0], sin[0]
    if layout == "T,D strided":
        cos = torch.cat((cos, rand((seq_len, 24), dtype)), dim=-1)[:, :head_dim]
        sin = torch.cat((rand((seq_len, 8), dtype), sin), dim=-1)[:, 8:]
    if layout == "B,T,D expanded":
        cos, sin = cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)
    return cos, sin


def check_own_buffer(impl):
    """From (B, T, H, D) views: new contiguous (B, H, T, D) outputs."""
    q = rand((1, 5, 3, 64), torch.float16).transpose(1, 2)
    k = rand((1, 5, 1, 64), torch.float16).transpose(1, 2)
    cos, sin = make_table(1, 5, 64, "T,D", "rope", torch.float32)
    q_out, k_out = impl(q, k, cos, sin)
    q_ref, k_ref = apply_rope_ref(q.double(), k.double(), cos.double(), sin.double())
    return [
        compare("q", q_out, q_ref),
        compare("k", k_out, k_ref),
        Outcome("outputs contiguous", q_out.is_contiguous() and k_out.is_contiguous()),
    ]


def check_huge(impl):
    """q past 2^31 elements (B1 H32 T524289 D128): the last positions, where 32-bit offsets wrap."""
    seq_len = 2**31 // (32 * 128) + 1
    q, k = rand((1, 32, seq_len, 128), torch.bfloat16), rand((1, 1, seq_len, 128), torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(seq_len, device=DEVICE), 128)
    q_out, k_out = impl(q, k, cos, sin)
    tail = slice(seq_len - 3, seq_len)
    q_ref, k_ref = apply_rope_ref(
        q[:, :, tail].double(), k[:, :, tail].double(), cos[tail].double(), sin[tail].double()
    )
    return [
        compare("q last positions", q_out[:, :, tail], q_ref),
        compare("k last positions", k_out[:, :, tail], k_ref),
    ]


def check_empty(impl):
    outcomes = []
    for name, (q_shape, k_shape) in {
        "T = 0": ((2, 4, 0, 64), (2, 2, 0, 64)),
        "B = 0": ((0, 4, 6, 64), (0, 2, 6, 64)),
    }.items():
        q, k = rand(q_shape, torch.bfloat16), rand(k_shape, torch.bfloat16)
        cos, sin = rand(q_shape[2:], torch.float32), rand(q_shape[2:], torch.float32)
        q_out, k_out = impl(q, k, cos, sin)
        outcomes.append(
            Outcome(
                f"{name}: empty in, empty out",
                q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == k_out.dtype == q.dtype,
            )
        )
    return outcomes
