"""AdamW step: TritonAdamW against torch.optim.AdamW with foreach=True and with fused=True, as GB/s
and as a share of the copy bandwidth of the same run.

Bytes moved per param: read w, g, m, v and write w, m, v:
    fp32 params                          28
    bf16 params with fp32 m, v (triton)  22   (w and g 2 bytes each; torch.optim.AdamW keeps bf16
                                               m and v for bf16 params, so it has no such row)

Rows: one fp32 tensor of 1M..200M params, and the parameter list of a Llama-style model of about
1.1B params (TinyLlama's shapes: vocab 32000, hidden 2048, intermediate 5632, 22 layers, 4 KV heads
of 64, untied embeddings: 201 tensors), built from shapes. One optimizer.step() is timed, its
grads set once (the step changes the params, which does not change its cost). max_err: the first
step from the same start against optimizers/adam.py in fp32.
    python benchmarks/optimizer_bench.py            (GPU; writes benchmarks/results/optimizer.json and PNGs)
    python benchmarks/optimizer_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402

from common.bench import time_ms  # noqa: E402
from common.device import DEVICE  # noqa: E402
from common.results import load_or_measure, make_row, parse_args, plot_sweeps, shape_str, start_run  # noqa: E402
from common.testing import dtype_name  # noqa: E402
from optimizers.adam import adamw_step_ref  # noqa: E402
from optimizers.triton_adam import TritonAdamW  # noqa: E402

BYTES_PER_PARAM = {torch.float32: 28, torch.bfloat16: 22}
PROVIDERS = {
    "triton": lambda params: TritonAdamW(params),
    "torch-foreach": lambda params: torch.optim.AdamW(params, foreach=True),
    "torch-fused": lambda params: torch.optim.AdamW(params, fused=True),
}
HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2)  # torch.optim.AdamW's defaults


def llama_shapes(vocab=32000, hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4):
    """The parameter shapes of a Llama decoder: embeddings, per layer q k v o, gate up down and two
    RMSNorm weights, the final norm and an untied LM head."""
    kv = hidden // heads * kv_heads
    layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden),
             (intermediate, hidden), (intermediate, hidden), (hidden, intermediate), (hidden,), (hidden,)]
    return [(vocab, hidden)] + layer * layers + [(hidden,), (vocab, hidden)]


def model_row_name(shapes):
    total = sum(torch.Size(s).numel() for s in shapes)
    size = f"{total / 1e9:.1f}B" if total >= 1e9 else f"{total / 1e6:.1f}M" if total >= 1e6 else f"{total / 1e3:.1f}K"
    return f"llama-{size}({len(shapes)} tensors)"


FULL = dict(sizes=[1_000_000, 4_000_000, 16_000_000, 64_000_000, 200_000_000], model=llama_shapes())
SMOKE = dict(sizes=[1000, 100_000], model=llama_shapes(vocab=64, hidden=32, intermediate=64, layers=1,
                                                        heads=4, kv_heads=2)[:10])


def sweeps(config):
    model = model_row_name(config["model"])
    return [("params (one tensor)", [(n, (n,)) for n in config["sizes"]]),
            ("model parameter list (total params)", [(sum(torch.Size(s).numel() for s in config["model"]), (model,))])]


def reference(start, grads):
    """One AdamW step of every tensor in fp32, from optimizers/adam.py."""
    out = []
    for w, g in zip(start, grads):
        w = w.clone()
        m, v = torch.zeros_like(w, dtype=torch.float32), torch.zeros_like(w, dtype=torch.float32)
        adamw_step_ref(w, g, m, v, 1, lr=HYPER["lr"], beta1=HYPER["beta1"], beta2=HYPER["beta2"],
                       eps=HYPER["eps"], weight_decay=HYPER["weight_decay"])
        out.append(w)
    return out


def measure_row(rows, copy_GBps, name, shapes, dtype):
    """Time one step of every provider on fresh params of `shapes` (a list: one step covers all)."""
    start = [torch.randn(s, device=DEVICE).to(dtype) for s in shapes]
    grads = [torch.randn(s, device=DEVICE).to(dtype) for s in shapes]
    expected = reference(start, grads)
    n_params = sum(w.numel() for w in start)
    providers = PROVIDERS if dtype == torch.float32 else {"triton": PROVIDERS["triton"]}
    for provider, make in providers.items():
        params = [w.clone().requires_grad_() for w in start]
        for p, g in zip(params, grads):
            p.grad = g
        try:
            opt = make(params)
            opt.step()  # also the warm-up (compilation)
        except (RuntimeError, ValueError) as e:  # fused=True where torch has no fused kernel
            print(f"adamw {name:>24s} {dtype_name(dtype)} {provider:13s} skipped: {str(e)[:80]}", flush=True)
            continue
        err = max((p.detach().float() - w.float()).abs().max().item() for p, w in zip(params, expected))
        ms = time_ms(opt.step)
        row = make_row("adamw", name, dtype_name(dtype), provider, ms, copy_GBps,
                       n_bytes=BYTES_PER_PARAM[dtype] * n_params, max_err=err)
        rows.append(row)
        print(f"adamw {name:>24s} {row['dtype']} {provider:13s} {ms:9.4f} ms {row['GBps']:8.1f} GB/s "
              f"{row['pct_copy']:5.1f}% of copy  err {err:.2g}", flush=True)
        del opt, params
        if DEVICE == "cuda":
            torch.cuda.empty_cache()  # the 1.1B list needs the memory the last provider held


def measure(config, smoke):
    """Time every row and provider; returns (meta, rows)."""
    meta = start_run(smoke)
    copy_GBps = meta["copy_GBps"]
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for n in config["sizes"]:
            measure_row(rows, copy_GBps, shape_str((n,)), [(n,)], dtype)
        measure_row(rows, copy_GBps, model_row_name(config["model"]), config["model"], dtype)
    return meta, rows


def main():
    args = parse_args(__doc__.splitlines()[0])
    config = SMOKE if args.smoke else FULL
    meta, rows = load_or_measure(args, "optimizer", lambda: measure(config, args.smoke))
    for dtype in ("fp32", "bf16"):
        sel = [r for r in rows if r["dtype"] == dtype]
        plot_sweeps(args.out / f"optimizer_adamw_{dtype}.png", f"AdamW step {dtype}", sel, sweeps(config), meta)


if __name__ == "__main__":
    main()
