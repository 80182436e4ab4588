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
the backward still reads x (its weight gradient casts x along the tokens). quantize_fp8 reads the
transposed operands (W.T, dy.T, x.T) in place: a transposed view takes its column kernels, which
read along the contiguous dimension (gemm/triton_fp8_quant.py). A cast that writes both layouts in
one pass is the next step for speed.

Error: each product carries e4m3's rounding of both operands, 2^-4 relative at most a value
(half an ulp of a 3-bit significand), on top of fp8_matmul's own sums and one rounding:
gemm/test_fp8.py derives its tolerance from that.
"""
import torch

from llmk.common.ops import define_op
from llmk.common.validation import as_rows, check_same_device, check_tensor
from llmk.gemm.fp8_ops import FP8, fp8_matmul_op, quantize_fp8_op
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
            raise ValueError(f"x_fp8 must be q {tuple(x.shape)} and scale {tuple(x.shape[:-1])} (x's rows); got "
                             f"{tuple(x_fp8[0].shape)} and {tuple(x_fp8[1].shape)}")
    check_tensor("weight", weight, (x.dtype,), min_dim=2)
    check_same_device("weight", weight, "x", x)
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must be (N, K) with K = x.shape[-1] = {x.shape[-1]}; got {tuple(weight.shape)}")
    check_bias(bias, weight.shape[0], (x.dtype, torch.float32), "x", x)


def fp8_product(a, b_t, out_dtype, product, bias=None, a_fp8=None):
    """a @ b_t.T in FP8: a (M, K) and b_t (N, K) each quantized by rows (along K), out_dtype out;
    product ("y", "dx" or "dw") picks FAST_ACCUM's entry. a_fp8: (q (M, K), scale (M,)), a's rows
    already cast (then a is not read)."""
    qa, sa = quantize_fp8_op(a, "row") if a_fp8 is None else a_fp8
    qb, sb = quantize_fp8_op(b_t, "row")
    return fp8_matmul_op(qa, qb.T, sa, sb, bias, None, out_dtype, FAST_ACCUM[product])


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


def _fp8_linear_backward(ctx, dy):
    """(dx, dW, db): dx = dy @ W and dW = dy^T @ x in FP8 (module docstring), db in fp32."""
    x, weight = ctx.saved_tensors
    x_grad, w_grad, b_grad = ctx.needs_input_grad[:3]
    dy_rows, x_rows = as_rows(dy), as_rows(x)
    dx = dw = db = None
    if x_grad:
        dx = fp8_product(dy_rows, weight.T, x.dtype, "dx").view(x.shape) if dy_rows.numel() and x.numel() \
            else torch.zeros_like(x)
    if w_grad:
        dw = fp8_product(dy_rows.T, x_rows.T, weight.dtype, "dw") if dy_rows.numel() and x_rows.shape[1] \
            else torch.zeros_like(weight)
    if b_grad and ctx.has_bias:
        db = dy_rows.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
    return dx, dw, db, None, None


fp8_linear_op = define_op(
    "fp8_linear(Tensor x, Tensor weight, Tensor? bias, Tensor? x_q=None, Tensor? x_scale=None) -> Tensor",
    _fp8_linear, _fp8_linear_empty, backward=_fp8_linear_backward, setup_context=_setup)


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
    return fp8_linear_op(x, weight, bias, x_fp8[0], x_fp8[1])
