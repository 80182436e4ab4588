"""Argument checks and outputs of RoPE (the Triton kernel and the CUDA comparison in cuda_cpp/)."""

import torch

from llmk.common.validation import check_out, check_same_device, check_tensor, contiguous_like

ROPE_MAX_HEAD_DIM = 1024  # the RoPE kernels (Triton and CUDA) hold half a head in one block


def check_rope_args(q, k, cos, sin, interleaved, partial=False):
    """Argument checks of RoPE (Triton and CUDA): q (B, H, T, D), k (B, Hkv, T, D) of one dtype,
    cos/sin tables (T, R), (1, T, R) or (B, T, R); raises naming the first bad argument.
    partial=False (the CUDA kernel): R = D, even. partial=True (the Triton kernel): R, the rotary
    dim, is the tables' last dim, even and 2 <= R <= D (the first R features of a head rotate, the
    other D - R pass through), and D may be odd. Returns R."""
    check_tensor("q", q)
    check_tensor("k", k)
    check_same_device("k", k, "q", q)
    if q.dim() != 4 or k.dim() != 4:
        bad = "q" if q.dim() != 4 else "k"
        raise ValueError(f"{bad} must have 4 dims (B, heads, T, D), got shape {tuple((q if bad == 'q' else k).shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}; got {k.dtype}")
    batch, _, seq_len, head_dim = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq_len, head_dim):
        raise ValueError(
            f"k must be (B, Hkv, T, D) with q's B = {batch}, T = {seq_len}, D = {head_dim}; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if head_dim > ROPE_MAX_HEAD_DIM or (head_dim % 2 and not partial):
        raise ValueError(
            f"q and k need {'a' if partial else 'an even'} head dim D <= {ROPE_MAX_HEAD_DIM}"
            f"{'' if partial else ' (pairs of features are rotated)'}; got D = {head_dim}"
        )
    table_dtypes = (torch.float32,) if q.dtype == torch.float32 else (torch.float32, q.dtype)
    for name, table in (("cos", cos), ("sin", sin)):
        check_tensor(name, table, dtypes=table_dtypes)
        check_same_device(name, table, "q", q)
    rotary_dim, r = (cos.shape[-1], "R") if partial else (head_dim, "D")
    for name, table in (("cos", cos), ("sin", sin)):
        shape = tuple(table.shape)
        if not (
            shape == (seq_len, rotary_dim)
            or (len(shape) == 3 and shape[0] in (1, batch) and shape[1:] == (seq_len, rotary_dim))
        ):
            raise ValueError(
                f"{name} must have shape (T, {r}) = {(seq_len, rotary_dim)}, (1, T, {r}) or "
                f"(B, T, {r}) = {(batch, seq_len, rotary_dim)}; got {shape}"
            )
    if rotary_dim % 2 or rotary_dim > head_dim or (rotary_dim == 0 and head_dim > 0):
        raise ValueError(
            f"cos and sin's last dim is the rotary dim R (the first R features of a head "
            f"rotate, in pairs): it must be even, 2 <= R <= D = {head_dim}; got R = {rotary_dim}"
        )
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
    return rotary_dim


def rope_outputs(q, k, out):
    """(q_out, k_out): the checked `out` pair, or new contiguous tensors shaped and typed like q, k."""
    if out is None:
        return contiguous_like(q), contiguous_like(k)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a (q_out, k_out) pair or None, got {type(out).__name__}")
    check_out("out[0] (q_out)", out[0], q.shape, q.dtype, q.device)
    check_out("out[1] (k_out)", out[1], k.shape, k.dtype, k.device)
    return tuple(out)
