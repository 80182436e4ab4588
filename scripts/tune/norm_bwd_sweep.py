"""GPU sweep for the norms' backward (normalization/launch_config.py: BACKWARD_FUSED_TABLE,
BACKWARD_LOOP_TABLE, backward programs an SM, sum_config): times each backward config of RMSNorm,
residual RMSNorm (HAS_DU) and LayerNorm at the training bench shapes, the dweight reduce alone, and
the forward, to set the tables from measurement.

    python scripts/tune/norm_bwd_sweep.py                  (GPU, bf16, about a minute with compiles)
    python scripts/tune/norm_bwd_sweep.py --wide           (the looped widths alone)
    python scripts/tune/norm_bwd_sweep.py --kernel rmsnorm (one kernel)
    python scripts/tune/norm_bwd_sweep.py --smoke          (interpreter, tiny shapes: proves the script runs)

Bytes a backward call (e = element size): read x and dy, write dx (3*M*N*e); residual RMSNorm also
reads du (4*M*N*e); the weight and the fp32 partials are L2-sized and not counted. Forward: 2*M*N*e.
Times are GPU time (common.timing.graph_time_ms: a CUDA graph of L2-flushed calls, the host out),
allocations of the partial buffer included. Each config is first checked against the backward in
fp32 PyTorch (dx and dweight within 2% of the reference's largest value; BAD lines are not timed).
A config: "fused BLOCK_M rows" or "looped BLOCK_M x chunk", then warps, programs an SM, prefetch (P) or not
(-; the looped LayerNorm kernel has none); '*' marks the tables' pick. --wide: the looped
kernel's widths alone.
"""

import torch

from llmk.common.device import DEVICE, INTERPRET, sm_count
from llmk.common.ints import next_power_of_2
from llmk.common.reduce import INTERPRETER_SMS, sum_config, sum_partials
from llmk.common.timing import graph_time_ms
from llmk.devtools.bench import gbps
from llmk.normalization.launch_config import RowConfig, backward_config, row_config
from llmk.normalization.triton_layernorm import launch_layernorm
from llmk.normalization.triton_norm_backward import launch_layernorm_backward, launch_rmsnorm_backward
from llmk.normalization.triton_rmsnorm import launch_rmsnorm

from sweep_common import MAX_REL_ERR, measure_copy, parse_sweep_args

KERNELS = ("rmsnorm", "layernorm", "residual_rmsnorm")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SHAPES = ((16384, 1024), (16384, 4096), (16384, 8192), (4096, 32768))
SMOKE_SHAPES = ((40, 64), (9, 3000))
EPS = 1e-6
# (looped, BLOCK_M or 1, chunk or None for the padded row, warps, programs an SM, prefetch), by N
BWD_CANDIDATES = {
    1024: [
        (False, 8, None, 16, 1, True),
        (False, 4, None, 8, 1, True),
        (False, 4, None, 8, 2, True),
        (False, 4, None, 8, 2, False),
        (False, 4, None, 4, 2, True),
        (False, 4, None, 4, 4, True),
        (False, 4, None, 4, 4, False),
        (False, 2, None, 4, 4, True),
        (False, 2, None, 4, 8, False),
        (False, 8, None, 8, 2, True),
        (False, 8, None, 8, 2, False),
        (False, 1, None, 4, 8, False),
    ],
    4096: [
        (False, 2, None, 16, 1, True),
        (False, 2, None, 16, 1, False),
        (False, 1, None, 16, 1, True),
        (False, 1, None, 8, 2, True),
        (False, 1, None, 8, 2, False),
        (False, 1, None, 4, 4, False),
        (True, 1, None, 8, 1, True),
        (True, 1, None, 8, 2, True),
        (True, 1, 2048, 4, 4, True),
    ],
    8192: [
        (True, 1, None, 32, 1, True),
        (True, 1, None, 16, 1, True),
        (True, 1, None, 16, 2, True),
        (True, 1, 4096, 16, 1, True),
        (True, 1, 4096, 16, 2, True),
        (False, 1, None, 32, 1, True),
        (False, 1, None, 32, 1, False),
        (False, 1, None, 16, 2, False),
        (False, 1, None, 16, 1, True),
    ],
    32768: [
        (True, 2, 4096, 32, 1, True),
        (True, 2, 4096, 32, 1, False),
        (True, 1, 8192, 32, 1, True),
        (True, 1, 8192, 32, 1, False),
        (True, 4, 2048, 32, 1, True),
        (True, 2, 8192, 32, 1, True),
        (True, 1, 16384, 32, 1, False),
        (True, 1, 16384, 32, 1, True),
    ],
}
BWD_CANDIDATES[131072] = BWD_CANDIDATES[32768]
WIDE_SHAPES = ((4096, 32768), (4096, 131072))
WIDE_N = {n for _, n in WIDE_SHAPES}
# layernorm and residual: the best-looking few of each width (fewer compiles); LayerNorm's looped
# kernel takes one row a step and has no prefetch: of the wide ones, those alone
SHORT = {
    1024: [0, 2, 3, 5, 6, 8, 9],
    4096: [0, 1, 3, 4, 6, 7],
    8192: [0, 1, 2, 4, 5, 7],
    32768: [0, 1, 2, 3, 4, 6],
    131072: [0, 1, 2, 3, 4, 6],
}
SMOKE_CANDIDATES = [
    (False, 2, None, 4, 1, True),
    (False, 1, None, 4, 2, False),
    (True, 1, None, 4, 1, True),
    (True, 1, 1024, 4, 2, True),
    (True, 1, 1024, 4, 1, False),
]


def make_cfg(spec, n_rows, n_cols, sms):
    looped, block_m, chunk, warps, per_sm, prefetch = spec
    block_n = chunk or next_power_of_2(n_cols)
    if not looped and block_n < n_cols:
        return None
    grid = min(per_sm * sms, -(-n_rows // block_m))
    return RowConfig(looped, block_m, block_n, warps, grid, prefetch)


def describe(cfg, sms):
    per_sm = -(-cfg.grid // sms)
    if cfg.looped:
        return f"looped {cfg.BLOCK_M} x {cfg.BLOCK_N:5d} {cfg.num_warps:2d}w x{per_sm} {'P' if cfg.prefetch else '-'}"
    return f"fused {cfg.BLOCK_M:3d} rows {cfg.num_warps:2d}w x{per_sm} {'P' if cfg.prefetch else '-'}"


def reference(kernel, x, dy, w, du):
    """(dx, dweight[, dbias]) of the backward in fp32 PyTorch."""
    xf, dyf, wf = x.float(), dy.float(), w.float()
    g = dyf * wf
    if kernel == "layernorm":
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt(((xf - mean) ** 2).mean(-1, keepdim=True) + EPS)
        xh = (xf - mean) * rstd
        dx = rstd * (g - xh * (g * xh).mean(-1, keepdim=True) - g.mean(-1, keepdim=True))
        return dx, (dyf * xh).sum(0), dyf.sum(0)
    rstd = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + EPS)
    xh = xf * rstd
    dx = rstd * (g - xh * (g * xh).mean(-1, keepdim=True))
    if du is not None:
        dx = dx + du.float()
    return dx, (dyf * xh).sum(0)


def bad(outs, refs):
    return any((o.float() - r).abs().max().item() > MAX_REL_ERR * r.abs().max().item() for o, r in zip(outs, refs))


def sweep_kernel(kernel, shapes, dtype, copy_GBps, smoke):
    sms = sm_count(DEVICE, 3)
    e = dtype.itemsize
    for n_rows, n_cols in shapes:
        x = torch.randn(n_rows, n_cols, device=DEVICE, dtype=dtype)
        dy = torch.randn_like(x)
        w, b = torch.randn(n_cols, device=DEVICE, dtype=dtype), torch.randn(n_cols, device=DEVICE, dtype=dtype)
        du = torch.randn_like(x) if kernel == "residual_rmsnorm" else None
        refs = reference(kernel, x, dy, w, du)
        dx = torch.empty_like(x)
        grads = [torch.empty(n_cols, device=DEVICE, dtype=dtype) for _ in refs[1:]]
        y = torch.empty_like(x)
        if kernel == "layernorm":
            fwd = lambda: launch_layernorm(x, w, b, EPS, y)  # noqa: E731
        else:
            fwd = lambda: launch_rmsnorm(x, None, w, EPS, y, None)  # noqa: E731
        ms = graph_time_ms(fwd, reps=10, warmup_ms=10, rep_ms=40)
        print(
            f"{kernel} {n_rows}x{n_cols}: forward {ms:.4f} ms {gbps(2 * x.numel() * e, ms) / copy_GBps:5.1%}"
            f" ({row_config(n_rows, n_cols, e, kernel == 'layernorm')})",
            flush=True,
        )
        n_bytes = (4 if du is not None else 3) * x.numel() * e
        picked = backward_config(n_rows, n_cols, e, x.device, kernel)
        specs = SMOKE_CANDIDATES if smoke else BWD_CANDIDATES[n_cols]
        if kernel != "rmsnorm" and not smoke:
            specs = [specs[i] for i in SHORT[n_cols]]
        if kernel == "layernorm" and not smoke and n_cols in WIDE_N:
            specs = [spec for spec in BWD_CANDIDATES[n_cols] if spec[0] and spec[1] == 1 and spec[5]]
        cfgs = [c for c in (make_cfg(s, n_rows, n_cols, sms) for s in specs) if c is not None]
        for cfg in dict.fromkeys([picked] + cfgs):
            if kernel == "layernorm":
                call = lambda cfg=cfg: launch_layernorm_backward(  # noqa: E731
                    dy, x, w, EPS, dx, grads[0], grads[1], cfg
                )
            else:
                call = lambda cfg=cfg: launch_rmsnorm_backward(dy, x, w, du, EPS, dx, grads[0], cfg)  # noqa: E731
            name = describe(cfg, sms)
            try:
                call()
                torch.cuda.synchronize() if not INTERPRET else None
            except Exception as exc:  # out of registers or shared memory
                print(f"  {name}  REFUSED {type(exc).__name__}", flush=True)
                continue
            if bad([dx, *grads], refs):
                print(f"  {name}  BAD", flush=True)
                continue
            ms = graph_time_ms(call, reps=10, warmup_ms=10, rep_ms=40)
            mark = "*" if cfg == picked else " "
            print(f"{mark} {name}  {ms:.4f} ms {gbps(n_bytes, ms) / copy_GBps:6.1%}", flush=True)


def sweep_reduce(copy_GBps, smoke):
    """The dweight reduce alone: (P, N) fp32 -> (N,) bf16, sum_config's pick against others."""
    shapes = (
        ((3, 64), (6, 1000))
        if smoke
        else ((132, 1024), (264, 1024), (528, 1024), (132, 8192), (264, 8192), (132, 32768), (264, 32768))
    )
    for p, n in shapes:
        partial = torch.randn(p, n, device=DEVICE)
        out = torch.empty(n, device=DEVICE, dtype=torch.bfloat16)
        ref = partial.sum(0)
        line = []
        others = [(8, 256, 4), (32, 64, 4), (64, 32, 4), (128, 32, 8), (16, 128, 4)]
        for blocks in dict.fromkeys([sum_config(p, n, sm_count(DEVICE, INTERPRETER_SMS)), *others]):
            sum_partials(partial, out, blocks)
            if (out.float() - ref).abs().max().item() > 0.02 * ref.abs().max().item():
                line.append(f"{blocks} BAD")
                continue
            ms = graph_time_ms(
                lambda blocks=blocks: sum_partials(partial, out, blocks), reps=10, warmup_ms=10, rep_ms=30
            )
            line.append(f"{blocks} {ms * 1e3:.1f}us")
        print(f"reduce {p}x{n}: " + ", ".join(line), flush=True)


def main():
    args = parse_sweep_args(
        __doc__,
        "norm_bwd_sweep",
        DTYPES,
        kernels=KERNELS,
        flags={"--wide": "only the looped kernel's widths (4096 x 32768 and x 131072)"},
    )
    dtype = DTYPES[args.dtype]
    copy_GBps = measure_copy(args)
    if not args.wide:
        sweep_reduce(copy_GBps, args.smoke)
    shapes = SMOKE_SHAPES if args.smoke else WIDE_SHAPES if args.wide else SHAPES
    for kernel in args.kernel or KERNELS:
        sweep_kernel(kernel, shapes, dtype, copy_GBps, args.smoke)


if __name__ == "__main__":
    main()
