"""Argument checks shared by every launcher: each raises before anything is launched, with a
message that names the argument and says what was expected."""
import math
import os

import torch

from llmk.common.device import DEVICE

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def check_tensor(name, t, dtypes=FLOAT_DTYPES, min_dim=1):
    """`t` must be a tensor on the kernel device, of one of `dtypes`, with at least `min_dim` dims."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        wanted = ", ".join(DTYPE_NAMES.get(d, str(d)) for d in dtypes)
        raise TypeError(f"{name} must have dtype {wanted}; got {t.dtype}")
    if t.device.type != DEVICE:
        raise ValueError(f"{name} must be on the {DEVICE} device, got a tensor on {t.device}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dim(s), got shape {tuple(t.shape)}")


def check_same_device(name, t, like_name, like):
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but {like_name} is on {like.device}")


def check_out(name, out, shape, dtype, device):
    """A caller-supplied output buffer must match what the kernel would allocate."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(
            f"{name} must have shape {tuple(shape)}, dtype {dtype} and device {device}; "
            f"got {tuple(out.shape)}, {out.dtype}, {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def as_rows(t):
    """View `t` (..., N) as (rows, N) without a copy when the leading dims merge and the last dim
    is unit-stride; otherwise copy once (the kernels take a row stride, not a column stride)."""
    n_cols = t.shape[-1]
    if t.stride(-1) != 1 and n_cols > 1:
        t = t.contiguous()
    try:
        return t.view(-1, n_cols)
    except RuntimeError:  # leading dims that cannot be merged into one row index
        return t.reshape(-1, n_cols)


def check_norm_args(x, weight, eps, x_name="x", weight_name="weight", offset=0.0):
    """Argument checks of the row-wise norms (RMSNorm, LayerNorm; Triton and CUDA); returns N, the
    normalized size. weight may be None (no affine weight). offset: RMSNorm's, added to the weight."""
    check_tensor(x_name, x)
    n_cols = x.shape[-1]
    if weight is not None:
        check_tensor(weight_name, weight)
        check_same_device(weight_name, weight, x_name, x)
        if tuple(weight.shape) != (n_cols,):
            raise ValueError(f"{weight_name} must have shape ({n_cols},) to match the last dim of "
                             f"{x_name} {tuple(x.shape)}; got {tuple(weight.shape)}")
    if isinstance(eps, bool):  # a flag passed where eps goes would be taken as 1.0
        raise TypeError(f"eps must be a number, not a bool; got {eps!r}")
    if not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    if isinstance(offset, bool) or not isinstance(offset, (int, float)):
        raise TypeError(f"offset must be a number (1.0 for Gemma's RMSNorm), got {offset!r}")
    if not math.isfinite(offset):
        raise ValueError(f"offset must be finite, got {offset!r}")
    return n_cols


def check_swiglu_args(gate, up):
    """Argument checks of SwiGLU (Triton and CUDA): gate and up of one shape, dtype and device."""
    check_tensor("gate", gate)
    check_tensor("up", up)
    check_same_device("up", up, "gate", gate)
    if up.dtype != gate.dtype:
        raise TypeError(f"up must have gate's dtype {gate.dtype}; got {up.dtype}")
    if up.shape != gate.shape:
        raise ValueError(f"up must have gate's shape {tuple(gate.shape)}; got {tuple(up.shape)}")


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
        raise ValueError(f"k must be (B, Hkv, T, D) with q's B = {batch}, T = {seq_len}, D = {head_dim}; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if head_dim > ROPE_MAX_HEAD_DIM or (head_dim % 2 and not partial):
        raise ValueError(f"q and k need {'a' if partial else 'an even'} head dim D <= {ROPE_MAX_HEAD_DIM}"
                         f"{'' if partial else ' (pairs of features are rotated)'}; got D = {head_dim}")
    for name, table in (("cos", cos), ("sin", sin)):
        check_tensor(name, table, dtypes=tuple(dict.fromkeys((torch.float32, q.dtype))))
        check_same_device(name, table, "q", q)
    rotary_dim, r = (cos.shape[-1], "R") if partial else (head_dim, "D")
    for name, table in (("cos", cos), ("sin", sin)):
        shape = tuple(table.shape)
        if not (shape == (seq_len, rotary_dim) or (len(shape) == 3 and shape[0] in (1, batch)
                                                    and shape[1:] == (seq_len, rotary_dim))):
            raise ValueError(f"{name} must have shape (T, {r}) = {(seq_len, rotary_dim)}, (1, T, {r}) or "
                             f"(B, T, {r}) = {(batch, seq_len, rotary_dim)}; got {shape}")
    if rotary_dim % 2 or rotary_dim > head_dim or (rotary_dim == 0 and head_dim > 0):
        raise ValueError(f"cos and sin's last dim is the rotary dim R (the first R features of a head "
                         f"rotate, in pairs): it must be even, 2 <= R <= D = {head_dim}; got R = {rotary_dim}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
    return rotary_dim


def rope_outputs(q, k, out):
    """(q_out, k_out): the checked `out` pair, or new contiguous tensors shaped and typed like q, k."""
    if out is None:
        return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
                torch.empty(k.shape, dtype=k.dtype, device=k.device))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a (q_out, k_out) pair or None, got {type(out).__name__}")
    check_out("out[0] (q_out)", out[0], q.shape, q.dtype, q.device)
    check_out("out[1] (k_out)", out[1], k.shape, k.dtype, k.device)
    return tuple(out)


def check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q):
    """The layout of a packed batch's cumulative lengths (no values read: no device sync): int32,
    1-D with B + 1 >= 1 entries, on q's device, one length for q's and k's."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(name, cu, (torch.int32,))
        check_same_device(name, cu, "q", q)
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"{name} must be 1-D with B + 1 >= 1 entries, got shape {tuple(cu.shape)}")
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError(f"cu_seqlens_k must have cu_seqlens_q's length {cu_seqlens_q.shape[0]} "
                         f"(B + 1), got {cu_seqlens_k.shape[0]}")


# A debug switch: LLMK_CHECK_SEQLENS=1 has the packed-batch launchers read cu_seqlens on the host
# before a launch on a GPU too (a device sync each call, so off by default)
CHECK_SEQLENS_ENV = "LLMK_CHECK_SEQLENS"


def seqlens_checked(cu_seqlens):
    """Whether a launch on these cumulative lengths reads them on the host first
    (check_cu_seqlens_values): always on the CPU (the interpreter, where a length past the end
    would corrupt the heap; reading them costs nothing there); on a GPU only when the environment
    sets LLMK_CHECK_SEQLENS=1 (the read waits for the device), and never while a CUDA graph is
    being captured (which forbids a sync)."""
    if cu_seqlens.device.type == "cpu":
        return True
    if os.environ.get(CHECK_SEQLENS_ENV, "0") != "1":
        return False
    return not torch.cuda.is_current_stream_capturing()


def check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k):
    """The values of a packed batch's cumulative lengths (layout checked by check_cu_seqlens), read
    in one transfer: each starts at 0, stays within and ends at its packed length (total_q =
    q.shape[0], total_k = k.shape[0]), never decreases, and no sequence is longer than
    max_seqlen_q / max_seqlen_k. Raises ValueError naming the argument, the position and the value."""
    values = torch.stack((cu_seqlens_q, cu_seqlens_k)).tolist()
    for cu, name, total, max_name, max_len in zip(values, ("cu_seqlens_q", "cu_seqlens_k"), (total_q, total_k),
                                                  ("max_seqlen_q", "max_seqlen_k"), (max_seqlen_q, max_seqlen_k)):
        side = name[-1]
        if cu[0] != 0:
            raise ValueError(f"{name} must start at 0; got {name}[0] = {cu[0]}")
        for i, (before, value) in enumerate(zip(cu, cu[1:]), start=1):
            if value > total:
                raise ValueError(f"{name}[{i}] = {value} is past the packed length {total} ({side}.shape[0])")
            if value < before:
                raise ValueError(f"{name} must be non-decreasing (cumulative lengths); got {name}[{i}] = {value} "
                                 f"< {name}[{i - 1}] = {before}")
        if cu[-1] != total:
            raise ValueError(f"{name} must end at the packed length {total} ({side}.shape[0]); got "
                             f"{name}[{len(cu) - 1}] = {cu[-1]}")
        lengths = [after - before for before, after in zip(cu, cu[1:])]
        if lengths and max(lengths) > max_len:
            b = lengths.index(max(lengths))
            raise ValueError(f"{max_name} = {max_len} is less than sequence {b}'s length {lengths[b]} "
                             f"({name}[{b + 1}] - {name}[{b}])")


def check_window(window, name="window"):
    """window: None, or (left, right), two ints >= -1 (-1: no bound on that side). Returns the
    operators' (window_left, window_right), (-1, -1) for None. name: the argument, for errors."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"{name} must be None or a (left, right) pair of ints, got {window!r}")
    for side in window:
        if not isinstance(side, int) or isinstance(side, bool):
            raise TypeError(f"{name} must be None or a (left, right) pair of ints, got {window!r}")
        if side < -1:
            raise ValueError(f"{name}'s sides must be ints >= -1 (-1: unbounded), got {window!r}")
    return int(window[0]), int(window[1])


def check_softcap(softcap):
    """softcap: None or 0 (off), or a positive finite number. Returns the operators' float, 0.0 for off."""
    if softcap is None:
        return 0.0
    if not isinstance(softcap, (int, float)) or isinstance(softcap, bool):
        raise TypeError(f"softcap must be None or a number >= 0, got {type(softcap).__name__}")
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be a finite number >= 0 (0 or None: off), got {softcap!r}")
    return float(softcap)
