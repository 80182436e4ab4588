"""SwiGLU in one pass, the activation of Llama-style gated MLPs:

    y = silu(gate) * up = gate * up / (1 + exp(-gate))        in fp32, one rounding at the end

where gate and up are the two projections of the same input, often the two halves of one fused
gate/up GEMM's output: any row stride is taken as it is, so those halves are read in place.
Large |gate| is safe: for a large negative gate exp(-gate) overflows to inf and silu = -0, never NaN.

Memory traffic for M rows of I values of e bytes: read gate and up, write y: 3*M*I*e. Eager
`F.silu(gate) * up` takes two kernels and rounds silu(gate) between them: 5*M*I*e bytes.
Tiling (2D tiles over rows and columns, 64-bit offsets) and its table: mlp/tiling.py.
"""
import common  # noqa: F401  (interpreter switch before triton is imported)
import triton
import triton.language as tl

from common.ops import define_ops
from common.triton_utils import silu
from common.validation import as_rows, check_out, check_swiglu_args
from mlp.tiling import tile_config, tile_offsets


@triton.jit
def _swiglu_kernel(
    # pointers
    gate_ptr, up_ptr, y_ptr,
    # matrix dimensions and row strides (in elements)
    n_rows, n_cols, stride_gm, stride_um, stride_ym,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr,
):
    rows, cols, mask, _ = tile_offsets(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N, EVEN_M, EVEN_N)
    # no eviction hint: evict_first on these loads lost 4-6% on an H200 (docs/tuning/mlp.md)
    g = tl.load(gate_ptr + rows[:, None] * stride_gm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + rows[:, None] * stride_um + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = silu(g) * u
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def launch_swiglu(gate, up, y, cfg=None):
    """Launch on validated arguments: gate, up (..., I) of one dtype; y a contiguous output shaped
    like gate. Writes y in place. cfg: a TileConfig to launch instead of tile_config's choice
    (tuning sweeps: mlp.tiling.tile_config_for)."""
    if gate.numel() == 0:
        return
    g2, u2 = as_rows(gate), as_rows(up)
    n_rows, n_cols = g2.shape
    y2 = y.view(-1, n_cols)
    if cfg is None:
        cfg = tile_config("swiglu", n_rows, n_cols, gate.element_size())
    _swiglu_kernel[(cfg.grid,)](
        g2, u2, y2, n_rows, n_cols, g2.stride(0), u2.stride(0), y2.stride(0),
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, EVEN_M=cfg.EVEN_M, EVEN_N=cfg.EVEN_N,
        num_warps=cfg.num_warps)


swiglu_op, swiglu_out_op = define_ops("swiglu", "Tensor gate, Tensor up", lambda gate, up: gate.new_empty(gate.shape),
                                      launch_swiglu)


def swiglu(gate, up, out=None):
    """silu(gate) * up in one pass, as F.silu(gate) * up but with no rounding of silu(gate)
    (operators llmk::swiglu and llmk::swiglu_out).

    gate, up: (..., I), same shape, both fp16, bf16 or fp32 (one dtype), any row strides (a view
       whose leading dims cannot merge, or whose last dim is strided, is copied once).
    out: optional contiguous buffer shaped like gate, gate's dtype.
    Returns y: (..., I), gate's dtype, contiguous (out itself when given).
    """
    check_swiglu_args(gate, up)
    if out is None:
        return swiglu_op(gate, up)
    check_out("out", out, gate.shape, gate.dtype, gate.device)
    swiglu_out_op(gate, up, out)
    return out
