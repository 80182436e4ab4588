"""Tests for moe/moe_experts_ops.py (the grouped GEMMs of moe/triton_moe_gemm.py): the layer's output
and its four gradients against moe/reference_moe.py's experts_ref in fp64, and against PyTorch's
own eager loop in the inputs' dtype (the 2x rule).

    python moe/test_moe_experts.py        (or: pytest moe/test_moe_experts.py)

Error model (gemm/matmul_cases.py's): each output element is a sum of products whose inputs carry
one or two roundings of relative size u (h is rounded once before the down projection, each
routed row's output once before the sum over the slots): about sqrt(2/3) u T for an element whose
terms' root-sum-square is T (sum_scale), so atol = 8 u T with rtol the final rounding. The four
gradients are such sums too, with T computed element by element (reference_moe's
experts_grad_scales, each computed factor taken at the scale its own sums carry): an estimate
from the gradient's row and column sizes misses an expert with few tokens, one of them large (at
Qwen3-30B widths PyTorch's own bf16 dw_down broke that 8 u T at 15566 of 201M elements; against
experts_grad_scales its four gradients stay within 4.7 u T). A row sent to the wrong expert, a
missing routing weight or an unwritten tile is off by about T. The kernels' own buffers are
checked for unwritten elements by launching them into NaN-poisoned ones.
"""

import dataclasses

import torch

from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.testing import (
    UNIT_ROUNDOFF,
    Case,
    Outcome,
    Tol,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    main,
    opcheck,
    poisoned,
    rand,
)
from llmk.gemm.matmul_cases import grad_tolerance, sum_scale
from llmk.moe.moe_experts_ops import expert_rows, moe_experts, moe_experts_op
from llmk.moe.reference_moe import experts_grad_scales, experts_ref
from llmk.moe.triton_moe_gemm import (
    launch_expert_rows,
    launch_expert_weight_grad,
    launch_gather_rows,
    launch_glu_backward_rows,
)
from llmk.moe.triton_moe_routing import moe_route, permute


def out_tolerance(ref, dtype):
    atol = (8 * UNIT_ROUNDOFF[dtype] * sum_scale(ref)).clamp_min(1e-5)
    return Tol(
        atol,
        UNIT_ROUNDOFF[dtype],
        "one or two roundings of each input of the sums, one of the output",
        rounding_check=False,
    )


def layer(t, h, inter, e, k, dtype, routing="router", strided=False, transposed=False):
    """Fresh inputs: x (T, H), weights and ids (T, k) from moe_route, w_gate_up (E, 2I, H) and
    w_down (E, H, I) scaled so that every stage is O(1). routing: "router", "one" (every token on
    expert E - 1) or "few" (experts 0 and 2 only: most get no token). strided: x a row-padded
    view; transposed: the weights transposes of (E, H, 2I) and (E, I, H) tensors."""
    x = rand((t, h), dtype, pad=(0, 8) if strided else None)
    weights, ids = moe_route(rand((t, e), torch.float32), k)
    if routing == "one":
        ids = torch.full_like(ids, e - 1)
    elif routing == "few":
        ids = torch.stack([torch.zeros_like(ids[:, 0]), torch.full_like(ids[:, 0], 2)], 1)[:, :k]
    if transposed:
        w_gate_up = rand((e, h, 2 * inter), dtype, scale=h**-0.5).transpose(1, 2)
        w_down = rand((e, inter, h), dtype, scale=inter**-0.5).transpose(1, 2)
    else:
        w_gate_up = rand((e, 2 * inter, h), dtype, scale=h**-0.5)
        w_down = rand((e, h, inter), dtype, scale=inter**-0.5)
    return x, weights, ids, w_gate_up, w_down


def check_forward(t, h, inter, e, k, dtype, activation="silu", **kw):
    x, weights, ids, w_gate_up, w_down = args = layer(t, h, inter, e, k, dtype, **kw)
    with torch.no_grad():
        out = moe_experts(*args, activation)
    ref = experts_ref(*args, activation)
    theirs = experts_ref(*args, activation, dtype=dtype)
    return [
        Outcome("output shape, dtype", out.shape == x.shape and out.dtype == dtype),
        compare("out", out, ref, out_tolerance(ref, dtype), torch_out=theirs),
    ]


def check_backward(t, h, inter, e, k, dtype, activation="silu", **kw):
    args = layer(t, h, inter, e, k, dtype, **kw)

    def ours(x, weights, ids, w_gate_up, w_down):
        return moe_experts(x, weights, ids, w_gate_up, w_down, activation)

    def reference(x, weights, ids, w_gate_up, w_down):
        return experts_ref(x, weights, ids, w_gate_up, w_down, activation)

    def torch_fn(x, weights, ids, w_gate_up, w_down):
        return experts_ref(x, weights, ids, w_gate_up, w_down, activation, dtype=dtype)

    grad_out = torch.randn(args[0].shape, device=args[0].device).to(dtype)
    tol = grad_tolerance(dtype, experts_grad_scales(*args, grad_out, activation))
    return check_grads(
        "",
        ours,
        reference,
        args,
        (0, 1, 3, 4),
        ("x", "weights", "ids", "w_gate_up", "w_down"),
        lambda name, ref: dataclasses.replace(tol(name, ref), rounding_check=False),
        torch_fn=torch_fn,
        grad_outputs=[grad_out],
    )


def check_poisoned(t, h, inter, e, k, dtype, tma):
    """Every kernel writes every element of its own buffers (launched into NaN-poisoned ones). tma:
    whether expert_rows takes the persistent TMA kernel here (long runs; every run in the
    interpreter), else the row kernel; the row kernel's gate | up, h and y are computed too, and
    must equal them bit for bit (the same dots in the same order)."""
    x, weights, ids, w_gate_up, w_down = layer(t, h, inter, e, k, dtype, routing="few")
    rows = t * k
    order, _, offsets = permute(ids, e)
    scale = weights.reshape(-1).contiguous()
    pre, hid, y = poisoned((rows, 2 * inter), dtype), poisoned((rows, inter), dtype), poisoned((rows, h), dtype)
    taken = [
        expert_rows(x, w_gate_up, hid, order, offsets, epilogue="glu", top_k=k, pre=pre),
        expert_rows(hid, w_down, y, order, offsets, epilogue="scatter", scale=scale),
    ]
    # and the row kernel, the path of short runs and of operands the TMA kernel cannot take
    pre_rows, hid_rows, y_rows = (poisoned(tuple(t.shape), dtype) for t in (pre, hid, y))
    launch_expert_rows(x, w_gate_up, hid_rows, order, offsets, gather=True, epilogue="glu", top_k=k, pre=pre_rows)
    launch_expert_rows(hid, w_down, y_rows, order, offsets, gather=False, epilogue="scatter", scale=scale)
    dout = rand((t, h), dtype)
    dpre, dout_rows = poisoned((rows, 2 * inter), dtype), poisoned((rows, h), dtype)
    dweights = poisoned((t, k), torch.float32)
    launch_expert_rows(
        dout,
        w_down.transpose(1, 2),
        dpre[:, :inter],
        order,
        offsets,
        gather=True,
        epilogue="store",
        top_k=k,
        scale=scale,
        a_copy=dout_rows,
    )
    launch_glu_backward_rows(dpre, pre, order, scale, dweights, "silu")
    dx_rows = poisoned((rows, h), dtype)
    taken.append(expert_rows(dpre, w_gate_up.transpose(1, 2), dx_rows, order, offsets, epilogue="scatter"))
    dw_gate_up, dw_down = poisoned(tuple(w_gate_up.shape), dtype), poisoned(tuple(w_down.shape), dtype)
    x_rows = launch_gather_rows(x, order, k)
    launch_expert_weight_grad(dpre, x_rows, dw_gate_up, offsets, kind="gate_up")
    launch_expert_weight_grad(dout_rows, hid, dw_down, offsets, kind="down")
    idle = torch.ones(e, dtype=torch.bool, device=DEVICE)
    idle[ids.reshape(-1).long()] = False
    outcomes = [
        Outcome(
            f"{name}: every element written",
            not bool(buf.isnan().any()),
            note=f"{int(buf.isnan().sum())}/{buf.numel()} NaN",
        )
        for name, buf in (
            ("gate | up", pre),
            ("h", hid),
            ("y", y),
            ("d gate | d up", dpre),
            ("d weights", dweights),
            ("dx rows", dx_rows),
            ("d w_gate_up", dw_gate_up),
            ("d w_down", dw_down),
        )
    ]
    outcomes.append(
        Outcome(
            f"gate/up, down and dx by the {'TMA' if tma else 'row'} kernel",
            taken == [tma] * 3,
            note=f"TMA taken: {taken}",
        )
    )
    for name, got, ref in (("gate | up", pre, pre_rows), ("h", hid, hid_rows), ("y", y, y_rows)):
        diff = (got.float() - ref.float()).abs().max()
        outcomes.append(
            Outcome(f"{name}: the row kernel's bit for bit", torch.equal(got, ref), note=f"max diff {diff:.3g}")
        )
    # x's gather, and dh's GEMM keeping the rows it reads: exactly those rows (scaled once, in fp32)
    tokens = order // k
    want = (x[tokens], (dout[tokens].float() * scale[order][:, None]).to(dtype))
    for name, got, ref in (("x rows", x_rows, want[0]), ("weight * dout rows", dout_rows, want[1])):
        outcomes.append(
            Outcome(
                f"{name} in expert order: exact",
                torch.equal(got, ref),
                note=f"{int((got != ref).sum())}/{ref.numel()} differ",
            )
        )
    outcomes.append(
        Outcome(
            "experts with no token: zero weight gradients",
            bool((dw_gate_up[idle] == 0).all()) and bool((dw_down[idle] == 0).all()),
            note=f"{int(idle.sum())} idle experts",
        )
    )
    return outcomes


def check_edges():
    """No tokens; opcheck of the operator's registrations; an expanded (stride 0) upstream gradient
    gives the contiguous one's gradients; frozen experts: their gradients none, the rest unchanged."""
    x, weights, ids, w_gate_up, w_down = layer(0, 32, 16, 4, 2, torch.float32)
    outcomes = []
    out = moe_experts(x, weights, ids, w_gate_up, w_down)
    outcomes.append(Outcome("T = 0: empty output", tuple(out.shape) == (0, 32)))
    leaves = [t.requires_grad_() for t in (x, weights, w_gate_up, w_down)]
    moe_experts(x, weights, ids, w_gate_up, w_down).sum().backward()
    outcomes.append(
        Outcome(
            "T = 0: zero weight gradients",
            all(t.grad is not None for t in leaves) and not bool(w_gate_up.grad.any()) and not bool(w_down.grad.any()),
        )
    )
    x, weights, ids, w_gate_up, w_down = layer(6, 32, 24, 4, 2, torch.float32)
    grads = [t.requires_grad_() for t in (x, weights, w_gate_up, w_down)]
    outcomes.append(
        opcheck("opcheck llmk::moe_experts", moe_experts_op.overload, (*grads[:2], ids, *grads[2:], "silu", True))
    )
    out = moe_experts(x, weights, ids, w_gate_up, w_down)
    dout = rand((1, 32), torch.float32).expand(6, 32)
    expanded = torch.autograd.grad(out, grads, dout, retain_graph=True)
    plain = torch.autograd.grad(out, grads, dout.contiguous(), retain_graph=True)
    outcomes.append(
        Outcome(
            "stride-0 dout: the contiguous one's gradients, bit for bit",
            all(torch.equal(a, b) for a, b in zip(expanded, plain)),
        )
    )
    frozen = moe_experts(x, weights, ids, w_gate_up.detach(), w_down.detach())
    got = torch.autograd.grad(frozen, grads[:2], dout.contiguous())
    outcomes.append(
        Outcome("frozen experts: dx and d weights unchanged", all(torch.equal(a, b) for a, b in zip(got, plain[:2])))
    )
    return outcomes


def check_errors():
    x, weights, ids, w_gate_up, w_down = layer(4, 32, 16, 4, 2, torch.bfloat16)
    return [
        expect_raises(
            "top_k > E",
            lambda: moe_experts(x, *layer(4, 32, 16, 8, 6, torch.bfloat16)[1:3], w_gate_up, w_down),
            ValueError,
            "top_k",
        ),
        expect_raises(
            "weights' shape", lambda: moe_experts(x, weights[:, :1], ids, w_gate_up, w_down), ValueError, "weights"
        ),
        expect_raises("ids' rows", lambda: moe_experts(x, weights, ids[:3], w_gate_up, w_down), ValueError, "ids"),
        expect_raises("float ids", lambda: moe_experts(x, weights, ids.float(), w_gate_up, w_down), TypeError, "ids"),
        expect_raises(
            "w_gate_up's hidden",
            lambda: moe_experts(x, weights, ids, w_gate_up[..., :16], w_down),
            ValueError,
            "w_gate_up",
        ),
        expect_raises(
            "w_gate_up odd rows",
            lambda: moe_experts(x, weights, ids, w_gate_up[:, :31], w_down),
            ValueError,
            "w_gate_up",
        ),
        expect_raises(
            "w_down's shape", lambda: moe_experts(x, weights, ids, w_gate_up, w_down[:, :, :8]), ValueError, "w_down"
        ),
        expect_raises(
            "w_down's experts", lambda: moe_experts(x, weights, ids, w_gate_up, w_down[:3]), ValueError, "w_down"
        ),
        expect_raises(
            "w_down's dtype", lambda: moe_experts(x, weights, ids, w_gate_up, w_down.float()), TypeError, "w_down"
        ),
        expect_raises("3-D x", lambda: moe_experts(x[None], weights, ids, w_gate_up, w_down), ValueError, "x"),
        expect_raises(
            "activation", lambda: moe_experts(x, weights, ids, w_gate_up, w_down, "relu"), ValueError, "activation"
        ),
    ] + (
        [  # the ids' range is checked on the CPU only: on a GPU it would cost a host sync a call (an id out of
            # range there trips a device-side assert, as an out-of-range index of torch's embedding does)
            expect_raises(
                "id past E (CPU)", lambda: moe_experts(x, weights, ids + 4, w_gate_up, w_down), ValueError, "ids"
            ),
            expect_raises(
                "negative id (CPU)", lambda: moe_experts(x, weights, ids - 4, w_gate_up, w_down), ValueError, "ids"
            ),
        ]
        if DEVICE == "cpu"
        else []
    )


def cases():
    out = []

    def add(name, fn, gpu_only=False, **kw):
        out.append(Case(name, fn, kw, gpu_only))

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        dt = dtype_name(dtype)
        add(f"E8 top2 T37 H48 I40 {dt}", check_forward, t=37, h=48, inter=40, e=8, k=2, dtype=dtype)
        add(
            f"E16 top4 T5 H64 I24 (experts with no token) {dt}",
            check_forward,
            t=5,
            h=64,
            inter=24,
            e=16,
            k=4,
            dtype=dtype,
        )
    add("one token E16 top4 bf16", check_forward, t=1, h=48, inter=32, e=16, k=4, dtype=torch.bfloat16)
    add(
        "every token on one expert E4 top2 T40 bf16",
        check_forward,
        t=40,
        h=32,
        inter=24,
        e=4,
        k=2,
        dtype=torch.bfloat16,
        routing="one",
    )
    add(
        "x row-strided, weights transposed E8 top2 T21 bf16",
        check_forward,
        t=21,
        h=40,
        inter=24,
        e=8,
        k=2,
        dtype=torch.bfloat16,
        strided=True,
        transposed=True,
    )
    for activation in ("gelu", "gelu_tanh"):
        add(
            f"GeGLU ({activation}) E8 top2 T19 bf16",
            check_forward,
            t=19,
            h=32,
            inter=40,
            e=8,
            k=2,
            dtype=torch.bfloat16,
            activation=activation,
        )
    for dtype in (torch.float32, torch.bfloat16):
        dt = dtype_name(dtype)
        add(f"grads E8 top2 T29 H40 I24 {dt}", check_backward, t=29, h=40, inter=24, e=8, k=2, dtype=dtype)
    add(
        "grads every token on one expert, others none E4 top2 T18 bf16",
        check_backward,
        t=18,
        h=32,
        inter=16,
        e=4,
        k=2,
        dtype=torch.bfloat16,
        routing="few",
    )
    add(
        "grads x row-strided, weights transposed, GeGLU tanh E6 top3 T11 fp16",
        check_backward,
        t=11,
        h=32,
        inter=24,
        e=6,
        k=3,
        dtype=torch.float16,
        strided=True,
        transposed=True,
        activation="gelu_tanh",
    )
    add("grads one token E8 top2 bf16", check_backward, t=1, h=32, inter=16, e=8, k=2, dtype=torch.bfloat16)
    add(
        "kernels write every element E8 top2 T13",
        check_poisoned,
        t=13,
        h=40,
        inter=24,
        e=8,
        k=2,
        dtype=torch.bfloat16,
        tma=INTERPRET,
    )
    add("edges, opcheck", check_edges)
    add("bad input", check_errors)
    add(
        "Qwen3-30B-A3B widths E128 top8 T512 bf16",
        check_forward,
        True,
        t=512,
        h=2048,
        inter=768,
        e=128,
        k=8,
        dtype=torch.bfloat16,
    )
    add(
        "grads Qwen3-30B-A3B widths E128 top8 T256 bf16",
        check_backward,
        True,
        t=256,
        h=2048,
        inter=768,
        e=128,
        k=8,
        dtype=torch.bfloat16,
    )
    # 128 rows an expert: MOE_CONFIGS' long-run tiles (prefill, training), which the cases above (at most
    # 64 rows an expert) never reach
    add(
        "grads Qwen3-30B-A3B widths E128 top8 T2048 bf16 (long-run tiles)",
        check_backward,
        True,
        t=2048,
        h=2048,
        inter=768,
        e=128,
        k=8,
        dtype=torch.bfloat16,
    )
    add(
        "kernels write every element E16 top2 T1024 H512 I384 bf16 (long-run tiles)",
        check_poisoned,
        True,
        t=1024,
        h=512,
        inter=384,
        e=16,
        k=2,
        dtype=torch.bfloat16,
        tma=True,
    )
    add(
        "Mixtral-like E8 top2 T300 H1024 I3584 bf16",
        check_forward,
        True,
        t=300,
        h=1024,
        inter=3584,
        e=8,
        k=2,
        dtype=torch.bfloat16,
    )
    return out


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("moe experts", CASES)
