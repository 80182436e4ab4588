"""Tests for losses/fused_linear_cross_entropy_ops.py against the fp64 reference (losses/reference_losses.py)
and against PyTorch's own same-dtype computation (logits = hidden @ weight.T in the input dtype,
then F.cross_entropy).

    python losses/test_fused_linear_cross_entropy.py    (or: pytest losses/test_fused_linear_cross_entropy.py)

Tolerance: flash-attention's rule, for the loss and each gradient: the error against the fp64
reference at most twice PyTorch's same-dtype error, plus one rounding of the largest value
(u * max|ref|), plus a floor of FLOOR_ULPS fp32 ulps of it (where PyTorch's fp32 error is ~0).
The kernel rounds the logits and dlogits to the input dtype, as PyTorch's path rounds its logits
and gradients; in bf16, grad_weight also takes one rounding a chunk of tokens (module docstring),
so its rule counts that many roundings of its largest value (weight_roundings: 3 for the
interpreter's 21 rows, where one element of 9600 had passed the one-rounding rule at 2.5 ulps).
The interpreter runs chunks of INTERPRET_CHUNK rows, so every test batch spans several chunks and
a ragged last one; the kernel's vocabulary chunks are 128 there (V = 300: a ragged last one too).
"""

import math

import torch
import torch._dynamo.testing  # CompileCounterWithBackend (a submodule: import it, not only torch)

from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.testing import (
    EXACT,
    UNIT_ROUNDOFF,
    Case,
    Outcome,
    Tol,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    grads_of,
    main,
    one_dtype_here,
    opcheck,
    rand,
)
from llmk.losses.fused_linear_cross_entropy_ops import (
    chunk_rows,
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_backward_op,
)
from llmk.losses.loss_cases import IGNORE, bad_target_message, make_class_weight, make_target, target_of, with_hits
from llmk.losses.reference_losses import (
    linear_cross_entropy_ref,
    linear_cross_entropy_same_dtype,
    token_accuracy_ref,
    z_loss_ref,
)

FLOOR_ULPS = 64
# Rows of the main cases: 37 on a GPU; 21 in the interpreter, whose cost is a program per row, still
# three chunks of INTERPRET_CHUNK (8) with a ragged last one
ROWS = 21 if INTERPRET else 37


def rule_tol(dtype, want, theirs, roundings=1):
    """flash-attention's rule (module docstring) as a per-element Tol; roundings: of the largest
    value, one, or grad_weight's one a chunk in 16 bits."""
    if not want.numel():
        return Tol(0.0, 0.0, "empty", rounding_check=False)
    top = want.abs().nan_to_num(nan=0.0).max().item()  # NaN: every target ignored
    err = (theirs.double() - want).abs().nan_to_num(nan=0.0).max().item()
    atol = 2 * err + (roundings * UNIT_ROUNDOFF[dtype] + FLOOR_ULPS * UNIT_ROUNDOFF[torch.float32]) * top + 1e-12
    return Tol(atol, 0.0, f"2x PyTorch's same-dtype error + {roundings} u * max|ref|", rounding_check=False)


def weight_roundings(n, v, dtype):
    """grad_weight's roundings in `dtype`: one a chunk of tokens in 16 bits (each partial sum of the
    chunks rounded, module docstring; bounded here by max|ref|), one in fp32."""
    if dtype == torch.float32 or n == 0:
        return 1
    return math.ceil(n / chunk_rows(n, v, torch.finfo(dtype).bits // 8))


def check(
    n,
    h,
    v,
    dtype,
    reduction="mean",
    label_smoothing=0.0,
    softcap=None,
    bias=False,
    weight_scale=None,
    lead=None,
    all_ignored=False,
    wrt=None,
    weighted=False,
    lse_square_scale=0.0,
    extras=False,
):
    """Loss and the gradients of hidden, weight (and bias) against the fp64 reference. wrt: the
    positions (0 hidden, 1 weight, 2 bias) that require grad, default all; the others get None.
    weighted: class weights; extras: the z-loss and token accuracy outputs too."""
    shape = (lead, n // lead, h) if lead else (n, h)
    hidden = rand(shape, dtype)
    weight = rand((v, h), dtype, scale=weight_scale or h**-0.5 * 3)
    inputs = [hidden, weight] + ([rand((v,), dtype)] if bias else [])
    target = make_target(shape[:-1], v, all_ignored=all_ignored)
    if extras:  # half the rows hit: an accuracy of all 0 or all 1 fails
        target = with_hits(target, hidden @ weight.T + (inputs[2] if bias else 0.0))
    options = dict(
        ignore_index=IGNORE,
        reduction=reduction,
        label_smoothing=label_smoothing,
        softcap=softcap,
        class_weight=make_class_weight(v) if weighted else None,
        lse_square_scale=lse_square_scale,
    )

    def call(fn):
        return lambda hd, w, *b: fn(hd, w, target, b[0] if b else None, **options)

    ours, ref, theirs = (
        call(fused_linear_cross_entropy),
        call(linear_cross_entropy_ref),
        call(linear_cross_entropy_same_dtype),
    )
    wrt = list(range(len(inputs))) if wrt is None else list(wrt)
    dy = torch.randn(target.shape if reduction == "none" else (), device=DEVICE).to(dtype)
    outs, want = grads_of(ref, inputs, wrt, [dy], dtype=torch.float64)
    _, their_grads = grads_of(theirs, inputs, wrt, [dy])
    with torch.no_grad():
        loss, ref_loss, torch_loss = ours(*inputs), ref(*[t.double() for t in inputs]), theirs(*inputs)
    nan_loss = all_ignored and reduction == "mean"  # 0 / 0: compared below, as NaN
    outcomes = (
        []
        if nan_loss
        else [compare("loss", loss, ref_loss, rule_tol(dtype, ref_loss, torch_loss), torch_out=torch_loss)]
    )
    if all_ignored:
        outcomes.append(
            Outcome(
                "every target ignored: loss as PyTorch's",
                bool(loss.isnan()) == bool(torch_loss.isnan()),
                note=f"{loss.flatten()[0].item()}",
            )
        )
    if extras:
        outcomes += check_extras(inputs, target, options)
    n_rows = hidden.numel() // h
    tols = {
        ("hidden", "weight", "bias")[i]: rule_tol(dtype, w, t, weight_roundings(n_rows, v, dtype) if i == 1 else 1)
        for i, w, t in zip(wrt, want, their_grads)
    }
    return outcomes + check_grads(
        "",
        ours,
        ref,
        inputs,
        wrt,
        ("hidden", "weight", "bias"),
        lambda name, w: tols[name],
        torch_fn=theirs,
        grad_outputs=[dy],
    )


def check_extras(inputs, target, options):
    """The z-loss and token accuracy outputs against the references on the fp64 logits, and the
    loss beside them equal to the plain call's, bit for bit."""
    hidden, weight, *bias = inputs
    out = fused_linear_cross_entropy(
        hidden, weight, target, *bias, **options, return_z_loss=True, return_token_accuracy=True
    )
    logits = hidden.double() @ weight.double().T + (bias[0].double() if bias else 0.0)
    reduction, softcap = options["reduction"], options["softcap"]
    z = z_loss_ref(logits, target, IGNORE, reduction, options["lse_square_scale"], softcap)
    # PyTorch's: the z-loss of the logits in hidden's dtype (their rounding moves the LSE, as the kernel's)
    same_dtype = hidden @ weight.T + (bias[0] if bias else 0.0)
    z_theirs = z_loss_ref(same_dtype, target, IGNORE, reduction, options["lse_square_scale"], softcap)
    plain = fused_linear_cross_entropy(hidden, weight, target, *bias, **options)
    return [
        compare("z_loss", out.z_loss, z, rule_tol(hidden.dtype, z, z_theirs), torch_out=z_theirs),
        check_accuracy(out.token_accuracy, logits, target, hidden.dtype, reduction, softcap),
        compare("loss = the plain call's", out.loss, plain, EXACT),
    ]


def check_accuracy(got, logits, target, dtype, reduction, softcap):
    """token_accuracy against the argmax of the fp64 logits rounded to dtype. The kernel takes the
    argmax of its GEMM's logits, which may round the other way: a row whose two largest logits are
    within two ulps of dtype (or 1e-5 relative, fp32's accumulation over H) may hit or miss. Those
    rows are left out of the "none" comparison, and widen the range of the share ("mean" and "sum"
    alike: the share of the rows not ignored) by one each; the share itself is one fp32 division."""
    hits = token_accuracy_ref(logits.to(dtype), target, IGNORE, "none", softcap).reshape(-1).double()
    top2 = logits.reshape(-1, logits.shape[-1]).topk(2, dim=-1).values
    kept = target.reshape(-1) != IGNORE
    near = kept & (top2[:, 0] - top2[:, 1] <= max(4 * UNIT_ROUNDOFF[dtype], 1e-5) * top2[:, 0].abs())
    note = f"{int(near.sum())} of {int(kept.sum())} rows within the rounding of a tie"
    if reduction == "none":
        bad = (got.reshape(-1).double() != hits) & ~near
        return Outcome(
            "token_accuracy", not bad.any() and got.shape == target.shape, bad=f"{int(bad.sum())}", note=note
        )
    value = got.double().item()
    if not kept.any():  # 0 / 0, as the reference
        return Outcome("token_accuracy: NaN, every target ignored", math.isnan(value), note=f"{value}")
    slack = UNIT_ROUNDOFF[torch.float32]
    low = (hits[~near].sum() / kept.sum()).item() * (1 - slack)
    high = ((hits[~near].sum() + near.sum()) / kept.sum()).item() * (1 + slack)
    return Outcome(
        "token_accuracy", low <= value <= high, limit=f"[{low:.6g}, {high:.6g}]", note=f"{value:.6g}; {note}"
    )


def check_huge():
    """Logits of +-1e4 (hidden scaled up): a finite loss and finite gradients, as the reference."""
    hidden, weight = rand((12, 32), torch.float32, scale=300.0), rand((300, 32), torch.float32)
    target = make_target((12,), 300)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    loss = fused_linear_cross_entropy(h, w, target)
    grads = torch.autograd.grad(loss, (h, w))
    ref = linear_cross_entropy_ref(hidden.double(), weight.double(), target)
    return [
        Outcome(
            "finite loss and gradients",
            bool(loss.isfinite()) and all(bool(g.isfinite().all()) for g in grads),
            note=f"max |logit| {(hidden @ weight.T).abs().max().item():.3g}",
        ),
        compare("loss", loss.detach(), ref, Tol(1e-4 * abs(ref.item()), 1e-5, "fp32 at logits of 1e4")),
    ]


def check_strided_target():
    """A target that is a strided view reads the right entries (the op takes a contiguous copy)."""
    hidden, weight = rand((10, 16), torch.float32), rand((50, 16), torch.float32)
    target = make_target((20,), 50)[::2]
    loss = fused_linear_cross_entropy(hidden, weight, target)
    ref = linear_cross_entropy_ref(hidden.double(), weight.double(), target)
    return [compare("loss, target[::2]", loss, ref, Tol(1e-5 * abs(ref.item()) + 1e-6, 1e-5, "fp32"))]


def check_bad_target():
    """A target outside [0, V) that is not ignore_index raises a ValueError naming target, the value
    and V, through every entry: each reduction (with and without gradients), with the options, int32
    targets, a custom ignore_index, the recomputing backward operator called on its own, a compiled
    call; the error is an IndexError too, so callers catching that keep working."""
    hidden, weight = rand((5, 16), torch.float32), rand((10, 16), torch.float32)
    f = fused_linear_cross_entropy
    grad = lambda: hidden.clone().requires_grad_()  # noqa: E731
    calls = [
        ("target 10, mean", lambda: f(hidden, weight, target_of(1, 10, IGNORE, 0, 9)), 10, IGNORE),
        ("target 10, mean under grad", lambda: f(grad(), weight, target_of(1, 10, IGNORE, 0, 9)), 10, IGNORE),
        (
            "target 10, sum under grad",
            lambda: f(grad(), weight, target_of(1, 10, 2, 0, 9), reduction="sum"),
            10,
            IGNORE,
        ),
        (
            "target 10, none under grad",
            lambda: f(grad(), weight, target_of(1, 10, 2, 0, 9), reduction="none"),
            10,
            IGNORE,
        ),
        ("target -5, none", lambda: f(hidden, weight, target_of(1, 2, -5, 0, 9), reduction="none"), -5, IGNORE),
        (
            "target 10, class_weight, z-loss, extras under grad",
            lambda: f(
                grad(),
                weight,
                target_of(1, 10, 2, 0, 9),
                class_weight=make_class_weight(10),
                lse_square_scale=1e-3,
                return_z_loss=True,
                return_token_accuracy=True,
            ),
            10,
            IGNORE,
        ),
        ("int32 target 11", lambda: f(hidden, weight, target_of(1, 2, 11, 0, 9, dtype=torch.int32)), 11, IGNORE),
        ("int32 target -2", lambda: f(hidden, weight, target_of(-2, 2, 3, 0, 9, dtype=torch.int32)), -2, IGNORE),
        (
            "-100 with ignore_index 9",
            lambda: f(hidden, weight, target_of(9, IGNORE, 3, 0, 1), ignore_index=9),
            IGNORE,
            9,
        ),
        (
            "backward operator, target 10",
            lambda: fused_linear_cross_entropy_backward_op(
                torch.ones(5, device=DEVICE),
                None,
                hidden,
                weight,
                target_of(1, 10, 3, 0, 9),
                None,
                torch.zeros(5, device=DEVICE),
                IGNORE,
                0.0,
                None,
                [True, True, False],
            ),
            10,
            IGNORE,
        ),
    ]
    outcomes = [
        expect_raises(name, fn, ValueError, bad_target_message(value, 10, ignore_index))
        for name, fn, value, ignore_index in calls
    ]
    outcomes.append(
        expect_raises(
            "caught as IndexError",
            lambda: f(hidden, weight, target_of(1, 10, 3, 0, 9)),
            IndexError,
            bad_target_message(10, 10),
        )
    )
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda hd, w, t: f(hd, w, t), fullgraph=True, backend="aot_eager" if INTERPRET else "inductor"
    )
    valid = compiled(grad(), weight, target_of(1, 9, 0, IGNORE, 3))
    outcomes.append(Outcome("compiled, valid target: finite loss", bool(valid.isfinite())))
    outcomes.append(
        expect_raises(
            "compiled, target 10",
            lambda: compiled(grad(), weight, target_of(1, 10, 0, 2, 3)),
            ValueError,
            bad_target_message(10, 10),
        )
    )
    return outcomes


def check_edge_targets():
    """Targets 0 and V - 1 and ignore_index entries pass the check, whether ignore_index is the
    default, a class inside [0, V) or a value past V: losses as the reference's, in int64 and int32,
    and gradients that are finite."""
    hidden, weight = rand((4, 16), torch.float32), rand((10, 16), torch.float32)
    outcomes = []
    for ignore_index, values in (
        (IGNORE, (0, 9, IGNORE, 5)),
        (9, (0, 9, 9, 3)),
        (-1, (-1, 0, 9, 4)),
        (10, (10, 0, 9, 2)),
    ):
        for dtype in (torch.int64, torch.int32):
            target = target_of(*values, dtype=dtype)
            label = f"ignore_index {ignore_index}, targets {values}, {dtype_name(dtype)}"
            h = hidden.clone().requires_grad_()
            loss = fused_linear_cross_entropy(h, weight, target, ignore_index=ignore_index, reduction="none")
            (g,) = torch.autograd.grad(loss.sum(), h)
            ref = linear_cross_entropy_ref(
                hidden.double(), weight.double(), target, ignore_index=ignore_index, reduction="none"
            )
            tol = Tol(1e-5 * ref.abs().max().item() + 1e-6, 1e-5, "fp32")
            outcomes += [
                compare(label, loss.detach(), ref, tol),
                Outcome(f"{label}: finite gradient", bool(g.isfinite().all())),
            ]
    return outcomes


def check_graph_capture():
    """Under CUDA-graph capture the check cannot run (a host read): the capture succeeds, and a
    replay on targets 10 and -5 gives their rows a NaN loss, the valid rows finite ones."""
    hidden, weight = rand((5, 16), torch.float32), rand((10, 16), torch.float32)
    target = target_of(1, 2, 3, 4, 5)
    fused_linear_cross_entropy(hidden, weight, target, reduction="none")  # kernels and cuBLAS made outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rows = fused_linear_cross_entropy(hidden, weight, target, reduction="none")
    target.copy_(target_of(1, 10, -5, 4, IGNORE))
    graph.replay()
    torch.cuda.synchronize()
    return [
        Outcome(
            "replay, targets 10 and -5: NaN rows, the others finite",
            bool(rows[1:3].isnan().all() and rows[[0, 3, 4]].isfinite().all()),
            note=str(rows.tolist()),
        )
    ]


def check_one_backward():
    """The gradients are scaled in place: a second backward through the same graph raises."""
    hidden = rand((10, 16), torch.float32).requires_grad_()
    weight = rand((50, 16), torch.float32)
    loss = fused_linear_cross_entropy(hidden, weight, make_target((10,), 50))
    torch.autograd.grad(loss, hidden, retain_graph=True)
    return [expect_raises("second backward", lambda: torch.autograd.grad(loss, hidden), RuntimeError, "retain_graph")]


def check_no_grad():
    """Under torch.no_grad() (and with nothing requiring grad) the same loss, no gradient work."""
    hidden, weight = rand((10, 16), torch.bfloat16), rand((50, 16), torch.bfloat16)
    target = make_target((10,), 50)
    with torch.no_grad():
        a = fused_linear_cross_entropy(hidden.requires_grad_(), weight, target)
    b = fused_linear_cross_entropy(hidden.detach(), weight, target)
    return [Outcome("no_grad = plain inputs, bit for bit", torch.equal(a, b) and not a.requires_grad)]


def in_place_grads(x, weight, target, bias, grad_in_place, **options):
    """(loss, gradient of hidden = x * 1, of weight, of bias, hidden): the loss taken on a non-leaf
    copy of x, as an LM head's input is the final norm's output."""
    hidden = x * 1
    loss = fused_linear_cross_entropy(hidden, weight, target, bias, grad_in_place=grad_in_place, **options)
    wrt = [hidden, weight] + ([bias] if bias is not None else [])
    return (loss.detach(), *torch.autograd.grad(loss * 3, wrt), hidden)


def check_grad_in_place(n, h, v, dtype, reduction="mean", bias=False, lead=None, weighted=False, lse_square_scale=0.0):
    """grad_in_place=True: the loss and gradients bit for bit those of the plain op (tested against
    the fp64 reference above), and grad_hidden is hidden's own memory."""
    shape = (lead, n // lead, h) if lead else (n, h)
    x = rand(shape, dtype).requires_grad_()
    weight = rand((v, h), dtype, scale=h**-0.5 * 3).requires_grad_()
    b = rand((v,), dtype).requires_grad_() if bias else None
    target = make_target(shape[:-1], v)
    options = dict(
        ignore_index=IGNORE,
        reduction=reduction,
        label_smoothing=0.1,
        softcap=30.0,
        class_weight=make_class_weight(v) if weighted else None,
        lse_square_scale=lse_square_scale,
    )
    *plain, _ = in_place_grads(x, weight, target, b, False, **options)
    *got, hidden = in_place_grads(x, weight, target, b, True, **options)
    names = ("loss", "grad hidden", "grad weight", "grad bias")
    return [compare(f"{name} = plain op's", g, w, EXACT) for name, g, w in zip(names, got, plain)] + [
        Outcome("grad_hidden written over hidden", got[1].data_ptr() == hidden.data_ptr())
    ]


def check_in_place_rules():
    """Where grad_in_place writes over hidden, and where it must not (fused_linear_cross_entropy's
    _in_place_safe): the gradients are the plain op's in every case, and a hidden that is not
    written keeps its values."""
    # 9 rows in the interpreter: two of its chunks (INTERPRET_CHUNK, 8), the last of one row; each
    # of the two dozen calls here costs a program a row there
    n, h, v, dtype = 9 if INTERPRET else 21, 32, 150, torch.bfloat16
    x, weight, target = rand((n, h), dtype).requires_grad_(), rand((v, h), dtype).requires_grad_(), make_target((n,), v)
    f = fused_linear_cross_entropy
    want = torch.autograd.grad(f(x, weight, target), (x, weight))

    def untouched(label, hidden, wrt, loss_fn=lambda hd, **kw: f(hd, weight, target, **kw)):
        before = hidden.detach().clone()
        got = torch.autograd.grad(loss_fn(hidden, grad_in_place=True), wrt)
        plain = torch.autograd.grad(loss_fn(x * 1), (x, weight))
        same = all(torch.equal(g, w) for g, w in zip(got, plain if wrt[0] is x else plain[1:]))
        return Outcome(f"{label}: the plain gradients, hidden unchanged", same and torch.equal(hidden, before))

    outcomes = [
        untouched("a leaf", x, (x, weight)),
        untouched("a view of a leaf", x.view(n, h), (x, weight)),
        untouched("rows of a larger tensor", torch.cat([x, x]).mul(1)[:n], (x, weight)),
        untouched(
            "reduction none",
            x * 1,
            (x, weight),
            lambda hd, **kw: f(hd, weight, target, reduction="none", **kw).sum() / n,
        ),
        untouched("hidden not requiring grad", x.detach() * 1, (weight,)),
    ]
    with torch.no_grad():
        hidden = x * 1
        loss = f(hidden, weight, target, grad_in_place=True)
    outcomes.append(
        Outcome(
            "no_grad: the plain loss, hidden unchanged",
            torch.equal(loss, f(x.detach(), weight.detach(), target)) and torch.equal(hidden, x),
        )
    )

    hidden = x * 1
    squares = (hidden * hidden).sum()  # mul saves hidden, before the loss writes over it
    loss = f(hidden, weight, target, grad_in_place=True) + squares
    outcomes.append(
        expect_raises(
            "a node that saved hidden raises in its backward",
            lambda: torch.autograd.grad(loss, x),
            RuntimeError,
            "modified by an inplace operation",
        )
    )
    hidden = x * 1
    loss = f(hidden, weight, target, grad_in_place=True)
    torch.autograd.grad(loss, hidden, retain_graph=True)
    outcomes.append(
        expect_raises(
            "a second backward raises", lambda: torch.autograd.grad(loss, hidden), RuntimeError, "retain_graph"
        )
    )

    hidden, weight_, target_, bias = operator_inputs()
    outcomes.append(
        opcheck(
            "opcheck llmk::fused_linear_cross_entropy_in_place",
            torch.ops.llmk.fused_linear_cross_entropy_in_place.default,
            (hidden, weight_, target_, bias, IGNORE, 0.1, 30.0, "mean", [True, True, True]),
        )
    )
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda xx, w: f(xx * 1, w, target, grad_in_place=True),
        fullgraph=True,
        backend="aot_eager" if INTERPRET else "inductor",
    )
    got = torch.autograd.grad(compiled(x, weight), (x, weight))
    outcomes.append(
        Outcome("torch.compile(fullgraph=True): the plain gradients", all(torch.equal(g, w) for g, w in zip(got, want)))
    )
    return outcomes


def operator_inputs():
    return (
        rand((12, 32), torch.bfloat16),
        rand((100, 32), torch.bfloat16),
        make_target((12,), 100),
        rand((100,), torch.bfloat16),
    )


def check_operator():
    """torch.library.opcheck of llmk::fused_linear_cross_entropy, without and with gradients (its
    schema's `grads`), and of the recomputing backward called on its own, with the target check
    (its default) and without (autograd's call)."""
    from llmk.common.ops import OPS

    calls = []
    for grads in ([False, False, False], [True, True, True]):
        hidden, weight, target, bias = operator_inputs()
        if any(grads):
            hidden, weight, bias = (t.requires_grad_() for t in (hidden, weight, bias))
        calls.append(
            (
                f"opcheck, grads {grads}",
                "fused_linear_cross_entropy",
                (hidden, weight, target, bias, IGNORE, 0.1, 30.0, "mean", grads),
            )
        )
        calls.append(
            (
                f"opcheck, grads {grads}, class_weight, z-loss, accuracy",
                "fused_linear_cross_entropy",
                (hidden, weight, target, bias, IGNORE, 0.1, 30.0, "sum", grads, make_class_weight(100), 1e-2, True),
            )
        )
    for extra in ((), (False,)):
        hidden, weight, target, bias = operator_inputs()
        lse = torch.logsumexp(hidden.float() @ weight.float().T + bias.float(), -1)
        args = (
            (
                torch.randn(12, device=DEVICE),
                torch.randn(12, device=DEVICE),
                hidden,
                weight,
                target,
                bias,
                lse,
                IGNORE,
                0.1,
                30.0,
                [True, True, True],
            )
            + extra
            + (make_class_weight(100),) * bool(extra)
        )
        calls.append(
            (f"opcheck, recomputing backward, check_target {extra == ()}", "fused_linear_cross_entropy_backward", args)
        )
    outcomes = []
    for check, name, args in calls:
        try:
            torch.library.opcheck(OPS[name].overload, args)
            outcomes.append(Outcome(check, True))
        except Exception as e:
            outcomes.append(Outcome(check, False, note=str(e).split(" (scroll")[0][:150]))
    return outcomes


def check_compile():
    """A fullgraph-compiled training call (aot_eager in the interpreter, inductor on a GPU): one
    frame over two calls on fresh inputs, gradients equal to eager's bit for bit."""
    backend = "aot_eager" if INTERPRET else "inductor"
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)

    def step(hidden, weight, target, bias):
        return fused_linear_cross_entropy(hidden, weight, target, bias, label_smoothing=0.1, softcap=30.0) * 2

    compiled = torch.compile(step, fullgraph=True, backend=counter)
    outcomes = []
    for call in (1, 2):
        hidden, weight, target, bias = operator_inputs()
        runs = []
        for fn in (compiled, step):
            leaves = [t.detach().requires_grad_() for t in (hidden, weight, bias)]
            loss = fn(leaves[0], leaves[1], target, leaves[2])
            runs.append((loss.detach(), torch.autograd.grad(loss, leaves)))
        (loss_c, grads_c), (loss_e, grads_e) = runs
        same = torch.equal(loss_c, loss_e) and all(torch.equal(a, b) for a, b in zip(grads_c, grads_e))
        outcomes.append(Outcome(f"{backend} call {call}: loss and grads = eager", same))
    outcomes.append(Outcome(f"frames compiled: {counter.frame_count}, expected 1", counter.frame_count == 1))
    return outcomes


def check_errors():
    hidden, weight, target = rand((4, 8), torch.float16), rand((20, 8), torch.float16), make_target((4,), 20)
    f = fused_linear_cross_entropy
    return [
        expect_raises("weight dtype", lambda: f(hidden, weight.float(), target), TypeError, "weight"),
        expect_raises("weight (20, 9)", lambda: f(hidden, rand((20, 9), torch.float16), target), ValueError, "weight"),
        expect_raises("1-D weight", lambda: f(hidden, weight[0], target), ValueError, "weight"),
        expect_raises(
            "bias shape", lambda: f(hidden, weight, target, bias=rand((19,), torch.float16)), ValueError, "bias"
        ),
        expect_raises("target shape", lambda: f(hidden, weight, target[:3]), ValueError, "target"),
        expect_raises("float target", lambda: f(hidden, weight, target.float()), TypeError, "target"),
        expect_raises("softcap 0", lambda: f(hidden, weight, target, softcap=0.0), ValueError, "softcap"),
        expect_raises("reduction", lambda: f(hidden, weight, target, reduction="max"), ValueError, "reduction"),
        expect_raises("int hidden", lambda: f(target[:, None], weight, target), TypeError, "hidden"),
        expect_raises(
            "class_weight (19,)",
            lambda: f(hidden, weight, target, class_weight=make_class_weight(19)),
            ValueError,
            "class_weight",
        ),
        expect_raises(
            "class_weight requiring grad",
            lambda: f(hidden, weight, target, class_weight=make_class_weight(20).requires_grad_()),
            ValueError,
            "class_weight",
        ),
        expect_raises(
            "lse_square_scale nan",
            lambda: f(hidden, weight, target, lse_square_scale=float("nan")),
            ValueError,
            "lse_square_scale",
        ),
        expect_raises(
            "return_token_accuracy None",
            lambda: f(hidden, weight, target, return_token_accuracy=None),
            TypeError,
            "return_token_accuracy",
        ),
    ]


def _cases():
    cases = []

    def add(name, gpu_only=False, gpu_gb=None, **kw):
        cases.append(Case(name, check, kw, gpu_only, gpu_gb=gpu_gb))

    # the interpreter runs each case of the lists below in one dtype, alternating down the list (the
    # GPU both): every shape, reduction and set of options still runs there, in fp32 and in bf16 alike
    dtypes = (torch.float32, torch.bfloat16)
    for dtype in dtypes:
        first = len(cases)
        dt = dtype_name(dtype)
        add(f"N{ROWS} H32 V300 {dt} mean", n=ROWS, h=32, v=300, dtype=dtype)
        add(
            f"N20 H64 V129 {dt} sum, smoothing 0.1, softcap 30, bias",
            n=20,
            h=64,
            v=129,
            dtype=dtype,
            reduction="sum",
            label_smoothing=0.1,
            softcap=30.0,
            bias=True,
        )
        add(
            f"N19 H32 V77 {dt} none, softcap 5, bias",
            n=19,
            h=32,
            v=77,
            dtype=dtype,
            reduction="none",
            softcap=5.0,
            bias=True,
        )
        add(f"B3 T8 H32 V200 {dt} 3-D hidden", n=24, h=32, v=200, dtype=dtype, lead=3)
        add(f"N1024 H2048 V32000 {dt}", gpu_only=True, n=1024, h=2048, v=32000, dtype=dtype)
        add(
            f"N512 H4096 V128256 {dt} smoothing 0.1",
            gpu_only=True,
            n=512,
            h=4096,
            v=128256,
            dtype=dtype,
            label_smoothing=0.1,
            gpu_gb=45 if dtype == torch.float32 else 38,
        )  # 42.8 / 35.8 GB printed
        one_dtype_here(cases[first:], dtype, dtypes=dtypes)
    # the options: class weights, z-loss, extra outputs, with smoothing and softcap; each reduction
    for dtype in dtypes:
        first = len(cases)
        dt = dtype_name(dtype)
        for reduction in ("mean", "sum", "none"):
            add(
                f"N{ROWS} H32 V300 {dt} {reduction}, class_weight",
                n=ROWS,
                h=32,
                v=300,
                dtype=dtype,
                reduction=reduction,
                weighted=True,
            )
            add(
                f"N{ROWS} H32 V300 {dt} {reduction}, z-loss 1e-2, extras",
                n=ROWS,
                h=32,
                v=300,
                dtype=dtype,
                reduction=reduction,
                lse_square_scale=1e-2,
                extras=True,
            )
            add(
                f"N20 H64 V129 {dt} {reduction}, class_weight, smoothing 0.1, z-loss, softcap 30, bias, extras",
                n=20,
                h=64,
                v=129,
                dtype=dtype,
                reduction=reduction,
                weighted=True,
                label_smoothing=0.1,
                lse_square_scale=1e-2,
                softcap=30.0,
                bias=True,
                extras=True,
            )
        add(
            f"N512 H4096 V128256 {dt} class_weight, smoothing 0.1, z-loss 1e-4, extras",
            gpu_only=True,
            n=512,
            h=4096,
            v=128256,
            dtype=dtype,
            weighted=True,
            label_smoothing=0.1,
            lse_square_scale=1e-4,
            extras=True,
            gpu_gb=45 if dtype == torch.float32 else 38,
        )
        add(
            f"N512 H3584 V151936 {dt} none, z-loss 1e-4, extras",
            gpu_only=True,
            n=512,
            h=3584,
            v=151936,
            dtype=dtype,
            reduction="none",
            lse_square_scale=1e-4,
            extras=True,
            gpu_gb=45 if dtype == torch.float32 else 38,
        )
        one_dtype_here(cases[first:], dtype, dtypes=dtypes)
    add(
        "N12 H16 V50 every target ignored fp32, class_weight, z-loss, extras",
        n=12,
        h=16,
        v=50,
        dtype=torch.float32,
        all_ignored=True,
        weighted=True,
        lse_square_scale=1e-2,
        extras=True,
    )
    add(
        "B3 T8 H32 V200 bf16 3-D none, class_weight, z-loss, extras, hidden only",
        n=24,
        h=32,
        v=200,
        dtype=torch.bfloat16,
        lead=3,
        reduction="none",
        weighted=True,
        lse_square_scale=1e-2,
        extras=True,
        wrt=(0,),
    )
    # a subset requiring grad: the others' products skipped, None for them (a frozen head: hidden only)
    add(
        "N19 H32 V77 bf16 none, bias, hidden only",
        n=19,
        h=32,
        v=77,
        dtype=torch.bfloat16,
        reduction="none",
        bias=True,
        wrt=(0,),
    )
    add(
        "N19 H32 V77 fp32 none, bias, weight and bias only",
        n=19,
        h=32,
        v=77,
        dtype=torch.float32,
        reduction="none",
        bias=True,
        wrt=(1, 2),
    )
    add("N20 H64 V129 bf16 mean, bias, weight only", n=20, h=64, v=129, dtype=torch.bfloat16, bias=True, wrt=(1,))
    add("N9 H16 V1 fp32", n=9, h=16, v=1, dtype=torch.float32)
    add("N12 H16 V50 every target ignored fp32", n=12, h=16, v=50, dtype=torch.float32, all_ignored=True)
    add(
        "N12 H16 V50 every target ignored, sum bf16",
        n=12,
        h=16,
        v=50,
        dtype=torch.bfloat16,
        reduction="sum",
        all_ignored=True,
    )
    add("N10 H16 V300 fp16 mean", n=10, h=16, v=300, dtype=torch.float16)
    for dtype in dtypes:  # one dtype each in the interpreter, as above
        first = len(cases)
        dt = dtype_name(dtype)
        cases += [
            Case(
                f"grad_in_place N{ROWS} H32 V300 {dt} mean", check_grad_in_place, dict(n=ROWS, h=32, v=300, dtype=dtype)
            ),
            Case(
                f"grad_in_place B3 T8 H32 V200 {dt} sum, bias",
                check_grad_in_place,
                dict(n=24, h=32, v=200, dtype=dtype, reduction="sum", bias=True, lead=3),
            ),
        ]
        one_dtype_here(cases[first:], dtype, dtypes=dtypes)
    cases.append(
        Case(
            f"grad_in_place N{ROWS} H32 V300 bf16 mean, class_weight, z-loss",
            check_grad_in_place,
            dict(n=ROWS, h=32, v=300, dtype=torch.bfloat16, weighted=True, lse_square_scale=1e-2),
        )
    )
    cases.append(
        Case(
            "grad_in_place N1024 H2048 V32000 bf16",
            check_grad_in_place,
            dict(n=1024, h=2048, v=32000, dtype=torch.bfloat16),
            gpu_only=True,
        )
    )
    cases.append(Case("grad_in_place: where, and where not", check_in_place_rules))
    return cases + [
        Case("logits of 1e4", check_huge),
        Case("one backward", check_one_backward),
        Case("strided target", check_strided_target),
        Case("target out of range: ValueError", check_bad_target),
        Case("targets 0, V - 1 and ignore_index pass", check_edge_targets),
        Case("CUDA-graph capture: no check, NaN rows", check_graph_capture, gpu_only=True),
        Case("no grad", check_no_grad),
        Case("operator", check_operator),
        Case("torch.compile training", check_compile),
        Case("bad input", check_errors),
    ]


CASES = _cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("fused_linear_cross_entropy", CASES)
