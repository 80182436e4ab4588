"""What autograd keeps after a training forward of the patched model, against Liger-Kernel's and
eager's: every saved tensor's storage but the parameters', once, with its shape and dtype and the autograd node that
saved it, summed per node; the models are benchmarks/train_bench.py's with fewer layers.

    python scripts/saved_tensors.py [--model llama-1.5b] [--layers 2]   (GPU; Liger where importable)
    python scripts/saved_tensors.py --smoke                             (interpreter, tiny model)
"""

import argparse
import collections
import importlib.util

import torch

from llmk.benchmarks.train_bench import MODELS, SMOKE_MODELS, build, prepare
from llmk.common.device import DEVICE

MB = 1e6


def saved_by_node(model, ids):
    """{(node name, shape, dtype): MB} of the distinct storages saved by one forward's graph, the
    parameters left out (they exist before the forward)."""
    seen, sizes = {p.untyped_storage().data_ptr() for p in model.parameters()}, collections.Counter()
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    stack, visited = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_") and attr != "saved_tensors":
                continue
            try:
                value = getattr(node, attr)
            except Exception:  # a saved tensor already freed, or not a tensor
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor) and t.numel():
                    key = t.untyped_storage().data_ptr()
                    if key not in seen:
                        seen.add(key)
                        sizes[(type(node).__name__, tuple(t.shape), str(t.dtype).replace("torch.", ""))] += (
                            t.untyped_storage().nbytes() / MB
                        )
        stack.extend(n for n, _ in node.next_functions)
    return sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--model", default="llama-1.5b")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    models = SMOKE_MODELS if args.smoke else MODELS
    name = next(iter(models)) if args.smoke else args.model
    kind, config = models[name]
    config = dict(config, num_hidden_layers=args.layers)
    batch, seq = (2, 16) if args.smoke else (2, 4096)
    ids = torch.randint(0, config["vocab_size"], (batch, seq), device=DEVICE)
    providers = ["eager", "triton"]
    if not args.smoke and importlib.util.find_spec("liger_kernel") is not None:
        providers.append("liger")
    totals = {}
    for provider in providers:
        model = build(kind, config)
        undo = prepare(model, kind, provider, args.smoke)
        sizes = saved_by_node(model, ids)
        totals[provider] = sum(sizes.values())
        print(f"\n{name} {args.layers} layers, {batch}x{seq}, {provider}: {totals[provider]:.1f} MB saved")
        for (node, shape, dtype), mb in sorted(sizes.items(), key=lambda kv: -kv[1]):
            print(f"  {mb:9.1f} MB  {node:38} {shape} {dtype}")
        if undo is not None:
            undo()
        del model
    print("\ntotals (MB):", {k: round(v, 1) for k, v in totals.items()})


if __name__ == "__main__":
    main()
