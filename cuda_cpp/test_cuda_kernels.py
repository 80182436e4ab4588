"""Tests for cuda_cpp/ops.py, the hand-written CUDA RMSNorm, RoPE and SwiGLU, against the same fp64
references, PyTorch same-dtype results and tolerances as the Triton kernels' tests
(normalization/test_rmsnorm.py, attention/test_rope.py, mlp/test_glu.py), on their inputs plus
the switch points of cuda_cpp/launch_config.py and both paths of every kernel (16-byte packs with a
scalar tail, and the scalar variant for misaligned or strided data).

Every case needs a CUDA device and nvcc (the kernels are compiled at first use, in well under a
minute): all are `gpu_only`, and without them every case counts as skipped ("no CUDA toolchain").
The checks shared with the Triton kernels' tests are beside those tests (normalization/rmsnorm_cases.py,
attention/rope_cases.py, mlp/glu_cases.py).

    python cuda_cpp/test_cuda_kernels.py        (or: pytest cuda_cpp/test_cuda_kernels.py)
"""

import torch
import torch.nn.functional as F

import llmk.attention.rope_cases as rope_checks
import llmk.mlp.glu_cases as glu_checks
import llmk.normalization.rmsnorm_cases as norm_checks
from llmk.attention.reference_rope import apply_rope_ref
from llmk.common.device import INTERPRET
from llmk.cuda_cpp.extension import unavailable_reason
from llmk.cuda_cpp.launch_config import (
    CACHED_ROW_PACKS,
    CACHED_SMALL_PACKS,
    CACHED_THREADS,
    WARP_ROW_PACKS,
    RmsnormConfig,
    SwigluConfig,
    pack_size,
)
from llmk.cuda_cpp.ops import apply_rope, launch_rmsnorm, launch_swiglu, rmsnorm, swiglu
from llmk.devtools.testing import Case, Outcome, compare, dtype_name, expect_raises, main, poisoned, rand
from llmk.mlp.glu_cases import Glu
from llmk.mlp.glu_cases import inputs as glu_inputs
from llmk.mlp.mlp_cases import ONE_ROUNDING
from llmk.mlp.mlp_cases import WIDTHS as SWIGLU_WIDTHS
from llmk.mlp.reference_mlp import swiglu_ref
from llmk.normalization.norm_cases import norm_inputs
from llmk.normalization.reference_rmsnorm import rmsnorm_ref

EPS = 1e-6
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
OTHER = "cpu"  # a device the kernels must refuse


# ---- RMSNorm ----


def rmsnorm_variants(n_cols, vector):
    """Every launch of the RMSNorm kernels that covers rows of n_cols fp16 values."""
    packs = max(1, n_cols // pack_size(2, vector))
    out = [RmsnormConfig(True, 1, 32, 4)] + [RmsnormConfig(True, 1, t, 1) for t in (64, 256, 1024)]
    if vector:
        out += [
            RmsnormConfig(False, v, t, 4 if t == 32 else 1)
            for v in (1, 2, 4)
            for t in (32, 64, 128, 256, 512, 1024)
            if packs <= t * v <= 4 * packs
        ]
    return out


def check_rmsnorm_variants(shape, pad=None):
    """The same rows through every kernel and launch shape (the ones the tuning sweep tries too)."""
    x = rand(shape, torch.float16, pad=pad)
    w = rand((shape[-1],), torch.float16)
    ref = rmsnorm_ref(x.double(), w.double(), EPS)
    vector = pad is None and (shape[-1] % 8 == 0 or shape[0] == 1)
    outcomes = []
    for cfg in rmsnorm_variants(shape[-1], vector):
        y = poisoned(shape, torch.float16)
        launch_rmsnorm(x, w, EPS, y, cfg)
        label = (
            f"looped {cfg.threads_per_row}x{cfg.rows_per_block}"
            if cfg.looped
            else f"cached {cfg.threads_per_row}x{cfg.rows_per_block} vpt {cfg.vectors_per_thread}"
        )
        outcomes.append(compare(label, y, ref))
    return outcomes


def check_rmsnorm_errors():
    x, w = rand((4, 64), torch.float16), rand((64,), torch.float16)
    return [
        expect_raises("weight size", lambda: rmsnorm(x, w[:63]), ValueError, "weight"),
        expect_raises("weight None", lambda: rmsnorm(x, None), TypeError, "weight"),
        expect_raises("int x", lambda: rmsnorm(x.to(torch.int32), w), TypeError, "x"),
        expect_raises("int weight", lambda: rmsnorm(x, w.to(torch.int32)), TypeError, "weight"),
        expect_raises(f"x on {OTHER}", lambda: rmsnorm(x.to(OTHER), w.to(OTHER)), ValueError, "x"),
        expect_raises("weight elsewhere", lambda: rmsnorm(x, w.to(OTHER)), ValueError, "weight"),
        expect_raises("not a tensor", lambda: rmsnorm([1.0], w), TypeError, "x"),
        expect_raises("eps < 0", lambda: rmsnorm(x, w, -1.0), ValueError, "eps"),
        expect_raises("out shape", lambda: rmsnorm(x, w, out=x[:2].clone()), ValueError, "out"),
    ]


def check_rmsnorm_empty():
    x, w = rand((0, 64), torch.bfloat16), rand((64,), torch.bfloat16)
    y = rmsnorm(x, w)
    return [Outcome("empty in, empty out", y.shape == x.shape and y.dtype == x.dtype)]


def rmsnorm_cases():
    cases = [
        Case(f"rmsnorm {name}", norm_checks.check, dict(kwargs, impl=rmsnorm), gpu_only=True)
        for name, kwargs, _ in norm_inputs()
    ]

    def add(shape, dtype, **extra):
        label = " ".join(f"{k}={dtype_name(v) if isinstance(v, torch.dtype) else v}" for k, v in extra.items())
        cases.append(
            Case(
                f"rmsnorm {tuple(shape)} {dtype_name(dtype)} {label}".strip(),
                norm_checks.check,
                dict(shape=shape, dtype=dtype, impl=rmsnorm, **extra),
                gpu_only=True,
            )
        )

    for dtype in DTYPES:
        vec = pack_size(torch.finfo(dtype).bits // 8, True)
        # either side of each change of kernel, and of the cached kernel's change from 2 to 4 packs a thread
        for packs in (WARP_ROW_PACKS, CACHED_SMALL_PACKS * CACHED_THREADS, CACHED_ROW_PACKS):
            add((3, packs * vec), dtype)
            add((3, (packs + 1) * vec), dtype)
        add((1, 123), dtype)  # one row: packs, then a scalar tail of 3
        add((1, CACHED_ROW_PACKS * vec + 5), dtype)  # the same in the looped kernel
        add((5, 123), dtype, pad=(0, 5))  # row stride 128, rows of 123: scalar path
        add((7, 4096), dtype, pad=(0, 3))  # row stride 4099: misaligned rows, scalar
    add((2, 4096), torch.bfloat16, weight_dtype=torch.float16)  # neither x's dtype nor fp32
    cases += [
        Case("rmsnorm every kernel (5, 4096)", check_rmsnorm_variants, dict(shape=(5, 4096)), gpu_only=True),
        Case("rmsnorm every kernel (1, 4099)", check_rmsnorm_variants, dict(shape=(1, 4099)), gpu_only=True),
        Case(
            "rmsnorm every kernel (6, 1000) strided",
            check_rmsnorm_variants,
            dict(shape=(6, 1000), pad=(0, 1)),
            gpu_only=True,
        ),
        Case("rmsnorm allocates its output", norm_checks.check_own_buffer, dict(impl=rmsnorm), gpu_only=True),
        Case("rmsnorm bad input", check_rmsnorm_errors, gpu_only=True),
        Case("rmsnorm empty input", check_rmsnorm_empty, gpu_only=True),
    ]
    cases += [
        Case(f"rmsnorm 2^31+ elements, {kernel}", norm_checks.check_huge, dict(n_cols=n, impl=rmsnorm), gpu_only=True)
        for kernel, n in (("warp a row", 1000), ("row in registers", 4096), ("looped", 65536))
    ]
    return cases


# ---- RoPE ----


def rope_table(batch, seq_len, head_dim, layout, kind, dtype, sin_dtype=None):
    """attention/rope_cases.py's tables, plus "T,D misaligned": columns 1.. of a (T, D + 1) buffer
    (odd row stride, base off 16 bytes), which the packed kernel cannot read; sin_dtype: a sin
    table in another dtype than cos."""
    if layout == "T,D misaligned":
        cos, sin = (rand((seq_len, head_dim + 1), dtype)[:, 1:] for _ in range(2))
    else:
        cos, sin = rope_checks.make_table(batch, seq_len, head_dim, layout, kind, dtype)
    return cos, (sin.to(sin_dtype) if sin_dtype else sin)


def check_rope(
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
    sin_dtype=None,
    strided=None,
):
    q, k = rope_checks.make_qk(batch, heads, kv_heads, seq_len, head_dim, dtype, strided)
    cos, sin = rope_table(batch, seq_len, head_dim, layout, kind, table_dtype or dtype, sin_dtype)
    out = (poisoned(q.shape, dtype), poisoned(k.shape, dtype))
    q_out, k_out = apply_rope(q, k, cos, sin, interleaved, out=out)
    q_ref, k_ref = apply_rope_ref(q.double(), k.double(), cos.double(), sin.double(), interleaved)
    # the HF way in the input dtype (three roundings) bounds our error (2x rule)
    q_torch, k_torch = apply_rope_ref(q, k, cos, sin, interleaved)
    return [compare("q", q_out, q_ref, torch_out=q_torch), compare("k", k_out, k_ref, torch_out=k_torch)]


def check_rope_errors():
    q, k = rand((2, 4, 6, 64), torch.float16), rand((2, 2, 6, 64), torch.float16)
    cos, sin = rope_checks.make_table(2, 6, 64, "T,D", "rope", torch.float32)
    odd_q, odd_k = rand((2, 4, 6, 63), torch.float16), rand((2, 2, 6, 63), torch.float16)
    odd_cos = rand((6, 63), torch.float32)
    return [
        expect_raises("odd D", lambda: apply_rope(odd_q, odd_k, odd_cos, odd_cos), ValueError, "even"),
        expect_raises("q 3 dims", lambda: apply_rope(q[0], k, cos, sin), ValueError, "q"),
        expect_raises("k batch", lambda: apply_rope(q, k[:1], cos, sin), ValueError, "k"),
        expect_raises("k dtype", lambda: apply_rope(q, k.bfloat16(), cos, sin), TypeError, "k"),
        expect_raises("fp64 q", lambda: apply_rope(q.double(), k.double(), cos, sin), TypeError, "q"),
        expect_raises("cos length", lambda: apply_rope(q, k, cos[:5], sin), ValueError, "cos"),
        expect_raises("bf16 cos for fp16 q", lambda: apply_rope(q, k, cos.bfloat16(), sin), TypeError, "cos"),
        expect_raises(
            f"q on {OTHER}", lambda: apply_rope(q.to(OTHER), k.to(OTHER), cos.to(OTHER), sin.to(OTHER)), ValueError, "q"
        ),
        expect_raises("cos elsewhere", lambda: apply_rope(q, k, cos.to(OTHER), sin), ValueError, "cos"),
        expect_raises("interleaved not bool", lambda: apply_rope(q, k, cos, sin, "yes"), TypeError, "interleaved"),
        expect_raises("out shape", lambda: apply_rope(q, k, cos, sin, out=(q.clone(), q.clone())), ValueError, "k_out"),
    ]


def rope_cases():
    cases = []

    def add(batch, heads, kv_heads, seq_len, head_dim, dtype, **extra):
        extra_str = " ".join(f"{k}={dtype_name(v) if isinstance(v, torch.dtype) else v}" for k, v in extra.items())
        name = f"rope B{batch} H{heads}/{kv_heads} T{seq_len} D{head_dim} {dtype_name(dtype)} {extra_str}".strip()
        cases.append(
            Case(
                name,
                check_rope,
                dict(
                    batch=batch,
                    heads=heads,
                    kv_heads=kv_heads,
                    seq_len=seq_len,
                    head_dim=head_dim,
                    dtype=dtype,
                    **extra,
                ),
                gpu_only=True,
            )
        )

    for dtype in DTYPES:
        for interleaved in (False, True):
            add(2, 4, 1, 7, 64, dtype, interleaved=interleaved)
            add(2, 8, 8, 7, 80, dtype, interleaved=interleaved, layout="B,T,D", kind="random")
            add(1, 4, 1, 77, 96, dtype, interleaved=interleaved, strided="BTHD", layout="1,T,D")
            add(2, 4, 1, 7, 128, dtype, interleaved=interleaved, strided="BTHD", kind="random")
            add(2, 3, 2, 5, 80, dtype, interleaved=interleaved, strided="every other feature")  # scalar kernel
            add(2, 3, 2, 5, 64, dtype, interleaved=interleaved, layout="T,D misaligned")  # scalar kernel
        add(3, 8, 8, 1, 256, dtype, layout="B,T,D")
        add(2, 3, 2, 5, 64, dtype, table_dtype=torch.float32, layout="T,D strided", kind="random")
        add(2, 3, 2, 5, 6, dtype, kind="random")  # D/2 = 3: no whole pack, the scalar kernel
    for interleaved in (False, True):
        add(3, 32, 8, 1, 128, torch.bfloat16, interleaved=interleaved, layout="B,T,D")  # decode
        add(1, 4, 1, 1000, 64, torch.bfloat16, interleaved=interleaved)
        add(1, 2, 1, 7, 256, torch.float16, interleaved=interleaved, kind="random", layout="B,T,D expanded")
        add(1, 32, 8, 77, 128, torch.bfloat16, interleaved=interleaved, layout="1,T,D", table_dtype=torch.float32)
        add(2, 4, 3, 9, 1024, torch.float16, interleaved=interleaved, kind="random")  # widest head
        add(1, 2, 1, 3, 1024, torch.float16, interleaved=interleaved, strided="every other feature")  # 512 threads
    add(2, 4, 2, 9, 128, torch.float16, table_dtype=torch.float32, sin_dtype=torch.float16, kind="random")
    # full size
    for dtype in (torch.bfloat16, torch.float16):
        for interleaved in (False, True):
            add(1, 32, 8, 8192, 128, dtype, interleaved=interleaved)
            add(4, 32, 8, 2048, 128, dtype, interleaved=interleaved, strided="BTHD", layout="B,T,D")
        for head_dim in (80, 96, 256):
            add(2, 32, 8, 1000, head_dim, dtype, kind="random", layout="B,T,D")
    add(1, 32, 8, 8192, 128, torch.float32, table_dtype=torch.float32, strided="BTHD")
    return cases + [
        Case("rope allocates its output", rope_checks.check_own_buffer, dict(impl=apply_rope), gpu_only=True),
        Case("rope bad input", check_rope_errors, gpu_only=True),
        Case("rope empty input", rope_checks.check_empty, dict(impl=apply_rope), gpu_only=True),
        Case("rope 2^31+ elements", rope_checks.check_huge, dict(impl=apply_rope), gpu_only=True),
    ]


# ---- SwiGLU ----

# the Triton SwiGLU's forward checks (mlp/glu_cases.py), on the CUDA kernel
SWIGLU = Glu("swiglu", swiglu, swiglu_ref, lambda gate, up: F.silu(gate) * up)


def check_swiglu_variants(shape, layout):
    """The same input through every block size and packs-a-thread (the tuning sweep's choices)."""
    gate, up = glu_inputs(shape, torch.bfloat16, layout, None, 1.0, 1.0)
    ref = swiglu_ref(gate.double(), up.double())
    outcomes = []
    for threads in (32, 128, 256, 512):
        for vpt in (1, 2, 4):
            y = poisoned(shape, torch.bfloat16)
            launch_swiglu(gate, up, y, SwigluConfig(vpt, threads))
            outcomes.append(compare(f"{threads} threads x {vpt}", y, ref, ONE_ROUNDING[torch.bfloat16]))
    return outcomes


def swiglu_cases():
    cases = []

    def add(shape, dtype, **extra):
        label = " ".join(f"{k}={v}" for k, v in extra.items())
        cases.append(
            Case(
                f"swiglu {tuple(shape)} {dtype_name(dtype)} {label}".strip(),
                glu_checks.check,
                dict(shape=shape, dtype=dtype, glu=SWIGLU, **extra),
                gpu_only=True,
            )
        )

    for dtype in DTYPES:
        for n in SWIGLU_WIDTHS:
            add((3, n), dtype)  # packed: one row of 3n, a scalar tail
        add((1, 4096), dtype)
        add((257, 123), dtype)
        add((2, 3, 123), dtype)
        add((5, 1000), dtype, layout="fused")  # halves of one (5, 2000) buffer: rows
        add((5, 760), dtype, pad=(0, 8))  # gate row stride 768: rows of packs
        add((5, 123), dtype, pad=(0, 5), up_pad=(0, 5))  # rows of 123: the scalar kernel
        add((2, 5, 1000), dtype, pad=(0, 3, 0))  # leading dims that cannot merge
        add((33, 64), dtype, layout="transposed")  # last dim strided: one copy
        add((3, 5120), dtype, gate_scale=1e4, up_scale=0.1)  # exp(-gate) overflows: no NaN
        cases.append(
            Case(
                f"swiglu extremes {dtype_name(dtype)}",
                glu_checks.check_extremes,
                dict(dtype=dtype, glu=SWIGLU),
                gpu_only=True,
            )
        )
        cases.append(
            Case(
                f"swiglu every value {dtype_name(dtype)}",
                glu_checks.check_every_value,
                dict(dtype=dtype, glu=SWIGLU),
                gpu_only=True,
            )
        )
        add((8192, 14336), dtype)
        add((4096, 16384), dtype, layout="fused")
        add((2049, 11008), dtype, pad=(0, 64))
    cases += [
        Case(
            "swiglu every launch (3, 1001)",
            check_swiglu_variants,
            dict(shape=(3, 1001), layout="separate"),
            gpu_only=True,
        ),
        Case(
            "swiglu every launch (5, 1000) fused",
            check_swiglu_variants,
            dict(shape=(5, 1000), layout="fused"),
            gpu_only=True,
        ),
        Case("swiglu allocates its output", glu_checks.check_own_buffer, dict(glu=SWIGLU), gpu_only=True),
        Case("swiglu bad input", glu_checks.check_errors, dict(glu=SWIGLU), gpu_only=True),
        Case("swiglu empty input", glu_checks.check_empty, dict(glu=SWIGLU), gpu_only=True),
        Case("swiglu 2^31+ elements", glu_checks.check_huge, dict(n_cols=14336, glu=SWIGLU), gpu_only=True, gpu_gb=23),
    ]  # 21.5 GB printed
    return cases


CASES = rmsnorm_cases() + rope_cases() + swiglu_cases()


def skip_reason():
    """Why no case can run here, as (short reason for the count line, detail), or None."""
    detail = unavailable_reason()
    if detail is not None:
        return "no CUDA toolchain", detail
    if INTERPRET:
        return "TRITON_INTERPRET=1", "TRITON_INTERPRET=1 puts the tests' tensors on the CPU"
    return None


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    if skip_reason() is not None:
        import pytest

        pytest.skip(skip_reason()[1])
    case.check()


if __name__ == "__main__":
    reason = skip_reason()
    if reason is not None:
        print(f"cuda kernels: {reason[1]}")
    main("cuda kernels", CASES, skip_reason=reason and reason[0])
