"""AdamW step: TritonAdamW against torch.optim.AdamW with foreach=True and with fused=True, as GB/s
and as a share of the copy bandwidth of the same run.

Bytes moved per param: read w, g, m, v and write w, m, v:
    fp32 params                          28
    bf16 params with fp32 m, v (triton)  22   (w and g 2 bytes each; torch.optim.AdamW keeps bf16
                                               m and v for bf16 params, so it has no such row: its
                                               foreach step is run once, untimed, as the max_err
                                               gate's baseline)

Rows: one tensor of 1M..200M params (1M, 4M, 10M: the sizes where a step's host work can outlast
its GPU work), and the parameter list of a Llama-style model of about 1.1B params (TinyLlama's
shapes: vocab 32000, hidden 2048, intermediate 5632, 22 layers, 4 KV heads of 64, untied
embeddings: 201 tensors), built from shapes. One optimizer.step() is timed, its grads set once (the
step changes the params, which does not change its cost). host_us: the CPU time of one step
(devtools.bench.host_time_us, steps queued without a sync), which do_bench's figure shows instead of
the GPU's wherever it is the larger. max_err: the first step from the same start against
optimizers/reference_adam.py in fp32.
    python benchmarks/optimizer_bench.py            (GPU; writes benchmarks/results/optimizer.json and PNGs)
    python benchmarks/optimizer_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/optimizer_bench.py --only llama --dtype fp32   (a subset)
"""

import torch

from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.bench import host_time_us
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.results import plot_sweeps, shape_str
from llmk.optimizers.reference_adam import adamw_step_ref
from llmk.optimizers.triton_adam import TritonAdamW

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
    layer = [
        (hidden, hidden),
        (kv, hidden),
        (kv, hidden),
        (hidden, hidden),
        (intermediate, hidden),
        (intermediate, hidden),
        (hidden, intermediate),
        (hidden,),
        (hidden,),
    ]
    return [(vocab, hidden)] + layer * layers + [(hidden,), (vocab, hidden)]


def model_row_name(shapes):
    total = sum(torch.Size(s).numel() for s in shapes)
    size = f"{total / 1e9:.1f}B" if total >= 1e9 else f"{total / 1e6:.1f}M" if total >= 1e6 else f"{total / 1e3:.1f}K"
    return f"llama-{size}({len(shapes)} tensors)"


FULL = dict(sizes=[1_000_000, 4_000_000, 10_000_000, 16_000_000, 64_000_000, 200_000_000], model=llama_shapes())
SMOKE = dict(
    sizes=[1000, 100_000], model=llama_shapes(vocab=64, hidden=32, intermediate=64, layers=1, heads=4, kv_heads=2)[:10]
)


def sweeps(config):
    model = model_row_name(config["model"])
    return [
        ("params (one tensor)", [(n, (n,)) for n in config["sizes"]]),
        ("model parameter list (total params)", [(sum(torch.Size(s).numel() for s in config["model"]), (model,))]),
    ]


def setup(shapes, dtype):
    """(start params, grads) and one AdamW step of every tensor in fp32, from optimizers/reference_adam.py."""
    start = [torch.randn(s, device=DEVICE).to(dtype) for s in shapes]
    grads = [torch.randn(s, device=DEVICE).to(dtype) for s in shapes]
    expected = []
    for w, g in zip(start, grads):
        w = w.clone()
        m, v = torch.zeros_like(w, dtype=torch.float32), torch.zeros_like(w, dtype=torch.float32)
        adamw_step_ref(w, g, m, v, 1, **HYPER)
        expected.append(w)
    return (start, grads), expected


def step(opt, params):
    opt.step()
    return params


def bind(provider, inputs):
    """A fresh optimizer on a copy of the start params; the call steps it and returns the params."""
    start, grads = inputs
    params = [w.clone().requires_grad_() for w in start]
    for p, g in zip(params, grads):
        p.grad = g
    opt = PROVIDERS[provider](params)
    return lambda: step(opt, params)


def host_us(provider, inputs, call):
    """CPU time of one step; fewer steps for more params, so the queued GPU work stays short (one
    in the interpreter, where the figure means nothing)."""
    n = sum(w.numel() for w in inputs[0])
    calls = 1 if INTERPRET else max(5, min(200, int(2e9 / n)))
    return {"host_us": round(host_time_us(call, calls=calls, rounds=1 if INTERPRET else 3), 1)}


def cases(config):
    for dtype in (torch.float32, torch.bfloat16):
        rows = [((n,), [(n,)]) for n in config["sizes"]] + [(model_row_name(config["model"]), config["model"])]
        providers = PROVIDERS if dtype == torch.float32 else {p: PROVIDERS[p] for p in ("triton", "torch-foreach")}
        for name, shapes in rows:
            yield BenchCase(
                "adamw",
                shape_str(name),
                dtype,
                providers,
                lambda shapes=shapes, dtype=dtype: setup(shapes, dtype),
                n_bytes=BYTES_PER_PARAM[dtype] * sum(torch.Size(s).numel() for s in shapes),
                bind=bind,
                extra=host_us,
                untimed=() if dtype == torch.float32 else ("torch-foreach",),
                skip_on=(RuntimeError, ValueError),
            )  # fused=True where torch has no fused kernel


def charts(args, config):
    def draw(meta, rows):
        for dtype in ("fp32", "bf16"):
            sel = [r for r in rows if r["dtype"] == dtype]
            plot_sweeps(args.out / f"optimizer_adamw_{dtype}.png", f"AdamW step {dtype}", sel, sweeps(config), meta)

    return draw


def main():
    args = parse_args(__doc__)
    config = SMOKE if args.smoke else FULL
    run(args, "optimizer", charts(args, config), cases=lambda: cases(config))


if __name__ == "__main__":
    main()
