"""Tests for losses/triton_cross_entropy.py against the fp64 reference (losses/reference_losses.py) and against
PyTorch's own F.cross_entropy on the same-dtype logits.

    python losses/test_cross_entropy.py        (or: pytest losses/test_cross_entropy.py)

Error model. The kernel's math is fp32: a row's LSE carries an absolute error of a few fp32 ulps of
its size (|LSE| <= max|x| + log V), which moves the row's loss by as much and every probability
p = exp(x - LSE) by that much relatively. Then one rounding to the logits' dtype. So:
- loss (a row's, or the mean): atol LSE_ULPS * u32 * (max|x| + log V + 1), plus n * that for "sum";
  rtol: one rounding of the dtype (u);
- dlogits = g * (p - targets): atol |g| * LSE_ULPS * u32 * (max|x| + log V + 1), rtol u.
Beside these, the 2x rule: our error at most twice PyTorch's same-dtype error plus the atol.
"""

import math

import torch
import torch.nn.functional as F

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
    main,
    rand,
)
from llmk.losses.loss_cases import IGNORE, bad_target_message, make_class_weight, make_target, target_of, with_hits
from llmk.losses.reference_losses import cross_entropy_ref, token_accuracy_ref, z_loss_ref
from llmk.losses.triton_cross_entropy import cross_entropy, cross_entropy_backward_op, cross_entropy_op

LSE_ULPS = 8  # the online max/sum over BLOCK_V chunks and exp2's error: a few fp32 ulps of |LSE|


def torch_ce(
    logits,
    target,
    ignore_index=IGNORE,
    reduction="mean",
    label_smoothing=0.0,
    weight=None,
    lse_square_scale=0.0,
    softcap=None,
):
    """PyTorch on the same-dtype logits (class dimension last): F.cross_entropy of the capped
    logits, plus the z-loss of their logsumexp, all in the logits' dtype."""
    x = logits.reshape(-1, logits.shape[-1])
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    t = target.reshape(-1).long()
    loss = F.cross_entropy(
        x,
        t,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
        weight=None if weight is None else weight.to(x.dtype),
    )
    if lse_square_scale:
        kept = t != ignore_index
        z = lse_square_scale * torch.where(kept, torch.logsumexp(x, -1).square(), 0.0)
        loss = loss + (z if reduction == "none" else z.sum() / kept.sum() if reduction == "mean" else z.sum())
    return loss.reshape(target.shape) if reduction == "none" else loss


def lse_error(x):
    """The absolute error of an fp32 LSE of rows of x (module docstring)."""
    top = x.detach().abs().max().item() if x.numel() else 0.0
    return LSE_ULPS * UNIT_ROUNDOFF[torch.float32] * (top + math.log(x.shape[-1]) + 1)


def option_factor(x, weight=None, lse_square_scale=0.0):
    """How much the options scale a row's LSE error: its largest class weight, plus the z-loss's
    2 s |LSE| (d(s lse^2) = 2 s lse dlse)."""
    top = (x.detach().abs().max().item() if x.numel() else 0.0) + math.log(x.shape[-1]) + 1
    return (weight.abs().max().item() if weight is not None else 1.0) + 2 * lse_square_scale * top


def loss_tol(x, target, reduction, weight=None, lse_square_scale=0.0):
    atol = (
        lse_error(x)
        * option_factor(x, weight, lse_square_scale)
        * (max(1, target.numel()) if reduction == "sum" else 1)
    )
    return Tol(atol, UNIT_ROUNDOFF[x.dtype], "fp32 LSE error (a few ulps of |LSE|) x the options', one rounding")


def check(
    shape,
    dtype,
    reduction="mean",
    label_smoothing=0.0,
    pad=0,
    scale=3.0,
    ignored=0.25,
    all_ignored=False,
    target_dtype=torch.int64,
    weighted=False,
    lse_square_scale=0.0,
    softcap=None,
    extras=False,
):
    """Loss and dlogits of cross_entropy against the fp64 reference; weighted: class weights;
    extras: the z-loss and token accuracy outputs too."""
    v = shape[-1]
    logits = rand(shape, dtype, pad=(0,) * (len(shape) - 1) + (pad,), scale=scale)
    target = make_target(shape[:-1], v, ignored, all_ignored).to(target_dtype)
    if extras:  # half the rows hit: an accuracy of all 0 or all 1 fails
        target = with_hits(target, logits)
    weight = make_class_weight(v) if weighted else None
    options = dict(weight=weight, lse_square_scale=lse_square_scale, softcap=softcap)
    args = (IGNORE, reduction, label_smoothing)
    out = cross_entropy(logits, target, *args, **options, return_z_loss=extras, return_token_accuracy=extras)
    loss = out.loss if extras else out
    ref_options = dict(options, weight=None if weight is None else weight.double())
    ref = cross_entropy_ref(logits.double(), target, *args, **ref_options)
    tol = loss_tol(logits, target, reduction, weight, lse_square_scale)
    outcomes = [compare("loss", loss, ref, tol, torch_out=torch_ce(logits, target, *args, **options))]
    if extras:
        z = z_loss_ref(logits.double(), target, IGNORE, reduction, lse_square_scale, softcap)
        outcomes += [
            compare("z_loss", out.z_loss, z, loss_tol(logits, target, reduction, None, lse_square_scale)),
            compare(
                "token_accuracy",
                out.token_accuracy,
                token_accuracy_ref(logits, target, IGNORE, reduction, softcap).float(),
                EXACT,
            ),
        ]
    if all_ignored and reduction == "mean":
        return (
            outcomes
            + [Outcome("all ignored: NaN loss, as PyTorch", bool(loss.isnan()))]
            + grads_zero(logits, target, label_smoothing)
        )
    kept = target != IGNORE
    count = (weight[target[kept].long()].sum().item() if weighted else int(kept.sum())) or 1
    g_max = option_factor(logits, weight, lse_square_scale) / (count if reduction == "mean" else 1)
    tol = Tol(
        3 * g_max * lse_error(logits),
        UNIT_ROUNDOFF[dtype],
        "fp32 probabilities from an LSE a few ulps off, one rounding",
    )
    return outcomes + check_grads(
        "",
        lambda x: cross_entropy(x, target, *args, **options),
        lambda x: cross_entropy_ref(x, target, *args, **ref_options),
        [logits],
        [0],
        ("logits",),
        tol,
        torch_fn=lambda x: torch_ce(x, target, *args, **options),
    )


def grads_zero(logits, target, label_smoothing):
    """Every target ignored: the gradient is zero, as PyTorch's."""
    x = logits.detach().requires_grad_()
    (g,) = torch.autograd.grad(cross_entropy(x, target, IGNORE, "mean", label_smoothing), x)
    return [Outcome("all ignored: zero gradient", bool((g == 0).all()))]


def compiled_call():
    """cross_entropy compiled with fullgraph=True (the check is in the operator, not traced)."""
    torch._dynamo.reset()
    return torch.compile(
        lambda x, t: cross_entropy(x, t), fullgraph=True, backend="aot_eager" if INTERPRET else "inductor"
    )


def check_bad_target():
    """A target outside [0, V) that is not ignore_index raises a ValueError naming target, the value
    and V, through every entry: each reduction, under grad, with the options, int32 targets, a custom
    ignore_index, the backward operator called on its own, a compiled call; the error is an
    IndexError too (F.cross_entropy's class on the CPU), so callers catching that keep working."""
    logits = rand((3, 10), torch.float32)
    outcomes = [
        expect_raises(
            f"target 10, {reduction}",
            lambda r=reduction: cross_entropy(logits, target_of(1, 10, IGNORE), reduction=r),
            ValueError,
            bad_target_message(10, 10),
        )
        for reduction in ("mean", "sum", "none")
    ]
    calls = [
        ("target -5", lambda: cross_entropy(logits, target_of(-5, 2, 3)), -5, IGNORE),
        (
            "target 10 under grad",
            lambda: cross_entropy(logits.clone().requires_grad_(), target_of(1, 10, 3)),
            10,
            IGNORE,
        ),
        (
            "target 10, weight, z-loss, softcap, extras",
            lambda: cross_entropy(
                logits,
                target_of(1, 10, 3),
                weight=make_class_weight(10),
                lse_square_scale=1e-3,
                softcap=5.0,
                return_z_loss=True,
                return_token_accuracy=True,
            ),
            10,
            IGNORE,
        ),
        ("int32 target 12", lambda: cross_entropy(logits, target_of(1, 12, 3, dtype=torch.int32)), 12, IGNORE),
        ("int32 target -1", lambda: cross_entropy(logits, target_of(-1, 2, 3, dtype=torch.int32)), -1, IGNORE),
        ("-100 with ignore_index 9", lambda: cross_entropy(logits, target_of(9, IGNORE, 3), ignore_index=9), IGNORE, 9),
        (
            "backward operator, target 10",
            lambda: cross_entropy_backward_op(
                torch.ones(3, device=DEVICE),
                None,
                logits,
                target_of(1, 10, 3),
                torch.zeros(3, device=DEVICE),
                IGNORE,
                0.0,
            ),
            10,
            IGNORE,
        ),
    ]
    outcomes += [
        expect_raises(name, fn, ValueError, bad_target_message(value, 10, ignore_index))
        for name, fn, value, ignore_index in calls
    ]
    outcomes.append(
        expect_raises(
            "caught as IndexError",
            lambda: cross_entropy(logits, target_of(1, 10, 3)),
            IndexError,
            bad_target_message(10, 10),
        )
    )
    compiled = compiled_call()
    valid = compiled(logits, target_of(1, 9, 0))
    outcomes.append(Outcome("compiled, valid target: finite loss", bool(valid.isfinite())))
    outcomes.append(
        expect_raises(
            "compiled, target 10", lambda: compiled(logits, target_of(1, 10, 0)), ValueError, bad_target_message(10, 10)
        )
    )
    return outcomes


def check_edge_targets():
    """Targets 0 and V - 1 and ignore_index entries pass the check, whether ignore_index is the
    default, a class inside [0, V) or a value past V: losses as the reference's, in int64 and int32."""
    logits = rand((4, 10), torch.float32)
    outcomes = []
    for ignore_index, values in (
        (IGNORE, (0, 9, IGNORE, 5)),
        (9, (0, 9, 9, 3)),
        (-1, (-1, 0, 9, 4)),
        (10, (10, 0, 9, 2)),
    ):
        for dtype in (torch.int64, torch.int32):
            target = target_of(*values, dtype=dtype)
            loss = cross_entropy(logits, target, ignore_index, "none")
            ref = cross_entropy_ref(logits.double(), target, ignore_index, "none")
            outcomes.append(
                compare(
                    f"ignore_index {ignore_index}, targets {values}, {dtype_name(dtype)}",
                    loss,
                    ref,
                    loss_tol(logits, target, "none"),
                )
            )
    lse = torch.zeros(4, device=DEVICE)
    grad = cross_entropy_backward_op(torch.ones(4, device=DEVICE), None, logits, target_of(0, 9, 9, 3), lse, 9, 0.0)
    outcomes.append(Outcome("backward operator, ignore_index 9: no error", grad.shape == logits.shape))
    return outcomes


def check_backward_operator():
    """torch.library.opcheck of llmk::cross_entropy_backward called on its own, with the target
    check (its default) and without (autograd's call)."""
    logits = rand((6, 300), torch.float32)
    target, lse = make_target((6,), 300), torch.logsumexp(logits, -1)
    outcomes = []
    for extra in ((), (False,)):
        check = f"opcheck, check_target {extra == ()}"
        args = (torch.randn(6, device=DEVICE), None, logits, target, lse, IGNORE, 0.1) + extra
        try:
            torch.library.opcheck(cross_entropy_backward_op.overload, args)
            outcomes.append(Outcome(check, True))
        except Exception as e:
            outcomes.append(Outcome(check, False, note=str(e).split(" (scroll")[0][:150]))
    return outcomes


def check_graph_capture():
    """Under CUDA-graph capture the check cannot run (a host read): the capture succeeds, and a
    replay on targets 10 and -5 gives their rows a NaN loss, the valid row its loss."""
    logits = rand((3, 10), torch.float32)
    target = target_of(1, 2, 3)
    cross_entropy(logits, target, reduction="none")  # compiles the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rows = cross_entropy(logits, target, reduction="none")
    target.copy_(target_of(1, 10, -5))
    graph.replay()
    torch.cuda.synchronize()
    return [
        Outcome(
            "replay, targets 10 and -5: NaN rows, the valid one finite",
            bool(rows[1:].isnan().all() and rows[0].isfinite()),
            note=str(rows.tolist()),
        )
    ]


def check_strided_target():
    """A target that is a strided view (every other entry of a longer one) reads the right entries."""
    logits = rand((6, 300), torch.bfloat16)
    target = make_target((12,), 300)[::2]
    return [
        compare(
            "loss, target[::2]",
            cross_entropy(logits, target),
            cross_entropy_ref(logits.double(), target),
            loss_tol(logits, target, "mean"),
            torch_out=torch_ce(logits, target),
        )
    ]


def check_masked_vocabulary():
    """-inf logits (a masked vocabulary): classes of probability 0, finite loss and gradient, as
    F.cross_entropy; a whole chunk of them (the interpreter's chunks are 128 wide) too."""
    logits = rand((5, 300), torch.float32, scale=3.0)
    logits[:, 10:20] = float("-inf")
    logits[1, :130] = float("-inf")
    target = torch.tensor([3, 200, 50, IGNORE, 299], device=DEVICE)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target, reduction="none")
    (g,) = torch.autograd.grad(loss.sum(), x)
    xr = logits.double().requires_grad_()
    ref = cross_entropy_ref(xr, target, reduction="none")
    (gr,) = torch.autograd.grad(ref.sum(), xr)
    tol = Tol(3 * LSE_ULPS * UNIT_ROUNDOFF[torch.float32] * 20, 1e-5, "fp32, |logits| <= ~15")
    return [
        compare("loss rows", loss, ref, tol),
        compare("dlogits", g, gr, tol),
        Outcome("finite", bool(loss.isfinite().all() and g.isfinite().all())),
    ]


def check_lse_grad():
    """llmk::cross_entropy's LSE output is differentiable: dLSE adds dLSE * p to dlogits."""
    logits = rand((6, 300), torch.float32, scale=3.0)
    target = make_target((6,), 300)

    def ours(x):
        rows, lse, _ = cross_entropy_op(x, target, IGNORE, 0.0)
        return rows, lse

    def ref(x):
        rows = cross_entropy_ref(x, target, IGNORE, "none")
        return rows, torch.logsumexp(x, -1)

    tol = Tol(3 * lse_error(logits), UNIT_ROUNDOFF[torch.float32], "as the loss rows")
    return check_grads("rows and LSE", ours, ref, [logits], [0], ("logits",), tol)


def check_errors():
    x = rand((4, 10), torch.float16)
    t = make_target((4,), 10)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("int logits", lambda: cross_entropy(t.reshape(4, 1), t), TypeError, "logits"),
        expect_raises("float target", lambda: cross_entropy(x, t.float()), TypeError, "target"),
        expect_raises("target shape", lambda: cross_entropy(x, t[:3]), ValueError, "target"),
        expect_raises("V = 0", lambda: cross_entropy(x[:, :0], t), ValueError, "logits"),
        expect_raises("reduction 'avg'", lambda: cross_entropy(x, t, reduction="avg"), ValueError, "reduction"),
        expect_raises(
            "label_smoothing 1.5", lambda: cross_entropy(x, t, label_smoothing=1.5), ValueError, "label_smoothing"
        ),
        expect_raises("ignore_index 1.0", lambda: cross_entropy(x, t, ignore_index=1.0), TypeError, "ignore_index"),
        expect_raises(f"target on {other}", lambda: cross_entropy(x, t.to(other)), ValueError, "target"),
        expect_raises("not a tensor", lambda: cross_entropy([1.0], t), TypeError, "logits"),
        expect_raises("weight (9,)", lambda: cross_entropy(x, t, weight=make_class_weight(9)), ValueError, "weight"),
        expect_raises("int weight", lambda: cross_entropy(x, t, weight=t.new_ones(10)), TypeError, "weight"),
        expect_raises(
            "weight requiring grad",
            lambda: cross_entropy(x, t, weight=make_class_weight(10).requires_grad_()),
            ValueError,
            "weight",
        ),
        expect_raises(
            "lse_square_scale -1", lambda: cross_entropy(x, t, lse_square_scale=-1.0), ValueError, "lse_square_scale"
        ),
        expect_raises("softcap 0", lambda: cross_entropy(x, t, softcap=0.0), ValueError, "softcap"),
        expect_raises("return_z_loss 1", lambda: cross_entropy(x, t, return_z_loss=1), TypeError, "return_z_loss"),
        expect_raises(
            "return_token_accuracy 'yes'",
            lambda: cross_entropy(x, t, return_token_accuracy="yes"),
            TypeError,
            "return_token_accuracy",
        ),
    ]


def check_empty():
    outcomes = []
    for reduction in ("mean", "sum", "none"):
        x = rand((0, 7), torch.bfloat16).requires_grad_()
        loss = cross_entropy(x, torch.zeros(0, dtype=torch.long, device=DEVICE), reduction=reduction)
        want = torch_ce(x.detach().float(), torch.zeros(0, dtype=torch.long, device=DEVICE), reduction=reduction)
        same = loss.shape == want.shape and (bool(loss.isnan()) == bool(want.isnan()) if loss.dim() == 0 else True)
        outcomes.append(Outcome(f"empty, {reduction}: as PyTorch ({want.tolist()})", same))
    return outcomes


def _cases():
    cases = []

    def add(name, gpu_only=False, **kw):
        cases.append(Case(name, check, kw, gpu_only))

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        dt = dtype_name(dtype)
        for reduction in ("mean", "sum", "none"):
            add(f"(7, 300) {dt} {reduction}", shape=(7, 300), dtype=dtype, reduction=reduction)
        add(f"(5, 1000) {dt} label smoothing 0.1", shape=(5, 1000), dtype=dtype, label_smoothing=0.1)
        add(f"(2, 3, 200) {dt} 3-D, none", shape=(2, 3, 200), dtype=dtype, reduction="none")
        # full sizes: vocabularies of real models, rows to 262144, a 16384-token batch
        add(f"(64, 128256) {dt}", gpu_only=True, shape=(64, 128256), dtype=dtype)
        add(f"(16, 262144) {dt} sum", gpu_only=True, shape=(16, 262144), dtype=dtype, reduction="sum")
        add(f"(16384, 4096) {dt} smoothing 0.1", gpu_only=True, shape=(16384, 4096), dtype=dtype, label_smoothing=0.1)
    bf16, fp32 = torch.bfloat16, torch.float32
    add("(1, 700) one row bf16", shape=(1, 700), dtype=bf16, ignored=0.0)
    add("(33, 1) V = 1 fp32", shape=(33, 1), dtype=fp32)
    add("(5, 4097) V not a multiple of the block bf16", shape=(5, 4097), dtype=bf16)
    add("(6, 250) padded rows (strided) fp16", shape=(6, 250), dtype=torch.float16, pad=6)
    add("(9, 300) every target ignored, mean fp32", shape=(9, 300), dtype=fp32, all_ignored=True)
    add("(9, 300) every target ignored, sum bf16", shape=(9, 300), dtype=bf16, reduction="sum", all_ignored=True)
    add("(6, 300) huge logits x 1e4 fp32", shape=(6, 300), dtype=fp32, scale=1e4)
    add("(6, 300) huge logits x 1e4 bf16 none", shape=(6, 300), dtype=bf16, scale=1e4, reduction="none")
    add("(8, 300) int32 target bf16", shape=(8, 300), dtype=bf16, target_dtype=torch.int32)
    add("(8, 300) smoothing 1.0 fp32", shape=(8, 300), dtype=fp32, label_smoothing=1.0)
    # the options: class weights, z-loss, softcap, extra outputs; alone and together, each reduction
    for dtype in (fp32, bf16):
        dt = dtype_name(dtype)
        for reduction in ("mean", "sum", "none"):
            add(f"(7, 300) {dt} {reduction}, weight", shape=(7, 300), dtype=dtype, reduction=reduction, weighted=True)
            add(
                f"(7, 300) {dt} {reduction}, z-loss 1e-2, extras",
                shape=(7, 300),
                dtype=dtype,
                reduction=reduction,
                lse_square_scale=1e-2,
                extras=True,
            )
            add(
                f"(7, 300) {dt} {reduction}, weight, smoothing 0.1, z-loss, softcap 5, extras",
                shape=(7, 300),
                dtype=dtype,
                reduction=reduction,
                weighted=True,
                label_smoothing=0.1,
                lse_square_scale=1e-2,
                softcap=5.0,
                extras=True,
            )
        add(
            f"(5, 1000) {dt} softcap 30, smoothing 0.1", shape=(5, 1000), dtype=dtype, softcap=30.0, label_smoothing=0.1
        )
    add(
        "(6, 250) padded rows fp16, weight, z-loss, extras",
        shape=(6, 250),
        dtype=torch.float16,
        pad=6,
        weighted=True,
        lse_square_scale=1e-3,
        extras=True,
    )
    add(
        "(1, 700) one row bf16, weight, smoothing 0.2, extras",
        shape=(1, 700),
        dtype=bf16,
        ignored=0.0,
        weighted=True,
        label_smoothing=0.2,
        extras=True,
    )
    add(
        "(9, 300) every target ignored, mean fp32, weight, z-loss, extras",
        shape=(9, 300),
        dtype=fp32,
        all_ignored=True,
        weighted=True,
        lse_square_scale=1e-2,
        extras=True,
    )
    add(
        "(2, 3, 200) 3-D bf16 none, weight, z-loss, extras",
        shape=(2, 3, 200),
        dtype=bf16,
        reduction="none",
        weighted=True,
        lse_square_scale=1e-2,
        extras=True,
    )
    for dt, dtype in (("bf16", bf16), ("fp32", fp32)):  # full sizes: Llama 3's and Qwen2's vocabularies
        add(
            f"(4096, 128256) {dt} weight, smoothing 0.1, z-loss 1e-4, extras",
            gpu_only=True,
            shape=(4096, 128256),
            dtype=dtype,
            weighted=True,
            label_smoothing=0.1,
            lse_square_scale=1e-4,
            extras=True,
        )
        add(
            f"(4096, 151936) {dt} sum, z-loss 1e-4, softcap 30, extras",
            gpu_only=True,
            shape=(4096, 151936),
            dtype=dtype,
            reduction="sum",
            lse_square_scale=1e-4,
            softcap=30.0,
            extras=True,
        )
    return cases + [
        Case("target out of range: ValueError", check_bad_target),
        Case("targets 0, V - 1 and ignore_index pass", check_edge_targets),
        Case("CUDA-graph capture: no check, NaN rows", check_graph_capture, gpu_only=True),
        Case("backward operator", check_backward_operator),
        Case("LSE gradient", check_lse_grad),
        Case("strided target", check_strided_target),
        Case("-inf logits", check_masked_vocabulary),
        Case("bad input", check_errors),
        Case("empty input", check_empty),
    ]


CASES = _cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("cross_entropy", CASES)
