"""Tests for gemm/matmul_ops.py against the fp64 product of the same fp16/bf16 inputs and
PyTorch's same-dtype torch.matmul (plus its bias and activation ops for the epilogue).

    python gemm/test_matmul.py        (or: pytest gemm/test_matmul.py)

Tolerance: gemm/matmul_cases.py (fp32 accumulation over K and one rounding per element; at
most 2x torch.matmul's own error plus atol).
Split-K adds fp32 slice sums in a different order, the same error model; a slice lost, counted
twice or given the epilogue on its own is off by a whole partial sum, far past the tolerance.
Backward: gradients of a, b and bias (devtools.testing.check_grads) against autograd through the
fp64 reference and PyTorch's same-dtype ops; tolerance in grad_tolerance (inputs of the backward's
products carry roundings, so the model is that of gemm/test_rmsnorm_linear.py, not an exact-input
GEMM's), and again at most 2x PyTorch's error plus atol. A lost band of dbias, a skipped row of
dz or a gradient in the wrong layout is off by whole terms, far past it.
"""

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE, INTERPRET, sm_count
from llmk.devtools.testing import (
    Case,
    Outcome,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    main,
    one_dtype_here,
    poisoned,
    rand,
)
from llmk.gemm import triton_matmul_tma
from llmk.gemm.matmul_cases import grad_tolerance, reference, tolerance, torch_same_dtype
from llmk.gemm.matmul_ops import (
    TMA_MIN_M,
    choose_kernel,
    kernel_choice,
    launch_matmul,
    matmul,
    matmul_op,
    matmul_train_op,
)
from llmk.gemm.triton_matmul_common import m_bucket
from llmk.gemm.triton_matmul_tiled import (
    CONFIGS,
    INTERPRET_SMS,
    SPLIT_TABLE,
    autotune_configs,
    plan,
    prune_configs,
    split_plan,
)

DTYPES = (torch.float16, torch.bfloat16)


def outcome(check, a, b, bias=None, activation=None, config=None, split_k=None, kernel=None):
    """Run matmul (or a forced config, split-K or kernel) into a poisoned buffer and compare."""
    out = poisoned((a.shape[0], b.shape[1]), a.dtype)
    if config is None and split_k is None and kernel is None:
        matmul(a, b, bias, activation, out=out)
    else:
        launch_matmul(a, b, bias, activation, out, config=config, split_k=split_k, kernel=kernel)
    return compare(
        check,
        out,
        reference(a, b, bias, activation),
        tolerance(a, b),
        torch_out=torch_same_dtype(a, b, bias, activation),
    )


def check(
    m,
    n,
    k,
    dtype,
    bias=False,
    bias_dtype=None,
    activation=None,
    trans_a=False,
    trans_b=False,
    pad=False,
    split_k=None,
    planned_split=None,
    kernel=None,
    planned_kernel=None,
):
    """a (M, K) and b (K, N), built transposed (a view of a (K, M) tensor) or padded (a view of a
    larger tensor; pad=8 pads by 8 columns, which keeps TMA's 16-byte row alignment) as asked.
    split_k forces split-K and kernel the kernel (None: matmul's own choice); planned_split and
    planned_kernel also check that matmul's own choice for this shape is that SPLIT_K, that kernel."""
    pad_a, pad_b = ((8, 8), (8, 8)) if pad == 8 else ((5, 3), (3, 7)) if pad else (None, None)
    a = rand((k, m), dtype).t() if trans_a else rand((m, k), dtype, pad=pad_a)
    b = rand((n, k), dtype).t() if trans_b else rand((k, n), dtype, pad=pad_b)
    # bias "strided": a (N,) view with stride 2 (the kernels read a contiguous copy)
    bias_t = (
        rand((2 * n,), bias_dtype or dtype)[::2]
        if bias == "strided"
        else rand((n,), bias_dtype or dtype)
        if bias
        else None
    )
    outcomes = [outcome("c", a, b, bias_t, activation, split_k=split_k, kernel=kernel)]
    if planned_split is not None:
        chosen = plan(m, n, k, sm_count(a.device, INTERPRET_SMS))[1]
        outcomes.append(Outcome(f"plan: SPLIT_K {chosen}, expected {planned_split}", chosen == planned_split))
    if planned_kernel is not None:
        chosen = choose_kernel(a, b, torch.empty(m, n, dtype=dtype, device=a.device), m)
        outcomes.append(Outcome(f"kernel chosen: {chosen}, expected {planned_kernel}", chosen == planned_kernel))
    return outcomes


def check_config(config, dtype, split_k=None):
    """One row of CONFIGS (or SPLIT_TABLE, with split_k), forced, on a shape with an edge tile in M
    and N and a K tail; b is an nn.Linear weight's transpose. With split_k the K steps are split
    over the slices, the last one shorter."""
    bm, bn, bk = config[:3]
    m, n, k = bm + 3, bn + 5, bk * (split_k or 1) + 7
    a, b, bias = rand((m, k), dtype), rand((n, k), dtype).t(), rand((n,), dtype)
    outcomes = [outcome("c", a, b, config=config, split_k=split_k)]
    if dtype == torch.float16:  # the epilogue in one dtype: each variant is one more compile per config
        outcomes.append(outcome("c, bias+gelu", a, b, bias, "gelu", config=config, split_k=split_k))
    return outcomes


def check_tma_config(config, dtype):
    """One row of TMA_CONFIGS, forced, on a shape with an edge tile in M and N and a K tail (TMA
    zero-fills past the edges; N and K multiples of 8 for the 16-byte row alignment); b is an
    nn.Linear weight's transpose, and with bias+gelu a row-major b."""
    bm, bn, bk = config[:3]
    m, n, k = bm + 3, bn + 8, bk + 8
    a, b = rand((m, k), dtype), rand((n, k), dtype).t()
    outcomes = [outcome("c", a, b, config=config, kernel="tma")]
    if dtype == torch.float16:
        b_rows, bias = rand((k, n), dtype), rand((n,), dtype)
        outcomes.append(outcome("c, row-major b, bias+gelu", a, b_rows, bias, "gelu", config=config, kernel="tma"))
    return outcomes


def check_tma_fits():
    """Which arguments a TMA descriptor covers; the rest run the pointer kernel."""
    a, b, c = rand((40, 64), torch.float16), rand((64, 48), torch.float16), rand((40, 48), torch.float16)
    fits = triton_matmul_tma.fits
    return [
        Outcome("row-major a, b, c", fits(a, b, c)),
        Outcome("b an nn.Linear weight's transpose", fits(a, rand((48, 64), torch.float16).t(), c)),
        Outcome("a transposed (a backward's a.T)", fits(rand((64, 40), torch.float16).t(), b, c)),
        Outcome("a transposed, rows 42 elements apart: no", not fits(rand((64, 42), torch.float16).t(), b, c)),
        Outcome("a a column view: no", not fits(rand((40, 128), torch.float16)[:, ::2], b, c)),
        Outcome("a's rows 7 elements apart: no", not fits(rand((40, 63), torch.float16)[:, :56], b[:56], c)),
        Outcome("a's base 2 bytes past 16: no", not fits(a[:, 1:], b[1:], c)),
        Outcome("N = 47: no", not fits(a, rand((64, 47), torch.float16), rand((40, 47), torch.float16))),
        Outcome(
            "N = 47, b transposed: no (c's rows)",
            not fits(a, rand((47, 64), torch.float16).t(), rand((40, 47), torch.float16)),
        ),
    ]


def check_tma_prune():
    """TMA_CONFIGS' autotune candidates on an H100/H200's 132 SMs."""
    configs = triton_matmul_tma.autotune_configs()

    def kept(m, n):
        return {c.kwargs["BLOCK_N"] for c in triton_matmul_tma.prune_configs(configs, dict(M=m, N=n, NUM_SMS=132))}

    def rows(m, n, a_transposed):
        return {
            triton_matmul_tma.row_of(c)
            for c in triton_matmul_tma.prune_configs(configs, dict(M=m, N=n, NUM_SMS=132, A_TRANSPOSED=a_transposed))
        }

    only = triton_matmul_tma.TRANSPOSED_A_ONLY
    return [
        Outcome("4096^2: 128x256 tiles", kept(4096, 4096) == {256}),
        Outcome("4096^2, a transposed: also TRANSPOSED_A_ONLY's rows", only <= rows(4096, 4096, True)),
        Outcome("4096^2, a row-major: not TRANSPOSED_A_ONLY's rows", not only & rows(4096, 4096, False)),
        Outcome("1024^2, a transposed: smaller tiles only", not only & rows(1024, 1024, True)),
        Outcome("2048^2: 128 tiles of 128x256, about a wave", kept(2048, 2048) == {256}),
        Outcome("1024^2: 32 tiles of 128x256, smaller tiles", kept(1024, 1024) == {128}),
    ]


def check_prune():
    """The autotuner's candidates (the GPU's path, checked here without one): configs that fit M."""
    configs = autotune_configs()

    def kept(m, n, k):
        return {c.kwargs["BLOCK_M"] for c in prune_configs(configs, dict(M_BUCKET=m_bucket(m), N=n, K=k))}

    return [
        Outcome("decode M=1: 16-row tiles only", kept(1, 4096, 4096) == {16}),
        Outcome("M=48: tiles up to 64 rows", kept(48, 4096, 4096) == {16, 32, 64}),
        Outcome("M=200: every tile", kept(200, 4096, 4096) == {16, 32, 64, 128}),
        Outcome("M=4096: 64 rows and up", kept(4096, 4096, 4096) == {64, 128}),
        Outcome("tiny: one config", len(prune_configs(configs, dict(M_BUCKET=16, N=64, K=64))) == 1),
    ]


def check_split_plan():
    """SPLIT_TABLE's decisions on the GPU's tiles and an H100/H200's 132 SMs, checked without a GPU."""

    def split(m, n, k):
        return split_plan(m, n, k, 132, SPLIT_TABLE)[1]

    return [
        Outcome("decode M=1, N=4096: 16 tiles of 256 columns, 4 slices", split(1, 4096, 4096) == 4),
        Outcome("M=1, N=4096: the 256-column tile", split_plan(1, 4096, 4096, 132, SPLIT_TABLE)[0][1] == 256),
        Outcome("M=1, N=2048: 16 tiles, 4 slices", split(1, 2048, 4096) == 4),
        Outcome("M=1, N=8192: 64 tiles, 2 slices", split(1, 8192, 4096) == 2),
        Outcome("M=1, N=14336: 112 tiles, no split", split(1, 14336, 4096) == 1),
        Outcome("M=2: no split", split(2, 4096, 4096) == 1),
        Outcome("1024^3: no split", split(1024, 1024, 1024) == 1),
        Outcome("K=1024: 8 steps, 2 slices of 4", split(1, 2048, 1024) == 2),
        Outcome("K=384: 3 steps, no split", split(1, 2048, 384) == 1),
    ]


def check_kernel_choice():
    """kernel_choice names the kernel each call takes: GEMV for one row against W.T, split-K for one
    row against a row-major b of few tiles, TMA from TMA_MIN_M rows (the interpreter emulates it),
    the tiled kernel otherwise; after the call, with the config it ran."""

    def choice(m, n, k, linear=False):
        a = rand((m, k), torch.float16)
        b = rand((n, k), torch.float16).t() if linear else rand((k, n), torch.float16)
        matmul(a, b)  # tunes the key on a GPU
        return kernel_choice(a, b)

    cases = [
        ("M=1, W.T: GEMV", choice(1, 96, 64, linear=True), "gemv "),
        # a split needs few tiles against the SMs: the interpreter counts 16 SMs and 32x32 tiles
        ("M=1, row-major b: split-K", choice(1, 256, 512) if INTERPRET else choice(1, 4096, 4096), "tiled split-K "),
        ("M=17: tiled, one kernel", choice(17, 40, 33), "tiled "),
        ("M=TMA_MIN_M: TMA", choice(TMA_MIN_M, 64, 64), "tma "),
    ]
    return [
        Outcome(
            name,
            got.startswith(prefix) and "untuned" not in got and ("split-K" in got) == ("split-K" in prefix),
            note=got,
        )
        for name, got, prefix in cases
    ]


def check_own_buffer():
    a, b = rand((9, 41), torch.float16), rand((41, 23), torch.float16)
    return [compare("c", matmul(a, b), reference(a, b, None, None), tolerance(a, b), torch_out=torch.matmul(a, b))]


def check_empty():
    a, b, bias = rand((5, 0), torch.bfloat16), rand((0, 7), torch.bfloat16), rand((7,), torch.bfloat16)
    zero_k = matmul(a, b, out=poisoned((5, 7), torch.bfloat16))
    zero_k_epilogue = matmul(a, b, bias, "silu", out=poisoned((5, 7), torch.bfloat16))
    no_rows = matmul(rand((0, 9), torch.float16), rand((9, 4), torch.float16))
    no_cols = matmul(rand((3, 9), torch.float16), rand((9, 0), torch.float16))
    return [
        compare("K = 0: zeros", zero_k, torch.zeros(5, 7, dtype=torch.float64, device=DEVICE)),
        compare("K = 0: silu(bias)", zero_k_epilogue, F.silu(bias.double()).expand(5, 7)),
        Outcome("M = 0: empty (0, N)", tuple(no_rows.shape) == (0, 4) and no_rows.dtype == torch.float16),
        Outcome("N = 0: empty (M, 0)", tuple(no_cols.shape) == (3, 0)),
    ]


def check_errors():
    a, b, bias = rand((4, 64), torch.float16), rand((64, 32), torch.float16), rand((32,), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("fp32 a", lambda: matmul(a.float(), b), TypeError, "a"),
        expect_raises("fp32 b", lambda: matmul(a, b.float()), TypeError, "b"),
        expect_raises("a fp16, b bf16", lambda: matmul(a, b.bfloat16()), TypeError, "b"),
        expect_raises("inner dims differ", lambda: matmul(a, b[:63]), ValueError, "K"),
        expect_raises("3-D a", lambda: matmul(a[None], b), ValueError, "a"),
        expect_raises("bias size", lambda: matmul(a, b, bias[:31]), ValueError, "bias"),
        expect_raises("int bias", lambda: matmul(a, b, bias.to(torch.int32)), TypeError, "bias"),
        expect_raises("unknown activation", lambda: matmul(a, b, activation="relu"), ValueError, "activation"),
        expect_raises("activation True", lambda: matmul(a, b, activation=True), ValueError, "activation"),
        expect_raises(f"a on {other}", lambda: matmul(a.to(other), b.to(other)), ValueError, "a"),
        expect_raises("b elsewhere", lambda: matmul(a, b.to(other)), ValueError, "b"),
        expect_raises("bias elsewhere", lambda: matmul(a, b, bias.to(other)), ValueError, "bias"),
        expect_raises("not a tensor", lambda: matmul([1.0], b), TypeError, "a"),
        expect_raises("out shape", lambda: matmul(a, b, out=a.clone()), ValueError, "out"),
    ]


def backward_inputs(m, n, k, dtype, bias=True, bias_dtype=None, trans_a=False, trans_b=False, pad=False):
    """a, b, bias laid out as `check` makes them (transposed, padded)."""
    a = rand((k, m), dtype).t() if trans_a else rand((m, k), dtype, pad=(5, 3) if pad else None)
    b = rand((n, k), dtype).t() if trans_b else rand((k, n), dtype, pad=(3, 7) if pad else None)
    return a, b, rand((n,), bias_dtype or dtype) if bias else None


def check_backward(
    m,
    n,
    k,
    dtype,
    bias=True,
    bias_dtype=None,
    activation=None,
    trans_a=False,
    trans_b=False,
    pad=False,
    wrt=(0, 1, 2),
    expanded_dc=False,
):
    """Gradients of matmul(a, b, bias, activation) for the inputs at `wrt` (0 a, 1 b, 2 bias) against
    autograd through the fp64 reference and PyTorch's same-dtype matmul, bias add and activation;
    the others get None. expanded_dc: the upstream gradient an expanded (1, N) row (stride 0 down
    the rows, as .sum(0) gives): dz = dc is read in place, without a copy."""
    a, b, bias_t = backward_inputs(m, n, k, dtype, bias, bias_dtype, trans_a, trans_b, pad)
    inputs = (a, b, bias_t)
    wrt = tuple(i for i in wrt if inputs[i] is not None)
    dys = [torch.randn(1, n, device=DEVICE).to(dtype).expand(m, n)] if expanded_dc else None
    return check_grads(
        "matmul",
        lambda a, b, bias: matmul(a, b, bias, activation),
        lambda a, b, bias: reference(a, b, bias, activation),
        inputs,
        wrt,
        ("a", "b", "bias"),
        grad_tolerance(dtype),
        torch_fn=lambda a, b, bias: torch_same_dtype(a, b, bias, activation),
        grad_outputs=dys,
    )


def check_backward_ops(dtype):
    """The operators below matmul(): llmk::matmul called directly under grad with an activation
    (its backward recomputes z, a third GEMM), and llmk::matmul_train with both its outputs used (z's
    own gradient adds to dz)."""
    a, b, bias = backward_inputs(20, 40, 50, dtype)
    inputs, names, tol = (a, b, bias), ("a", "b", "bias"), grad_tolerance(dtype)

    def ref_pair(a, b, bias):
        return reference(a, b, bias, "silu"), reference(a, b, bias, None)

    def torch_pair(a, b, bias):
        return torch_same_dtype(a, b, bias, "silu"), torch_same_dtype(a, b, bias, None)

    return check_grads(
        "llmk::matmul gelu_tanh",
        lambda a, b, bias: matmul_op(a, b, bias, "gelu_tanh"),
        lambda a, b, bias: reference(a, b, bias, "gelu_tanh"),
        inputs,
        (0, 1, 2),
        names,
        tol,
        torch_fn=lambda a, b, bias: torch_same_dtype(a, b, bias, "gelu_tanh"),
    ) + check_grads(
        "llmk::matmul_train silu (c, z)",
        lambda a, b, bias: matmul_train_op(a, b, bias, "silu"),
        ref_pair,
        inputs,
        (0, 1, 2),
        names,
        tol,
        torch_fn=torch_pair,
    )


def check_backward_empty():
    """Gradients of empty products: no rows (da empty, db and dbias zeros), no columns, K = 0 (da and
    db empty, dbias the column sums of dz)."""
    outcomes = []
    for m, n, k in ((0, 6, 9), (4, 0, 9), (4, 6, 0)):
        a, b, bias = (rand(s, torch.bfloat16).requires_grad_() for s in ((m, k), (k, n), (n,)))
        c = matmul(a, b, bias, "gelu")
        dc = torch.randn(c.shape, device=DEVICE).to(c.dtype)
        got = torch.autograd.grad(c, (a, b, bias), dc)
        want = torch.autograd.grad(reference(a, b, bias, "gelu"), (a, b, bias), dc.double())
        outcomes += [
            compare(f"({m}, {n}, {k}) d{name}", g, w, grad_tolerance(torch.bfloat16)(name, w))
            for name, g, w in zip(("a", "b", "bias"), got, want)
        ]
    return outcomes


def check_grad_mode():
    """matmul under grad: out= stays forward-only (llmk::matmul_out raises); under torch.no_grad()
    the same call gives the same bits as on plain tensors (the tiled kernel, and the GEMV kernel at
    M = 1 against W.T), with no z written."""
    a, b, bias = rand((6, 40), torch.float16), rand((40, 24), torch.float16), rand((24,), torch.float16)
    w_t = rand((24, 40), torch.float16).t()
    grad = [t.clone().requires_grad_() for t in (a, b, bias, w_t)]
    outcomes = [
        expect_raises(
            "bias requires grad, out=",
            lambda: matmul(a, b, grad[2], "gelu", out=poisoned((6, 24), a.dtype)),
            RuntimeError,
            "llmk::matmul_out is forward-only",
        ),
    ]
    with torch.no_grad():
        c = matmul(grad[0], grad[1], grad[2], "gelu")
        c_out = matmul(grad[0], grad[1], grad[2], "gelu", out=poisoned((6, 24), a.dtype))
        c_gemv = matmul(grad[0][:1], grad[3])
    outcomes += [
        compare(
            "no_grad: c",
            c,
            reference(a, b, bias, "gelu"),
            tolerance(a, b),
            torch_out=torch_same_dtype(a, b, bias, "gelu"),
        ),
        Outcome("no_grad: c as on plain tensors", torch.equal(c, matmul(a, b, bias, "gelu")) and not c.requires_grad),
        Outcome("no_grad, out=: as on plain tensors", torch.equal(c_out, c)),
        Outcome("no_grad, M = 1 (gemv): as on plain tensors", torch.equal(c_gemv, matmul(a[:1], w_t))),
    ]
    return outcomes


def check_huge():
    """An output past 2^31 elements: the last rows only, where a 32-bit offset would wrap."""
    m, n, k = 2**31 // 4096 + 3, 4096, 32
    a, b = rand((m, k), torch.float16), rand((k, n), torch.float16)
    c = matmul(a, b, out=poisoned((m, n), torch.float16))
    tail = a[-4:]
    return [
        compare(
            "last rows", c[-4:], reference(tail, b, None, None), tolerance(tail, b), torch_out=torch.matmul(tail, b)
        )
    ]


def check_tables_forced():
    """Every CONFIGS row, every SPLIT_TABLE tile and every TMA_CONFIGS row is forced by a case that
    runs on this device."""
    runnable = [c for c in CASES if not (c.gpu_only and INTERPRET)]
    forced = {tuple(c.kwargs["config"]) for c in runnable if "config" in c.kwargs}
    tables = {
        "CONFIGS": CONFIGS,
        "SPLIT_TABLE": [row[-1] for row in SPLIT_TABLE],
        "TMA_CONFIGS": triton_matmul_tma.TMA_CONFIGS,
    }
    outcomes = []
    for name, rows in tables.items():
        missing = [row for row in rows if tuple(row) not in forced]
        outcomes.append(Outcome(f"every {name} row forced", not missing, note=f"missing {missing}" if missing else ""))
    return outcomes


def cases():
    out = []

    def add(name, fn=check, gpu_only=False, **kwargs):
        out.append(Case(name, fn, kwargs, gpu_only))

    for dtype in DTYPES:
        first = len(out)
        dt = dtype_name(dtype)
        # M, N, K that are multiples of no block, one row, one element, a K tail, a long K
        for m, n, k in [
            (1, 1, 1),
            (17, 17, 17),
            (1, 100, 64),
            (33, 65, 129),
            (100, 300, 70),
            (300, 70, 64),
            (8, 40, 3000),
        ]:
            add(f"({m}, {n}, {k}) {dt}", m=m, n=n, k=k, dtype=dtype)
        for bias, activation in [(True, None), (True, "gelu"), (True, "gelu_tanh"), (True, "silu"), (False, "gelu")]:
            label = "+".join(["bias"] * bias + [activation] * (activation is not None))
            add(f"(33, 65, 129) {dt} {label}", m=33, n=65, k=129, dtype=dtype, bias=bias, activation=activation)
        add(f"(40, 50, 60) {dt} a transposed", m=40, n=50, k=60, dtype=dtype, trans_a=True)
        add(f"(40, 50, 60) {dt} b transposed", m=40, n=50, k=60, dtype=dtype, trans_b=True)
        add(f"(40, 50, 60) {dt} both transposed", m=40, n=50, k=60, dtype=dtype, trans_a=True, trans_b=True)
        add(f"(40, 50, 60) {dt} padded views", m=40, n=50, k=60, dtype=dtype, pad=True)
        for config in CONFIGS:  # each tuned config, forced (the interpreter runs them in fp16)
            add(
                f"config {'x'.join(map(str, config[:3]))} w{config[3]} s{config[4]} {dt}",
                check_config,
                gpu_only=dtype != torch.float16,
                config=config,
                dtype=dtype,
            )
        for config in sorted({row[-1] for row in SPLIT_TABLE}):  # each split-K tile, forced
            add(
                f"split 3 x {'x'.join(map(str, config[:3]))} w{config[3]} s{config[4]} {dt}",
                check_config,
                gpu_only=dtype != torch.float16,
                config=config,
                dtype=dtype,
                split_k=3,
            )
        # split-K forced: one row, odd N, K tails (the last slice shorter), slice counts that do
        # not divide the K steps, each epilogue (applied once, to the full sum), strided inputs
        # (more slices than K steps: lowered to one a step)
        for m, n, k, split_k in [(1, 1, 100, 4), (1, 17, 300, 3), (17, 33, 129, 2), (33, 65, 1000, 5), (20, 50, 64, 7)]:
            add(f"({m}, {n}, {k}) {dt} split {split_k}", m=m, n=n, k=k, dtype=dtype, split_k=split_k)
        for bias, activation in [(True, None), (True, "gelu"), (True, "gelu_tanh"), (True, "silu"), (False, "silu")]:
            label = "+".join(["bias"] * bias + [activation] * (activation is not None))
            add(
                f"(17, 65, 300) {dt} split 3 {label}",
                m=17,
                n=65,
                k=300,
                dtype=dtype,
                bias=bias,
                activation=activation,
                split_k=3,
            )
        add(
            f"(9, 50, 200) {dt} split 2 both transposed",
            m=9,
            n=50,
            k=200,
            dtype=dtype,
            trans_a=True,
            trans_b=True,
            split_k=2,
        )
        add(f"(9, 50, 200) {dt} split 3 padded views", m=9, n=50, k=200, dtype=dtype, pad=True, split_k=3)
        # the persistent TMA kernel forced: edge tiles in M and N, K tails, one row, each epilogue,
        # both layouts of b, padded (aligned) views; a program walks several tiles
        for m, n, k in [(1, 8, 8), (17, 40, 72), (100, 56, 200), (65, 96, 24)]:
            add(f"({m}, {n}, {k}) {dt} TMA", m=m, n=n, k=k, dtype=dtype, kernel="tma")
        for bias, activation in [(True, None), (True, "gelu"), (True, "gelu_tanh"), (False, "silu")]:
            label = "+".join(["bias"] * bias + [activation] * (activation is not None))
            add(
                f"(33, 72, 136) {dt} TMA {label}",
                m=33,
                n=72,
                k=136,
                dtype=dtype,
                bias=bias,
                activation=activation,
                kernel="tma",
            )
        add(f"(40, 56, 64) {dt} TMA b transposed", m=40, n=56, k=64, dtype=dtype, trans_b=True, kernel="tma")
        add(f"(40, 56, 72) {dt} TMA a transposed", m=40, n=56, k=72, dtype=dtype, trans_a=True, kernel="tma")
        add(
            f"(48, 56, 72) {dt} TMA both transposed bias+silu",
            m=48,
            n=56,
            k=72,
            dtype=dtype,
            trans_a=True,
            trans_b=True,
            bias=True,
            activation="silu",
            kernel="tma",
        )
        add(f"(40, 48, 64) {dt} TMA padded views", m=40, n=48, k=64, dtype=dtype, pad=8, kernel="tma")
        for config in triton_matmul_tma.TMA_CONFIGS:
            add(
                f"TMA config {'x'.join(map(str, config[:3]))} w{config[3]} s{config[4]} e{config[5]} {dt}",
                check_tma_config,
                gpu_only=dtype != torch.float16,
                config=config,
                dtype=dtype,
            )
        # matmul's own choice: TMA from TMA_MIN_M rows where it fits, else the pointer kernel
        add(f"(1030, 72, 64) {dt} chosen TMA", m=1030, n=72, k=64, dtype=dtype, planned_kernel="tma")
        add(
            f"(1000, 72, 64) {dt} M < TMA_MIN_M: pointer kernel",
            m=1000,
            n=72,
            k=64,
            dtype=dtype,
            planned_kernel="tiled",
        )
        add(f"(1030, 70, 64) {dt} N = 70: pointer kernel", m=1030, n=70, k=64, dtype=dtype, planned_kernel="tiled")
        add(
            f"(1030, 72, 64) {dt} a transposed, rows 1030 apart (unaligned): pointer kernel",
            m=1030,
            n=72,
            k=64,
            dtype=dtype,
            trans_a=True,
            planned_kernel="tiled",
        )
        # the tiled kernel's own split-K: rows of SPLIT_TABLE, decode shapes with a long K (the
        # interpreter counts its 32x32 tiles on INTERPRET_SMS, where the first two rows are one;
        # the GPU plans these differently)
        for n, k, split_k in [(60, 1000, 4), (100, 520, 2), (250, 300, 2)]:
            add(
                f"(1, {n}, {k}) {dt} tiled, chosen split {split_k}",
                m=1,
                n=n,
                k=k,
                dtype=dtype,
                kernel="tiled",
                planned_split=split_k if INTERPRET else None,
            )
        add(
            f"(1, 60, 1000) {dt} tiled, chosen split 4 bias+gelu_tanh b transposed",
            m=1,
            n=60,
            k=1000,
            dtype=dtype,
            bias=True,
            activation="gelu_tanh",
            trans_b=True,
            kernel="tiled",
            planned_split=4 if INTERPRET else None,
        )
        add(
            f"(2, 100, 520) {dt} no split above M = 1",
            m=2,
            n=100,
            k=520,
            dtype=dtype,
            planned_split=1 if INTERPRET else None,
            planned_kernel="tiled",
        )
        # one row against an nn.Linear weight's transpose: matmul runs the GEMV (gemm/test_gemv.py
        # tests it in depth); against a row-major b, the tiled kernel
        add(
            f"(1, 100, 520) {dt} chosen GEMV b transposed",
            m=1,
            n=100,
            k=520,
            dtype=dtype,
            trans_b=True,
            planned_kernel="gemv",
        )
        add(
            f"(1, 60, 1000) {dt} GEMV bias+silu b transposed",
            m=1,
            n=60,
            k=1000,
            dtype=dtype,
            bias=True,
            activation="silu",
            trans_b=True,
            planned_kernel="gemv",
        )
        add(f"(1, 100, 520) {dt} row-major b: tiled", m=1, n=100, k=520, dtype=dtype, planned_kernel="tiled")
        # full size on the GPU: the tutorial shape, decode, a ragged large shape
        add(f"(4096, 4096, 4096) {dt}", gpu_only=True, m=4096, n=4096, k=4096, dtype=dtype, planned_kernel="tma")
        add(
            f"(4096, 4096, 4096) {dt} pointer kernel",
            gpu_only=True,
            m=4096,
            n=4096,
            k=4096,
            dtype=dtype,
            kernel="tiled",
        )
        add(
            f"(4000, 4104, 4104) {dt} b transposed bias+gelu_tanh",
            gpu_only=True,
            m=4000,
            n=4104,
            k=4104,
            dtype=dtype,
            trans_b=True,
            bias=True,
            activation="gelu_tanh",
            planned_kernel="tma",
        )
        add(
            f"(1, 4096, 4096) {dt} b transposed",
            gpu_only=True,
            m=1,
            n=4096,
            k=4096,
            dtype=dtype,
            trans_b=True,
            planned_kernel="gemv",
        )
        add(
            f"(1, 4096, 4096) {dt} tiled, b transposed",
            gpu_only=True,
            m=1,
            n=4096,
            k=4096,
            dtype=dtype,
            trans_b=True,
            kernel="tiled",
            planned_split=4,
        )
        add(
            f"(1, 4096, 14336) {dt} bias+silu",
            gpu_only=True,
            m=1,
            n=4096,
            k=14336,
            dtype=dtype,
            bias=True,
            activation="silu",
            planned_kernel="tiled",
            planned_split=4,
        )
        add(
            f"(1, 4096, 14336) {dt} bias+silu b transposed",
            gpu_only=True,
            m=1,
            n=4096,
            k=14336,
            dtype=dtype,
            bias=True,
            activation="silu",
            trans_b=True,
            planned_kernel="gemv",
        )
        add(
            f"(3, 4095, 5000) {dt} split 5 bias+gelu",
            gpu_only=True,
            m=3,
            n=4095,
            k=5000,
            dtype=dtype,
            bias=True,
            activation="gelu",
            split_k=5,
        )
        add(f"(128, 4096, 4096) {dt}", gpu_only=True, m=128, n=4096, k=4096, dtype=dtype)
        add(f"(1024, 1024, 1024) {dt}", gpu_only=True, m=1024, n=1024, k=1024, dtype=dtype)
        add(
            f"(1023, 4095, 1000) {dt} bias+gelu",
            gpu_only=True,
            m=1023,
            n=4095,
            k=1000,
            dtype=dtype,
            bias=True,
            activation="gelu",
        )
        # the interpreter runs each of these in one dtype, alternating (the GPU both): every shape,
        # layout, split, epilogue and kernel choice still runs there (the forced configs: fp16)
        one_dtype_here(out[first:], dtype, (check,))
    add(
        "(33, 65, 129) bf16 fp32 bias+silu",
        m=33,
        n=65,
        k=129,
        dtype=torch.bfloat16,
        bias=True,
        bias_dtype=torch.float32,
        activation="silu",
    )
    add(
        "(33, 65, 129) bf16 strided bias+gelu",
        m=33,
        n=65,
        k=129,
        dtype=torch.bfloat16,
        bias="strided",
        activation="gelu",
    )
    add(
        "(40, 64, 64) fp16 strided bias, the TMA kernel",
        m=40,
        n=64,
        k=64,
        dtype=torch.float16,
        bias="strided",
        kernel="tma",
    )
    # backward: each epilogue (in each dtype on the GPU); one row (the GEMV kernel against W.T, the
    # forward writing z from its epilogue too); transposed and padded inputs (gradients laid out
    # like them); subsets of the inputs; an fp32 bias; an expanded upstream gradient; edges in every
    # dimension of the interpreter's 32x32x32 tiles and of the derivative pass's 4x16 blocks
    for dtype in DTYPES:
        first = len(out)
        dt = dtype_name(dtype)
        for bias, activation in [(False, None), (True, None), (True, "gelu"), (True, "gelu_tanh"), (True, "silu")]:
            label = "+".join(["bias"] * bias + [activation or "no activation"])
            add(
                f"backward (33, 65, 70) {dt} {label}",
                check_backward,
                m=33,
                n=65,
                k=70,
                dtype=dtype,
                bias=bias,
                activation=activation,
            )
        add(
            f"backward (1, 40, 72) {dt} GEMV bias+gelu b transposed",
            check_backward,
            m=1,
            n=40,
            k=72,
            dtype=dtype,
            activation="gelu",
            trans_b=True,
        )
        add(f"backward llmk::matmul, llmk::matmul_train {dt}", check_backward_ops, dtype=dtype)
        one_dtype_here(out[first:], dtype, (check_backward, check_backward_ops))  # as the forward's
    add(
        "backward (1, 40, 72) bf16 GEMV b transposed",
        check_backward,
        m=1,
        n=40,
        k=72,
        dtype=torch.bfloat16,
        bias=False,
        trans_b=True,
    )
    add(
        "backward (40, 50, 36) fp16 both transposed gelu_tanh",
        check_backward,
        m=40,
        n=50,
        k=36,
        dtype=torch.float16,
        activation="gelu_tanh",
        trans_a=True,
        trans_b=True,
    )
    add(
        "backward (30, 50, 40) bf16 padded views silu",
        check_backward,
        m=30,
        n=50,
        k=40,
        dtype=torch.bfloat16,
        activation="silu",
        pad=True,
    )
    add(
        "backward (30, 50, 40) fp16 da only gelu",
        check_backward,
        m=30,
        n=50,
        k=40,
        dtype=torch.float16,
        activation="gelu",
        wrt=(0,),
    )
    add(
        "backward (30, 50, 40) bf16 db, dbias gelu b transposed",
        check_backward,
        m=30,
        n=50,
        k=40,
        dtype=torch.bfloat16,
        activation="gelu",
        trans_b=True,
        wrt=(1, 2),
    )
    add("backward (30, 50, 40) fp16 dbias only", check_backward, m=30, n=50, k=40, dtype=torch.float16, wrt=(2,))
    add(
        "backward (30, 50, 40) bf16 fp32 bias silu",
        check_backward,
        m=30,
        n=50,
        k=40,
        dtype=torch.bfloat16,
        bias_dtype=torch.float32,
        activation="silu",
    )
    add(
        "backward (30, 50, 40) bf16 expanded dc bias",
        check_backward,
        m=30,
        n=50,
        k=40,
        dtype=torch.bfloat16,
        expanded_dc=True,
    )
    add(
        "backward (30, 50, 40) fp16 expanded dc gelu",
        check_backward,
        m=30,
        n=50,
        k=40,
        dtype=torch.float16,
        activation="gelu",
        expanded_dc=True,
    )
    # full size on the GPU: the TMA kernel for both backward GEMMs (a.T and b.T read in place)
    add(
        "backward (4096, 4096, 4096) bf16 bias+gelu",
        check_backward,
        gpu_only=True,
        m=4096,
        n=4096,
        k=4096,
        dtype=torch.bfloat16,
        activation="gelu",
    )
    add(
        "backward (8192, 14336, 4096) bf16 bias+silu",
        check_backward,
        gpu_only=True,
        m=8192,
        n=14336,
        k=4096,
        dtype=torch.bfloat16,
        activation="silu",
    )
    add(
        "backward (8192, 4096, 14336) bf16 b transposed",
        check_backward,
        gpu_only=True,
        m=8192,
        n=4096,
        k=14336,
        dtype=torch.bfloat16,
        bias=False,
        trans_b=True,
    )
    add(
        "backward (4000, 4104, 4104) fp16 b transposed bias+gelu_tanh",
        check_backward,
        gpu_only=True,
        m=4000,
        n=4104,
        k=4104,
        dtype=torch.float16,
        activation="gelu_tanh",
        trans_b=True,
    )
    add(
        "backward (2048, 4096, 4096) bf16 a transposed bias",
        check_backward,
        gpu_only=True,
        m=2048,
        n=4096,
        k=4096,
        dtype=torch.bfloat16,
        trans_a=True,
    )
    add(
        "backward (1, 4096, 4096) bf16 GEMV bias+silu b transposed",
        check_backward,
        gpu_only=True,
        m=1,
        n=4096,
        k=4096,
        dtype=torch.bfloat16,
        activation="silu",
        trans_b=True,
    )
    # LLM projections, bf16: (M tokens, K in, N out) for a 4096-wide model with a 14336-wide MLP
    for m in (1, 16, 128, 2048):
        for k, n in ((4096, 14336), (14336, 4096)):
            add(f"LLM ({m}, {n}, {k}) bf16", gpu_only=True, m=m, n=n, k=k, dtype=torch.bfloat16)
    add(
        "(2048, 14336, 4096) fp16 bias+silu",
        gpu_only=True,
        m=2048,
        n=14336,
        k=4096,
        dtype=torch.float16,
        bias=True,
        activation="silu",
    )
    out += [
        Case("autotune candidates", check_prune),
        Case("split-K plan", check_split_plan),
        Case("TMA: which arguments fit", check_tma_fits),
        Case("TMA autotune candidates", check_tma_prune),
        Case("which kernel runs", check_kernel_choice),
        Case("allocates its output", check_own_buffer),
        Case("empty input", check_empty),
        Case("bad input", check_errors),
        Case("grad mode: out= forward-only, no_grad unchanged", check_grad_mode),
        Case("backward: empty products", check_backward_empty),
        Case("2^31+ output elements", check_huge, gpu_only=True),
        Case("every launch-table row forced", check_tables_forced),
    ]
    return out


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("matmul", CASES)
