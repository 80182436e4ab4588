"""Losses: cross-entropy over logits, and the LM head's linear layer fused with it, against PyTorch
eager, torch.compile and Liger-Kernel, with the peak memory of each call.

    cross_entropy         logits (BT, V) bf16 -> mean loss; GB/s and % of copy:
                          fwd: read the logits, N*V*e;  fwd+bwd: read them twice, write dlogits, 3*N*V*e
    linear_cross_entropy  hidden (BT, H) and weight (V, H) bf16, both requiring grad -> mean loss,
                          fwd+bwd; TFLOP/s of its three GEMMs, 6*BT*H*V FLOPs
Providers: triton (losses/triton_cross_entropy.py, losses/triton_fused_linear_cross_entropy.py); eager (logits in
bf16, then F.cross_entropy on them: what a model's loss does); torch.compile of eager; liger
(LigerCrossEntropyFunction, LigerFusedLinearCrossEntropyFunction; skipped where not installed).
peak_MB: the memory a call adds beyond its inputs (logits, gradients, scratch); Liger's
cross-entropy writes dlogits into its input and allocates none. fwd+bwd rows also give graph_ms
(GPU time, common.bench.graph_time_ms) for every provider but Liger's: its losses read the count of
targets on the host (.item()), which a CUDA graph cannot capture (a failed capture leaves the
process's CUDA state unusable). max_err: the gradients against an
fp32 reference (for linear_cross_entropy computed in chunks of tokens, no (BT, V) matrix in fp32).

Shapes: BT 8192 with V 32000, 128256 and 151936 for cross_entropy; (8192, 4096, 128256) and
(16384, 4096, 151936) for linear_cross_entropy (Llama 3 and Qwen2 heads).
    python benchmarks/losses_bench.py            (GPU; benchmarks/results/losses.json and PNGs)
    python benchmarks/losses_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
"""

import torch
import torch.nn.functional as F

from llmk.common.bench import compile_fn, compile_train_fn, train_call
from llmk.common.device import DEVICE, INTERPRET
from llmk.common.harness import BenchCase, parse_args, run
from llmk.common.peers import LIGER, liger_ce, liger_lce
from llmk.common.results import plot_sweeps
from llmk.losses.triton_cross_entropy import cross_entropy
from llmk.losses.triton_fused_linear_cross_entropy import fused_linear_cross_entropy

DTYPE = torch.bfloat16
CE_SHAPES = [(8192, 32000), (8192, 128256), (8192, 151936)]
LCE_SHAPES = [(8192, 4096, 128256), (16384, 4096, 151936)]
SMOKE_CE_SHAPES = [(16, 300)]
SMOKE_LCE_SHAPES = [(24, 32, 300)]
REFERENCE_CHUNK = 1024  # tokens a chunk of the fp32 reference


def eager_ce(logits, target):
    return F.cross_entropy(logits, target)


def eager_lce(hidden, weight, target):
    return F.cross_entropy(hidden @ weight.T, target)


def targets(n, v):
    return torch.randint(0, v, (n,), device=DEVICE)


def ce_setup(n, v, mode):
    logits, target = torch.randn(n, v, device=DEVICE, dtype=DTYPE), targets(n, v)
    x = logits.float().requires_grad_(mode != "fwd")
    loss = F.cross_entropy(x, target)
    if mode == "fwd":
        return (logits, target, None), loss.detach()
    return (logits, target, [torch.ones((), device=DEVICE, dtype=DTYPE)]), torch.autograd.grad(loss, x)


def lce_reference(hidden, weight, target):
    """(dhidden, dweight) of the mean loss in fp32, a chunk of tokens at a time."""
    n = hidden.shape[0]
    w = weight.float()
    dh, dw = torch.empty(hidden.shape, device=DEVICE), torch.zeros(w.shape, device=DEVICE)
    for start in range(0, n, REFERENCE_CHUNK):
        h = hidden[start:start + REFERENCE_CHUNK].float()
        p = torch.softmax(h @ w.T, dim=-1)
        p[torch.arange(p.shape[0], device=DEVICE), target[start:start + REFERENCE_CHUNK]] -= 1.0
        p /= n
        dh[start:start + REFERENCE_CHUNK] = p @ w
        dw += p.T @ h
    return dh, dw


def lce_setup(n, h, v):
    hidden = torch.randn(n, h, device=DEVICE, dtype=DTYPE)
    weight = (torch.randn(v, h, device=DEVICE) * h ** -0.5).to(DTYPE)
    target = targets(n, v)
    return (hidden, weight, target, [torch.ones((), device=DEVICE, dtype=DTYPE)]), lce_reference(hidden, weight, target)


def bind_train(providers, wrt, mode):
    def bind(name, inputs):
        *tensors, dys = inputs
        if name == LIGER:  # Liger's cross-entropy writes dlogits into its input: its own copy
            tensors = [t.clone() for t in tensors]
        if mode == "fwd":
            return lambda: providers[name](*tensors)
        return train_call(providers[name], tensors, wrt, mode, dys)
    return bind


GRAPHED = ("triton", "eager", "torch.compile")  # fwd+bwd rows: the providers a CUDA graph can capture


def ce_cases(shapes):
    for mode in ("fwd", "fwd+bwd"):
        compiled = compile_fn(eager_ce) if mode == "fwd" else compile_train_fn(eager_ce, mode)
        providers = {"triton": cross_entropy, "eager": eager_ce, "torch.compile": compiled,
                     LIGER: "liger: its kernels do not run in Triton's interpreter" if INTERPRET else liger_ce()}
        for n, v in shapes:
            yield BenchCase("cross_entropy", (n, v), DTYPE, providers, lambda n=n, v=v, mode=mode: ce_setup(n, v, mode),
                       n_bytes=(1 if mode == "fwd" else 3) * n * v * DTYPE.itemsize, mode=mode,
                       peak=mode != "fwd", bind=bind_train(providers, (0,), mode),
                       graph=GRAPHED if mode != "fwd" else ())


def lce_cases(shapes):
    providers = {"triton": fused_linear_cross_entropy, "eager": eager_lce,
                 "torch.compile": compile_train_fn(eager_lce, "fwd+bwd"),
                 LIGER: "liger: its kernels do not run in Triton's interpreter" if INTERPRET else liger_lce()}
    for n, h, v in shapes:
        yield BenchCase("linear_cross_entropy", (n, h, v), DTYPE, providers, lambda n=n, h=h, v=v: lce_setup(n, h, v),
                   flops=6 * n * h * v, mode="fwd+bwd", peak=True, bind=bind_train(providers, (0, 1), "fwd+bwd"),
                   skip_on=(torch.cuda.OutOfMemoryError,), graph=GRAPHED)


def charts(args, ce_shapes, lce_shapes):
    panels = {"cross_entropy": ("GBps", [("vocabulary V (BT x V logits)", [(s[-1], s) for s in ce_shapes])]),
              "linear_cross_entropy": ("TFLOPs", [("vocabulary V ((BT, H) x (V, H))", [(s[-1], s) for s in lce_shapes])])}

    def draw(meta, rows):
        for op, (metric, sweeps) in panels.items():
            sel = [r for r in rows if r["op"] == op and r.get("mode") == "fwd+bwd"]
            plot_sweeps(args.out / f"losses_{op}.png", f"{op} bf16 fwd+bwd", sel, sweeps, meta, metric=metric)
    return draw


def main():
    args = parse_args(__doc__)
    ce_shapes, lce_shapes = (SMOKE_CE_SHAPES, SMOKE_LCE_SHAPES) if args.smoke else (CE_SHAPES, LCE_SHAPES)
    run(args, "losses", charts(args, ce_shapes, lce_shapes),
        cases=lambda: [*ce_cases(ce_shapes), *lce_cases(lce_shapes)])


if __name__ == "__main__":
    main()
