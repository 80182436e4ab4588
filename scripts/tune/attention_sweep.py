"""GPU sweep for attention/flash_attention_ops.py: times launch configs (BLOCK_M, BLOCK_N,
num_warps, num_stages) at each of CONFIG_TABLE's head dims, full and causal, against PyTorch's SDPA,
to set CONFIG_TABLE from measurement.

    python scripts/tune/attention_sweep.py           (GPU, fp16: ~10 min, compiles included)
    python scripts/tune/attention_sweep.py --cudnn   (SDPA held to its cuDNN backend, the fastest on Hopper)
    python scripts/tune/attention_sweep.py --smoke   (interpreter, tiny shapes: proves the script runs)
    SWEEP_DIMS=128 python scripts/tune/attention_sweep.py --cudnn   (the head-dim-128 shapes only)

Shapes: B4 H32 T4096 D64, B16 H16 T1024 D128, B4 H16 T4096 D128, B1 H16 T16384 D128, B4 H16 T4096 D256
(the attention benchmark's hd-128 forward rows are H16 at 16384 tokens). FLOPs a call:
4 * B*H*T*T*D full, half of that causal. Each config is checked against SDPA first (a wrong one prints
BAD, one that does not fit the GPU prints REFUSED; neither is timed), then timed with
common.timing.time_ms. One line a config: TFLOP/s and its ratio to SDPA's; '*' marks the config the
table picks. Read off: the best config per shape and mask. Kernels compile first in SWEEP_JOBS
processes at once (default: the host's cores less one; sweep_common.precompile).
"""

import contextlib
import os

import torch
import torch.nn.functional as F

from llmk.attention.flash_attention_ops import flash_attention, table_config
from llmk.common.device import DEVICE, describe
from llmk.common.ints import next_power_of_2
from llmk.common.timing import time_ms
from llmk.devtools.bench import tflops

from sweep_common import parse_sweep_args, precompile, report_config

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SHAPES = ((4, 32, 4096, 64), (16, 16, 1024, 128), (4, 16, 4096, 128), (1, 16, 16384, 128), (4, 16, 4096, 256))
WARM_T = 256  # the precompile's sequence length: a multiple of 16, as the timed ones are
SMOKE_SHAPES = ((1, 2, 40, 64),)
SMEM_BYTES = 200 * 1024  # an H100/H200 SM has 228 KB of shared memory; leave the compiler room


def candidates(head_dim, smoke):
    """Blocks of 64 or 128 queries by 32 to 128 keys, 4 or 8 warps, 2 to 4 stages, where the
    stages' K and V blocks fit shared memory."""
    if smoke:
        return [(16, 16, 1, 1), (32, 16, 1, 1)]
    block_d = max(16, next_power_of_2(head_dim))
    return [
        (bm, bn, warps, stages)
        for bm in (64, 128)
        for bn in (32, 64, 128)
        for warps in (4, 8)
        for stages in (2, 3, 4)
        if stages * 2 * bn * block_d * 2 <= SMEM_BYTES
    ]


def warm(task):
    """Compile one config (precompile's worker) on a short sequence of the same specializations."""
    d, h, causal, config, dtype_name = task
    q, k, v = (torch.randn(1, h, WARM_T, d, device=DEVICE, dtype=DTYPES[dtype_name]) for _ in range(3))
    try:
        flash_attention(q, k, v, causal=causal, out=torch.empty_like(q), config=config)
    except Exception:  # noqa: BLE001  (a config that does not fit: the sweep reports it)
        pass


def sdpa_backend(cudnn):
    """SDPA held to its cuDNN backend, or left to choose."""
    if not cudnn:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.CUDNN_ATTENTION)


def main():
    args = parse_sweep_args(
        __doc__,
        "attention_sweep",
        DTYPES,
        flags={"--cudnn": "time SDPA on its cuDNN backend instead of its default pick (not in the interpreter)"},
    )
    dtype = DTYPES[args.dtype]
    cudnn = args.cudnn and not args.smoke  # the interpreter has no cuDNN backend
    versus = "sdpa-cudnn" if cudnn else "SDPA"
    dims = [int(x) for x in os.environ.get("SWEEP_DIMS", "").split(",") if x]
    shapes = SMOKE_SHAPES if args.smoke else [s for s in SHAPES if not dims or s[3] in dims]
    jobs = int(os.environ.get("SWEEP_JOBS", max(1, (os.cpu_count() or 2) - 1)))
    print(f"{describe()}, {args.dtype}, compiling in {jobs} processes", flush=True)
    precompile(
        warm,
        list(
            dict.fromkeys(
                (d, h, causal, config, args.dtype)
                for _, h, _, d in shapes
                for causal in (False, True)
                for config in candidates(d, args.smoke)
            )
        ),
        jobs,
    )
    for b, h, t, d in shapes:
        q, k, v = (torch.randn(b, h, t, d, device=DEVICE).to(dtype) for _ in range(3))
        out = torch.empty_like(q)
        picked = table_config(d, t)
        for causal in (False, True):
            flops = 4 * b * h * t * t * d // (2 if causal else 1)
            with sdpa_backend(cudnn):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                sdpa = tflops(flops, time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))
            print(f"B{b} H{h} T{t} D{d} {'causal' if causal else 'full'}: {versus} {sdpa:.0f} TFLOP/s", flush=True)
            for config in dict.fromkeys(candidates(d, args.smoke) + [picked]):
                call = lambda: flash_attention(q, k, v, causal=causal, out=out, config=config)  # noqa: E731
                name = "{} x {}, {} warps, {} stages".format(*config)
                report_config(
                    name,
                    call,
                    out,
                    ref,
                    config == picked,
                    flops=flops,
                    sdpa_TFLOPs=sdpa,
                    may_refuse=True,
                    versus=versus,
                )


if __name__ == "__main__":
    main()
