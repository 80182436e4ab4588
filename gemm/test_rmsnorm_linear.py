"""Tests for gemm/triton_rmsnorm_linear.py against the fp64 rmsnorm(x) @ W^T of the same inputs
and PyTorch's same-dtype F.rms_norm followed by torch.matmul; each path by itself and as chosen,
and the decode kernel at set configs (split K, several row tiles, K steps with a masked tail)
into a NaN-filled output.

    python gemm/test_rmsnorm_linear.py        (or: pytest gemm/test_rmsnorm_linear.py)

Tolerance (per element, against the fp64 reference): both paths round the normalized input to
the input dtype before the dot (the fused path rounds x * norm_weight, the unfused one x * rstd *
norm_weight), which PyTorch does as well. Each rounding is a relative error of at most u (2^-11
fp16, 2^-8 bf16), with random sign, on one of K terms, so the error of an output is about
u / sqrt(3) times the root-sum-square of its terms, which is the size of a typical output, T
(the rms of the reference). The largest of a million such errors is near 5.5 standard deviations,
3.2u T: atol = 8u T, and rtol the final rounding (one ulp, devtools.testing.TOLERANCES). fp32
accumulation adds nothing visible at this scale. The 2x-PyTorch rule is the tighter guard.
Backward: gradients of x, norm_weight and weight (devtools.testing.check_grads) against autograd
through the fp64 reference and PyTorch's F.rms_norm and matmul in the same dtype; the same error
model with up to two roundings per term (gemm.matmul_cases.grad_tolerance).
"""

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.testing import (
    TOLERANCES,
    UNIT_ROUNDOFF,
    Case,
    Outcome,
    Tol,
    check_grads,
    compare,
    dtype_name,
    expect_raises,
    main,
    poisoned,
    rand,
)
from llmk.gemm.matmul_cases import grad_tolerance
from llmk.gemm.triton_rmsnorm_linear import DECODE_TABLE, PATH_TABLE, PATHS, choose_path, launch_decode, rmsnorm_linear
from llmk.normalization.reference_rmsnorm import rmsnorm_ref

EPS = 1e-6
DTYPES = (torch.float16, torch.bfloat16)


def outcome(check, x, norm_weight, weight, y):
    """y against the fp64 reference of x, norm_weight, weight, and against PyTorch's error."""
    ref = rmsnorm_ref(x.double(), norm_weight.double(), EPS) @ weight.double().t()
    typical = ref.pow(2).mean().sqrt().item()
    tol = Tol(
        max(1e-5, 8 * UNIT_ROUNDOFF[x.dtype] * typical),
        TOLERANCES[x.dtype].rtol,
        "one rounding of each normalized input, one of the output",
    )
    torch_out = None
    if norm_weight.dtype == x.dtype:  # F.rms_norm wants one dtype
        torch_out = torch.matmul(F.rms_norm(x, (x.shape[-1],), norm_weight, EPS), weight.t())
    return compare(check, y, ref, tol, torch_out=torch_out)


def inputs(shape, n, dtype, pad=False, scale=1.0, norm_dtype=None):
    """x (..., K), W (N, K), norm_weight (K,). pad: x and W as views with wider row strides and
    norm_weight as every other element of a longer vector; "x^T": x as the transpose of a (K, M)
    tensor (unit row stride, column stride M); "W^T": W as the transpose of a (K, N) tensor."""
    k = shape[-1]
    if pad == "x^T":
        x = rand(shape[::-1], dtype, scale=scale).t()
    else:
        x = rand(shape, dtype, pad=(0,) * (len(shape) - 1) + (8,) if pad else None, scale=scale)
    if pad == "W^T":
        weight = rand((k, n), dtype, scale=k**-0.5).t()
    else:
        weight = rand((n, k), dtype, pad=(0, 24) if pad else None, scale=k**-0.5)
    norm_weight = rand((2 * k,), norm_dtype or dtype)[::2] if pad is True else rand((k,), norm_dtype or dtype)
    return x, norm_weight, weight


def check(shape, n, dtype, paths=PATHS + (None,), **kwargs):
    """Each path of `paths` (None: the one PATH_TABLE chooses) through rmsnorm_linear."""
    x, norm_weight, weight = inputs(shape, n, dtype, **kwargs)
    return [
        outcome(
            f"y, {path or 'chosen: ' + choose_path(x.numel() // shape[-1])}",
            x,
            norm_weight,
            weight,
            rmsnorm_linear(x, norm_weight, weight, EPS, path=path),
        )
        for path in paths
    ]


def check_decode(shape, n, dtype, config, **kwargs):
    """The decode path at `config` (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages),
    writing a NaN-filled y: an element it leaves unwritten fails. Twice, on fresh inputs: split K
    must leave its arrival counters ready for the next launch."""
    out = []
    for launch in ("1st", "2nd"):
        x, norm_weight, weight = inputs(shape, n, dtype, **kwargs)
        y = poisoned((shape[0], n), dtype)
        launch_decode(x, norm_weight, weight, EPS, y, config=config)
        out.append(outcome(f"y, {launch} launch", x, norm_weight, weight, y))
    return out


def check_empty():
    w, nw = rand((6, 8), torch.float16), rand((8,), torch.float16)
    no_rows = rmsnorm_linear(rand((0, 8), torch.float16), nw, w)
    no_cols = rmsnorm_linear(rand((2, 3, 8), torch.float16), nw, rand((0, 8), torch.float16))
    zero_k = rmsnorm_linear(rand((3, 0), torch.bfloat16), rand((0,), torch.bfloat16), rand((5, 0), torch.bfloat16))
    return [
        Outcome("M = 0: empty (0, N)", tuple(no_rows.shape) == (0, 6)),
        Outcome("N = 0: empty (..., 0)", tuple(no_cols.shape) == (2, 3, 0)),
        compare("K = 0: zeros", zero_k, torch.zeros(3, 5, dtype=torch.float64, device=DEVICE)),
    ]


def check_errors():
    x, nw, w = rand((4, 64), torch.float16), rand((64,), torch.float16), rand((32, 64), torch.float16)
    other = "cpu" if DEVICE == "cuda" else "meta"
    return [
        expect_raises("fp32 x", lambda: rmsnorm_linear(x.float(), nw, w.float()), TypeError, "x"),
        expect_raises("weight bf16, x fp16", lambda: rmsnorm_linear(x, nw, w.bfloat16()), TypeError, "weight"),
        expect_raises("weight (K, N)", lambda: rmsnorm_linear(x, nw, w.t().contiguous()), ValueError, "weight"),
        expect_raises("1-D weight", lambda: rmsnorm_linear(x, nw, w[0]), ValueError, "weight"),
        expect_raises("norm_weight size", lambda: rmsnorm_linear(x, nw[:63], w), ValueError, "norm_weight"),
        expect_raises("norm_weight None", lambda: rmsnorm_linear(x, None, w), TypeError, "norm_weight"),
        expect_raises("int norm_weight", lambda: rmsnorm_linear(x, nw.to(torch.int32), w), TypeError, "norm_weight"),
        expect_raises("eps < 0", lambda: rmsnorm_linear(x, nw, w, -1.0), ValueError, "eps"),
        expect_raises("eps True", lambda: rmsnorm_linear(x, nw, w, True), TypeError, "eps"),
        expect_raises("path True", lambda: rmsnorm_linear(x, nw, w, path=True), ValueError, "path"),
        expect_raises("unknown path", lambda: rmsnorm_linear(x, nw, w, path="split"), ValueError, "path"),
        expect_raises("0-d x", lambda: rmsnorm_linear(x[0, 0], nw, w, path="decode"), ValueError, "x"),
        expect_raises(
            "weight (N, K + 1), decode",
            lambda: rmsnorm_linear(x, nw, rand((32, 65), torch.float16), path="decode"),
            ValueError,
            "weight",
        ),
        expect_raises(f"x on {other}", lambda: rmsnorm_linear(x.to(other), nw.to(other), w.to(other)), ValueError, "x"),
        expect_raises("weight elsewhere", lambda: rmsnorm_linear(x, nw, w.to(other)), ValueError, "weight"),
        expect_raises("not a tensor", lambda: rmsnorm_linear([1.0], nw, w), TypeError, "x"),
    ]


def check_backward(shape, n, dtype, path=None, wrt=(0, 1, 2), **kwargs):
    """Gradients of rmsnorm_linear for the inputs at `wrt` (0 x, 1 norm_weight, 2 weight) against
    autograd through the fp64 reference and PyTorch's same-dtype F.rms_norm and matmul (norm_weight
    cast to x's dtype there when it is fp32); the others get None. path: the forward's."""
    x, norm_weight, weight = inputs(shape, n, dtype, **kwargs)

    def torch_fn(x, nw, w):
        return torch.matmul(F.rms_norm(x, (x.shape[-1],), nw.to(x.dtype), EPS), w.t())

    return check_grads(
        f"path {path}",
        lambda x, nw, w: rmsnorm_linear(x, nw, w, EPS, path=path),
        lambda x, nw, w: rmsnorm_ref(x, nw, EPS) @ w.t(),
        (x, norm_weight, weight),
        wrt,
        ("x", "norm_weight", "weight"),
        grad_tolerance(dtype),
        torch_fn=torch_fn,
    )


def check_backward_empty():
    """Gradients with no rows, no output columns or K = 0: zeros (or empty) of each input's shape."""
    outcomes = []
    for shape, n in (((0, 8), 6), ((2, 3, 8), 0), ((3, 0), 5)):
        x, nw, w = (rand(s, torch.bfloat16).requires_grad_() for s in (shape, (shape[-1],), (n, shape[-1])))
        y = rmsnorm_linear(x, nw, w, EPS)
        grads = torch.autograd.grad(y, (x, nw, w), torch.randn(y.shape, device=DEVICE).to(y.dtype))
        outcomes += [
            Outcome(
                f"x {shape}, N = {n}: d{name} zeros {tuple(t.shape)}",
                g.shape == t.shape and g.dtype == t.dtype and not g.any(),
            )
            for name, g, t in zip(("x", "norm_weight", "weight"), grads, (x, nw, w))
        ]
    return outcomes


def check_grad_mode():
    """Under torch.no_grad() each path gives the same bits as on plain tensors."""
    x, nw, w = rand((3, 64), torch.float16), rand((64,), torch.float16), rand((24, 64), torch.float16)
    grad = [t.clone().requires_grad_() for t in (x, nw, w)]
    outcomes = []
    for path in PATHS:
        with torch.no_grad():
            y = rmsnorm_linear(*grad, EPS, path=path)
        outcomes += [
            outcome(f"no_grad, {path}: y", x, nw, w, y),
            Outcome(
                f"no_grad, {path}: as on plain tensors",
                torch.equal(y, rmsnorm_linear(x, nw, w, EPS, path=path)) and not y.requires_grad,
            ),
        ]
    return outcomes


# Decode configs (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) at which the small
# shapes below take several K steps, several row tiles and a column tile that wraps past N
DECODE_CASES = [
    ((5, 200), 40, (16, 16, 32, 3, 4, 1)),  # split K: 7 steps in splits of 3, 3 and 1 (masked tail)
    ((33, 256), 40, (32, 16, 32, 4, 4, 1)),  # split K, every step full; two row tiles
    ((20, 96), 24, (16, 32, 32, 1, 4, 2)),  # no split; two row tiles; one column tile wider than N
    ((3, 200), 20, (1, 8, 64, 1, 4, 2)),  # the GEMV kernel, one program row per row of x; K tail
]


def table_config(row):
    """launch_decode's config for a DECODE_TABLE row: its tile, warps and stages, K split in two (the
    GEMV kernel's row, BLOCK_M 1, does not split)."""
    _, block_m, block_n, block_k, warps, stages = row
    return block_m, block_n, block_k, 1 if block_m == 1 else 2, warps, stages


def check_tables_forced():
    """Every DECODE_TABLE row is forced by a case that runs on this device, and every PATH_TABLE
    path by `check`."""
    runnable = [c for c in CASES if not (c.gpu_only and INTERPRET)]
    forced = {tuple(c.kwargs["config"]) for c in runnable if c.fn is check_decode}
    missing = [row for row in DECODE_TABLE if table_config(row) not in forced]
    paths = {path for _, path in PATH_TABLE}
    return [
        Outcome("every DECODE_TABLE row forced", not missing, note=f"missing {missing}" if missing else ""),
        Outcome("every PATH_TABLE path run", paths <= set(PATHS) and any(c.fn is check for c in runnable)),
    ]


def cases():
    out = []

    def add(name, fn=check, gpu_only=False, **kwargs):
        out.append(Case(name, fn, kwargs, gpu_only))

    # the largest M that the decode path takes (32 when PATH_TABLE gives it none)
    switch = next((max_m for max_m, path in PATH_TABLE if path == "decode"), 32)
    for dtype in DTYPES:
        dt = dtype_name(dtype)
        # M from one row to either side of the path switch and of the decode table's 64-row tiles;
        # K and N multiples of no block
        for m in sorted({1, 17, switch, switch + 1, 64, 65}):
            add(f"M={m} K=130 N=70 {dt}", shape=(m, 130), n=70, dtype=dtype)
        add(f"(2, 3, 96) N=50 {dt}", shape=(2, 3, 96), n=50, dtype=dtype)
        add(f"M=5 K=64 N=40 {dt} strided views", shape=(5, 64), n=40, dtype=dtype, pad=True)
        add(f"M=9 K=80 N=24 {dt} x^T", shape=(9, 80), n=24, dtype=dtype, pad="x^T")
        add(f"M=3 K=1000 N=24 {dt}", shape=(3, 1000), n=24, dtype=dtype)
        for shape, n, config in DECODE_CASES:
            add(
                f"decode {config} M={shape[0]} K={shape[1]} N={n} {dt}",
                check_decode,
                shape=shape,
                n=n,
                dtype=dtype,
                config=config,
            )
        for shape, n, config in DECODE_CASES[::3]:  # split K and the GEMV kernel on strided views
            add(
                f"decode {config} M={shape[0]} K={shape[1]} N={n} {dt} strided views",
                check_decode,
                shape=shape,
                n=n,
                dtype=dtype,
                config=config,
                pad=True,
            )
        # LLM shapes on the GPU, M from decode to prefill, each path
        for m in (1, 4, 16, 32, 33, 64, 65, 256, 1024, 2048):
            add(f"M={m} K=4096 N=4096 {dt}", gpu_only=True, shape=(m, 4096), n=4096, dtype=dtype)
    for m in (1, 16, 32, 64):
        add(f"M={m} K=4096 N=14336 bf16", gpu_only=True, shape=(m, 4096), n=14336, dtype=torch.bfloat16)
    for m in (1, 4, 32, 64):
        add(f"M={m} K=14336 N=4096 fp16", gpu_only=True, shape=(m, 14336), n=4096, dtype=torch.float16)
    add("M=4 K=96 N=40 bf16 x*1e4", shape=(4, 96), n=40, dtype=torch.bfloat16, scale=1e4)  # squares past fp16
    add("M=4 K=96 N=40 fp16 x*100", shape=(4, 96), n=40, dtype=torch.float16, scale=100.0)  # squares past fp16
    add("M=4 K=96 N=40 bf16 fp32 norm_weight", shape=(4, 96), n=40, dtype=torch.bfloat16, norm_dtype=torch.float32)
    out += [
        Case("empty input", check_empty),
        Case("bad input", check_errors),
        Case("grad mode: no_grad unchanged", check_grad_mode),
        Case("backward: empty", check_backward_empty),
    ]
    # backward: either path's forward (decode at M <= 16, unfused above), 3-D x, strided views, x
    # and W transposed (dweight laid out like W), subsets of the inputs, an fp32 norm_weight
    for dtype in DTYPES:
        dt = dtype_name(dtype)
        add(f"backward M=5 K=72 N=40 {dt} decode", check_backward, shape=(5, 72), n=40, dtype=dtype)
        add(f"backward M=33 K=72 N=40 {dt} unfused", check_backward, shape=(33, 72), n=40, dtype=dtype)
    add("backward (2, 3, 96) N=50 bf16", check_backward, shape=(2, 3, 96), n=50, dtype=torch.bfloat16)
    add("backward M=5 K=64 N=40 fp16 strided views", check_backward, shape=(5, 64), n=40, dtype=torch.float16, pad=True)
    add("backward M=9 K=80 N=24 bf16 x^T", check_backward, shape=(9, 80), n=24, dtype=torch.bfloat16, pad="x^T")
    add("backward M=9 K=80 N=24 fp16 W^T", check_backward, shape=(9, 80), n=24, dtype=torch.float16, pad="W^T")
    add(
        "backward M=20 K=48 N=40 bf16 dweight only",
        check_backward,
        shape=(20, 48),
        n=40,
        dtype=torch.bfloat16,
        wrt=(2,),
    )
    add("backward M=20 K=48 N=40 fp16 dx only", check_backward, shape=(20, 48), n=40, dtype=torch.float16, wrt=(0,))
    add(
        "backward M=20 K=48 N=40 bf16 dnorm_weight, dweight",
        check_backward,
        shape=(20, 48),
        n=40,
        dtype=torch.bfloat16,
        wrt=(1, 2),
    )
    add(
        "backward M=20 K=48 N=40 bf16 fp32 norm_weight",
        check_backward,
        shape=(20, 48),
        n=40,
        dtype=torch.bfloat16,
        norm_dtype=torch.float32,
    )
    for m, n, path in ((16, 4096, None), (4096, 4096, None), (8192, 14336, None), (2048, 4096, "decode")):
        add(
            f"backward M={m} K=4096 N={n} bf16 {path or 'chosen'}",
            check_backward,
            gpu_only=True,
            shape=(m, 4096),
            n=n,
            dtype=torch.bfloat16,
            path=path,
        )
    # each DECODE_TABLE row, forced: a row tile and a column tile past M and N, K in two splits with a
    # masked tail (the interpreter runs them in fp16)
    for dtype in DTYPES:
        for row in DECODE_TABLE:
            config = table_config(row)
            m = 3 if config[0] == 1 else config[0] + 3
            add(
                f"decode table {config} M={m} {dtype_name(dtype)}",
                check_decode,
                gpu_only=dtype != torch.float16,
                shape=(m, 3 * config[2] + 7),
                n=config[1] + 5,
                dtype=dtype,
                config=config,
            )
    out.append(Case("every launch-table row forced", check_tables_forced))
    return out


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("rmsnorm_linear", CASES)
