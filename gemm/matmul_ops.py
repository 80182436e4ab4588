"""matmul: c = act(a @ b + bias) for FP16/BF16 a (M, K) and b (K, N), fp32 accumulation, one
rounding; the public entry point of gemm/, which runs one of three kernels (choose_kernel):

- "tiled" (gemm/triton_matmul_tiled.py): tensor-core tiles, autotuned, with split-K for decode
  against a row-major b; any strides.
- "tma" (gemm/triton_matmul_tma.py): a persistent kernel with TMA loads and stores, from TMA_MIN_M
  rows on Hopper and later, where the descriptors fit the strides.
- "gemv" (gemm/triton_gemv.py): one row against an nn.Linear weight's transpose, on the CUDA
  cores: a single pass over b, where a tensor-core tile would be 15/16 padding.

Thresholds measured by scripts/tune/tma_sweep.py and scripts/tune/gemv_sweep.py on an H100;
docs/tuning/gemm.md has the figures.

Backward (llmk::matmul and llmk::matmul_train carry autograd formulas):

    dz = dc * act'(z)        z = a @ b + bias, the pre-activation; dz = dc without an activation
    da = dz @ b^T,  db = a^T @ dz,  dbias = sum over rows of dz

The two GEMMs run on the kernels above, on transposed views (b.T, a.T: every kernel takes strides,
and the TMA kernel reads either operand transposed), each laid out like the input it is the
gradient of (a gradient of W.T comes out as W's layout, which autograd accumulates without a
copy). z: with an activation, the public function's forward under grad is llmk::matmul_train,
which also writes z from the GEMM's epilogue (M*N*e more bytes) instead of leaving the backward a
third GEMM to recompute it. dz and dbias come from one elementwise pass
(gemm/triton_matmul_backward.py), then the two GEMMs read dz: the derivative is not fused into a
GEMM's prologue (docs/tuning/gemm.md says what that would save). Without an activation dz is dc,
not copied. The forward's knobs (launch_matmul's config, split_k, kernel) are not the public
function's: the backward's GEMMs take matmul's own choice.
"""

import functools

import torch

from llmk.common.device import INTERPRET, sm_count
from llmk.common.ops import define_op, define_ops, needs_grad
from llmk.common.validation import check_out
from llmk.gemm import triton_gemv, triton_matmul_tiled, triton_matmul_tma
from llmk.gemm.triton_matmul_backward import epilogue_backward
from llmk.gemm.triton_matmul_common import check_matmul_args, picked_config

# From TMA_MIN_M rows the persistent TMA kernel runs: from 2048 rows it beats the tiled kernel by
# up to a tenth, at 1024 it ties or leads, below that both tie and the TMA kernel's three
# descriptors cost host time a short GEMM would feel (scripts/tune/tma_sweep.py, H100).
TMA_MIN_M = 1024
# Up to GEMV_MAX_M rows against b read along K (W.T), the GEMV kernel runs: one row wastes most of
# a tensor-core tile, the GEMV reads W once, near the copy bandwidth (docs/tuning/gemm.md). Against a
# row-major b the tiled kernel's split-K stays faster.
GEMV_MAX_M = 1


@functools.lru_cache(maxsize=None)
def has_tma(device):
    """Whether `device` has TMA (compute capability 9.0, Hopper, and later). The interpreter
    emulates the descriptors, so its tests run that path too."""
    return INTERPRET or torch.cuda.get_device_capability(device)[0] >= 9


def choose_kernel(a, b, c, m):
    """Which kernel runs a call that forces none: "gemv" for M <= GEMV_MAX_M with b read along K,
    "tma" from TMA_MIN_M rows where the descriptors fit (on Hopper and later), else "tiled"."""
    if m <= GEMV_MAX_M and not triton_gemv.is_row_major(b):
        return "gemv"
    if m >= TMA_MIN_M and has_tma(a.device) and triton_matmul_tma.fits(a, b, c):
        return "tma"
    return "tiled"


def launch_matmul(a, b, bias, activation, c, config=None, split_k=None, kernel=None, z=None):
    """Launch on validated arguments with M, N >= 1: a (M, K), b (K, N), bias (N,) or None, c (M, N),
    any strides. z: None, or a buffer with c's shape and strides that receives the pre-activation
    a @ b + bias (the training forward's; every kernel writes it from its epilogue).
    kernel: "tiled", "tma" (the arguments must fit it) or "gemv" (M = 1); None: choose_kernel(), or
    "tiled" when config or split_k is given.
    config: a row of the kernel's table to run as is (tiled: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps,
    num_stages); tma: a TMA_CONFIGS row; gemv: a GEMV_CONFIGS row); None: the kernel's own choice.
    split_k: K slices a tile (tiled and gemv; see their launchers); None: their plan's."""
    if bias is not None:
        bias = bias.contiguous()  # the kernels read bias[n] at n: a strided (N,) view is copied
    if kernel is None:
        kernel = "tiled" if config is not None or split_k is not None else choose_kernel(a, b, c, a.shape[0])
    if kernel == "tma":
        triton_matmul_tma.launch_matmul_tma(
            a, b, bias, activation, c, sm_count(a.device, triton_matmul_tma.INTERPRET_SMS), config, z
        )
    elif kernel == "gemv":
        triton_gemv.launch_gemv(a, b, bias, activation, c, config, split_k, z)
    else:
        triton_matmul_tiled.launch_tiled(
            a, b, bias, activation, c, sm_count(a.device, triton_matmul_tiled.INTERPRET_SMS), config, split_k, z
        )


def kernel_choice(a, b):
    """What matmul(a, b) runs, in words: "gemv 4x1024 w4 s3 split 1" (BLOCK_N x BLOCK_K), "tiled
    64x128x64 w4 s4", "tiled split-K 4 16x256x64 w8 s4", "tma 128x256x64 w8 s3 epilogue split 2",
    or "tiled (untuned)" / "tma (untuned)" before a key's first call has tuned it. For benchmark
    rows and tuning logs: the config behind a time. It follows launch_matmul's choice (choose_kernel,
    plan, the autotuner's pick) without launching; "which kernel runs" in gemm/test_matmul.py
    checks each branch."""
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device="meta")  # matmul's own output's layout, nothing allocated
    kind = choose_kernel(a, b, c, m)
    if kind == "gemv":
        bn, bk, warps, stages, split = triton_gemv.gemv_plan(
            n, k, triton_gemv.is_row_major(b), sm_count(a.device, triton_gemv.INTERPRET_SMS)
        )
        return f"gemv {bn}x{bk} w{warps} s{stages} split {split}"
    if kind == "tiled":
        config, split = triton_matmul_tiled.plan(m, n, k, sm_count(a.device, triton_matmul_tiled.INTERPRET_SMS))
        if split > 1:
            return f"tiled split-K {split} {config[0]}x{config[1]}x{config[2]} w{config[3]} s{config[4]}"
    if INTERPRET:  # no tuning there: each kernel runs its INTERPRET_CONFIG
        meta = (
            triton_matmul_tma.meta_of(triton_matmul_tma.INTERPRET_CONFIG)
            if kind == "tma"
            else dict(triton_matmul_tiled.interpret_meta(), num_warps=4, num_stages=1)
        )
    else:
        kernel = triton_matmul_tma._matmul_tma_kernel if kind == "tma" else triton_matmul_tiled._matmul_kernel
        meta = picked_config(kernel, a, b, m, n, k)
    if meta is None:
        return f"{kind} (untuned)"
    extra = f" epilogue split {meta['EPILOGUE_SPLIT']}" if "EPILOGUE_SPLIT" in meta else ""
    return (
        f"{kind} {meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} w{meta['num_warps']} "
        f"s{meta['num_stages']}{extra}"
    )


def _matmul_into(a, b, bias, activation, c):
    if c.numel():  # M = 0 or N = 0: nothing to write; K = 0 runs, the epilogue on zero sums
        launch_matmul(a, b, bias, activation, c)


def product_like(x, lhs, rhs):
    """lhs @ rhs on our kernels, laid out like x (the input it is the gradient of): for x a
    transposed view (unit stride down its columns), (rhs.T @ lhs.T).T, so that the gradient of
    W.T is W's layout and autograd accumulates it without a copy."""
    if x.stride(0) == 1 and x.stride(1) != 1:
        return matmul_op(rhs.T, lhs.T, bias=None, activation=None).T
    return matmul_op(lhs, rhs, bias=None, activation=None)


def _grads(ctx, dc, a, b, bias, z, dz_out=None):
    """(da, db, dbias) of c = act(z), z = a @ b + bias, each None unless ctx.needs_input_grad.
    dz_out: z's own gradient, where a caller of llmk::matmul_train used z (None otherwise)."""
    a_grad, b_grad, bias_grad = ctx.needs_input_grad[:3]
    bias_grad = bias_grad and bias is not None
    dz, dbias = dc, None
    if dz_out is not None:  # never from matmul(): plain torch ops are enough
        dz = epilogue_backward(dc, z, None, ctx.activation, False)[0] + dz_out
        dbias = dz.sum(0, dtype=torch.float32).to(bias.dtype) if bias_grad else None
    elif ctx.activation is not None or bias_grad:
        dz, dbias = epilogue_backward(dc, z, bias, ctx.activation, bias_grad)
    da = product_like(a, dz, b.T) if a_grad else None
    db = product_like(b, a.T, dz) if b_grad else None
    return da, db, dbias


def _setup_matmul(ctx, inputs, output):
    ctx.save_for_backward(inputs.a, inputs.b, inputs.bias)
    ctx.activation = inputs.activation


def _matmul_backward(ctx, dc):
    """llmk::matmul's backward. With an activation it recomputes z (a third GEMM): only a direct
    call of the operator under grad comes here with one, as matmul() takes llmk::matmul_train then."""
    a, b, bias = ctx.saved_tensors
    z = matmul_op(a, b, bias, activation=None) if ctx.activation is not None else None
    return (*_grads(ctx, dc, a, b, bias, z), None)


matmul_op, matmul_out_op = define_ops(
    "matmul",
    "Tensor a, Tensor b, Tensor? bias, str? activation",
    lambda a, b, bias, activation: a.new_empty((a.shape[0], b.shape[1])),
    _matmul_into,
    backward=_matmul_backward,
    setup_context=_setup_matmul,
)


def _matmul_train(a, b, bias, activation):
    c = a.new_empty((a.shape[0], b.shape[1]))
    z = torch.empty_like(c)
    if c.numel():
        launch_matmul(a, b, bias, activation, c, z=z)
    return c, z


def _setup_matmul_train(ctx, inputs, output):
    ctx.save_for_backward(inputs.a, inputs.b, inputs.bias, output[1])
    ctx.activation = inputs.activation
    ctx.set_materialize_grads(False)  # z's gradient: None unless a caller of the operator used z


def _matmul_train_backward(ctx, dc, dz_out):
    a, b, bias, z = ctx.saved_tensors
    if dc is None:  # only z was used
        dc = torch.zeros_like(z)
    return (*_grads(ctx, dc, a, b, bias, z, dz_out), None)


matmul_train_op = define_op(
    "matmul_train(Tensor a, Tensor b, Tensor? bias, str activation) -> (Tensor, Tensor)",
    _matmul_train,
    lambda a, b, bias, activation: (a.new_empty((a.shape[0], b.shape[1])), a.new_empty((a.shape[0], b.shape[1]))),
    backward=_matmul_train_backward,
    setup_context=_setup_matmul_train,
)


def matmul(a, b, bias=None, activation=None, out=None):
    """c = activation(a @ b + bias), accumulated in fp32 and rounded once to a's dtype (operators
    llmk::matmul and llmk::matmul_out).

    a: (M, K) fp16 or bf16, any strides (a transposed or padded view is read in place).
    b: (K, N), a's dtype, any strides (for an nn.Linear weight W (N, K), pass W.T).
    bias: optional (N,), a's dtype or fp32. activation: None, "gelu" (erf), "gelu_tanh" or "silu".
    out: optional contiguous (M, N) buffer of a's dtype; forward-only (llmk::matmul_out raises
    when an input requires grad).
    Returns c: (M, N), a's dtype, contiguous (out itself when given). K = 0 gives activation(bias)
    (zeros without a bias).
    Differentiable in a, b and bias (module docstring). Under grad with an activation the forward
    also writes the pre-activation z (M, N), kept for the backward; without grad nothing changes.
    """
    m, n, _ = check_matmul_args(a, b, bias, activation)
    if out is None:
        if activation is not None and needs_grad(a, b, bias):
            return matmul_train_op(a, b, bias, activation=activation)[0]
        return matmul_op(a, b, bias, activation=activation)
    check_out("out", out, (m, n), a.dtype, a.device)
    matmul_out_op(a, b, bias, activation=activation, out=out)
    return out
