"""Hand-written CUDA C++ RMSNorm, RoPE and SwiGLU (cuda_cpp/csrc), with the Triton kernels' interfaces.

    rmsnorm(x, weight, eps=1e-6, out=None)                     as normalization/triton_rmsnorm.py
    apply_rope(q, k, cos, sin, interleaved=False, out=None)    as attention/triton_rope.py
    swiglu(gate, up, out=None)                                  as mlp/triton_glu.py

Same math (fp32 inside, one rounding to the input dtype), the Triton launchers' argument checks and
messages (normalization/checks.py, attention/rope_checks.py, mlp/checks.py), plus one: tensors must
be on a CUDA device. The kernels are compiled at the first call (cuda_cpp/extension.py); bad input
raises before that.

Layouts: the last dim must be unit-stride for 16-byte packs; any other stride is taken as it is
(RMSNorm and SwiGLU rows, every RoPE stride). Inputs that cannot be read in 16-byte packs
(misaligned, or a row stride that is not a multiple of 16 bytes) run the scalar variant of the same
kernel; RoPE's scalar variant honours a strided head dim too. RMSNorm and SwiGLU inputs whose
last dim is strided, or whose leading dims cannot merge into one row index, are copied once
(common.validation.as_rows), as the Triton launchers do.
"""

import torch

from llmk.attention.rope_checks import check_rope_args, rope_outputs
from llmk.common.validation import as_rows, check_out
from llmk.cuda_cpp.extension import extension
from llmk.cuda_cpp.launch_config import PACK_BYTES, pack_size, rmsnorm_config, rope_config, swiglu_config
from llmk.mlp.checks import check_swiglu_args
from llmk.normalization.checks import check_norm_args

DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}  # csrc/common.cuh DType


def check_cuda(**tensors):
    """Every tensor on a CUDA device (the shared checks accept any tensor on common.device's device)."""
    for name, t in tensors.items():
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be a CUDA tensor for the CUDA kernels, got a tensor on {t.device}")


def packs_fit(vec, *tensors):
    """Whether every tensor can be read in 16-byte packs of `vec` values: base address 16-byte
    aligned, unit last stride, every other stride a multiple of the pack (dims of size 1 aside)."""
    for t in tensors:
        if t.data_ptr() % PACK_BYTES or (t.shape[-1] > 1 and t.stride(-1) != 1):
            return False
        if any(stride % vec for size, stride in zip(t.shape[:-1], t.stride()[:-1]) if size > 1):
            return False
    return True


def launch_args(device):
    """The stream to launch on, and whether x's device must be made current first."""
    switch = device.index is not None and device.index != torch.cuda.current_device()
    return torch.cuda.current_stream(device).cuda_stream, switch


def run_on(device, fn, **kwargs):
    """fn(stream=..., **kwargs) with `device` current (a launch goes to the current device)."""
    stream, switch = launch_args(device)
    if switch:
        with torch.cuda.device(device):
            return fn(stream=stream, **kwargs)
    return fn(stream=stream, **kwargs)


# ---- RMSNorm ----


def launch_rmsnorm(x, weight, eps, y, cfg=None):
    """Launch on validated arguments: x (..., N) on a CUDA device; weight (N,) in x's dtype or fp32;
    y a contiguous output shaped like x. Writes y. cfg: a launch_config.RmsnormConfig, by default
    rmsnorm_config's."""
    if x.numel() == 0:
        return
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    y2 = y.view(-1, n_cols)
    weight = weight.contiguous()
    vector = packs_fit(pack_size(x.element_size(), True), x2, y2, weight)
    cfg = cfg or rmsnorm_config(n_cols, x.element_size(), vector)
    run_on(
        x.device,
        extension().rmsnorm,
        dtype=DTYPE_CODES[x.dtype],
        weight_dtype=DTYPE_CODES[weight.dtype],
        x=x2.data_ptr(),
        weight=weight.data_ptr(),
        y=y2.data_ptr(),
        n_rows=n_rows,
        n_cols=n_cols,
        stride_x=x2.stride(0),
        stride_y=y2.stride(0),
        eps=float(eps),
        vector=vector,
        looped=cfg.looped,
        vectors_per_thread=cfg.vectors_per_thread,
        threads_per_row=cfg.threads_per_row,
        rows_per_block=cfg.rows_per_block,
    )


def rmsnorm(x, weight, eps=1e-6, out=None):
    """RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * weight, fp32 math.

    x: (..., N) fp16, bf16 or fp32 on a CUDA device, any row stride. weight: (N,) any float dtype
       (one in neither x's dtype nor fp32 is converted to fp32 first: N values).
    out: optional contiguous buffer shaped like x. Returns y: (..., N), x's dtype.
    """
    if weight is None:
        raise TypeError("weight must be a tensor of shape (N,), got None")
    check_norm_args(x, weight, eps)
    check_cuda(x=x, weight=weight)
    if out is not None:
        check_out("out", out, x.shape, x.dtype, x.device)
    if weight.dtype not in (x.dtype, torch.float32):
        weight = weight.float()
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    launch_rmsnorm(x, weight, eps, y)
    return y


# ---- SwiGLU ----


def launch_swiglu(gate, up, y, cfg=None):
    """Launch on validated arguments: gate, up (..., I) of one dtype on a CUDA device; y a contiguous
    output shaped like gate. Writes y. cfg: a launch_config.SwigluConfig."""
    if gate.numel() == 0:
        return
    g2, u2 = as_rows(gate), as_rows(up)
    n_rows, n_cols = g2.shape
    y2 = y.view(-1, n_cols)
    if all(t.stride(0) == n_cols for t in (g2, u2, y2)):  # all packed: one row, no row ends to respect
        g2, u2, y2 = (t.view(1, -1) for t in (g2, u2, y2))
        n_rows, n_cols = 1, n_rows * n_cols
    vector = packs_fit(pack_size(gate.element_size(), True), g2, u2, y2)
    cfg = cfg or swiglu_config(vector)
    run_on(
        gate.device,
        extension().swiglu,
        dtype=DTYPE_CODES[gate.dtype],
        gate=g2.data_ptr(),
        up=u2.data_ptr(),
        y=y2.data_ptr(),
        n_rows=n_rows,
        n_cols=n_cols,
        stride_gate=g2.stride(0),
        stride_up=u2.stride(0),
        stride_y=y2.stride(0),
        vector=vector,
        vectors_per_thread=cfg.vectors_per_thread,
        threads=cfg.threads,
    )


def swiglu(gate, up, out=None):
    """silu(gate) * up in one pass, fp32 math, one rounding.

    gate, up: (..., I), same shape, fp16, bf16 or fp32 (one dtype) on a CUDA device, any row strides
       (the two halves of a fused gate/up projection are read in place).
    out: optional contiguous buffer shaped like gate. Returns y: (..., I), gate's dtype.
    """
    check_swiglu_args(gate, up)
    check_cuda(gate=gate, up=up)
    if out is not None:
        check_out("out", out, gate.shape, gate.dtype, gate.device)
    y = out if out is not None else torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    launch_swiglu(gate, up, y)
    return y


# ---- RoPE ----


def _table(table, batch):
    """A (T, D), (1, T, D) or (B, T, D) table as a (B or 1, T, D) view; batch stride 0 when shared."""
    if table.dim() == 2:
        table = table.unsqueeze(0)
    if table.shape[0] == 1 and batch > 1:
        table = table.expand(batch, -1, -1)  # stride 0: every sequence reads the same rows
    return table


def launch_rope(q, k, cos, sin, q_out, k_out, interleaved, cfg=None):
    """Launch on validated arguments (shapes as in apply_rope); writes q_out, k_out (contiguous).
    cfg: a launch_config.RopeConfig, by default rope_config's."""
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_k_heads = k.shape[1]
    if batch * seq_len == 0 or head_dim == 0 or n_q_heads + n_k_heads == 0:
        return
    if cos.dtype != sin.dtype:  # the kernel reads one table dtype: both as fp32 (T x D values each)
        cos, sin = cos.float(), sin.float()
    cos, sin = _table(cos, batch), _table(sin, batch)
    pairs = pack_size(q.element_size(), True)
    vector = (head_dim // 2) % pairs == 0 and packs_fit(pairs, q, k, cos, sin, q_out, k_out)
    cfg = cfg or rope_config(head_dim, n_q_heads + n_k_heads, q.element_size(), vector)
    # strides of size-1 dims are never multiplied by a nonzero index, so any value is right there
    strides = [*q.stride(), *k.stride(), *cos.stride(), *sin.stride(), *q_out.stride()[:3], *k_out.stride()[:3]]
    run_on(
        q.device,
        extension().rope,
        dtype=DTYPE_CODES[q.dtype],
        table_dtype=DTYPE_CODES[cos.dtype],
        q=q.data_ptr(),
        k=k.data_ptr(),
        cos=cos.data_ptr(),
        sin=sin.data_ptr(),
        q_out=q_out.data_ptr(),
        k_out=k_out.data_ptr(),
        batch=batch,
        seq_len=seq_len,
        n_q_heads=n_q_heads,
        n_k_heads=n_k_heads,
        head_dim=head_dim,
        strides=strides,
        interleaved=interleaved,
        vector=vector,
        threads_pairs=cfg.threads_pairs,
        threads_heads=cfg.threads_heads,
    )


def apply_rope(q, k, cos, sin, interleaved=False, out=None):
    """Rotary embeddings on q and k in one launch (the HF table; both pair layouts).

    q: (B, H, T, D), k: (B, Hkv, T, D), fp16, bf16 or fp32, one dtype, on a CUDA device, any strides.
       D even, <= 1024.
    cos, sin: (T, D), (1, T, D) or (B, T, D), fp32 or q's dtype, any strides. interleaved=False pairs
       (x[i], x[i + D/2]) and uses every column; True pairs (x[2i], x[2i + 1]) and uses columns
       0 .. D/2-1 only (attention/reference_rope.py).
    out: optional (q_out, k_out), contiguous buffers shaped and typed like q and k.
    Returns (q_out, k_out): new contiguous (B, H, T, D) and (B, Hkv, T, D) tensors in q's dtype.
    """
    check_rope_args(q, k, cos, sin, interleaved)
    check_cuda(q=q, k=k, cos=cos, sin=sin)
    q_out, k_out = rope_outputs(q, k, out)
    launch_rope(q, k, cos, sin, q_out, k_out, interleaved)
    return q_out, k_out
