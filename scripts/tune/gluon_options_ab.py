"""GPU A/B of the Gluon forward's option rows (attention/gluon_flash_attention_fwd.py), on the
attention benchmark's shapes, bf16 hd 128 H 32 causal, in one process:

- packed: the benchmark's 64 sequences of 128..8192 tokens (131072 in all) on each grid (one tile a
  program, static, dynamic), against the tl kernel, and against the dense Gluon kernel on equal
  work: each sequence's FLOPs at the dense kernel's causal TFLOP/s at its length (measured on full
  batches, B = 131072 / T, at T = 128..8192, interpolated in log T), summed as times;
- window: T 16384, window (4095, 0), on each grid, against the plain causal call's TFLOP/s
  (visible pairs counted for both);
- softcap 50 at B4 T4096 against the same call without it (time ratio), fp16 and bf16.

Each variant's O is compared with the tl kernel's (max |difference| printed; more than 2e-2
prints BAD and is not timed). Times are triton.testing.do_bench medians.

    python scripts/tune/gluon_options_ab.py                (H100/H200, Triton 3.6: ~1 min)
    python scripts/tune/gluon_options_ab.py --only softcap
"""

import argparse
import math
import os
import threading

import torch
import triton

from llmk.attention.attention_checks import attention_mask
from llmk.attention.gluon_flash_attention_fwd import (
    DYNAMIC,
    ONE_TILE,
    STATIC,
    gluon_config,
    launch_gluon_attention,
)
from llmk.attention.triton_flash_attention_fwd import launch_flash_attention
from llmk.benchmarks.attention_bench import (
    VARLEN_MAX,
    VARLEN_MIN,
    VARLEN_SEQS,
    VARLEN_TOKENS,
    attention_flops,
    varlen_lengths,
    window_pairs,
)

H, D = 32, 128
GRIDS = {"one tile a program": ONE_TILE, "static": STATIC, "dynamic": DYNAMIC}
WATCHDOG_S = 240
DTYPE = torch.bfloat16


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=DTYPE)


def timed(label, call, out, want, flops, rows):
    """do_bench's median of call (which writes out) where out is within 2e-2 of want."""
    out.fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    err = (out.float() - want.float()).abs().max().item()
    if not err <= 2e-2:
        print(f"{label} | BAD | max |diff| vs tl {err:.3g}", flush=True)
        return None
    ms = triton.testing.do_bench(call)
    rows[label] = ms
    print(f"{label} | {flops / ms / 1e9:.0f} TFLOP/s | {ms:.3f} ms | max |diff| vs tl {err:.3g}", flush=True)
    return ms


def dense_rates():
    """Dense Gluon causal TFLOP/s at T = 128..8192 on full batches (the table's config)."""
    rates = {}
    for t in (128, 256, 512, 1024, 2048, 4096, 8192):
        b = VARLEN_TOKENS // t
        q, k, v = randn(b, H, t, D), randn(b, H, t, D), randn(b, H, t, D)
        out = torch.empty_like(q)
        ms = triton.testing.do_bench(lambda: launch_gluon_attention(q, k, v, out, True, D**-0.5))
        rates[t] = attention_flops(b, H, t, D, True) / ms / 1e9
        print(f"dense causal B{b} T{t} | {rates[t]:.0f} TFLOP/s", flush=True)
    return rates


def rate_at(rates, t):
    """rates interpolated linearly in log2 T (clamped at the ends)."""
    ts = sorted(rates)
    if t <= ts[0]:
        return rates[ts[0]]
    for lo, hi in zip(ts, ts[1:]):
        if t <= hi:
            w = (math.log2(t) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            return rates[lo] * (1 - w) + rates[hi] * w
    return rates[ts[-1]]


def packed_rows():
    lengths = varlen_lengths(VARLEN_SEQS, VARLEN_MIN, VARLEN_MAX, VARLEN_TOKENS)
    total = sum(lengths)
    q, k, v = randn(total, H, D), randn(total, H, D), randn(total, H, D)
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    view = lambda t: t.unsqueeze(0).transpose(1, 2)  # noqa: E731  (total, H, D) -> (1, H, total, D)
    out = torch.empty_like(q)
    flops = sum(attention_flops(1, H, n, D, True) for n in lengths)
    seqs = (cu, cu, max(lengths))
    scale = D**-0.5
    rows = {}
    launch_flash_attention(view(q), view(k), view(v), view(out), True, scale, None, seqs)
    want = out.clone()
    timed(
        "packed | tl",
        lambda: launch_flash_attention(view(q), view(k), view(v), view(out), True, scale, None, seqs),
        out,
        want,
        flops,
        rows,
    )
    for name, grid in GRIDS.items():
        config = (*gluon_config(D, True)[:5], grid)
        timed(
            f"packed | gluon {name}",
            lambda c=config: launch_gluon_attention(
                view(q), view(k), view(v), view(out), True, scale, config=c, cu_seqlens=seqs
            ),
            out,
            want,
            flops,
            rows,
        )
    rates = dense_rates()
    equal_ms = sum(attention_flops(1, H, n, D, True) / rate_at(rates, n) / 1e9 for n in lengths)
    print(f"packed | dense gluon on equal work | {flops / equal_ms / 1e9:.0f} TFLOP/s | {equal_ms:.3f} ms", flush=True)
    for label, ms in rows.items():
        print(f"{label} / dense on equal work | {equal_ms / ms:.3f}", flush=True)


def window_rows():
    t, left = 16384, 4095
    q, k, v = randn(1, H, t, D), randn(1, H, t, D), randn(1, H, t, D)
    out = torch.empty_like(q)
    scale = D**-0.5
    rows = {}
    causal_flops = attention_flops(1, H, t, D, True)
    launch_flash_attention(q, k, v, out, True, scale)
    want = out.clone()
    causal_ms = timed(
        "window off (causal) | gluon table",
        lambda: launch_gluon_attention(q, k, v, out, True, scale),
        out,
        want,
        causal_flops,
        rows,
    )
    mask = attention_mask((left, 0), None)
    launch_flash_attention(q, k, v, out, True, scale, mask=mask)
    want = out.clone()
    flops = 4 * H * D * window_pairs(t, left)
    for name, grid in GRIDS.items():
        config = (*gluon_config(D, False)[:5], grid)
        ms = timed(
            f"window | gluon {name}",
            lambda c=config: launch_gluon_attention(q, k, v, out, True, scale, mask=mask, config=c),
            out,
            want,
            flops,
            rows,
        )
        if ms and causal_ms:
            print(
                f"window | gluon {name} / causal TFLOP/s | {(flops / ms) / (causal_flops / causal_ms):.3f}", flush=True
            )


def softcap_rows(dtype=DTYPE):
    """Softcap 50 against no cap, in `dtype`."""
    b, t = 4, 4096
    q, k, v = (torch.randn(b, H, t, D, device="cuda", dtype=dtype) for _ in range(3))
    out = torch.empty_like(q)
    scale = D**-0.5
    flops = attention_flops(b, H, t, D, True)
    rows = {}
    name = "fp16" if dtype == torch.float16 else "bf16"
    launch_flash_attention(q, k, v, out, True, scale)
    off = timed(
        f"softcap off {name} | gluon",
        lambda: launch_gluon_attention(q, k, v, out, True, scale),
        out,
        out.clone(),
        flops,
        rows,
    )
    mask = attention_mask(None, 50.0)
    launch_flash_attention(q, k, v, out, True, scale, mask=mask)
    want = out.clone()
    on = timed(
        f"softcap 50 {name} | gluon",
        lambda: launch_gluon_attention(q, k, v, out, True, scale, mask=mask),
        out,
        want,
        flops,
        rows,
    )
    if on and off:
        print(f"softcap {name} | time with / without | {on / off:.3f}", flush=True)


def main():
    def hang():
        print(f"TIMEOUT: a kernel ran past {WATCHDOG_S} s", flush=True)
        os._exit(3)

    timer = threading.Timer(WATCHDOG_S, hang)
    timer.start()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--only", nargs="+", choices=("packed", "window", "softcap"), default=("packed", "window", "softcap")
    )
    args = parser.parse_args()
    if "packed" in args.only:
        packed_rows()
    if "window" in args.only:
        window_rows()
    if "softcap" in args.only:
        for dtype in (torch.bfloat16, torch.float16):
            softcap_rows(dtype)
    timer.cancel()


if __name__ == "__main__":
    main()
