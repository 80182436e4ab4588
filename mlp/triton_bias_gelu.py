"""Bias + GELU in one pass, the activation after the MLP's first linear layer (GPT-2, BERT, ...):

    y = gelu(x + bias)       exact:  z * Phi(z)            Phi the standard normal CDF, z = x + bias
                             tanh:   z * sigmoid(2 * sqrt(2/pi) * (z + 0.044715 * z^3))

in fp32 (common.triton_utils.gelu), with one rounding to x's dtype at the end. Neither form calls
erf or tanh. The textbook 0.5 * z * (1 + erf(z / sqrt(2))) loses most of its digits to 1 + erf(.)
for z < -2, and with libdevice's erf the kernel takes about twice the instructions a value, near
what an H100 can issue while streaming fp16 at full bandwidth (docs/tuning/mlp.md).

Memory traffic for M rows of O values of e bytes: read x (M*O*e), write y (M*O*e), read bias (O*e,
from L2 after the first band of rows). Eager PyTorch takes two kernels and rounds x + bias between
them: 5*M*O*e bytes.
Tiling (2D tiles over rows and columns, 64-bit offsets) and its table: mlp/tiling.py.
"""
import common  # noqa: F401  (interpreter switch before triton is imported)
import triton
import triton.language as tl

from common.ops import define_ops
from common.triton_utils import gelu
from common.validation import as_rows, check_out, check_same_device, check_tensor
from mlp.gelu import check_approximate
from mlp.tiling import tile_config, tile_offsets


@triton.jit
def _bias_gelu_kernel(
    # pointers
    x_ptr, b_ptr, y_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_xm, stride_ym,
    # meta-parameters
    HAS_BIAS: tl.constexpr, TANH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):
    rows, cols, mask, in_cols = tile_offsets(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N, EVEN_M, EVEN_N)
    # x is read exactly once: do not let it push the bias out of L2
    z = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first").to(tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=in_cols, other=0.0, eviction_policy="evict_last")
        z += b.to(tl.float32)[None, :]
    y = gelu(z, TANH)
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def check_bias_gelu_args(x, bias, approximate):
    check_tensor("x", x)
    if bias is not None:
        check_tensor("bias", bias)
        check_same_device("bias", bias, "x", x)
        if tuple(bias.shape) != (x.shape[-1],):
            raise ValueError(f"bias must have shape ({x.shape[-1]},) to match the last dim of x "
                             f"{tuple(x.shape)}; got {tuple(bias.shape)}")
    check_approximate(approximate)


def launch_bias_gelu(x, bias, approximate, y, cfg=None):
    """Launch on validated arguments: x (..., O); bias (O,) or None; y a contiguous output shaped
    like x. Writes y in place. cfg: a TileConfig to launch instead of tile_config's choice
    (tuning sweeps: mlp.tiling.tile_config_for)."""
    if x.numel() == 0:
        return
    x2 = as_rows(x)
    n_rows, n_cols = x2.shape
    y2 = y.view(-1, n_cols)
    if cfg is None:
        cfg = tile_config("bias_gelu", n_rows, n_cols, x.element_size())
    b = bias.contiguous() if bias is not None else x2  # x2: a placeholder pointer, never read
    _bias_gelu_kernel[(cfg.grid,)](
        x2, b, y2, n_rows, n_cols, x2.stride(0), y2.stride(0),
        HAS_BIAS=bias is not None, TANH=approximate == "tanh",
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, EVEN_M=cfg.EVEN_M, EVEN_N=cfg.EVEN_N,
        num_warps=cfg.num_warps)


bias_gelu_op, bias_gelu_out_op = define_ops(
    "bias_gelu", "Tensor x, Tensor? bias, str approximate", lambda x, bias, approximate: x.new_empty(x.shape),
    launch_bias_gelu)


def bias_gelu(x, bias, approximate="none", out=None):
    """gelu(x + bias) in one pass, as F.gelu(x + bias, approximate=approximate) but with no
    rounding of x + bias (operators llmk::bias_gelu and llmk::bias_gelu_out).

    x: (..., O) fp16, bf16 or fp32, any row stride (a view whose leading dims cannot merge is
       copied once). bias: (O,) any float dtype, or None for plain GELU.
    approximate: "none" (the exact GELU, F.gelu's default) or "tanh".
    out: optional contiguous buffer shaped like x, x's dtype.
    Returns y: (..., O), x's dtype, contiguous (out itself when given).
    """
    check_bias_gelu_args(x, bias, approximate)
    if out is None:
        return bias_gelu_op(x, bias, approximate)
    check_out("out", out, x.shape, x.dtype, x.device)
    bias_gelu_out_op(x, bias, approximate, out)
    return out
