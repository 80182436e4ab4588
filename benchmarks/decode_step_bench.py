"""Decode step of one decoder layer (models/llama_layer.py): ours against the same layer in PyTorch,
each eager, replayed from one CUDA graph, and under torch.compile(mode="reduce-overhead"), in ms a
step and GB/s of the bytes a step must move.

Layers: Llama-3-8B (hidden 4096, 32/8 heads of 128, MLP 14336) and Qwen2-7B (hidden 3584, 28/4
heads of 128, MLP 18944, q/k/v bias), random bf16 weights. Shapes "BxT": B = 1, 8, 32 sequences,
each of T = 1024 .. 16384 tokens counting the new one (every length T; the cache holds T tokens).
One step: RMSNorm + QKV projection, RoPE at position T - 1, the new k and v written into the cache,
attention over the T tokens, o projection, residual add + RMSNorm, gate/up projection, SwiGLU,
down projection, residual add.
Providers:
    ours-eager             models/llama_layer.py decode_step: rmsnorm_linear, apply_rope,
                           decode_attention, matmul, residual_rmsnorm, swiglu (our operators)
    ours-graph             the same step captured once in a torch.cuda.CUDAGraph (after one eager
                           call: autotuning and compiles stay outside the graph); g.replay() timed
    ours-reduce-overhead   torch.compile(decode_step, mode="reduce-overhead", dynamic=True): our
                           operators opaque in Inductor's graph, CUDA graph trees
    torch-eager            torch_decode_step: F.rms_norm, F.linear (cuBLAS), Hugging Face's RoPE,
                           SDPA's flash backend (enable_gqa) over the cache's T tokens
    torch-graph, torch-reduce-overhead   the PyTorch step captured the same two ways
torch.compile compiles once per layer and provider, with dynamic shapes (B = 1 gets a graph of its
own: Dynamo specializes sizes of 1); CUDA graph trees record once per shape. Weights and caches are
marked static (llama_layer.mark_static), so the graphs read them in place.
Bytes a step (GB/s, share of copy): every weight once, 2 * P_layer (P_layer: llama_layer's
LayerConfig.n_params, 218M for Llama, 233M for Qwen2), + the KV cache read, B * 2 * T * Hkv * D * 2,
+ the new k and v written, B * 2 * Hkv * D * 2, + x read and y written, 2 * B * hidden * 2.
Activations between the kernels (a few MB at B = 32, against 436-466 MB of weights) are left out.
ms: do_bench medians (common.timing.time_ms; 10 ms warm-up, 50 ms of repetitions, --warmup and
    --rep change them); for a graph, of g.replay() alone.
max_err: against the PyTorch step in fp32 (weights and caches widened) on the
    first (up to) two sequences. The max_err gate (devtools/harness.py) holds our three providers to
    the PyTorch providers' error.
    python benchmarks/decode_step_bench.py            (GPU; benchmarks/results/decode_step.json and PNGs)
    python benchmarks/decode_step_bench.py --smoke    (interpreter, a tiny Qwen2 layer; no CUDA graphs there)
    python benchmarks/decode_step_bench.py --only llama3-8b,graph   (a subset)
"""

import functools

import torch

from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.harness import BenchCase, max_err, parse_args, run
from llmk.devtools.results import plot_sweeps
from llmk.models.llama_layer import CONFIGS, decode_step, make_weights, mark_static, rope_tables, torch_decode_step

OURS = ("ours-eager", "ours-graph", "ours-reduce-overhead")
# eager first: its first call autotunes and compiles, before a graph is captured
PROVIDERS = ("ours-eager", "torch-eager", "ours-graph", "torch-graph", "torch-reduce-overhead", "ours-reduce-overhead")
DTYPE = torch.bfloat16
FULL = dict(models=("llama3-8b", "qwen2-7b"), batches=(1, 8, 32), lengths=(1024, 2048, 4096, 8192, 16384))
# one layer in a smoke run: the Qwen2-shaped one (q/k/v bias) takes every branch of the Llama one; M = 1
# (GEMV) is slow interpreted
SMOKE = dict(models=("tiny-qwen2",), batches=(2,), lengths=(48,))
REF_ROWS = 2  # sequences the fp32 reference computes: each sequence's step is independent of the others


def step_bytes(config, b, t):
    kv = b * 2 * t * config.kv_heads * config.head_dim * 2
    new_kv = b * 2 * config.kv_heads * config.head_dim * 2
    return 2 * config.n_params + kv + new_kv + 2 * b * config.hidden * 2


@functools.lru_cache(maxsize=None)
def layer(model):
    """(bf16 weights on the device, their fp32 widening): built once a model."""
    weights = make_weights(CONFIGS[model], DTYPE, DEVICE)
    return weights, weights.to(torch.float32)


@functools.lru_cache(maxsize=None)
def compiled(model, ours):
    """One torch.compile'd step a layer and provider (model keys the cache only: Dynamo guards on
    the weights' config). The interpreter has no CUDA graphs or GPU Inductor: aot_eager there."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    fn = decode_step if ours else torch_decode_step
    if INTERPRET:
        return torch.compile(fn, dynamic=True, backend="aot_eager")
    return torch.compile(fn, mode="reduce-overhead", dynamic=True)


def setup(model, b, t):
    weights, weights32 = layer(model)
    c = weights.config
    x = torch.randn(b, c.hidden, device=DEVICE).to(DTYPE)
    k_cache, v_cache = (torch.randn(b, t, c.kv_heads, c.head_dim, device=DEVICE).to(DTYPE) for _ in range(2))
    lengths = torch.full((b,), t, dtype=torch.int32, device=DEVICE)
    cos, sin = rope_tables(c, t, DEVICE)
    n = min(b, REF_ROWS)
    expected = torch_decode_step(
        weights32, x[:n].float(), k_cache[:n].float(), v_cache[:n].float(), lengths[:n], cos, sin, kv_len=t
    )
    return (model, weights, x, k_cache, v_cache, lengths, cos, sin, t), expected


def captured(call):
    """call() captured in one CUDA graph after a warm-up call on a side stream; returns a call that
    replays it and returns the captured output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()

    def replay():
        graph.replay()
        return out

    return replay


# provider -> why its first call failed: later shapes are skipped with the reason, not tried again
FAILED = {}


def bind(provider, inputs):
    if provider in FAILED:
        raise RuntimeError(f"as at its first shape: {FAILED[provider]}")
    try:
        call = bind_step(provider, inputs)
        call()  # the warm-up: compiles, autotunes, records
    except RuntimeError as e:
        FAILED[provider] = str(e).splitlines()[0] if str(e) else type(e).__name__
        if provider.endswith("reduce-overhead"):
            # a failed CUDA graph tree warm-up leaves its tensors in the pool that every compiled
            # step shares, and the next one to record trips on them: start the trees afresh
            # (the other provider recompiles once)
            torch._dynamo.reset()
        raise
    return call


def bind_step(provider, inputs):
    model, weights, x, k_cache, v_cache, lengths, cos, sin, t = inputs
    ours = provider.startswith("ours")
    extra = {} if ours else dict(kv_len=t)

    def step(fn):
        return lambda: fn(weights, x, k_cache, v_cache, lengths, cos, sin, **extra)

    if provider.endswith("eager"):
        return step(decode_step if ours else torch_decode_step)
    if provider.endswith("graph"):
        return captured(step(decode_step if ours else torch_decode_step))
    mark_static(weights, k_cache, v_cache)
    return step(compiled(model, ours))


def compare(out, expected):
    return max_err(out[: expected.shape[0]], expected)


def cases(cfg, smoke):
    for model in cfg["models"]:
        config = CONFIGS[model]
        for b in cfg["batches"]:
            for t in cfg["lengths"]:
                providers = dict.fromkeys(PROVIDERS, bind)
                if smoke:
                    providers.update({p: "CUDA graphs need a GPU" for p in PROVIDERS if p.endswith("graph")})
                yield BenchCase(
                    model,
                    (b, t),
                    DTYPE,
                    providers,
                    functools.partial(setup, model, b, t),
                    n_bytes=step_bytes(config, b, t),
                    bind=bind,
                    compare=compare,
                    skip_on=(RuntimeError,),
                )


def summarize(rows):
    """ours-graph against torch-graph per shape (the target: faster at every shape)."""
    cell = {(r["op"], r["shape"], r["provider"]): r["ms"] for r in rows}
    pairs = [
        (op, shape, cell[(op, shape, "torch-graph")] / cell[(op, shape, "ours-graph")])
        for (op, shape, p) in cell
        if p == "ours-graph" and (op, shape, "torch-graph") in cell
    ]
    if not pairs:
        return []
    behind = [f"{op} {shape} {s:.2f}x" for op, shape, s in pairs if s < 1]
    lines = [
        f"ours-graph faster than torch-graph at {len(pairs) - len(behind)} of {len(pairs)} shapes; speedup "
        f"{min(s for *_, s in pairs):.2f}-{max(s for *_, s in pairs):.2f}x"
    ]
    if behind:
        lines.append("behind at: " + ", ".join(behind))
    return lines


def charts(args, cfg):
    def draw(meta, rows):
        for line in summarize(rows):
            print(line)
        for model in cfg["models"]:
            sel = [r for r in rows if r["op"] == model]
            sweeps = [(f"T, tokens a sequence (B {b})", [(t, (b, t)) for t in cfg["lengths"]]) for b in cfg["batches"]]
            plot_sweeps(args.out / f"decode_step_{model}_bf16.png", f"{model} decode step bf16", sel, sweeps, meta)

    return draw


def main():
    args = parse_args(__doc__, warmup_ms=10, rep_ms=50)  # a step is 0.15-1 ms: 50+ timed replays each
    cfg = SMOKE if args.smoke else FULL
    with torch.no_grad():
        run(args, "decode_step", charts(args, cfg), cases=lambda: cases(cfg, args.smoke), ours=OURS)


if __name__ == "__main__":
    main()
