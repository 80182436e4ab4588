"""Tests for moe/triton_moe_routing.py: moe_route against moe/reference_moe.py's route_ref (fp64),
its gradient against autograd through the reference, and moe_permute against permute_ref.

    python moe/test_moe_routing.py        (or: pytest moe/test_moe_routing.py)

ids must equal the reference's exactly: the choice reads the logits, and equal logits go in expert
order on both sides (cases with many equal logits check it). weights are fp32 softmax or sigmoid
values against fp64: an exp, a sum over at most MAX_EXPERTS terms and a division, each a few fp32
ulps, so WEIGHT_TOL's rtol of 2^-16 leaves ~100x room; a weight of the wrong expert, a sum over the
wrong experts or a missing renormalization is off by far more. Outputs are launched into buffers
poisoned with NaN weights and ids of -1.
"""

import torch

from llmk.common.device import DEVICE
from llmk.devtools.testing import (
    EXACT,
    Case,
    Outcome,
    Tol,
    compare,
    dtype_name,
    expect_raises,
    main,
    opcheck,
    poisoned,
    rand,
)
from llmk.moe.reference_moe import permute_ref, route_ref
from llmk.moe.triton_moe_routing import (
    MAX_EXPERTS,
    MAX_TOP_K,
    launch_moe_route,
    moe_permute,
    moe_route,
    moe_route_op,
)

WEIGHT_TOL = Tol(1e-7, 2**-16, "fp32 exp, sum and division against fp64: a few ulps", rounding_check=False)
# the gradient: fp32 products and sums of the weights against fp64, then one rounding to the
# logits' dtype (fp32: a few ulps)
GRAD_TOL = {
    torch.float32: Tol(1e-6, 2**-16, "fp32 formula against fp64 autograd", rounding_check=False),
    torch.bfloat16: Tol(1e-6, 2**-8 + 2**-16, "fp32 formula, one rounding to bf16", rounding_check=False),
    torch.float16: Tol(1e-6, 2**-11 + 2**-16, "fp32 formula, one rounding to fp16", rounding_check=False),
}


def logits_of(t, e, dtype, strided=False, ties=False):
    """(T, E) router logits: normal, or with ties only 4 distinct values; strided: a column-major
    view (stride (1, T))."""
    x = torch.randint(0, 4, (t, e), device=DEVICE).float() if ties else torch.randn(t, e, device=DEVICE)
    x = x.to(dtype)
    return x.t().contiguous().t() if strided else x


def check_route(t, e, k, dtype, scoring="softmax", renormalize=True, strided=False, ties=False, nan_row=None):
    logits = logits_of(t, e, dtype, strided, ties)
    if nan_row is not None:
        logits[nan_row, e // 2] = float("nan")
    w, ids = poisoned((t, k), torch.float32), torch.full((t, k), -1, dtype=torch.int32, device=DEVICE)
    launch_moe_route(logits, k, scoring, renormalize, w, ids)
    want_w, want_ids = route_ref(logits, k, scoring, renormalize)
    w2, ids2 = moe_route(logits, k, scoring, renormalize)
    rows = torch.arange(t, device=DEVICE) != (-1 if nan_row is None else nan_row)  # the reference sorts NaN first
    outcomes = [
        Outcome(
            "ids = reference's",
            torch.equal(ids.long()[rows], want_ids[rows]),
            note=f"{int((ids.long()[rows] != want_ids[rows]).sum())}/{ids[rows].numel()} differ",
        ),
        compare("weights", w[rows], want_w[rows], WEIGHT_TOL),
        compare("weights, moe_route", w2, w, EXACT),
        Outcome("ids, moe_route", torch.equal(ids2, ids)),
    ]
    if nan_row is not None:  # never the NaN's expert; softmax weights NaN, as torch.softmax gives them
        nan_ids = ids[nan_row]
        ok = bool(((nan_ids >= 0) & (nan_ids < e) & (nan_ids != e // 2)).all()) and bool(w[nan_row].isnan().all())
        outcomes.append(
            Outcome(
                "NaN row: ids in range, not the NaN's, weights NaN",
                ok,
                note=f"{nan_ids.tolist()} {w[nan_row].tolist()}",
            )
        )
    return outcomes


def check_route_grad(t, e, k, dtype, scoring, renormalize):
    """d logits through the weights against autograd through route_ref (fp64, the choice fixed)."""
    logits = logits_of(t, e, dtype).requires_grad_()
    w, _ = moe_route(logits, k, scoring, renormalize)
    g = rand((t, k), torch.float32)
    (got,) = torch.autograd.grad(w, logits, g)
    ref_logits = logits.detach().double().requires_grad_()
    want_w, _ = route_ref(ref_logits, k, scoring, renormalize)
    (want,) = torch.autograd.grad(want_w, ref_logits, g.double())
    return [compare("d logits", got, want, GRAD_TOL[dtype])]


def check_permute(t, e, k, one_expert=False):
    """moe_permute against permute_ref on moe_route's ids (or every token on expert e - 1)."""
    _, ids = moe_route(rand((t, e), torch.float32), k)
    if one_expert:
        ids = torch.full_like(ids, e - 1)
    order, counts, offsets = moe_permute(ids, e)
    want = permute_ref(ids, e)
    return [
        Outcome("order", torch.equal(order.cpu(), want[0])),
        Outcome("counts", torch.equal(counts.cpu(), want[1])),
        Outcome("offsets", torch.equal(offsets.cpu(), want[2])),
        Outcome("experts with no token", int((counts == 0).sum()) >= (e - 1 if one_expert else 0)),
    ]


def check_edges():
    """No tokens: empty outputs; top_k = E; one expert; opcheck with the logits requiring grad."""
    outcomes = []
    w, ids = moe_route(rand((0, 16), torch.bfloat16), 2)
    outcomes.append(Outcome("T = 0", tuple(w.shape) == (0, 2) and tuple(ids.shape) == (0, 2)))
    order, counts, offsets = moe_permute(ids, 16)
    outcomes.append(
        Outcome(
            "permute of no tokens", order.numel() == 0 and bool((counts == 0).all()) and tuple(offsets.shape) == (17,)
        )
    )
    x = rand((5, 6), torch.float32)
    w, ids = moe_route(x, 6, renormalize=False)
    outcomes.append(
        compare("top_k = E, softmax: the weights sum to 1", w.sum(-1), torch.ones(5, device=DEVICE), WEIGHT_TOL)
    )
    w, ids = moe_route(rand((3, 1), torch.float16), 1, "sigmoid", False)
    outcomes.append(Outcome("one expert", bool((ids == 0).all()) and bool((w > 0).all() & (w < 1).all())))
    outcomes.append(
        opcheck(
            "opcheck llmk::moe_route",
            moe_route_op.overload,
            (rand((7, 12), torch.float32).requires_grad_(), 3, "softmax", True),
        )
    )
    return outcomes


def check_errors():
    x = rand((4, 8), torch.bfloat16)
    ids = torch.zeros(4, 2, dtype=torch.int32, device=DEVICE)
    return [
        expect_raises("top_k > E", lambda: moe_route(x, 9), ValueError, "top_k"),
        expect_raises("top_k 0", lambda: moe_route(x, 0), ValueError, "top_k"),
        expect_raises(
            f"top_k > MAX_TOP_K ({MAX_TOP_K})",
            lambda: moe_route(rand((2, 128), torch.float32), MAX_TOP_K + 1),
            ValueError,
            "top_k",
        ),
        expect_raises("top_k True", lambda: moe_route(x, True), ValueError, "top_k"),
        expect_raises("scoring", lambda: moe_route(x, 2, "relu"), ValueError, "scoring"),
        expect_raises("renormalize 1", lambda: moe_route(x, 2, "softmax", 1), TypeError, "renormalize"),
        expect_raises("3-D logits", lambda: moe_route(x[None], 2), ValueError, "logits"),
        expect_raises("int logits", lambda: moe_route(x.to(torch.int32), 2), TypeError, "logits"),
        expect_raises(
            f"E > {MAX_EXPERTS}", lambda: moe_route(rand((2, MAX_EXPERTS + 1), torch.float32), 2), ValueError, "experts"
        ),
        expect_raises("permute: float ids", lambda: moe_permute(ids.float(), 8), TypeError, "ids"),
        expect_raises("permute: n_experts 0", lambda: moe_permute(ids, 0), ValueError, "n_experts"),
        expect_raises("permute: 1-D ids", lambda: moe_permute(ids[0], 8), ValueError, "ids"),
    ] + (
        [expect_raises("permute: id past n_experts (CPU)", lambda: moe_permute(ids + 8, 8), ValueError, "ids")]
        if DEVICE == "cpu"
        else []
    )


def cases():
    out = []

    def add(name, fn, gpu_only=False, **kw):
        out.append(Case(name, fn, kw, gpu_only))

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        dt = dtype_name(dtype)
        add(f"Qwen3 E128 top8 softmax renormalized T37 {dt}", check_route, t=37, e=128, k=8, dtype=dtype)
        add(f"Mixtral E8 top2 T50 {dt}", check_route, t=50, e=8, k=2, dtype=dtype)
        add(
            f"E60 top4 softmax T9 column-major {dt}",
            check_route,
            t=9,
            e=60,
            k=4,
            dtype=dtype,
            renormalize=False,
            strided=True,
        )
        add(f"E256 top8 sigmoid renormalized T11 {dt}", check_route, t=11, e=256, k=8, dtype=dtype, scoring="sigmoid")
        add(f"E64 top6 ties (4 distinct logits) T21 {dt}", check_route, t=21, e=64, k=6, dtype=dtype, ties=True)
    add(
        "E64 top6 sigmoid ties T21 bf16",
        check_route,
        t=21,
        e=64,
        k=6,
        dtype=torch.bfloat16,
        scoring="sigmoid",
        renormalize=False,
        ties=True,
    )
    add("E32 top4 a NaN logit T6", check_route, t=6, e=32, k=4, dtype=torch.float32, nan_row=3)
    add(f"E{MAX_EXPERTS} top16 T5", check_route, t=5, e=MAX_EXPERTS, k=16, dtype=torch.float32)
    for scoring in ("softmax", "sigmoid"):
        for renormalize in (True, False):
            for dtype in (torch.float32, torch.bfloat16):
                add(
                    f"d logits {scoring}{' renormalized' if renormalize else ''} E48 top5 {dtype_name(dtype)}",
                    check_route_grad,
                    t=13,
                    e=48,
                    k=5,
                    dtype=dtype,
                    scoring=scoring,
                    renormalize=renormalize,
                )
    add("permute E128 top8 T37", check_permute, t=37, e=128, k=8)
    add("permute E8 top2 T50: every token on one expert", check_permute, t=50, e=8, k=2, one_expert=True)
    add("edges, opcheck", check_edges)
    add("bad input", check_errors)
    add("Qwen3 E128 top8 T16384", check_route, True, t=16384, e=128, k=8, dtype=torch.bfloat16)
    add("permute E128 top8 T16384", check_permute, True, t=16384, e=128, k=8)
    return out


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("moe routing", CASES)
