"""Tests for attention/triton_rope.py against the fp64 reference and the same-dtype HF-style one.

    python attention/test_rope.py        (or: pytest attention/test_rope.py)

Backward: dq, dk against autograd through the fp64 reference and the same-dtype one (check_grads),
both layouts, GQA, tables whose halves differ, strided q, k and upstream gradients; `out=` stays
forward-only, and a cos or sin that requires grad raises (no gradient for the table).

Partial rotary (a table of R < D columns; odd head dims): Liger's odd and uneven shapes (D 41, D 92
with Hkv > H) and flash-attn's rotary_dim < headdim (R = D/2; D 59 with R 48), forward and
backward, the D - R copied features bit for bit.
"""

import torch

from llmk.attention.reference_rope import apply_rope_ref, rope_cos_sin
from llmk.attention.rope_cases import check_empty, check_huge, check_own_buffer, make_qk, make_table
from llmk.attention.triton_rope import ROPE_TABLE, apply_rope, table_row
from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.testing import (
    TOLERANCES,
    Case,
    Outcome,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    main,
    poisoned,
    rand,
    select_cases,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Sequence lengths of the cases that run on both tiers: the interpreter's cost is a program per tile
# of one or two positions, so it runs shorter ones, still odd (a last tile half full where a tile
# takes two) and still many tiles; a GPU runs the full ones
LONG_T = 257 if INTERPRET else 1000
MID_T = 23 if INTERPRET else 77


def passed_through(rotary_dim, inputs, outputs):
    """Partial rotary: the features past the rotary dim are copied bit for bit (none if R = D)."""
    if rotary_dim is None:
        return []
    same = all(torch.equal(o[..., rotary_dim:], x[..., rotary_dim:]) for x, o in zip(inputs, outputs))
    return [Outcome(f"features {rotary_dim}.. copied", same)]


def check(
    batch,
    heads,
    kv_heads,
    seq_len,
    head_dim,
    dtype,
    interleaved=False,
    layout="T,D",
    kind="rope",
    table_dtype=None,
    strided=None,
    rotary_dim=None,
):
    """rotary_dim: a table of R < D columns (partial rotary), R = D by default."""
    q, k = make_qk(batch, heads, kv_heads, seq_len, head_dim, dtype, strided)
    cos, sin = make_table(batch, seq_len, rotary_dim or head_dim, layout, kind, table_dtype or dtype)
    out = (poisoned(q.shape, dtype), poisoned(k.shape, dtype))
    q_out, k_out = apply_rope(q, k, cos, sin, interleaved, out=out)
    q_ref, k_ref = apply_rope_ref(q.double(), k.double(), cos.double(), sin.double(), interleaved)
    # the HF way in the input dtype (table cast to it, three roundings) bounds our error (2x rule);
    # tolerances: devtools.testing.TOLERANCES, the rule for fp32 math rounded once to the output dtype
    q_torch, k_torch = apply_rope_ref(q, k, cos, sin, interleaved)
    return [
        compare("q", q_out, q_ref, torch_out=q_torch),
        compare("k", k_out, k_ref, torch_out=k_torch),
        *passed_through(rotary_dim, (q, k), (q_out, k_out)),
    ]


def check_properties(dtype=torch.float32):
    """With a true rotation table: every pair keeps its length; interleaved equals the half layout
    on features permuted (x[0::2], x[1::2]) -> (first half, second half) and back."""
    q, k = rand((2, 4, 9, 64), dtype), rand((2, 2, 9, 64), dtype)
    cos, sin = make_table(2, 9, 64, "B,T,D", "rope", torch.float32)
    q_half, _ = apply_rope(q, k, cos, sin)
    q_int, _ = apply_rope(q, k, cos, sin, interleaved=True)

    def pair_norms(x, interleaved):
        a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
        return (a.double() ** 2 + b.double() ** 2).sqrt()

    perm = torch.cat((torch.arange(0, 64, 2), torch.arange(1, 64, 2))).to(DEVICE)
    q_perm_out, _ = apply_rope(q[..., perm], k, cos, sin)
    q_back = torch.empty_like(q_perm_out)
    q_back[..., perm] = q_perm_out
    tol = TOLERANCES[dtype]  # lengths of fp32 results: the fp32 rounding of each element, in fp64
    return [
        compare("half: pair lengths kept", pair_norms(q_half, False), pair_norms(q, False), tol),
        compare("interleaved: pair lengths kept", pair_norms(q_int, True), pair_norms(q, True), tol),
        compare("interleaved == permuted half layout", q_int, q_back.double()),
    ]


def check_errors():
    q, k = rand((2, 4, 6, 64), torch.float16), rand((2, 2, 6, 64), torch.float16)
    cos, sin = make_table(2, 6, 64, "T,D", "rope", torch.float32)
    other = "cpu" if DEVICE == "cuda" else "meta"
    odd_q, odd_k = rand((2, 4, 6, 63), torch.float16), rand((2, 2, 6, 63), torch.float16)
    odd_cos = rand((6, 63), torch.float32)
    wide_cos = rand((6, 66), torch.float32)
    return [
        expect_raises(
            "odd rotary dim (R = D = 63)", lambda: apply_rope(odd_q, odd_k, odd_cos, odd_cos), ValueError, "even"
        ),
        expect_raises(
            "odd rotary dim (R 33 < D)", lambda: apply_rope(q, k, cos[:, :33], sin[:, :33]), ValueError, "rotary dim"
        ),
        expect_raises(
            "rotary dim past D (R 66 > D 64)", lambda: apply_rope(q, k, wide_cos, wide_cos), ValueError, "rotary dim"
        ),
        expect_raises("rotary dim 0", lambda: apply_rope(q, k, cos[:, :0], sin[:, :0]), ValueError, "rotary dim"),
        expect_raises("sin's R != cos's", lambda: apply_rope(q, k, cos[:, :32], sin), ValueError, "sin"),
        expect_raises(
            "D 1025",
            lambda: apply_rope(
                rand((1, 1, 2, 1025), torch.float16), rand((1, 1, 2, 1025), torch.float16), cos[:2], sin[:2]
            ),
            ValueError,
            "1024",
        ),
        expect_raises("q 3 dims", lambda: apply_rope(q[0], k, cos, sin), ValueError, "q"),
        expect_raises("k batch", lambda: apply_rope(q, k[:1], cos, sin), ValueError, "k"),
        expect_raises("k length", lambda: apply_rope(q, k[:, :, :5], cos, sin), ValueError, "k"),
        expect_raises("k head dim", lambda: apply_rope(q, k[..., :32], cos, sin), ValueError, "k"),
        expect_raises("k dtype", lambda: apply_rope(q, k.bfloat16(), cos, sin), TypeError, "k"),
        expect_raises("int q", lambda: apply_rope(q.to(torch.int32), k, cos, sin), TypeError, "q"),
        expect_raises("fp64 q", lambda: apply_rope(q.double(), k.double(), cos, sin), TypeError, "q"),
        expect_raises("cos length", lambda: apply_rope(q, k, cos[:5], sin), ValueError, "cos"),
        expect_raises("sin head dim", lambda: apply_rope(q, k, cos, sin[:, :32]), ValueError, "sin"),
        expect_raises("cos batch 3", lambda: apply_rope(q, k, cos.expand(3, -1, -1), sin), ValueError, "cos"),
        expect_raises("cos 1 dim", lambda: apply_rope(q, k, cos[0], sin), ValueError, "cos"),
        expect_raises("bf16 cos for fp16 q", lambda: apply_rope(q, k, cos.bfloat16(), sin), TypeError, "cos"),
        expect_raises("int sin", lambda: apply_rope(q, k, cos, sin.to(torch.int32)), TypeError, "sin"),
        expect_raises(
            f"q on {other}", lambda: apply_rope(q.to(other), k.to(other), cos.to(other), sin.to(other)), ValueError, "q"
        ),
        expect_raises("k elsewhere", lambda: apply_rope(q, k.to(other), cos, sin), ValueError, "k"),
        expect_raises("cos elsewhere", lambda: apply_rope(q, k, cos.to(other), sin), ValueError, "cos"),
        expect_raises("not a tensor", lambda: apply_rope([1.0], k, cos, sin), TypeError, "q"),
        expect_raises("interleaved not bool", lambda: apply_rope(q, k, cos, sin, "yes"), TypeError, "interleaved"),
        expect_raises("out shape", lambda: apply_rope(q, k, cos, sin, out=(q.clone(), q.clone())), ValueError, "k_out"),
    ]


def check_grad_mode():
    """With out= the call stays forward-only: in grad mode a q that requires grad raises, naming
    the operator; under torch.no_grad() both calls give what they give on a plain q. A table that
    requires grad raises ValueError naming it (no gradient for cos and sin), but not under no_grad."""
    q, k = rand((2, 4, 6, 64), torch.float16), rand((2, 2, 6, 64), torch.float16)
    cos, sin = make_table(2, 6, 64, "T,D", "rope", torch.float32)
    q_grad = q.clone().requires_grad_()
    with torch.no_grad():
        got = apply_rope(q_grad, k, cos, sin)
        got_out = apply_rope(q_grad, k, cos, sin, out=(poisoned(q.shape, q.dtype), poisoned(k.shape, k.dtype)))
        got_table = apply_rope(q, k, cos.clone().requires_grad_(), sin)
    plain = apply_rope(q, k, cos, sin)
    return [
        expect_raises(
            "q requires grad, out=",
            lambda: apply_rope(q_grad, k, cos, sin, out=(q.clone(), k.clone())),
            RuntimeError,
            "llmk::apply_rope_out is forward-only",
        ),
        expect_raises(
            "cos requires grad", lambda: apply_rope(q_grad, k, cos.clone().requires_grad_(), sin), ValueError, "cos"
        ),
        expect_raises(
            "sin requires grad", lambda: apply_rope(q, k, cos, sin.clone().requires_grad_()), ValueError, "sin"
        ),
        Outcome(
            "under no_grad: as on a plain q",
            all(torch.equal(a, b) for a, b in zip(got + got_out + got_table, plain * 3)) and not got[0].requires_grad,
        ),
    ]


def check_grad(
    batch,
    heads,
    kv_heads,
    seq_len,
    head_dim,
    dtype,
    interleaved=False,
    layout="T,D",
    kind="rope",
    strided=None,
    grads_strided=None,
    wrt=(0, 1),
    rotary_dim=None,
):
    """dq, dk against autograd through the fp64 reference and the same-dtype HF-style reference (2x
    rule). The backward is the forward's math (two fp32 products and a sum, one rounding), so the
    forward's tolerances hold. grads_strided "BTHD": dq_out, dk_out as (B, T, H, D) tensors seen as
    (B, H, T, D), the layout an attention backward may hand back. wrt=(0,): k gets no gradient.
    rotary_dim: as check's; the copied features' gradient is the upstream one, bit for bit."""
    q, k = make_qk(batch, heads, kv_heads, seq_len, head_dim, dtype, strided)
    cos, sin = make_table(batch, seq_len, rotary_dim or head_dim, layout, kind, dtype)
    dys = make_qk(batch, heads, kv_heads, seq_len, head_dim, dtype, grads_strided)

    def ours(q, k, cos, sin):
        return apply_rope(q, k, cos, sin, interleaved)

    def ref(q, k, cos, sin):
        return apply_rope_ref(q, k, cos, sin, interleaved)

    outcomes = check_grads(
        "rope",
        ours,
        ref,
        (q, k, cos, sin),
        wrt,
        ("q", "k", "cos", "sin"),
        TOLERANCES[dtype],
        torch_fn=ref,
        grad_outputs=dys,
    )
    if rotary_dim is not None:
        leaves = [t.detach().requires_grad_() for t in (q, k)]
        grads = torch.autograd.grad(ours(*leaves, cos, sin), leaves, dys)
        outcomes += passed_through(rotary_dim, dys, grads)
    return outcomes


def check_grad_empty():
    outcomes = []
    for name, (q_shape, k_shape) in {
        "T = 0": ((2, 4, 0, 64), (2, 2, 0, 64)),
        "B = 0": ((0, 4, 6, 64), (0, 2, 6, 64)),
    }.items():
        q, k = rand(q_shape, torch.bfloat16).requires_grad_(), rand(k_shape, torch.bfloat16).requires_grad_()
        cos, sin = rand(q_shape[2:], torch.float32), rand(q_shape[2:], torch.float32)
        q_out, k_out = apply_rope(q, k, cos, sin)
        dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (torch.empty_like(q_out), torch.empty_like(k_out)))
        outcomes.append(
            Outcome(
                f"{name}: empty dq, dk", dq.shape == q.shape and dk.shape == k.shape and dq.dtype == dk.dtype == q.dtype
            )
        )
    return outcomes


def check_grad_huge():
    """q past 2^31 elements (B1 H32 T524289 D128): dq and dk of the last positions."""
    seq_len = 2**31 // (32 * 128) + 1
    q = rand((1, 32, seq_len, 128), torch.bfloat16).requires_grad_()
    k = rand((1, 1, seq_len, 128), torch.bfloat16).requires_grad_()
    cos, sin = rope_cos_sin(torch.arange(seq_len, device=DEVICE), 128)
    dq_out, dk_out = torch.randn_like(q), torch.randn_like(k)
    dq, dk = torch.autograd.grad(apply_rope(q, k, cos, sin), (q, k), (dq_out, dk_out))
    tail = slice(seq_len - 3, seq_len)
    q_t, k_t = (t[:, :, tail].detach().double().requires_grad_() for t in (q, k))
    want = torch.autograd.grad(
        apply_rope_ref(q_t, k_t, cos[tail].double(), sin[tail].double()),
        (q_t, k_t),
        (dq_out[:, :, tail].double(), dk_out[:, :, tail].double()),
    )
    return [
        compare("dq last positions", dq[:, :, tail], want[0]),
        compare("dk last positions", dk[:, :, tail], want[1]),
    ]


def rope_cases():
    cases = []

    def add(batch, heads, kv_heads, seq_len, head_dim, dtype, gpu_only=False, **extra):
        extra_str = " ".join(f"{k}={dtype_name(v) if isinstance(v, torch.dtype) else v}" for k, v in extra.items())
        name = f"B{batch} H{heads}/{kv_heads} T{seq_len} D{head_dim} {dtype_name(dtype)} {extra_str}".strip()
        cases.append(
            Case(
                name,
                check,
                dict(
                    batch=batch,
                    heads=heads,
                    kv_heads=kv_heads,
                    seq_len=seq_len,
                    head_dim=head_dim,
                    dtype=dtype,
                    **extra,
                ),
                gpu_only,
            )
        )

    for dtype in DTYPES:
        for interleaved in (False, True):
            add(2, 4, 1, 7, 64, dtype, interleaved=interleaved)
            add(2, 8, 8, 7, 80, dtype, interleaved=interleaved, layout="B,T,D", kind="random")
            add(1, 4, 1, MID_T, 96, dtype, interleaved=interleaved, strided="BTHD", layout="1,T,D")
            add(2, 4, 1, 7, 128, dtype, interleaved=interleaved, strided="BTHD", kind="random")
        add(3, 8, 8, 1, 256, dtype, layout="B,T,D")
        add(2, 3, 2, 5, 80, dtype, interleaved=dtype == torch.float16, strided="every other feature")
        add(2, 3, 2, 5, 64, dtype, table_dtype=torch.float32, layout="T,D strided", kind="random")
    for interleaved in (False, True):
        add(3, 32, 8, 1, 128, torch.bfloat16, interleaved=interleaved, layout="B,T,D")  # decode
        add(1, 4, 1, LONG_T, 64, torch.bfloat16, interleaved=interleaved)
        add(1, 2, 1, 7, 256, torch.float16, interleaved=interleaved, kind="random", layout="B,T,D expanded")
        add(1, 32, 8, MID_T, 128, torch.bfloat16, interleaved=interleaved, layout="1,T,D", table_dtype=torch.float32)
        add(2, 4, 3, 9, 1024, torch.float16, interleaved=interleaved, kind="random")  # widest head
    # partial rotary: the first R features rotate, D - R are copied; odd head dims
    for dtype in DTYPES:
        for interleaved in (False, True):
            add(2, 4, 1, 7, 41, dtype, interleaved=interleaved, rotary_dim=40, kind="random")  # Liger's odd D
            add(1, 4, 2, 9, 59, dtype, interleaved=interleaved, rotary_dim=48, strided="BTHD")  # flash-attn's d 59
        add(2, 3, 2, 5, 128, dtype, rotary_dim=64, layout="T,D strided", kind="random", table_dtype=torch.float32)
    add(9, 41, 41, 7, 41, torch.float32, rotary_dim=40, layout="B,T,D")  # Liger's functional shape
    add(3, 7, 21, 5, 92, torch.bfloat16, layout="B,T,D")  # Liger's D 92, Hkv > H
    add(2, 3, 2, 5, 80, torch.float16, interleaved=True, rotary_dim=32, strided="every other feature")
    add(1, 2, 1, 3, 1023, torch.bfloat16, rotary_dim=1022, kind="random")  # widest odd head: ROPE_TABLE's last row
    add(1, 2, 1, 3, 7, torch.float32, interleaved=True, rotary_dim=2)  # one rotated pair
    # full size on the GPU
    for dtype in (torch.bfloat16, torch.float16):
        for interleaved in (False, True):
            add(1, 32, 8, 8192, 128, dtype, True, interleaved=interleaved)
            add(4, 32, 8, 2048, 128, dtype, True, interleaved=interleaved, strided="BTHD", layout="B,T,D")
        for head_dim in (80, 96, 256):
            add(2, 32, 8, 1000, head_dim, dtype, True, kind="random", layout="B,T,D")
        for interleaved in (False, True):
            add(1, 32, 8, 8192, 128, dtype, True, interleaved=interleaved, rotary_dim=64)
        add(3, 73, 213, 423, 92, dtype, True, layout="B,T,D")  # Liger's uneven shape
        add(3, 73, 155, 423, 41, dtype, True, rotary_dim=40, strided="BTHD")
        add(4, 32, 8, 2048, 111, dtype, True, rotary_dim=96, kind="random", layout="B,T,D")
    add(1, 32, 8, 8192, 128, torch.float32, True, table_dtype=torch.float32, strided="BTHD")
    return cases + [
        Case("rotation properties", check_properties),
        Case("allocates its output", check_own_buffer, dict(impl=apply_rope)),
        Case("bad input", check_errors),
        Case("empty input", check_empty, dict(impl=apply_rope)),
        Case("out= under grad (forward-only), tables that require grad", check_grad_mode),
        Case("2^31+ elements", check_huge, dict(impl=apply_rope), gpu_only=True),
        Case("empty input backward", check_grad_empty),
        Case("2^31+ elements backward", check_grad_huge, gpu_only=True),
    ]


def grad_cases():
    """Backward: both layouts, GQA, tables whose halves differ (the transposed map's swapped sines),
    strided q, k and upstream gradients, one input only; Llama sizes on the GPU."""
    cases = []

    def add(batch, heads, kv_heads, seq_len, head_dim, dtype, gpu_only=False, **extra):
        extra_str = " ".join(f"{k}={dtype_name(v) if isinstance(v, torch.dtype) else v}" for k, v in extra.items())
        name = f"backward B{batch} H{heads}/{kv_heads} T{seq_len} D{head_dim} {dtype_name(dtype)} {extra_str}".strip()
        cases.append(
            Case(
                name,
                check_grad,
                dict(
                    batch=batch,
                    heads=heads,
                    kv_heads=kv_heads,
                    seq_len=seq_len,
                    head_dim=head_dim,
                    dtype=dtype,
                    **extra,
                ),
                gpu_only,
            )
        )

    for dtype in DTYPES:
        for interleaved in (False, True):
            add(2, 4, 1, 7, 64, dtype, interleaved=interleaved, kind="random")
        add(1, 4, 2, 9, 80, dtype, strided="BTHD", grads_strided="BTHD", layout="B,T,D")
    add(2, 3, 2, 5, 96, torch.bfloat16, interleaved=True, strided="every other feature", layout="1,T,D", kind="random")
    add(2, 4, 1, 1, 128, torch.float16, wrt=(0,))  # decode step, only q gets a gradient
    add(1, 2, 1, 5, 256, torch.float16, kind="random", layout="B,T,D expanded")
    for interleaved in (False, True):
        add(1, 32, 8, 8192, 128, torch.bfloat16, True, interleaved=interleaved)
        add(
            4,
            32,
            8,
            4096,
            128,
            torch.bfloat16,
            True,
            interleaved=interleaved,
            strided="BTHD",
            grads_strided="BTHD",
            layout="B,T,D",
        )
    add(2, 32, 8, 1000, 80, torch.float16, True, kind="random")
    add(1, 32, 8, 4096, 128, torch.float32, True, strided="BTHD")
    # partial rotary, odd head dims
    for dtype in (torch.float32, torch.bfloat16):
        for interleaved in (False, True):
            add(2, 4, 1, 7, 41, dtype, interleaved=interleaved, rotary_dim=40, kind="random")
    add(1, 4, 2, 9, 59, torch.float16, rotary_dim=48, strided="BTHD", grads_strided="BTHD", layout="B,T,D")
    add(2, 3, 2, 5, 128, torch.bfloat16, interleaved=True, rotary_dim=64, layout="1,T,D", kind="random")
    # Liger's functional shape (B9; the interpreter's B3 takes the same 41-head blocks in a third of
    # the programs, the forward above runs B9 there)
    add(3 if INTERPRET else 9, 41, 41, 7, 41, torch.float32, rotary_dim=40, layout="B,T,D")
    add(3, 7, 21, 5, 92, torch.bfloat16, layout="B,T,D")
    for interleaved in (False, True):
        add(1, 32, 8, 8192, 128, torch.bfloat16, True, interleaved=interleaved, rotary_dim=64)
    add(3, 73, 213, 423, 92, torch.bfloat16, True, layout="B,T,D")
    add(3, 73, 155, 423, 41, torch.float16, True, rotary_dim=40, strided="BTHD", grads_strided="BTHD")
    return cases


CASES = rope_cases() + grad_cases()
for interleaved in (False, True):  # D = 512: ROPE_TABLE's 512 row
    CASES.append(
        Case(
            f"B2 H5/2 T6 D512 bf16 interleaved={interleaved}",
            check,
            dict(
                batch=2,
                heads=5,
                kv_heads=2,
                seq_len=6,
                head_dim=512,
                dtype=torch.bfloat16,
                interleaved=interleaved,
                kind="random",
            ),
        )
    )


def check_table_rows():
    """Every ROPE_TABLE row is taken by a head dim of this tier: a row added to the table without
    a case that reaches it fails here."""
    rows = {table_row(c.kwargs["head_dim"]) for c in select_cases(CASES) if c.fn is check}
    missing = [ROPE_TABLE[i] for i in range(len(ROPE_TABLE)) if i not in rows]
    return [Outcome("every ROPE_TABLE row", not missing, note=f"no head dim reaches {missing}" if missing else "")]


CASES.append(Case("every launch-table row reached", check_table_rows))


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("rope", CASES)
