"""Tests for attention/flash_attention_ops.py against naive_attention computed in fp64:
the forward, the backward (dq, dk, dv) and packed variable-length batches.

    python attention/test_flash_attention.py        (or: pytest attention/test_flash_attention.py)

Error model and tolerance of O: attention/attention_cases.py (p rounded once to the input dtype
before p @ v, O rounded once: a bound for each element from the fp64 probabilities). Beside that
bound, the 2x rule: our error must be at most twice that of PyTorch's same-dtype attention
(scores, softmax and p @ v each in the input dtype, as flash-attention's own tests build their
comparison).

Gradients: flash-attention's own rule. Each of dq, dk, dv may be off the fp64 reference by at
most twice the largest error of PyTorch's same-dtype attention backward, plus one rounding of the
largest gradient (u * max|ref|). The kernels round P and dS to the input dtype before their
products, as PyTorch's same-dtype path rounds P, dP and dS: the errors are of one kind.

Packed batches (flash_attention_varlen) must equal a loop of the padded kernel over the sequences,
bit for bit, in both passes (the same kernels on the same numbers, the launch config forced to one).

Sliding windows and logit softcapping (mask_cases): the same rules against the reference with the
window and the cap, for O, LSE and both backward schedules; block bounds swept where an off-by-one
would show (SWEEP_WINDOWS); blocks outside every window filled with NaN, which a kernel that
visited them would carry into its outputs.
"""

import math

import torch
import triton
import triton.language as tl

from llmk.attention.attention_cases import attention_tol as rounding_tol
from llmk.attention.attention_checks import CHECK_SEQLENS_ENV, attention_mask, seqlens_checked
from llmk.attention.attention_paths import (
    forced_path,
    gluon_forward,
)
from llmk.attention.flash_attention_ops import (
    CONFIG_TABLE,
    flash_attention,
    flash_attention_train_op,
    flash_attention_varlen,
    flash_attention_varlen_train_op,
    packed,
    table_config,
)
from llmk.attention.reference_attention import attention_probs, attention_scores, expand_kv, naive_attention
from llmk.attention.triton_flash_attention_bwd import (
    BACKWARD_TABLE,
    INTERPRET_BACKWARD,
    backward_config,
    backward_table_config,
    launch_flash_attention_backward,
    one_pass_when,
)
from llmk.attention.triton_flash_attention_fwd import MAX_GRID_Y, attention_config, launch_flash_attention
from llmk.common.device import DEVICE, INTERPRET
from llmk.common.environment import environment
from llmk.common.triton_utils import TANH_APPROX_REL, tanh_approx
from llmk.devtools.testing import (
    UNIT_ROUNDOFF,
    Case,
    Outcome,
    Skip,
    Tol,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    grads_of,
    interpreter_dtype,
    main,
    opcheck,
    poisoned,
    rand,
)


def attention_tol(q, k, v, causal, sm_scale, window=None, softcap=None):
    """The tolerance of O in q's dtype, from the fp64 probabilities of this problem. With softcap c
    on a GPU, tanh_approx moves each capped score s_ij by at most e = c * TANH_APPROX_REL: each p_ij
    then by a factor within [e^-2e, e^2e], and O_i = sum_j p_ij v_j by at most
    (e^2e - 1) / 2 * (p @ |v| + |O|) more (e to first order). The gradients' rule, twice PyTorch's
    same-dtype error, needs no such term: PyTorch's bf16 or fp16 capped scores are rounded coarser."""
    p = attention_probs(q.double(), k.double(), causal, sm_scale, window, softcap)
    v = expand_kv(v.double(), q.shape[1])
    tol = rounding_tol(q.dtype, p, v, q.shape)
    if softcap and not INTERPRET:
        bound = math.expm1(2 * softcap * TANH_APPROX_REL) / 2 * (p @ v.abs() + (p @ v).abs())
        tol = Tol(tol.atol + bound.reshape(q.shape), tol.rtol, tol.why + "; tanh.approx's error in the capped scores")
    return tol


def same_dtype_attention(q, k, v, causal, sm_scale, window=None, softcap=None):
    """PyTorch's attention with every step in the input dtype: the error the 2x rule allows."""
    scores = attention_scores(q, k, causal, sm_scale, window, softcap, dtype=q.dtype)
    p = torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)
    return torch.matmul(p, expand_kv(v, q.shape[1]))


def make_qkv(b, h, hkv, tq, tk, d, dtype, layout="bhtd", scale=1.0):
    """q (b, h, tq, d), k and v (b, hkv, tk, d). layout "bthd" gives transposed views of (B, T, H, D)
    tensors; "padded" gives views cut from tensors with a wider head dim (token stride > D)."""
    if layout == "bthd":
        q = rand((b, tq, h, d), dtype, scale=scale).transpose(1, 2)
        k, v = (rand((b, tk, hkv, d), dtype).transpose(1, 2) for _ in range(2))
    elif layout == "padded":
        q = rand((b, h, tq, d), dtype, pad=(0, 0, 0, 8), scale=scale)
        k, v = (rand((b, hkv, tk, d), dtype, pad=(0, 1, 0, 8)) for _ in range(2))
    else:
        q = rand((b, h, tq, d), dtype, scale=scale)
        k, v = (rand((b, hkv, tk, d), dtype) for _ in range(2))
    return q, k, v


def compare_o(o, q, k, v, causal, sm_scale, window=None, softcap=None):
    """O of the kernel against the fp64 reference of the same problem, under attention_tol and the
    2x rule of PyTorch's same-dtype attention."""
    mask = dict(window=window, softcap=softcap)
    ref = naive_attention(q.double(), k.double(), v.double(), causal, sm_scale, **mask)
    return compare(
        "O",
        o,
        ref,
        attention_tol(q, k, v, causal, sm_scale, **mask),
        torch_out=same_dtype_attention(q, k, v, causal, sm_scale, **mask),
    )


def kernel_note(outcome, q, k, v, causal, out, lse=None):
    """outcome with the forward kernel that ran (attention/attention_paths.py) added to its note."""
    ran = "gluon" if gluon_forward(q, k, v, causal, out, lse, None, None) else "tl"
    outcome.note = f"{outcome.note}; {ran} forward".lstrip("; ")
    return outcome


def check(
    b, h, hkv, tq, tk, d, dtype, causal, layout="bhtd", sm_scale=None, scale=1.0, window=None, softcap=None, path="tl"
):
    """O against the reference; path "gluon" runs the Gluon forward where it applies
    (attention/attention_paths.py)."""
    q, k, v = make_qkv(b, h, hkv, tq, tk, d, dtype, layout, scale)
    out = poisoned((b, h, tq, d), dtype)
    mask = dict(window=window, softcap=softcap)
    with forced_path(path):
        o = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, out=out, **mask)
        outcomes = [
            kernel_note(
                compare_o(o, q, k, v, causal, 1.0 / math.sqrt(d) if sm_scale is None else sm_scale, **mask),
                q,
                k,
                v,
                causal,
                out,
            )
        ]
        if layout == "bthd":  # without out=, O comes back laid out like q
            o2 = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, **mask)
            outcomes.append(
                Outcome(
                    "O keeps q's layout",
                    o2.stride() == q.stride() and torch.equal(o2, o),
                    note=f"strides {o2.stride()} vs q {q.stride()}",
                )
            )
    return outcomes


def check_matches_blocked():
    """naive and blocked references agree to fp64 rounding on a GQA, Tq != Tk, causal problem."""
    from llmk.attention.reference_blocked_attention import blocked_attention

    q, k, v = make_qkv(2, 4, 2, 37, 70, 32, torch.float64)
    ref = naive_attention(q, k, v, True)
    return [
        compare(
            "blocked vs naive",
            blocked_attention(q, k, v, True, block_size=16),
            ref,
            Tol(1e-12, 1e-12, "fp64 throughout"),
        )
    ]


def check_no_keys():
    """Tk = 0: every query sees nothing, O is zeros (the convention for a query with no key)."""
    q, k, v = make_qkv(1, 2, 2, 5, 0, 64, torch.float16)
    o = flash_attention(q, k, v, out=poisoned((1, 2, 5, 64), torch.float16))
    return [Outcome("zeros", bool((o == 0).all()))]


def check_empty():
    outcomes = []
    for shape_q in ((0, 2, 5, 64), (1, 2, 0, 64)):
        q = rand(shape_q, torch.bfloat16)
        k = v = rand((shape_q[0], 2, 7, 64), torch.bfloat16)
        o = flash_attention(q, k, v, causal=True)
        outcomes.append(Outcome(f"q {shape_q}", o.shape == q.shape and o.dtype == q.dtype))
    return outcomes


def check_errors():
    q, k, v = make_qkv(1, 4, 2, 8, 8, 64, torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("fp32 q", lambda: flash_attention(q.float(), k, v), TypeError, "q"),
        expect_raises("k dtype differs", lambda: flash_attention(q, k.bfloat16(), v), TypeError, "k"),
        expect_raises("3-D q", lambda: flash_attention(q[0], k, v), ValueError, "q"),
        expect_raises(
            "head dim 512",
            lambda: flash_attention(*make_qkv(1, 1, 1, 4, 4, 512, torch.float16)),
            ValueError,
            "head_dim",
        ),
        expect_raises("k head dim", lambda: flash_attention(q, k[..., :32], v), ValueError, "k"),
        expect_raises("v shape", lambda: flash_attention(q, k, v[:, :, :4]), ValueError, "v"),
        expect_raises(
            "heads 4 vs 3",
            lambda: flash_attention(q, *make_qkv(1, 3, 3, 8, 8, 64, torch.float16)[1:]),
            ValueError,
            "head count",
        ),
        expect_raises(
            "batch", lambda: flash_attention(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)), ValueError, "k"
        ),
        expect_raises("sm_scale 0", lambda: flash_attention(q, k, v, sm_scale=0.0), ValueError, "sm_scale"),
        expect_raises(f"q on {other}", lambda: flash_attention(q.to(other), k, v), ValueError, "q"),
        expect_raises("v elsewhere", lambda: flash_attention(q, k, v.to(other)), ValueError, "v"),
        expect_raises("not a tensor", lambda: flash_attention(q, [1.0], v), TypeError, "k"),
        expect_raises("out shape", lambda: flash_attention(q, k, v, out=q[:, :2].clone()), ValueError, "out"),
        expect_raises("causal='no'", lambda: flash_attention(q, k, v, causal="no"), TypeError, "causal"),
        expect_raises("causal=1", lambda: flash_attention(q, k, v, causal=1), TypeError, "causal"),
        expect_raises(
            "deterministic=None", lambda: flash_attention(q, k, v, deterministic=None), TypeError, "deterministic"
        ),
    ]


def check_out_under_grad():
    """out= is forward-only: under grad with an input that requires grad it raises, naming the
    operator and the way to gradients; under torch.no_grad() it writes what a plain call returns."""
    q, k, v = make_qkv(1, 4, 2, 20, 20, 64, torch.float16)
    q_grad = q.clone().requires_grad_()
    with torch.no_grad():
        o = flash_attention(q_grad, k, v, True)
        o_out = flash_attention(q_grad, k, v, True, out=poisoned(q.shape, q.dtype))
    return [
        expect_raises(
            "q requires grad, out=",
            lambda: flash_attention(q_grad, k, v, True, out=torch.empty_like(q)),
            RuntimeError,
            "llmk::flash_attention_out is forward-only",
        ),
        expect_raises(
            "q requires grad, out=: the remedy",
            lambda: flash_attention(q_grad, k, v, True, out=torch.empty_like(q)),
            RuntimeError,
            "call flash_attention without out=",
        ),
        Outcome(
            "under no_grad: as on a plain q, no grad",
            torch.equal(o, flash_attention(q, k, v, True)) and torch.equal(o_out, o) and not o.requires_grad,
        ),
    ]


# ---------------------------------------------------------------------------------------------
# backward

GRAD_ATOL_FLOOR = 1e-5  # dP - delta of a query that sees one key is 0 in fp64, an fp32 residue here


def grad_rule_tol(dtype, want, theirs):
    """flash-attention's rule for a gradient, per element: within twice the largest error of
    PyTorch's same-dtype backward (`theirs`) of the fp64 reference (`want`), plus one rounding of
    the largest gradient."""
    torch_err = (theirs.double() - want).abs().max().item() if want.numel() else 0.0
    atol = 2 * torch_err + UNIT_ROUNDOFF[dtype] * (want.abs().max().item() if want.numel() else 0.0)
    return Tol(atol + GRAD_ATOL_FLOOR, 0.0, "2x PyTorch's same-dtype error + u * max|grad|", rounding_check=False)


def delta_rounding_bounds(q, k, v, do, causal, sm_scale, window=None, softcap=None):
    """(dq, dk) bounds, per element, of the error the backward's delta takes from O rounded to the
    input dtype. The kernels compute delta_i = dO_i . O_i from the stored O, as FlashAttention
    does; PyTorch's same-dtype backward uses P, so the 2x rule alone misses this term. O_id is off
    by at most u |O_id|, so delta_i by e_i = u sum_d |dO_id O_id|, dS_ij = P_ij (dP_ij - delta_i)
    by P_ij e_i, and dq_i = scale sum_j dS_ij k_j by scale e_i (P |k|)_i, dk_j by
    scale (P^T (e |q|))_j (summed over a GQA group). Where a query's probability sits on one key,
    dP_ij - delta_i nearly cancels and this is the whole error (a softcap's tanh' <= 1 keeps the
    bound)."""
    qd, kd, vd = q.double(), expand_kv(k.double(), q.shape[1]), expand_kv(v.double(), q.shape[1])
    p = attention_probs(qd, k.double(), causal, sm_scale, window, softcap)
    err = UNIT_ROUNDOFF[q.dtype] * (do.double().abs() * (p @ vd).abs()).sum(-1, keepdim=True)
    dq = sm_scale * err * (p @ kd.abs())
    dk = sm_scale * (p.transpose(-1, -2) @ (err * qd.abs()))
    b, h, tk, d = dk.shape
    return dq, dk.reshape(b, k.shape[1], h // k.shape[1], tk, d).sum(2)


def grad_tols(dtype, want, theirs, delta_bounds=None):
    """{"q", "k", "v": Tol} of dq, dk, dv: flash-attention's rule (grad_rule_tol) on the fp64
    gradients `want` and PyTorch's same-dtype ones `theirs`, plus delta_bounds
    (delta_rounding_bounds' (dq, dk)) where given."""
    tols = {name: grad_rule_tol(dtype, w, t) for name, w, t in zip("qkv", want, theirs)}
    for name, bound in zip("qk", delta_bounds or ()):
        tol = tols[name]
        tols[name] = Tol(tol.atol + bound, tol.rtol, tol.why + "; delta from the rounded O", rounding_check=False)
    return tols


def attention_grads(label, fn, ref, torch_fn, inputs, grad_outputs, dtype, delta_bounds=None):
    """check_grads of fn (our kernels) on inputs q, k, v under grad_tols."""
    wrt = [0, 1, 2]
    _, want = grads_of(ref, inputs, wrt, grad_outputs, dtype=torch.float64)
    _, theirs = grads_of(torch_fn, inputs, wrt, grad_outputs)
    tols = grad_tols(dtype, want, theirs, delta_bounds)
    return check_grads(
        label,
        fn,
        ref,
        inputs,
        wrt,
        ("q", "k", "v"),
        lambda name, w: tols[name],
        torch_fn=torch_fn,
        grad_outputs=grad_outputs,
    )


def check_backward(
    b,
    h,
    hkv,
    tq,
    tk,
    d,
    dtype,
    causal,
    layout="bhtd",
    sm_scale=None,
    scale=1.0,
    deterministic=False,
    window=None,
    softcap=None,
):
    """dq, dk, dv of flash_attention against autograd through naive_attention in fp64, by the
    default schedule or (deterministic) the two-pass one."""
    q, k, v = make_qkv(b, h, hkv, tq, tk, d, dtype, layout, scale)
    scale_used = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    mask = dict(window=window, softcap=softcap)
    layouts = []

    def ours(q, k, v):
        o = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, deterministic=deterministic, **mask)
        if o.requires_grad:
            layouts.append(o.transpose(1, 2).is_contiguous())
        return o

    do = rand((b, h, tq, d), dtype)
    out = attention_grads(
        "",
        ours,
        lambda q, k, v: naive_attention(q, k, v, causal, scale_used, **mask),
        lambda q, k, v: same_dtype_attention(q, k, v, causal, scale_used, **mask),
        [q, k, v],
        [do],
        dtype,
        delta_rounding_bounds(q, k, v, do, causal, scale_used, **mask),
    )
    # under grad O is stored (B, Tq, H, D), whatever q's layout: the projection reads it in place
    return out + [Outcome("O under grad stored (B, Tq, H, D)", bool(layouts) and all(layouts))]


def attention_and_lse(q, k, v, causal, sm_scale, window=None, softcap=None):
    """q (B, H, Tq, D), k and v (B, Hkv, Tk, D) -> (O (B, H, Tq, D), LSE (B, H, Tq)) with every step in
    the inputs' dtype: fp64 inputs give the reference. A query that sees no key gets LSE -inf (O NaN)."""
    scores = attention_scores(q, k, causal, sm_scale, window, softcap, dtype=q.dtype)
    return torch.matmul(torch.softmax(scores, dim=-1), expand_kv(v, q.shape[1])), torch.logsumexp(scores, dim=-1)


def check_lse_grad(dtype, b=1, tq=40):
    """llmk::flash_attention_train's LSE output is differentiable: a loss on O and LSE gets the
    gradients of both (dLSE enters the backward's delta). Tq not a multiple of 4 over several
    (batch, head) rows: the Gluon backward pads LSE's and delta's rows, and dLSE must follow."""
    q, k, v = make_qkv(b, 4, 2, tq, 50, 64, dtype)
    scale = 1.0 / math.sqrt(64)
    return attention_grads(
        "O and LSE",
        lambda q, k, v: flash_attention_train_op(q, k, v, True, None, None),
        lambda q, k, v: attention_and_lse(q, k, v, True, scale),
        lambda q, k, v: attention_and_lse(q, k, v, True, scale),
        [q, k, v],
        [rand((b, 4, tq, 64), dtype), rand((b, 4, tq), torch.float32)],
        dtype,
    )


def check_unseen_dlse():
    """A query that sees no key (LSE -inf) takes no part in any gradient, whatever its dLSE: inf and
    NaN there give the same dq, dk, dv, bit for bit, as 0 (delta is 0 on such rows, so dS is not
    0 * NaN), on the default schedule and the two-pass one."""
    # window (40, 3): queries 0..26 see no key. In the interpreter two heads over one KV head, still a
    # group of two: its six backward launches cost a program per block of each head
    h, hkv = (2, 1) if INTERPRET else (4, 2)
    q, k, v = make_qkv(1, h, hkv, 90, 60, 64, torch.bfloat16)
    do, mask = rand(q.shape, torch.bfloat16), attention_mask((40, 3), None)
    with torch.no_grad():
        o, lse = flash_attention_train_op(q, k, v, False, None, None, False, 40, 3, 0.0)
    unseen = lse == float("-inf")
    dlse_seen = rand(lse.shape, torch.float32)  # one dLSE; only its unseen rows change
    outcomes = [Outcome("27 queries a head see no key", bool(unseen[..., :27].all() and not unseen[..., 27:].any()))]
    for deterministic in (False, True):
        grads = []
        for fill in (0.0, float("inf"), float("nan")):
            dlse = dlse_seen.masked_fill(unseen, fill)
            got = [poisoned(t.shape, t.dtype) for t in (q, k, v)]
            launch_flash_attention_backward(
                do, q, k, v, o, lse, *got, False, 0.125, dlse, mask=mask, deterministic=deterministic
            )
            grads.append(got)
        for fill, got in zip(("inf", "nan"), grads[1:]):
            outcomes += [
                compare(f"d{name}, dLSE {fill} where no key is seen, deterministic={deterministic}", g, w, EXACT)
                for name, g, w in zip("qkv", got, grads[0])
            ]
    return outcomes


def check_backward_forced(
    config,
    b,
    h,
    hkv,
    tq,
    tk,
    d,
    dtype,
    causal,
    dq_add=None,
    scale=1.0,
    layout="bhtd",
    gluon=(),
    window=None,
    softcap=None,
):
    """The backward launched with `config` (a BACKWARD_TABLE row's two-pass (dk/dv, dq) pair, or
    its one-pass (config, None), adding dq by dq_add; None: the table's) and `gluon`'s kernels in
    Gluon (launch_flash_attention_backward's) into poisoned buffers, under check_backward's
    tolerances (the 2x rule and delta's rounding); scale multiplies q; window and softcap the
    mask's."""
    q, k, v = make_qkv(b, h, hkv, tq, tk, d, dtype, layout, scale=scale)
    do = rand((b, h, tq, d), dtype)
    scale = 1.0 / math.sqrt(d)
    options = dict(window=window, softcap=softcap)
    mask = attention_mask(window, softcap)
    with torch.no_grad():
        o, lse = flash_attention_train_op(
            q, k, v, causal, None, None, False, mask.window_left, mask.window_right, mask.softcap
        )
    got = [poisoned(t.shape, dtype) for t in (q, k, v)]
    launch_flash_attention_backward(
        do, q, k, v, o, lse, *got, causal, scale, config=config, dq_add=dq_add, mask=mask, gluon=gluon
    )
    _, want = grads_of(
        lambda q, k, v: naive_attention(q, k, v, causal, scale, **options),
        [q, k, v],
        [0, 1, 2],
        [do],
        dtype=torch.float64,
    )
    _, theirs = grads_of(
        lambda q, k, v: same_dtype_attention(q, k, v, causal, scale, **options), [q, k, v], [0, 1, 2], [do]
    )
    tols = grad_tols(dtype, want, theirs, delta_rounding_bounds(q, k, v, do, causal, scale, **options))
    return [compare(f"d{name}", g, w, tols[name], torch_out=t) for name, g, w, t in zip("qkv", got, want, theirs)]


def check_deterministic_repeats():
    """deterministic=True: two backward calls on the same inputs give the same bits, on a shape
    where the one-pass schedule's dq would see thousands of atomic adds per row block (GQA, Tk 4097)."""
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 32, 8, 4097, 4097, 128, torch.bfloat16))
    do = rand(q.shape, torch.bfloat16)
    runs = [
        torch.autograd.grad(flash_attention(q, k, v, causal=True, deterministic=True), (q, k, v), do) for _ in range(2)
    ]
    return [Outcome(f"d{name}", torch.equal(a, b)) for name, a, b in zip("qkv", *runs)]


def check_backward_memory():
    """No T x T buffer: fwd + bwd at T = 16384 allocate beyond their inputs less than one head's
    fp32 score matrix (1 GiB) would take; the budget is 4x q, k, v, O, dO and the gradients."""
    b, h, t, d = 1, 4, 16384, 64
    q, k, v = (x.requires_grad_() for x in make_qkv(b, h, h, t, t, d, torch.bfloat16))
    do = rand((b, h, t, d), torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    budget = 4 * 8 * q.numel() * q.element_size()
    return [Outcome("peak extra memory", extra <= budget, note=f"{extra / 2**20:.0f} MiB, budget {budget / 2**20:.0f}")]


# ---------------------------------------------------------------------------------------------
# packed sequences


def cumulative(lengths):
    return torch.tensor([0] + lengths, device=DEVICE).cumsum(0).to(torch.int32)


def check_varlen(
    lengths_q, lengths_k, h, hkv, d, dtype, causal, packed_qkv=False, window=None, softcap=None, scale=1.0
):
    """flash_attention_varlen's O, dq, dk, dv equal a loop of flash_attention over the sequences,
    bit for bit (config forced to one for both; the deterministic backward). packed_qkv: q, k, v
    slices of one (total, 3, H, D) tensor (self-attention, lengths_q == lengths_k). The default
    backward's dk and dv then equal those within dq_order_tol, and its dq within one_pass_dq_tol.
    window, softcap: flash_attention's (per sequence); scale multiplies q, for scores softcap caps."""
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    if packed_qkv:
        q, k, v = rand((total_q, 3, h, d), dtype).unbind(1)
    else:
        q, k, v = (
            rand((total_q, h, d), dtype, scale=scale),
            rand((total_k, hkv, d), dtype),
            rand((total_k, hkv, d), dtype),
        )
    mask = dict(window=window, softcap=softcap)
    do = rand((total_q, h, d), dtype)
    config = attention_config(d, max(lengths_q, default=0))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    varlen_args = (cumulative(lengths_q), cumulative(lengths_k), max(lengths_q, default=0), max(lengths_k, default=0))
    o = flash_attention_varlen(q, k, v, *varlen_args, causal, config=config, deterministic=True, **mask)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    default_grads = torch.autograd.grad(
        flash_attention_varlen(q, k, v, *varlen_args, causal, config=config, **mask), (q, k, v), do
    )
    want = [torch.zeros_like(t) for t in (o, q, k, v)]
    ds_k = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cq, ck = cumulative(lengths_q).tolist(), cumulative(lengths_k).tolist()
    for i in range(len(lengths_q)):
        sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        one = [t.detach()[s].transpose(0, 1).unsqueeze(0).requires_grad_() for t, s in ((q, sq), (k, sk), (v, sk))]
        do_i = do[sq].transpose(0, 1).unsqueeze(0)
        o_i = flash_attention(*one, causal=causal, config=config, deterministic=True, **mask)
        grads = torch.autograd.grad(o_i, one, do_i)
        for w, got, s in zip(want, (o_i, *grads), (sq, sq, sk, sk)):
            w[s] = got[0].transpose(0, 1)
        ds_k[sq] = abs_ds_times_abs_k(*one, do_i, causal, **mask)[0].transpose(0, 1)
    return [compare(name, got, w, EXACT) for name, got, w in zip(("O", "dq", "dk", "dv"), (o, dq, dk, dv), want)] + [
        compare(f"{name}, default backward", got, w, one_pass_dq_tol(w, ds_k) if name == "dq" else dq_order_tol(w))
        for name, got, w in zip(("dq", "dk", "dv"), default_grads, (dq, dk, dv))
    ]


EXACT = Tol(0.0, 0.0, "the same kernels on the same numbers", rounding_check=False)


def dq_order_tol(want):
    """The one-pass backward against the two-pass one: dk and dv may come from other blocks (other
    fp32 summation orders), and dq is each key block's share summed in fp32 in a scheduler's order,
    where the two-pass kernel sums in registers; each value is rounded once to the dtype from fp32
    sums that differ by fp32 residues: one rounding (u * |x|, twice for a tie) apart, plus those
    residues (a few fp32 units of the largest share) where a value is near 0."""
    u = UNIT_ROUNDOFF[want.dtype]
    return Tol(
        1e-5 * (want.abs().max().item() if want.numel() else 0.0),
        2 * u,
        "dq's fp32 adds in a scheduler's order, one rounding",
        rounding_check=False,
    )


def abs_ds_times_abs_k(q, k, v, do, causal, window=None, softcap=None):
    """sm_scale * |dS| @ |k| in fp32, q and do (B, H, Tq, D), k and v (B, Hkv, Tk, D): for each
    value of dq, the sum of the magnitudes of the terms dq adds up (dS = P * (dP - delta)). Under
    softcap the kernels' dS carries a factor 1 - tanh^2 <= 1 more: this bounds it still."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    q, k, v, do = (t.detach().float() for t in (q, k, v, do))
    p = attention_probs(q, k, causal, scale, window, softcap)
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    delta = (do * (p @ v)).sum(-1, keepdim=True)
    # in place: at 32 heads of 3000 tokens each (Tq, Tk) matrix is 1.2 GB
    ds = p.mul_((do @ v.transpose(-1, -2)).sub_(delta)).abs_()
    return (ds @ k.abs()).mul_(scale)


def one_pass_dq_tol(want, ds_k):
    """The one-pass dq against the two-pass one. Beside dq_order_tol's order of adds, the two
    schedules form dS from S in two orientations (k q^T in the dk/dv launch, q k^T in the dq
    launch): S's fp32 values may differ in their last bits, and a value of dS near a midpoint then
    rounds to the input dtype one ulp (at most 2u |dS|) apart. Each such term moves dq by at most
    2u |dS| |k| sm_scale: their sum, ds_k (abs_ds_times_abs_k), bounds it, and it is what
    separates two roundings where dq is a small sum of large terms."""
    order = dq_order_tol(want)
    return Tol(
        order.atol + 2 * UNIT_ROUNDOFF[want.dtype] * ds_k,
        order.rtol,
        "dS's roundings from S in two orientations, fp32 adds in a scheduler's order",
        rounding_check=False,
    )


def check_grid_spill():
    """More (batch, head) pairs than a grid's y extent: the pairs past it go to axis 2. Forced with
    grid_y = 3 on 2 x 4 pairs (3 x 3 programs, one empty): O, LSE and the gradients equal a launch
    that fits, bit for bit by the two-pass backward, up to dq's order of adds by the one-pass one."""
    t = 17 if INTERPRET else 40  # two blocks of the interpreter's 16, the second of one row
    q, k, v = make_qkv(2, 4, 2, t, t, 64, torch.bfloat16)
    do = rand(q.shape, torch.bfloat16)
    scale = 0.125
    outcomes = []
    for grid_y in (MAX_GRID_Y, 3):
        out, lse = poisoned(q.shape, q.dtype), poisoned(q.shape[:3], torch.float32)
        launch_flash_attention(q, k, v, out, True, scale, lse, grid_y=grid_y)
        grads = [poisoned(t.shape, t.dtype) for t in (q, k, v)]
        launch_flash_attention_backward(do, q, k, v, out, lse, *grads, True, scale, deterministic=True, grid_y=grid_y)
        one_pass = [poisoned(t.shape, t.dtype) for t in (q, k, v)]
        launch_flash_attention_backward(
            do, q, k, v, out, lse, *one_pass, True, scale, grid_y=grid_y, config=(INTERPRET_BACKWARD[2], None)
        )
        outcomes.append([out, lse, *grads, *one_pass])
    names = ("O", "LSE", "dq", "dk", "dv", "dq one-pass", "dk one-pass", "dv one-pass")
    return [
        compare(f"{name}, grid_y 3", got, want, EXACT if i < 5 else dq_order_tol(want))
        for i, (name, got, want) in enumerate(zip(names, outcomes[1], outcomes[0]))
    ]


def check_varlen_forward(lengths_q, lengths_k, h, hkv, d, dtype, causal, window=None, softcap=None, path="tl"):
    """flash_attention_varlen_train's O and LSE, on the kernel `path` picks, equal the same kernel's
    dense O and LSE of each sequence bit for bit (the same blocks in the same order: keys past a
    sequence's end, which a packed batch reads from the next sequence, are masked like the zeros a
    dense call reads), and O is within the rounding tolerance of the fp64 reference."""
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q, k, v = rand((total_q, h, d), dtype), rand((total_k, hkv, d), dtype), rand((total_k, hkv, d), dtype)
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    left, right = window or (-1, -1)
    options = (causal, None, None, False, left, right, softcap or 0.0)
    with forced_path(path), torch.no_grad():
        o, lse = flash_attention_varlen_train_op(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), *options)
        ran = (
            "gluon"
            if gluon_forward(
                packed(q), packed(k), packed(v), causal, packed(o), packed(lse), (cu_q, cu_k, max(lengths_q)), None
            )
            else "tl"
        )
        if ran != path:  # the tl kernel's config depends on the longest sequence: not bit for bit
            raise Skip(f"the {path} forward does not run here")
        want_o, want_lse = torch.empty_like(o), torch.empty_like(lse)
        cq, ck = cu_q.tolist(), cu_k.tolist()
        outcomes = []
        for i in range(len(lengths_q)):
            sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
            one = [t[s].transpose(0, 1).unsqueeze(0) for t, s in ((q, sq), (k, sk), (v, sk))]
            o_i, lse_i = flash_attention_train_op(*one, *options)
            want_o[sq], want_lse[:, sq] = o_i[0].transpose(0, 1), lse_i[0]
            if lengths_q[i] and lengths_k[i]:
                outcome = compare_o(o_i, *one, causal, 1.0 / math.sqrt(d), window, softcap)
                outcome.check = f"O of sequence {i} against the reference"
                outcomes.append(outcome)
    return [
        compare(f"O against the dense calls ({ran} forward)", o, want_o, EXACT),
        compare(f"LSE against the dense calls ({ran} forward)", lse, want_lse, EXACT),
    ] + outcomes


def check_varlen_errors():
    q, k, v = rand((10, 4, 64), torch.float16), rand((12, 2, 64), torch.float16), rand((12, 2, 64), torch.float16)
    cq, ck = cumulative([4, 6]), cumulative([5, 7])
    call = flash_attention_varlen
    return [
        expect_raises("4-D q", lambda: call(q[None], k, v, cq, ck, 6, 7), ValueError, "q"),
        expect_raises("k head dim", lambda: call(q, k[..., :32], v, cq, ck, 6, 7), ValueError, "k"),
        expect_raises("v shape", lambda: call(q, k, v[:5], cq, ck, 6, 7), ValueError, "v"),
        expect_raises(
            "heads 4 vs 3",
            lambda: call(q, k[:, :1].expand(-1, 3, -1), v[:, :1].expand(-1, 3, -1), cq, ck, 6, 7),
            ValueError,
            "head count",
        ),
        expect_raises("int64 cu_seqlens_q", lambda: call(q, k, v, cq.long(), ck, 6, 7), TypeError, "cu_seqlens_q"),
        expect_raises("2-D cu_seqlens_k", lambda: call(q, k, v, cq, ck[None], 6, 7), ValueError, "cu_seqlens_k"),
        expect_raises("cu_seqlens lengths differ", lambda: call(q, k, v, cq, ck[:2], 6, 7), ValueError, "cu_seqlens_k"),
        expect_raises("max_seqlen_q -1", lambda: call(q, k, v, cq, ck, -1, 7), TypeError, "max_seqlen_q"),
        expect_raises("max_seqlen_k 7.0", lambda: call(q, k, v, cq, ck, 6, 7.0), TypeError, "max_seqlen_k"),
        expect_raises("fp32 q", lambda: call(q.float(), k, v, cq, ck, 6, 7), TypeError, "q"),
        expect_raises("causal=1", lambda: call(q, k, v, cq, ck, 6, 7, causal=1), TypeError, "causal"),
        expect_raises("sm_scale -1", lambda: call(q, k, v, cq, ck, 6, 7, sm_scale=-1.0), ValueError, "sm_scale"),
    ]


def seqlens_switch(value):
    """LLMK_CHECK_SEQLENS set to value ("1": check cu_seqlens on the GPU too, "0": not) for the
    block."""
    return environment(CHECK_SEQLENS_ENV, value)


def i32(*values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def bad_seqlens():
    """(name, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), what the error names) for
    q of 10 tokens and k, v of 12: bad values a launch must never read through."""
    cq, ck = cumulative([4, 6]), cumulative([5, 7])
    return [
        ("cu_seqlens_q past the end", (i32(0, 4, 50), ck, 6, 7), "cu_seqlens_q[2] = 50"),
        ("cu_seqlens_k past the end mid-way", (cq, i32(0, 40, 12), 6, 7), "cu_seqlens_k[1] = 40"),
        ("cu_seqlens_q decreasing", (i32(0, 6, 4, 10), i32(0, 5, 5, 12), 6, 7), "cu_seqlens_q[2] = 4"),
        ("cu_seqlens_k nonzero start", (cq, i32(2, 5, 12), 6, 7), "cu_seqlens_k[0] = 2"),
        ("cu_seqlens_k negative start", (cq, i32(-3, 5, 12), 6, 7), "cu_seqlens_k[0] = -3"),
        ("cu_seqlens_q ends short of q", (i32(0, 4, 9), ck, 6, 7), "cu_seqlens_q[2] = 9"),
        ("max_seqlen_q too small", (cq, ck, 5, 7), "max_seqlen_q = 5"),
        ("max_seqlen_k too small", (cq, ck, 6, 6), "max_seqlen_k = 6"),
    ]


def check_varlen_value_errors():
    """Bad cu_seqlens values raise ValueError naming the argument, position and value, before any
    launch: through the public function, the operators called directly (forward and backward), and
    a compiled call. Run with LLMK_CHECK_SEQLENS=1, which a GPU needs (the CPU checks always)."""
    q, k, v = rand((10, 4, 64), torch.float16), rand((12, 2, 64), torch.float16), rand((12, 2, 64), torch.float16)
    ops = torch.ops.llmk
    out, lse = torch.empty_like(q), torch.zeros((4, 10), dtype=torch.float32, device=DEVICE)
    outcomes = []
    with seqlens_switch("1"):
        for name, (cu_q, cu_k, max_q, max_k), names in bad_seqlens():
            outcomes.append(
                expect_raises(
                    name, lambda: flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k), ValueError, names
                )
            )
        ((name, (cu_q, cu_k, max_q, max_k), names),) = bad_seqlens()[:1]
        outcomes += [
            expect_raises(
                f"{name}: torch.ops.llmk.flash_attention_varlen",
                lambda: ops.flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, False, None, None),
                ValueError,
                names,
            ),
            expect_raises(
                f"{name}: under grad",
                lambda: flash_attention_varlen(q.clone().requires_grad_(), k, v, cu_q, cu_k, max_q, max_k, causal=True),
                ValueError,
                names,
            ),
            expect_raises(
                f"{name}: torch.ops.llmk.flash_attention_backward",
                lambda: ops.flash_attention_backward(
                    out, q, k, v, out, lse, None, cu_q, cu_k, max_q, max_k, False, None, False
                ),
                ValueError,
                names,
            ),
            expect_raises(
                f"{name}: torch.compile'd call",
                lambda: torch.compile(flash_attention_varlen, fullgraph=True, backend="aot_eager")(
                    q, k, v, cu_q, cu_k, max_q, max_k
                ),
                ValueError,
                names,
            ),
        ]
    return outcomes


def check_seqlens_switch():
    """LLMK_CHECK_SEQLENS: on the CPU the values are always checked, the switch off too; on a GPU
    only with it on (off: nothing waits for the device, a max_seqlen too small goes unnoticed),
    and a CUDA graph captures a call with it on (the check stands aside during the capture)."""
    q, k, v = rand((10, 4, 64), torch.float16), rand((12, 2, 64), torch.float16), rand((12, 2, 64), torch.float16)
    cq, ck = cumulative([4, 6]), cumulative([5, 7])
    small = lambda: flash_attention_varlen(q, k, v, cq, ck, 5, 7)  # noqa: E731 (max_seqlen_q 5 < 6)
    outcomes = [Outcome("CPU tensors: always checked", seqlens_checked(cq.cpu()))]
    with seqlens_switch("1"):
        outcomes.append(expect_raises("switch on: max_seqlen_q too small", small, ValueError, "max_seqlen_q"))
    with seqlens_switch("0"):
        if DEVICE == "cpu":
            outcomes.append(expect_raises("switch off, CPU: still checked", small, ValueError, "max_seqlen_q"))
        else:
            small()  # results undefined but in bounds: the grid is short, no read past a sequence
            outcomes.append(Outcome("switch off, GPU: not checked (no sync)", not seqlens_checked(cq)))
    if DEVICE == "cuda":
        with seqlens_switch("1"):
            want = flash_attention_varlen(q, k, v, cq, ck, 6, 7)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                got = flash_attention_varlen(q, k, v, cq, ck, 6, 7)
            graph.replay()
        outcomes.append(compare("switch on: a CUDA graph captures it", got, want.double(), EXACT))
    return outcomes


def check_varlen_empty():
    """No tokens at all (every length 0), and no sequences (cu_seqlens = [0]): empty O, zero grads."""
    outcomes = []
    for lengths in ([0, 0], []):
        q, k, v = (rand((0, 2, 64), torch.bfloat16).requires_grad_() for _ in range(3))
        cu = cumulative(lengths)
        o = flash_attention_varlen(q, k, v, cu, cu, 0, 0, causal=True)
        grads = torch.autograd.grad(o, (q, k, v), torch.zeros_like(o), allow_unused=True)
        outcomes.append(
            Outcome(
                f"lengths {lengths}",
                o.shape == q.shape and all(g is None or g.shape == t.shape for g, t in zip(grads, (q, k, v))),
            )
        )
    return outcomes


def _cases():
    cases = []

    def add(name, gpu_only=False, **kw):
        cases.append(Case(name, check, kw, gpu_only))

    small = [
        ("B2 H4 T77 D64", dict(b=2, h=4, hkv=4, tq=77, tk=77, d=64)),
        ("GQA 8/2 T100 D128", dict(b=1, h=8, hkv=2, tq=100, tk=100, d=128)),
        ("MQA 4/1 T33 D32", dict(b=2, h=4, hkv=1, tq=33, tk=33, d=32)),
        ("Tq17 Tk77 D96", dict(b=1, h=2, hkv=2, tq=17, tk=77, d=96)),
        ("Tq77 Tk17 D64", dict(b=1, h=2, hkv=1, tq=77, tk=17, d=64)),
        ("T1 D64", dict(b=3, h=2, hkv=2, tq=1, tk=1, d=64)),
        ("Tq1 Tk50 D128", dict(b=2, h=4, hkv=2, tq=1, tk=50, d=128)),
        ("D80 T40", dict(b=1, h=2, hkv=2, tq=40, tk=40, d=80)),
        ("D256 T40", dict(b=1, h=2, hkv=1, tq=40, tk=40, d=256)),
        ("(B,T,H,D) view T50 D64", dict(b=2, h=4, hkv=2, tq=50, tk=50, d=64, layout="bthd")),
        ("padded view Tq30 Tk45 D32", dict(b=1, h=2, hkv=1, tq=30, tk=45, d=32, layout="padded")),
    ]
    for dtype in (torch.float16, torch.bfloat16):
        dt = dtype_name(dtype)
        for causal in (False, True):
            c = "causal" if causal else "full"
            # the interpreter runs each shape full in one dtype and causal in the other (the GPU all four)
            for i, (name, shape) in enumerate(small):
                add(
                    f"{name} {c} {dt}",
                    gpu_only=dtype != interpreter_dtype(i + causal),
                    dtype=dtype,
                    causal=causal,
                    **shape,
                )
        add(f"sm_scale 0.3 T48 D64 {dt}", b=1, h=2, hkv=2, tq=48, tk=48, d=64, dtype=dtype, causal=True, sm_scale=0.3)
        add(f"peaked: q x 30 T64 D64 {dt}", b=1, h=2, hkv=2, tq=64, tk=64, d=64, dtype=dtype, causal=False, scale=30.0)
        # full sizes: every head dim, long sequences, GQA 32/8, a prefill chunk against a longer cache
        for d in (32, 64, 96, 128, 256):
            for causal in (False, True):
                add(
                    f"B2 H8 T1000 D{d} {'causal' if causal else 'full'} {dt}",
                    gpu_only=True,
                    b=2,
                    h=8,
                    hkv=8,
                    tq=1000,
                    tk=1000,
                    d=d,
                    dtype=dtype,
                    causal=causal,
                )
        add(
            f"GQA 32/8 T4096 D128 causal {dt}",
            gpu_only=True,
            b=1,
            h=32,
            hkv=8,
            tq=4096,
            tk=4096,
            d=128,
            dtype=dtype,
            causal=True,
        )
        add(
            f"Tq1000 Tk4097 D128 causal {dt}",
            gpu_only=True,
            b=1,
            h=8,
            hkv=2,
            tq=1000,
            tk=4097,
            d=128,
            dtype=dtype,
            causal=True,
        )
        add(
            f"(B,T,H,D) view T2048 D128 full {dt}",
            gpu_only=True,
            b=2,
            h=16,
            hkv=4,
            tq=2048,
            tk=2048,
            d=128,
            dtype=dtype,
            causal=False,
            layout="bthd",
        )
        # more (batch, head) pairs than a grid's y extent (the tl kernel spills them onto axis 2)
        add(
            f"B2100 H32 T24 D64 causal: {2100 * 32} (batch, head) pairs {dt}",
            gpu_only=True,
            b=2100,
            h=32,
            hkv=8,
            tq=24,
            tk=24,
            d=64,
            dtype=dtype,
            causal=True,
        )
    cases += [
        Case("references agree", check_matches_blocked),
        Case("no keys", check_no_keys),
        Case("empty input", check_empty),
        Case("bad input", check_errors),
        Case("out= under grad (forward-only)", check_out_under_grad),
    ]
    return cases


CASES = _cases()


def check_forced(config, b, h, hkv, tq, tk, d, dtype, causal):
    """check()'s comparison with the launch forced to `config`, a CONFIG_TABLE row: the interpreter
    otherwise runs INTERPRET_CONFIG only."""
    q, k, v = make_qkv(b, h, hkv, tq, tk, d, dtype)
    o = flash_attention(q, k, v, causal=causal, out=poisoned((b, h, tq, d), dtype), config=config)
    return [compare_o(o, q, k, v, causal, 1.0 / math.sqrt(d))]


def forced_cases():
    """Each CONFIG_TABLE row on a short sequence (several q and key blocks of the row's size, a
    ragged last one) at the row's largest head dim, full and causal, fp16 and bf16."""
    cases = []
    for i, (max_dim, config) in enumerate(dict.fromkeys((row[0], tuple(row[3:])) for row in CONFIG_TABLE)):
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                name = f"forced {config} T150 D{max_dim} {'causal' if causal else 'full'} {dtype_name(dtype)}"
                # the interpreter: each row full in one dtype, causal in the other
                cases.append(
                    Case(
                        name,
                        check_forced,
                        dict(config=config, b=1, h=2, hkv=1, tq=150, tk=150, d=max_dim, dtype=dtype, causal=causal),
                        gpu_only=dtype != interpreter_dtype(i + causal),
                    )
                )
    return cases


def check_table_rows():
    """Every CONFIG_TABLE row is forced by a case, and table_config routes each row's head dims
    and lengths to it: a row added to the table without a forced case fails here."""
    forced = {(c.kwargs["d"], c.kwargs["config"]) for c in CASES if c.fn is check_forced}
    missing = [row for row in CONFIG_TABLE if (row[0], tuple(row[3:])) not in forced]
    routed = all(
        table_config(max_dim, max_tq or 4096, windowed) == tuple(config)
        for max_dim, max_tq, windowed, *config in CONFIG_TABLE
    )
    return [
        Outcome("every CONFIG_TABLE row forced", not missing, note=f"not forced: {missing}" if missing else ""),
        Outcome("table_config picks each row", routed),
    ]


CASES += forced_cases() + [Case("every launch-table row forced", check_table_rows)]


def backward_cases():
    """Gradients: every layout, GQA/MQA, Tq != Tk both ways, one query, odd head dims, in both
    lanes; full sizes (T 1000 at every head dim, 4097, GQA 32/8 at 4096) on the GPU only."""
    cases = []

    def add(name, gpu_only=False, **kw):
        cases.append(Case(f"backward {name}", check_backward, kw, gpu_only))

    small = [
        ("B1 H2 T77 D64", dict(b=1, h=2, hkv=2, tq=77, tk=77, d=64)),
        ("GQA 4/2 T50 D128", dict(b=1, h=4, hkv=2, tq=50, tk=50, d=128)),
        ("Tq17 Tk77 D96", dict(b=1, h=2, hkv=2, tq=17, tk=77, d=96)),
        ("(B,T,H,D) view T40 D64", dict(b=2, h=2, hkv=1, tq=40, tk=40, d=64, layout="bthd")),
    ]
    for dtype in (torch.float16, torch.bfloat16):
        dt = dtype_name(dtype)
        for causal in (False, True):
            c = "causal" if causal else "full"
            # the interpreter runs each shape full in one dtype and causal in the other (the GPU all four)
            for i, (name, shape) in enumerate(small):
                add(
                    f"{name} {c} {dt}",
                    gpu_only=dtype != interpreter_dtype(i + causal),
                    dtype=dtype,
                    causal=causal,
                    **shape,
                )
            for d in (32, 64, 96, 128, 256):
                add(
                    f"B2 H8 T1000 D{d} {c} {dt}",
                    gpu_only=True,
                    b=2,
                    h=8,
                    hkv=8,
                    tq=1000,
                    tk=1000,
                    d=d,
                    dtype=dtype,
                    causal=causal,
                )
            add(
                f"GQA 32/8 T4097 D128 {c} {dt}",
                gpu_only=True,
                b=1,
                h=32,
                hkv=8,
                tq=4097,
                tk=4097,
                d=128,
                dtype=dtype,
                causal=causal,
            )
            add(
                f"MQA 8/1 T4097 D64 {c} {dt}",
                gpu_only=True,
                b=1,
                h=8,
                hkv=1,
                tq=4097,
                tk=4097,
                d=64,
                dtype=dtype,
                causal=causal,
            )
        add(
            f"Tq1000 Tk4097 D128 causal {dt}",
            gpu_only=True,
            b=1,
            h=8,
            hkv=2,
            tq=1000,
            tk=4097,
            d=128,
            dtype=dtype,
            causal=True,
        )
        add(
            f"(B,T,H,D) view T2048 D128 full {dt}",
            gpu_only=True,
            b=2,
            h=16,
            hkv=4,
            tq=2048,
            tk=2048,
            d=128,
            dtype=dtype,
            causal=False,
            layout="bthd",
        )
        # more (batch, head) pairs than a grid's y extent (the tl kernel spills them onto axis 2)
        add(
            f"B2100 H32 T24 D64 causal: {2100 * 32} (batch, head) pairs {dt}",
            gpu_only=True,
            b=2100,
            h=32,
            hkv=8,
            tq=24,
            tk=24,
            d=64,
            dtype=dtype,
            causal=True,
        )
    bf16 = torch.bfloat16
    for causal in (False, True):
        c = "causal" if causal else "full"
        # in the interpreter MQA and D256 causal, T1 and the padded view full, Tq77 Tk17 both (its causal
        # mask leaves 60 queries no key): a head count, head dim or layout meets the causal mask's
        # blocks no differently from the small shapes above, which run both
        add(
            f"MQA 4/1 T33 D32 {c} bf16",
            gpu_only=not causal,
            b=1,
            h=4,
            hkv=1,
            tq=33,
            tk=33,
            d=32,
            dtype=bf16,
            causal=causal,
        )
        add(f"Tq77 Tk17 D64 {c} bf16", b=1, h=2, hkv=1, tq=77, tk=17, d=64, dtype=bf16, causal=causal)
        add(f"T1 D64 {c} bf16", gpu_only=causal, b=3, h=2, hkv=2, tq=1, tk=1, d=64, dtype=bf16, causal=causal)
        add(f"D256 T40 {c} bf16", gpu_only=not causal, b=1, h=2, hkv=1, tq=40, tk=40, d=256, dtype=bf16, causal=causal)
        add(
            f"padded view Tq30 Tk45 D80 {c} bf16",
            gpu_only=causal,
            b=1,
            h=2,
            hkv=1,
            tq=30,
            tk=45,
            d=80,
            dtype=bf16,
            causal=causal,
            layout="padded",
        )
    add(
        "sm_scale 0.3 T48 D64 fp16", b=1, h=2, hkv=2, tq=48, tk=48, d=64, dtype=torch.float16, causal=True, sm_scale=0.3
    )
    add("peaked: q x 30 T64 D64 bf16", b=1, h=2, hkv=2, tq=64, tk=64, d=64, dtype=bf16, causal=False, scale=30.0)
    # the two-pass schedule (deterministic=True): the default runs the one-pass one wherever
    # BACKWARD_TABLE has it, and always in the interpreter
    for causal in (False, True):
        c = "causal" if causal else "full"
        for dtype in (torch.float16, bf16):  # the interpreter: full in fp16, causal in bf16
            add(
                f"deterministic GQA 4/2 Tq50 Tk77 D128 {c} {dtype_name(dtype)}",
                b=1,
                h=4,
                hkv=2,
                tq=50,
                tk=77,
                d=128,
                dtype=dtype,
                causal=causal,
                deterministic=True,
                gpu_only=dtype != interpreter_dtype(causal),
            )
        add(
            f"deterministic (B,T,H,D) view T40 D64 {c} bf16",
            b=2,
            h=2,
            hkv=1,
            tq=40,
            tk=40,
            d=64,
            dtype=bf16,
            causal=causal,
            layout="bthd",
            deterministic=True,
        )
        add(
            f"deterministic Tq77 Tk17 D96 {c} bf16",
            b=1,
            h=2,
            hkv=1,
            tq=77,
            tk=17,
            d=96,
            dtype=bf16,
            causal=causal,
            deterministic=True,
        )
        for d in (64, 128, 256):
            add(
                f"deterministic GQA 32/8 T1000 D{d} {c} bf16",
                gpu_only=True,
                b=1,
                h=32,
                hkv=8,
                tq=1000,
                tk=1000,
                d=d,
                dtype=bf16,
                causal=causal,
                deterministic=True,
            )
    # bf16's B1 Tq40 on the GPU only: the B2 Tq37 case runs bf16 in the interpreter
    cases += [
        Case(f"LSE gradient {dtype_name(dt)}", check_lse_grad, dict(dtype=dt), gpu_only=dt == bf16)
        for dt in (torch.float16, bf16)
    ]
    cases.append(Case("LSE gradient bf16 B2 Tq37", check_lse_grad, dict(dtype=bf16, b=2, tq=37)))
    cases.append(Case("dLSE non-finite where no key is seen", check_unseen_dlse))
    # one head in the interpreter, where every head multiplies the programs; the GPU's two share a KV
    # head (the dk/dv launch's loop over a group, which the GQA cases above run at the interpreter's blocks)
    forced_heads = 1 if INTERPRET else 2
    for config, max_dim in forced_backward_configs():
        # the one-pass schedule by both adds: TMA reductions on the GPU only (the interpreter has none)
        adds = [None] if config[1] is not None else [("atomics", False), ("tma", True)]
        for causal in (False, True):
            for add in adds:
                name = f"two-pass {config[0]} {config[1]}" if add is None else f"one-pass {config[0]} {add[0]}"
                cases.append(
                    Case(
                        f"backward forced {name} T150 D{max_dim} {'causal' if causal else 'full'} bf16",
                        check_backward_forced,
                        dict(
                            config=config,
                            b=1,
                            h=forced_heads,
                            hkv=1,
                            tq=150,
                            tk=150,
                            d=max_dim,
                            dtype=bf16,
                            causal=causal,
                            dq_add=None if add is None else add[0],
                        ),
                        gpu_only=add is not None and add[1],
                    )
                )
    # flash-attn's test_flash_attn_bwd_overflow inputs (there q x 5 and k x 3; here q x 15): scores
    # of size ~15, so a query's LSE can be very negative and a key row past the end (k = 0) would
    # give P = 2^-lse2 past fp16's range, dS = inf and dq's product inf x 0 = NaN; the dk/dv kernel
    # caps P's exponent at 0. One and two keys, so every key block runs past the end. The interpreter
    # runs half of them, each (T, D), (T, schedule) and (D, schedule) pair still once
    for t in (1, 2):
        for j, d in enumerate((16, 32, 64)):
            for deterministic in (False, True):
                cases.append(
                    Case(
                        f"backward{' deterministic' if deterministic else ''} overflow inputs (q x 15) "
                        f"B2 H5 T{t} D{d} full fp16",
                        check_backward,
                        dict(
                            b=2,
                            h=5,
                            hkv=5,
                            tq=t,
                            tk=t,
                            d=d,
                            dtype=torch.float16,
                            causal=False,
                            scale=15.0,
                            deterministic=deterministic,
                        ),
                        gpu_only=(t + j + deterministic) % 2 == 1,
                    )
                )
    for config, max_dim in forced_backward_configs():
        dq_add = "atomics" if config[1] is None else None  # the one-pass schedule's add in both lanes
        name = f"two-pass {config[0]} {config[1]}" if dq_add is None else f"one-pass {config[0]} {dq_add}"
        cases.append(
            Case(
                f"backward forced {name} overflow inputs (q x 15) T2 D{max_dim} full fp16",
                check_backward_forced,
                dict(
                    config=config,
                    b=2,
                    h=5,
                    hkv=5,
                    tq=2,
                    tk=2,
                    d=max_dim,
                    dtype=torch.float16,
                    causal=False,
                    dq_add=dq_add,
                    scale=15.0,
                ),
            )
        )
    cases.append(Case("deterministic backward: the same bits twice", check_deterministic_repeats, gpu_only=True))
    cases.append(Case("backward memory O(T): T16384 causal", check_backward_memory, gpu_only=True))
    return cases


def forced_backward_configs():
    """(config, head dim) of each launch BACKWARD_TABLE holds: every row's two-pass (dk/dv, dq)
    pair and, where it has one, its one-pass (config, None)."""
    for max_dim, dkdv, dq, one_pass in BACKWARD_TABLE:
        yield (dkdv, dq), max_dim
        if one_pass is not None:
            yield (one_pass, None), max_dim


def check_backward_table():
    """Every BACKWARD_TABLE launch is forced by a case, backward_table_config routes each row's
    head dim to it, deterministic=True always takes the two-pass schedule, and the default the
    one-pass one only with TMA reductions and no GQA."""
    forced = {c.kwargs["config"] for c in CASES if c.fn is check_backward_forced}
    missing = [config for config, _ in forced_backward_configs() if config not in forced]
    routed = all(backward_table_config(max_dim) == tuple(configs) for max_dim, *configs in BACKWARD_TABLE)
    two_pass = all(
        backward_config(d, True, group, tma)[1] is not None
        for d in (32, 64, 128, 256)
        for group in (1, 4)
        for tma in (False, True)
    )
    rule = one_pass_when(1, True) and not one_pass_when(4, True) and not one_pass_when(1, False)
    return [
        Outcome("every BACKWARD_TABLE row forced", not missing, note=f"not forced: {missing}" if missing else ""),
        Outcome("backward_table_config picks each row", routed),
        Outcome("deterministic: two-pass at every head dim", two_pass),
        Outcome("one-pass only with TMA and no GQA", rule),
    ]


def varlen_cases():
    """Packed batches: ragged lengths with 0 and 1, Tq != Tk per sequence, GQA/MQA, a packed qkv
    tensor's slices; long mixed lengths on the GPU."""
    # backward_cases' overflow inputs, packed (D64 on the GPU only: the interpreter's D16 takes the same path)
    cases = [
        Case(
            f"varlen overflow inputs (q x 15) [1,2,1,2] D{d} full fp16",
            check_varlen,
            dict(
                lengths_q=[1, 2, 1, 2],
                lengths_k=[1, 2, 1, 2],
                h=5,
                hkv=5,
                d=d,
                dtype=torch.float16,
                causal=False,
                scale=15.0,
            ),
            gpu_only=d == 64,
        )
        for d in (16, 64)
    ]
    for dtype in (torch.float16, torch.bfloat16):
        dt = dtype_name(dtype)
        for causal in (False, True):
            c = "causal" if causal else "full"
            cases += [
                Case(
                    f"varlen [5,0,1,37,20] GQA 4/2 D64 {c} {dt}",
                    check_varlen,
                    dict(
                        lengths_q=[5, 0, 1, 37, 20],
                        lengths_k=[5, 0, 1, 37, 20],
                        h=4,
                        hkv=2,
                        d=64,
                        dtype=dtype,
                        causal=causal,
                    ),
                    gpu_only=dtype == torch.float16,
                ),
                # the interpreter: full in fp16, causal in bf16
                Case(
                    f"varlen Tq != Tk [3,20,1,0] vs [9,4,0,7] MQA D32 {c} {dt}",
                    check_varlen,
                    dict(lengths_q=[3, 20, 1, 0], lengths_k=[9, 4, 0, 7], h=2, hkv=1, d=32, dtype=dtype, causal=causal),
                    gpu_only=dtype != interpreter_dtype(causal),
                ),
                Case(
                    f"varlen packed qkv [17,33] D80 {c} {dt}",
                    check_varlen,
                    dict(
                        lengths_q=[17, 33],
                        lengths_k=[17, 33],
                        h=2,
                        hkv=2,
                        d=80,
                        dtype=dtype,
                        causal=causal,
                        packed_qkv=True,
                    ),
                    gpu_only=dtype == torch.float16,
                ),
                Case(
                    f"varlen 16 mixed 1..3000 GQA 32/8 D128 {c} {dt}",
                    check_varlen,
                    dict(
                        lengths_q=LONG_LENGTHS, lengths_k=LONG_LENGTHS, h=32, hkv=8, d=128, dtype=dtype, causal=causal
                    ),
                    gpu_only=True,
                ),
                # no GQA: the default backward takes the one-pass schedule on Hopper
                Case(
                    f"varlen 16 mixed 1..3000 MHA 8/8 D128 {c} {dt}",
                    check_varlen,
                    dict(lengths_q=LONG_LENGTHS, lengths_k=LONG_LENGTHS, h=8, hkv=8, d=128, dtype=dtype, causal=causal),
                    gpu_only=True,
                ),
            ]
    return cases + [
        Case("varlen bad input", check_varlen_errors),
        Case("varlen bad cu_seqlens values", check_varlen_value_errors),
        Case("varlen LLMK_CHECK_SEQLENS switch", check_seqlens_switch),
        Case("varlen empty", check_varlen_empty),
        Case("(batch, head) pairs past the grid's y extent", check_grid_spill),
    ]


def varlen_gluon_cases():
    """Packed forwards on the Gluon path (GPU only; attention/test_gluon_attention.py runs them)."""
    cases = []
    for d, hkv, mask in ((64, 2, {}), (128, 1, {}), (128, 2, dict(window=(256, 0))), (64, 2, dict(softcap=30.0))):
        for causal in (False, True):
            c = "causal" if causal else "full"
            kw = dict(h=4, hkv=hkv, d=d, causal=causal, path="gluon", **mask)
            named = f"D{d} {4 // hkv}:1 {c}{''.join(f' {k} {v}' for k, v in mask.items())}"
            cases += [
                Case(
                    f"varlen forward [5,0,1,37,200] {named} fp16 [gluon forward]",
                    check_varlen_forward,
                    dict(kw, lengths_q=[5, 0, 1, 37, 200], lengths_k=[5, 0, 1, 37, 200], dtype=torch.float16),
                    gpu_only=True,
                ),
                Case(
                    f"varlen forward Tq != Tk [3,200,1,0] vs [9,4,0,300] {named} bf16 [gluon forward]",
                    check_varlen_forward,
                    dict(kw, lengths_q=[3, 200, 1, 0], lengths_k=[9, 4, 0, 300], dtype=torch.bfloat16),
                    gpu_only=True,
                ),
                Case(
                    f"varlen forward 16 mixed 1..4096 {named} bf16 [gluon forward]",
                    check_varlen_forward,
                    dict(kw, lengths_q=LONG_LENGTHS, lengths_k=LONG_LENGTHS, dtype=torch.bfloat16),
                    gpu_only=True,
                ),
            ]
    return cases


LONG_LENGTHS = [1, 3000, 77, 0, 1024, 513, 2048, 5, 1500, 128, 999, 2, 4096, 64, 700, 1]

CASES += backward_cases()
CASES += [Case("every backward-table row forced", check_backward_table)] + varlen_cases()


# ---------------------------------------------------------------------------------------------
# sliding windows and logit softcapping

# LSE in fp32 against the fp64 logsumexp of the same inputs' scores: each score is an fp32 dot
# product (a few fp32 units of sum |q_d k_d| * sm_scale) and, capped, c * tanh by exp2 (an fp32
# unit of 1, times c); then m + log2(l) in fp32. 1e-4 + 1e-5 |LSE| sits 10-20x above what the
# interpreter shows for |s| up to ~100. On a GPU the cap's tanh is tanh.approx: each capped score,
# and so the LSE, may be off by c * TANH_APPROX_REL more (lse_tol).
LSE_TOL = Tol(1e-4, 1e-5, "fp32 scores (and tanh by exp2), fp32 log-sum-exp", rounding_check=False)


def lse_tol(softcap):
    if not softcap or INTERPRET:
        return LSE_TOL
    return Tol(
        LSE_TOL.atol + softcap * TANH_APPROX_REL,
        LSE_TOL.rtol,
        "fp32 scores capped by tanh.approx, fp32 log-sum-exp",
        rounding_check=False,
    )


def check_window_one_loop(causal, window, d, dtype):
    """launch_flash_attention(window_split=False), the sweeps' alternative (one loop, every block
    masked), under the forward's rules: a sweep's figures must come from a correct kernel."""
    q, k, v = make_qkv(1, 4, 2, 77, 77, d, dtype)
    scale = 1.0 / math.sqrt(d)
    out = poisoned(q.shape, dtype)
    launch_flash_attention(q, k, v, out, causal, scale, mask=attention_mask(window), window_split=False)
    return [compare_o(out, q, k, v, causal, scale, window)]


@triton.jit
def _tanh_approx_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tanh_approx(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


def check_tanh_approx():
    """The bounds above rest on tanh_approx's error: on a GPU (tanh.approx.f32) within
    TANH_APPROX_REL of |tanh x|, in the interpreter (tanh by exp2) within 2^-22, over fp32 x from
    1e-6 to 20 in magnitude, and 0."""
    x = torch.cat(
        [
            torch.linspace(-20.0, 20.0, 200001),
            torch.logspace(-6, 1, 20001),
            -torch.logspace(-6, 1, 20001),
            torch.zeros(1),
        ]
    ).to(DEVICE)
    y = torch.full_like(x, float("nan"))
    _tanh_approx_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    want = torch.tanh(x.double())
    err = (y.double() - want).abs()
    if INTERPRET:
        return [
            Outcome("tanh by exp2: |error| <= 2^-22", bool((err <= 2.0**-22).all()), note=f"max {err.max().item():.3g}")
        ]
    rel = (err / want.abs().clamp_min(1e-30)).max().item()
    return [
        Outcome(
            "tanh.approx.f32: relative error <= TANH_APPROX_REL",
            bool((err <= TANH_APPROX_REL * want.abs()).all()),
            note=f"max {rel:.3g} vs {TANH_APPROX_REL:.3g}",
        )
    ]


def check_lse(b, h, hkv, tq, tk, d, dtype, causal, window=None, softcap=None, scale=1.0, path="tl"):
    """The forward's LSE (llmk::flash_attention_train's second output) against the fp64
    logsumexp of the capped, masked scores: -inf where a query sees no key."""
    q, k, v = make_qkv(b, h, hkv, tq, tk, d, dtype, scale=scale)
    left, right = window or (-1, -1)
    with forced_path(path), torch.no_grad():
        out, lse = flash_attention_train_op(q, k, v, causal, None, None, False, left, right, softcap or 0.0)
        _, ref = attention_and_lse(q.double(), k.double(), v.double(), causal, None, window, softcap)
        return [kernel_note(compare("LSE", lse, ref, lse_tol(softcap)), q, k, v, causal, out, lse)]


def check_window_skips(causal, window, deterministic):
    """Blocks outside every pair of the window are not visited: one query against 80 keys (its
    window cuts keys 0..63, four whole 16-key blocks, NaN here) for the forward and dq, and one key
    against 80 queries (queries 0..63 NaN, and their dO) for dk and dv. A kernel that read a NaN
    block, masked or not, would carry the NaN into p @ v or dS^T q."""
    dtype, d = torch.bfloat16, 32
    outcomes = []
    for tq, tk, poison in ((1, 80, "kv"), (80, 1, "q")):
        q, k, v = make_qkv(1, 2, 1, tq, tk, d, dtype)
        do = rand(q.shape, dtype)
        if poison == "kv":
            k[:, :, :64], v[:, :, :64] = float("nan"), float("nan")
        else:
            q[:, :, :64], do[:, :, :64] = float("nan"), float("nan")
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        o = flash_attention(q, k, v, causal=causal, window=window, deterministic=deterministic)
        grads = torch.autograd.grad(o, (q, k, v), do)
        if poison == "kv":  # what the query sees: keys 64.. (no NaN); dk, dv of keys it sees
            seen = slice(64, None)
            ref = naive_attention(
                *(t.detach().double()[:, :, seen] if i else t.detach().double() for i, t in enumerate((q, k, v))),
                causal,
                None,
                window,
            )
            outcomes.append(
                compare(
                    "O, keys 0..63 NaN",
                    o,
                    ref,
                    attention_tol(q.detach(), k.detach()[:, :, seen], v.detach()[:, :, seen], causal, None, window),
                )
            )
            outcomes.append(
                Outcome(
                    "dq, dk, dv of the seen keys finite",
                    bool(
                        grads[0].isfinite().all()
                        and grads[1][:, :, seen].isfinite().all()
                        and grads[2][:, :, seen].isfinite().all()
                    ),
                )
            )
        else:
            outcomes.append(Outcome("O of queries 64.. finite", bool(o[:, :, 64:].isfinite().all())))
            outcomes.append(
                Outcome(
                    "dk, dv finite (queries 0..63 NaN), dq of 64.. finite",
                    bool(
                        grads[1].isfinite().all() and grads[2].isfinite().all() and grads[0][:, :, 64:].isfinite().all()
                    ),
                )
            )
    return outcomes


# Each block bound (window_key_range's lo, unmasked_lo, unmasked_hi, hi; window_query_range's) is an
# i' -/+ left or right rounded to 16 (the interpreter's blocks): one off by one shows only where
# that sum sits at a multiple of 16 or beside one. With Tq = Tk (i' = i), sides of 0, 1, 14, 15,
# 16 and 17 put each bound there for some block. Causal, Tq45 Tk61 (i' = i + 16): left sides only.
SWEEP_WINDOWS = ((0, 1), (1, 0), (14, 15), (15, 14), (16, 17), (17, 16))
SWEEP_CAUSAL_WINDOWS = ((0, 0), (1, 0), (14, 0), (15, 0), (17, 0))


def check_mask_errors():
    """window and softcap checked before any launch, each error naming its argument."""
    q, k, v = make_qkv(1, 2, 2, 8, 8, 32, torch.float16)
    cu = cumulative([8])
    dense, varlen = (
        flash_attention,
        lambda **kw: flash_attention_varlen(
            q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 8, 8, **kw
        ),
    )
    bad = [
        ("window 3", dict(window=3), TypeError, "window"),
        ("window (1, 2, 3)", dict(window=(1, 2, 3)), TypeError, "window"),
        ("window (-2, 0)", dict(window=(-2, 0)), ValueError, "window"),
        ("window (1.0, 2)", dict(window=(1.0, 2)), TypeError, "window"),
        ("window (True, 0)", dict(window=(True, 0)), TypeError, "window"),
        ("softcap -1", dict(softcap=-1.0), ValueError, "softcap"),
        ("softcap nan", dict(softcap=float("nan")), ValueError, "softcap"),
        ("softcap inf", dict(softcap=float("inf")), ValueError, "softcap"),
        ("softcap '5'", dict(softcap="5"), TypeError, "softcap"),
    ]
    return (
        [expect_raises(f"{name}", lambda kw=kw: dense(q, k, v, **kw), exc, arg) for name, kw, exc, arg in bad]
        + [expect_raises(f"varlen {name}", lambda kw=kw: varlen(**kw), exc, arg) for name, kw, exc, arg in bad[::3]]
        + [
            expect_raises(
                "op window_left -3",
                lambda: flash_attention_train_op(q, k, v, False, None, None, False, -3),
                ValueError,
                "window_left",
            )
        ]
    )


def check_mask_defaults():
    """window=(-1, -1), softcap=0.0 and None are today's attention, bit for bit; so is a window that
    no key reaches past (left >= Tk, right >= Tq), and (-1, 0) is the causal mask."""
    q, k, v = make_qkv(1, 2, 1, 40, 50, 64, torch.bfloat16)
    full, causal = flash_attention(q, k, v), flash_attention(q, k, v, causal=True)
    return [
        Outcome(
            "window (-1, -1), softcap 0.0", torch.equal(flash_attention(q, k, v, window=(-1, -1), softcap=0.0), full)
        ),
        Outcome("window (50, 40)", torch.equal(flash_attention(q, k, v, window=(50, 40)), full)),
        Outcome("window (-1, 0) = causal", torch.equal(flash_attention(q, k, v, window=(-1, 0)), causal)),
        Outcome("causal, window (-1, 7)", torch.equal(flash_attention(q, k, v, causal=True, window=(-1, 7)), causal)),
    ]


def check_mask_opcheck():
    """The operators with a window and a softcap through torch.library.opcheck (schema, autograd
    registration, fake tensors, AOT dispatch): the options travel by name to the backward."""
    # in the interpreter two heads over one KV head, still a group of two: opcheck's dozens of calls
    # cost a program per block of each head
    h, hkv = (2, 1) if INTERPRET else (4, 2)
    q, k, v = (t.requires_grad_() for t in make_qkv(1, h, hkv, 20, 30, 32, torch.float16, scale=5.0))
    lengths = [7, 0, 13]
    cu = cumulative(lengths)
    qp, kp, vp = (rand((20, heads, 32), torch.float16).requires_grad_() for heads in (h, hkv, hkv))
    mask = (5, 0, 5.0)
    ops = torch.ops.llmk
    return [
        opcheck("flash_attention", ops.flash_attention.default, (q, k, v, True, None, None, *mask)),
        opcheck(
            "flash_attention_train", ops.flash_attention_train.default, (q, k, v, False, 0.2, None, True, 3, 4, 5.0)
        ),
        opcheck(
            "flash_attention_varlen",
            ops.flash_attention_varlen.default,
            (qp, kp, vp, cu, cu, 13, 13, True, None, None, *mask),
        ),
        opcheck(
            "flash_attention_varlen_train",
            ops.flash_attention_varlen_train.default,
            (qp, kp, vp, cu, cu, 13, 13, False, None, None, False, 2, 3, 0.0),
        ),
    ]


def mask_cases():
    """Windows (narrower than a block, spanning several, one-sided, queries that see no key, Tq != Tk)
    and softcaps (scores scaled so that capping matters), and both: O and LSE, and the gradients
    by both schedules (the interpreter's default is the one-pass one). Packed batches equal the
    padded kernel's loop; a T4096 window and a 256-wide softcap on the GPU."""
    cases = []
    problems = [  # name, shape (b, h, hkv, tq, tk, d), causal, window, softcap, q scale, layout
        ("window (4, 0) causal T77 D64", (1, 2, 2, 77, 77, 64), True, (4, 0), None, 1.0, "bhtd"),
        ("window (3, 5) GQA 4/2 Tq50 Tk77 D32", (1, 4, 2, 50, 77, 32), False, (3, 5), None, 1.0, "bhtd"),
        ("window (-1, 2) T64 D64", (1, 2, 2, 64, 64, 64), False, (-1, 2), None, 1.0, "bhtd"),
        ("window (40, 0) causal T100 D32", (1, 2, 1, 100, 100, 32), True, (40, 0), None, 1.0, "bhtd"),
        # i' = i - 30: queries 0..26 see no key
        (
            "window (40, 3) Tq90 Tk60 D32 (no key for 27 queries)",
            (1, 2, 2, 90, 60, 32),
            False,
            (40, 3),
            None,
            1.0,
            "bhtd",
        ),
        ("softcap 5: q x 5 T64 D64", (1, 2, 2, 64, 64, 64), False, None, 5.0, 5.0, "bhtd"),
        ("softcap 50: q x 30 causal T48 D128", (1, 2, 1, 48, 48, 128), True, None, 50.0, 30.0, "bhtd"),
        (
            "window (24, 0) causal softcap 20: q x 10 GQA 4/2 Tq50 Tk77 D64",
            (1, 4, 2, 50, 77, 64),
            True,
            (24, 0),
            20.0,
            10.0,
            "bhtd",
        ),
        (
            "window (5, 7) softcap 5: q x 5 (B,T,H,D) view T40 D32",
            (2, 2, 1, 40, 40, 32),
            False,
            (5, 7),
            5.0,
            5.0,
            "bthd",
        ),
    ]
    for i, (name, (b, h, hkv, tq, tk, d), causal, window, softcap, scale, layout) in enumerate(problems):
        dtype = (torch.float16, torch.bfloat16)[i % 2]
        shape = dict(
            b=b,
            h=h,
            hkv=hkv,
            tq=tq,
            tk=tk,
            d=d,
            dtype=dtype,
            causal=causal,
            window=window,
            softcap=softcap,
            scale=scale,
        )
        dt = dtype_name(dtype)
        cases.append(Case(f"{name} {dt}", check, dict(shape, layout=layout)))
        cases.append(Case(f"LSE {name} {dt}", check_lse, shape))
        for deterministic in (False, True):
            cases.append(
                Case(
                    f"backward{' deterministic' if deterministic else ''} {name} {dt}",
                    check_backward,
                    dict(shape, layout=layout, deterministic=deterministic),
                )
            )
    bf16 = torch.bfloat16
    # the block bounds' off-by-ones: one head of D16 over three blocks (T48), O and both backward schedules.
    # In the interpreter the backward by the two-pass schedule alone: its dk/dv launch walks the query
    # blocks the one-pass schedule's does (one loop, where the one-pass schedule also adds dq's shares,
    # which the windowed problems above check), and its dq launch adds the key blocks' bounds
    sweep = [(window, 48, 48, False) for window in SWEEP_WINDOWS] + [
        (window, 45, 61, True) for window in SWEEP_CAUSAL_WINDOWS
    ]
    for window, tq, tk, causal in sweep:
        name = f"window sweep {window}{' causal' if causal else ''} Tq{tq} Tk{tk} D16 bf16"
        shape = dict(b=1, h=1, hkv=1, tq=tq, tk=tk, d=16, dtype=bf16, causal=causal, sm_scale=0.25, window=window)
        cases.append(Case(name, check, shape))
        for deterministic in (False, True):
            cases.append(
                Case(
                    f"backward{' deterministic' if deterministic else ''} {name}",
                    check_backward,
                    dict(shape, deterministic=deterministic),
                    gpu_only=not deterministic,
                )
            )
    for causal, window in ((True, (10, 0)), (False, (4, 8))):
        for deterministic in (False, True):
            cases.append(
                Case(
                    f"window {window}{' causal' if causal else ''}: blocks outside it not visited"
                    f"{' (deterministic)' if deterministic else ''}",
                    check_window_skips,
                    dict(causal=causal, window=window, deterministic=deterministic),
                )
            )
    cases += [
        Case(
            "varlen window (4, 0) causal [5,0,1,37,20] GQA 4/2 D64 fp16",
            check_varlen,
            dict(
                lengths_q=[5, 0, 1, 37, 20],
                lengths_k=[5, 0, 1, 37, 20],
                h=4,
                hkv=2,
                d=64,
                dtype=torch.float16,
                causal=True,
                window=(4, 0),
            ),
        ),
        Case(
            "varlen Tq != Tk [3,20,1,0] vs [9,4,0,7] window (3, 2) softcap 5: q x 5 MQA D32 bf16",
            check_varlen,
            dict(
                lengths_q=[3, 20, 1, 0],
                lengths_k=[9, 4, 0, 7],
                h=2,
                hkv=1,
                d=32,
                dtype=bf16,
                causal=False,
                window=(3, 2),
                softcap=5.0,
                scale=5.0,
            ),
        ),
        Case(
            "varlen 16 mixed 1..3000 window (512, 0) causal softcap 50 GQA 32/8 D128 bf16",
            check_varlen,
            dict(
                lengths_q=LONG_LENGTHS,
                lengths_k=LONG_LENGTHS,
                h=32,
                hkv=8,
                d=128,
                dtype=bf16,
                causal=True,
                window=(512, 0),
                softcap=50.0,
                scale=10.0,
            ),
            gpu_only=True,
        ),
        Case("tanh_approx: the softcap's tanh within its bound", check_tanh_approx),
        Case(
            "window (4, 0) causal, one masked loop D64 bf16",
            check_window_one_loop,
            dict(causal=True, window=(4, 0), d=64, dtype=bf16),
        ),
        Case(
            "window (20, 30), one masked loop D32 fp16",
            check_window_one_loop,
            dict(causal=False, window=(20, 30), d=32, dtype=torch.float16),
        ),
        Case("window and softcap: bad input", check_mask_errors),
        Case("window and softcap off: today's bits", check_mask_defaults),
        Case("window and softcap: operators' opcheck", check_mask_opcheck),
    ]
    # full sizes on the GPU: Mistral's window over a 4096 context, Gemma 2's softcap at head dim 256
    for dtype in (torch.float16, bf16):
        dt = dtype_name(dtype)
        big = [
            (
                "window (1024, 0) causal GQA 32/8 T4096 D128",
                dict(b=1, h=32, hkv=8, tq=4096, tk=4096, d=128, causal=True, window=(1024, 0)),
            ),
            (
                "softcap 50: q x 30 causal B2 H8 T1000 D256",
                dict(b=2, h=8, hkv=4, tq=1000, tk=1000, d=256, causal=True, softcap=50.0, scale=30.0),
            ),
            (
                "window (255, 0) causal softcap 50: q x 30 Tq1000 Tk4097 D128",
                dict(b=1, h=8, hkv=2, tq=1000, tk=4097, d=128, causal=True, window=(255, 0), softcap=50.0, scale=30.0),
            ),
        ]
        for name, kw in big:
            cases.append(Case(f"{name} {dt}", check, dict(kw, dtype=dtype), gpu_only=True))
            for deterministic in (False, True):
                cases.append(
                    Case(
                        f"backward{' deterministic' if deterministic else ''} {name} {dt}",
                        check_backward,
                        dict(kw, dtype=dtype, deterministic=deterministic),
                        gpu_only=True,
                    )
                )
    return cases


CASES += mask_cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("flash_attention", CASES)
