"""The cost of the losses' target range check (losses/triton_cross_entropy.py, start_target_check):
cross_entropy and fused_linear_cross_entropy, forward and backward, with the check on and off.

    python scripts/target_check_cost.py            (GPU: logits (8192, 128256) bf16; hidden (8192, 4096)
                                                    and weight (128256, 4096) bf16)
    python scripts/target_check_cost.py --smoke    (any device, tiny shapes: proves the script runs;
                                                    the interpreter's host-clock times mean nothing)

Times: devtools/bench.py's time_ms, a triton.testing.do_bench median (L2 flushed before each call),
on and off alternating over ROUNDS rounds, then the median of each setting's rounds. Off is the
measurement switch losses.triton_cross_entropy._CHECK_TARGETS, set here only and restored after each timing.
What to expect: the check enqueues four small kernels over the N targets and a 16-byte copy to the
host ahead of the loss kernels, and the host waits for that copy once they are launched, so the
GPU keeps the loss kernels queued meanwhile: a few to tens of us against calls of milliseconds.
"""

import argparse
import statistics
import sys

import torch

import llmk.losses.triton_cross_entropy as cross_entropy_module
from llmk.common.device import DEVICE, INTERPRET, describe
from llmk.common.timing import time_ms
from llmk.devtools.bench import train_call
from llmk.losses.fused_linear_cross_entropy_ops import fused_linear_cross_entropy
from llmk.losses.triton_cross_entropy import cross_entropy

DTYPE = torch.bfloat16
ROUNDS = 3  # on/off alternations: clock or thermal drift moves both settings alike
CE_SHAPE, LCE_SHAPE = (8192, 128256), (8192, 4096, 128256)  # (N, V) and (N, H, V): Llama 3's head
SMOKE_CE_SHAPE, SMOKE_LCE_SHAPE = (16, 300), (24, 32, 300)


def cross_entropy_call(n, v):
    logits = torch.randn(n, v, device=DEVICE, dtype=DTYPE)
    target = torch.randint(0, v, (n,), device=DEVICE)
    return train_call(cross_entropy, [logits, target], (0,), "fwd+bwd")


def fused_linear_call(n, h, v):
    hidden = torch.randn(n, h, device=DEVICE, dtype=DTYPE)
    weight = (torch.randn(v, h, device=DEVICE) * h**-0.5).to(DTYPE)
    target = torch.randint(0, v, (n,), device=DEVICE)
    return train_call(fused_linear_cross_entropy, [hidden, weight, target], (0, 1), "fwd+bwd")


def timed(call, check):
    cross_entropy_module._CHECK_TARGETS = check
    try:
        return time_ms(call)
    finally:
        cross_entropy_module._CHECK_TARGETS = True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (the interpreter needs them)")
    args = parser.parse_args()
    if INTERPRET and not args.smoke:
        sys.exit("no GPU: the interpreter runs this only with --smoke (tiny shapes)")
    ce_shape, lce_shape = (SMOKE_CE_SHAPE, SMOKE_LCE_SHAPE) if args.smoke else (CE_SHAPE, LCE_SHAPE)
    print(f"target check cost, fwd+bwd, bf16, on {describe()}")
    print(f"{'op':<28} {'shape':<22} {'check on ms':>11} {'off ms':>9} {'cost us':>9} {'cost %':>7}")
    for name, make, shape in (
        ("cross_entropy", cross_entropy_call, ce_shape),
        ("fused_linear_cross_entropy", fused_linear_call, lce_shape),
    ):
        call = make(*shape)
        times = {True: [], False: []}
        for _ in range(ROUNDS):
            for check in (True, False):
                times[check].append(timed(call, check))
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(
            f"{name:<28} {str(shape):<22} {on:>11.3f} {off:>9.3f} {(on - off) * 1e3:>9.1f} "
            f"{(on - off) / off * 100:>7.2f}",
            flush=True,
        )
        del call
        if not INTERPRET:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
