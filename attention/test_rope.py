"""Tests for attention/triton_rope.py against the fp64 reference and the same-dtype HF-style one.

    python attention/test_rope.py        (or: pytest attention/test_rope.py)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402

from common.device import DEVICE  # noqa: E402
from common.testing import TOLERANCES, Case, Outcome, compare, dtype_name, expect_raises, main, poisoned, rand  # noqa: E402
from attention.rope import apply_rope_ref, rope_cos_sin  # noqa: E402
from attention.triton_rope import apply_rope  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def make_table(batch, seq_len, head_dim, layout, kind, dtype):
    """cos, sin for the test.

    layout: "T,D" (one table for the batch), "1,T,D", "B,T,D", "B,T,D expanded" (a (1, T, D) table
    expanded, batch stride 0) or "T,D strided" (columns of a wider cache). kind: "rope" is
    rope_cos_sin at random positions (each sequence its own for B,T,D); "random" is normal noise
    whose two halves differ, so a kernel reading the wrong column of the table fails.
    """
    rows = batch if layout == "B,T,D" else 1
    if kind == "rope":
        positions = torch.randint(0, 8192, (rows, seq_len), device=DEVICE)
        cos, sin = rope_cos_sin(positions, head_dim, dtype=dtype)
    else:
        cos, sin = rand((rows, seq_len, head_dim), dtype), rand((rows, seq_len, head_dim), dtype)
    if layout in ("T,D", "T,D strided"):
        cos, sin = cos[0], sin[0]
    if layout == "T,D strided":
        cos = torch.cat((cos, rand((seq_len, 24), dtype)), dim=-1)[:, :head_dim]
        sin = torch.cat((rand((seq_len, 8), dtype), sin), dim=-1)[:, 8:]
    if layout == "B,T,D expanded":
        cos, sin = cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)
    return cos, sin


def check(batch, heads, kv_heads, seq_len, head_dim, dtype, interleaved=False, layout="T,D", kind="rope",
          table_dtype=None, strided=None):
    if strided == "BTHD":  # the projection's (B, T, H, D) layout seen as (B, H, T, D): read in place
        q = rand((batch, seq_len, heads, head_dim), dtype).transpose(1, 2)
        k = rand((batch, seq_len, kv_heads, head_dim), dtype).transpose(1, 2)
    elif strided == "every other feature":  # stride 2 along D: every stride is honoured
        q = rand((batch, heads, seq_len, 2 * head_dim), dtype)[..., ::2]
        k = rand((batch, kv_heads, seq_len, 2 * head_dim), dtype)[..., 1::2]
    else:
        q = rand((batch, heads, seq_len, head_dim), dtype)
        k = rand((batch, kv_heads, seq_len, head_dim), dtype)
    cos, sin = make_table(batch, seq_len, head_dim, layout, kind, table_dtype or dtype)
    out = (poisoned(q.shape, dtype), poisoned(k.shape, dtype))
    q_out, k_out = apply_rope(q, k, cos, sin, interleaved, out=out)
    q_ref, k_ref = apply_rope_ref(q.double(), k.double(), cos.double(), sin.double(), interleaved)
    # the HF way in the input dtype (table cast to it, three roundings) bounds our error (2x rule);
    # tolerances: common.testing.TOLERANCES, the rule for fp32 math rounded once to the output dtype
    q_torch, k_torch = apply_rope_ref(q, k, cos, sin, interleaved)
    return [compare("q", q_out, q_ref, torch_out=q_torch), compare("k", k_out, k_ref, torch_out=k_torch)]


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
    return [compare("half: pair lengths kept", pair_norms(q_half, False), pair_norms(q, False), tol),
            compare("interleaved: pair lengths kept", pair_norms(q_int, True), pair_norms(q, True), tol),
            compare("interleaved == permuted half layout", q_int, q_back.double())]


def check_own_buffer(impl=apply_rope):
    """From (B, T, H, D) views: new contiguous (B, H, T, D) outputs. impl: the RoPE under test
    (cuda_cpp/test_cuda_kernels.py passes the CUDA one)."""
    q = rand((1, 5, 3, 64), torch.float16).transpose(1, 2)
    k = rand((1, 5, 1, 64), torch.float16).transpose(1, 2)
    cos, sin = make_table(1, 5, 64, "T,D", "rope", torch.float32)
    q_out, k_out = impl(q, k, cos, sin)
    q_ref, k_ref = apply_rope_ref(q.double(), k.double(), cos.double(), sin.double())
    return [compare("q", q_out, q_ref), compare("k", k_out, k_ref),
            Outcome("outputs contiguous", q_out.is_contiguous() and k_out.is_contiguous())]


def check_huge(impl=apply_rope):
    """q past 2^31 elements (B1 H32 T524289 D128): the last positions, where 32-bit offsets wrap."""
    seq_len = 2 ** 31 // (32 * 128) + 1
    q, k = rand((1, 32, seq_len, 128), torch.bfloat16), rand((1, 1, seq_len, 128), torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(seq_len, device=DEVICE), 128)
    q_out, k_out = impl(q, k, cos, sin)
    tail = slice(seq_len - 3, seq_len)
    q_ref, k_ref = apply_rope_ref(q[:, :, tail].double(), k[:, :, tail].double(), cos[tail].double(),
                                  sin[tail].double())
    return [compare("q last positions", q_out[:, :, tail], q_ref),
            compare("k last positions", k_out[:, :, tail], k_ref)]


def check_errors():
    q, k = rand((2, 4, 6, 64), torch.float16), rand((2, 2, 6, 64), torch.float16)
    cos, sin = make_table(2, 6, 64, "T,D", "rope", torch.float32)
    other = "cpu" if DEVICE == "cuda" else "meta"
    odd_q, odd_k = rand((2, 4, 6, 63), torch.float16), rand((2, 2, 6, 63), torch.float16)
    odd_cos = rand((6, 63), torch.float32)
    return [
        expect_raises("odd D", lambda: apply_rope(odd_q, odd_k, odd_cos, odd_cos), ValueError, "even"),
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
        expect_raises(f"q on {other}", lambda: apply_rope(q.to(other), k.to(other), cos.to(other),
                                                          sin.to(other)), ValueError, "q"),
        expect_raises("k elsewhere", lambda: apply_rope(q, k.to(other), cos, sin), ValueError, "k"),
        expect_raises("cos elsewhere", lambda: apply_rope(q, k, cos.to(other), sin), ValueError, "cos"),
        expect_raises("not a tensor", lambda: apply_rope([1.0], k, cos, sin), TypeError, "q"),
        expect_raises("interleaved not bool", lambda: apply_rope(q, k, cos, sin, "yes"), TypeError, "interleaved"),
        expect_raises("out shape", lambda: apply_rope(q, k, cos, sin, out=(q.clone(), q.clone())),
                      ValueError, "k_out"),
    ]


def check_empty(impl=apply_rope):
    outcomes = []
    for name, (q_shape, k_shape) in {"T = 0": ((2, 4, 0, 64), (2, 2, 0, 64)),
                                     "B = 0": ((0, 4, 6, 64), (0, 2, 6, 64))}.items():
        q, k = rand(q_shape, torch.bfloat16), rand(k_shape, torch.bfloat16)
        cos, sin = rand(q_shape[2:], torch.float32), rand(q_shape[2:], torch.float32)
        q_out, k_out = impl(q, k, cos, sin)
        outcomes.append(Outcome(f"{name}: empty in, empty out", q_out.shape == q.shape and k_out.shape == k.shape
                                and q_out.dtype == k_out.dtype == q.dtype))
    return outcomes


def rope_cases():
    cases = []

    def add(batch, heads, kv_heads, seq_len, head_dim, dtype, gpu_only=False, **extra):
        extra_str = " ".join(f"{k}={dtype_name(v) if isinstance(v, torch.dtype) else v}" for k, v in extra.items())
        name = f"B{batch} H{heads}/{kv_heads} T{seq_len} D{head_dim} {dtype_name(dtype)} {extra_str}".strip()
        cases.append(Case(name, check, dict(batch=batch, heads=heads, kv_heads=kv_heads, seq_len=seq_len,
                                            head_dim=head_dim, dtype=dtype, **extra), gpu_only))

    for dtype in DTYPES:
        for interleaved in (False, True):
            add(2, 4, 1, 7, 64, dtype, interleaved=interleaved)
            add(2, 8, 8, 7, 80, dtype, interleaved=interleaved, layout="B,T,D", kind="random")
            add(1, 4, 1, 77, 96, dtype, interleaved=interleaved, strided="BTHD", layout="1,T,D")
            add(2, 4, 1, 7, 128, dtype, interleaved=interleaved, strided="BTHD", kind="random")
        add(3, 8, 8, 1, 256, dtype, layout="B,T,D")
        add(2, 3, 2, 5, 80, dtype, interleaved=dtype == torch.float16, strided="every other feature")
        add(2, 3, 2, 5, 64, dtype, table_dtype=torch.float32, layout="T,D strided", kind="random")
    for interleaved in (False, True):
        add(3, 32, 8, 1, 128, torch.bfloat16, interleaved=interleaved, layout="B,T,D")  # decode
        add(1, 4, 1, 1000, 64, torch.bfloat16, interleaved=interleaved)
        add(1, 2, 1, 7, 256, torch.float16, interleaved=interleaved, kind="random", layout="B,T,D expanded")
        add(1, 32, 8, 77, 128, torch.bfloat16, interleaved=interleaved, layout="1,T,D", table_dtype=torch.float32)
        add(2, 4, 3, 9, 1024, torch.float16, interleaved=interleaved, kind="random")  # widest head
    # full size on the GPU
    for dtype in (torch.bfloat16, torch.float16):
        for interleaved in (False, True):
            add(1, 32, 8, 8192, 128, dtype, True, interleaved=interleaved)
            add(4, 32, 8, 2048, 128, dtype, True, interleaved=interleaved, strided="BTHD", layout="B,T,D")
        for head_dim in (80, 96, 256):
            add(2, 32, 8, 1000, head_dim, dtype, True, kind="random", layout="B,T,D")
    add(1, 32, 8, 8192, 128, torch.float32, True, table_dtype=torch.float32, strided="BTHD")
    return cases + [Case("rotation properties", check_properties),
                    Case("allocates its output", check_own_buffer),
                    Case("bad input", check_errors), Case("empty input", check_empty),
                    Case("2^31+ elements", check_huge, gpu_only=True)]


CASES = rope_cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("rope", CASES)
