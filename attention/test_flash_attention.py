"""Tests for attention/flash_attention_triton.py against naive_attention computed in fp64.

    python attention/test_flash_attention.py        (or: pytest attention/test_flash_attention.py)

Error model and tolerance: common/checks/attention.py (p rounded once to the input dtype before
p @ v, O rounded once: a bound for each element from the fp64 probabilities). Beside that bound,
the 2x rule: our error must be at most twice that of PyTorch's same-dtype attention (scores,
softmax and p @ v each in the input dtype, as flash-attention's own tests build their comparison).
"""
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402

from attention.flash_attention_triton import CONFIG_TABLE, flash_attention, table_config  # noqa: E402
from attention.naive_attention import causal_mask, expand_kv, naive_attention  # noqa: E402
from common.checks.attention import attention_tol as rounding_tol  # noqa: E402
from common.device import DEVICE  # noqa: E402
from common.testing import Case, Outcome, Tol, compare, dtype_name, expect_raises, main, poisoned, rand  # noqa: E402

def attention_tol(q, k, v, causal, sm_scale):
    """The tolerance of O in q's dtype, from the fp64 probabilities of this problem."""
    k, v = expand_kv(k.double(), q.shape[1]), expand_kv(v.double(), q.shape[1])
    scores = torch.matmul(q.double(), k.transpose(-1, -2)) * sm_scale
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)
    return rounding_tol(q.dtype, p, v, q.shape)


def same_dtype_attention(q, k, v, causal, sm_scale):
    """PyTorch's attention with every step in the input dtype: the error the 2x rule allows."""
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    scores = torch.matmul(q, k.transpose(-1, -2)) * sm_scale
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(nan=0.0)
    return torch.matmul(p, v)


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


def check(b, h, hkv, tq, tk, d, dtype, causal, layout="bhtd", sm_scale=None, scale=1.0):
    q, k, v = make_qkv(b, h, hkv, tq, tk, d, dtype, layout, scale)
    out = poisoned((b, h, tq, d), dtype)
    o = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, out=out)
    scale_used = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    ref = naive_attention(q.double(), k.double(), v.double(), causal, scale_used)
    torch_out = same_dtype_attention(q, k, v, causal, scale_used)
    outcomes = [compare("O", o, ref, attention_tol(q, k, v, causal, scale_used), torch_out=torch_out)]
    if layout == "bthd":  # without out=, O comes back laid out like q
        o2 = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)
        outcomes.append(Outcome("O keeps q's layout", o2.stride() == q.stride() and torch.equal(o2, o),
                                note=f"strides {o2.stride()} vs q {q.stride()}"))
    return outcomes


def check_matches_blocked():
    """naive and blocked references agree to fp64 rounding on a GQA, Tq != Tk, causal problem."""
    from attention.blocked_attention import blocked_attention
    q, k, v = make_qkv(2, 4, 2, 37, 70, 32, torch.float64)
    ref = naive_attention(q, k, v, True)
    return [compare("blocked vs naive", blocked_attention(q, k, v, True, block_size=16), ref,
                    Tol(1e-12, 1e-12, "fp64 throughout"))]


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
        expect_raises("head dim 512", lambda: flash_attention(*make_qkv(1, 1, 1, 4, 4, 512, torch.float16)),
                      ValueError, "head_dim"),
        expect_raises("k head dim", lambda: flash_attention(q, k[..., :32], v), ValueError, "k"),
        expect_raises("v shape", lambda: flash_attention(q, k, v[:, :, :4]), ValueError, "v"),
        expect_raises("heads 4 vs 3", lambda: flash_attention(q, *make_qkv(1, 3, 3, 8, 8, 64, torch.float16)[1:]),
                      ValueError, "head count"),
        expect_raises("batch", lambda: flash_attention(q, k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)),
                      ValueError, "k"),
        expect_raises("sm_scale 0", lambda: flash_attention(q, k, v, sm_scale=0.0), ValueError, "sm_scale"),
        expect_raises(f"q on {other}", lambda: flash_attention(q.to(other), k, v), ValueError, "q"),
        expect_raises("v elsewhere", lambda: flash_attention(q, k, v.to(other)), ValueError, "v"),
        expect_raises("not a tensor", lambda: flash_attention(q, [1.0], v), TypeError, "k"),
        expect_raises("out shape", lambda: flash_attention(q, k, v, out=q[:, :2].clone()), ValueError, "out"),
        expect_raises("causal='no'", lambda: flash_attention(q, k, v, causal="no"), TypeError, "causal"),
        expect_raises("causal=1", lambda: flash_attention(q, k, v, causal=1), TypeError, "causal"),
    ]


def check_grad_mode():
    """Forward-only: in grad mode a q that requires grad raises, naming the operator; under
    torch.no_grad() the call gives what it gives on a plain q."""
    q, k, v = make_qkv(1, 4, 2, 20, 20, 64, torch.float16)
    q_grad = q.clone().requires_grad_()
    with torch.no_grad():
        o = flash_attention(q_grad, k, v, True)
        o_out = flash_attention(q_grad, k, v, True, out=poisoned(q.shape, q.dtype))
    return [expect_raises("q requires grad", lambda: flash_attention(q_grad, k, v, True), RuntimeError,
                          "llmk::flash_attention is forward-only"),
            expect_raises("q requires grad, out=", lambda: flash_attention(q_grad, k, v, True, out=torch.empty_like(q)),
                          RuntimeError, "llmk::flash_attention_out is forward-only"),
            Outcome("under no_grad: as on a plain q",
                    torch.equal(o, flash_attention(q, k, v, True)) and torch.equal(o_out, o))]


def _cases():
    cases = []

    def add(name, gpu_only=False, **kw):
        cases.append(Case(name, check, kw, gpu_only))

    for dtype in (torch.float16, torch.bfloat16):
        dt = dtype_name(dtype)
        for causal in (False, True):
            c = "causal" if causal else "full"
            add(f"B2 H4 T77 D64 {c} {dt}", b=2, h=4, hkv=4, tq=77, tk=77, d=64, dtype=dtype, causal=causal)
            add(f"GQA 8/2 T100 D128 {c} {dt}", b=1, h=8, hkv=2, tq=100, tk=100, d=128, dtype=dtype, causal=causal)
            add(f"MQA 4/1 T33 D32 {c} {dt}", b=2, h=4, hkv=1, tq=33, tk=33, d=32, dtype=dtype, causal=causal)
            add(f"Tq17 Tk77 D96 {c} {dt}", b=1, h=2, hkv=2, tq=17, tk=77, d=96, dtype=dtype, causal=causal)
            add(f"Tq77 Tk17 D64 {c} {dt}", b=1, h=2, hkv=1, tq=77, tk=17, d=64, dtype=dtype, causal=causal)
            add(f"T1 D64 {c} {dt}", b=3, h=2, hkv=2, tq=1, tk=1, d=64, dtype=dtype, causal=causal)
            add(f"Tq1 Tk50 D128 {c} {dt}", b=2, h=4, hkv=2, tq=1, tk=50, d=128, dtype=dtype, causal=causal)
            add(f"D80 T40 {c} {dt}", b=1, h=2, hkv=2, tq=40, tk=40, d=80, dtype=dtype, causal=causal)
            add(f"D256 T40 {c} {dt}", b=1, h=2, hkv=1, tq=40, tk=40, d=256, dtype=dtype, causal=causal)
            add(f"(B,T,H,D) view T50 D64 {c} {dt}", b=2, h=4, hkv=2, tq=50, tk=50, d=64, dtype=dtype,
                causal=causal, layout="bthd")
            add(f"padded view Tq30 Tk45 D32 {c} {dt}", b=1, h=2, hkv=1, tq=30, tk=45, d=32, dtype=dtype,
                causal=causal, layout="padded")
        add(f"sm_scale 0.3 T48 D64 {dt}", b=1, h=2, hkv=2, tq=48, tk=48, d=64, dtype=dtype, causal=True, sm_scale=0.3)
        add(f"peaked: q x 30 T64 D64 {dt}", b=1, h=2, hkv=2, tq=64, tk=64, d=64, dtype=dtype, causal=False, scale=30.0)
        # full sizes: every head dim, long sequences, GQA 32/8, a prefill chunk against a longer cache
        for d in (32, 64, 96, 128, 256):
            for causal in (False, True):
                add(f"B2 H8 T1000 D{d} {'causal' if causal else 'full'} {dt}", gpu_only=True,
                    b=2, h=8, hkv=8, tq=1000, tk=1000, d=d, dtype=dtype, causal=causal)
        add(f"GQA 32/8 T4096 D128 causal {dt}", gpu_only=True, b=1, h=32, hkv=8, tq=4096, tk=4096, d=128,
            dtype=dtype, causal=True)
        add(f"Tq1000 Tk4097 D128 causal {dt}", gpu_only=True, b=1, h=8, hkv=2, tq=1000, tk=4097, d=128,
            dtype=dtype, causal=True)
        add(f"(B,T,H,D) view T2048 D128 full {dt}", gpu_only=True, b=2, h=16, hkv=4, tq=2048, tk=2048, d=128,
            dtype=dtype, causal=False, layout="bthd")
    cases += [Case("references agree", check_matches_blocked), Case("no keys", check_no_keys),
              Case("empty input", check_empty), Case("bad input", check_errors),
              Case("grad mode (forward-only)", check_grad_mode)]
    return cases


CASES = _cases()


def check_forced(config, b, h, hkv, tq, tk, d, dtype, causal):
    """check()'s comparison with the launch forced to `config`, a CONFIG_TABLE row: the interpreter
    otherwise runs INTERPRET_CONFIG only."""
    q, k, v = make_qkv(b, h, hkv, tq, tk, d, dtype)
    o = flash_attention(q, k, v, causal=causal, out=poisoned((b, h, tq, d), dtype), config=config)
    scale = 1.0 / math.sqrt(d)
    ref = naive_attention(q.double(), k.double(), v.double(), causal, scale)
    return [compare("O", o, ref, attention_tol(q, k, v, causal, scale),
                    torch_out=same_dtype_attention(q, k, v, causal, scale))]


def forced_cases():
    """Each CONFIG_TABLE row on a short sequence (several q and key blocks of the row's size, a
    ragged last one) at the row's largest head dim, full and causal, fp16 and bf16."""
    cases = []
    for max_dim, max_tq, *config in CONFIG_TABLE:
        for dtype in (torch.float16, torch.bfloat16):
            for causal in (False, True):
                name = f"forced {tuple(config)} T150 D{max_dim} {'causal' if causal else 'full'} {dtype_name(dtype)}"
                cases.append(Case(name, check_forced, dict(config=tuple(config), b=1, h=2, hkv=1, tq=150, tk=150,
                                                           d=max_dim, dtype=dtype, causal=causal)))
    return cases


def check_table_rows():
    """Every CONFIG_TABLE row is forced by a case, and table_config routes each row's head dims
    and lengths to it: a row added to the table without a forced case fails here."""
    forced = {(c.kwargs["d"], c.kwargs["config"]) for c in CASES if c.fn is check_forced}
    missing = [row for row in CONFIG_TABLE if (row[0], tuple(row[2:])) not in forced]
    routed = all(table_config(max_dim, max_tq or 4096) == tuple(config) for max_dim, max_tq, *config in CONFIG_TABLE)
    return [Outcome("every CONFIG_TABLE row forced", not missing, note=f"not forced: {missing}" if missing else ""),
            Outcome("table_config picks each row", routed)]


CASES += forced_cases() + [Case("every launch-table row forced", check_table_rows)]


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("flash_attention", CASES)
