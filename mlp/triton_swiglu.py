"""SwiGLU in one pass, the activation of Llama-style gated MLPs:

    y = silu(gate) * up = gate * up / (1 + exp(-gate))        in fp32, one rounding at the end

where gate and up are the two projections of the same input, often the two halves of one fused
gate/up GEMM's output: any row stride is taken as it is, so those halves are read in place.
Large |gate| is safe: for a large negative gate exp(-gate) overflows to inf and silu = -0, never NaN.

Memory traffic for M rows of I values of e bytes: read gate and up, write y: 3*M*I*e. Eager
`F.silu(gate) * up` takes two kernels and rounds silu(gate) between them: 5*M*I*e bytes.

Backward (one kernel, llmk::swiglu_backward): the forward saves gate and up, not y, and silu is
recomputed in fp32, each gradient rounded once:
    dgate = dy * up * silu'(gate),   silu'(g) = s * (1 + g * (1 - s)),   s = sigmoid(g)
    dup   = dy * silu(gate)
read gate, up and dy, write dgate and dup: 5*M*I*e (fwd+bwd 8*M*I*e); only dup: read gate and dy,
write dup (3*M*I*e); only dgate: 4*M*I*e. The gradients are new tensors (2*M*I*e of memory while
the backward runs): gate and up may still be read by the caller, or saved by another node.
`swiglu(gate, up, grad_in_place=True)` (llmk::swiglu_grad_in_place) is for a caller whose gate and
up are temporaries read by nothing else, as a gated MLP's two projections are (the model patch): its
backward writes dgate and dup over the saved gate and up (llmk::swiglu_backward_in_place), as
Liger-Kernel's does always, and the backward's peak holds 2*M*I*e less (268 MB a layer at Llama's
B2 x T4096 x I8192). Where that cannot be safe it makes new tensors as the plain op does: a gate or
up that is a leaf (the caller's own tensor), not contiguous (a half of a fused projection: its rows
are not one block), sharing memory with the other or with dy, one gradient not wanted, or under
torch.compile (whose graph owns its buffers). After an in-place backward their version counters move,
so a second backward through the same graph (retain_graph=True), or any other node that saved them,
raises PyTorch's "modified by an inplace operation" error instead of reading gradients as inputs.
Tiling (2D tiles over rows and columns, 64-bit offsets) and its table: mlp/launch_config.py.
"""
import torch
import triton
import triton.language as tl

from llmk.common.ops import define_op, define_ops, no_outputs
from llmk.common.triton_utils import silu, silu_grad
from llmk.common.validation import as_rows, check_out, check_swiglu_args
from llmk.mlp.launch_config import tile_config, tile_offsets


@triton.jit
def _swiglu_kernel(
    # pointers
    gate_ptr, up_ptr, y_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_gm, stride_um, stride_ym,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):
    rows, cols, mask, _ = tile_offsets(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N, EVEN_M, EVEN_N)
    # no eviction hint: evict_first on these loads lost 4-6% on an H200 (docs/tuning/mlp.md)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = silu(g) * u
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def launch_swiglu(gate, up, y, cfg=None):
    """Launch on validated arguments: gate, up (..., I) of one dtype; y a contiguous output shaped
    like gate. Writes y in place. cfg: a TileConfig to launch instead of tile_config's choice
    (tuning sweeps: mlp.launch_config.tile_config_for)."""
    if gate.numel() == 0:
        return
    g2, u2 = as_rows(gate), as_rows(up)
    n_rows, n_cols = g2.shape
    y2 = y.view(-1, n_cols)
    if cfg is None:
        cfg = tile_config("swiglu", n_rows, n_cols, gate.element_size())
    _swiglu_kernel[(cfg.grid,)](
        g2, u2, y2, n_rows, n_cols, g2.stride(0), u2.stride(0), y2.stride(0),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, EVEN_M=cfg.EVEN_M, EVEN_N=cfg.EVEN_N,
        num_warps=cfg.num_warps)


@triton.jit
def _swiglu_backward_kernel(
    # pointers
    dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_dym, stride_gm, stride_um, stride_dgm, stride_dum,
    # meta-parameters
    GATE_GRAD: tl.constexpr, UP_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):
    rows, cols, mask, _ = tile_offsets(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N, EVEN_M, EVEN_N)
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if GATE_GRAD:  # up is read only for dgate
        u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dgate = dy * u * silu_grad(g)
        tl.store(dgate_ptr + rows[:, None] * stride_dgm + cols[None, :], dgate.to(dgate_ptr.dtype.element_ty),
                 mask=mask)
    if UP_GRAD:
        dup = dy * silu(g)
        tl.store(dup_ptr + rows[:, None] * stride_dum + cols[None, :], dup.to(dup_ptr.dtype.element_ty), mask=mask)


def launch_swiglu_backward(dy, gate, up, dgate, dup, cfg=None):
    """Launch on validated arguments: dy, gate, up (..., I), any row strides (dy may be an
    expanded view); dgate, dup contiguous outputs shaped like gate, or None where that gradient is
    not wanted (not both). Writes them in place. cfg: a TileConfig, as launch_swiglu takes."""
    if gate.numel() == 0:
        return
    dy2, g2, u2 = as_rows(dy), as_rows(gate), as_rows(up)
    n_rows, n_cols = g2.shape
    dg2 = dgate.view(-1, n_cols) if dgate is not None else g2  # g2: a placeholder pointer, never written
    du2 = dup.view(-1, n_cols) if dup is not None else g2
    if cfg is None:
        cfg = tile_config("swiglu_backward", n_rows, n_cols, gate.element_size())
    _swiglu_backward_kernel[(cfg.grid,)](
        dy2, g2, u2, dg2, du2, n_rows, n_cols, dy2.stride(0), g2.stride(0), u2.stride(0), dg2.stride(0), du2.stride(0),
        GATE_GRAD=dgate is not None, UP_GRAD=dup is not None,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, EVEN_M=cfg.EVEN_M, EVEN_N=cfg.EVEN_N,
        num_warps=cfg.num_warps)


def _backward_empty(dy, gate, up, gate_grad, up_grad):
    """(dgate, dup): new contiguous tensors like gate, 0-size where that gradient is not wanted
    (an op may not return None). Also the backward op's fake implementation."""
    return (gate.new_empty(gate.shape if gate_grad else (0,)), gate.new_empty(gate.shape if up_grad else (0,)))


def _backward_impl(dy, gate, up, gate_grad, up_grad):
    dgate, dup = _backward_empty(dy, gate, up, gate_grad, up_grad)
    if gate_grad or up_grad:
        launch_swiglu_backward(dy, gate, up, dgate if gate_grad else None, dup if up_grad else None)
    return dgate, dup


swiglu_backward_op = define_op(
    "swiglu_backward(Tensor dy, Tensor gate, Tensor up, bool gate_grad, bool up_grad) -> (Tensor, Tensor)",
    _backward_impl, _backward_empty)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # gate, up: silu is recomputed, y is not kept


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    gate_grad, up_grad = ctx.needs_input_grad[:2]
    dgate, dup = swiglu_backward_op(dy, gate, up, gate_grad, up_grad)
    return dgate if gate_grad else None, dup if up_grad else None


def _empty(gate, up):
    return gate.new_empty(gate.shape)


swiglu_op, swiglu_out_op = define_ops("swiglu", "Tensor gate, Tensor up", _empty, launch_swiglu, backward=_backward,
                                      setup_context=_setup_context)


def _backward_in_place_impl(dy, gate, up):
    launch_swiglu_backward(dy, gate, up, gate, up)  # each element's loads come before its stores


swiglu_backward_in_place_op = define_op(
    "swiglu_backward_in_place(Tensor dy, Tensor(a!) gate, Tensor(b!) up) -> ()", _backward_in_place_impl, no_outputs)


def _in_place_safe(ctx, dy, gate, up):
    """Whether the backward may write dgate and dup over the saved gate and up (module docstring)."""
    if not all(ctx.needs_input_grad[:2]) or torch.compiler.is_compiling():
        return False
    if any(type(t) is not torch.Tensor for t in (dy, gate, up)):  # fake, functional or DTensor: traced
        return False
    if gate.is_leaf or up.is_leaf or not (gate.is_contiguous() and up.is_contiguous()):
        return False
    storages = {t.untyped_storage().data_ptr() for t in (dy, gate, up)}
    return len(storages) == 3


def _backward_grad_in_place(ctx, dy):
    gate, up = ctx.saved_tensors
    if not _in_place_safe(ctx, dy, gate, up):
        return _backward(ctx, dy)
    swiglu_backward_in_place_op(dy, gate, up)
    for t in (gate, up):  # a later reader of the saved tensors raises rather than reads gradients
        torch.autograd.graph.increment_version(t)
    return gate, up


swiglu_grad_in_place_op = define_op(
    "swiglu_grad_in_place(Tensor gate, Tensor up) -> Tensor", swiglu_op.impl, _empty,
    backward=_backward_grad_in_place, setup_context=_setup_context)


def swiglu(gate, up, out=None, *, grad_in_place=False):
    """silu(gate) * up in one pass, as F.silu(gate) * up but with no rounding of silu(gate)
    (operators llmk::swiglu and llmk::swiglu_out).

    gate, up: (..., I), same shape, both fp16, bf16 or fp32 (one dtype), any row strides (a view
       whose leading dims cannot merge, or whose last dim is strided, is copied once).
    out: optional contiguous buffer shaped like gate, gate's dtype (forward-only: with out= an
       input that requires grad raises).
    grad_in_place: the backward writes dgate and dup over gate and up where it safely can
       (llmk::swiglu_grad_in_place, module docstring): only for a gate and up that nothing else
       reads after this call.
    Returns y: (..., I), gate's dtype, contiguous (out itself when given). Differentiable in gate
    and up (llmk::swiglu_backward, or llmk::swiglu_backward_in_place).
    """
    check_swiglu_args(gate, up)
    if out is None:
        return swiglu_grad_in_place_op(gate, up) if grad_in_place else swiglu_op(gate, up)
    check_out("out", out, gate.shape, gate.dtype, gate.device)
    swiglu_out_op(gate, up, out)
    return out
