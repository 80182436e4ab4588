"""GPU sweep for moe/triton_moe_gemm.py's MOE_CONFIGS and WEIGHT_GRAD_CONFIGS: times each launch of
moe_experts' forward and backward (moe/moe_experts_ops.py) at candidate tiles, beside torch._grouped_mm
on the same product, to set the tables from measurement.

    python scripts/tune/moe_sweep.py                          (GPU, bf16, Qwen3-30B-A3B T 16384 and Mixtral T 4096)
    python scripts/tune/moe_sweep.py --shape qwen3-t16        (one shape: a key of SHAPES)
    python scripts/tune/moe_sweep.py --smoke                  (interpreter, tiny shapes: proves the script runs)

The launches, as moe_experts runs them (S = T x top-k rows sorted by expert):
  gate_up   x[token] @ w_gate_up[e]^T with SwiGLU in the epilogue     (S, H) -> (S, I), 2 S (2I) H FLOPs
            (training's form, gate | up stored too)
  down      h @ w_down[e]^T, weight and scatter in the epilogue        (S, I) -> (S, H), 2 S H I
  dh        dout[token] @ w_down[e], stored as it is                   (S, H) -> (S, I), 2 S I H
            (its loads kept as weight * dout's rows in expert order, d w_down's operand; the
            SwiGLU backward pass after it, and the GEMM without that copy, timed on the lines after)
  dx        d gate | d up @ w_gate_up[e], scattered                    (S, 2I) -> (S, H), 2 S H (2I)
  gate_up_tma, down_tma, dx_tma: the same three launches in moe/triton_moe_rows_tma.py's persistent
            kernel, which MOE_CONFIGS' glu_tma and scatter_tma rows give the long runs
  dw_up     per expert (d gate | d up)^T @ x[tokens]                   (E, 2I, H), 2 S (2I) H
  dw_down   per expert (weight * dout[tokens])^T @ h                   (E, H, I), 2 S H I
            (d w_gate_up over x's rows copied into expert order first: that gather is timed on the
            line after, and not in the TFLOP/s)
A rows config is (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), given to the launch as is (for
gate_up and dh BLOCK_N counts the GLU's half width, as MOE_CONFIGS does); a weight config
is (BLOCK_P, BLOCK_Q, BLOCK_R, num_warps, num_stages). Each candidate's output is checked against
the shipped config's (the same sums in another order: a wrong tile is off by the values' size;
BAD, not timed), then timed with common.timing.time_ms; '*' marks the shipped config. The
grouped_mm line times torch._grouped_mm on the same product over operands already in expert order
(the gathers and epilogues it leaves to other kernels are not in it): the GEMM alone. Read off, per
launch and row class, the candidate best or within 2% at the most shapes.
"""

import argparse
import functools
import sys

import torch

from llmk.common.device import DEVICE, INTERPRET, describe
from llmk.common.timing import time_ms
from llmk.devtools.bench import tflops
from llmk.moe.triton_moe_gemm import (
    WEIGHT_GRAD_CONFIGS,
    launch_expert_rows,
    launch_expert_weight_grad,
    launch_gather_rows,
    launch_glu_backward_rows,
    rows_config,
)
from llmk.moe.triton_moe_routing import moe_route, permute
from llmk.moe.triton_moe_rows_tma import launch_expert_rows_tma

# name -> (T, H, I, E, top_k)
SHAPES = {
    "qwen3-t16384": (16384, 2048, 768, 128, 8),
    "qwen3-t4096": (4096, 2048, 768, 128, 8),
    "qwen3-t64": (64, 2048, 768, 128, 8),
    "qwen3-t16": (16, 2048, 768, 128, 8),
    "mixtral-t4096": (4096, 4096, 14336, 8, 2),
}
DEFAULT_SHAPES = ("qwen3-t16384", "mixtral-t4096")
SMOKE_SHAPES = {"tiny": (37, 64, 48, 8, 2)}
# rows candidates for long runs (prefill, training) and short ones (decode); the shipped config is
# always added
LONG_ROWS = [
    (128, 64, 64, 8, 3),
    (128, 64, 64, 8, 4),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
    (128, 64, 128, 8, 3),
    (128, 128, 128, 8, 2),
    (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
    (128, 128, 64, 4, 3),
]
SHORT_ROWS = [
    (16, 64, 128, 4, 4),
    (16, 128, 128, 4, 4),
    (16, 64, 256, 4, 3),
    (16, 32, 128, 4, 4),
    (32, 64, 128, 4, 4),
    (16, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
]
WEIGHT = [
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 32, 8, 4),
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 128, 128, 8, 2),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
]
# the SwiGLU backward's pass over dh: (BLOCK_R, BLOCK_N, num_warps)
GLU_PASS = [(8, 256, 4), (32, 256, 4), (16, 512, 4), (32, 256, 8), (64, 128, 4), (4, 1024, 4)]
SMOKE_ROWS = [(16, 16, 16, 1, 1), (16, 32, 16, 1, 1)]
SMOKE_WEIGHT = [(16, 16, 16, 1, 1), (32, 16, 16, 1, 1)]
# weight gradient -> the token-order operand its gather copies
GATHERS = {"dw_up": "x"}
MAX_REL_ERR = 0.02  # max |err| over max |ref|, each output: a right tile's rounding stays far under it


def problem(t, h, inter, e, k, dtype):
    """The layer's tensors and routing, and what the forward leaves for the backward."""
    x = torch.randn(t, h, device=DEVICE, dtype=dtype)
    w_gate_up = torch.randn(e, 2 * inter, h, device=DEVICE, dtype=dtype) * h**-0.5
    w_down = torch.randn(e, h, inter, device=DEVICE, dtype=dtype) * inter**-0.5
    weights, ids = moe_route(torch.randn(t, e, device=DEVICE), k)
    order, counts, offsets = permute(ids, e)
    s = t * k
    scale = weights.reshape(-1).float().contiguous()
    pre = torch.empty(s, 2 * inter, device=DEVICE, dtype=dtype)
    h_act = torch.empty(s, inter, device=DEVICE, dtype=dtype)
    launch_expert_rows(x, w_gate_up, h_act, order, offsets, gather=True, epilogue="glu", top_k=k, pre=pre)
    dout = torch.randn(t, h, device=DEVICE, dtype=dtype)
    return dict(
        x=x,
        w_gate_up=w_gate_up,
        w_down=w_down,
        order=order,
        counts=counts,
        offsets=offsets,
        scale=scale,
        pre=pre,
        h=h_act,
        dout=dout,
        dpre=torch.randn(s, 2 * inter, device=DEVICE, dtype=dtype),
        top_k=k,
        x_rows=launch_gather_rows(x, order, k),
        dout_rows=launch_gather_rows(dout, order, k, scale=scale),
    )


def launches(p):
    """name -> (kind, flops, run(config) -> output): each launch of moe_experts as it runs it."""
    x, wgu, wd, order, offsets, k = p["x"], p["w_gate_up"], p["w_down"], p["order"], p["offsets"], p["top_k"]
    s, h, inter = order.shape[0], x.shape[1], wd.shape[2]

    def rows(cfg, tma, a, b, c, **kw):  # a glu or scatter launch by the row kernel, or the persistent TMA one
        if tma:
            launch_expert_rows_tma(a, b, c, order, offsets, cfg, **kw)
        else:
            launch_expert_rows(a, b, c, order, offsets, gather=kw["epilogue"] == "glu", config=cfg, **kw)

    def gate_up(cfg, tma=False):  # training's form: gate | up stored for the backward too
        out, pre = torch.empty(s, inter, device=DEVICE, dtype=x.dtype), torch.empty_like(p["pre"])
        rows(cfg, tma, x, wgu, out, epilogue="glu", top_k=k, pre=pre)
        return out, pre

    def down(cfg, tma=False):
        out = torch.empty(s, h, device=DEVICE, dtype=x.dtype)
        rows(cfg, tma, p["h"], wd, out, epilogue="scatter", scale=p["scale"])
        return out

    def dh(cfg, copy=True):  # as the backward runs it: with the weight gradients' copy of its rows
        out = torch.empty(s, inter, device=DEVICE, dtype=x.dtype)
        kept = torch.empty(s, h, device=DEVICE, dtype=x.dtype) if copy else None
        launch_expert_rows(
            p["dout"],
            wd.transpose(1, 2),
            out,
            order,
            offsets,
            gather=True,
            epilogue="store",
            top_k=k,
            scale=p["scale"],
            a_copy=kept,
            config=cfg,
        )
        return (out, kept) if copy else out

    def dx(cfg, tma=False):
        out = torch.empty(s, h, device=DEVICE, dtype=x.dtype)
        rows(cfg, tma, p["dpre"], wgu.transpose(1, 2), out, epilogue="scatter")
        return out

    def dw_up(cfg):  # over x's rows already in expert order (the gather is its own launch)
        out = torch.empty_like(wgu)
        launch_expert_weight_grad(p["dpre"], p["x_rows"], out, offsets, kind="gate_up", config=cfg)
        return out

    def dw_down(cfg):
        out = torch.empty_like(wd)
        launch_expert_weight_grad(p["dout_rows"], p["h"], out, offsets, kind="down", config=cfg)
        return out

    gemm = 2 * s * h * inter
    on_tma = functools.partial  # the same launch, in the persistent TMA kernel
    return {
        "gate_up": ("glu", 2 * gemm, gate_up),
        "gate_up_tma": ("glu_tma", 2 * gemm, on_tma(gate_up, tma=True)),
        "down": ("scatter", gemm, down),
        "down_tma": ("scatter_tma", gemm, on_tma(down, tma=True)),
        "dh": ("store", gemm, dh),
        "dx": ("scatter", 2 * gemm, dx),
        "dx_tma": ("scatter_tma", 2 * gemm, on_tma(dx, tma=True)),
        "dw_up": ("weight", 2 * gemm, dw_up),
        "dw_down": ("weight", gemm, dw_down),
    }


def grouped_mm_calls(p):
    """name -> the same product as torch._grouped_mm over operands in expert order (None where this
    torch has no grouped_mm for them)."""
    if not hasattr(torch, "_grouped_mm") or INTERPRET:
        return {}
    tokens = p["order"] // p["top_k"]
    xs, dout_s = p["x"][tokens], p["dout"][tokens]
    offs = p["counts"].cumsum(0).to(torch.int32)
    wgu, wd = p["w_gate_up"], p["w_down"]
    gm = torch._grouped_mm
    calls = {
        "gate_up": lambda: gm(xs, wgu.transpose(1, 2), offs=offs),
        "down": lambda: gm(p["h"], wd.transpose(1, 2), offs=offs),
        "dh": lambda: gm(dout_s, wd, offs=offs),
        "dx": lambda: gm(p["dpre"], wgu, offs=offs),
        "dw_up": lambda: gm(p["dpre"].t(), xs, offs=offs),
        "dw_down": lambda: gm(dout_s.t(), p["h"], offs=offs),
    }
    return {**calls, **{f"{name}_tma": calls[name] for name in ("gate_up", "down", "dx")}}  # the same products


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=tuple(SHAPES), action="append", help=f"default: {DEFAULT_SHAPES}")
    parser.add_argument(
        "--launch",
        choices=("gate_up", "gate_up_tma", "down", "down_tma", "dh", "dx", "dx_tma", "dw_up", "dw_down"),
        action="append",
        help="default: all nine",
    )
    parser.add_argument("--smoke", action="store_true", help="interpreter, tiny shapes: numbers mean nothing")
    args = parser.parse_args()
    if args.smoke != INTERPRET:
        sys.exit("moe_sweep: --smoke runs in the interpreter (TRITON_INTERPRET=1), a full sweep on a CUDA GPU")
    shapes = SMOKE_SHAPES if args.smoke else {name: SHAPES[name] for name in args.shape or DEFAULT_SHAPES}
    print(describe(), flush=True)
    for name, (t, h, inter, e, k) in shapes.items():
        p = problem(t, h, inter, e, k, torch.float32 if args.smoke else torch.bfloat16)
        baselines = grouped_mm_calls(p)
        print(f"{name}: T {t} H {h} I {inter} E {e} top-{k}, {t * k // e} rows an expert on average", flush=True)
        for launch, (kind, flops, run) in launches(p).items():
            if args.launch and launch not in args.launch:
                continue
            if kind == "weight":
                shipped = WEIGHT_GRAD_CONFIGS["gate_up" if launch == "dw_up" else "down"]
                pool = SMOKE_WEIGHT if args.smoke else WEIGHT
            else:
                base = launch.removesuffix("_tma")
                n, kk = (inter, h) if base in ("gate_up", "dh") else (h, inter if base == "down" else 2 * inter)
                # the TMA forms on short runs, which ship the row kernel: its tile as the reference
                shipped = rows_config(t * k, e, kind, n, kk) or rows_config(t * k, e, kind.removesuffix("_tma"), n, kk)
                pool = SMOKE_ROWS if args.smoke else (SHORT_ROWS if shipped[0] <= 32 else LONG_ROWS)
            if args.smoke:
                shipped = pool[0]
            print(f" {launch} ({flops / 1e9:.1f} GFLOP)", flush=True)
            refs = run(shipped)
            refs = tuple(r.float() for r in (refs if isinstance(refs, tuple) else (refs,)))
            for cfg in dict.fromkeys([shipped] + pool):
                try:
                    out = run(cfg)
                except Exception as exc:  # out of shared memory or registers
                    print(f"  {'*' if cfg == shipped else ' '} {cfg}  REFUSED ({type(exc).__name__})", flush=True)
                    continue
                outs = out if isinstance(out, tuple) else (out,)
                err = max(
                    (o.float() - r).abs().max().item() / max(r.abs().max().item(), 1e-30) for o, r in zip(outs, refs)
                )
                if not err <= MAX_REL_ERR:
                    print(
                        f"  {'*' if cfg == shipped else ' '} {cfg}  BAD (max |err| / max |ref| {err:.3g})", flush=True
                    )
                    continue
                ms = time_ms(lambda: run(cfg))
                print(
                    f"  {'*' if cfg == shipped else ' '} {cfg}  {tflops(flops, ms):6.0f} TFLOP/s  {ms:.4f} ms",
                    flush=True,
                )
            if launch in GATHERS:  # its operand's copy into expert order, a launch of its own
                operand = GATHERS[launch]
                ms = time_ms(lambda: launch_gather_rows(p[operand], p["order"], p["top_k"]))
                print(f"    + gather of {operand}'s rows  {ms:.4f} ms", flush=True)
            if launch == "dh":  # what the copy of its rows costs it, and the SwiGLU backward's pass
                ms = time_ms(lambda: run(shipped, copy=False))
                print(f"    the shipped tile without the copy  {tflops(flops, ms):6.0f} TFLOP/s  {ms:.4f} ms")
                ms = time_ms(lambda: launch_gather_rows(p["dout"], p["order"], p["top_k"], scale=p["scale"]))
                print(f"    (a gather of weight * dout's rows instead  {ms:.4f} ms)")
                dpre, dweights = torch.empty_like(p["pre"]), torch.empty(t, k, device=DEVICE)
                for cfg in [None] + ([] if args.smoke else GLU_PASS):
                    ms = time_ms(
                        lambda: launch_glu_backward_rows(
                            dpre, p["pre"], p["order"], p["scale"], dweights, "silu", config=cfg
                        )
                    )
                    print(f"    + SwiGLU backward pass {cfg or '(shipped)'}  {ms:.4f} ms", flush=True)
            if launch in baselines:
                try:
                    ms = time_ms(baselines[launch])
                    print(f"    grouped_mm  {tflops(flops, ms):6.0f} TFLOP/s  {ms:.4f} ms", flush=True)
                except RuntimeError as exc:
                    print(f"    grouped_mm  refused: {str(exc)[:80]}", flush=True)


if __name__ == "__main__":
    main()
