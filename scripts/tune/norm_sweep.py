"""GPU sweep for normalization/launch_config.py: times the fused kernel (rows a program x warps) and
the looped kernel (chunk size) of RMSNorm, residual RMSNorm and LayerNorm at each row width, to set
FUSED_TABLE, LAYERNORM_FUSED_TABLE and LOOP_CHUNK_TABLE from measurement.

    python scripts/tune/norm_sweep.py                    (GPU, bf16, every kernel: ~10 min, compiles included)
    python scripts/tune/norm_sweep.py --kernel rmsnorm   (one kernel; --dtype fp16 for another dtype)
    python scripts/tune/norm_sweep.py --smoke            (interpreter, tiny shapes: proves the script runs)

Shapes: 16384 rows for N <= 16384, 4096 rows above. Bytes a call: read x, write y (2*M*N*e; residual
RMSNorm also reads the residual and writes u: 4*M*N*e); the weight is L2-resident and not counted.
Each config is checked against PyTorch in fp32 first (max |err| within 2% of max |ref|; a wrong
one prints BAD and is not timed), then timed
with common.timing.time_ms. One line a config: GB/s and its share of the copy bandwidth measured at
the start; '*' marks the config the tables pick. Read off: the best config per width.
"""

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE
from llmk.common.ints import cdiv, next_power_of_2
from llmk.normalization.launch_config import LOOP_CHUNK_TABLE, RowConfig, looped_config, row_config
from llmk.normalization.triton_layernorm import launch_layernorm
from llmk.normalization.triton_rmsnorm import launch_rmsnorm

from sweep_common import measure_copy, parse_sweep_args, report_config

KERNELS = ("rmsnorm", "residual_rmsnorm", "layernorm")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
WIDTHS = (64, 256, 512, 1024, 2048, 4096, 5120, 8192, 16384, 32768, 65536, 131072)
SMOKE_WIDTHS = (64, 1000, 5000)
EPS = 1e-6


def candidates(n_rows, n_cols, elem_size, smoke):
    """Fused configs (the whole row in registers) up to 16 KB rows, then every looped chunk size."""
    block_n = next_power_of_2(n_cols)
    configs = []
    if block_n * elem_size <= 16384:
        for block_m in (1, 2, 4, 8, 16, 64):
            for warps in (2, 4, 8):
                if block_m * block_n <= 16384:
                    configs.append(RowConfig(False, block_m, block_n, warps, cdiv(n_rows, block_m)))
    chunks = sorted({c for _, c in LOOP_CHUNK_TABLE} | {1024})
    configs += list(dict.fromkeys(looped_config(n_rows, n_cols, elem_size, c) for c in chunks))
    return configs[:2] + configs[-2:] if smoke else configs


def make_call(kernel, x, cfg):
    """(call, reference): the kernel forced to cfg on x, and PyTorch's result to check it against."""
    n = x.shape[-1]
    w = torch.randn(n, device=DEVICE).to(x.dtype)
    y = torch.empty_like(x)
    if kernel == "layernorm":
        b = torch.randn(n, device=DEVICE).to(x.dtype)
        return (
            (lambda: launch_layernorm(x, w, b, EPS, y, cfg)),
            y,
            F.layer_norm(x.float(), (n,), w.float(), b.float(), EPS),
        )
    if kernel == "residual_rmsnorm":
        r, u = torch.randn_like(x), torch.empty_like(x)
        ref = F.rms_norm((x + r).float(), (n,), w.float(), EPS)
        return (lambda: launch_rmsnorm(x, r, w, EPS, y, u, cfg)), y, ref
    return (lambda: launch_rmsnorm(x, None, w, EPS, y, None, cfg)), y, F.rms_norm(x.float(), (n,), w.float(), EPS)


def describe_config(cfg):
    if cfg.looped:
        return f"looped chunk {cfg.BLOCK_N:6d}, {cfg.num_warps:2d} warps"
    return f"fused {cfg.BLOCK_M:3d} rows, {cfg.num_warps:2d} warps"


def main():
    args = parse_sweep_args(__doc__, "norm_sweep", DTYPES, kernels=KERNELS)
    dtype = DTYPES[args.dtype]
    elem_size = torch.finfo(dtype).bits // 8
    copy_GBps = measure_copy(args)
    for kernel in args.kernel or KERNELS:
        for n_cols in SMOKE_WIDTHS if args.smoke else WIDTHS:
            n_rows = 4 if args.smoke else (16384 if n_cols <= 16384 else 4096)
            x = torch.randn(n_rows, n_cols, device=DEVICE).to(dtype)
            n_bytes = (4 if kernel == "residual_rmsnorm" else 2) * x.numel() * elem_size
            picked = row_config(n_rows, n_cols, elem_size, layernorm=kernel == "layernorm")
            print(f"{kernel} {n_rows} x {n_cols}", flush=True)
            for cfg in dict.fromkeys(candidates(n_rows, n_cols, elem_size, args.smoke) + [picked]):
                call, y, ref = make_call(kernel, x, cfg)
                report_config(describe_config(cfg), call, y, ref, cfg == picked, n_bytes=n_bytes, copy_GBps=copy_GBps)


if __name__ == "__main__":
    main()
