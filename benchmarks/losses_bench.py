"""Losses: cross-entropy over logits, and the LM head's linear layer fused with it, against PyTorch
eager, torch.compile and Liger-Kernel, with the peak memory of each call.

    cross_entropy         logits (BT, V) bf16 -> mean loss; GB/s and % of copy:
                          fwd: read the logits, N*V*e;  fwd+bwd: read them twice, write dlogits, 3*N*V*e
    linear_cross_entropy  hidden (BT, H) and weight (V, H) bf16, both requiring grad -> mean loss,
                          fwd+bwd; TFLOP/s of its three GEMMs, 6*BT*H*V FLOPs
Providers: triton (losses/triton_cross_entropy.py, losses/fused_linear_cross_entropy_ops.py); eager (logits in
bf16, then F.cross_entropy on them: what a model's loss does); torch.compile of eager; liger
(LigerCrossEntropyFunction, LigerFusedLinearCrossEntropyFunction; skipped where not installed).
peak_MB: the memory a call adds beyond its inputs (logits, gradients, scratch); Liger's
cross-entropy writes dlogits into its input and allocates none. fwd+bwd rows also give graph_ms
(GPU time, common.timing.graph_time_ms) for every provider but Liger's: its losses read the count of
targets on the host (.item()), which a CUDA graph cannot capture (a failed capture leaves the
process's CUDA state unusable). max_err: the gradients against an
fp32 reference (for linear_cross_entropy computed in chunks of tokens, no (BT, V) matrix in fp32).

Options rows (fwd+bwd, the mean loss, at V 128256 / the Llama 3 head): "z-loss" (lse_square_scale
1e-4, PaLM's) and "class weight" (a (V,) fp32 weight), for cross_entropy (ops "cross_entropy z-loss",
"cross_entropy class weight": the same 3*N*V*e bytes, the weights' 4V bytes read from L2 by every
row not counted) and linear_cross_entropy (the same 6*BT*H*V FLOPs), against eager/compiled
PyTorch with the same option (F.cross_entropy's weight=; z-loss: s * logsumexp(logits)^2 on the
bf16 logits, the mean over the targets) and Liger with it (LigerCrossEntropyFunction /
LigerFusedLinearCrossEntropyFunction with lse_square_scale= or weight= / ce_weight=).

Shapes: BT 8192 with V 32000, 128256 and 151936 for cross_entropy; (8192, 4096, 128256) and
(16384, 4096, 151936) for linear_cross_entropy (Llama 3 and Qwen2 heads).
    python benchmarks/losses_bench.py            (GPU; benchmarks/results/losses.json and PNGs)
    python benchmarks/losses_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
"""

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.bench import compile_fn, compile_train_fn, train_call
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.peers import LIGER, liger, liger_ce, liger_lce
from llmk.devtools.results import plot_sweeps
from llmk.losses.fused_linear_cross_entropy_ops import fused_linear_cross_entropy
from llmk.losses.triton_cross_entropy import cross_entropy

DTYPE = torch.bfloat16
CE_SHAPES = [(8192, 32000), (8192, 128256), (8192, 151936)]
LCE_SHAPES = [(8192, 4096, 128256), (16384, 4096, 151936)]
SMOKE_CE_SHAPES = [(16, 300)]
SMOKE_LCE_SHAPES = [(24, 32, 300)]
REFERENCE_CHUNK = 1024  # tokens a chunk of the fp32 reference


Z_LOSS = 1e-4  # lse_square_scale of the z-loss rows (PaLM's)
OPTIONS = {"z-loss": dict(lse_square_scale=Z_LOSS), "class weight": dict(weight=True)}


def eager_ce(logits, target, weight=None, lse_square_scale=0.0):
    loss = F.cross_entropy(logits, target, weight=None if weight is None else weight.to(logits.dtype))
    if lse_square_scale:
        loss = loss + lse_square_scale * torch.logsumexp(logits, -1).square().mean()
    return loss


def eager_lce(hidden, weight, target, class_weight=None, lse_square_scale=0.0):
    return eager_ce(hidden @ weight.T, target, class_weight, lse_square_scale)


def class_weight_of(v):
    return torch.rand(v, device=DEVICE) + 0.5


def targets(n, v):
    return torch.randint(0, v, (n,), device=DEVICE)


def ce_setup(n, v, mode, weighted=False, lse_square_scale=0.0):
    logits, target = torch.randn(n, v, device=DEVICE, dtype=DTYPE), targets(n, v)
    weight = class_weight_of(v) if weighted else None
    x = logits.float().requires_grad_(mode != "fwd")
    loss = eager_ce(x, target, weight, lse_square_scale)
    extra = [weight] if weighted else []
    if mode == "fwd":
        return (logits, target, *extra, None), loss.detach()
    return (logits, target, *extra, [torch.ones((), device=DEVICE, dtype=DTYPE)]), torch.autograd.grad(loss, x)


def lce_reference(hidden, weight, target, class_weight=None, lse_square_scale=0.0):
    """(dhidden, dweight) of the mean loss in fp32, a chunk of tokens at a time (no target ignored):
    dlogits = c_t (p - onehot) + 2 s lse p / n, c_t = 1 / n or w_t / sum of the targets' w."""
    n = hidden.shape[0]
    w = weight.float()
    row_weight = torch.ones(n, device=DEVICE) if class_weight is None else class_weight[target]
    coef = row_weight / row_weight.sum()
    dh, dw = torch.empty(hidden.shape, device=DEVICE), torch.zeros(w.shape, device=DEVICE)
    for start in range(0, n, REFERENCE_CHUNK):
        rows = slice(start, start + REFERENCE_CHUNK)
        h = hidden[rows].float()
        logits = h @ w.T
        p = torch.softmax(logits, dim=-1)
        g = p * coef[rows, None]
        g[torch.arange(p.shape[0], device=DEVICE), target[rows]] -= coef[rows]
        if lse_square_scale:
            g += p * (2 * lse_square_scale / n * torch.logsumexp(logits, -1))[:, None]
        dh[rows] = g @ w
        dw += g.T @ h
    return dh, dw


def lce_setup(n, h, v, weighted=False, lse_square_scale=0.0):
    hidden = torch.randn(n, h, device=DEVICE, dtype=DTYPE)
    weight = (torch.randn(v, h, device=DEVICE) * h**-0.5).to(DTYPE)
    target = targets(n, v)
    class_weight = class_weight_of(v) if weighted else None
    extra = [class_weight] if weighted else []
    return (hidden, weight, target, *extra, [torch.ones((), device=DEVICE, dtype=DTYPE)]), lce_reference(
        hidden, weight, target, class_weight, lse_square_scale
    )


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
        providers = {
            "triton": cross_entropy,
            "eager": eager_ce,
            "torch.compile": compiled,
            LIGER: "liger: its kernels do not run in Triton's interpreter" if INTERPRET else liger_ce(),
        }
        for n, v in shapes:
            yield BenchCase(
                "cross_entropy",
                (n, v),
                DTYPE,
                providers,
                lambda n=n, v=v, mode=mode: ce_setup(n, v, mode),
                n_bytes=(1 if mode == "fwd" else 3) * n * v * DTYPE.itemsize,
                mode=mode,
                peak=mode != "fwd",
                bind=bind_train(providers, (0,), mode),
                graph=GRAPHED if mode != "fwd" else (),
            )


def lce_cases(shapes):
    providers = {
        "triton": fused_linear_cross_entropy,
        "eager": eager_lce,
        "torch.compile": compile_train_fn(eager_lce, "fwd+bwd"),
        LIGER: "liger: its kernels do not run in Triton's interpreter" if INTERPRET else liger_lce(),
    }
    for n, h, v in shapes:
        yield BenchCase(
            "linear_cross_entropy",
            (n, h, v),
            DTYPE,
            providers,
            lambda n=n, h=h, v=v: lce_setup(n, h, v),
            flops=6 * n * h * v,
            mode="fwd+bwd",
            peak=True,
            bind=bind_train(providers, (0, 1), "fwd+bwd"),
            skip_on=(torch.cuda.OutOfMemoryError,),
            graph=GRAPHED,
        )


def liger_with(module, name, call):
    """A Liger-Kernel autograd.Function's apply, bound by `call`; or why it is unavailable."""
    if INTERPRET:
        return "liger: its kernels do not run in Triton's interpreter"
    fn = liger(module, name)
    return fn if isinstance(fn, str) else call(fn.apply)


# Liger's positional arguments (0.8.5): CE (input, target, weight, ignore_index, lse_square_scale, label_smoothing,
# reduction, softcap, return_z_loss, ...); FLCE (input, weight, target, bias, ce_weight, ignore_index,
# lse_square_scale, ...)
LIGER_CE = {
    "z-loss": lambda f: lambda logits, target: f(logits, target, None, -100, Z_LOSS)[0],
    "class weight": lambda f: lambda logits, target, w: f(logits, target, w)[0],
}
LIGER_LCE = {
    "z-loss": lambda f: lambda hidden, weight, target: f(hidden, weight, target, None, None, -100, Z_LOSS)[0],
    "class weight": lambda f: lambda hidden, weight, target, w: f(hidden, weight, target, None, w)[0],
}


def option_cases(ce_shape, lce_shape):
    """fwd+bwd rows of each option in OPTIONS, beside the plain rows (module docstring)."""
    for label, option in OPTIONS.items():
        weighted, z = "weight" in option, option.get("lse_square_scale", 0.0)
        if weighted:
            ours_ce = lambda logits, target, w: cross_entropy(logits, target, weight=w)  # noqa: E731
            ours_lce = lambda hidden, weight, target, w: fused_linear_cross_entropy(  # noqa: E731
                hidden, weight, target, class_weight=w
            )
            eager_c, eager_l = eager_ce, eager_lce
        else:
            ours_ce = lambda logits, target: cross_entropy(logits, target, lse_square_scale=Z_LOSS)  # noqa: E731
            ours_lce = lambda hidden, weight, target: fused_linear_cross_entropy(  # noqa: E731
                hidden, weight, target, lse_square_scale=Z_LOSS
            )
            eager_c = lambda logits, target: eager_ce(logits, target, None, Z_LOSS)  # noqa: E731
            eager_l = lambda hidden, weight, target: eager_lce(hidden, weight, target, None, Z_LOSS)  # noqa: E731
        providers = {
            "triton": ours_ce,
            "eager": eager_c,
            "torch.compile": compile_train_fn(eager_c, "fwd+bwd"),
            LIGER: liger_with("cross_entropy", "LigerCrossEntropyFunction", LIGER_CE[label]),
        }
        n, v = ce_shape
        yield BenchCase(
            f"cross_entropy {label}",
            (n, v),
            DTYPE,
            providers,
            lambda n=n, v=v, w=weighted, z=z: ce_setup(n, v, "fwd+bwd", w, z),
            n_bytes=3 * n * v * DTYPE.itemsize,
            mode="fwd+bwd",
            peak=True,
            bind=bind_train(providers, (0,), "fwd+bwd"),
            graph=GRAPHED,
        )
        providers = {
            "triton": ours_lce,
            "eager": eager_l,
            "torch.compile": compile_train_fn(eager_l, "fwd+bwd"),
            LIGER: liger_with("fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyFunction", LIGER_LCE[label]),
        }
        n, h, v = lce_shape
        yield BenchCase(
            f"linear_cross_entropy {label}",
            (n, h, v),
            DTYPE,
            providers,
            lambda n=n, h=h, v=v, w=weighted, z=z: lce_setup(n, h, v, w, z),
            flops=6 * n * h * v,
            mode="fwd+bwd",
            peak=True,
            bind=bind_train(providers, (0, 1), "fwd+bwd"),
            skip_on=(torch.cuda.OutOfMemoryError,),
            graph=GRAPHED,
        )


def charts(args, ce_shapes, lce_shapes):
    panels = {
        "cross_entropy": ("GBps", [("vocabulary V (BT x V logits)", [(s[-1], s) for s in ce_shapes])]),
        "linear_cross_entropy": ("TFLOPs", [("vocabulary V ((BT, H) x (V, H))", [(s[-1], s) for s in lce_shapes])]),
    }

    def draw(meta, rows):
        for op, (metric, sweeps) in panels.items():
            sel = [r for r in rows if r["op"] == op and r.get("mode") == "fwd+bwd"]
            plot_sweeps(args.out / f"losses_{op}.png", f"{op} bf16 fwd+bwd", sel, sweeps, meta, metric=metric)

    return draw


def main():
    args = parse_args(__doc__)
    ce_shapes, lce_shapes = (SMOKE_CE_SHAPES, SMOKE_LCE_SHAPES) if args.smoke else (CE_SHAPES, LCE_SHAPES)
    run(
        args,
        "losses",
        charts(args, ce_shapes, lce_shapes),
        cases=lambda: [
            *ce_cases(ce_shapes),
            *lce_cases(lce_shapes),
            *option_cases(ce_shapes[1 % len(ce_shapes)], lce_shapes[0]),
        ],
    )


if __name__ == "__main__":
    main()
