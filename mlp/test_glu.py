"""Tests for mlp/triton_glu.py (SwiGLU, GeGLU in both GELU forms) against the fp64 reference and
PyTorch's F.silu(gate) * up, F.gelu(gate, approximate=...) * up.

The tolerance is one rounding (mlp/mlp_cases.py: half an ulp, not devtools.testing's whole ulp), and
PyTorch's same-dtype result bounds the error too (the 2x rule); it rounds twice (act(gate), then
the product), the kernel once. The gradients (dgate, dup) are checked the same way: against autograd
through the fp64 reference, and against PyTorch's own same-dtype gradients. Every shape runs for each
unit; the forward checks are shared with the CUDA SwiGLU's tests (mlp/glu_cases.py).

    python mlp/test_glu.py        (or: pytest mlp/test_glu.py)
"""

import contextlib
import dataclasses
import functools

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.testing import (
    EXACT,
    Case,
    Outcome,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    grads_of,
    main,
    opcheck,
    poisoned,
    rand,
    shape_case,
)
from llmk.mlp import glu_cases
from llmk.mlp.glu_cases import Glu, inputs
from llmk.mlp.launch_config import BACKWARD_TILE_TABLE, tile_config_for
from llmk.mlp.mlp_cases import (
    DTYPES,
    ONE_ROUNDING,
    WIDTHS,
    every_value,
    forced_tile_cases,
    huge_rows,
    overflow_expected,
    upstream,
)
from llmk.mlp.reference_mlp import geglu_ref, swiglu_ref
from llmk.mlp.triton_glu import GELU_ACTIVATION, geglu, launch_glu, launch_glu_backward, swiglu

NAMES = ("gate", "up")
# grad_in_place's shape: (257, 123) on a GPU; (37, 123) in the interpreter, whose cost is a program a
# tile: 5 tiles of 8 x 128, not 33, still with a partial last row tile and masked columns
IN_PLACE_SHAPE = (37, 123) if INTERPRET else (257, 123)


@dataclasses.dataclass(frozen=True)
class TritonGlu(Glu):
    """A unit of mlp/triton_glu.py: also its kernels' ACTIVATION, its operators' name and their
    arguments after gate and up."""

    activation: str = ""
    op: str = ""
    values: tuple = ()


def gelu_unit(name, approximate):
    return TritonGlu(
        name,
        functools.partial(geglu, approximate=approximate),
        functools.partial(geglu_ref, approximate=approximate),
        lambda gate, up: F.gelu(gate, approximate=approximate) * up,
        GELU_ACTIVATION[approximate],
        "geglu",
        (approximate,),
    )


SWIGLU = TritonGlu("swiglu", swiglu, swiglu_ref, lambda gate, up: F.silu(gate) * up, "silu", "swiglu")
GEGLU = gelu_unit("geglu", "tanh")  # Gemma's, geglu's default
UNITS = (SWIGLU, GEGLU, gelu_unit("geglu none", "none"))


def check_grad(
    shape,
    dtype,
    glu,
    layout="separate",
    pad=None,
    gate_scale=1.0,
    up_scale=1.0,
    wrt=(0, 1),
    dy_layout="packed",
    dy_scale=1.0,
):
    """dgate and dup (or one of them, wrt) against autograd through the fp64 reference."""
    gate, up = inputs(shape, dtype, layout, pad, gate_scale, up_scale)
    dy = upstream(shape, dtype, dy_layout, dy_scale)
    with overflow_expected() if gate_scale > 100 else contextlib.nullcontext():
        return check_grads(
            glu.name,
            glu.fn,
            glu.ref,
            (gate, up),
            wrt,
            NAMES,
            ONE_ROUNDING[dtype],
            torch_fn=glu.eager,
            grad_outputs=[dy],
        )


def check_grad_in_place(shape, dtype, glu, layout="separate"):
    """grad_in_place=True: the gradients against the fp64 reference (as check_grad), and bit for bit
    those of the plain op on the same inputs and upstream gradient. The unit's function runs on
    copies made in the graph (non-leaves, as a model's projections are): the backward writes over
    those copies, the leaves stay as they were."""
    gate, up = inputs(shape, dtype, layout, None, 1.0, 1.0)
    dy = upstream(shape, dtype, "packed", 1.0)

    def in_place(g, u):
        return glu.fn(g * 1, u * 1, grad_in_place=True)

    outcomes = check_grads(
        f"{glu.name} grad_in_place",
        in_place,
        glu.ref,
        (gate, up),
        (0, 1),
        NAMES,
        ONE_ROUNDING[dtype],
        torch_fn=glu.eager,
        grad_outputs=[dy],
    )
    _, plain = grads_of(lambda g, u: glu.fn(g * 1, u * 1), (gate, up), (0, 1), [dy])
    _, got = grads_of(in_place, (gate, up), (0, 1), [dy])
    return outcomes + [compare(f"d{name} = plain op's", g, w, EXACT) for name, g, w in zip(NAMES, got, plain)]


def check_in_place_rules(glu):
    """Where grad_in_place writes over gate and up, and where it must not (mlp/triton_glu.py)."""
    shape, dtype, fn = (37, 96), torch.bfloat16, glu.fn
    dy = rand(shape, dtype)
    leaf_gate, leaf_up = rand(shape, dtype).requires_grad_(), rand(shape, dtype).requires_grad_()
    want = torch.autograd.grad(fn(leaf_gate, leaf_up), (leaf_gate, leaf_up), dy)
    outcomes = []

    gate, up = leaf_gate * 1, leaf_up * 1
    y = fn(gate, up, grad_in_place=True)
    dgate, dup = torch.autograd.grad(y, (gate, up), dy, retain_graph=True)
    outcomes.append(
        Outcome(
            "non-leaf contiguous gate, up: gradients written over them",
            dgate.data_ptr() == gate.data_ptr()
            and dup.data_ptr() == up.data_ptr()
            and torch.equal(dgate, want[0])
            and torch.equal(dup, want[1]),
        )
    )
    outcomes.append(
        expect_raises(
            "a second backward (retain_graph) raises",
            lambda: torch.autograd.grad(y, (gate, up), dy),
            RuntimeError,
            "modified by an inplace operation",
        )
    )

    kept = (leaf_gate.detach().clone(), leaf_up.detach().clone())
    got = torch.autograd.grad(fn(leaf_gate, leaf_up, grad_in_place=True), (leaf_gate, leaf_up), dy)
    outcomes.append(
        Outcome(
            "leaves: new gradients, the leaves unchanged",
            torch.equal(leaf_gate, kept[0])
            and torch.equal(leaf_up, kept[1])
            and all(torch.equal(g, w) for g, w in zip(got, want)),
        )
    )

    fused = torch.cat([leaf_gate, leaf_up], -1)  # a fused projection's output: its halves are strided
    before = fused.detach().clone()
    got = torch.autograd.grad(fn(*fused.chunk(2, -1), grad_in_place=True), (leaf_gate, leaf_up), dy)
    outcomes.append(
        Outcome(
            "halves of one buffer: new gradients, the buffer unchanged",
            torch.equal(fused, before) and all(torch.equal(g, w) for g, w in zip(got, want)),
        )
    )

    same = leaf_gate * 1  # fn(x, x): one tensor, two gradients
    got = torch.autograd.grad(fn(same, same, grad_in_place=True), (leaf_gate,), dy)[0]
    ref = torch.autograd.grad(fn(leaf_gate, leaf_gate), (leaf_gate,), dy)[0]
    outcomes.append(Outcome("gate is up: the plain gradients", torch.equal(got, ref)))

    gate, up = leaf_gate * 1, leaf_up.detach() * 1  # dup not wanted
    before = gate.detach().clone()
    got = torch.autograd.grad(fn(gate, up, grad_in_place=True), (gate,), dy)[0]
    outcomes.append(
        Outcome(
            "one gradient wanted: a new tensor, gate unchanged",
            torch.equal(got, want[0]) and got.data_ptr() != gate.data_ptr() and torch.equal(gate, before),
        )
    )

    op = getattr(torch.ops.llmk, f"{glu.op}_backward_in_place").default
    outcomes.append(
        opcheck(
            f"opcheck llmk::{glu.op}_backward_in_place",
            op,
            (dy, leaf_gate.detach().clone(), leaf_up.detach().clone(), *glu.values),
        )
    )
    compiled = torch.compile(
        lambda g, u: fn(g * 1, u * 1, grad_in_place=True),
        fullgraph=True,
        backend="aot_eager" if INTERPRET else "inductor",
    )
    got = torch.autograd.grad(compiled(leaf_gate, leaf_up), (leaf_gate, leaf_up), dy)
    outcomes.append(
        Outcome("torch.compile(fullgraph=True): the plain gradients", all(torch.equal(g, w) for g, w in zip(got, want)))
    )
    return outcomes


def check_grad_every_value(dtype, glu):
    """The gradients at every fp16 or bf16 gate value, up and dy in [-1, 1] so that dy * act(gate)
    does not overflow: act' is 0 for large negative gates and 1 for large positive ones, never NaN."""
    gate = every_value(dtype, fp32_limit=100.0)
    up = (torch.rand(gate.shape, device=DEVICE) * 2 - 1).to(dtype)
    dy = (torch.rand(gate.shape, device=DEVICE) * 2 - 1).to(dtype)
    with overflow_expected():
        return check_grads(
            glu.name,
            glu.fn,
            glu.ref,
            (gate, up),
            (0, 1),
            NAMES,
            ONE_ROUNDING[dtype],
            torch_fn=glu.eager,
            grad_outputs=[dy],
        )


def check_grad_huge(n_cols, glu):
    """The gradients past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    gate, up = rand((rows, n_cols), torch.float16), rand((rows, n_cols), torch.float16)
    dy = upstream((rows, n_cols), torch.float16)
    dgate, dup = grads_of(glu.fn, (gate, up), (0, 1), [dy])[1]
    _, want = grads_of(glu.ref, (gate[-4:], up[-4:]), (0, 1), [dy[-4:]], dtype=torch.float64)
    tol = ONE_ROUNDING[torch.float16]
    return [compare("dgate, last rows", dgate[-4:], want[0], tol), compare("dup, last rows", dup[-4:], want[1], tol)]


def check_approximate_errors():
    """geglu's approximate: F.gelu's two names only, checked by the function and by the operator."""
    gate, up = rand((4, 64), torch.float16), rand((4, 64), torch.float16)
    return [
        expect_raises("approximate='foo'", lambda: geglu(gate, up, "foo"), ValueError, "'foo'"),
        expect_raises("approximate=None", lambda: geglu(gate, up, None), ValueError, "approximate"),
        expect_raises(
            "llmk::geglu, approximate='foo'", lambda: torch.ops.llmk.geglu(gate, up, "foo"), ValueError, "approximate"
        ),
    ]


def check_grad_mode(glu):
    """Under grad the call gives what it gives under torch.no_grad(), bit for bit; out= stays
    forward-only: an input that requires grad raises, naming the operator."""
    gate, up = rand((4, 64), torch.float16), rand((4, 64), torch.float16)
    up_grad = up.clone().requires_grad_()
    with torch.no_grad():
        y, y_out = glu.fn(gate, up_grad), glu.fn(gate, up_grad, out=poisoned(gate.shape, gate.dtype))
    y_grad = glu.fn(gate, up_grad)
    return [
        expect_raises(
            "up requires grad, out=",
            lambda: glu.fn(gate, up_grad, out=torch.empty_like(gate)),
            RuntimeError,
            f"llmk::{glu.op}_out is forward-only",
        ),
        Outcome("under grad: as under no_grad", torch.equal(y_grad, y) and y_grad.requires_grad),
        Outcome("under no_grad: as on a plain up", torch.equal(y, glu.fn(gate, up)) and torch.equal(y_out, y)),
    ]


def check_grad_empty(glu):
    """Empty gate and up: empty gradients of their shapes."""
    outcomes = []
    for shape in ((0, 64), (2, 0, 64), (3, 0)):
        gate = rand(shape, torch.float16).requires_grad_()
        up = rand(shape, torch.float16).requires_grad_()
        dy = torch.ones(shape, dtype=torch.float16, device=DEVICE)
        dgate, dup = torch.autograd.grad(glu.fn(gate, up), (gate, up), dy)
        outcomes.append(Outcome(f"{shape}: empty gradients", dgate.shape == gate.shape and dup.shape == up.shape))
    return outcomes


def unit_cases(glu):
    """Every case of one unit, named after it."""
    out = []

    def case(name, fn, gpu_only=False, gpu_gb=None, **kwargs):
        out.append(Case(f"{glu.name} {name}", fn, dict(kwargs, glu=glu), gpu_only, gpu_gb))

    def add(shape, dtype, gpu_only=False, fn=glu_cases.check, prefix="", **extra):
        named = shape_case(fn, shape, dtype, gpu_only, **extra)
        out.append(
            dataclasses.replace(named, name=f"{glu.name} {prefix}{named.name}", kwargs=dict(named.kwargs, glu=glu))
        )

    for dtype in DTYPES:
        for n in WIDTHS:
            add((3, n), dtype)
        add((1, 4096), dtype)
        add((37, 64), dtype)  # several row tiles, the last one partial
        add((257, 123), dtype)  # row and column masks together
        add((2, 3, 123), dtype)
        add((5, 1000), dtype, layout="fused")  # halves of one (5, 2000) buffer
        add((5, 760), dtype, pad=(0, 8))  # gate row stride 768, up packed
        add((2, 5, 1000), dtype, pad=(0, 3, 0))  # leading dims that cannot merge
        add((33, 64), dtype, layout="transposed")  # last dim strided: one copy
        # large gates: exp overflows, no NaN; up small enough that fp16 does not overflow
        add((3, 5120), dtype, gate_scale=1e4, up_scale=0.1)
        case(f"extremes {dtype_name(dtype)}", glu_cases.check_extremes, dtype=dtype)
        case(f"every value {dtype_name(dtype)}", glu_cases.check_every_value, dtype=dtype)
        add((8192, 14336), dtype, gpu_only=True)
        add((4096, 16384), dtype, gpu_only=True, layout="fused")
        add((2049, 11008), dtype, gpu_only=True, pad=(0, 64))  # 11008 = 43 * 256: column tiles of 256

    def grad(shape, dtype, gpu_only=False, **extra):  # named apart from the forward's cases of a shape
        add(shape, dtype, gpu_only, fn=check_grad, prefix="grad ", **extra)

    for dtype in DTYPES:  # gradients
        grad((3, 1000), dtype)
        grad((1, 4096), dtype)  # one row
        grad((257, 123), dtype)  # row and column masks together
        grad((2, 5, 1000), dtype, pad=(0, 3, 0))  # leading dims that cannot merge
        grad((5, 1000), dtype, layout="fused")  # halves of one (5, 2000) buffer
        grad((33, 64), dtype, layout="transposed", dy_layout="transposed")  # last dims strided: copies
        grad((8192, 14336), dtype, gpu_only=True)
        grad((4096, 16384), dtype, gpu_only=True, layout="fused")
    # saturated activations, slopes 0 or 1 and no NaN: every fp16 and bf16 gate value (to 3e38), and
    # fp16 and fp32 gates to ~4e4 (dy small enough that dy * act(gate) fits in fp16)
    for dtype in (torch.float16, torch.bfloat16):
        case(f"grad every value {dtype_name(dtype)}", check_grad_every_value, dtype=dtype)
    for dtype in (torch.float16, torch.float32):
        grad((3, 5120), dtype, gate_scale=1e4, up_scale=0.1, dy_scale=0.1)
    for dtype in DTYPES:  # grad_in_place=True (the model patch's MLP)
        add(IN_PLACE_SHAPE, dtype, fn=check_grad_in_place, prefix="grad in place ")
    add((8192, 14336), torch.bfloat16, gpu_only=True, fn=check_grad_in_place, prefix="grad in place ")
    grad((5, 1), torch.float16)  # one column
    grad((37, 64), torch.bfloat16, dy_layout="expanded")  # dy with row stride 0 (a broadcast)
    grad((7, 1000), torch.float16, wrt=(0,))  # dgate only
    grad((7, 1000), torch.bfloat16, wrt=(1,))  # dup only: up is not read
    for name, fn in (
        ("allocates its output", glu_cases.check_own_buffer),
        ("bad input", glu_cases.check_errors),
        ("empty input", glu_cases.check_empty),
        ("grad mode", check_grad_mode),
        ("grad of empty input", check_grad_empty),
    ):
        case(name, fn)
    return out


def cases():
    out = [c for glu in UNITS for c in unit_cases(glu)]
    # the rules and the operators of each family (geglu none differs from geglu only in its argument)
    out += [
        Case(f"{glu.name} grad in place: where it writes over gate and up", check_in_place_rules, dict(glu=glu))
        for glu in (SWIGLU, GEGLU)
    ]
    out.append(Case("geglu bad approximate", check_approximate_errors))
    # 64-bit offsets: the kernels' own, whatever the activation (the GPU memory each needs: its peak
    # printed on a GPU, rounded up)
    return out + [
        Case("swiglu 2^31+ elements", glu_cases.check_huge, dict(n_cols=14336, glu=SWIGLU), gpu_only=True, gpu_gb=23),
        Case("swiglu grad 2^31+ elements", check_grad_huge, dict(n_cols=14336, glu=SWIGLU), gpu_only=True, gpu_gb=28),
    ]


CASES = cases()


def check_forced(row, shape, dtype):
    """A TILE_TABLE["swiglu"] entry's whole tile (which the interpreter's small matrices otherwise
    halve), for every unit: they all launch with it."""
    gate, up = rand(shape, dtype), rand(shape, dtype)
    cfg = tile_config_for(row, *shape, gate.element_size(), min_programs=1)
    outcomes = [Outcome("whole tile", cfg.BLOCK_M * cfg.BLOCK_N == row[1], note=str(cfg))]
    for glu in UNITS:
        y = poisoned(shape, dtype)
        launch_glu(gate, up, y, glu.activation, cfg)
        outcomes.append(
            compare(
                f"{glu.name} y",
                y,
                glu.ref(gate.double(), up.double()),
                ONE_ROUNDING[dtype],
                torch_out=glu.eager(gate, up),
            )
        )
    return outcomes


CASES += forced_tile_cases("swiglu", check_forced)


def check_forced_backward(row, shape, dtype):
    """A BACKWARD_TILE_TABLE["swiglu_backward"] entry's whole tile, for every unit."""
    gate, up, dy = rand(shape, dtype), rand(shape, dtype), rand(shape, dtype)
    cfg = tile_config_for(row, *shape, gate.element_size(), min_programs=1)
    outcomes = [Outcome("whole tile", cfg.BLOCK_M * cfg.BLOCK_N == row[1], note=str(cfg))]
    for glu in UNITS:
        dgate, dup = poisoned(shape, dtype), poisoned(shape, dtype)
        launch_glu_backward(dy, gate, up, dgate, dup, glu.activation, cfg)
        _, want = grads_of(glu.ref, (gate, up), (0, 1), [dy], dtype=torch.float64)
        _, theirs = grads_of(glu.eager, (gate, up), (0, 1), [dy])
        outcomes += [
            compare(f"{glu.name} dgate", dgate, want[0], ONE_ROUNDING[dtype], torch_out=theirs[0]),
            compare(f"{glu.name} dup", dup, want[1], ONE_ROUNDING[dtype], torch_out=theirs[1]),
        ]
    return outcomes


CASES += forced_tile_cases("swiglu_backward", check_forced_backward, table=BACKWARD_TILE_TABLE)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("glu", CASES)
