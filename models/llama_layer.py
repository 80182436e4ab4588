"""One Llama / Qwen2 decoder layer built from our operators, beside the same layer in plain PyTorch.

    h = rmsnorm(x) ; q, k, v = h Wqkv^T (+ bqkv) ; q, k = rope(q, k)
    u = x + attention(q, k, v) Wo^T                     (causal, GQA: H query heads, Hkv kv heads)
    y = u + (silu(g) * up) Wdown^T,   g | up = rmsnorm(u) Wgate_up^T

The two shapes benchmarked (CONFIGS): Llama-3-8B (hidden 4096, 32/8 heads of 128, MLP 14336, eps
1e-5, rope theta 5e5; Llama 3.1's long-context frequency scaling is left out) and Qwen2-7B (hidden
3584, 28/4 heads of 128, MLP 18944, eps 1e-6, theta 1e6, q/k/v projections with bias); "tiny-*"
shapes run in the interpreter. Weights are random and seeded (make_weights), in nn.Linear's (N, K)
layout, with q, k and v fused into one (H + 2 Hkv) * D row block and gate and up into one 2I block.

Two passes of ours, each mirrored by a torch_* reference (F.rms_norm, F.linear = cuBLAS, RoPE in
torch as Hugging Face computes it, SDPA):

- prefill(weights, x, cos, sin): T tokens a sequence, no cache; rmsnorm, matmul, apply_rope,
  flash_attention (causal), residual_rmsnorm, swiglu.
- decode_step(weights, x, k_cache, v_cache, lengths, cos, sin, paged=None): one new token a
  sequence against its KV cache; rmsnorm_linear (the norm fused into the QKV GEMM, M = B),
  apply_rope at each sequence's position, the new k and v written at position lengths - 1,
  decode_attention (paged_decode_attention through a block table), matmul, residual_rmsnorm,
  swiglu, matmul, residual add. Everything stays on the device (positions come from `lengths` by
  tensor indexing, never .item()), so a step can be captured in a CUDA graph and replayed with new
  lengths, and torch.compile(fullgraph=True) traces it whole.

For inference: the decode kernels and the out= calls the layer makes are forward-only, so call
both passes under torch.no_grad() or torch.inference_mode().
"""

from dataclasses import dataclass, fields, replace
from typing import Optional

import torch
import torch.nn.functional as F

from llmk.attention.flash_attention_ops import flash_attention
from llmk.attention.reference_rope import apply_rope_ref, rope_cos_sin
from llmk.attention.triton_rope import apply_rope
from llmk.gemm.matmul_ops import matmul
from llmk.gemm.triton_rmsnorm_linear import rmsnorm_linear
from llmk.inference.paged_kv_cache import gather_pages
from llmk.inference.triton_inference_attention import decode_attention, paged_decode_attention
from llmk.mlp.triton_glu import swiglu
from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm
from llmk.normalization.triton_rmsnorm import rmsnorm


@dataclass(frozen=True)
class LayerConfig:
    name: str
    hidden: int  # model width
    heads: int  # query heads H
    kv_heads: int  # key/value heads Hkv (H a multiple of it: GQA)
    head_dim: int  # D (1 to 256: the decode kernel's head dims)
    intermediate: int  # MLP width I
    eps: float  # RMSNorm epsilon
    rope_theta: float
    qkv_bias: bool  # Qwen2: the q, k, v projections carry a bias

    @property
    def qkv_width(self):
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def n_params(self):
        """Parameters of the layer: both norms, q/k/v (and bias), o, gate/up and down."""
        return (
            2 * self.hidden
            + self.qkv_width * (self.hidden + self.qkv_bias)
            + self.hidden * self.heads * self.head_dim
            + 3 * self.intermediate * self.hidden
        )


CONFIGS = {
    "llama3-8b": LayerConfig("llama3-8b", 4096, 32, 8, 128, 14336, 1e-5, 500000.0, False),
    "qwen2-7b": LayerConfig("qwen2-7b", 3584, 28, 4, 128, 18944, 1e-6, 1000000.0, True),
    # the interpreter's: the same structure (GQA 2 and 4, bias or not) at a few hundred wide
    "tiny-llama": LayerConfig("tiny-llama", 256, 4, 2, 64, 384, 1e-5, 500000.0, False),
    "tiny-qwen2": LayerConfig("tiny-qwen2", 256, 4, 1, 64, 320, 1e-6, 1000000.0, True),
}


@dataclass(frozen=True)
class LayerWeights:
    """One layer's parameters, nn.Linear layout (out_features, in_features):
    input_norm (hidden,); wqkv (qkv_width, hidden), rows q | k | v; bqkv (qkv_width,) or None;
    wo (hidden, H * D); post_norm (hidden,); w_gate_up (2 I, hidden), rows gate | up; w_down (hidden, I)."""

    config: LayerConfig
    input_norm: torch.Tensor
    wqkv: torch.Tensor
    bqkv: Optional[torch.Tensor]
    wo: torch.Tensor
    post_norm: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor

    def tensors(self):
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "config" and getattr(self, f.name) is not None
        }

    def to(self, dtype):
        """The same weights in `dtype` (fp32: the exact widening, for references)."""
        return replace(self, **{name: t.to(dtype) for name, t in self.tensors().items()})


# Random weights: every linear layer N(0, 1/fan_in), so each projection of a unit-variance input
# keeps unit variance and attention scores (q.k / sqrt(D)) are O(1), far from uniform: a wrong
# rotation, mask or cache slot changes the output. Norm weights N(1, 0.2^2) and biases N(0, 0.5^2),
# where HF starts at one and zero, so that a dropped norm weight or bias shows too.
NORM_WEIGHT_STD = 0.2
BIAS_STD = 0.5


def make_weights(config, dtype=torch.bfloat16, device="cpu", seed=0):
    """LayerWeights of `config`, drawn in fp32 on the CPU from `seed` (the same numbers on every
    machine), then cast to `dtype` on `device`."""
    gen = torch.Generator().manual_seed(seed)

    def linear(n, k):
        return torch.randn(n, k, generator=gen) * k**-0.5

    def vector(n, mean, std):
        return mean + std * torch.randn(n, generator=gen)

    c = config
    w = LayerWeights(
        c,
        input_norm=vector(c.hidden, 1.0, NORM_WEIGHT_STD),
        wqkv=linear(c.qkv_width, c.hidden),
        bqkv=vector(c.qkv_width, 0.0, BIAS_STD) if c.qkv_bias else None,
        wo=linear(c.hidden, c.heads * c.head_dim),
        post_norm=vector(c.hidden, 1.0, NORM_WEIGHT_STD),
        w_gate_up=linear(2 * c.intermediate, c.hidden),
        w_down=linear(c.hidden, c.intermediate),
    )
    return replace(w, **{name: t.to(device=device, dtype=dtype) for name, t in w.tensors().items()})


def mark_static(weights, *caches):
    """Mark the weights and caches as tensors that keep their address across calls, for
    torch.compile(mode="reduce-overhead"): its CUDA graphs then read them in place, where an input
    not so marked is copied into the graph's own buffer at every replay (the whole layer's weights),
    and a cache that a step writes into may only be a static input (else Inductor runs no graph).
    Unguarded: another tensor in the same place re-records the graph rather than recompiling."""
    for t in (*weights.tensors().values(), *caches):
        torch._dynamo.mark_static_address(t, guard=False)


def rope_tables(config, n_positions, device="cpu"):
    """cos, sin (n_positions, D) fp32: the Hugging Face table of positions 0 .. n_positions - 1."""
    return rope_cos_sin(torch.arange(n_positions, device=device), config.head_dim, base=config.rope_theta)


def _split_qkv(qkv, config):
    """(M, qkv_width) -> q (M, H, D), k, v (M, Hkv, D): views of the fused projection's columns."""
    h, hkv, d = config.heads, config.kv_heads, config.head_dim
    q, k, v = qkv.split((h * d, hkv * d, hkv * d), dim=-1)
    return q.unflatten(-1, (h, d)), k.unflatten(-1, (hkv, d)), v.unflatten(-1, (hkv, d))


def _positions(lengths):
    """The new token's slot in each sequence, lengths - 1, as int64 (B,) for indexing."""
    return lengths.long() - 1


def write_kv(k_cache, v_cache, k_new, v_new, lengths, paged=None):
    """Write one token a sequence at position lengths - 1, on the device (tensor indexing: no host
    sync, capturable). k_new, v_new: (B, Hkv, D). Contiguous caches (B, T_max, Hkv, D); with a block
    table `paged` (B, max_pages) int32, pages (num_pages, PAGE_SIZE, Hkv, D)."""
    pos = _positions(lengths)
    rows = torch.arange(lengths.shape[0], device=lengths.device)
    if paged is None:
        k_cache[rows, pos] = k_new
        v_cache[rows, pos] = v_new
    else:
        page_size = k_cache.shape[1]
        page = paged[rows, pos // page_size].long()
        slot = pos % page_size
        k_cache[page, slot] = k_new
        v_cache[page, slot] = v_new


# ---------------------------------------------------------------------------------------------
# ours


def prefill(weights, x, cos, sin):
    """The layer over T tokens a sequence, causal, no cache, from our operators.

    x: (B, T, hidden) fp16 or bf16. cos, sin: (T, D) or (B, T, D) rope tables (rope_tables).
    Returns (y, k, v): y (B, T, hidden) in x's dtype; k (B, Hkv, T, D) rotated and v (B, Hkv, T, D),
    what a KV cache keeps of these tokens.
    """
    c = weights.config
    b, t, hidden = x.shape
    h = rmsnorm(x, weights.input_norm, c.eps)
    qkv = matmul(h.view(b * t, hidden), weights.wqkv.t(), bias=weights.bqkv)
    q, k, v = (z.unflatten(0, (b, t)).transpose(1, 2) for z in _split_qkv(qkv, c))  # (B, heads, T, D) views
    q, k = apply_rope(q, k, cos, sin)
    # attention written straight into (B, T, H, D): o_proj reads it as (B * T, H * D) with no copy
    attn = torch.empty((b, t, c.heads, c.head_dim), dtype=x.dtype, device=x.device)
    flash_attention(q, k, v, causal=True, out=attn.transpose(1, 2))
    o = matmul(attn.view(b * t, c.heads * c.head_dim), weights.wo.t())
    h2, u = residual_rmsnorm(o.view(b, t, hidden), x, weights.post_norm, c.eps)
    y = _mlp(weights, h2.view(b * t, hidden)).view(b, t, hidden) + u
    return y, k, v


def _mlp(weights, h):
    """(M, hidden) -> (M, hidden): down(swiglu(gate, up)), gate | up from one GEMM."""
    gate_up = matmul(h, weights.w_gate_up.t())
    i = weights.config.intermediate
    return matmul(swiglu(gate_up[:, :i], gate_up[:, i:]), weights.w_down.t())


def decode_step(weights, x, k_cache, v_cache, lengths, cos, sin, paged=None, num_splits=None):
    """One new token a sequence through the layer, against (and into) its KV cache, from our operators.

    x: (B, hidden) fp16 or bf16, the new tokens' hidden states.
    k_cache, v_cache: (B, T_max, Hkv, D) in x's dtype, holding each sequence's earlier tokens; with
       paged (a (B, max_pages) int32 block table) pages (num_pages, PAGE_SIZE, Hkv, D) instead.
       The new token's k and v are written at position lengths - 1 (in place).
    lengths: (B,) int32 on the device, tokens of each sequence counting the new one (1 .. T_max).
    cos, sin: (n_positions, D) rope tables (rope_tables), n_positions >= T_max; row lengths - 1 is used.
    num_splits: decode attention's split-KV count (None: its heuristics; tests force >= 2).
    Returns y: (B, hidden) in x's dtype.
    """
    c = weights.config
    b = x.shape[0]
    qkv = rmsnorm_linear(x, weights.input_norm, weights.wqkv, c.eps)
    if weights.bqkv is not None:
        qkv = qkv + weights.bqkv
    q, k, v = _split_qkv(qkv, c)
    pos = _positions(lengths)
    cos_b, sin_b = cos[pos][:, None], sin[pos][:, None]  # (B, 1, D): each sequence at its own position
    q, k = apply_rope(q[:, :, None], k[:, :, None], cos_b, sin_b)  # (B, H, 1, D), (B, Hkv, 1, D)
    write_kv(k_cache, v_cache, k[:, :, 0], v, lengths, paged)
    if paged is None:
        attn = decode_attention(q[:, :, 0], k_cache, v_cache, lengths, num_splits=num_splits)
    else:
        attn = paged_decode_attention(q[:, :, 0], k_cache, v_cache, paged, lengths, num_splits=num_splits)
    o = matmul(attn.view(b, c.heads * c.head_dim), weights.wo.t())
    h2, u = residual_rmsnorm(o, x, weights.post_norm, c.eps)
    return _mlp(weights, h2) + u


# ---------------------------------------------------------------------------------------------
# PyTorch


def _sdpa_backends(q):
    """SDPA's flash backend for fp16 / bf16 on the GPU (FlashAttention-2), else PyTorch's choice."""
    from torch.nn.attention import SDPBackend

    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        return [SDPBackend.FLASH_ATTENTION]
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _sdpa(q, k, v, config, causal=False, mask=None):
    """F.scaled_dot_product_attention with GQA, q (B, H, Tq, D), k, v (B, Hkv, Tk, D). enable_gqa is
    always on (a no-op for H = Hkv): torch.compile with dynamic shapes traces the config's ints as
    symbols, and SDPA takes no symbolic bool."""
    from torch.nn.attention import sdpa_kernel

    group = config.heads // config.kv_heads
    if mask is not None:  # a mask: K and V expanded to H heads, any backend that takes a mask
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with sdpa_kernel(_sdpa_backends(q)):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def _torch_mlp(weights, h):
    gate, up = F.linear(h, weights.w_gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, weights.w_down)


def torch_prefill(weights, x, cos, sin):
    """prefill in plain PyTorch: F.rms_norm, F.linear (cuBLAS), Hugging Face's RoPE (in x's dtype),
    SDPA (flash backend on the GPU for fp16 / bf16). Same arguments and results as prefill; fp32
    weights and x give the reference."""
    c = weights.config
    b, t, hidden = x.shape
    h = F.rms_norm(x, (hidden,), weights.input_norm, c.eps)
    q, k, v = (z.transpose(1, 2) for z in _split_qkv(F.linear(h, weights.wqkv, weights.bqkv), c))
    q, k = apply_rope_ref(q, k, cos, sin)
    attn = _sdpa(q, k, v, c, causal=True).transpose(1, 2).reshape(b, t, c.heads * c.head_dim)
    u = x + F.linear(attn, weights.wo)
    y = u + _torch_mlp(weights, F.rms_norm(u, (hidden,), weights.post_norm, c.eps))
    return y, k, v


def torch_decode_step(weights, x, k_cache, v_cache, lengths, cos, sin, paged=None, kv_len=None):
    """decode_step in plain PyTorch, same arguments and result.

    kv_len: an int T when every sequence has length T: SDPA (flash on the GPU) over the cache's first
    T tokens, capturable. None: lengths may differ, and SDPA runs with a mask over the whole cache
    (K and V expanded to H heads; a paged cache gathered into a contiguous copy first): for tests.
    """
    c = weights.config
    b, hidden = x.shape
    h = F.rms_norm(x, (hidden,), weights.input_norm, c.eps)
    q, k, v = _split_qkv(F.linear(h, weights.wqkv, weights.bqkv), c)
    pos = _positions(lengths)
    q, k = apply_rope_ref(q[:, :, None], k[:, :, None], cos[pos][:, None], sin[pos][:, None])
    write_kv(k_cache, v_cache, k[:, :, 0], v, lengths, paged)
    keys, values = k_cache, v_cache
    if paged is not None:
        keys, values = gather_pages(k_cache, paged), gather_pages(v_cache, paged)
    if kv_len is not None:
        attn = _sdpa(q, keys[:, :kv_len].transpose(1, 2), values[:, :kv_len].transpose(1, 2), c)
    else:
        mask = torch.arange(keys.shape[1], device=x.device) < lengths[:, None]  # (B, T_max)
        attn = _sdpa(q, keys.transpose(1, 2), values.transpose(1, 2), c, mask=mask[:, None, None, :])
    u = x + F.linear(attn.reshape(b, c.heads * c.head_dim), weights.wo)
    return u + _torch_mlp(weights, F.rms_norm(u, (hidden,), weights.post_norm, c.eps))
