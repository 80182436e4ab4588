"""Tests for mlp/triton_swiglu.py against the fp64 reference and F.silu(gate) * up.

The tolerance is one rounding (mlp/mlp_cases.py: half an ulp, not common.testing's whole ulp), and
PyTorch's same-dtype result bounds the error too (the 2x rule); it rounds twice (silu(gate), then
the product), the kernel once. The gradients (dgate, dup) are checked the same way: against autograd
through the fp64 reference, and against PyTorch's own same-dtype gradients of F.silu(gate) * up.

    python mlp/test_swiglu.py        (or: pytest mlp/test_swiglu.py)
"""
import contextlib
import dataclasses

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE, INTERPRET
from llmk.common.testing import (EXACT, Case, Outcome, check_grads, compare, dtype_name, expect_raises,
                                 grads_of, main, opcheck, poisoned, rand, shape_case)
from llmk.mlp.launch_config import BACKWARD_TILE_TABLE, tile_config_for
from llmk.mlp.mlp_cases import (DTYPES, ONE_ROUNDING, WIDTHS, every_value, forced_tile_cases, huge_rows,
                                overflow_expected, upstream)
from llmk.mlp.reference_mlp import swiglu_ref
from llmk.mlp.swiglu_cases import inputs
from llmk.mlp.triton_swiglu import launch_swiglu, launch_swiglu_backward, swiglu

NAMES = ("gate", "up")


def eager_swiglu(gate, up):
    return F.silu(gate) * up


def check(shape, dtype, layout="separate", pad=None, gate_scale=1.0, up_scale=1.0):
    gate, up = inputs(shape, dtype, layout, pad, gate_scale, up_scale)
    with overflow_expected() if gate_scale > 100 else contextlib.nullcontext():
        y = swiglu(gate, up, out=poisoned(shape, dtype))
    ref = swiglu_ref(gate.double(), up.double())
    # inf/NaN where the reference is finite fails too
    return [compare("y", y, ref, ONE_ROUNDING[dtype], torch_out=F.silu(gate) * up)]


def check_grad(shape, dtype, layout="separate", pad=None, gate_scale=1.0, up_scale=1.0, wrt=(0, 1),
               dy_layout="packed", dy_scale=1.0):
    """dgate and dup (or one of them, wrt) against autograd through the fp64 reference."""
    gate, up = inputs(shape, dtype, layout, pad, gate_scale, up_scale)
    dy = upstream(shape, dtype, dy_layout, dy_scale)
    with overflow_expected() if gate_scale > 100 else contextlib.nullcontext():
        return check_grads("swiglu", swiglu, swiglu_ref, (gate, up), wrt, NAMES, ONE_ROUNDING[dtype],
                           torch_fn=eager_swiglu, grad_outputs=[dy])


def in_place(gate, up):
    """swiglu with grad_in_place=True on copies made in the graph (non-leaves, as a model's
    projections are): the backward writes over those copies, the leaves stay as they were."""
    return swiglu(gate * 1, up * 1, grad_in_place=True)


def check_grad_in_place(shape, dtype, layout="separate"):
    """grad_in_place=True: the gradients against the fp64 reference (as check_grad), and bit for bit
    those of the plain op on the same inputs and upstream gradient."""
    gate, up = inputs(shape, dtype, layout, None, 1.0, 1.0)
    dy = upstream(shape, dtype, "packed", 1.0)
    outcomes = check_grads("swiglu grad_in_place", in_place, swiglu_ref, (gate, up), (0, 1), NAMES,
                           ONE_ROUNDING[dtype], torch_fn=eager_swiglu, grad_outputs=[dy])
    _, plain = grads_of(lambda g, u: swiglu(g * 1, u * 1), (gate, up), (0, 1), [dy])
    _, got = grads_of(in_place, (gate, up), (0, 1), [dy])
    return outcomes + [compare(f"d{name} = plain op's", g, w, EXACT) for name, g, w in zip(NAMES, got, plain)]


def check_in_place_rules():
    """Where grad_in_place writes over gate and up, and where it must not (mlp/triton_swiglu.py)."""
    shape, dtype = (37, 96), torch.bfloat16
    dy = rand(shape, dtype)
    leaf_gate, leaf_up = rand(shape, dtype).requires_grad_(), rand(shape, dtype).requires_grad_()
    want = torch.autograd.grad(swiglu(leaf_gate, leaf_up), (leaf_gate, leaf_up), dy)
    outcomes = []

    gate, up = leaf_gate * 1, leaf_up * 1
    y = swiglu(gate, up, grad_in_place=True)
    dgate, dup = torch.autograd.grad(y, (gate, up), dy, retain_graph=True)
    outcomes.append(Outcome("non-leaf contiguous gate, up: gradients written over them",
                            dgate.data_ptr() == gate.data_ptr() and dup.data_ptr() == up.data_ptr()
                            and torch.equal(dgate, want[0]) and torch.equal(dup, want[1])))
    outcomes.append(expect_raises("a second backward (retain_graph) raises",
                                  lambda: torch.autograd.grad(y, (gate, up), dy), RuntimeError,
                                  "modified by an inplace operation"))

    kept = (leaf_gate.detach().clone(), leaf_up.detach().clone())
    got = torch.autograd.grad(swiglu(leaf_gate, leaf_up, grad_in_place=True), (leaf_gate, leaf_up), dy)
    outcomes.append(Outcome("leaves: new gradients, the leaves unchanged",
                            torch.equal(leaf_gate, kept[0]) and torch.equal(leaf_up, kept[1])
                            and all(torch.equal(g, w) for g, w in zip(got, want))))

    fused = torch.cat([leaf_gate, leaf_up], -1)  # a fused projection's output: its halves are strided
    before = fused.detach().clone()
    got = torch.autograd.grad(swiglu(*fused.chunk(2, -1), grad_in_place=True), (leaf_gate, leaf_up), dy)
    outcomes.append(Outcome("halves of one buffer: new gradients, the buffer unchanged",
                            torch.equal(fused, before) and all(torch.equal(g, w) for g, w in zip(got, want))))

    same = leaf_gate * 1  # swiglu(x, x): one tensor, two gradients
    got = torch.autograd.grad(swiglu(same, same, grad_in_place=True), (leaf_gate,), dy)[0]
    ref = torch.autograd.grad(swiglu(leaf_gate, leaf_gate), (leaf_gate,), dy)[0]
    outcomes.append(Outcome("gate is up: the plain gradients", torch.equal(got, ref)))

    gate, up = leaf_gate * 1, leaf_up.detach() * 1  # dup not wanted
    before = gate.detach().clone()
    got = torch.autograd.grad(swiglu(gate, up, grad_in_place=True), (gate,), dy)[0]
    outcomes.append(Outcome("one gradient wanted: a new tensor, gate unchanged",
                            torch.equal(got, want[0]) and got.data_ptr() != gate.data_ptr()
                            and torch.equal(gate, before)))

    gate, up = leaf_gate * 1, leaf_up * 1
    outcomes.append(opcheck("opcheck llmk::swiglu_backward_in_place", torch.ops.llmk.swiglu_backward_in_place.default,
                            (dy, gate.detach().clone(), up.detach().clone())))
    compiled = torch.compile(lambda g, u: swiglu(g * 1, u * 1, grad_in_place=True), fullgraph=True,
                             backend="aot_eager" if INTERPRET else "inductor")
    got = torch.autograd.grad(compiled(leaf_gate, leaf_up), (leaf_gate, leaf_up), dy)
    outcomes.append(Outcome("torch.compile(fullgraph=True): the plain gradients",
                            all(torch.equal(g, w) for g, w in zip(got, want))))
    return outcomes


def check_grad_every_value(dtype):
    """The gradients at every fp16 or bf16 gate value, up and dy in [-1, 1] so that dy * silu(gate)
    does not overflow: silu' is 0 for large negative gates and 1 for large positive ones, never NaN."""
    gate = every_value(dtype, fp32_limit=100.0)
    up = (torch.rand(gate.shape, device=DEVICE) * 2 - 1).to(dtype)
    dy = (torch.rand(gate.shape, device=DEVICE) * 2 - 1).to(dtype)
    with overflow_expected():
        return check_grads("swiglu", swiglu, swiglu_ref, (gate, up), (0, 1), NAMES, ONE_ROUNDING[dtype],
                           torch_fn=eager_swiglu, grad_outputs=[dy])


def check_extremes(dtype):
    """silu(-1e4) * up = 0 and silu(1e4) * up = 1e4 * up (rounded once); NaN in, NaN out."""
    pick = torch.randint(0, 3, (7, 129), device=DEVICE)
    gate = torch.tensor([-1e4, 1e4, float("nan")], device=DEVICE)[pick].to(dtype)
    up = rand(gate.shape, dtype)
    with overflow_expected():
        y = swiglu(gate, up, out=poisoned(gate.shape, dtype))
    big = (gate.double() * up.double()).to(dtype)
    return [Outcome("silu(-1e4) * up == 0", bool((y[pick == 0] == 0).all())),
            Outcome("silu(1e4) * up == 1e4 * up", bool((y[pick == 1] == big[pick == 1]).all())),
            Outcome("silu(NaN) * up is NaN", bool(y[pick == 2].isnan().all()))]


def check_every_value(dtype):
    """Every fp16 / bf16 gate value (fp32: a grid over [-100, 100]) with up in [-1, 1], so that no
    product overflows: both tails of silu, subnormals, the largest values."""
    gate = every_value(dtype, fp32_limit=100.0)
    up = (torch.rand(gate.shape, device=DEVICE) * 2 - 1).to(dtype)
    with overflow_expected():
        y = swiglu(gate, up, out=poisoned(gate.shape, dtype))
        torch_out = F.silu(gate) * up
    ref = swiglu_ref(gate.double(), up.double())
    return [compare("y", y, ref, ONE_ROUNDING[dtype], torch_out=torch_out)]


def check_own_buffer():
    gate, up = rand((9, 41), torch.bfloat16), rand((9, 41), torch.bfloat16)
    ref = swiglu_ref(gate.double(), up.double())
    return [compare("y", swiglu(gate, up), ref, ONE_ROUNDING[gate.dtype])]


def check_grad_huge(n_cols):
    """The gradients past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    gate, up = rand((rows, n_cols), torch.float16), rand((rows, n_cols), torch.float16)
    dy = upstream((rows, n_cols), torch.float16)
    dgate, dup = grads_of(swiglu, (gate, up), (0, 1), [dy])[1]
    _, want = grads_of(swiglu_ref, (gate[-4:], up[-4:]), (0, 1), [dy[-4:]], dtype=torch.float64)
    tol = ONE_ROUNDING[torch.float16]
    return [compare("dgate, last rows", dgate[-4:], want[0], tol), compare("dup, last rows", dup[-4:], want[1], tol)]


def check_huge(n_cols):
    """Past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    rows = huge_rows(n_cols)
    gate, up = rand((rows, n_cols), torch.float16), rand((rows, n_cols), torch.float16)
    y = swiglu(gate, up, out=poisoned((rows, n_cols), torch.float16))
    ref = swiglu_ref(gate[-4:].double(), up[-4:].double())
    return [compare("last rows", y[-4:], ref, ONE_ROUNDING[torch.float16])]


def check_errors():
    gate, up = rand((4, 64), torch.float16), rand((4, 64), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("up shape", lambda: swiglu(gate, up[:, :63]), ValueError, "up"),
        expect_raises("up broadcast", lambda: swiglu(gate, up[:1]), ValueError, "up"),
        expect_raises("up dtype", lambda: swiglu(gate, up.float()), TypeError, "up"),
        expect_raises("int gate", lambda: swiglu(gate.to(torch.int32), up), TypeError, "gate"),
        expect_raises("int up", lambda: swiglu(gate, up.to(torch.int32)), TypeError, "up"),
        expect_raises(f"gate on {other}", lambda: swiglu(gate.to(other), up.to(other)), ValueError, "gate"),
        expect_raises("up elsewhere", lambda: swiglu(gate, up.to(other)), ValueError, "up"),
        expect_raises("not a tensor", lambda: swiglu(gate, [1.0]), TypeError, "up"),
        expect_raises("0-dim gate", lambda: swiglu(gate[0, 0], up[0, 0]), ValueError, "gate"),
        expect_raises("out shape", lambda: swiglu(gate, up, out=gate[:2].clone()), ValueError, "out"),
        expect_raises("out dtype", lambda: swiglu(gate, up, out=gate.float()), ValueError, "out"),
    ]


def check_grad_mode():
    """Under grad the call gives what it gives under torch.no_grad(), bit for bit; out= stays
    forward-only: an input that requires grad raises, naming the operator."""
    gate, up = rand((4, 64), torch.float16), rand((4, 64), torch.float16)
    up_grad = up.clone().requires_grad_()
    with torch.no_grad():
        y, y_out = swiglu(gate, up_grad), swiglu(gate, up_grad, out=poisoned(gate.shape, gate.dtype))
    y_grad = swiglu(gate, up_grad)
    return [expect_raises("up requires grad, out=", lambda: swiglu(gate, up_grad, out=torch.empty_like(gate)),
                          RuntimeError, "llmk::swiglu_out is forward-only"),
            Outcome("under grad: as under no_grad", torch.equal(y_grad, y) and y_grad.requires_grad),
            Outcome("under no_grad: as on a plain up", torch.equal(y, swiglu(gate, up)) and torch.equal(y_out, y))]


def check_grad_empty():
    """Empty gate and up: empty gradients of their shapes."""
    outcomes = []
    for shape in ((0, 64), (2, 0, 64), (3, 0)):
        gate = rand(shape, torch.float16).requires_grad_()
        up = rand(shape, torch.float16).requires_grad_()
        dy = torch.ones(shape, dtype=torch.float16, device=DEVICE)
        dgate, dup = torch.autograd.grad(swiglu(gate, up), (gate, up), dy)
        outcomes.append(Outcome(f"{shape}: empty gradients", dgate.shape == gate.shape and dup.shape == up.shape))
    return outcomes


def check_empty():
    outcomes = []
    for shape in ((0, 64), (2, 0, 64), (3, 0)):
        gate, up = rand(shape, torch.float16), rand(shape, torch.float16)
        y = swiglu(gate, up)
        ok = y.shape == gate.shape and y.dtype == gate.dtype
        outcomes.append(Outcome(f"{shape}: empty in, empty out", ok))
    return outcomes


def cases():
    out = []

    def add(shape, dtype, gpu_only=False, **extra):
        out.append(shape_case(check, shape, dtype, gpu_only, **extra))

    for dtype in DTYPES:
        for n in WIDTHS:
            add((3, n), dtype)
        add((1, 4096), dtype)
        add((37, 64), dtype)                                      # several row tiles, the last one partial
        add((257, 123), dtype)                                    # row and column masks together
        add((2, 3, 123), dtype)
        add((5, 1000), dtype, layout="fused")                     # halves of one (5, 2000) buffer
        add((5, 760), dtype, pad=(0, 8))                          # gate row stride 768, up packed
        add((2, 5, 1000), dtype, pad=(0, 3, 0))                   # leading dims that cannot merge
        add((33, 64), dtype, layout="transposed")                 # last dim strided: one copy
        # large gates: exp(-gate) overflows, no NaN; up small enough that fp16 does not overflow
        add((3, 5120), dtype, gate_scale=1e4, up_scale=0.1)
        out.append(Case(f"extremes {dtype_name(dtype)}", check_extremes, dict(dtype=dtype)))
        out.append(Case(f"every value {dtype_name(dtype)}", check_every_value, dict(dtype=dtype)))
        add((8192, 14336), dtype, gpu_only=True)
        add((4096, 16384), dtype, gpu_only=True, layout="fused")
        add((2049, 11008), dtype, gpu_only=True, pad=(0, 64))     # 11008 = 43 * 256: column tiles of 256

    def grad(shape, dtype, gpu_only=False, **extra):  # named apart from the forward's cases of a shape
        case = shape_case(check_grad, shape, dtype, gpu_only, **extra)
        out.append(dataclasses.replace(case, name=f"grad {case.name}"))

    for dtype in DTYPES:  # gradients
        grad((3, 1000), dtype)
        grad((1, 4096), dtype)                                    # one row
        grad((257, 123), dtype)                                   # row and column masks together
        grad((2, 5, 1000), dtype, pad=(0, 3, 0))                  # leading dims that cannot merge
        grad((5, 1000), dtype, layout="fused")                    # halves of one (5, 2000) buffer
        grad((33, 64), dtype, layout="transposed", dy_layout="transposed")  # last dims strided: copies
        grad((8192, 14336), dtype, gpu_only=True)
        grad((4096, 16384), dtype, gpu_only=True, layout="fused")
    # saturated silu, slopes 0 or 1 and no NaN: every fp16 and bf16 gate value (to 3e38), and fp16 and
    # fp32 gates to ~4e4 (dy small enough that dy * silu(gate) fits in fp16)
    for dtype in (torch.float16, torch.bfloat16):
        out.append(Case(f"grad every value {dtype_name(dtype)}", check_grad_every_value, dict(dtype=dtype)))
    for dtype in (torch.float16, torch.float32):
        grad((3, 5120), dtype, gate_scale=1e4, up_scale=0.1, dy_scale=0.1)
    for dtype in DTYPES:  # grad_in_place=True (the model patch's MLP)
        out.append(Case(f"grad in place (257, 123) {dtype_name(dtype)}", check_grad_in_place,
                        dict(shape=(257, 123), dtype=dtype)))
    out.append(Case("grad in place (8192, 14336) bf16", check_grad_in_place,
                    dict(shape=(8192, 14336), dtype=torch.bfloat16), gpu_only=True))
    out.append(Case("grad in place: where it writes over gate and up", check_in_place_rules))
    grad((5, 1), torch.float16)                                   # one column
    grad((37, 64), torch.bfloat16, dy_layout="expanded")          # dy with row stride 0 (a broadcast)
    grad((7, 1000), torch.float16, wrt=(0,))                      # dgate only
    grad((7, 1000), torch.bfloat16, wrt=(1,))                     # dup only: up is not read
    return out + [Case("allocates its output", check_own_buffer), Case("bad input", check_errors),
                  Case("empty input", check_empty), Case("grad mode", check_grad_mode),
                  Case("grad of empty input", check_grad_empty),
                  # the GPU memory each needs: its peak printed on a GPU, rounded up
                  Case("2^31+ elements", check_huge, dict(n_cols=14336), gpu_only=True, gpu_gb=23),
                  Case("grad 2^31+ elements", check_grad_huge, dict(n_cols=14336), gpu_only=True, gpu_gb=28)]


CASES = cases()


def check_forced(row, shape, dtype):
    """A TILE_TABLE entry's whole tile, which the interpreter's small matrices otherwise halve."""
    gate, up = rand(shape, dtype), rand(shape, dtype)
    cfg = tile_config_for(row, *shape, gate.element_size(), min_programs=1)
    y = poisoned(shape, dtype)
    launch_swiglu(gate, up, y, cfg)
    return [Outcome("whole tile", cfg.BLOCK_M * cfg.BLOCK_N == row[1], note=str(cfg)),
            compare("y", y, swiglu_ref(gate.double(), up.double()), ONE_ROUNDING[dtype], torch_out=F.silu(gate) * up)]


CASES += forced_tile_cases("swiglu", check_forced)


def check_forced_backward(row, shape, dtype):
    """A BACKWARD_TILE_TABLE["swiglu_backward"] entry's whole tile."""
    gate, up, dy = rand(shape, dtype), rand(shape, dtype), rand(shape, dtype)
    cfg = tile_config_for(row, *shape, gate.element_size(), min_programs=1)
    dgate, dup = poisoned(shape, dtype), poisoned(shape, dtype)
    launch_swiglu_backward(dy, gate, up, dgate, dup, cfg)
    _, want = grads_of(swiglu_ref, (gate, up), (0, 1), [dy], dtype=torch.float64)
    _, theirs = grads_of(eager_swiglu, (gate, up), (0, 1), [dy])
    return [Outcome("whole tile", cfg.BLOCK_M * cfg.BLOCK_N == row[1], note=str(cfg)),
            compare("dgate", dgate, want[0], ONE_ROUNDING[dtype], torch_out=theirs[0]),
            compare("dup", dup, want[1], ONE_ROUNDING[dtype], torch_out=theirs[1])]


CASES += forced_tile_cases("swiglu_backward", check_forced_backward, table=BACKWARD_TILE_TABLE)


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("swiglu", CASES)
