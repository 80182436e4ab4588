"""Training: a full step (forward, backward, optimizer) of ~1.5B-parameter Llama- and Qwen2-shaped
transformers models (random weights, nothing downloaded), in tokens/s and peak memory.

Providers, each on a fresh model from the same seed:
  eager          transformers as it ships (SDPA attention, PyTorch ops), torch.optim.AdamW(fused=True)
  triton         the same model patched with models/hf_patch.py (RMSNorm, residual RMSNorm, RoPE,
                 FlashAttention with its backward, SwiGLU, the fused linear cross-entropy for the
                 loss), TritonAdamW with its default fp32 m and v (4 bytes a parameter more than
                 torch's bf16 state; optimizers/triton_adam.py says why it is the default)
  triton+bf16-state  the same with TritonAdamW(state_dtype=None): m and v in bf16 as torch's AdamW
                 keeps them, the peers' memory for the state
  triton+torch-adamw  the patched model with torch's fused AdamW: the kernels' share alone, with the
                 peers' optimizer
  torch.compile  eager with each decoder layer compiled (regional compilation, as e2e_bench.py does)
  liger          Liger-Kernel's apply_liger_kernel_to_llama / _qwen2 on the model (RoPE, RMSNorm,
                 SwiGLU, fused linear cross-entropy); runs last, as it patches transformers' modules
                 for the rest of the process; skipped where not installed
Parameters and gradients in bf16 for every provider. Every model runs with use_cache=False, as
training does: no KV cache is built, and the compiled layers see no cache object to guard on.

Row: op "train_step", shape "<model> BxT", ms a step (median of STEPS timed steps after WARMUP),
tokens_per_s = B*T / step, peak_MB = torch.cuda.max_memory_allocated over the timed steps (weights,
gradients, optimizer state and activations: the whole process), max_err = |first step's loss - eager's|.
One more step, untimed, splits the peak by phase: fwd_peak_MB, bwd_peak_MB, opt_peak_MB (each
phase's own maximum) and saved_MB (allocated after the forward minus before it: the activations
autograd keeps, with the loss's gradients where the loss computes them in its forward).
The loss curves of LOSS_STEPS steps of eager and triton from the same initial weights and the same
batches go into meta["loss_curves"] and a PNG.

    python benchmarks/train_bench.py            (GPU; benchmarks/results/train.json and PNGs)
    python benchmarks/train_bench.py --smoke    (a tiny model in the interpreter, build/bench-smoke)
    python benchmarks/train_bench.py --fsdp2    (llama-1.5b under FSDP2 on two GPUs, one process each:
                                                 benchmarks/train_fsdp2.py, results/train_fsdp2.json)
Needs transformers (optional for the repository): without it the script says so and exits 0.
"""
import gc
import importlib.util
import statistics
import sys
import time

import torch

from llmk.common.device import DEVICE, INTERPRET
from llmk.common.harness import parse_args, run
from llmk.common.peers import LIGER
from llmk.common.results import make_row

_LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                 num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=8192,
                 tie_word_embeddings=False)
MODELS = {
    "llama-1.5b": ("llama", dict(_LLAMA_1B, vocab_size=128256)),
    "qwen2-1.5b": ("qwen2", dict(_LLAMA_1B, vocab_size=151936, rope_theta=1000000.0, use_sliding_window=False)),
}
SMOKE_MODELS = {
    "llama-tiny": ("llama", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, vocab_size=256, tie_word_embeddings=False)),
}
FULL_PLAN = dict(batch=2, seq=4096, warmup=3, steps=10, loss_steps=50, lr=3e-4)
SMOKE_PLAN = dict(batch=2, seq=16, warmup=1, steps=2, loss_steps=3, lr=3e-4)
DTYPE = torch.bfloat16
PROVIDERS = ("eager", "triton", "triton+bf16-state", "triton+torch-adamw", "torch.compile", LIGER)
OURS = ("triton", "triton+bf16-state", "triton+torch-adamw")
LOSS_ATOL = 0.05  # the gate's atol on the first step's loss: bf16 models of 16 layers differ by ~0.01


def build(kind, config):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[kind]
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = model_cls._from_config(config_cls(**config, use_cache=False), dtype=DTYPE)
    return model.train()


def batches(vocab, plan, n):
    """n fixed batches of random tokens (the same for every provider)."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    return [torch.randint(0, vocab, (plan["batch"], plan["seq"]), generator=gen).to(DEVICE) for _ in range(n)]


def optimizer(model, provider, lr):
    if provider in ("triton", "triton+bf16-state"):  # ours: the patched model's own optimizer
        from llmk.optimizers.triton_adam import TritonAdamW
        return TritonAdamW(model.parameters(), lr=lr,
                           state_dtype=None if provider == "triton+bf16-state" else torch.float32)
    return torch.optim.AdamW(model.parameters(), lr=lr, fused=not INTERPRET)


def prepare(model, kind, provider, smoke):
    """The provider's changes to a fresh model; returns a function that undoes them (or None)."""
    if provider.startswith("triton"):
        from llmk.models.hf_patch import patch_model, unpatch_model
        patch_model(model)
        return lambda: unpatch_model(model)
    if provider == "torch.compile":
        for layer in model.model.layers:
            layer.compile(dynamic=False, backend="eager" if smoke else "inductor")
        return None
    if provider == LIGER:
        from liger_kernel.transformers import apply_liger_kernel_to_llama, apply_liger_kernel_to_qwen2
        {"llama": apply_liger_kernel_to_llama, "qwen2": apply_liger_kernel_to_qwen2}[kind](model=model)
    return None


def release(undo):
    """After a provider's model is dropped: undo its changes and hand its memory back, so the next
    provider starts from the same free memory."""
    if undo is not None:
        undo()
    gc.collect()
    if not INTERPRET:
        torch.cuda.empty_cache()


def step(model, opt, ids):
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
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
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
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


def loss_curve(model, opt, data):
    return [round(step(model, opt, ids).float().item(), 5) for ids in data]


def measure_model(run, name, kind, config, plan):
    shape = f"{name} {plan['batch']}x{plan['seq']}"
    data = batches(config["vocab_size"], plan, max(plan["loss_steps"], plan["warmup"] + plan["steps"]))
    curves = run.meta["loss_curves"][name] = {}
    eager_first = None
    for provider in PROVIDERS:
        if provider == LIGER and (INTERPRET or importlib.util.find_spec("liger_kernel") is None):
            print(f"{shape} {provider}: skipped (liger-kernel unavailable here)", flush=True)
            continue
        if not run.selected("train_step", shape, provider) and not (provider == "eager"):
            continue
        model = build(kind, config)
        undo = prepare(model, kind, provider, run.args.smoke)
        try:
            if provider in ("eager", "triton"):  # the loss curves first, from the initial weights
                curves[provider] = loss_curve(model, optimizer(model, provider, plan["lr"]),
                                              data[:plan["loss_steps"]])
                model = build(kind, config) if undo is None else (undo(), build(kind, config))[1]
                undo = prepare(model, kind, provider, run.args.smoke)
            ms, peak, first, phases = timed_steps(model, optimizer(model, provider, plan["lr"]), data, plan)
        finally:
            del model
            release(undo)
        if provider == "eager":
            eager_first = first
        err = abs(first - eager_first) if eager_first is not None else None
        row = make_row("train_step", shape, "bf16", provider, ms, run.meta["copy_GBps"], max_err=err)
        row.update(tokens_per_s=round(plan["batch"] * plan["seq"] * 1e3 / ms, 1), peak_MB=peak, first_loss=first,
                   **phases)
        run.add(row)


def measure(run, models, plan):
    run.total = len(models) * len(PROVIDERS)
    run.meta.update(loss_curves={}, plan=plan)
    t0 = time.perf_counter()
    for name, (kind, config) in models.items():
        measure_model(run, name, kind, config, plan)
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
    if "--fsdp2" in sys.argv:  # the same step sharded over two GPUs: benchmarks/train_fsdp2.py
        sys.argv.remove("--fsdp2")
        from llmk.benchmarks.train_fsdp2 import main_fsdp2
        sys.exit(main_fsdp2(parse_args(__doc__), sys.argv[1:]))
    args = parse_args(__doc__)
    if not args.replot and importlib.util.find_spec("transformers") is None:
        print("train_bench.py: skipped, transformers is not installed (optional: pip install transformers==5.17.0)")
        return
    models, plan = (SMOKE_MODELS, SMOKE_PLAN) if args.smoke else (MODELS, FULL_PLAN)
    run(args, "train", charts(args), measure=lambda bench: measure(bench, models, plan), ours=OURS,
        atol={"bf16": LOSS_ATOL})


if __name__ == "__main__":
    main()
