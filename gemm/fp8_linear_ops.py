"""fp8_linear: y = x @ weight.T + bias with all three products of training in FP8 (e4m3, row-wise
scales), as operator llmk::fp8_linear with its autograd formula.

Forward and backward, each product one fp8_matmul (gemm/fp8_ops.py) of operands that
quantize_fp8 scales along the product's K (the dimension summed over), a scale per row of the
left operand and per column of the right one:

    y  = x @ W^T        x (M, K) by rows;   W (N, K) by rows: W^T's columns     (K summed)
    dx = dy @ W         dy (M, N) by rows;  W^T (K, N) by rows: W's columns     (N summed)
    dW = dy^T @ x       dy^T (N, M) by rows; x^T (K, M) by rows: x's columns    (M summed)
    db = sum of dy's rows (fp32)

so each operand is quantized twice, once along each of its dimensions (x and dy in the forward's
and the backward's layouts): the row-wise recipe (torchao's "rowwise"), gradients in e4m3 too.
Saved for the backward: x and W as given (16-bit), not their FP8 copies. x_fp8, where the kernel
that made x also cast it (gemm/triton_fp8_producers.py: the same bytes quantize_fp8(x, "row")
gives), is the forward's left operand as it is, and the forward's quantization pass is skipped;
the backward still reads x (its weight gradient casts x along the tokens). The transposed
operands (W.T, dy.T, x.T) are read in place: a transposed view takes the column kernels, which
read along the contiguous dimension (gemm/triton_fp8_quant.py).

The backward is one operator, llmk::fp8_linear_backward, so that its casts share what they can:
dy's two casts (by rows for dx, by columns for dW) are one pair of kernels that read dy twice
(quantize_both_impl), and the column casts' amax buffers (dy's, W's, x's) are one zeroed
allocation. Its casts and products are quantize_fp8's and fp8_matmul's implementations called
directly: at a training step's sizes the host's time a launch is what the FP8 step waits on
(docs/tuning/gemm.md), and the operator layer's dispatch is paid once for the backward, not once
a cast and a product.

Error: each product carries e4m3's rounding of both operands, 2^-4 relative at most a value
(half an ulp of a 3-bit significand), on top of fp8_matmul's own sums and one rounding:
gemm/test_fp8.py derives its tolerance from that.
"""

import torch

from llmk.common.ops import define_op
from llmk.common.validation import as_rows, check_same_device, check_tensor
from llmk.gemm.fp8_ops import FP8, fp8_matmul_impl, quantize_both_impl, quantize_impl
from llmk.gemm.triton_matmul_common import check_bias

DTYPES = (torch.float16, torch.bfloat16)
# The products that keep their whole K loop in the tensor cores' accumulator (fp8_matmul's
# fast_accum), as torchao's float8 training does by default: the forward's y (1.1-1.4x faster on
# the H200; its K is the layer's input width), not the gradients (dW sums over every token of the
# batch, K 8192 at the llama-1.5b step, where fast accumulation's error is twice promotion's).
FAST_ACCUM = dict(y=True, dx=False, dw=False)


def check_fp8_linear_args(x, weight, bias, x_fp8=None):
    check_tensor("x", x, DTYPES)
    if x_fp8 is not None:
        if not isinstance(x_fp8, (tuple, list)) or len(x_fp8) < 2:
            raise TypeError(f"x_fp8 must be (q, scale) (an FP8Rows), got {type(x_fp8).__name__}")
        check_tensor("x_fp8's q", x_fp8[0], (FP8,))
        check_tensor("x_fp8's scale", x_fp8[1], (torch.float32,))
        if x_fp8[0].shape != x.shape or x_fp8[1].shape != x.shape[:-1]:
            raise ValueError(
                f"x_fp8 must be q {tuple(x.shape)} and scale {tuple(x.shape[:-1])} (x's rows); got "
                f"{tuple(x_fp8[0].shape)} and {tuple(x_fp8[1].shape)}"
            )
    check_tensor("weight", weight, (x.dtype,), min_dim=2)
    check_same_device("weight", weight, "x", x)
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must be (N, K) with K = x.shape[-1] = {x.shape[-1]}; got {tuple(weight.shape)}")
    check_bias(bias, weight.shape[0], (x.dtype, torch.float32), "x", x)


def fp8_product(a, b_t, out_dtype, product, bias=None, a_fp8=None, amax=None):
    """a @ b_t.T in FP8: a (M, K) and b_t (N, K) each quantized by rows (along K), out_dtype out;
    product ("y", "dx" or "dw") picks FAST_ACCUM's entry. a_fp8: (q (M, K), scale (M,)), a's rows
    already cast (then a is not read). amax: a zeroed int32 (N,) for b_t's column kernels."""
    qa, sa = quantize_impl(a, "row") if a_fp8 is None else a_fp8
    qb, sb = quantize_impl(b_t, "row", amax)
    return fp8_matmul_impl(qa, qb.T, sa, sb, bias, None, out_dtype, FAST_ACCUM[product])


def _fp8_linear(x, weight, bias, x_q=None, x_scale=None):
    rows = as_rows(x)
    if rows.numel() == 0 or weight.numel() == 0:
        y = torch.zeros((rows.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
        if bias is not None:
            y += bias.to(x.dtype)
    else:  # x_q: x's rows cast by the kernel that made x
        cast = None if x_q is None else (x_q.reshape(rows.shape), x_scale.reshape(-1))
        y = fp8_product(rows, weight, x.dtype, "y", bias, cast)
    return y.view(*x.shape[:-1], weight.shape[0])


def _fp8_linear_empty(x, weight, bias, x_q=None, x_scale=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs.x, inputs.weight)
    ctx.has_bias = inputs.bias is not None
    ctx.bias_dtype = inputs.bias.dtype if ctx.has_bias else None


def _backward_impl(dy, x, weight, x_grad, w_grad):
    """dy (M, N) and x (M, K) by rows, weight (N, K): (dx (M, K), dW (N, K)), each empty (0,) where
    not asked for (module docstring: one zeroed amax buffer, dy cast both ways at once)."""
    (m, n), k = dy.shape, x.shape[1]
    dx, dw = x.new_empty(0), weight.new_empty(0)  # what is not asked for
    if m == 0 or n == 0 or k == 0:  # empty sums: zeros
        return (x.new_zeros((m, k)) if x_grad else dx), (weight.new_zeros((n, k)) if w_grad else dw)
    both = x_grad and w_grad
    # one zeroed buffer for every column cast's amax: dy's rows and columns (or its columns), W's, x's
    sizes = [(m + n) if both else n if w_grad else 0, k if x_grad else 0, k if w_grad else 0]
    amax = torch.zeros(sum(sizes), dtype=torch.int32, device=dy.device)
    dy_amax, w_amax, x_amax = amax.split(sizes)
    if both:
        q, s, qt, st = quantize_both_impl(dy, dy_amax)
        dy_rows, dy_cols = (q, s), (qt, st)
    else:
        dy_rows = quantize_impl(dy, "row") if x_grad else None
        dy_cols = quantize_impl(dy.T, "row", dy_amax) if w_grad else None
    if x_grad:
        dx = fp8_product(dy, weight.T, x.dtype, "dx", a_fp8=dy_rows, amax=w_amax)
    if w_grad:
        dw = fp8_product(dy.T, x.T, weight.dtype, "dw", a_fp8=dy_cols, amax=x_amax)
    return dx, dw


def _backward_empty(dy, x, weight, x_grad, w_grad):
    return (
        x.new_empty((dy.shape[0], x.shape[1])) if x_grad else x.new_empty(0),
        weight.new_empty(weight.shape) if w_grad else weight.new_empty(0),
    )


fp8_linear_backward_op = define_op(
    "fp8_linear_backward(Tensor dy, Tensor x, Tensor weight, bool x_grad, bool w_grad) -> (Tensor, Tensor)",
    _backward_impl,
    _backward_empty,
)


def _fp8_linear_backward(ctx, dy):
    """(dx, dW, db): dx = dy @ W and dW = dy^T @ x in FP8 (module docstring), db in fp32."""
    x, weight = ctx.saved_tensors
    x_grad, w_grad, b_grad = ctx.needs_input_grad[:3]
    dy_rows, x_rows = as_rows(dy), as_rows(x)
    dx, dw = fp8_linear_backward_op(dy_rows, x_rows, weight, x_grad=bool(x_grad), w_grad=bool(w_grad))
    db = dy_rows.sum(0, dtype=torch.float32).to(ctx.bias_dtype) if b_grad and ctx.has_bias else None
    return dx.view(x.shape) if x_grad else None, dw if w_grad else None, db, None, None


fp8_linear_op = define_op(
    "fp8_linear(Tensor x, Tensor weight, Tensor? bias, Tensor? x_q=None, Tensor? x_scale=None) -> Tensor",
    _fp8_linear,
    _fp8_linear_empty,
    backward=_fp8_linear_backward,
    setup_context=_setup,
)


def fp8_linear(x, weight, bias=None, *, x_fp8=None):
    """y = x @ weight.T + bias, its three training products in FP8 (operator llmk::fp8_linear).

    x: (..., K) fp16 or bf16. weight: (N, K), x's dtype (an nn.Linear weight). bias: optional (N,),
    x's dtype or fp32. x_fp8: optional (q (..., K) e4m3, scale (...,) fp32), x's rows already cast
    (an FP8Rows from rmsnorm_fp8 or swiglu_fp8 with keep_y, whose y is x): the forward reads them
    in place of its own cast of x. Returns y (..., N) in x's dtype. Differentiable in x, weight and bias: the
    backward's products run in FP8 as well (module docstring); e4m3's rounding costs about 2^-4 of
    each operand, so y is that far from F.linear's, by design."""
    check_fp8_linear_args(x, weight, bias, x_fp8)
    if x_fp8 is None:
        return fp8_linear_op(x, weight, bias)
    return fp8_linear_op(x, weight, bias, x_q=x_fp8[0], x_scale=x_fp8[1])
