"""Where the host time of one forward + backward call of ours goes: cProfile over rmsnorm, swiglu,
matmul, flash_attention, apply_rope and the two losses, each called as benchmarks/host_bench.py's
fwd+bwd rows call it (the same shapes and inputs, and the same call, devtools.bench.train_call: the
forward on leaves that require grad, then torch.autograd.grad of its outputs).

    python scripts/host_profile.py                       (GPU: 500 profiled calls an op)
    python scripts/host_profile.py --smoke               (interpreter, tiny shapes, 3 calls: the code runs)
    python scripts/host_profile.py --ops matmul,swiglu --calls 1000 --top 40

For each op: warm-up calls (Triton's compile and autotuning, torch's caches), then CALLS calls timed
without the profiler (CPU us a call, as host_bench times it) and CALLS more under cProfile, then the
top functions by cumulative time and by own time, in microseconds per op call.

Two threads do the work. The calling thread runs the forward, then waits in autograd's
run_backward; the backward of CUDA tensors (our autograd.Function's backward, its checks, its
launches) runs on autograd's worker thread for the device, which a profiler started on the calling
thread does not see. So a second profiler runs on that thread, started and stopped from hooks of a
one-element backward on the same device, and each op gets two pairs of tables. In the interpreter
the tensors are on the CPU and the backward runs on the calling thread: one pair. So too from
Python 3.12, where cProfile listens through sys.monitoring, which is process-wide: one profiler
sees both threads, the backward's calls nested under run_backward, where the calling thread waits.

cProfile adds about a microsecond to every Python call it sees, so the profiled totals are larger
than the plain figure, and Python-heavy paths (Triton's JITFunction.run binding its arguments,
autograd.Function.apply, our argument checks) are inflated against C++ ones (allocation, the launch
itself): read the split, not the absolute figures.
"""

import argparse
import cProfile
import pathlib
import pstats
import sys
import sysconfig
import threading

import torch

from llmk.benchmarks.host_bench import FULL, SMOKE, TRAIN_MODE, train_cases
from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.bench import host_time_us, train_call

ROOT = pathlib.Path(__file__).resolve().parents[1]
STDLIB = pathlib.Path(sysconfig.get_paths()["stdlib"]).resolve()
OPS = ("rmsnorm", "swiglu", "matmul", "flash_attention", "apply_rope", "cross_entropy", "fused_linear_cross_entropy")


def where(key):
    """A pstats key (file, line, function) as a short location: the repository's files relative to
    its root, installed packages from their package, built-ins by name."""
    path, line, function = key
    if path == "~":  # a built-in: pstats names it "<built-in method ...>" or "<method ... objects>"
        return function
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return f"{path.split(marker, 1)[1]}:{line}({function})"
    for base in (ROOT, STDLIB):
        try:
            return f"{pathlib.Path(path).resolve().relative_to(base)}:{line}({function})"
        except ValueError:
            pass
    return f"{path}:{line}({function})"


def top(stats, calls, sort, n):
    """The n functions with the largest `sort` ("cumulative" or "tottime"), per op call."""
    index = 3 if sort == "cumulative" else 2  # pstats' (primitive calls, calls, tottime, cumtime, callers)
    entries = sorted(stats.stats.items(), key=lambda item: item[1][index], reverse=True)[:n]
    lines = [f"  {'calls':>7s} {'own us':>9s} {'cum us':>9s}  function  (per op call)"]
    for key, (_, ncalls, tottime, cumtime, _) in entries:
        lines.append(f"  {ncalls / calls:7.2f} {tottime / calls * 1e6:9.2f} {cumtime / calls * 1e6:9.2f}  {where(key)}")
    return lines


def on_backward_thread(action):
    """Run action() on the thread that runs the backward of DEVICE's tensors, from the hook of a
    one-element backward there; returns that thread's id."""
    thread = []

    def hook(grad):
        thread.append(threading.get_ident())
        action()

    x = torch.zeros(1, device=DEVICE, requires_grad=True)
    y = x * 1
    y.register_hook(hook)
    torch.autograd.grad(y, x, torch.ones_like(y))
    return thread[0]


def profile(call, calls):
    """{thread: pstats.Stats} of `calls` calls of `call`: "calling" and, where the backward runs on
    a thread of its own (CUDA tensors), "backward". The GPU's queue is drained before and after."""
    sync = (lambda: None) if INTERPRET else torch.cuda.synchronize
    calling, backward = cProfile.Profile(), cProfile.Profile()
    separate = (
        not INTERPRET and sys.version_info < (3, 12) and on_backward_thread(lambda: None) != threading.get_ident()
    )
    sync()
    if separate:
        on_backward_thread(backward.enable)
    calling.enable()
    for _ in range(calls):
        call()
    calling.disable()
    if separate:
        on_backward_thread(backward.disable)
    sync()
    stats = {"calling": pstats.Stats(calling)}
    if separate:
        stats["backward"] = pstats.Stats(backward)
    return stats


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.strip().splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.strip().splitlines()[1:]),
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, any device, few calls (numbers meaningless)")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma list of {', '.join(OPS)} (default: all)")
    parser.add_argument("--calls", type=int, default=None, help="profiled calls an op (default 500; smoke 3)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls an op (default 20; smoke 1)")
    parser.add_argument("--top", type=int, default=25, help="functions listed in each table (default 25)")
    args = parser.parse_args()
    ops = [op for op in args.ops.split(",") if op]
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        parser.error(f"--ops: unknown {', '.join(unknown)}; expected a comma list of {', '.join(OPS)}")
    if not args.smoke and INTERPRET:
        print(
            f"{parser.prog}: no CUDA GPU here; the profile needs one (use --smoke to run the code on tiny shapes)",
            file=sys.stderr,
        )
        sys.exit(2)
    calls = args.calls or (3 if args.smoke else 500)
    warmup = args.warmup or (1 if args.smoke else 20)
    shapes = SMOKE if args.smoke else FULL
    cases = {case.op: case for case in train_cases(shapes) if case.op in ops}

    for op in ops:
        case = cases[op]
        inputs, wrt, providers = case.build()
        call = train_call(providers["public"], inputs, wrt, TRAIN_MODE)
        with torch.enable_grad():
            for _ in range(warmup):
                call()
            plain = host_time_us(call, calls=calls, rounds=1)
            threads = profile(call, calls)
        profiled = ", ".join(f"{s.total_tt / calls * 1e6:.1f} us on the {name} thread" for name, s in threads.items())
        print(
            f"\n=== {op} {case.shape} bf16, {TRAIN_MODE}: {plain:.1f} CPU us a call unprofiled; profiled "
            f"({calls} calls): {profiled}"
        )
        for name, stats in threads.items():
            for sort, title in (("cumulative", "by cumulative time"), ("tottime", "by own time")):
                print(f"\n{op}, {name} thread, top {args.top} {title}:")
                print("\n".join(top(stats, calls, sort, args.top)), flush=True)


if __name__ == "__main__":
    main()
