"""The experts' row GEMMs on long runs, persistent and with TMA weight loads: the forward's gate/up
(x's rows gathered, SwiGLU in the epilogue) and down (weighted, scattered back to token order), and
the backward's dx (scattered).

    glu:     h[r] = act(a[order[r] // top_k] @ b[e, :N]^T) * (a[order[r] // top_k] @ b[e, N:]^T)
    scatter: c[order[r]] = scale[order[r]] * (a[r] @ b[e]^T)       r a sorted row of expert e

The same products and epilogues as moe/triton_moe_gemm.py's _expert_rows_kernel (EPILOGUE "glu"
with GATHER, "scatter" without), in two changes:

- Persistence. NUM_SMS programs each walk the tiles pid, pid + NUM_SMS, ... (grouped order), the
  tile count summed on the device from the offsets (no host sync). The row kernel launches one
  program a tile; at its long-run tiles a program takes 144 KB of shared memory, so one runs on an
  SM, and each tile's epilogue and its pipeline's filling ran with no load in flight. Here the
  flattened loop (`tl.range(..., flatten=True)`) issues the next tile's first loads before the
  current tile's epilogue. Down's K is short (768 at Qwen3-30B-A3B's widths: 12 steps of 64), so
  that was a large share of its time.
- TMA for the weights (and for a where it is read in sorted order). glu reads gate's and up's
  BLOCK_N rows as one (2, BLOCK_N, BLOCK_K) box of a descriptor over b's memory as (2E, N, K)
  (expert e's gate rows are its row 2e, its up rows 2e + 1), one copy and one dot a step; the box
  stops at N and K, so edge tiles read zeros. scatter reads a's tile at (row0, k) and b's at
  (e * N + n0, k) from descriptors over a (S, K) and b as (E * N, K) (with B_TRANSPOSED, b's memory
  (E * K, N)). A row tile that runs past its expert's rows reads the next expert's rows (their
  outputs are not stored); past S, or past K in a, the copy fills zeros. b's rows past N read the
  next expert's weights, whose columns are not stored either; with B_TRANSPOSED a K step past K
  would read the next expert's rows against a's zero columns, so that layout needs K % BLOCK_K == 0.
  x's rows (glu) are gathered by pointer loads as in the row kernel: Hopper's TMA has no row gather.

FLOPs and bytes are the row kernel's (moe/triton_moe_gemm.py's docstring): 2 S N K a launch (glu: 2 S
(2N) K), each expert's weights read once from HBM while GROUP_M row tiles share a band of them in L2.

`fits` says when a call qualifies (16-byte-aligned bases and strides, the layouts above); the
others run the row kernel, as do short runs (decode), where this kernel was slower
(MOE_CONFIGS' glu_tma and scatter_tma rows). Triton's interpreter emulates the descriptors: the
CPU lane runs this kernel with INTERPRET_SMS programs, each walking several tiles.
"""

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from llmk.common.device import sm_count
from llmk.common.ints import next_power_of_2
from llmk.common.triton_utils import activate
from llmk.moe.triton_moe_gemm import GROUP_M, dot_precision, expert_runs, grouped_order

# Programs the interpreter runs: few, so that each walks several of the tests' tiles
INTERPRET_SMS = 3


def _aligned(t, *strides):
    return t.data_ptr() % 16 == 0 and all((s * t.element_size()) % 16 == 0 for s in strides)


def fits(a, b, epilogue, block_k):
    """Whether this kernel can take a launch: epilogue "glu": b (E, 2N, K) with contiguous rows and
    the gate and up halves one (2E, N, K) tensor (a, gathered by pointers, any strides); "scatter":
    a (S, K) row-major and b (E, N, K) as (E * N, K) row-major, or b's transpose's memory (E, K, N)
    as (E * K, N) with K % block_k == 0. Bases and row strides 16-byte aligned."""
    n, k = b.shape[1:]
    if epilogue == "glu":
        return b.stride(2) == 1 and b.stride(0) == n * b.stride(1) and _aligned(b, b.stride(1))
    if not (a.stride(1) == 1 and _aligned(a, a.stride(0))):
        return False
    if b.stride(2) == 1 and b.stride(0) == n * b.stride(1):
        return _aligned(b, b.stride(1))
    return b.stride(1) == 1 and b.stride(0) == k * b.stride(2) and k % block_k == 0 and _aligned(b, b.stride(2))


@triton.jit
def _expert_rows_tma_kernel(
    # a: pointer (GATHER: x (T, K), by strides) or TMA descriptor (S, K) in expert order; b: TMA
    # descriptor (glu: (2E, N, K); scatter: (E * N, K), or (E * K, N) with B_TRANSPOSED); c (S, N)
    # by strides (glu: h at sorted rows; scatter: token order); order (S,) int64 and offsets (E + 1,)
    # int64 from moe_permute; scale (S,) fp32 routing weights in token order (SCALE); pre (S, 2N)
    # contiguous: gate | up (STORE_PRE)
    a, b_desc, c_ptr, order_ptr, offsets_ptr, scale_ptr, pre_ptr,
    N, K, n_experts, top_k, stride_am, stride_ak, stride_cm, stride_cn,
    GATHER: tl.constexpr, EPILOGUE: tl.constexpr, ACTIVATION: tl.constexpr, SCALE: tl.constexpr,
    STORE_PRE: tl.constexpr, B_TRANSPOSED: tl.constexpr, E_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
):  # fmt: skip
    """Program p computes tiles p, p + NUM_SMS, ...: BLOCK_M sorted rows of one expert x BLOCK_N
    columns (glu: of gate and of up), all of K, then the epilogue."""
    tl.static_assert(EPILOGUE == "glu" or EPILOGUE == "scatter", "EPILOGUE must be 'glu' or 'scatter'")
    # the experts' row runs, read once; the tile counts 32-bit, as descriptor coordinates must be
    es, start, end, tiles, tile_end = expert_runs(offsets_ptr, n_experts, BLOCK_M, E_PAD, tl.int32)
    n_tiles_m = tl.sum(tiles, 0)
    n_tiles_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    rk = tl.arange(0, BLOCK_K)
    for tile in tl.range(tl.program_id(0), n_tiles_m * n_tiles_n, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_order(tile, n_tiles_m, n_tiles_n, GROUP_M)
        # run_tile's expert and first row, with first_tile folded into row0's sum: one cross-warp
        # reduction fewer a tile of the loop (the row kernel keeps run_tile's form, as measured)
        e = tl.sum((tile_end <= pid_m).to(tl.int32), 0)
        mine = es == e
        row0 = tl.sum(tl.where(mine, start + (pid_m - tile_end + tiles) * BLOCK_M, 0), 0).to(tl.int32)
        rows = row0 + tl.arange(0, BLOCK_M)
        row_ok = rows < tl.sum(tl.where(mine, end, 0), 0)
        n0 = pid_n * BLOCK_N
        if GATHER:
            pos = tl.load(order_ptr + rows, mask=row_ok, other=0)  # the flat (token, slot) index
            a_ptrs = a + (pos // top_k)[:, None] * stride_am + rk[None, :] * stride_ak
        if EPILOGUE == "glu":
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_steps):
            if GATHER:
                a_tile = tl.load(a_ptrs, mask=row_ok[:, None] & (rk < K - k * BLOCK_K)[None, :], other=0.0)
                a_ptrs += BLOCK_K * stride_ak
            else:
                a_tile = a.load([row0, k * BLOCK_K])
            if EPILOGUE == "glu":  # gate's BLOCK_N rows, then up's: one box, one dot
                b = b_desc.load([2 * e, n0, k * BLOCK_K]).reshape(2 * BLOCK_N, BLOCK_K).T
            elif B_TRANSPOSED:
                b = b_desc.load([e * K + k * BLOCK_K, n0])
            else:
                b = b_desc.load([e * N + n0, k * BLOCK_K]).T
            acc = tl.dot(a_tile, b, acc, input_precision=DOT_PRECISION)
        rn = n0 + tl.arange(0, BLOCK_N)
        mask = row_ok[:, None] & (rn < N)[None, :]
        if EPILOGUE == "glu":
            # (BLOCK_M, [gate | up] x BLOCK_N) -> two (BLOCK_M, BLOCK_N), as in the row kernel
            gate, up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
            rows64 = rows.to(tl.int64)
            if STORE_PRE:
                pre_offs = rows64[:, None] * (2 * N) + rn[None, :]  # (S, 2N) contiguous: gate | up
                tl.store(pre_ptr + pre_offs, gate.to(pre_ptr.dtype.element_ty), mask=mask)
                tl.store(pre_ptr + pre_offs + N, up.to(pre_ptr.dtype.element_ty), mask=mask)
            h = activate(gate, ACTIVATION) * up
            tl.store(
                c_ptr + rows64[:, None] * stride_cm + rn[None, :] * stride_cn, h.to(c_ptr.dtype.element_ty), mask=mask
            )
        else:
            pos = tl.load(order_ptr + rows, mask=row_ok, other=0)
            if SCALE:
                acc = acc * tl.load(scale_ptr + pos, mask=row_ok, other=0.0)[:, None]
            tl.store(
                c_ptr + pos[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask
            )


def launch_expert_rows_tma(
    a, b, c, order, offsets, config, *, epilogue, activation="silu", top_k=1, scale=None, pre=None
):
    """Launch _expert_rows_tma_kernel on checked arguments that `fit`. glu: a = x (T, K) gathered
    through the order, b (E, 2N, K), c = h (S, N), pre (S, 2N) contiguous or None; scatter: a (S, K)
    in expert order, b (E, N, K) by strides, c (S, N) by strides in token order, scale (S,) fp32 or
    None. order (S,), offsets (E + 1,). config: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps,
    num_stages), MOE_CONFIGS' glu_tma or scatter_tma tile."""
    n_rows, n_experts = order.shape[0], offsets.shape[0] - 1
    n, k = c.shape[1], b.shape[2]
    bm, bn, bk, warps, stages = config
    glu = epilogue == "glu"
    transposed = not glu and b.stride(2) != 1
    if glu:  # b's memory as (2E, N, K): gate's rows of expert e at 2e, up's at 2e + 1
        b_desc = TensorDescriptor(b, [2 * n_experts, n, k], [n * b.stride(1), b.stride(1), 1], [2, bn, bk])
        a_arg, strides = a, (a.stride(0), a.stride(1))
    else:
        if transposed:  # b's memory (E, K, N): rows e * K + k
            b_desc = TensorDescriptor(b.transpose(1, 2), [n_experts * k, n], [b.stride(2), 1], [bk, bn])
        else:
            b_desc = TensorDescriptor(b, [n_experts * n, k], [b.stride(1), 1], [bn, bk])
        a_arg, strides = TensorDescriptor(a, [n_rows, k], [a.stride(0), 1], [bm, bk]), (0, 0)
    num_sms = sm_count(a.device, INTERPRET_SMS)
    dummy = order  # never read: pointers of the forms that take no such tensor
    _expert_rows_tma_kernel[(num_sms,)](
        a_arg,
        b_desc,
        c,
        order,
        offsets,
        scale if scale is not None else dummy,
        pre if pre is not None else dummy,
        n,
        k,
        n_experts,
        top_k,
        *strides,
        c.stride(0),
        c.stride(1),
        GATHER=glu,
        EPILOGUE=epilogue,
        ACTIVATION=activation,
        SCALE=scale is not None,
        STORE_PRE=pre is not None,
        B_TRANSPOSED=transposed,
        E_PAD=next_power_of_2(n_experts),
        DOT_PRECISION=dot_precision(a),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=GROUP_M,
        NUM_SMS=num_sms,
        num_warps=warps,
        num_stages=stages,
    )


__all__ = ["fits", "launch_expert_rows_tma"]
