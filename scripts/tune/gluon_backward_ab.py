"""GPU A/B of the backward's Gluon kernels (attention/gluon_flash_attention_bwd.py) against the tl
kernels, on the attention benchmark's training shapes, bf16, in one process:

- tl, the default schedule (one pass where one_pass_when takes it, else two);
- tl, two passes (deterministic=True);
- one kernel in Gluon and the other tl, at the tables' configs;
- both in Gluon: the dk/dv kernel at GLUON_DKDV_CONFIG's config and at DKDV_AB_CONFIGS', the dq
  kernel at GLUON_DQ_CONFIG's; then the dq kernel at DQ_AB_CONFIGS'; on the causal shapes without
  a window, both at the tables' configs with the grids dealt at ROW_GROUPS' values of
  CAUSAL_ROW_GROUP (0: the launch order; else heaviest block first in groups of that many rows).
The window and softcap shapes are attention_bench's (the dk/dv kernel at GLUON_DKDV_SOFTCAP_CONFIG's
config under the cap); the packed ones its packed batch (PACKED_SHAPES: the tl kernels, the Gluon
pair, the dk/dv kernel at DKDV_AB_CONFIGS' configs too). Beside each shape without a window or
softcap, SDPA's cuDNN backward on the same inputs (the peer; --profile: its kernels, forward and
backward, and the Gluon forward's and pair's, each under torch.profiler).

Each row is one whole backward (the preprocess, dk/dv, dq) on the same inputs, TFLOP/s counted as
the benchmark counts them (2.5x the forward's FLOPs over the visible pairs); dq, dk, dv are compared
with the tl two-pass schedule's (max |difference| printed; more than 5e-2 relative to the largest
gradient prints BAD and is not timed). Times are triton.testing.do_bench medians.

    python scripts/tune/gluon_backward_ab.py                   (H100/H200, Triton 3.6: ~2 min)
    python scripts/tune/gluon_backward_ab.py --shapes causal   (the shapes whose name holds a word)
"""

import argparse
import math
import os
import threading

import torch
import triton

from llmk.attention import gluon_flash_attention_bwd as gluon_bwd
from llmk.attention.attention_checks import attention_mask
from llmk.attention.attention_paths import forced_path
from llmk.attention.flash_attention_ops import flash_attention_train_op, flash_attention_varlen_train_op, packed
from llmk.attention.triton_flash_attention_bwd import launch_flash_attention_backward
from llmk.benchmarks.attention_bench import (
    VARLEN_MAX,
    VARLEN_MIN,
    VARLEN_SEQS,
    VARLEN_TOKENS,
    attention_flops,
    varlen_lengths,
)
from llmk.devtools.bench import kernel_times
from llmk.devtools.testing import table_entry

# (name, B, H, Hkv, T, D, causal, window, softcap): attention_bench's training rows, its GQA shape's
# group, and its window and softcap rows (FLOPs on the visible pairs, as it counts them)
SHAPES = [
    ("hd128 B4 H32 T4096 full", 4, 32, 32, 4096, 128, False, None, None),
    ("hd128 B4 H32 T4096 causal", 4, 32, 32, 4096, 128, True, None, None),
    ("hd128 B4 H32/8 T4096 causal (GQA)", 4, 32, 8, 4096, 128, True, None, None),
    ("hd128 B16 H32 T1024 causal", 16, 32, 32, 1024, 128, True, None, None),
    ("hd128 B1 H32 T16384 causal", 1, 32, 32, 16384, 128, True, None, None),
    ("hd64 B8 H32 T2048 full", 8, 32, 32, 2048, 64, False, None, None),
    ("hd64 B8 H32 T2048 causal", 8, 32, 32, 2048, 64, True, None, None),
    ("hd128 B1 H32 T16384 window (4095, 0)", 1, 32, 32, 16384, 128, True, (4095, 0), None),
    ("hd128 B4 H32 T4096 causal softcap 50", 4, 32, 32, 4096, 128, True, None, 50.0),
    # the attention of benchmarks/train_bench.py's llama-1.5b step (hidden 2048, GQA 32/8, B2 x T4096)
    ("hd64 B2 H32/8 T4096 causal (llama-1.5b)", 2, 32, 8, 4096, 64, True, None, None),
]
# (name, H, Hkv, D): packed batches of attention_bench's lengths (64 sequences of 128..8192 tokens,
# 131072 in all), causal; FLOPs the sequences' own
PACKED_SHAPES = [
    ("packed hd128 H32 causal", 32, 32, 128),
    ("packed hd64 H32/8 causal", 32, 8, 64),
]
# CAUSAL_ROW_GROUP's values weighed against the table's (4) on the causal shapes (0: the launch order)
ROW_GROUPS = (0, 8)
WATCHDOG_S = 400
PROFILE = False  # --profile
DTYPE = torch.bfloat16


def shape_rows(name, b, h, hkv, t, d, causal, window, softcap):
    """Every variant's backward on one shape."""
    q = torch.randn(b, h, t, d, device="cuda", dtype=DTYPE)
    k, v = (torch.randn(b, hkv, t, d, device="cuda", dtype=DTYPE) for _ in range(2))
    do = torch.randn_like(q)
    scale = 1.0 / math.sqrt(d)
    mask = attention_mask(window, softcap)
    with torch.no_grad():
        o, lse = flash_attention_train_op(
            q, k, v, causal, None, None, False, mask.window_left, mask.window_right, mask.softcap
        )
    flops = 2.5 * attention_flops(b, h, t, d, causal, window[0] if window else None)
    grads = [torch.empty_like(x) for x in (q, k, v)]

    def backward(**kw):
        return lambda: launch_flash_attention_backward(do, q, k, v, o, lse, *grads, causal, scale, mask=mask, **kw)

    backward(deterministic=True, gluon=())()
    want = [g.clone() for g in grads]
    variants = [
        ("tl, default schedule", backward(gluon=())),
        ("tl, two passes", backward(deterministic=True, gluon=())),
        ("Gluon dkdv + tl dq (tables)", backward(gluon=("dkdv",))),
        ("tl dk/dv + Gluon dq (tables)", backward(gluon=("dq",))),
    ]
    # under a softcap the dk/dv kernel reads GLUON_DKDV_SOFTCAP_CONFIG: its sweep stays on the other shapes
    dkdv_tables = (
        (gluon_bwd.GLUON_DKDV_SOFTCAP_CONFIG, {})
        if softcap
        else (gluon_bwd.GLUON_DKDV_CONFIG, gluon_bwd.DKDV_AB_CONFIGS)
    )
    pair = backward(gluon=("dkdv", "dq"))
    for kernel, tables, others in (("dkdv", *dkdv_tables), ("dq", gluon_bwd.GLUON_DQ_CONFIG, gluon_bwd.DQ_AB_CONFIGS)):
        table = tables[d]
        for config in (table, *others.get(d, ())) if kernel == "dkdv" else others[d]:
            label = (
                f"Gluon dkdv {config}{' (table)' if config == table else ''} + Gluon dq (table)"
                if kernel == "dkdv"
                else f"Gluon dkdv (table) + Gluon dq {config}"
            )
            variants.append((label, with_entry(pair, tables, d, config)))
    if causal and window is None:
        deal = {rows: f"in groups of {rows} rows" if rows else "in the launch order" for rows in ROW_GROUPS}
        variants += [
            (
                f"Gluon (tables), causal grids dealt {deal[rows]}",
                with_entry(pair, vars(gluon_bwd), "CAUSAL_ROW_GROUP", rows),
            )
            for rows in ROW_GROUPS
        ]
    time_variants(name, variants, grads, want, flops)
    if window is None and softcap is None:
        time_peer(name, q, k, v, do, causal, flops)
    if PROFILE:

        def forward():
            with forced_path("gluon"):
                flash_attention_train_op(
                    q, k, v, causal, None, None, False, mask.window_left, mask.window_right, mask.softcap
                )

        calls = {"Gluon forward": forward, "Gluon (tables)": pair}
        if window is None and softcap is None:
            calls["sdpa cuDNN"] = lambda: sdpa_backward(q, k, v, do, causal)()  # a forward, then its backward
        profile_kernels(name, calls)


def with_entry(call, table, key, value):
    """call with table[key] = value around it (table_entry: the launchers read their tables, and
    CAUSAL_ROW_GROUP, at each launch)."""

    def run():
        with table_entry(table, key, value):
            call()

    return run


def sdpa_backward(q, k, v, do, causal, repeat=False):
    """SDPA's cuDNN backward on the same inputs: a call that runs autograd's backward of one forward
    again. GQA as the llama step's eager model runs it (enable_gqa, K and V at their own heads: the
    cuDNN backend takes unequal head counts), or with K and V repeated to q's heads (`repeat`, as
    transformers' repeat_kv does where enable_gqa is not used)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    if repeat:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=group > 1)
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def time_peer(name, q, k, v, do, causal, flops):
    """The peer's rows: SDPA's cuDNN backward, timed as the variants are (not compared), GQA native
    and, where K and V have fewer heads, repeated too."""
    for repeat in (False, True) if k.shape[1] < q.shape[1] else (False,):
        label = "sdpa cuDNN (peer" + (", K and V repeated)" if repeat else ")")
        try:
            call = sdpa_backward(q, k, v, do, causal, repeat)
            call()
        except RuntimeError as e:  # no cuDNN attention for this shape or build
            print(f"{name} | {label} | skipped: {str(e)[:120]}", flush=True)
            continue
        ms = triton.testing.do_bench(call)
        print(f"{name} | {label} | {flops / ms / 1e9:.0f} TFLOP/s | {ms:.3f} ms", flush=True)


def profile_kernels(name, calls):
    """--profile: each call's kernels under torch.profiler (one call after a warm-up), ms each (the
    cuDNN call's forward kernels among them: they are named apart from its backward's)."""
    for label, call in calls.items():
        try:
            call()
        except RuntimeError as e:  # no cuDNN attention for this shape or build
            print(f"{name} | {label} kernels | skipped: {str(e)[:120]}", flush=True)
            continue
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        kernels = sorted(kernel_times(prof)[1], key=lambda kt: -kt[1])[:6]
        listed = "; ".join(f"{k[:60]} {us / 1e3:.3f} ms" for k, us in kernels)
        print(f"{name} | {label} kernels | {listed}", flush=True)


def time_variants(name, variants, grads, want, flops):
    """Each (label, call): its gradients against `want` (the tl two-pass schedule's), then its time."""
    for label, call in variants:
        for g in grads:
            g.fill_(float("nan"))
        call()
        torch.cuda.synchronize()
        err = max(
            ((g.float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-6)).item()
            for g, w in zip(grads, want)
        )
        if not err <= 5e-2:
            print(f"{name} | {label} | BAD | max |diff| / max |grad| vs tl two-pass {err:.3g}", flush=True)
            continue
        ms = triton.testing.do_bench(call)
        print(
            f"{name} | {label} | {flops / ms / 1e9:.0f} TFLOP/s | {ms:.3f} ms | max |diff| / max |grad| {err:.2g}",
            flush=True,
        )


def packed_rows(name, h, hkv, d):
    """The tl and Gluon backward on one packed batch, the Gluon dk/dv kernel at GLUON_DKDV_CONFIG's
    config and at DKDV_AB_CONFIGS' (those whose BLOCK_M divides packed_stats' blocks)."""
    lengths = varlen_lengths(VARLEN_SEQS, VARLEN_MIN, VARLEN_MAX, VARLEN_TOKENS)
    total = sum(lengths)
    q = torch.randn(total, h, d, device="cuda", dtype=DTYPE)
    k, v = (torch.randn(total, hkv, d, device="cuda", dtype=DTYPE) for _ in range(2))
    do = torch.randn_like(q)
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    varlen = (cu, cu, max(lengths), max(lengths))
    scale = 1.0 / math.sqrt(d)
    mask = attention_mask(None, None)
    with torch.no_grad():
        o, lse = flash_attention_varlen_train_op(q, k, v, *varlen, True, None, None, False, -1, -1, 0.0)
    flops = 2.5 * sum(attention_flops(1, h, n, d, True) for n in lengths)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    views = [packed(t) for t in (do, q, k, v, o, lse, *grads)]

    def backward(**kw):
        return lambda: launch_flash_attention_backward(*views, True, scale, cu_seqlens=varlen, mask=mask, **kw)

    backward(deterministic=True, gluon=())()
    want = [g.clone() for g in grads]
    variants = [
        ("tl, default schedule", backward(gluon=())),
        ("tl, two passes", backward(deterministic=True, gluon=())),
        ("Gluon (tables)", backward(gluon=("dkdv", "dq"))),
    ]
    for config in gluon_bwd.DKDV_AB_CONFIGS.get(d, ()):
        if gluon_bwd.PACKED_STATS_BLOCK % config[0] == 0:  # a packed batch's BLOCK_M divides packed_stats' blocks
            variants.append(
                (
                    f"Gluon dkdv {config} + Gluon dq",
                    with_entry(backward(gluon=("dkdv", "dq")), gluon_bwd.GLUON_DKDV_CONFIG, d, config),
                )
            )
    time_variants(name, variants, grads, want, flops)


def main():
    def hang():
        print(f"TIMEOUT: a kernel ran past {WATCHDOG_S} s", flush=True)
        os._exit(3)

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=[], help="words a shape's name must hold (any of them)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also each shape's kernels under torch.profiler: the Gluon forward's and backward's, "
        "and cuDNN's forward and backward",
    )
    args = parser.parse_args()
    global PROFILE
    PROFILE = args.profile
    timer = threading.Timer(WATCHDOG_S, hang)
    timer.start()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    for rows, shapes in ((shape_rows, SHAPES), (packed_rows, PACKED_SHAPES)):
        for name, *shape in shapes:
            if not args.shapes or any(word in name for word in args.shapes):
                rows(name, *shape)
    timer.cancel()


if __name__ == "__main__":
    main()
