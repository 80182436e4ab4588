"""Tests for gemm/fp8_ops.py: quantize_fp8 against the same formula in PyTorch, bit for bit, and
fp8_matmul against the fp64 product of the dequantized inputs and PyTorch's own FP8 product.

    python gemm/test_fp8.py        (or: pytest gemm/test_fp8.py)

quantize_fp8: scale = max(amax, AMAX_FLOOR) / 448 and q = e4m3(clamp(x * (448 / amax))) are one
IEEE division, one multiply and one rounding to nearest even each, in fp32 on both sides: the
kernel's q and scale must equal PyTorch's exactly (EXACT), in buffers poisoned with NaN.
fp8_matmul: the products of e4m3 values are exact, so the error model is matmul's
(gemm/matmul_cases.py: fp32 accumulation over K, one rounding to the output dtype) on the
dequantized operands a * scale_a and b * scale_b, plus one fp32 rounding a scaling (2^-24, far
inside it), plus on a GPU the tensor cores' 128-term sums (PROMOTED_SUM_ERROR). The PyTorch baseline
of the 2x rule is torch._scaled_mm for row-wise scales where its shape rules allow, and the
dequantized product in fp32 rounded once for block scales (which _scaled_mm takes on some CUDA GPUs
only) and the other shapes; bias and activation as separate ops after it, as matmul's tests do. A
scale ignored, a block's scale applied to the wrong 128 values of K or of N, or a tile left
unwritten is off by whole terms.
"""

import torch

from llmk.common.device import DEVICE, INTERPRET, sm_count
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
    table_entry,
)
from llmk.gemm import triton_fp8_matmul_tma
from llmk.gemm.fp8_cases import poisoned_fp8, same_bits
from llmk.gemm.fp8_linear_ops import FAST_ACCUM, fp8_linear, fp8_linear_op
from llmk.gemm.fp8_ops import FP8, FP8_TMA_MIN_M, fp8_matmul, fp8_matmul_op, quantize_fp8, quantize_fp8_op
from llmk.gemm.matmul_cases import TORCH_ACTIVATIONS, tolerance
from llmk.gemm.reference_fp8 import reference_quantize
from llmk.gemm.triton_fp8_matmul import (
    BLOCK_CONFIG_TABLE,
    CONFIG_TABLE,
    FAST_CONFIG_TABLE,
    INTERPRET_CONFIG,
    INTERPRET_LARGE_CONFIG,
    launch_fp8_matmul,
)
from llmk.gemm.triton_fp8_matmul_tma import FAST_TMA_TABLE, FP8_TMA_TABLE, INTERPRET_SMS, fits, launch_fp8_matmul_tma
from llmk.gemm.triton_fp8_producers import rmsnorm_fp8
from llmk.gemm.triton_fp8_quant import GROUP, launch_quantize_both, launch_quantize_fp8, scale_shape
from llmk.normalization.triton_rmsnorm import rmsnorm


def marked(x, zero_rows=(), zero_cols=(), outlier=None, nan_at=None):
    """x with the quantize cases' marks, in place: rows and columns of zeros, the first column set to
    `outlier` (the rest of each row lands on e4m3's subnormals and signed zeros), a NaN at nan_at
    (its groups' scales and values are NaN, as PyTorch's amax makes them)."""
    for r in zero_rows:
        x[r] = 0
    for c in zero_cols:
        x[:, c] = 0
    if outlier is not None:
        x[:, 0] = outlier
    if nan_at is not None:
        x[nan_at] = float("nan")
    return x


def check_quantize(
    m, k, dtype, granularity, transposed=False, scale=1.0, zero_rows=(), one_pass=None, outlier=None, nan_at=None, pad=0
):
    """quantize_fp8's q and scale against reference_quantize, bit for bit, in poisoned buffers
    (one_pass forces the row-wise kernel's path), and the public function's once more. transposed:
    x a column-major view (the column kernels' input, row-wise), of a (k, m + pad) tensor. outlier:
    the first column set to it, so that the rest of each group lands on e4m3's subnormals and signed
    zeros."""
    x = rand((k, m + pad), dtype, scale=scale)[:, :m].t() if transposed else rand((m, k), dtype, scale=scale)
    marked(x, zero_rows, outlier=outlier, nan_at=nan_at)
    want_q, want_s = reference_quantize(x, granularity)
    q, s = poisoned_fp8((m, k)), poisoned(scale_shape(m, k, granularity), torch.float32)
    launch_quantize_fp8(x, q, s, granularity, one_pass=one_pass)
    q2, s2 = quantize_fp8(x, granularity)
    return [
        same_bits("q", q, want_q),
        compare("scale", s, want_s, EXACT),
        same_bits("q, quantize_fp8", q2, want_q),
        compare("scale, quantize_fp8", s2, want_s, EXACT),
    ]


def check_quantize_both(m, k, dtype, pad=0, scale=1.0, zero_rows=(), zero_cols=(), outlier=None, nan_at=None):
    """launch_quantize_both's four outputs (x's row-wise cast and x.T's) against reference_quantize of
    x and of x.T, bit for bit, in poisoned buffers. pad: x a view of (m, k + pad) values a row;
    outlier: the first column set to it (subnormals and signed zeros in the rows' casts)."""
    x = marked(rand((m, k + pad), dtype, scale=scale)[:, :k], zero_rows, zero_cols, outlier, nan_at)
    want_q, want_s = reference_quantize(x, "row")
    want_qt, want_st = reference_quantize(x.T, "row")
    q, s = poisoned_fp8((m, k)), poisoned((m,), torch.float32)
    qt, st = poisoned_fp8((k, m)), poisoned((k,), torch.float32)
    launch_quantize_both(x, q, s, qt, st)
    return [
        same_bits("q (rows)", q, want_q),
        compare("scale (rows)", s, want_s, EXACT),
        same_bits("qt (columns)", qt, want_qt),
        compare("scale_t (columns)", st, want_st, EXACT),
    ]


def check_quantize_edges():
    """Empty inputs give empty q (scales of K = 0 rows are 0); x ~ q * scale within e4m3's half
    ulp (2^-4 relative) for values near the group's max; the operator's opcheck."""
    outcomes = []
    for shape, granularity in (((0, 128), "row"), ((5, 0), "row"), ((0, 256), "1x128"), ((0, 128), "128x128")):
        q, s = quantize_fp8(rand(shape, torch.bfloat16), granularity)
        ok = tuple(q.shape) == shape and q.dtype == FP8 and tuple(s.shape) == scale_shape(*shape, granularity)
        outcomes.append(Outcome(f"empty {shape} {granularity}", ok and bool((s == 0).all())))
    x = rand((16, 300), torch.float32)
    q, s = quantize_fp8(x)
    big = x.abs() >= x.abs().amax(1, keepdim=True) / 2  # normal e4m3 values: relative error <= 2^-4
    err = ((q.float() * s[:, None] - x).abs() / x.abs())[big].max().item()
    outcomes.append(Outcome("dequantized within e4m3's half ulp (2^-4)", err <= 2**-4, note=f"{err:.3g}"))
    outcomes.append(opcheck("opcheck llmk::quantize_fp8", quantize_fp8_op.overload, (x, "row")))
    return outcomes


def check_quantize_errors():
    x = rand((4, 256), torch.bfloat16)
    return [
        expect_raises("int x", lambda: quantize_fp8(x.to(torch.int32)), TypeError, "x"),
        expect_raises("1-D x", lambda: quantize_fp8(x[0]), ValueError, "x"),
        expect_raises("3-D x", lambda: quantize_fp8(x[None]), ValueError, "x"),
        expect_raises("granularity", lambda: quantize_fp8(x, "tensor"), ValueError, "granularity"),
        expect_raises("K not a multiple of 128", lambda: quantize_fp8(x[:, :200], "1x128"), ValueError, "128"),
        expect_raises("not a tensor", lambda: quantize_fp8([[1.0]]), TypeError, "x"),
    ]


def expand_blocks(scale, rows, cols, block_rows, block_cols):
    """A scale per (block_rows x block_cols) block, spread over the (rows, cols) values it scales."""
    return scale.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)[:rows, :cols]


def fp8_inputs(m, n, k, granularity, weight_layout=True, pad=False):
    """(a, b, scale_a, scale_b, a_deq, b_deq): a (M, K) quantized with `granularity` ("row" or
    "block": a 1 x 128, W 128 x 128), b = W.T for W (N, K) quantized (weight_layout) or b (K, N)
    quantized by columns as its own row-major tensor; the dequantized operands in fp64."""
    x = rand((m, k + 8 if pad else k), torch.bfloat16)[:, :k]
    w = rand((n, k), torch.bfloat16)
    if granularity == "row":
        a, sa = quantize_fp8(x)
        if weight_layout:
            qw, sw = quantize_fp8(w)
            b, sb = qw.T, sw
        else:  # b (K, N) row-major: its columns are the rows of the quantized b.T, copied back
            qw, sw = quantize_fp8(w)
            b, sb = qw.T.contiguous(), sw
        a_deq = a.double() * sa.double()[:, None]
        b_deq = b.double() * sb.double()[None, :]
    else:
        a, sa = quantize_fp8(x, "1x128")
        qw, sw = quantize_fp8(w, "128x128")
        b, sb = (qw.T, sw.T) if weight_layout else (qw.T.contiguous(), sw.T.contiguous())
        a_deq = a.double() * expand_blocks(sa.double(), m, k, 1, GROUP)
        b_deq = b.double() * expand_blocks(sb.double(), k, n, GROUP, GROUP)
    return a, b, sa, sb, a_deq, b_deq


def torch_fp8(a, b, sa, sb, a_deq, b_deq, bias, activation, out_dtype):
    """PyTorch's FP8 product (row-wise: torch._scaled_mm, which on CUDA takes K and N multiples of
    16 only; blocks and other shapes: the dequantized product in fp32, rounded once), then the bias
    and the activation as separate ops in out_dtype."""
    if sa.dim() == 1 and a.shape[1] % 16 == 0 and b.shape[1] % 16 == 0:
        y = torch._scaled_mm(a, b.T.contiguous().T, scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=out_dtype)
    else:
        y = (a_deq.float() @ b_deq.float()).to(out_dtype)
    if bias is not None:
        y = y + bias.to(out_dtype)
    return TORCH_ACTIVATIONS[activation](y)


# The tensor cores sum 128 e4m3 products with about 14 significant bits before each joins the fp32
# sum (gemm/triton_fp8_matmul.py): each of the ~128 additions can drop up to 2^-13 of a partial
# sum of the element's size, rss (the root-sum-square of its terms, which a partial sum of random
# signs stays near). Random over the additions that is ~sqrt(128) 2^-13 rss a step, and over K / 128
# steps again at most a few times that: PROMOTED_SUM_ERROR x rss bounds it with room. The
# interpreter sums in fp32 (numpy): no such term there.
PROMOTED_SUM_ERROR = 2**-7
# Not promoted (fast_accum), each wgmma adds its 32 products into a running sum of ~14 bits, which
# can drop up to 2^-13 of the sum a time, all the same way (the hardware truncates): K / 32 of
# those on top, FAST_SUM_ERROR x rss each. The H200 measured 0.6-1.2% of the largest output at K
# 4096-14336, inside this bound's 1.6-5.5% of rss (rss is about the outputs' size).
FAST_SUM_ERROR = 2**-13


def fp8_tolerance(a, b, dtype, promote=True):
    """matmul's tolerance (gemm/matmul_cases.py) of a @ b for the dequantized operands (fp64), out
    dtype `dtype`, plus the tensor cores' short sums on a GPU (PROMOTED_SUM_ERROR), and without
    promotion their running sum's (FAST_SUM_ERROR a wgmma)."""
    tol = tolerance(a.to(dtype), b.to(dtype))
    if INTERPRET:
        return tol
    rss = (a.pow(2) @ b.pow(2)).sqrt()
    sums = PROMOTED_SUM_ERROR + (0 if promote else FAST_SUM_ERROR * -(-a.shape[1] // 32))
    return Tol(
        tol.atol + sums * rss,
        tol.rtol,
        "fp32 sums of the tensor cores' 128-term sums, one rounding"
        if promote
        else "the tensor cores' sums over all of K, one rounding",
        rounding_check=False,
    )


def check_matmul(
    m,
    n,
    k,
    granularity,
    out_dtype=torch.bfloat16,
    bias=False,
    bias_dtype=None,
    activation=None,
    weight_layout=True,
    pad=False,
    config=None,
    promote=True,
    kernel=None,
    bias_stride=1,
):
    """fp8_matmul (or a kernel forced, "ptr" or "tma", with its config or its table's; promote=False:
    the row-wise sums not promoted, fp8_matmul's fast_accum) into a poisoned buffer against the fp64 product of
    the dequantized operands, and PyTorch's own FP8 product's error. Through fp8_matmul at
    FP8_TMA_MIN_M rows or more, also that it launched the TMA kernel (counted). bias_stride: the
    bias an (N,) view with that stride."""
    a, b, sa, sb, a_deq, b_deq = fp8_inputs(m, n, k, granularity, weight_layout, pad)
    bias_t = rand((n * bias_stride,), bias_dtype or out_dtype)[::bias_stride] if bias else None
    outcomes = []
    if kernel is None and config is None:
        launches = []

        def counted(*args, **kw):
            launches.append(1)
            return launch_fp8_matmul_tma(*args, **kw)

        with table_entry(vars(triton_fp8_matmul_tma), "launch_fp8_matmul_tma", counted):
            c = fp8_matmul(a, b, sa, sb, bias_t, activation, out_dtype, fast_accum=not promote)
        if m >= FP8_TMA_MIN_M and granularity == "row" and weight_layout and not pad:
            outcomes.append(Outcome("launched the TMA kernel once", len(launches) == 1, note=str(len(launches))))
    elif kernel == "tma":
        c = poisoned((m, n), out_dtype)
        launch_fp8_matmul_tma(
            a, b, sa, sb, bias_t, activation, c, sm_count(a.device, INTERPRET_SMS), config, promote=promote
        )
    else:
        c = poisoned((m, n), out_dtype)
        launch_fp8_matmul(a, b, sa, sb, bias_t, activation, c, config, promote=promote)
    want = a_deq @ b_deq
    if bias_t is not None:
        want = want + bias_t.double()
    want = TORCH_ACTIVATIONS[activation](want)
    tol = fp8_tolerance(a_deq, b_deq, out_dtype, promote or granularity != "row")
    return outcomes + [
        compare("c", c, want, tol, torch_out=torch_fp8(a, b, sa, sb, a_deq, b_deq, bias_t, activation, out_dtype))
    ]


def check_matmul_config(config, granularity, kernel="ptr", promote=True):
    """One CONFIG_TABLE row (or FP8_TMA_TABLE's, kernel "tma"), forced, on a shape with edge tiles in
    M and N and a K tail (row-wise; the TMA kernel's N and K keep its rows 16-byte aligned)."""
    bm, bn, bk = config[:3]
    k = 2 * bk + (0 if granularity == "block" else 48 if kernel == "tma" else 40)
    n = bn + (8 if kernel == "tma" else 5)
    return check_matmul(
        bm + 3, n, k, granularity, bias=True, activation="silu", config=config, kernel=kernel, promote=promote
    )


def check_tma_fits():
    """The TMA kernel's layout rule: a by rows and b = W.T, 16-byte row strides (rows of K a multiple
    of 16 values, c's of 8), aligned bases; anything else runs the pointer kernel."""
    a, w = poisoned_fp8((64, 128)), poisoned_fp8((48, 128))
    c = poisoned((64, 48), torch.bfloat16)
    cases = {
        "a by rows, b = W.T": (a, w.T, c, True),
        "b row-major": (a, w.T.contiguous(), c, False),
        "a transposed": (poisoned_fp8((128, 64)).T, w.T, c, False),
        "rows of K 100": (poisoned_fp8((64, 100)), poisoned_fp8((48, 100)).T, c, False),
        "K 100 of rows of 128": (a[:, :100], w[:, :100].T, c, True),
        "c rows of 44 values": (a, w[:44].T, poisoned((64, 44), torch.bfloat16), False),
        "a's base off 16 bytes (rows of 144)": (poisoned_fp8((64, 144))[:, 8:], w.T, c, False),
    }
    return [Outcome(name, fits(x, y, z) == want) for name, (x, y, z, want) in cases.items()]


def check_matmul_edges():
    """K = 0 gives activation(bias); M or N = 0 gives an empty c; the operator's opcheck."""
    outcomes = []
    a, b = poisoned_fp8((3, 0)), poisoned_fp8((0, 5))
    bias = rand((5,), torch.bfloat16)
    c = fp8_matmul(a, b, torch.ones(3, device=DEVICE), torch.ones(5, device=DEVICE), bias, "silu")
    outcomes.append(compare("K = 0: silu(bias)", c, torch.nn.functional.silu(bias.double()).expand(3, 5)))
    for m, n in ((0, 5), (3, 0)):
        c = fp8_matmul(
            poisoned_fp8((m, 128)), poisoned_fp8((128, n)), torch.ones(m, device=DEVICE), torch.ones(n, device=DEVICE)
        )
        outcomes.append(Outcome(f"M {m} N {n}: empty", tuple(c.shape) == (m, n)))
    a, b, sa, sb, _, _ = fp8_inputs(8, 16, 128, "row")
    # test_schema compares the inputs before and after with arithmetic torch has no float8 kernels for
    outcomes.append(
        opcheck(
            "opcheck llmk::fp8_matmul (less test_schema)",
            fp8_matmul_op.overload,
            (a, b, sa, sb, None, None, torch.bfloat16),
            skip=("test_schema",),
        )
    )
    return outcomes


def check_matmul_errors():
    a, b, sa, sb, _, _ = fp8_inputs(4, 32, 256, "row")
    ab, bb, sab, sbb, _, _ = fp8_inputs(4, 32, 256, "block")
    a_short = a[:, :100]
    return [
        expect_raises("bf16 a", lambda: fp8_matmul(a.to(torch.bfloat16), b, sa, sb), TypeError, "a"),
        expect_raises("bf16 b", lambda: fp8_matmul(a, b.to(torch.bfloat16), sa, sb), TypeError, "b"),
        expect_raises("inner dims differ", lambda: fp8_matmul(a, b[:128], sa, sb), ValueError, "K"),
        expect_raises("scale_a shape", lambda: fp8_matmul(a, b, sa[:3], sb), ValueError, "scale_a"),
        expect_raises("scale_b shape", lambda: fp8_matmul(a, b, sa, sb[:31]), ValueError, "scale_b"),
        expect_raises("fp16 scale_a", lambda: fp8_matmul(a, b, sa.half(), sb), TypeError, "scale_a"),
        expect_raises("fp16 scale_b", lambda: fp8_matmul(a, b, sa, sb.half()), TypeError, "scale_b"),
        expect_raises(
            "blocks: K not a multiple of 128",
            lambda: fp8_matmul(a_short, b[:100], sab[:, :1], sbb[:1]),
            ValueError,
            "128",
        ),
        expect_raises("blocks: scale_b row-wise", lambda: fp8_matmul(ab, bb, sab, sb), ValueError, "scale_b"),
        expect_raises(
            "out_dtype fp32", lambda: fp8_matmul(a, b, sa, sb, out_dtype=torch.float32), TypeError, "out_dtype"
        ),
        expect_raises("bias size", lambda: fp8_matmul(a, b, sa, sb, rand((31,), torch.bfloat16)), ValueError, "bias"),
        expect_raises(
            "unknown activation", lambda: fp8_matmul(a, b, sa, sb, activation="relu"), ValueError, "activation"
        ),
        expect_raises(
            "fast_accum not a bool", lambda: fp8_matmul(a, b, sa, sb, fast_accum="yes"), TypeError, "fast_accum"
        ),
    ]


def quantized(t):
    """t (16-bit, 2-D) as fp8_linear's operands see it: quantized by rows, dequantized, in fp64."""
    q, s = reference_quantize(t, "row")
    return q.double() * s.double()[:, None]


def e4m3_tol(a, b):
    """Tol of a @ b.T computed from a and b each rounded to e4m3 (by rows, scale to the row's max):
    a term a_k b_k moves by up to 2^-4 of itself from each rounding, with random signs: a standard
    deviation of sqrt(2/3) 2^-4 times the root-sum-square of an element's terms, bound at six of
    them (the largest of a few thousand elements sits near four). Plus the output's rounding."""
    rss = (a.double().pow(2) @ b.double().pow(2).T).sqrt()
    return Tol(
        6 * (2 / 3) ** 0.5 * 2**-4 * rss, 2**-7, "e4m3 rounding of both operands, random signs", rounding_check=False
    )


def check_linear(shape, n, dtype, bias=False, strided=False):
    """fp8_linear's y, dx, dW, db against (1) the same products of the same quantized operands in
    fp64 (matmul's tolerance: the plumbing, each operand quantized along the right dimension; the
    sums' term by FAST_ACCUM, fast or promoted) and
    (2) the 16-bit linear's y, dx, dW in fp64 (e4m3_tol: what FP8 costs)."""
    k = shape[-1]
    x = rand(shape[:-1] + (k + 8,), dtype)[..., :k] if strided else rand(shape, dtype)
    w = (torch.randn(n, k, device=DEVICE) * k**-0.5).to(dtype)
    b = rand((n,), dtype) if bias else None
    leaves = [t.detach().requires_grad_() for t in (x, w)] + ([b.detach().requires_grad_()] if bias else [])
    y = fp8_linear(leaves[0], leaves[1], leaves[2] if bias else None)
    dy = rand(y.shape, dtype)
    grads = torch.autograd.grad(y, leaves, dy)
    x2, dy2 = x.reshape(-1, k), dy.reshape(-1, n)
    # each product's operands as the kernels quantize them: left by rows, right by columns
    same = {
        "y": (quantized(x2), quantized(w).T),
        "dx": (quantized(dy2), quantized(w.T).T),
        "dW": (quantized(dy2.T), quantized(x2.T).T),
    }
    plain = {
        "y": (x2.double() @ w.double().T + (b.double() if bias else 0), x2, w),
        "dx": (dy2.double() @ w.double(), dy2, w.T),
        "dW": (dy2.double().T @ x2.double(), dy2.T, x2.T),
    }
    got = {"y": y.reshape(-1, n), "dx": grads[0].reshape(-1, k), "dW": grads[1]}
    outcomes = []
    for name in ("y", "dx", "dW"):
        qa, qb = same[name]
        want = qa @ qb + (b.double() if bias and name == "y" else 0)
        outcomes.append(
            compare(
                f"{name} vs its quantized operands' product",
                got[name],
                want,
                fp8_tolerance(qa, qb, dtype, promote=not FAST_ACCUM[name.lower()]),
            )
        )
        ref, a_, b_ = plain[name]
        outcomes.append(compare(f"{name} vs the {dtype_name(dtype)} linear", got[name], ref, e4m3_tol(a_, b_)))
    if bias:
        outcomes.append(compare("db", grads[2], dy2.double().sum(0)))
    return outcomes


def check_linear_partial(shape, n, dtype):
    """The backward asked for dx alone (a frozen weight) and for dW alone (a frozen input) casts dy
    one way only (the row kernel, or the column kernels): the same bytes as the two-way cast, so
    dx and dW equal the full backward's bit for bit. And no rows: dW is zeros, dx empty."""
    k = shape[-1]
    x, w = rand(shape, dtype), (torch.randn(n, k, device=DEVICE) * k**-0.5).to(dtype)
    dy = rand(shape[:-1] + (n,), dtype)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    dx_full, dw_full = torch.autograd.grad(fp8_linear(xs, ws), (xs, ws), dy)
    xs = x.clone().requires_grad_()
    (dx_only,) = torch.autograd.grad(fp8_linear(xs, w), (xs,), dy)
    ws = w.clone().requires_grad_()
    (dw_only,) = torch.autograd.grad(fp8_linear(x, ws), (ws,), dy)
    x0, w0 = rand((0, k), dtype).requires_grad_(), w.clone().requires_grad_()
    dx0, dw0 = torch.autograd.grad(fp8_linear(x0, w0).sum(), (x0, w0))
    return [
        compare("dx alone = dx of the full backward", dx_only, dx_full, EXACT),
        compare("dW alone = dW of the full backward", dw_only, dw_full, EXACT),
        Outcome("no rows: dx empty, dW zeros", dx0.shape == x0.shape and bool((dw0 == 0).all())),
    ]


def check_linear_producer(shape, n, dtype):
    """x_fp8 from the kernel that made x (rmsnorm_fp8 with keep_y: the bytes quantize_fp8(x) gives):
    y, dx and dW equal fp8_linear's without it, bit for bit, and dx reaches the norm's input."""
    k = shape[-1]
    x0, norm_w = rand(shape, dtype).requires_grad_(), rand((k,), dtype)
    w = (torch.randn(n, k, device=DEVICE) * k**-0.5).to(dtype).requires_grad_()
    made = rmsnorm_fp8(x0, norm_w, 1e-6, keep_y=True)
    y = fp8_linear(made.y, w, x_fp8=made)
    dy = rand(y.shape, dtype)
    got = (y, *torch.autograd.grad(y, (x0, w), dy))
    x = made.y.detach().requires_grad_()
    y2 = fp8_linear(x, w)
    dx, dw = torch.autograd.grad(y2, (x, w), dy)
    (dx0,) = torch.autograd.grad(rmsnorm(x0, norm_w, 1e-6), x0, dx)
    return [
        compare(f"{name} = without x_fp8", a, b, EXACT)
        for name, a, b in zip(("y", "dx (the norm's input)", "dW"), got, (y2, dx0, dw))
    ]


def check_linear_errors():
    x, w, b = rand((4, 64), torch.bfloat16), rand((32, 64), torch.bfloat16), rand((32,), torch.bfloat16)
    return [
        expect_raises("int x", lambda: fp8_linear(x.to(torch.int32), w), TypeError, "x"),
        expect_raises("weight fp16, x bf16", lambda: fp8_linear(x, w.half()), TypeError, "weight"),
        expect_raises("weight K differs", lambda: fp8_linear(x, w[:, :63]), ValueError, "weight"),
        expect_raises("bias size", lambda: fp8_linear(x, w, b[:31]), ValueError, "bias"),
        expect_raises("x_fp8 not a pair", lambda: fp8_linear(x, w, x_fp8=x), TypeError, "x_fp8"),
        expect_raises("x_fp8 16-bit q", lambda: fp8_linear(x, w, x_fp8=(x, x[:, 0].float())), TypeError, "q"),
        expect_raises("x_fp8 scale shape", lambda: fp8_linear(x, w, x_fp8=(x.to(FP8), x.float())), ValueError, "x_fp8"),
        opcheck(
            "opcheck llmk::fp8_linear, x and weight require grad",
            fp8_linear_op.overload,
            (x.requires_grad_(), w.requires_grad_(), None),
        ),
    ]


def cases():
    out = []

    def add(name, fn, gpu_only=False, gpu_gb=None, **kw):
        out.append(Case(name, fn, kw, gpu_only, gpu_gb))

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        dt = dtype_name(dtype)
        add(f"quantize row (7, 100) {dt}", check_quantize, m=7, k=100, dtype=dtype, granularity="row", zero_rows=(3,))
        add(
            f"quantize row (5, 333) two passes {dt}",
            check_quantize,
            m=5,
            k=333,
            dtype=dtype,
            granularity="row",
            one_pass=False,
        )
    add("quantize row (1, 1) bf16", check_quantize, m=1, k=1, dtype=torch.bfloat16, granularity="row")
    add(
        "quantize row (33, 64) transposed view x 1e4",
        check_quantize,
        m=33,
        k=64,
        dtype=torch.bfloat16,
        granularity="row",
        transposed=True,
        scale=1e4,
    )
    # transposed views take the column kernels: edge tiles both ways, several amax programs a row (the
    # interpreter's tiles are 32 values of K by 64 rows, its amax programs 2 tiles deep)
    add(
        "quantize row (130, 300) fp16 transposed view, a zero row, a NaN",
        check_quantize,
        m=130,
        k=300,
        dtype=torch.float16,
        granularity="row",
        transposed=True,
        zero_rows=(5,),
        nan_at=(129, 299),
    )
    add(
        "quantize row (19, 45) fp32 transposed view of a padded tensor, outlier 3e4",
        check_quantize,
        m=19,
        k=45,
        dtype=torch.float32,
        granularity="row",
        transposed=True,
        pad=3,
        outlier=3e4,
    )
    add(
        "quantize row (2, 7) transposed view x 1e-3",
        check_quantize,
        m=2,
        k=7,
        dtype=torch.bfloat16,
        granularity="row",
        transposed=True,
        scale=1e-3,
    )
    add(
        "quantize row (33, 64) transposed view, the row kernel",
        check_quantize,
        m=33,
        k=64,
        dtype=torch.bfloat16,
        granularity="row",
        transposed=True,
        one_pass=True,
    )
    add(
        "quantize row (9, 40) x 1e-3 (e4m3 subnormals)",
        check_quantize,
        m=9,
        k=40,
        dtype=torch.float32,
        granularity="row",
        scale=1e-3,
    )
    add(
        "quantize row (6, 500) outlier 3e4 (subnormals, signed zeros)",
        check_quantize,
        m=6,
        k=500,
        dtype=torch.float32,
        granularity="row",
        outlier=3e4,
    )
    add(
        "quantize row (5, 300) a NaN, two passes",
        check_quantize,
        m=5,
        k=300,
        dtype=torch.bfloat16,
        granularity="row",
        one_pass=False,
        nan_at=(2, 17),
    )
    add(
        "quantize row (5, 300) a NaN",
        check_quantize,
        m=5,
        k=300,
        dtype=torch.float32,
        granularity="row",
        nan_at=(4, 299),
    )
    add(
        "quantize 1x128 (9, 256) a NaN",
        check_quantize,
        m=9,
        k=256,
        dtype=torch.bfloat16,
        granularity="1x128",
        nan_at=(3, 200),
    )
    add(
        "quantize 128x128 (130, 256) a NaN",
        check_quantize,
        m=130,
        k=256,
        dtype=torch.float32,
        granularity="128x128",
        nan_at=(129, 5),
    )
    add(
        "quantize 1x128 (130, 256) bf16",
        check_quantize,
        m=130,
        k=256,
        dtype=torch.bfloat16,
        granularity="1x128",
        zero_rows=(0,),
    )
    add(
        "quantize 1x128 (1, 128) fp16 transposed view",
        check_quantize,
        m=1,
        k=128,
        dtype=torch.float16,
        granularity="1x128",
        transposed=True,
    )
    add("quantize 128x128 (130, 384) bf16", check_quantize, m=130, k=384, dtype=torch.bfloat16, granularity="128x128")
    add("quantize 128x128 (300, 128) fp32", check_quantize, m=300, k=128, dtype=torch.float32, granularity="128x128")
    # both layouts at once (fp8_linear's backward casts dy so): tiles cut in both directions
    add("quantize both ways (37, 70) bf16", check_quantize_both, m=37, k=70, dtype=torch.bfloat16)
    add(
        "quantize both ways (130, 300) fp16 padded, a zero row and column, a NaN",
        check_quantize_both,
        m=130,
        k=300,
        dtype=torch.float16,
        pad=5,
        zero_rows=(3,),
        zero_cols=(7,),
        nan_at=(64, 200),
    )
    add(
        "quantize both ways (33, 65) fp32 outlier 3e4",
        check_quantize_both,
        m=33,
        k=65,
        dtype=torch.float32,
        outlier=3e4,
    )
    add(
        "quantize both ways (1, 9) and (9, 1) bf16 x 1e-3",
        lambda: (
            check_quantize_both(1, 9, torch.bfloat16, scale=1e-3)
            + check_quantize_both(9, 1, torch.bfloat16, scale=1e-3)
        ),
    )
    add(
        "quantize both ways (8192, 3072) bf16 (the llama step's q/k/v dy)",
        check_quantize_both,
        gpu_only=True,
        m=8192,
        k=3072,
        dtype=torch.bfloat16,
    )
    add(
        "quantize both ways (8192, 8192) bf16 a NaN",
        check_quantize_both,
        gpu_only=True,
        m=8192,
        k=8192,
        dtype=torch.bfloat16,
        nan_at=(4000, 8191),
    )
    add("quantize: empty, dequantized, opcheck", check_quantize_edges)
    add("quantize: bad input", check_quantize_errors)
    # full size on the GPU: a long row (two passes), the widest one-pass row, an LLM weight's blocks
    add(
        "quantize row (4096, 14336) bf16",
        check_quantize,
        gpu_only=True,
        m=4096,
        k=14336,
        dtype=torch.bfloat16,
        granularity="row",
    )
    add(
        "quantize row (8192, 4096) bf16",
        check_quantize,
        gpu_only=True,
        m=8192,
        k=4096,
        dtype=torch.bfloat16,
        granularity="row",
    )
    add(
        "quantize 1x128 (8192, 4096) bf16",
        check_quantize,
        gpu_only=True,
        m=8192,
        k=4096,
        dtype=torch.bfloat16,
        granularity="1x128",
    )
    add(
        "quantize 128x128 (14336, 4096) bf16",
        check_quantize,
        gpu_only=True,
        m=14336,
        k=4096,
        dtype=torch.bfloat16,
        granularity="128x128",
    )
    # the llama-1.5b step's weight-gradient casts: x.T and dy.T of 8192 tokens
    add(
        "quantize row (2048, 8192) transposed view bf16",
        check_quantize,
        gpu_only=True,
        m=2048,
        k=8192,
        dtype=torch.bfloat16,
        granularity="row",
        transposed=True,
    )
    add(
        "quantize row (8192, 8192) transposed view bf16 a NaN",
        check_quantize,
        gpu_only=True,
        m=8192,
        k=8192,
        dtype=torch.bfloat16,
        granularity="row",
        transposed=True,
        nan_at=(4000, 8191),
    )
    # a transposed view whose offsets pass 2^31 (fp8_linear's backward quantizes dy.T and x.T)
    add(
        "quantize row (65600, 32768) transposed view, offsets past 2^31",
        check_quantize,
        gpu_only=True,
        gpu_gb=48,
        m=65600,
        k=32768,
        dtype=torch.bfloat16,
        granularity="row",
        transposed=True,
    )

    for granularity in ("row", "block"):
        g = granularity
        add(f"fp8_matmul {g} (1, 64, 256)", check_matmul, m=1, n=64, k=256, granularity=g)
        add(
            f"fp8_matmul {g} (37, 70, 384) bias+gelu",
            check_matmul,
            m=37,
            n=70,
            k=384,
            granularity=g,
            bias=True,
            activation="gelu",
        )
        add(
            f"fp8_matmul {g} (64, 130, 256) fp16 out, fp32 bias+silu, a padded",
            check_matmul,
            m=64,
            n=130,
            k=256,
            granularity=g,
            out_dtype=torch.float16,
            bias=True,
            bias_dtype=torch.float32,
            activation="silu",
            pad=True,
        )
        add(
            f"fp8_matmul {g} (40, 48, 256) b row-major",
            check_matmul,
            m=40,
            n=48,
            k=256,
            granularity=g,
            weight_layout=False,
        )
        add(
            f"fp8_matmul {g} (24, 40, 128) strided bias+silu",
            check_matmul,
            m=24,
            n=40,
            k=128,
            granularity=g,
            bias=True,
            bias_stride=2,
            activation="silu",
        )
        if g == "row":  # K 296: the unpromoted sum of about 2.3 promotion intervals stays inside the bound
            add(
                "fp8_matmul row (37, 70, 296) fast_accum", check_matmul, m=37, n=70, k=296, granularity=g, promote=False
            )
        add(f"fp8_matmul {g} interpreter config forced", check_matmul_config, config=INTERPRET_CONFIG, granularity=g)
        add(
            f"fp8_matmul {g} interpreter large config forced",
            check_matmul_config,
            config=INTERPRET_LARGE_CONFIG,
            granularity=g,
        )
        if g == "row":  # the persistent TMA kernel: edge tiles in M and N, a K tail, 3 programs walking tiles
            add(
                "fp8_matmul row TMA kernel (70, 104, 96) bias+silu",
                check_matmul,
                m=70,
                n=104,
                k=96,
                granularity=g,
                bias=True,
                activation="silu",
                kernel="tma",
            )
            add(
                "fp8_matmul row TMA kernel (33, 48, 112) fp16 out, fp32 bias+gelu",
                check_matmul,
                m=33,
                n=48,
                k=112,
                granularity=g,
                out_dtype=torch.float16,
                bias=True,
                bias_dtype=torch.float32,
                activation="gelu",
                kernel="tma",
            )
            add(
                "fp8_matmul row TMA kernel (37, 56, 160) not promoted",
                check_matmul,
                m=37,
                n=56,
                k=160,
                granularity=g,
                promote=False,
                kernel="tma",
            )
            add(
                "fp8_matmul row TMA kernel (40, 64, 64) strided bias",
                check_matmul,
                m=40,
                n=64,
                k=64,
                granularity=g,
                bias=True,
                bias_stride=3,
                kernel="tma",
            )
            add(
                f"fp8_matmul row ({FP8_TMA_MIN_M}, 40, 64) through the TMA kernel",
                check_matmul,
                m=FP8_TMA_MIN_M,
                n=40,
                k=64,
                granularity=g,
            )
            add("fp8_matmul: the TMA kernel's layouts", check_tma_fits)
            for table, promote in ((FP8_TMA_TABLE, True), (FAST_TMA_TABLE, False)):
                for max_m, *config in table:
                    add(
                        f"fp8_matmul row TMA config {tuple(config)} forced{'' if promote else ', not promoted'}",
                        check_matmul_config,
                        gpu_only=True,
                        config=tuple(config),
                        granularity=g,
                        kernel="tma",
                        promote=promote,
                    )
            add(
                "fp8_matmul row (8192, 2048, 8192) (the llama step's down projection)",
                check_matmul,
                gpu_only=True,
                m=8192,
                n=2048,
                k=8192,
                granularity=g,
            )
            add(
                "fp8_matmul row (8192, 2048, 8192) fast_accum",
                check_matmul,
                gpu_only=True,
                m=8192,
                n=2048,
                k=8192,
                granularity=g,
                promote=False,
            )
            add(
                "fp8_matmul row (512, 4096, 4096) fast_accum",
                check_matmul,
                gpu_only=True,
                m=512,
                n=4096,
                k=4096,
                granularity=g,
                promote=False,
            )
            for max_m, *config in FAST_CONFIG_TABLE:
                add(
                    f"fp8_matmul row config {tuple(config)} forced, not promoted",
                    check_matmul_config,
                    gpu_only=True,
                    config=tuple(config),
                    granularity=g,
                    promote=False,
                )
        for max_m, *config in CONFIG_TABLE if g == "row" else BLOCK_CONFIG_TABLE:
            add(
                f"fp8_matmul {g} config {tuple(config)} forced",
                check_matmul_config,
                gpu_only=True,
                config=tuple(config),
                granularity=g,
            )
        # full size on the GPU: a square GEMM, decode, an MLP's up projection
        add(f"fp8_matmul {g} (2048, 4096, 4096)", check_matmul, gpu_only=True, m=2048, n=4096, k=4096, granularity=g)
        add(f"fp8_matmul {g} (1, 4096, 4096)", check_matmul, gpu_only=True, m=1, n=4096, k=4096, granularity=g)
        add(
            f"fp8_matmul {g} (512, 14336, 4096) bias+silu",
            check_matmul,
            gpu_only=True,
            m=512,
            n=14336,
            k=4096,
            granularity=g,
            bias=True,
            activation="silu",
        )
    add("fp8_matmul row (20, 36, 100) K tail", check_matmul, m=20, n=36, k=100, granularity="row")
    add(
        "fp8_linear (2, 5, 128) -> 48 bf16 bias", check_linear, shape=(2, 5, 128), n=48, dtype=torch.bfloat16, bias=True
    )
    add(
        "fp8_linear (33, 100) -> 70 fp16 strided x",
        check_linear,
        shape=(33, 100),
        n=70,
        dtype=torch.float16,
        strided=True,
    )
    add("fp8_linear (1, 64) -> 16 bf16", check_linear, shape=(1, 64), n=16, dtype=torch.bfloat16)
    add(
        "fp8_linear (2, 19, 72) -> 40 bf16: dx alone, dW alone, no rows",
        check_linear_partial,
        shape=(2, 19, 72),
        n=40,
        dtype=torch.bfloat16,
    )
    add(
        "fp8_linear (4096, 2048) -> 3072 bf16: dx alone, dW alone, no rows",
        check_linear_partial,
        gpu_only=True,
        shape=(4096, 2048),
        n=3072,
        dtype=torch.bfloat16,
    )
    add(
        "fp8_linear (2048, 4096) -> 4096 bf16 bias",
        check_linear,
        gpu_only=True,
        shape=(2048, 4096),
        n=4096,
        dtype=torch.bfloat16,
        bias=True,
    )
    add(
        "fp8_linear with x_fp8 from rmsnorm_fp8 (3, 7, 96) -> 40 bf16",
        check_linear_producer,
        shape=(3, 7, 96),
        n=40,
        dtype=torch.bfloat16,
    )
    add("fp8_linear: bad input, opcheck", check_linear_errors)
    add("fp8_matmul: K = 0, empty, opcheck", check_matmul_edges)
    add("fp8_matmul: bad input", check_matmul_errors)
    return out


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("fp8", CASES)
