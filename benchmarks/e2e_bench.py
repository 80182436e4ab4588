"""End to end: Llama-3-8B- and Qwen2.5-7B-shaped Hugging Face models (built from the configs below,
random bf16 weights, nothing downloaded) run as transformers ships them (`eager`: its SDPA attention
and PyTorch ops), patched with models/hf_patch.py (`triton`, LLMK_ATTENTION_PATH=tl: the tl attention
forward; for prefill also `triton-gluon`, LLMK_ATTENTION_PATH=gluon, sm_90 only), and with torch.compile.

prefill  one forward over T tokens at batch 1, T = 128..4096, no KV cache, logits of the last
         position only (as generate() asks for them). FLOPs: 2 * L * P_layer * T for the linear
         layers (P_layer = H*Hq*D + 2*H*Hkv*D + Hq*D*H + 3*H*I weights a layer), 2 * H * V for the
         LM head, and 4 * L * Hq * D * T(T+1)/2 for causal attention (q k^T and p v over the visible
         pairs); TFLOP/s = FLOPs / time.
decode   32 steps on a DynamicCache after a 512-token prompt at batch 1 and 16, fed fixed random
         token ids (every provider sees the same tokens, so the logits compare step by step); ms
         per step and tokens/s (batch / step time). Bytes a step: every weight once,
         2 * (L * P_layer + H * V) (the embedding reads B rows only), plus the K and V cache read
         at the mean context, B * 2 * L * Hkv * D * 2 * (512 + 33/2). GB/s from those.
         Decode runs are the median of 3 after a warm-up (CUDA events; do_bench's 5 estimate runs
         would triple the time of these second-long runs). Prefill uses common.timing.time_ms.
max_err  largest |logits - eager logits| in fp32 over the compared positions (prefill: the last
         position; decode: every step), so each timing sits beside its numerical cost. The max_err
         gate (devtools/harness.py) holds triton to 2 x torch.compile's error at the same row, where
         compile ran, plus LOGITS_ATOL: the logits of 28-32 bf16 layers drift from eager's by about
         0.3-0.5 whatever runs them, and decode has no second implementation to compare with. Eager
         always runs (it is the reference), even where --only leaves its rows out.
GEMM share  one prefill at T = 2048 under torch.profiler, eager and triton: time in GEMM kernels
         (cuBLAS: names with gemm / nvjet / xmma / cutlass, attention kernels excluded) over all
         CUDA kernel time, in meta["models"][name]["profile"] with the top kernels for checking.

torch.compile compiles the unpatched model regionally, PyTorch's recipe for repeated blocks: each
decoder layer is torch.compile'd with dynamic shapes, and without a cache all layers and every T
share one graph (one compile a model) where whole-model compilation would trace every layer into
one graph per shape. Prefill only: with a DynamicCache a layer reads its cache entry by its layer
index, which Dynamo guards on, so each of the 28-32 layers compiles a graph of its own (measured on
4 layers: 8 graphs with a cache, 1 without), past the benchmark's time budget; meta["notes"] says so.

    python benchmarks/e2e_bench.py            (GPU, ~4 min on an H100; benchmarks/results/e2e.json, PNGs)
    python benchmarks/e2e_bench.py --smoke    (a tiny model in the interpreter, build/bench-smoke)
    python benchmarks/e2e_bench.py --only qwen,prefill   (a subset)
Needs transformers (optional for the repository): without it the script says so and exits 0.
"""

import gc
import importlib.util
import re
import statistics
import time

import torch

from llmk.attention.attention_paths import forced_path, gluon_runs_here
from llmk.common.device import DEVICE, INTERPRET
from llmk.common.timing import time_ms
from llmk.devtools.bench import ATTENTION_KERNEL, kernel_share
from llmk.devtools.harness import parse_args, run
from llmk.devtools.results import make_row, plot_sweeps, shape_str

# The shapes of the published configs (config.json of meta-llama/Meta-Llama-3-8B, Qwen/Qwen2.5-7B).
MODELS = {
    "llama3-8b": (
        "llama",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
        ),
    ),
    "qwen2.5-7b": (
        "qwen2",
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            max_position_embeddings=131072,
            sliding_window=131072,
            use_sliding_window=False,
            max_window_layers=28,
            tie_word_embeddings=False,
        ),
    ),
}
SMOKE_MODELS = {  # head dim 64, one the decode kernel takes
    "llama-tiny": (
        "llama",
        dict(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            tie_word_embeddings=False,
        ),
    ),
}
FULL_PLAN = dict(
    prefill=(128, 512, 1024, 2048, 4096), prompt=512, steps=32, batches=(1, 16), profile_len=2048, decode_reps=3
)
SMOKE_PLAN = dict(prefill=(16,), prompt=16, steps=2, batches=(1, 2), profile_len=16, decode_reps=1)
DTYPE = torch.bfloat16
LOGITS_ATOL = 1.0  # the gate's atol on logits (bf16): twice the drift of the full-size models on an H200
# A model's torch.compile provider starts only before this many seconds into the run, so a slow
# compile cannot push the whole run far past its ~4 minutes.
COMPILE_START_LIMIT_S = 170
DECODE_COMPILE_NOTE = (
    "torch.compile decode skipped: a compiled decoder layer reads its DynamicCache entry by "
    "its layer index, which Dynamo guards on, so every layer compiles its own graph "
    "(4 layers: 8 graphs for a cached prefill and decode, 1 without a cache)"
)
# op -> providers; triton-gluon: the patched model with LLMK_ATTENTION_PATH=gluon (the Gluon
# attention forward on sm_90 with a tested Triton; the same kernels otherwise, so no row elsewhere)
PROVIDERS = {"prefill": ("eager", "triton", "triton-gluon", "torch.compile"), "decode": ("eager", "triton")}
OURS = ("triton", "triton-gluon")
GEMM_KERNEL = re.compile(r"gemm|nvjet|xmma|cutlass|cublas|aten::(mm|addmm|bmm)$", re.IGNORECASE)


def shape_of(config):
    """(H, I, L, Hq, Hkv, D, V) of a config dict."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    return (
        hidden,
        config["intermediate_size"],
        config["num_hidden_layers"],
        heads,
        config["num_key_value_heads"],
        config.get("head_dim", hidden // heads),
        config["vocab_size"],
    )


def layer_weights(config):
    hidden, inter, _, heads, kv_heads, head_dim, _ = shape_of(config)
    return hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden + 3 * hidden * inter


def prefill_flops(config, n_tokens):
    hidden, _, layers, heads, _, head_dim, vocab = shape_of(config)
    return (
        2 * layers * layer_weights(config) * n_tokens
        + 2 * hidden * vocab
        + 4 * layers * heads * head_dim * n_tokens * (n_tokens + 1) / 2
    )


def decode_bytes(config, batch, prompt, steps):
    hidden, _, layers, _, kv_heads, head_dim, vocab = shape_of(config)
    weights = 2 * (layers * layer_weights(config) + hidden * vocab)
    return weights + batch * 2 * layers * kv_heads * head_dim * 2 * (prompt + (steps + 1) / 2)


def build(kind, config):
    """A model of the config's shape, random weights (transformers' own init), DTYPE, on DEVICE."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    torch.manual_seed(0)
    with torch.device(DEVICE):  # weights created in place on the GPU, in DTYPE: no fp32 copy on the host
        model = model_cls._from_config(config_cls(**config), dtype=DTYPE)
    return model.eval()


def sync():
    if not INTERPRET:
        torch.cuda.synchronize()


def median_ms(fn, reps):
    """Median of `reps` timed calls (the caller has warmed up): CUDA events on the GPU, a host clock
    in the interpreter."""
    samples = []
    for _ in range(reps):
        if INTERPRET:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def gemm_share(prof):
    """GEMM kernel time over all kernel time of a profile (devtools.bench.kernel_share), and the top
    kernels."""
    share = kernel_share(prof, GEMM_KERNEL, exclude=ATTENTION_KERNEL)
    return {
        "source": share["source"],
        "gemm_ms": share["ms"],
        "total_ms": share["total_ms"],
        "gemm_share": share["share"],
        "top": share["top"],
    }


def compile_layers(model, smoke):
    """Swap each decoder layer for its torch.compile'd module; returns the originals. Smoke mode uses
    the eager backend: Dynamo traces as on the GPU, without Inductor's minutes-long CPU build."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    layers = model.model.layers
    originals = list(layers)
    for i, layer in enumerate(originals):
        layers[i] = torch.compile(layer, dynamic=True, backend="eager" if smoke else "inductor")
    return originals


def restore_layers(model, originals):
    import torch._dynamo

    for i, layer in enumerate(originals):
        model.model.layers[i] = layer
    torch._dynamo.reset()  # drop the compiled code and what it holds


def run_prefill(model, ids):
    return model(ids, use_cache=False, logits_to_keep=1).logits


def decode_runner(model, prompt, tokens):
    """Prefill `prompt` (B, P) into a DynamicCache; returns steps() -> [logits (B, 1, V)] that runs
    the decode steps of `tokens` (B, S) and crops the cache back to the prompt, so it can repeat."""
    from transformers import DynamicCache

    from llmk.models.hf_patch import cache_argument

    cache = DynamicCache(config=model.config)
    cache_kwarg = {cache_argument(model): cache}  # the name this transformers version gives it
    model(prompt, use_cache=True, logits_to_keep=1, **cache_kwarg)
    n_steps = tokens.shape[1]

    def steps():
        out = [model(tokens[:, s : s + 1], use_cache=True, **cache_kwarg).logits for s in range(n_steps)]
        cache.crop(-n_steps)
        return out

    return steps


def measure_model(run, name, kind, config, plan, t_run):
    """Every selected provider on one model: rows into run, meta["models"][name] filled."""
    from llmk.models.hf_patch import kernel_calls, patch_model, unpatch_model

    meta, smoke, args = run.meta, run.args.smoke, run.args
    copy_GBps = meta["copy_GBps"]
    model = build(kind, config)
    vocab = config["vocab_size"]
    ids = torch.randint(0, vocab, (1, max(plan["prefill"])), device=DEVICE)
    prompts = {b: torch.randint(0, vocab, (b, plan["prompt"]), device=DEVICE) for b in plan["batches"]}
    steps_tokens = {b: torch.randint(0, vocab, (b, plan["steps"]), device=DEVICE) for b in plan["batches"]}
    info = meta["models"][name] = {"config": config, "profile": {}}
    reference = {}

    def wanted(op, shape, provider):
        """Eager's logits are the reference: it runs wherever a row of that op and shape is selected."""
        providers = PROVIDERS[op] if provider == "eager" else (provider,)
        return any(run.selected(f"{name} {op}", shape_str(shape), p) for p in providers)

    def record(op, shape, provider, ms, logits, **size):
        key = (op, shape)
        if provider == "eager":
            reference[key] = logits
        if ms is None:
            return
        err = (logits - reference[key]).abs().max().item()
        row = make_row(f"{name} {op}", shape_str(shape), "bf16", provider, ms, copy_GBps, max_err=err, **size)
        if op == "decode":
            row["tok_s"] = round(shape[0] * 1e3 / ms, 1)
        run.add(row)

    def profile_prefill(provider):
        prefix = ids[:, : plan["profile_len"]]
        activities = [torch.profiler.ProfilerActivity.CPU]
        if not INTERPRET:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        try:
            with torch.profiler.profile(activities=activities) as prof:
                run_prefill(model, prefix)
                sync()
            info["profile"][provider] = {"T": plan["profile_len"], **gemm_share(prof)}
        except Exception as e:  # the timings stand without the profile
            meta["notes"].append(f"{name} {provider}: profile failed: {type(e).__name__}: {e}"[:300])
            print(meta["notes"][-1], flush=True)
            return
        print(
            f"{name:11s} GEMM share of one prefill at T={plan['profile_len']} ({provider}): "
            f"{info['profile'][provider]['gemm_share']}",
            flush=True,
        )

    def run_all(provider, decode=True, profile=False):
        with torch.inference_mode():
            for n_tokens in plan["prefill"]:
                if not wanted("prefill", (1, n_tokens), provider):
                    continue
                prefix = ids[:, :n_tokens]
                logits = run_prefill(model, prefix).float()  # also the warm-up (and the compile)
                ms = (
                    time_ms(lambda: run_prefill(model, prefix), args.warmup, args.rep)
                    if run.selected(f"{name} prefill", shape_str((1, n_tokens)), provider)
                    else None
                )
                record("prefill", (1, n_tokens), provider, ms, logits, flops=prefill_flops(config, n_tokens))
            if profile:
                profile_prefill(provider)
            if not decode:
                return
            for batch in plan["batches"]:
                shape = (batch, plan["prompt"], plan["steps"])
                if not wanted("decode", shape, provider):
                    continue
                steps = decode_runner(model, prompts[batch], steps_tokens[batch])
                logits = torch.cat(steps(), dim=1).float()  # warm-up; (B, S, V)
                ms = (
                    median_ms(steps, plan["decode_reps"]) / plan["steps"]
                    if run.selected(f"{name} decode", shape_str(shape), provider)
                    else None
                )
                record(
                    "decode",
                    shape,
                    provider,
                    ms,
                    logits,
                    n_bytes=decode_bytes(config, batch, plan["prompt"], plan["steps"]),
                )
                del steps

    def any_row(provider):
        return any(wanted(op, shape, provider) for op, shape in row_keys(plan) if provider in PROVIDERS[op])

    run_all("eager", profile=not args.partial)
    if any_row("triton"):
        patch_model(model)
        try:
            with forced_path("tl"):  # the default path takes the Gluon forward on sm_90: triton-gluon's rows
                run_all("triton", profile=not args.partial)
            info["kernel_calls"] = kernel_calls(model)  # which kernels ran, and any fallback
            if any_row("triton-gluon") and gluon_runs_here():
                with forced_path("gluon"):
                    run_all("triton-gluon", decode=False)
            elif any_row("triton-gluon"):
                meta["notes"].append(
                    f"{name}: no triton-gluon rows: the Gluon forward runs on sm_90 with a "
                    "tested Triton (attention/attention_paths.py)"
                )
        finally:
            unpatch_model(model)
    late = time.perf_counter() - t_run > COMPILE_START_LIMIT_S and not smoke
    if any_row("torch.compile") and late:
        meta["notes"].append(f"{name}: torch.compile skipped, {time.perf_counter() - t_run:.0f} s into the run")
    elif any_row("torch.compile"):
        originals = compile_layers(model, smoke)
        t0 = time.perf_counter()
        try:
            run_all("torch.compile", decode=False)
            info["compile_s"] = round(time.perf_counter() - t0, 1)  # compile plus the prefill timings
        except Exception as e:  # a model that does not compile is a result, not a crash of the run
            meta["notes"].append(f"{name}: torch.compile failed: {type(e).__name__}: {e}"[:300])
            print(meta["notes"][-1], flush=True)
        finally:
            restore_layers(model, originals)
    del model, reference
    gc.collect()
    if not INTERPRET:
        torch.cuda.empty_cache()


def row_keys(plan):
    """(op, shape) of every row of one model."""
    return [("prefill", (1, t)) for t in plan["prefill"]] + [
        ("decode", (b, plan["prompt"], plan["steps"])) for b in plan["batches"]
    ]


def measure(run, models, plan):
    meta = run.meta
    run.total = sum(
        run.selected(f"{name} {op}", shape_str(shape), p)
        for name in models
        for op, shape in row_keys(plan)
        for p in PROVIDERS[op]
    )
    meta.update(models={}, notes=[DECODE_COMPILE_NOTE], plan=plan)
    if run.args.smoke:
        meta["notes"].append("smoke: torch.compile with the eager backend (Dynamo only)")
    t_run = time.perf_counter()
    for name, (kind, config) in models.items():
        keys = [(f"{name} {op}", shape_str(shape), p) for op, shape in row_keys(plan) for p in PROVIDERS[op]]
        if any(run.selected(*key) for key in keys):
            measure_model(run, name, kind, config, plan, t_run)
    meta["run_s"] = round(time.perf_counter() - t_run, 1)
    print(f"run time {meta['run_s']} s", flush=True)


def charts(args):
    def draw(meta, rows):
        plan = meta["plan"]
        for name in meta["models"]:
            prefill = [r for r in rows if r["op"] == f"{name} prefill"]
            decode = [r for r in rows if r["op"] == f"{name} decode"]
            plot_sweeps(
                args.out / f"e2e_{name}_prefill.png",
                f"{name} prefill, batch 1",
                prefill,
                [("sequence length T (batch 1)", [(t, (1, t)) for t in plan["prefill"]])],
                meta,
                metric="TFLOPs",
            )
            plot_sweeps(
                args.out / f"e2e_{name}_decode.png",
                f"{name} decode",
                decode,
                [
                    (
                        f"batch ({plan['prompt']}-token prompt, {plan['steps']} steps)",
                        [(b, (b, plan["prompt"], plan["steps"])) for b in plan["batches"]],
                    )
                ],
                meta,
                metric="GBps",
            )

    return draw


def main():
    args = parse_args(__doc__)
    if not args.replot and importlib.util.find_spec("transformers") is None:
        print("e2e_bench.py: skipped, transformers is not installed (optional: pip install transformers==5.17.0)")
        return
    models, plan = (SMOKE_MODELS, SMOKE_PLAN) if args.smoke else (MODELS, FULL_PLAN)
    run(
        args,
        "e2e",
        charts(args),
        measure=lambda bench: measure(bench, models, plan),
        ours=OURS,
        atol={"bf16": LOGITS_ATOL},
    )


if __name__ == "__main__":
    main()
