"""GPU sweep for FlashAttention's window= and softcap= (attention/flash_attention_ops*.py): times
forward and backward launch configs on the attention benchmark's option shapes, each beside the
same shape without the option (plain causal, the table's configs), to set their launch rows from
measurement against issue 29's targets: a window's TFLOP/s on its visible pairs equal to causal
attention's, and a softcap's time at most 1.1x the time without it.

    python scripts/tune/attention_options_sweep.py           (GPU, bf16: ~4 min, compiles included)
    python scripts/tune/attention_options_sweep.py --smoke   (interpreter, tiny shapes)

Problems (bf16, causal): a window of 4096 keys (left 4095) at B1 H32 T16384 hd128, and one of 1024
at B4 H32 T4096; softcap 50 at B4 H32 T4096 hd128 and at B2 H8 T4096 hd256 (Gemma 2's head).
FLOPs count visible pairs: 4 * B*H*D * pairs forward, 2.5x that backward. Each line: a config's
TFLOP/s and its ratio to the "off" line of its problem, whose own pairs count: a window's target
is a ratio of 1.00; a softcap's pairs are the same, so its ratio is off's time over the option's,
at least 0.91 for at most 1.1x the time. A window's configs run twice: split into masked edges
and an unmasked middle (the kernel's default), and as one loop of masked blocks; then the same
number of key blocks unmasked (full attention of Tq queries against left + 1 + BLOCK_M keys) shows
what the masks and edges cost beside the causal grid's shape. A config whose
output differs from the table's by more than 2% of its largest value prints BAD, one that does
not fit prints REFUSED; '*' marks the table's pick. Kernels compile first in SWEEP_JOBS processes.
"""

import os

import torch

from llmk.attention.attention_checks import attention_mask
from llmk.attention.attention_paths import forced_path
from llmk.attention.flash_attention_ops import flash_attention, flash_attention_train_op
from llmk.attention.triton_flash_attention_bwd import backward_config, launch_flash_attention_backward
from llmk.attention.triton_flash_attention_fwd import launch_flash_attention, table_config
from llmk.benchmarks.attention_bench import attention_flops
from llmk.common.device import DEVICE, describe
from llmk.common.timing import time_ms
from llmk.devtools.bench import tflops

from sweep_common import parse_sweep_args, precompile, report_config

DTYPES = {"bf16": torch.bfloat16}
# name, (B, H, T, D), window left or None, softcap or None
PROBLEMS = [
    ("window 4096 T16384", (1, 32, 16384, 128), 4095, None),
    ("window 1024 T4096", (4, 32, 4096, 128), 1023, None),
    ("softcap 50 hd128", (4, 32, 4096, 128), None, 50.0),
    ("softcap 50 hd256", (2, 8, 4096, 256), None, 50.0),
]
SMOKE_PROBLEMS = [("window 8 T40", (1, 2, 40, 32), 8, None), ("softcap 5 T40", (1, 2, 40, 32), None, 5.0)]
# forward (BLOCK_M, BLOCK_N, num_warps, num_stages) tried at each head dim beside the table's
FORWARD = {
    128: [
        (128, 64, 8, 3),
        (128, 64, 8, 4),
        (128, 128, 8, 2),
        (128, 128, 8, 3),
        (128, 32, 8, 3),
        (64, 64, 4, 3),
        (64, 128, 4, 3),
    ],
    256: [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 8, 3), (64, 32, 4, 3)],
}
# backward (dk/dv config, dq config or None for the one-pass schedule) beside backward_config's
BACKWARD = {
    128: [
        ((64, 128, 8, 3), None),
        ((64, 128, 8, 3), (128, 64, 8, 2)),
        ((64, 64, 4, 3), None),
        ((128, 64, 8, 2), None),
        ((64, 128, 8, 2), None),
    ],
    256: [((32, 64, 8, 2), None), ((32, 64, 8, 1), (64, 32, 4, 2)), ((32, 32, 4, 2), None)],
}
SMOKE_CONFIG = (16, 16, 1, 1)
WARM_T = 256


def options(left, softcap):
    """The launchers' mask= for a causal window of left keys (None: none) and a softcap (None: none)."""
    return dict(mask=attention_mask(None if left is None else (left, 0), softcap))


def forward_configs(d, smoke):
    return [SMOKE_CONFIG] if smoke else FORWARD[d]


def backward_configs(d, smoke):
    return [(SMOKE_CONFIG, None), (SMOKE_CONFIG, SMOKE_CONFIG)] if smoke else BACKWARD[d]


def table_backward(d):
    return backward_config(d, False, 1, True)


def warm(task):
    """Compile one forward and one backward launch on the problem's batch and heads at WARM_T tokens
    (precompile's worker): Triton specializes int arguments on their divisibility by 16, and the
    head and pair counts are such arguments."""
    b, h, d, left, softcap, fwd, bwd = task
    q, k, v, do = (torch.randn(b, h, WARM_T, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(4))
    # a left bound below WARM_T, odd as the timed ones are (Triton specializes ints on divisibility)
    opts = options(None if left is None else left % WARM_T, softcap)
    try:
        if fwd is not None:
            for split in (True, False) if left is not None else (True,):
                launch_flash_attention(
                    q, k, v, torch.empty_like(q), True, d**-0.5, config=fwd, window_split=split, **opts
                )
        if bwd is not None:
            o, lse = flash_attention_train_op(q, k, v, True, None, None)
            grads = [torch.empty_like(x) for x in (q, k, v)]
            launch_flash_attention_backward(do, q, k, v, o, lse, *grads, True, d**-0.5, config=bwd, **opts)
    except Exception:  # noqa: BLE001  (a config that does not fit: the sweep reports it)
        pass


def sweep_problem(name, shape, left, softcap, smoke):
    b, h, t, d = shape
    q, k, v, do = (torch.randn(b, h, t, d, device=DEVICE).to(torch.bfloat16) for _ in range(4))
    scale = d**-0.5
    out = torch.empty_like(q)
    opts = options(left, softcap)
    fwd_flops = attention_flops(b, h, t, d, True, left)
    off_flops = attention_flops(b, h, t, d, True)
    # the forward: off, then the option's configs
    with forced_path("tl"):  # the tl kernel's own rows: the default path takes the Gluon one on sm_90
        off_fwd = tflops(off_flops, time_ms(lambda: flash_attention(q, k, v, causal=True, out=out)))
    print(f"{name} B{b} H{h} T{t} D{d} forward: off {off_fwd:.0f} TFLOP/s", flush=True)
    with torch.no_grad():
        mask = opts["mask"]
        want = flash_attention(q, k, v, causal=True, window=(mask.window_left, mask.window_right), softcap=softcap)
    picked = SMOKE_CONFIG if smoke else table_config(d, t, windowed=left is not None)
    splits = (True, False) if left is not None else (True,)
    for config in dict.fromkeys(forward_configs(d, smoke) + [picked]):
        for split in splits:
            call = lambda config=config, split=split: launch_flash_attention(  # noqa: E731
                q, k, v, out, True, scale, config=config, window_split=split, **opts
            )
            report_config(
                "{} x {}, {} warps, {} stages".format(*config) + ("" if split else ", one masked loop"),
                call,
                out,
                want,
                config == picked and split,
                flops=fwd_flops,
                sdpa_TFLOPs=off_fwd,
                may_refuse=True,
                versus="off",
            )
    if left is not None:  # the window's work without its masks: each query block against as many keys, unmasked
        keys = left + 1 + picked[0]
        with forced_path("tl"):
            ms = time_ms(lambda: flash_attention(q, k[:, :, :keys], v[:, :, :keys], out=out))
        rate = tflops(4 * b * h * d * t * keys, ms)
        print(
            f"    unmasked, {keys} keys a query (the window's blocks, table config): {rate:.0f} TFLOP/s "
            f"{rate / off_fwd:.2f}x off",
            flush=True,
        )
    # the backward: off with the table's pick, then the option's configs
    with torch.no_grad():
        o_off, lse_off = flash_attention_train_op(q, k, v, True, None, None)
        o, lse = flash_attention_train_op(q, k, v, True, None, None, False, *opts["mask"])
    grads = tuple(torch.empty_like(x) for x in (q, k, v))
    off_bwd = tflops(
        2.5 * off_flops,
        time_ms(lambda: launch_flash_attention_backward(do, q, k, v, o_off, lse_off, *grads, True, scale)),
    )
    print(f"{name} backward: off {off_bwd:.0f} TFLOP/s", flush=True)
    launch_flash_attention_backward(do, q, k, v, o, lse, *grads, True, scale, deterministic=True, **opts)
    want = tuple(g.clone() for g in grads)
    table = (SMOKE_CONFIG, SMOKE_CONFIG) if smoke else table_backward(d)
    for config in dict.fromkeys(backward_configs(d, smoke) + [table]):
        label = "{} x {}, {} warps, {} stages".format(*config[0]) + (
            " one pass" if config[1] is None else " + dq {} x {}, {} warps, {} stages".format(*config[1])
        )
        call = lambda config=config: launch_flash_attention_backward(  # noqa: E731
            do, q, k, v, o, lse, *grads, True, scale, config=config, **opts
        )
        report_config(
            label,
            call,
            grads,
            want,
            config == table,
            flops=2.5 * fwd_flops,
            sdpa_TFLOPs=off_bwd,
            may_refuse=True,
            versus="off",
        )


def main():
    args = parse_sweep_args(__doc__, "attention_options_sweep", DTYPES)
    problems = SMOKE_PROBLEMS if args.smoke else PROBLEMS
    jobs = int(os.environ.get("SWEEP_JOBS", max(1, (os.cpu_count() or 2) - 1)))
    print(f"{describe()}, bf16, compiling in {jobs} processes", flush=True)
    tasks = []
    for _, (b, h, t, d), left, softcap in problems:
        if args.smoke:
            picks = [SMOKE_CONFIG], [(SMOKE_CONFIG, SMOKE_CONFIG)]
        else:
            picks = [table_config(d, t, left is not None)], [table_backward(d)]
        tasks += [(b, h, d, left, softcap, fwd, None) for fwd in forward_configs(d, args.smoke) + picks[0]]
        tasks += [(b, h, d, left, softcap, None, bwd) for bwd in backward_configs(d, args.smoke) + picks[1]]
    precompile(warm, list(dict.fromkeys(tasks)), jobs)
    for name, shape, left, softcap in problems:
        sweep_problem(name, shape, left, softcap, args.smoke)


if __name__ == "__main__":
    main()
