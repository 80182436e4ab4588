"""The benchmarks' measuring beyond common/timing.py's clocks (time_ms: `triton.testing.do_bench`
medians; graph_time_ms: GPU time with the host out of the loop): host time a call, the training
call and its peak memory, torch.compile baselines, and the roofline math. Every kernel is reported
against the device-to-device copy bandwidth measured in the same run, counting bytes read plus
bytes written, because absolute figures move between machines. In smoke mode (the interpreter on
CPU) a host clock stands in: the numbers then mean nothing and only prove the benchmark code runs.
"""

import re
import time

import torch

from llmk.common.device import DEVICE, INTERPRET
from llmk.common.timing import time_ms
from llmk.devtools.testing import COMPILE_BACKEND


def host_time_us(fn, calls=200, rounds=3):
    """CPU microseconds of one call of `fn`: `calls` calls without a sync, best of `rounds` (after
    a warm-up call). Meaningful where the GPU work of a call is shorter than its host work, so that
    launches do not wait for a full queue."""
    fn()
    if not INTERPRET:
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        if not INTERPRET:
            torch.cuda.synchronize()
    return best


def train_call(fn, inputs, wrt, mode, grad_outputs=None):
    """The call a training-mode benchmark row times, on `inputs` whose positions `wrt` get
    gradients (leaves that require grad, made here; the other inputs pass as they are).

    mode "fwd+bwd": fn(*inputs), then torch.autograd.grad of its outputs with grad_outputs.
    mode "bwd": fn(*inputs) once, here; the call is only the backward, retain_graph=True.
    grad_outputs: upstream gradients, one per output (default: fixed normal values, made here).
    Returns the call; it returns the gradients in `wrt`'s order (compared with the reference's).
    """
    leaves = [a.detach().requires_grad_() if i in wrt else a for i, a in enumerate(inputs)]
    wanted = [leaves[i] for i in wrt]

    def forward():
        out = fn(*leaves)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    if grad_outputs is None:
        with torch.no_grad():
            grad_outputs = [torch.randn(o.shape, device=o.device).to(o.dtype) for o in forward()]
    if mode == "fwd+bwd":
        return lambda: torch.autograd.grad(forward(), wanted, grad_outputs)
    if mode == "bwd":
        outs = forward()
        return lambda: torch.autograd.grad(outs, wanted, grad_outputs, retain_graph=True)
    raise ValueError(f"mode: expected 'fwd+bwd' or 'bwd', got {mode!r}")


def peak_extra_MB(call):
    """Peak memory of one call above what was allocated before it, in MB (1e6 bytes): its
    outputs, the tensors autograd saves, the gradients it returns and any scratch. The inputs,
    parameters and upstream gradients exist before the call and do not count. None without CUDA."""
    if INTERPRET:
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return round(peak / 1e6, 1)


# attention's kernels in a profile: SDPA's (cuDNN, flash, memory-efficient) and ours (the tl and Gluon
# forwards, the backward's preprocess, dk/dv and dq kernels)
ATTENTION_KERNEL = re.compile(r"flash|fmha|attention|sdpa|dkdv|_dq_kernel|_preprocess_kernel", re.IGNORECASE)


def kernel_times(prof):
    """(source, [(name, us)]): a torch.profiler profile's CUDA kernels, their self time summed by
    name. On the CPU (smoke) the aten ops' self times stand in for kernels."""
    from torch.autograd import DeviceType

    events = prof.key_averages()
    # a record_function range (Optimizer.step#AdamW.step, say) shows on the GPU's timeline too, over
    # the kernels it holds: not a kernel
    gpu = [
        (e.key, e.self_device_time_total)
        for e in events
        if e.device_type == DeviceType.CUDA
        and e.self_device_time_total > 0
        and not getattr(e, "is_user_annotation", False)
    ]
    if gpu:
        return "CUDA kernels", gpu
    return "CPU aten ops", [(e.key, e.self_cpu_time_total) for e in events if e.key.startswith("aten::")]


def kernel_share(prof, match, exclude=None):
    """The time of the kernels of a torch.profiler profile (kernel_times) whose names `match` (a
    compiled regex) finds and `exclude` does not, over all kernel time, and the top kernels:
    {"source", "ms", "total_ms", "share", "top"}."""
    source, timed = kernel_times(prof)
    total = sum(t for _, t in timed)
    picked = sum(t for name, t in timed if match.search(name) and not (exclude and exclude.search(name)))
    top = sorted(timed, key=lambda kt: -kt[1])[:6]
    return {
        "source": source,
        "ms": round(picked / 1e3, 3),
        "total_ms": round(total / 1e3, 3),
        "share": round(picked / total, 3) if total else None,
        "top": [[name[:90], round(t / 1e3, 3)] for name, t in top],
    }


def gbps(n_bytes, ms):
    return n_bytes / (ms * 1e-3) / 1e9


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def copy_bandwidth_GBps(n_bytes=1 << 30):
    """Device-to-device copy of `n_bytes` (far past L2), reported as (read + written) bytes / time."""
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return gbps(2 * n_bytes, ms)


def compile_fn(fn):
    """`torch.compile` baseline: static shapes (the strongest kernels Inductor makes), default mode,
    and a recompile limit high enough for a shape sweep; COMPILE_BACKEND's backend (aot_eager in
    make bench-smoke's interpreter, whose numbers mean nothing: Inductor's C++ builds were half of
    its time)."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    return torch.compile(fn, dynamic=False, backend=COMPILE_BACKEND)


def compile_train_fn(fn, mode):
    """The torch.compile baseline of a training-mode row. "bwd" rows run one graph's backward many
    times (retain_graph=True), which AOTAutograd's donated buffers (the backward freeing saved
    tensors as it goes) do not allow: that compile goes without them, of fn wrapped, as Dynamo
    caches compiled graphs by code object and fn's own would hold the graphs compiled with them."""
    if mode != "bwd":
        return compile_fn(fn)
    compiled = compile_fn(lambda *args: fn(*args))

    def call(*args):
        with torch._functorch.config.patch(donated_buffer=False):
            return compiled(*args)

    return call
