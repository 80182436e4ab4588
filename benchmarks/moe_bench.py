"""Mixture-of-experts experts layer: moe_experts (moe/moe_experts_ops.py: gate/up, SwiGLU, down and the
weighted sum back to the tokens as grouped GEMMs) against transformers' experts implementations
and Liger-Kernel's fused MoE, as TFLOP/s on the routed tokens.

Shapes (T tokens, hidden H, expert width I, E experts, top-k), bf16, routing from moe_route on
random router logits (softmax, renormalized):
    Qwen3-30B-A3B widths  H 2048, I 768, E 128, top-8: T 4096, 16384, 32768; decode T 1, 16, 64
    Mixtral widths        H 4096, I 14336, E 8, top-2: T 4096
FLOPs on the routed rows S = T * top_k: 6 * S * H * I forward (gate/up 4 S H I, down 2 S H I),
18 * S * H * I forward+backward (each GEMM gives an input and a weight gradient). Decode rows also
state bytes: the weights of the experts a batch reaches, E * (1 - (1 - 1/E)^S) of them on average,
3 * H * I elements each, plus x and the output, against the copy bandwidth (they are bound by it).

Providers: triton (ours); eager, transformers' loop over the experts hit (`experts_implementation`
"eager"); grouped_mm, transformers' `torch._grouped_mm` form ("grouped_mm", its default); liger,
Liger-Kernel's LigerFusedMoEFunction (skipped where not installed); torch.compile of the
grouped_mm form. The eager and grouped_mm rows run transformers' own Qwen3MoeExperts module (skipped
without transformers). dense-per-expert rows: cuBLAS (`F.linear`, SiLU * up, `F.linear`) on one
expert's share of a Mixtral batch, S / E rows: the dense GEMM of the same per-expert size, which a
grouped GEMM at Mixtral's widths is measured against. max_err: against the eager loop in fp32
(moe/reference_moe.py's experts_ref).

Training rows (mode "fwd+bwd", peak_MB): the gradients of x, the routing weights and both weight
tensors against autograd through the fp32 reference, one set of upstream gradients for every
provider.
    python benchmarks/moe_bench.py            (GPU; writes benchmarks/results/moe.json and PNGs)
    python benchmarks/moe_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/moe_bench.py --only qwen3 --mode fwd   (a subset)
"""

import torch
import torch.nn.functional as F

from llmk.common.device import INTERPRET
from llmk.devtools.bench import compile_fn, train_call
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.peers import LIGER, liger_moe
from llmk.devtools.results import plot_sweeps
from llmk.devtools.testing import grads_of, rand
from llmk.moe.moe_experts_ops import moe_experts
from llmk.moe.reference_moe import experts_ref
from llmk.moe.triton_moe_routing import moe_route

DTYPE = torch.bfloat16
# model -> (H, I, E, top_k), and the token counts of its forward, decode and fwd+bwd rows
MODELS = {
    "qwen3-30b-a3b": ((2048, 768, 128, 8), (4096, 16384, 32768), (1, 16, 64), (4096, 16384)),
    "mixtral-8x7b": ((4096, 14336, 8, 2), (4096,), (), (4096,)),
}
SMOKE_MODELS = {
    "qwen3-30b-a3b": ((64, 32, 8, 2), (13,), (1,), (13,)),
    "mixtral-8x7b": ((64, 48, 4, 2), (9,), (), ()),
}  # the training path runs in the first
WRT = (0, 1, 3, 4)  # x, weights, w_gate_up, w_down


def layer_inputs(t, h, inter, e, k):
    """x (T, H), routing (weights fp32, ids int32) from moe_route, weights scaled so that every
    stage is O(1)."""
    weights, ids = moe_route(rand((t, e), torch.float32), k)
    return (
        rand((t, h), DTYPE),
        weights,
        ids,
        rand((e, 2 * inter, h), DTYPE, scale=h**-0.5),
        rand((e, h, inter), DTYPE, scale=inter**-0.5),
    )


def reference(x, weights, ids, w_gate_up, w_down):
    return experts_ref(x, weights, ids, w_gate_up, w_down, dtype=torch.float32)


def hf_experts(implementation):
    """transformers' Qwen3MoeExperts run through its experts implementation `implementation`, as a
    function of (x, weights, ids, w_gate_up, w_down); or why it is unavailable. One module a
    weight shape, made at its first call (on the meta device: the case's tensors take the place of
    its parameters, leaves in training rows), so that the timed calls hold no set-up."""
    try:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    except Exception as e:
        return f"transformers unavailable: {type(e).__name__}"
    modules = {}

    def module_for(e, two_i, h):
        if (e, two_i, h) not in modules:
            config = Qwen3MoeConfig(hidden_size=h, moe_intermediate_size=two_i // 2, num_experts=e, hidden_act="silu")
            config._experts_implementation = implementation
            with torch.device("meta"):
                module = Qwen3MoeExperts(config)
            del module.gate_up_proj, module.down_proj
            modules[(e, two_i, h)] = module
        return modules[(e, two_i, h)]

    def call(x, weights, ids, w_gate_up, w_down):
        module = module_for(*w_gate_up.shape)
        module.gate_up_proj, module.down_proj = w_gate_up, w_down
        return module(x, ids.long(), weights.to(x.dtype))

    return call


def liger_provider():
    fn = liger_moe() if not INTERPRET else "liger: its kernels do not run in Triton's interpreter"
    return (
        fn
        if isinstance(fn, str)
        else (lambda x, weights, ids, w_gate_up, w_down: fn(x, w_gate_up, w_down, ids.int(), weights.to(x.dtype)))
    )


def providers():
    grouped = hf_experts("grouped_mm")
    return {
        "triton": moe_experts,
        "eager": hf_experts("eager"),
        "grouped_mm": grouped,
        LIGER: liger_provider(),
        "torch.compile": grouped if isinstance(grouped, str) else compile_fn(grouped),
    }


def routed_flops(t, h, inter, k, mode):
    return (18 if mode == "fwd+bwd" else 6) * t * k * h * inter


def decode_bytes(t, h, inter, e, k):
    """The expected bytes of a decode batch: the weights of the experts it reaches, x and the output."""
    reached = e * (1 - (1 - 1 / e) ** (t * k))
    return round(reached * 3 * h * inter * DTYPE.itemsize + 2 * t * h * DTYPE.itemsize)


def setup(t, h, inter, e, k):
    inputs = layer_inputs(t, h, inter, e, k)
    return inputs, reference(*inputs)


def train_setup(t, h, inter, e, k):
    """(inputs + (upstream gradient,), the fp32 reference's gradients)."""
    inputs = layer_inputs(t, h, inter, e, k)
    dys = [rand((t, h), DTYPE)]
    _, grads = grads_of(reference, inputs, WRT, dys, dtype=torch.float32)
    return inputs + (dys,), grads


def bind_train(fns):
    def bind(name, inputs):
        *tensors, dys = inputs
        return train_call(fns[name], tensors, WRT, "fwd+bwd", dys)

    return bind


def dense_per_expert(x, w_gate_up, w_down):
    """One expert's gated MLP in cuBLAS: x (rows, H), w_gate_up (2I, H), w_down (H, I)."""
    gate, up = F.linear(x, w_gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, w_down)


def dense_setup(rows, h, inter):
    inputs = (
        rand((rows, h), DTYPE),
        rand((2 * inter, h), DTYPE, scale=h**-0.5),
        rand((h, inter), DTYPE, scale=inter**-0.5),
    )
    return inputs, dense_per_expert(*(t.float() for t in inputs))


def cases(models):
    fns = providers()
    for model, ((h, inter, e, k), forward, decode, training) in models.items():
        for t in forward + decode:
            yield BenchCase(
                model,
                (t, h, inter, e, k),
                DTYPE,
                fns,
                lambda a=(t, h, inter, e, k): setup(*a),
                flops=routed_flops(t, h, inter, k, "fwd"),
                n_bytes=decode_bytes(t, h, inter, e, k) if t in decode else None,
            )
        for t in training:
            yield BenchCase(
                model,
                (t, h, inter, e, k),
                DTYPE,
                fns,
                lambda a=(t, h, inter, e, k): train_setup(*a),
                flops=routed_flops(t, h, inter, k, "fwd+bwd"),
                mode="fwd+bwd",
                peak=True,
                bind=bind_train(fns),
            )
        if model.startswith("mixtral"):
            rows = forward[0] * k // e
            yield BenchCase(
                "dense-per-expert",
                (rows, h, inter),
                DTYPE,
                {"cuBLAS": dense_per_expert},
                lambda a=(rows, h, inter): dense_setup(*a),
                flops=6 * rows * h * inter,
            )


def charts(args, models):
    def draw(meta, rows):
        for model, ((h, inter, e, k), forward, decode, training) in models.items():
            for mode, tokens in (("fwd", forward), ("fwd+bwd", training)):
                sel = [r for r in rows if r["op"] == model and r.get("mode", "fwd") == mode]
                sweeps = [
                    (f"tokens T (H {h}, I {inter}, {e} experts, top-{k})", [(t, (t, h, inter, e, k)) for t in tokens])
                ]
                plot_sweeps(
                    args.out / f"moe_{model}_{mode.replace('+', '_')}.png",
                    f"{model} experts {mode}",
                    sel,
                    sweeps,
                    meta,
                    metric="TFLOPs",
                )

    return draw


def main():
    args = parse_args(__doc__)
    models = SMOKE_MODELS if args.smoke else MODELS
    run(args, "moe", charts(args, models), cases=lambda: list(cases(models)))


if __name__ == "__main__":
    main()
