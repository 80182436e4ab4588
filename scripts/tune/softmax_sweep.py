"""GPU sweep for attention/triton_softmax.py: times each path's candidate configs (fused: rows a
program x warps; looped: chunk x warps; split: segment x warps) at each row width, to set
SOFTMAX_TABLE and the split path's constants from measurement.

    python scripts/tune/softmax_sweep.py             (GPU, bf16: ~10 min, compiles included)
    python scripts/tune/softmax_sweep.py --smoke     (interpreter, tiny shapes: proves the script runs)

Shapes: 16M elements (M = 16M / N rows) at each N, plus few wide rows (128 x 131072, 64 x 262144)
where the split path competes. Bytes a call: read x, write y (2*M*N*e). Each config is checked
against torch.softmax in fp32 first (a wrong one prints BAD and is not timed), then timed with
common.timing.time_ms. One line a config: GB/s and its share of the copy bandwidth measured at the
start; '*' marks softmax_config's choice. Read off: the best config per shape.
"""

import torch

from llmk.attention.triton_softmax import INTERPRET_SMS, MAX_SPLITS, SoftmaxConfig, launch_softmax, softmax_config
from llmk.common.device import DEVICE, sm_count
from llmk.common.ints import cdiv, next_power_of_2

from sweep_common import measure_copy, parse_sweep_args, report_config

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
WIDTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
WIDE = ((128, 131072), (64, 262144))
SMOKE_SHAPES = ((4, 64), (4, 9000), (1, 20000))


def chunk_for(values, n_cols):
    """The launcher's chunk rule: of values (capped at the padded row), its half and its quarter,
    the one that pads N least."""
    chunk = min(values, next_power_of_2(n_cols))
    return min((chunk, chunk // 2, chunk // 4), key=lambda c: cdiv(n_cols, c) * c)


def candidates(n_rows, n_cols, smoke):
    block_n = next_power_of_2(n_cols)
    configs = []
    if block_n <= 16384:
        for rows in (1, 2, 4, 8):
            for warps in (4, 8, 16):
                if rows * block_n <= 16384:
                    configs.append(SoftmaxConfig("fused", rows, block_n, warps, 1, n_cols))
    for values in (2048, 4096, 8192, 16384):
        for warps in (8, 16, 32):
            configs.append(SoftmaxConfig("looped", 1, chunk_for(values, n_cols), warps, 1, n_cols))
    for seg in (2048, 4096, 8192):
        if n_cols > seg and cdiv(n_cols, seg) <= MAX_SPLITS:
            for warps in (4, 8):
                configs.append(SoftmaxConfig("split", 1, seg, warps, cdiv(n_cols, seg), seg))
    configs = list(dict.fromkeys(configs))
    return configs[:2] + configs[-2:] if smoke else configs


def describe_config(cfg):
    if cfg.path == "fused":
        return f"fused  {cfg.BLOCK_M} rows, {cfg.num_warps:2d} warps"
    if cfg.path == "looped":
        return f"looped chunk {cfg.BLOCK_N:5d}, {cfg.num_warps:2d} warps"
    return f"split  segment {cfg.seg_len:5d} x {cfg.n_splits}, {cfg.num_warps:2d} warps"


def main():
    args = parse_sweep_args(__doc__, "softmax_sweep", DTYPES)
    dtype = DTYPES[args.dtype]
    n_sms = sm_count(torch.device(DEVICE).index or 0, INTERPRET_SMS)
    copy_GBps = measure_copy(args, f"{n_sms} SMs")
    shapes = SMOKE_SHAPES if args.smoke else tuple((2**24 // n, n) for n in WIDTHS) + WIDE
    for n_rows, n_cols in shapes:
        x = torch.randn(n_rows, n_cols, device=DEVICE).to(dtype)
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), -1)
        picked = softmax_config(n_rows, n_cols, n_sms)
        print(f"{n_rows} x {n_cols}", flush=True)
        for cfg in dict.fromkeys(candidates(n_rows, n_cols, args.smoke) + [picked]):
            call = lambda: launch_softmax(x, y, cfg)  # noqa: E731
            report_config(
                describe_config(cfg),
                call,
                y,
                ref,
                cfg == picked,
                n_bytes=2 * x.numel() * x.element_size(),
                copy_GBps=copy_GBps,
            )


if __name__ == "__main__":
    main()
