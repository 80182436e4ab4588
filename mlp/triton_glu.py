"""Gated linear units in one pass, the activations of gated MLPs: SwiGLU (Llama, Mistral, Qwen) and
GeGLU (Gemma), one forward and one backward kernel for both:

    y = act(gate) * up            in fp32, one rounding at the end
        swiglu:  act = silu,  silu(g) = g / (1 + exp(-g))
        geglu:   act = gelu,  the tanh form (Gemma's gelu_pytorch_tanh, the default) or the exact
                 (erf) form, common.triton_utils.gelu (neither calls erf or tanh)

where gate and up are the two projections of the same input, often the two halves of one fused
gate/up GEMM's output: any row stride is taken as it is, so those halves are read in place.
Large |gate| is safe: exp overflows to inf and act(gate) = 0 (or -0) or gate, never NaN.

Memory traffic for M rows of I values of e bytes: read gate and up, write y: 3*M*I*e. Eager
`F.silu(gate) * up` or `F.gelu(gate, approximate=...) * up` takes two kernels and rounds act(gate)
between them: 5*M*I*e bytes. GELU costs a few more instructions a value than SiLU (SASS for sm_90,
fp16, counted from the compiled kernels, not timed: forward ~25 a value for silu and the tanh GELU,
~30 for the exact one; backward 39-45), about half or less of what an H100 can issue while it streams the
6 bytes (forward) or 10 bytes (backward) a value at full bandwidth, ~40 slots per 4 bytes
(docs/tuning/mlp.md): GeGLU stays memory-bound, as SwiGLU is.

Backward (one kernel, llmk::<name>_backward): the forward saves gate and up, not y, and act is
recomputed in fp32, each gradient rounded once:
    dgate = dy * up * act'(gate),   silu'(g) = s * (1 + g * (1 - s)), s = sigmoid(g);
                                    gelu'(g): common.triton_utils.gelu_grad
    dup   = dy * act(gate)
read gate, up and dy, write dgate and dup: 5*M*I*e (fwd+bwd 8*M*I*e); only dup: read gate and dy,
write dup (3*M*I*e); only dgate: 4*M*I*e. The gradients are new tensors (2*M*I*e of memory while
the backward runs): gate and up may still be read by the caller, or saved by another node.
`swiglu(gate, up, grad_in_place=True)` (llmk::swiglu_grad_in_place; geglu's alike) is for a caller
whose gate and up are temporaries read by nothing else, as a gated MLP's two projections are (the
model patch): its backward writes dgate and dup over the saved gate and up
(llmk::swiglu_backward_in_place), as Liger-Kernel's does always, and the backward's peak holds
2*M*I*e less (268 MB a layer at Llama's B2 x T4096 x I8192). Where that cannot be safe it makes new
tensors as the plain op does: a gate or up that is a leaf (the caller's own tensor), not contiguous
(a half of a fused projection: its rows are not one block), sharing memory with the other or with
dy, one gradient not wanted, or under torch.compile (whose graph owns its buffers). After an
in-place backward their version counters move, so a second backward through the same graph
(retain_graph=True), or any other node that saved them, raises PyTorch's "modified by an inplace
operation" error instead of reading gradients as inputs.

Operators, five a unit, made by one factory (define_glu_ops), so that the autograd formula and the
in-place rules exist once; geglu's take `str approximate` after up:
    swiglu(gate, up) -> y                         swiglu_out(gate, up, out!) -> ()
    swiglu_grad_in_place(gate, up) -> y           swiglu_backward(dy, gate, up, gate_grad, up_grad) -> (dgate, dup)
    swiglu_backward_in_place(dy, gate!, up!) -> ()
Tiling (2D tiles over rows and columns, 64-bit offsets) and its table: mlp/launch_config.py.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llmk.common.direct_launch import Launcher
from llmk.common.ops import Op, define_op, define_ops, no_outputs
from llmk.common.triton_utils import activate, activate_grad
from llmk.common.validation import check_out, contiguous_like, rows_of
from llmk.mlp.checks import check_swiglu_args
from llmk.mlp.launch_config import tile_config, tile_offsets
from llmk.mlp.reference_mlp import check_approximate

ACTIVATIONS = ("silu", "gelu", "gelu_tanh")  # the kernels' ACTIVATION: common.triton_utils.activate's names
GELU_ACTIVATION = {"none": "gelu", "tanh": "gelu_tanh"}  # geglu's approximate -> ACTIVATION


@triton.jit
def _glu_kernel(
    # pointers
    gate_ptr, up_ptr, y_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_gm, stride_um, stride_ym,
    # meta-parameters
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    rows, cols, mask, _ = tile_offsets(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N, EVEN_M, EVEN_N)
    # no eviction hint: evict_first on these loads lost 4-6% on an H200 (docs/tuning/mlp.md)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = activate(g, ACTIVATION) * u
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def _check_activation(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")


# direct launches from a specialization's second on (common/direct_launch.py): at decode and
# micro-batch sizes the gated unit's host time is its cost
_glu_launch = Launcher(_glu_kernel)


def launch_glu(gate, up, y, activation, cfg=None):
    """Launch on validated arguments: gate, up (..., I) of one dtype; y a contiguous output shaped
    like gate; activation one of ACTIVATIONS. Writes y in place. cfg: a TileConfig to launch instead
    of tile_config's choice (tuning sweeps: mlp.launch_config.tile_config_for)."""
    _check_activation(activation)
    if gate.numel() == 0:
        return
    n_cols = gate.shape[-1]
    n_rows = gate.numel() // n_cols
    (g2, stride_g), (u2, stride_u) = rows_of(gate), rows_of(up)
    if cfg is None:  # every activation takes swiglu's row: the same bytes a value (launch_config.py)
        cfg = tile_config("swiglu", n_rows, n_cols, gate.element_size())
    # y is contiguous: row stride N
    _glu_launch[(cfg.grid,)](
        g2,
        u2,
        y,
        n_rows,
        n_cols,
        stride_g,
        stride_u,
        n_cols,
        ACTIVATION=activation,
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        EVEN_M=cfg.EVEN_M,
        EVEN_N=cfg.EVEN_N,
        num_warps=cfg.num_warps,
    )


@triton.jit
def _glu_backward_kernel(
    # pointers
    dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_dym, stride_gm, stride_um, stride_dgm, stride_dum,
    # meta-parameters
    ACTIVATION: tl.constexpr, GATE_GRAD: tl.constexpr, UP_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    rows, cols, mask, _ = tile_offsets(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N, EVEN_M, EVEN_N)
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if GATE_GRAD:  # up is read only for dgate
        u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dgate = dy * u * activate_grad(g, ACTIVATION)
        tl.store(
            dgate_ptr + rows[:, None] * stride_dgm + cols[None, :], dgate.to(dgate_ptr.dtype.element_ty), mask=mask
        )
    if UP_GRAD:
        dup = dy * activate(g, ACTIVATION)
        tl.store(dup_ptr + rows[:, None] * stride_dum + cols[None, :], dup.to(dup_ptr.dtype.element_ty), mask=mask)


_glu_backward_launch = Launcher(_glu_backward_kernel)


def launch_glu_backward(dy, gate, up, dgate, dup, activation, cfg=None):
    """Launch on validated arguments: dy, gate, up (..., I), any row strides (dy may be an
    expanded view); dgate, dup contiguous outputs shaped like gate, or None where that gradient is
    not wanted (not both); activation one of ACTIVATIONS. Writes them in place. cfg: a TileConfig,
    as launch_glu takes."""
    _check_activation(activation)
    if gate.numel() == 0:
        return
    n_cols = gate.shape[-1]
    n_rows = gate.numel() // n_cols
    (dy2, stride_dy), (g2, stride_g), (u2, stride_u) = rows_of(dy), rows_of(gate), rows_of(up)
    if cfg is None:
        cfg = tile_config("swiglu_backward", n_rows, n_cols, gate.element_size())
    # dgate and dup are contiguous (row stride N); g2 stands in as a placeholder pointer, never written
    _glu_backward_launch[(cfg.grid,)](
        dy2,
        g2,
        u2,
        g2 if dgate is None else dgate,
        g2 if dup is None else dup,
        n_rows,
        n_cols,
        stride_dy,
        stride_g,
        stride_u,
        n_cols,
        n_cols,
        ACTIVATION=activation,
        GATE_GRAD=dgate is not None,
        UP_GRAD=dup is not None,
        BLOCK_M=cfg.BLOCK_M,
        BLOCK_N=cfg.BLOCK_N,
        EVEN_M=cfg.EVEN_M,
        EVEN_N=cfg.EVEN_N,
        num_warps=cfg.num_warps,
    )


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


@dataclass(frozen=True)
class GluOps:
    """The operators of one gated unit (define_glu_ops); each takes the unit's extra arguments
    (geglu's approximate) after gate and up."""

    functional: Op  # llmk::<name>(gate, up, ...) -> y
    out: Op  # llmk::<name>_out(gate, up, ..., out!) -> ()
    grad_in_place: Op  # llmk::<name>_grad_in_place(gate, up, ...) -> y
    backward: Op  # llmk::<name>_backward(dy, gate, up, ..., gate_grad, up_grad) -> (dgate, dup)
    backward_in_place: Op  # llmk::<name>_backward_in_place(dy, gate!, up!, ...) -> ()


def define_glu_ops(name, extra, activation):
    """Register the five operators of the gated unit `name` (module docstring) and return them.

    extra: the schema's arguments after gate and up that choose the activation ("" for none, or
    "str approximate"); activation(*their values): the kernels' ACTIVATION. Every operator passes
    those values through in that place, and the autograd formula keeps them on ctx (they get no
    gradient)."""
    tail = f", {extra}" if extra else ""  # the schema's arguments after gate and up
    args = "Tensor gate, Tensor up" + tail

    def empty(gate, up, *values):
        return contiguous_like(gate)

    def launch(gate, up, *values_and_y):
        *values, y = values_and_y
        launch_glu(gate, up, y, activation(*values))

    def backward_empty(dy, gate, up, *values_and_flags):
        """(dgate, dup): new contiguous tensors like gate, 0-size where that gradient is not wanted
        (an op may not return None). Also the backward op's fake implementation."""
        gate_grad, up_grad = values_and_flags[-2:]
        return (
            contiguous_like(gate) if gate_grad else gate.new_empty((0,)),
            contiguous_like(gate) if up_grad else gate.new_empty((0,)),
        )

    def backward_impl(dy, gate, up, *values_and_flags):
        *values, gate_grad, up_grad = values_and_flags
        dgate, dup = backward_empty(dy, gate, up, gate_grad, up_grad)
        if gate_grad or up_grad:
            launch_glu_backward(
                dy, gate, up, dgate if gate_grad else None, dup if up_grad else None, activation(*values)
            )
        return dgate, dup

    backward_op = define_op(
        f"{name}_backward(Tensor dy, {args}, bool gate_grad, bool up_grad) -> (Tensor, Tensor)",
        backward_impl,
        backward_empty,
    )

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs.gate, inputs.up)  # act is recomputed, y is not kept
        # the activation's options by name (geglu's approximate), passed on as they came
        ctx.values = dict(zip(inputs._fields[2:], inputs[2:]))

    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        gate_grad, up_grad = ctx.needs_input_grad[:2]
        dgate, dup = backward_op(dy, gate, up, gate_grad=gate_grad, up_grad=up_grad, **ctx.values)
        return dgate if gate_grad else None, dup if up_grad else None, *(None for _ in ctx.values)

    functional_op, out_op = define_ops(name, args, empty, launch, backward=backward, setup_context=setup_context)

    def backward_in_place_impl(dy, gate, up, *values):
        launch_glu_backward(dy, gate, up, gate, up, activation(*values))  # each element's loads come before its stores

    backward_in_place_op = define_op(
        f"{name}_backward_in_place(Tensor dy, Tensor(a!) gate, Tensor(b!) up{tail}) -> ()",
        backward_in_place_impl,
        no_outputs,
    )

    def backward_grad_in_place(ctx, dy):
        gate, up = ctx.saved_tensors
        if not _in_place_safe(ctx, dy, gate, up):
            return backward(ctx, dy)
        backward_in_place_op(dy, gate, up, **ctx.values)
        for t in (gate, up):  # a later reader of the saved tensors raises rather than reads gradients
            torch.autograd.graph.increment_version(t)
        return gate, up, *(None for _ in ctx.values)

    grad_in_place_op = define_op(
        f"{name}_grad_in_place({args}) -> Tensor",
        functional_op.impl,
        empty,
        backward=backward_grad_in_place,
        setup_context=setup_context,
    )
    return GluOps(functional_op, out_op, grad_in_place_op, backward_op, backward_in_place_op)


def _gelu_activation(approximate):
    check_approximate(approximate)  # a direct call of the operator raises as geglu() does
    return GELU_ACTIVATION[approximate]


SWIGLU_OPS = define_glu_ops("swiglu", "", lambda: "silu")
GEGLU_OPS = define_glu_ops("geglu", "str approximate", _gelu_activation)


def _glu(ops, gate, up, values, out, grad_in_place):
    """The public functions' body: check, then call the functional, in-place-gradient or _out op.
    values: the activation's options by name ({} for swiglu, {"approximate": ...} for geglu)."""
    check_swiglu_args(gate, up)  # the same checks and messages for every unit
    if out is None:
        return (ops.grad_in_place if grad_in_place else ops.functional)(gate, up, **values)
    check_out("out", out, gate.shape, gate.dtype, gate.device)
    ops.out(gate, up, out=out, **values)
    return out


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
    return _glu(SWIGLU_OPS, gate, up, {}, out, grad_in_place)


def geglu(gate, up, approximate="tanh", out=None, *, grad_in_place=False):
    """gelu(gate) * up in one pass, as F.gelu(gate, approximate=approximate) * up but with no
    rounding of gelu(gate) (operators llmk::geglu and llmk::geglu_out): Gemma's MLP activation.

    gate, up, out, grad_in_place: as swiglu's (llmk::geglu_grad_in_place).
    approximate: "tanh" (Gemma's gelu_pytorch_tanh, the default here) or "none" (the exact, erf
       GELU, F.gelu's default); anything else raises ValueError.
    Returns y: (..., I), gate's dtype, contiguous (out itself when given). Differentiable in gate
    and up (llmk::geglu_backward, or llmk::geglu_backward_in_place).
    """
    check_approximate(approximate)
    return _glu(GEGLU_OPS, gate, up, {"approximate": approximate}, out, grad_in_place)
