"""GPU sweep for mlp/launch_config.py: times TILE_TABLE candidates (widest BLOCK_N, elements a program,
num_warps) of the SwiGLU and bias + GELU kernels at model-sized matrices, to set TILE_TABLE from
measurement.

    python scripts/tune/mlp_sweep.py                    (GPU, bf16, both kernels: ~10 min, compiles included)
    python scripts/tune/mlp_sweep.py --kernel swiglu    (one kernel; --dtype fp16 for another dtype)
    python scripts/tune/mlp_sweep.py --smoke            (interpreter, tiny shapes: proves the script runs)

Each candidate goes through mlp.launch_config.tile_config_for, as the table's entry does (so small grids
halve their tiles the same way). Bytes a call: SwiGLU reads gate and up and writes y (3*M*N*e);
bias + GELU reads x and writes y (2*M*N*e, the bias from L2 not counted). Each config is checked
against PyTorch in fp32 first (a wrong one prints BAD and is not timed), then timed with
common.timing.time_ms. One line a config: GB/s and its share of the copy bandwidth measured at the
start; '*' marks the table's entry. Read off: the candidate best or within 1% at the most shapes.
"""

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE
from llmk.mlp.launch_config import TILE_TABLE, tile_config_for
from llmk.mlp.triton_bias_gelu import launch_bias_gelu
from llmk.mlp.triton_glu import launch_glu

from sweep_common import measure_copy, parse_sweep_args, report_config

KERNELS = tuple(TILE_TABLE)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SHAPES = ((4096, 4096), (4096, 11008), (4096, 14336), (8192, 14336), (16384, 14336))
SMOKE_SHAPES = ((5, 1000), (64, 4096))


def candidates(smoke):
    rows = [
        (widest, tile, warps)
        for widest in (512, 1024, 2048)
        for tile in (1024, 2048, 4096, 8192)
        for warps in (2, 4, 8)
    ]
    return rows[:2] + rows[-2:] if smoke else rows


def make_call(kernel, shape, dtype, cfg):
    """(call, y, reference): the kernel forced to cfg, its output, and PyTorch's result in fp32."""
    x = torch.randn(shape, device=DEVICE).to(dtype)
    y = torch.empty_like(x)
    if kernel == "swiglu":
        up = torch.randn(shape, device=DEVICE).to(dtype)
        return (lambda: launch_glu(x, up, y, "silu", cfg)), y, F.silu(x.float()) * up.float()
    bias = torch.randn(shape[-1], device=DEVICE).to(dtype)
    return (lambda: launch_bias_gelu(x, bias, "none", y, cfg)), y, F.gelu(x.float() + bias.float())


def main():
    args = parse_sweep_args(__doc__, "mlp_sweep", DTYPES, kernels=KERNELS)
    dtype = DTYPES[args.dtype]
    elem_size = torch.finfo(dtype).bits // 8
    copy_GBps = measure_copy(args)
    for kernel in args.kernel or KERNELS:
        table_row = TILE_TABLE[kernel][elem_size]
        for shape in SMOKE_SHAPES if args.smoke else SHAPES:
            print(f"{kernel} {shape[0]} x {shape[1]}", flush=True)
            for row in dict.fromkeys(candidates(args.smoke) + [table_row]):
                cfg = tile_config_for(row, *shape, elem_size)
                call, y, ref = make_call(kernel, shape, dtype, cfg)
                name = f"{row} -> {cfg.BLOCK_M:3d} x {cfg.BLOCK_N:4d}, {cfg.num_warps} warps"
                n_bytes = (3 if kernel == "swiglu" else 2) * y.numel() * elem_size
                report_config(name, call, y, ref, row == table_row, n_bytes=n_bytes, copy_GBps=copy_GBps)
                del call, y, ref


if __name__ == "__main__":
    main()
