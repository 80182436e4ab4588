"""GPU sweep for the FlashAttention backward (attention/triton_flash_attention_bwd.py): times both schedules'
launch configs (BLOCK_M, BLOCK_N, num_warps, num_stages) at each BACKWARD_TABLE head dim against
SDPA's cuDNN and flash backends, then the two schedules against each other where the choice
between them is made (ONE_PASS_WHEN), to set BACKWARD_TABLE from measurement.

    python scripts/tune/attention_backward_sweep.py            (GPU, bf16)
    SWEEP_DIMS=64,128 python scripts/tune/attention_backward_sweep.py   (those head dims only)
    python scripts/tune/attention_backward_sweep.py --smoke    (interpreter, tiny shapes)

Backward FLOPs a call: 2.5x the forward's (4 * B*H*T*T*D full, half causal), flash-attention's
convention, for both schedules (the two-pass one does 7 products of 2*T*T*D a head where that
count has 5).

1. Configs, per head dim, full and causal (B*T = 16384 or 32768 tokens, MHA): the two-pass dk/dv
   configs with the table's dq config, then the dq configs with the best dk/dv one; the one-pass
   configs with dq added by TMA reductions and by fp32 atomics. Each line is the whole backward
   (preprocess, launches, the one-pass dq's rounding) in TFLOP/s and its ratio to sdpa-cudnn's,
   with the registers a thread and bytes spilled of each compiled kernel (ptxas; dk/dv first).
   A config whose gradients differ from the table's two-pass ones by more than 2% of their largest
   value prints BAD; one that does not fit prints REFUSED (sweep_common.report_config). '*' marks
   the table's pick.
2. Schedules: the table's two-pass pair against its one-pass config (the first ONE_PASS config
   where the row has none) by both adds, each in the dk/dv loop order dp_first_when picks and in
   the other one ("dP first": v dO^T issued beside k q^T; "dP last": after the dv product), in
   ROUNDS interleaved rounds (medians), on MHA and GQA shapes and the attention benchmark's packed
   batch.

Kernels compile first in SWEEP_JOBS processes at once (default: the host's cores less one) on small
inputs of the same specializations (sweep_common.precompile).
"""

import os
import statistics

import torch
import torch.nn.functional as F

from llmk.attention.flash_attention_ops import flash_attention_train_op, flash_attention_varlen_train_op, packed
from llmk.attention.triton_flash_attention_bwd import (
    backward_table_config,
    dp_first_when,
    launch_flash_attention_backward,
)
from llmk.common.device import DEVICE, describe
from llmk.common.timing import time_ms
from llmk.devtools.bench import tflops

from sweep_common import parse_sweep_args, precompile, report_config

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# (B, H, Hkv, T) per head dim for the config sweep: the attention benchmark's training shapes (hd 64, 128)
SHAPES = {64: (8, 32, 32, 2048), 128: (4, 32, 32, 4096), 256: (2, 16, 16, 4096)}
SMOKE_SHAPES = {64: (1, 2, 2, 40)}
# the schedule comparison's extra shapes, (B, H, Hkv, T, D): Llama's GQA 32/8, short sequences
SCHEDULE_SHAPES = [(2, 32, 8, 4096, 128), (16, 32, 32, 1024, 128)]
# the benchmark's packed batch: 64 sequences of 128..8192 tokens, 131072 in all, H 32, hd 128, causal
VARLEN = (64, 128, 8192, 131072, 32, 128)
ROUNDS = 3

# Candidates: configs a Triton 3.9 sm_90 compile (ptxas) showed spilling 1 KB or more a thread were
# left out (128-key dk/dv blocks with 4 warps at head dim 128, for one)
TWO_PASS_DKDV = {
    64: [
        (64, 128, 8, 3),
        (32, 128, 4, 3),
        (128, 128, 8, 3),
        (32, 64, 4, 3),
        (64, 64, 4, 3),
        (32, 128, 4, 5),
        (64, 128, 8, 2),
    ],
    128: [
        (32, 64, 4, 3),
        (64, 128, 8, 3),
        (64, 128, 8, 2),
        (64, 64, 4, 3),
        (32, 64, 4, 4),
        (64, 128, 8, 4),
        (32, 64, 4, 2),
    ],
    256: [(32, 32, 8, 2), (32, 64, 8, 1), (32, 64, 4, 2), (16, 64, 4, 2)],
}
TWO_PASS_DQ = {
    64: [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 128, 8, 3), (128, 64, 4, 3)],
    128: [
        (128, 64, 8, 2),
        (128, 64, 8, 3),
        (128, 32, 4, 5),
        (64, 64, 4, 3),
        (64, 32, 4, 3),
        (64, 64, 4, 4),
        (128, 32, 4, 3),
    ],
    256: [(64, 32, 8, 2), (64, 32, 4, 2), (32, 32, 4, 2), (32, 64, 4, 2)],
}
ONE_PASS = {
    64: [
        (32, 128, 4, 3),
        (64, 128, 8, 3),
        (64, 128, 8, 2),
        (128, 128, 8, 2),
        (64, 64, 4, 3),
        (32, 64, 4, 3),
        (32, 128, 8, 3),
    ],
    128: [
        (64, 128, 8, 3),
        (32, 128, 8, 3),
        (32, 128, 8, 2),
        (32, 128, 8, 4),
        (32, 64, 4, 3),
        (32, 64, 4, 4),
        (64, 128, 8, 2),
        (16, 128, 8, 3),
    ],
    256: [(32, 64, 8, 2), (32, 32, 8, 2), (16, 64, 4, 2), (32, 64, 4, 2)],
}
SMOKE_CONFIG = (16, 16, 1, 1)
WARM_T = 256  # the precompile's sequence length: a multiple of 16, as the timed ones are


def backward_flops(b, h, t, d, causal):
    pairs = t * (t + 1) / 2 if causal else t * t
    return 2.5 * 4 * b * h * d * pairs


def adds(smoke):
    """The one-pass schedule's dq adds to time: the interpreter has no TMA reductions."""
    return ("atomics",) if smoke else ("tma", "atomics")


def configs_of(d, smoke):
    """(two-pass dk/dv configs, two-pass dq configs, one-pass configs) swept at head dim d."""
    if smoke:
        return [SMOKE_CONFIG], [SMOKE_CONFIG], [SMOKE_CONFIG]
    return TWO_PASS_DKDV[d], TWO_PASS_DQ[d], ONE_PASS[d]


def table_launches(d, smoke):
    """(two-pass (dk/dv, dq) pair, one-pass config) of the table row for d: what the schedule
    comparison times."""
    if smoke:
        return (SMOKE_CONFIG, SMOKE_CONFIG), SMOKE_CONFIG
    dkdv, dq, one_pass = backward_table_config(d)
    return (dkdv, dq), one_pass or ONE_PASS[d][0]


def spills(kernels):
    """'regs/spilled bytes' of each compiled kernel a launch returned (dk/dv first)."""
    if not kernels:
        return ""
    return " [" + ", ".join(f"{k.n_regs}r/{k.n_spills}B" for k in kernels) + "]"


def sdpa_backward_ms(q, k, v, do, causal, backend):
    from torch.nn.attention import sdpa_kernel

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    return time_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))


class Problem:
    """One backward problem (dense (B, H, Hkv, T, D) or the packed batch), its forward's O and LSE,
    the table's deterministic gradients to check against, and launch(config, dq_add)."""

    def __init__(self, dtype, causal, shape=None, lengths=None, heads=None, dim=None):
        scale = (dim or shape[4]) ** -0.5
        self.cu = None
        if lengths is None:
            b, h, hkv, t, d = shape
            q, do = (torch.randn(b, h, t, d, device=DEVICE).to(dtype) for _ in range(2))
            k, v = (torch.randn(b, hkv, t, d, device=DEVICE).to(dtype) for _ in range(2))
            with torch.no_grad():
                o, lse = flash_attention_train_op(q, k, v, causal, None, None)
            self.flops = backward_flops(b, h, t, d, causal)
            self.tensors = (do, q, k, v, o, lse)
            self.grads = tuple(torch.empty_like(x) for x in (q, k, v))
            self.views = self.grads
        else:
            total, h, d = sum(lengths), heads, dim
            q, k, v, do = (torch.randn(total, h, d, device=DEVICE).to(dtype) for _ in range(4))
            cu = torch.tensor([0] + lengths, device=DEVICE).cumsum(0).to(torch.int32)
            t_max = max(lengths)
            with torch.no_grad():
                o, lse = flash_attention_varlen_train_op(q, k, v, cu, cu, t_max, t_max, causal, None, None)
            self.flops = sum(backward_flops(1, h, n, d, causal) for n in lengths)
            self.tensors = tuple(packed(x) for x in (do, q, k, v, o, lse))
            self.grads = tuple(torch.empty_like(x) for x in (q, k, v))
            self.views = tuple(packed(g) for g in self.grads)
            self.cu = (cu, cu, t_max, t_max)
        self.causal, self.scale = causal, scale
        self.launch(None, None, deterministic=True)
        self.want = tuple(g.clone() for g in self.grads)

    def launch(self, config, dq_add, deterministic=False, dp_first=None):
        return launch_flash_attention_backward(
            *self.tensors,
            *self.views,
            self.causal,
            self.scale,
            cu_seqlens=self.cu,
            config=config,
            dq_add=dq_add,
            deterministic=deterministic,
            dp_first=dp_first,
        )


def warm(task):
    """Compile one launch on small random inputs (precompile's worker): O and LSE random too, since
    only the specializations matter here."""
    d, h, hkv, causal, varlen, config, dq_add, dp_first, dtype_name = task
    dtype = DTYPES[dtype_name]
    t = WARM_T
    q, do, o = (torch.randn(1, h, t, d, device=DEVICE, dtype=dtype) for _ in range(3))
    k, v = (torch.randn(1, hkv, t, d, device=DEVICE, dtype=dtype) for _ in range(2))
    lse = torch.randn(1, h, t, device=DEVICE, dtype=torch.float32)
    cu = None
    if varlen:  # the (1, H, total, D) views of (total, H, D) tensors, as the public function passes
        q, k, v, do, o = (packed(torch.randn(t, h, d, device=DEVICE, dtype=dtype)) for _ in range(5))
        lse = packed(torch.randn(h, t, device=DEVICE, dtype=torch.float32))
        cu_seqlens = torch.tensor([0, t // 2 + 3, t], device=DEVICE, dtype=torch.int32)  # two ragged sequences
        cu = (cu_seqlens, cu_seqlens, t // 2 + 3, t // 2 + 3)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    try:
        launch_flash_attention_backward(
            do, q, k, v, o, lse, *grads, causal, d**-0.5, cu_seqlens=cu, config=config, dq_add=dq_add, dp_first=dp_first
        )
    except Exception:  # noqa: BLE001  (a config that does not fit: the sweep reports it)
        pass


def launches(d, smoke):
    """Every (config pair, dq_add) the config sweep may time at head dim d (the dq configs' partner,
    the best dk/dv config, is not known ahead: all are compiled with the table's)."""
    dkdv_list, dq_list, one_pass = configs_of(d, smoke)
    (table_dkdv, table_dq), _ = table_launches(d, smoke)
    return (
        [((c, table_dq), None) for c in dkdv_list]
        + [((table_dkdv, c), None) for c in dq_list]
        + [((c, None), add) for c in one_pass for add in adds(smoke)]
    )


def schedule_launches(d, smoke):
    """(label, config, dq_add, dp_first) of each schedule in the dk/dv loop's order for d
    (dp_first_when) and in the other one."""
    two, one = table_launches(d, smoke)
    order = dp_first_when(d)
    return [
        (name if first == order else f"{name} dP {'first' if first else 'last'}", config, add, first)
        for name, config, add in [("two-pass", two, None)]
        + [(f"one-pass {add}", (one, None), add) for add in adds(smoke)]
        for first in (order, not order)
    ]


def warm_tasks(dims, dtype_name, smoke):
    tasks = []
    for d in dims:
        _, h, hkv, _ = (SMOKE_SHAPES if smoke else SHAPES)[d]
        tasks += [
            (d, h, hkv, causal, False, config, add, None, dtype_name)
            for causal in (False, True)
            for config, add in launches(d, smoke)
        ]
    if not smoke:
        for b, h, hkv, t, d in SCHEDULE_SHAPES:
            if d in dims:
                tasks += [
                    (d, h, hkv, causal, False, config, add, first, dtype_name)
                    for causal in (False, True)
                    for _, config, add, first in schedule_launches(d, smoke)
                ]
        if VARLEN[5] in dims:
            tasks += [
                (VARLEN[5], VARLEN[4], VARLEN[4], True, True, config, add, first, dtype_name)
                for _, config, add, first in schedule_launches(VARLEN[5], smoke)
            ]
    return list(dict.fromkeys(tasks))


def run_config(problem, label, config, dq_add, cudnn, picked):
    """Time one launch through report_config; its rate, or None."""
    try:
        kernels = problem.launch(config, dq_add)
    except Exception as e:  # noqa: BLE001
        print(f"    {label}  REFUSED ({type(e).__name__}: {str(e)[:80]})", flush=True)
        return None
    return report_config(
        f"{label}{spills(kernels)}",
        lambda: problem.launch(config, dq_add),
        problem.grads,
        problem.want,
        picked,
        flops=problem.flops,
        sdpa_TFLOPs=cudnn,
        may_refuse=True,
        versus="sdpa-cudnn",
    )


def sweep_configs(d, dtype, smoke, best):
    from torch.nn.attention import SDPBackend

    b, h, hkv, t = (SMOKE_SHAPES if smoke else SHAPES)[d]
    dkdv_list, dq_list, one_pass = configs_of(d, smoke)
    table_two, table_one = table_launches(d, smoke)
    for causal in (False, True):
        problem = Problem(dtype, causal, (b, h, hkv, t, d))
        # the interpreter has no cuDNN or flash backend: its math backend stands in (numbers mean nothing)
        backends = (
            {"math": SDPBackend.MATH}
            if smoke
            else {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
        )
        do, q, k, v = problem.tensors[:4]
        rates = {
            name: tflops(problem.flops, sdpa_backward_ms(q, k, v, do, causal, backend))
            for name, backend in backends.items()
        }
        mask = "causal" if causal else "full"
        print(
            f"B{b} H{h} T{t} D{d} {mask} backward: "
            + ", ".join(f"sdpa-{name} {rate:.0f}" for name, rate in rates.items())
            + " TFLOP/s",
            flush=True,
        )
        cudnn = next(iter(rates.values()))
        two = {}
        for c in dkdv_list:
            two[(c, table_two[1])] = run_config(
                problem,
                f"two-pass dkdv {c} dq {table_two[1]}",
                (c, table_two[1]),
                None,
                cudnn,
                (c, table_two[1]) == table_two,
            )
        ok = {c: r for c, r in two.items() if r}
        best_dkdv = max(ok, key=ok.get)[0] if ok else table_two[0]
        for c in dq_list:
            if (best_dkdv, c) not in two:
                two[(best_dkdv, c)] = run_config(
                    problem,
                    f"two-pass dkdv {best_dkdv} dq {c}",
                    (best_dkdv, c),
                    None,
                    cudnn,
                    (best_dkdv, c) == table_two,
                )
        one = {}
        for c in one_pass:
            for add in adds(smoke):
                one[(c, add)] = run_config(problem, f"one-pass {c} {add}", (c, None), add, cudnn, c == table_one)
        for name, found in (("two-pass", two), ("one-pass", one)):
            ok = {c: r for c, r in found.items() if r}
            if ok:
                top = max(ok, key=ok.get)
                best.setdefault(f"D{d} {mask}", []).append(f"{name} {top} {ok[top]:.0f} ({ok[top] / cudnn:.2f}x)")


def compare_schedules(problem, label, d, smoke):
    """The table's two-pass pair against its one-pass config by each add, each in both dk/dv loop
    orders, ROUNDS interleaved rounds."""
    times = {name: [] for name, *_ in schedule_launches(d, smoke)}
    for _ in range(ROUNDS):
        for name, config, add, first in schedule_launches(d, smoke):
            problem.launch(config, add, dp_first=first)
            times[name].append(time_ms(lambda: problem.launch(config, add, dp_first=first)))
    print(
        f"  {label}: "
        + "; ".join(f"{name} {tflops(problem.flops, statistics.median(ts)):.0f}" for name, ts in times.items()),
        flush=True,
    )


def main():
    args = parse_sweep_args(__doc__, "attention_backward_sweep", DTYPES)
    dims = [int(x) for x in os.environ.get("SWEEP_DIMS", "").split(",") if x] or list(SHAPES)
    if args.smoke:
        dims = list(SMOKE_SHAPES)
    jobs = int(os.environ.get("SWEEP_JOBS", max(1, (os.cpu_count() or 2) - 1)))
    print(f"{describe()}, {args.dtype}, head dims {dims}, compiling in {jobs} processes", flush=True)
    precompile(warm, warm_tasks(dims, args.dtype, args.smoke), jobs)
    dtype = DTYPES[args.dtype]
    best = {}
    for d in dims:
        sweep_configs(d, dtype, args.smoke, best)
    print("best of each schedule (TFLOP/s, x sdpa-cudnn):", flush=True)
    for key, lines in best.items():
        print(f"  {key}: " + "; ".join(lines), flush=True)
    print(f"schedules, TFLOP/s (medians of {ROUNDS} interleaved rounds):", flush=True)
    for d in dims:
        b, h, hkv, t = (SMOKE_SHAPES if args.smoke else SHAPES)[d]
        extra = [] if args.smoke else [s for s in SCHEDULE_SHAPES if s[4] == d]
        for b, h, hkv, t, _ in [(b, h, hkv, t, d)] + extra:
            for causal in (False, True):
                compare_schedules(
                    Problem(dtype, causal, (b, h, hkv, t, d)),
                    f"B{b} H{h}/{hkv} T{t} D{d} {'causal' if causal else 'full'}",
                    d,
                    args.smoke,
                )
    if not args.smoke and VARLEN[5] in dims:
        from llmk.benchmarks.attention_bench import varlen_lengths

        n, low, high, total, h, d = VARLEN
        compare_schedules(
            Problem(dtype, True, lengths=varlen_lengths(n, low, high, total), heads=h, dim=d),
            f"packed {n} sequences {low}..{high}, {total} tokens, H{h} D{d} causal",
            d,
            args.smoke,
        )


if __name__ == "__main__":
    main()
