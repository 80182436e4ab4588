"""What is allocated at the peak of one training step: benchmarks/train_bench.py's model and step,
each provider's memory history replayed, and the blocks live at its highest point listed by the
code that allocated them (the first frame outside torch), summed per place.

    python scripts/step_memory.py [--model llama-1.5b] [--providers triton+bf16-state,liger]   (GPU)

The history (torch.cuda.memory._record_memory_history) starts before the model is built, so every
live block has its allocation's Python stack; a second step is the one read, after a first one
has made the optimizer's state. Prints, per provider, the peak, the phase it fell in and the places
holding the most at that moment; then each place's difference between the first two providers.
"""

import argparse
import collections

import torch

from llmk.benchmarks.train_bench import MODELS, batches, build, optimizer, prepare, release

MB = 1e6
OWN = ("/torch/", "/contextlib.py", "/functools.py")  # frames that say nothing about who allocated


def place(frames):
    """'file:line function' of the first frame (innermost first) outside torch, with the torch
    frame under it when there is one (say, which functional op)."""
    inner = None
    for f in frames:
        name = f["filename"]
        if any(s in name for s in OWN) and "torch/nn/functional.py" not in name:
            inner = inner or f
            continue
        here = f"{'/'.join(name.split('/')[-2:])}:{f['line']} {f['name']}"
        return here + (f" <- {inner['name']}" if inner is not None else "")
    return "(no Python frame)"


def peak_blocks(trace, start):
    """Replay one device's trace: (peak bytes, index of the event at the peak, {addr: (size,
    frames)} live then), the peak searched from event `start` on."""
    live, total, best = {}, 0, (-1, -1, {})
    for i, ev in enumerate(trace):
        action = ev["action"]
        if action == "alloc":
            live[ev["addr"]] = (ev["size"], ev.get("frames", []))
            total += ev["size"]
            if i >= start and total > best[0]:
                best = (total, i, dict(live))
        elif action == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    return best


def measure(kind, config, provider, ids):
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=4_000_000)
    model = build(kind, config)
    undo = prepare(model, kind, provider, smoke=False)
    opt = optimizer(model, provider, 1e-4)
    marks = {}

    def step(mark):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        if mark:
            torch.cuda.synchronize()
            marks["fwd"] = len(torch.cuda.memory._snapshot()["device_traces"][ids.device.index or 0])
        loss.backward()
        if mark:
            torch.cuda.synchronize()
            marks["bwd"] = len(torch.cuda.memory._snapshot()["device_traces"][ids.device.index or 0])
        opt.step()

    step(False)
    torch.cuda.synchronize()
    marks["start"] = len(torch.cuda.memory._snapshot()["device_traces"][ids.device.index or 0])
    step(True)
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][ids.device.index or 0]
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, at, live = peak_blocks(trace, marks["start"])
    phase = "forward" if at < marks["fwd"] else "backward" if at < marks["bwd"] else "optimizer"
    by_place = collections.Counter()
    for size, frames in live.values():
        by_place[place(frames)] += size
    del model, opt
    release(undo)
    return peak, phase, by_place


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1.5b")
    parser.add_argument("--providers", default="triton+bf16-state,liger")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    kind, config = MODELS[args.model]
    ids = batches(config["vocab_size"], dict(batch=2, seq=4096), 1)[0]
    results = {}
    for provider in args.providers.split(","):
        peak, phase, by_place = measure(kind, config, provider, ids)
        results[provider] = by_place
        print(f"\n{args.model} {provider}: peak {peak / MB:.1f} MB, in the {phase}")
        for where, size in by_place.most_common(args.top):
            print(f"  {size / MB:9.1f} MB  {where}")
    names = list(results)
    if len(names) >= 2:
        a, b = (results[n] for n in names[:2])
        print(f"\n{names[0]} - {names[1]}, by place (MB), differences past 1 MB:")
        diffs = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}
        for where, d in sorted(diffs.items(), key=lambda kv: -abs(kv[1])):
            if abs(d) > MB:
                print(f"  {d / MB:+9.1f}  {where}")


if __name__ == "__main__":
    main()
