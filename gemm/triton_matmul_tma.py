"""Persistent matmul with TMA loads and stores, for large GEMMs on Hopper (sm_90) and later.

    c = act(a @ b + bias)        a (M, K), b (K, N), bias (N,); fp32 accumulation, one rounding

The same math and tiles as gemm/triton_matmul_tiled.py's one-kernel path, in two changes:

- TMA. Each A and B tile is one tensor-memory-accelerator copy into shared memory, described by a
  host-built descriptor (base, shape, strides, block), instead of BLOCK_M * BLOCK_K / 8 pointer
  loads issued and address-computed by every thread. The registers and issue slots that pointer
  arithmetic took go to the wgmma pipeline, and the out-of-range part of an edge tile is filled
  with zeros by the copy itself (no masks, no wrap). c leaves through a TMA store, which clips at
  (M, N).
- Persistence. NUM_SMS programs (one per SM) each walk tiles pid, pid + NUM_SMS, ... in grouped
  order. With 128 x 256 tiles, 4096^3 has 512 tiles: 3.9 waves of one program per SM; a launch per
  tile pays each program's prologue (the pipeline filling) once a tile and leaves the last wave's
  SMs idle while the others finish, where a persistent program starts loading its next tile while
  the epilogue of the current one runs (flattened loops: `tl.range(..., flatten=True)`).

Memory traffic is that of the tiled kernel: (M*K + K*N + M*N) * e with perfect reuse, each
A row-panel read once per column of tiles and each B column-panel once per row of tiles, the
grouped order turning the repeats into L2 hits.

TMA needs a 16-byte-aligned base and 16-byte-aligned strides for all but the last (contiguous)
dimension: with 2-byte elements, a's, b's and c's row strides multiples of 8 (so N is one, for c),
and each of a and b contiguous along one of its dimensions. `fits` says when a call qualifies; the
others run gemm/triton_matmul_tiled.py's pointer kernel. b may be row-major (K, N)
or an nn.Linear weight's transpose (W.T, W (N, K) contiguous): the descriptor then covers W and
each loaded (BLOCK_N, BLOCK_K) tile is fed to the dot transposed, which wgmma reads from shared
memory in either order. a likewise may be row-major (M, K) or a transpose (X.T, X (K, M)
contiguous), which is how the backward reads its activations: db = a.T @ dz, dW = dy.T @ x.

The training forward also stores the pre-activation z = a @ b + bias (STORE_Z, through a second
descriptor like c's) for the backward's activation derivative: M*N*e more bytes written.

Block sizes are autotuned over TMA_CONFIGS, keyed like the pointer kernel. Triton's interpreter
runs this kernel too (the descriptors are emulated), with one small config and INTERPRET_SMS
programs, so that each program walks several tiles.
"""

import functools

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from llmk.common.device import INTERPRET
from llmk.common.ints import cdiv
from llmk.common.timing import autotune_bench
from llmk.common.triton_utils import activate
from llmk.gemm.triton_matmul_common import GROUP_M, grouped_tile, m_bucket, pick_config, picked_config, untuned_config

# Autotuned configs: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, EPILOGUE_SPLIT).
# Shared memory: (BLOCK_M + BLOCK_N) * BLOCK_K * 2 bytes a stage, plus the c tile staged for the TMA
# store, BLOCK_M * BLOCK_N * 2 / EPILOGUE_SPLIT bytes; an H100 block may take 227 KB. Measured by
# scripts/tune/tma_sweep.py on an H100; docs/tuning/gemm.md has the figures.
TMA_CONFIGS = [
    # the Hopper tile: two warpgroups each hold a 64 x 256 fp32 accumulator; 144 KB of stages + 32 KB
    # for c; ahead of the tiled kernel's 128 x 256 config at every large shape swept
    (128, 256, 64, 8, 3, 2),
    (128, 256, 64, 8, 4, 2),  # 192 + 32 KB: one more stage in flight; ties s3 within the run-to-run spread
    # twice the tiles, where 128 x 256 ones leave SMs idle; 4 warps (one warpgroup of 128 x 128)
    # beat 8 at every shape swept
    (128, 128, 64, 4, 4, 1),
    # 1024^3 and the like: 128 tiles, one an SM; 192 KB of stages + 16 KB for c; 4 stages beat 3
    # and 128 x 128 tiles (scripts/tune/host_and_picks.py tma1024)
    (64, 128, 128, 4, 4, 1),
    # a read transposed (the backward's dW = dz^T @ a, A_TRANSPOSED) only: 128 x 256 with the c tile
    # stored whole, and 256 x 128 (144 + 64 KB, 144 + 32 KB): the fastest there
    # in the backward sweep; other layouts gained nothing from them (docs/tuning/gemm.md)
    (128, 256, 64, 8, 3, 1),
    (256, 128, 64, 8, 3, 2),
]
# The rows only a transposed a competes with
TRANSPOSED_A_ONLY = {(128, 256, 64, 8, 3, 1), (256, 128, 64, 8, 3, 2)}
# A tile of c leaves in EPILOGUE_SPLIT column slices: each slice's staging buffer is a fraction of
# the tile's, which leaves room for one more load stage.

# Programs the interpreter runs (it has no SMs): few, so each walks several of the test tiles.
INTERPRET_SMS = 3
INTERPRET_CONFIG = (32, 32, 32, 4, 1, 2)


def fits(a, b, c):
    """Whether a TMA descriptor can cover a (as (M, K) row-major or a (K, M) transpose), b (as
    (K, N) row-major or an (N, K) transpose) and c (row-major): 16-byte-aligned bases and row
    strides, a contiguous last dimension."""
    e = a.element_size()

    def aligned(t, row_stride):
        return t.data_ptr() % 16 == 0 and (row_stride * e) % 16 == 0

    a_ok = (a.stride(1) == 1 and aligned(a, a.stride(0))) or (a.stride(0) == 1 and aligned(a, a.stride(1)))
    b_ok = (b.stride(1) == 1 and aligned(b, b.stride(0))) or (b.stride(0) == 1 and aligned(b, b.stride(1)))
    c_ok = c.stride(1) == 1 and aligned(c, c.stride(0))
    return a_ok and b_ok and c_ok


@triton.jit
def _matmul_tma_kernel(
    # TMA descriptors: a (M, K), or (K, M) when A_TRANSPOSED; b (K, N), or (N, K) when
    # B_TRANSPOSED; c (M, N); z (M, N), the pre-activation output (STORE_Z, else None); bias
    # pointer (HAS_BIAS, else None)
    a_desc, b_desc, c_desc, z_desc, bias_ptr,
    # matrix dimensions; M_BUCKET is only the autotune key (M rounded up to a power of two)
    M, N, K, M_BUCKET,
    # meta-parameters
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_Z: tl.constexpr,
    A_TRANSPOSED: tl.constexpr, B_TRANSPOSED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SPLIT: tl.constexpr, NUM_SMS: tl.constexpr,
):  # fmt: skip
    """Program p computes tiles p, p + NUM_SMS, ... (grouped order), each over all of K."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_steps):  # past K, the copies read zeros, which add nothing
            if A_TRANSPOSED:
                a = a_desc.load([k * BLOCK_K, off_m]).T
            else:
                a = a_desc.load([off_m, k * BLOCK_K])
            if B_TRANSPOSED:
                b = b_desc.load([off_n, k * BLOCK_K]).T
            else:
                b = b_desc.load([k * BLOCK_K, off_n])
            acc = tl.dot(a, b, acc)

        if HAS_BIAS:
            rn = off_n + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if STORE_Z:
            store_split(z_desc, acc, off_m, off_n, BLOCK_M, BLOCK_N, EPILOGUE_SPLIT)
        acc = activate(acc, ACTIVATION)
        store_split(c_desc, acc, off_m, off_n, BLOCK_M, BLOCK_N, EPILOGUE_SPLIT)


@triton.jit
def store_split(c_desc, acc, off_m, off_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EPILOGUE_SPLIT: tl.constexpr):
    """Round the fp32 tile to c's dtype and store it in EPILOGUE_SPLIT (1 or 2) column slices; the
    store clips rows and columns past (M, N)."""
    if EPILOGUE_SPLIT == 1:
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
    else:
        tiles = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        c_desc.store([off_m, off_n], tiles[0].to(c_desc.dtype))
        c_desc.store([off_m, off_n + BLOCK_N // 2], tiles[1].to(c_desc.dtype))


def set_blocks(nargs):
    """Autotuner pre-hook: the descriptors' block shapes follow the config being run."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bk, bm] if nargs["A_TRANSPOSED"] else [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk] if nargs["B_TRANSPOSED"] else [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn // nargs["EPILOGUE_SPLIT"]]
    if nargs["z_desc"] is not None:
        nargs["z_desc"].block_shape = [bm, bn // nargs["EPILOGUE_SPLIT"]]


def row_of(config):
    """The TMA_CONFIGS row of an autotuner config."""
    kw = config.kwargs
    return kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], config.num_warps, config.num_stages, kw["EPILOGUE_SPLIT"]


def prune_configs(configs, named_args, **kwargs):
    """128 x 256 tiles while they make at least 2/3 of a wave (one program an SM), smaller ones
    below that; with a read transposed, the TRANSPOSED_A_ONLY rows too while 128 x 256 tiles run."""
    args = {**named_args, **kwargs}
    waves = cdiv(args["M"], 128) * cdiv(args["N"], 256) / args["NUM_SMS"]
    large = waves >= 2 / 3
    kept = []
    for c in configs:
        if row_of(c) in TRANSPOSED_A_ONLY:
            if large and args.get("A_TRANSPOSED"):
                kept.append(c)
        elif (c.kwargs["BLOCK_N"] == 256) == large:
            kept.append(c)
    return kept


def meta_of(config):
    bm, bn, bk, warps, stages, split = config
    return dict(
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, EPILOGUE_SPLIT=split, num_warps=warps, num_stages=stages
    )


def autotune_configs():
    return [
        triton.Config(
            {k: v for k, v in meta_of(c).items() if not k.startswith("num_")},
            num_warps=c[3],
            num_stages=c[4],
            pre_hook=set_blocks,
        )
        for c in TMA_CONFIGS
    ]


@functools.lru_cache(maxsize=None)
def tuned():
    """The kernel autotuned over TMA_CONFIGS (built on first use, never in the interpreter). The
    autotuner's pick is kept per key with triton_matmul_common.pick_config: later calls launch it directly."""
    return triton.autotune(
        configs=autotune_configs(),
        key=["M_BUCKET", "N", "K", "A_TRANSPOSED", "B_TRANSPOSED", "STORE_Z"],
        prune_configs_by={"early_config_prune": prune_configs},
        do_bench=autotune_bench,
    )(_matmul_tma_kernel)


def launch_matmul_tma(a, b, bias, activation, c, num_sms, config=None, z=None):
    """Launch on validated arguments that `fits`: a (M, K) and b (K, N) either layout, bias (N,) or
    None, c (M, N) with M, N >= 1. config: a TMA_CONFIGS row to run as is; None autotunes on the
    key's first call and runs the pick after it (the interpreter runs INTERPRET_CONFIG on
    INTERPRET_SMS programs). z: None, or a row-major (M, N) buffer with c's strides that receives
    the pre-activation a @ b + bias."""
    (m, k), n = a.shape, b.shape[1]
    a_transposed = a.stride(1) != 1
    transposed = b.stride(1) != 1
    if INTERPRET and config is None:
        config = INTERPRET_CONFIG
    meta = meta_of(config) if config is not None else picked_config(_matmul_tma_kernel, a, b, m, n, k, z is not None)
    if meta is None:
        meta = untuned_config(a, autotune_configs(), prune_configs, dict(M=m, N=n, NUM_SMS=num_sms))
    # block shapes are placeholders until the config is known (set_blocks)
    bm, bn, bk = (meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]) if meta else (16, 16, 16)
    split = meta["EPILOGUE_SPLIT"] if meta else 1
    if a_transposed:  # X (K, M) with X.T = a
        a_desc = TensorDescriptor(a.T, [k, m], [a.stride(1), 1], [bk, bm])
    else:
        a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [bm, bk])
    if transposed:  # W (N, K) with W.T = b
        b_desc = TensorDescriptor(b.T, [n, k], [b.stride(1), 1], [bn, bk])
    else:
        b_desc = TensorDescriptor(b, [k, n], [b.stride(0), 1], [bk, bn])
    c_desc = TensorDescriptor(c, [m, n], [c.stride(0), 1], [bm, bn // split])
    # no z or no bias: None, which the kernel takes as a constant: one descriptor fewer for the
    # launch to encode on the host (host time decides the backward at 4096^3, docs/tuning/gemm.md)
    z_desc = None if z is None else TensorDescriptor(z, [m, n], [z.stride(0), 1], [bm, bn // split])
    args = (a_desc, b_desc, c_desc, z_desc, bias, m, n, k, m_bucket(m))
    flags = dict(
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        STORE_Z=z is not None,
        A_TRANSPOSED=a_transposed,
        B_TRANSPOSED=transposed,
        NUM_SMS=num_sms,
    )
    if meta is None:
        tuner = tuned()
        tuner[lambda meta: (min(num_sms, cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"])),)](*args, **flags)
        pick_config(_matmul_tma_kernel, a, b, m, n, k, tuner.best_config, z is not None)
        return
    grid = (min(num_sms, cdiv(m, bm) * cdiv(n, bn)),)
    _matmul_tma_kernel[grid](*args, **flags, **meta)
