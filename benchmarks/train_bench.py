"""Training: a full step (forward, backward, optimizer) of ~1-1.5B-parameter Llama-, Qwen2-, Qwen3-
and Gemma 2-shaped transformers models and a 1.9B-parameter Qwen3-MoE-shaped one (random weights,
nothing downloaded), in tokens/s and peak memory; and the Llama model on a batch of mixed-length
sequences, padding-free against padded.

Providers, each on a fresh model from the same seed:
  eager          transformers as it ships (SDPA attention, PyTorch ops; MoE experts through its default
                 experts implementation, grouped_mm), torch.optim.AdamW(fused=True)
  triton         the same model patched with models/hf_patch.py (RMSNorm, residual RMSNorm, RoPE,
                 FlashAttention with its backward, SwiGLU, the fused linear cross-entropy for the
                 loss; the MoE router and experts), TritonAdamW with its default fp32 m and v (4
                 bytes a parameter more than torch's bf16 state; optimizers/triton_adam.py says why
                 it is the default)
  triton+bf16-state  the same with TritonAdamW(state_dtype=None): m and v in bf16 as torch's AdamW
                 keeps them, the peers' memory for the state
  triton+torch-adamw  the patched model with torch's fused AdamW: the kernels' share alone, with the
                 peers' optimizer
  triton+fp8     triton with the opt-in fp8_linear: every decoder layer's linear in FP8 (e4m3, row-wise
                 scales), forward and backward (gemm/fp8_linear_ops.py), the norms and SwiGLU before
                 them casting their outputs in the same kernel; the LM head and loss bf16
  torch.compile  eager with each decoder layer compiled (regional compilation, as e2e_bench.py does)
  torchao-float8-rowwise, torchao-float8-tensorwise  torchao's float8 training
                 (convert_to_float8_training with the recipe of that name) on the decoder layers'
                 linears, each layer compiled as torch.compile's are (torchao's casts fuse only
                 under compilation); the LM head bf16; skipped where torchao is not installed (it
                 travels to the GPU as a wheel, as Liger does)
  liger          Liger-Kernel's apply_liger_kernel_to_<family> on the model (RoPE, RMSNorm,
                 SwiGLU or GeGLU, fused linear cross-entropy; for Qwen3-MoE its fused MoE); runs
                 last, as it patches transformers' modules for the rest of the process; skipped
                 where not installed
The Gemma 2 model runs transformers' default attention implementation (SDPA), which drops Gemma 2's
attention logit softcap (only its eager implementation applies it); the patched model applies it
(models/hf_patch.py), so the kernels do a little more work than eager's and Liger's attention.
Parameters and gradients in bf16 for every provider. Every model runs with use_cache=False, as
training does: no KV cache is built, and the compiled layers see no cache object to guard on.

Row: op "train_step", shape "<model> BxT", ms a step (median of STEPS timed steps after WARMUP),
tokens_per_s = B*T / step, peak_MB = torch.cuda.max_memory_allocated over the timed steps (weights,
gradients, optimizer state and activations: the whole process), max_err = |first step's loss - eager's|.
One more step, untimed, splits the peak by phase: fwd_peak_MB, bwd_peak_MB, opt_peak_MB (each
phase's own maximum) and saved_MB (allocated after the forward minus before it: the activations
autograd keeps, with the loss's gradients where the loss computes them in its forward).
The loss curves of 100 steps (loss_steps) of eager, triton, triton+fp8 and the torchao recipes on
CURVE_MODEL, from the same initial weights and the same batches, go into meta["loss_curves"] and a
PNG.
Attention's share (meta["attention_share"], CURVE_MODEL, whole runs): one step of eager, triton,
torch.compile and liger under torch.profiler, the time of attention's kernels (devtools.bench's
ATTENTION_KERNEL; repeat_kv's copies, where a GQA model makes them, not among them) beside the
timed step's ms; and triton's model again with its attention forced onto the tl kernels
(LLMK_ATTENTION_PATH=tl; its steps timed again): the share before the Gluon kernels.

Packed rows (op "train_step_packed", shape "<model> <layout> <n> seqs <tokens> tokens", providers
eager, triton, liger): PACKED_SEQS sequences of mixed lengths (PACKED_MIN..PACKED_MAX, B*T tokens in
all) as one padding-free row (position_ids restarting per sequence, labels -100 at each sequence's
first token, as DataCollatorWithFlattening builds it) and as a right-padded batch with its
attention_mask; tokens_per_s counts the real tokens only, so the two layouts compare directly.

    python benchmarks/train_bench.py            (GPU; benchmarks/results/train.json and PNGs)
    python benchmarks/train_bench.py --smoke    (a tiny Llama in the interpreter, build/bench-smoke; the
                                                 MoE model's patched step is models/test_hf_patch.py's)
    python benchmarks/train_fsdp2.py            (llama-1.5b under FSDP2 on two GPUs, one process each:
                                                 results/train_fsdp2.json)
Needs transformers (optional for the repository): without it the script says so and exits 0.
"""

import gc
import importlib.util
import statistics
import time

import torch

from llmk.attention.attention_paths import forced_path, gluon_runs_here
from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.bench import ATTENTION_KERNEL, kernel_share
from llmk.devtools.harness import parse_args, run
from llmk.devtools.peers import LIGER
from llmk.devtools.results import make_row

_LLAMA_1B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)
MODELS = {
    "llama-1.5b": ("llama", dict(_LLAMA_1B, vocab_size=128256)),
    "qwen2-1.5b": ("qwen2", dict(_LLAMA_1B, vocab_size=151936, rope_theta=1000000.0, use_sliding_window=False)),
    # Qwen3-1.7B's widths (16 heads of 128, q/k norms) at 16 layers
    "qwen3-1.2b": (
        "qwen3",
        dict(
            _LLAMA_1B,
            intermediate_size=6144,
            num_attention_heads=16,
            head_dim=128,
            vocab_size=151936,
            rope_theta=1000000.0,
        ),
    ),
    # Gemma 2 2B's widths (8 heads of 256, GeGLU, softcaps, a 4096-token window every other layer) at 10 layers
    "gemma2-1.2b": (
        "gemma2",
        dict(
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=10,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            vocab_size=256000,
            query_pre_attn_scalar=256,
            sliding_window=4096,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        ),
    ),
    # Qwen3-30B-A3B's widths (32 heads of 128 over 4 KV heads; 128 experts of 768, top-8) at 2 layers:
    # 1.2B expert parameters, 0.6B of embeddings
    "qwen3-moe-1.9b": (
        "qwen3_moe",
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            moe_intermediate_size=768,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=151936,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
        ),
    ),
}
PACKED_MODEL = "llama-1.5b"
PACKED_SEQS, PACKED_MIN, PACKED_MAX = 24, 64, 1024
SMOKE_PACKED = (4, 2, 12)
SMOKE_MODELS = {
    "llama-tiny": (
        "llama",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=256,
            tie_word_embeddings=False,
        ),
    ),
}
FULL_PLAN = dict(batch=2, seq=4096, warmup=3, steps=10, loss_steps=100, lr=3e-4)
CURVE_MODEL = "llama-1.5b"  # the model whose loss curves are kept (every model's would add minutes a run)
# 8 tokens a sequence: the interpreter's RoPE and loss cost a program per position or two (a step is
# seconds), and attention's one 16-key block is partial at 8 as at any length below 16
SMOKE_PLAN = dict(batch=2, seq=8, warmup=1, steps=1, loss_steps=2, lr=3e-4)
DTYPE = torch.bfloat16
TORCHAO = ("torchao-float8-rowwise", "torchao-float8-tensorwise")
PROVIDERS = (
    "eager",
    "triton",
    "triton+bf16-state",
    "triton+torch-adamw",
    "triton+fp8",
    "torch.compile",
    *TORCHAO,
    LIGER,
)
OURS = ("triton", "triton+bf16-state", "triton+torch-adamw", "triton+fp8")
CURVES = ("eager", "triton", "triton+fp8", *TORCHAO)  # the providers whose loss curves are kept
SMOKE_CURVES = ("eager", "triton")  # a smoke run's
# the providers that differ from triton only in the optimizer (TritonAdamW's bf16 state, torch's AdamW)
# or in the kernels patched (fp8_linear too, whose steps are the interpreter's longest, three times
# triton's): a smoke run exercises the benchmark's code, not the kernels' speed, and leaves them out
# (optimizers/test_adam.py tests both states; models/test_hf_patch.py the fp8_linear training step)
SMOKE_SKIP = ("triton+bf16-state", "triton+torch-adamw", "triton+fp8")
SHARE_PROVIDERS = ("eager", "triton", "torch.compile", LIGER)  # CURVE_MODEL's steps profiled for it
LOSS_ATOL = 0.05  # the gate's atol on the first step's loss: bf16 models of 16 layers differ by ~0.01


FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}


def build(kind, config):
    import transformers

    config_cls, model_cls = (getattr(transformers, name) for name in FAMILIES[kind])
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = model_cls._from_config(config_cls(**config, use_cache=False), dtype=DTYPE)
    return model.train()


def batches(vocab, plan, n):
    """n fixed batches of random tokens (the same for every provider)."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    return [torch.randint(0, vocab, (plan["batch"], plan["seq"]), generator=gen).to(DEVICE) for _ in range(n)]


def optimizer(model, provider, lr):
    if provider in ("triton", "triton+bf16-state", "triton+fp8"):  # ours: the patched model's own optimizer
        from llmk.optimizers.triton_adam import TritonAdamW

        return TritonAdamW(
            model.parameters(), lr=lr, state_dtype=None if provider == "triton+bf16-state" else torch.float32
        )
    return torch.optim.AdamW(model.parameters(), lr=lr, fused=not INTERPRET)


def prepare(model, kind, provider, smoke):
    """The provider's changes to a fresh model; returns a function that undoes them (or None)."""
    if provider.startswith("triton"):
        from llmk.models.hf_patch import KERNELS, patch_model, unpatch_model

        patch_model(model, KERNELS + ("fp8_linear",) if provider == "triton+fp8" else KERNELS)
        return lambda: unpatch_model(model)
    if provider in TORCHAO:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(provider.rsplit("-", 1)[1])
        convert_to_float8_training(model.model.layers, config=config)
    if provider == "torch.compile" or provider in TORCHAO:
        for layer in model.model.layers:
            layer.compile(dynamic=False, backend="eager" if smoke else "inductor")
        return None
    if provider == LIGER:
        import liger_kernel.transformers as liger

        getattr(liger, f"apply_liger_kernel_to_{kind}")(model=model)
    return None


def release(undo):
    """After a provider's model is dropped: undo its changes and hand its memory back, so the next
    provider starts from the same free memory."""
    if undo is not None:
        undo()
    gc.collect()
    if not INTERPRET:
        torch.cuda.empty_cache()


def model_inputs(ids):
    """The model's inputs for a batch: ids (B, T) with themselves as labels, or a dict of inputs
    as it is (the packed rows')."""
    return ids if isinstance(ids, dict) else dict(input_ids=ids, labels=ids)


def step(model, opt, ids):
    """One step on ids (B, T) (labels the ids), or on a dict of model inputs (the packed rows')."""
    opt.zero_grad(set_to_none=True)
    loss = model(**model_inputs(ids), use_cache=False).loss
    loss.backward()
    opt.step()
    return loss.detach()


def phase_peaks(model, opt, ids):
    """One step with the peak memory of each phase, in MB: {fwd, bwd, opt}_peak_MB and saved_MB."""
    mb = lambda n: round(n / 1e6, 1)  # noqa: E731
    opt.zero_grad(set_to_none=True)
    sync()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = model(**model_inputs(ids), use_cache=False).loss
    sync()
    out = dict(fwd_peak_MB=mb(torch.cuda.max_memory_allocated()), saved_MB=mb(torch.cuda.memory_allocated() - before))
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    sync()
    out["bwd_peak_MB"] = mb(torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    opt.step()
    sync()
    out["opt_peak_MB"] = mb(torch.cuda.max_memory_allocated())
    return out


def sync():
    if not INTERPRET:
        torch.cuda.synchronize()


def run_steps(model, opt, data, plan, before_timing=None):
    """(first step's loss, ms of each timed step): WARMUP steps, then STEPS timed ones, each
    synchronized; the peak memory statistics are reset between them, after `before_timing()`
    (a barrier across ranks, say)."""
    first = step(model, opt, data[0]).float().item()
    for i in range(1, plan["warmup"]):
        step(model, opt, data[i % len(data)])
    sync()
    if before_timing is not None:
        before_timing()
    if not INTERPRET:
        torch.cuda.reset_peak_memory_stats()
    samples = []
    for i in range(plan["steps"]):
        t0 = time.perf_counter()
        step(model, opt, data[i % len(data)])
        sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return first, samples


def timed_steps(model, opt, data, plan):
    """(median ms a step, peak MB, first loss, the peak of each phase)."""
    first, samples = run_steps(model, opt, data, plan)
    peak = None if INTERPRET else round(torch.cuda.max_memory_allocated() / 1e6, 1)
    phases = {} if INTERPRET else phase_peaks(model, opt, data[0])
    return statistics.median(samples), peak, first, phases


def attention_profile(model, opt, ids):
    """Attention's share of one step's kernel time (kernel_share over ATTENTION_KERNEL)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if not INTERPRET:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        step(model, opt, ids)
        sync()
    return kernel_share(prof, ATTENTION_KERNEL)


def attention_shares(meta, model, opt, data, plan, provider, ms):
    """meta["attention_share"][provider]: one profiled step of the provider's model (its timed
    step's ms beside it); for triton also the same model with the attention forced onto the tl
    kernels (plan's steps timed again), the share before the Gluon kernels."""
    shares = meta.setdefault("attention_share", {})
    shares[provider] = {"step_ms": round(ms, 2), **attention_profile(model, opt, data[0])}
    # where the Gluon kernels cannot run, the triton provider's attention is the tl kernels' already
    tl_too = provider == "triton" and gluon_runs_here()
    if tl_too:
        with forced_path("tl"):
            _, samples = run_steps(model, opt, data, plan)  # its warm-up steps compile the tl kernels
            shares["triton, tl attention"] = {
                "step_ms": round(statistics.median(samples), 2),
                **attention_profile(model, opt, data[0]),
            }
    for label in (provider, "triton, tl attention") if tl_too else (provider,):
        share = shares[label]
        print(
            f"attention's share of a step ({label}): {share['share']} ({share['ms']} of {share['total_ms']} "
            f"ms of kernels; a step {share['step_ms']} ms)",
            flush=True,
        )


def loss_curve(model, opt, data):
    return [round(step(model, opt, ids).float().item(), 5) for ids in data]


def measure_model(run, name, kind, config, plan):
    shape = f"{name} {plan['batch']}x{plan['seq']}"
    data = batches(config["vocab_size"], plan, max(plan["loss_steps"], plan["warmup"] + plan["steps"]))
    curves = {}
    if run.args.smoke or name == CURVE_MODEL:
        run.meta["loss_curves"][name] = curves
    eager_first = None
    for provider in PROVIDERS:
        if provider == LIGER and (INTERPRET or importlib.util.find_spec("liger_kernel") is None):
            print(f"{shape} {provider}: skipped (liger-kernel unavailable here)", flush=True)
            continue
        if provider in TORCHAO and (
            INTERPRET or importlib.util.find_spec("torchao") is None or torch.cuda.get_device_capability() < (8, 9)
        ):
            print(
                f"{shape} {provider}: skipped (torchao unavailable here, or a GPU without FP8 tensor cores)", flush=True
            )
            continue
        if run.args.smoke and provider in SMOKE_SKIP:
            print(f"{shape} {provider}: skipped (a smoke run: triton with another optimizer or fp8_linear)", flush=True)
            continue
        if not run.selected("train_step", shape, provider) and not (provider == "eager"):
            continue
        model = build(kind, config)
        undo = prepare(model, kind, provider, run.args.smoke)
        try:
            if (
                provider in (SMOKE_CURVES if run.args.smoke else CURVES) and name in run.meta["loss_curves"]
            ):  # first, from the initial weights
                curves[provider] = loss_curve(model, optimizer(model, provider, plan["lr"]), data[: plan["loss_steps"]])
                model = build(kind, config) if undo is None else (undo(), build(kind, config))[1]
                undo = prepare(model, kind, provider, run.args.smoke)
            opt = optimizer(model, provider, plan["lr"])
            ms, peak, first, phases = timed_steps(model, opt, data, plan)
            if name in run.meta["loss_curves"] and provider in SHARE_PROVIDERS and not run.args.partial:
                attention_shares(run.meta, model, opt, data, plan, provider, ms)
        finally:
            del model
            release(undo)
        if provider == "eager":
            eager_first = first
        err = abs(first - eager_first) if eager_first is not None else None
        row = make_row("train_step", shape, "bf16", provider, ms, run.meta["copy_GBps"], max_err=err)
        row.update(
            tokens_per_s=round(plan["batch"] * plan["seq"] * 1e3 / ms, 1), peak_MB=peak, first_loss=first, **phases
        )
        run.add(row)


def packed_lengths(n, low, high, total):
    """n lengths in [low, high] summing to at most `total` (a fixed draw: the same batch every run)."""
    gen = torch.Generator().manual_seed(2)
    lengths = torch.randint(low, high + 1, (n,), generator=gen)
    return (lengths * min(1.0, total / int(lengths.sum()))).long().clamp(min=1).tolist()


def packed_batches(vocab, lengths, n):
    """n pairs (padding-free inputs, padded inputs) of the same random sequences (module docstring;
    models/packing.py)."""
    from llmk.models.packing import packed_and_padded

    gen = torch.Generator(device="cpu").manual_seed(3)
    return [
        packed_and_padded([torch.randint(0, vocab, (k,), generator=gen).to(DEVICE) for k in lengths]) for _ in range(n)
    ]


PACKED_LAYOUTS = ("padding-free", "padded")  # the pairs packed_batches makes, in this order
PACKED_PROVIDERS = ("eager", "triton", LIGER)


def measure_packed(run, name, kind, config, plan, packed):
    """The packed rows (module docstring): PACKED_PROVIDERS on each layout."""
    n, low, high = packed
    lengths = packed_lengths(n, low, high, plan["batch"] * plan["seq"])
    data = packed_batches(config["vocab_size"], lengths, plan["warmup"] + plan["steps"])
    tokens = sum(lengths)
    for pick, layout in enumerate(PACKED_LAYOUTS):
        shape = f"{name} {layout} {len(lengths)} seqs {tokens} tokens"
        first_eager = None
        for provider in PACKED_PROVIDERS:
            if provider == LIGER and (INTERPRET or importlib.util.find_spec("liger_kernel") is None):
                print(f"{shape} {provider}: skipped (liger-kernel unavailable here)", flush=True)
                continue
            if not run.selected("train_step_packed", shape, provider) and provider != "eager":
                continue
            model = build(kind, config)
            undo = prepare(model, kind, provider, run.args.smoke)
            try:
                ms, peak, first, phases = timed_steps(
                    model, optimizer(model, provider, plan["lr"]), [batch[pick] for batch in data], plan
                )
            finally:
                del model
                release(undo)
            first_eager = first if provider == "eager" else first_eager
            row = make_row(
                "train_step_packed",
                shape,
                "bf16",
                provider,
                ms,
                run.meta["copy_GBps"],
                max_err=abs(first - first_eager),
            )
            row.update(tokens_per_s=round(tokens * 1e3 / ms, 1), peak_MB=peak, first_loss=first, **phases)
            run.add(row)


def measure(run, models, plan, packed):
    run.total = len(models) * len(PROVIDERS) + len(PACKED_LAYOUTS) * len(PACKED_PROVIDERS)
    run.meta.update(loss_curves={}, plan=plan)
    t0 = time.perf_counter()
    for name, (kind, config) in models.items():
        measure_model(run, name, kind, config, plan)
    name = next(iter(models)) if run.args.smoke else PACKED_MODEL
    measure_packed(run, name, *models[name], plan, packed)
    run.meta["run_s"] = round(time.perf_counter() - t0, 1)


def charts(args):
    def draw(meta, rows):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        for name, curves in meta["loss_curves"].items():
            fig, ax = plt.subplots(figsize=(7, 4.2))
            for provider, losses in curves.items():
                ax.plot(range(1, len(losses) + 1), losses, label=provider)
            ax.set_xlabel("step")
            ax.set_ylabel("loss")
            ax.set_title(f"{name}: training loss, same weights and batches")
            ax.grid(True, alpha=0.3)
            ax.legend()
            fig.tight_layout()
            fig.savefig(args.out / f"train_{name}_loss.png", dpi=120)
            plt.close(fig)

    return draw


def main():
    args = parse_args(__doc__)
    if not args.replot and importlib.util.find_spec("transformers") is None:
        print("train_bench.py: skipped, transformers is not installed (optional: pip install transformers==5.17.0)")
        return
    models, plan, packed = (
        (SMOKE_MODELS, SMOKE_PLAN, SMOKE_PACKED)
        if args.smoke
        else (MODELS, FULL_PLAN, (PACKED_SEQS, PACKED_MIN, PACKED_MAX))
    )
    run(
        args,
        "train",
        charts(args),
        measure=lambda bench: measure(bench, models, plan, packed),
        ours=OURS,
        atol={"bf16": LOSS_ATOL},
    )


if __name__ == "__main__":
    main()
