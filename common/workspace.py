"""Scratch memory that split kernels keep between launches, one set per device and stream.

A split-K kernel (gemm/matmul_ops.py, gemm/triton_rmsnorm_linear.py) has several programs
share one output tile: each stores its fp32 partial sums in a scratch buffer and counts itself in
the tile's int32 arrival counter; the last to arrive adds the partials up, finishes the tile and
sets the counter back to zero. One launch instead of a second, summing kernel. Split-KV decode
attention (inference/) keeps its partial softmaxes here too.

Allocating these buffers on every call costs host time (~4 us a torch.empty) next to GPU times
of 10-20 us, so they are allocated once and grown. Launches on one stream run one after another, so one
buffer serves them all; each stream gets its own. An outgrown buffer is kept, not freed: a CUDA
graph that captured a launch still points at it.

While a stream is being captured into a CUDA graph, each launch gets buffers of its own, allocated
in the graph's memory pool (the counters' zeroing is captured with them): a cached buffer would
tie the graph to memory that eager calls or other graphs also write, and a buffer first made
during a capture holds no zeros until the graph replays. So capture needs no warm-up call before it.

A cached buffer is allocated on a thread of its own: torch.compile's mode="reduce-overhead" runs a
warm-up call before it records a graph, with every allocation of the calling thread routed into
the graph's memory pool, and a buffer kept from there would sit in the pool untracked (Inductor
refuses that). The routing is per thread, so the buffer made elsewhere stays in ordinary memory.
"""

import threading

import torch

from llmk.common.torch_private import raw_cuda_stream

MIN_COUNTERS = 1024  # int32 counters (4 KB)
MIN_SCRATCH = 1 << 18  # fp32 values (1 MB): every decode-size split of this repo fits

_BUFFERS = {}
_OUTGROWN = []


def _stream_key(device):
    # the raw handle of the current stream, as Triton's launcher and Inductor's generated code read
    # it: building a torch.cuda.Stream object (torch.cuda.current_stream) costs ~5 us of host time
    return raw_cuda_stream(device.index) if device.type == "cuda" else 0


def _outside_graph_pools(make):
    """make() run on another thread, out of reach of any memory pool this thread allocates into."""
    made = []
    worker = threading.Thread(target=lambda: made.append(make()))
    worker.start()
    worker.join()
    if not made:
        raise RuntimeError("allocating a split kernel's scratch buffer failed (see the thread's error above)")
    return made[0]


def _buffer(key, numel, dtype, device, minimum):
    """The cached buffer under `key`, grown to at least numel values: new ones are uninitialized."""
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None:  # kept alive; at least doubling keeps the outgrown ones few
            _OUTGROWN.append(buf)
            numel = max(numel, 2 * buf.numel())
        size = max(numel, minimum)
        if device.type == "cuda":
            buf = _outside_graph_pools(lambda: torch.empty(size, dtype=dtype, device=device))
        else:
            buf = torch.empty(size, dtype=dtype, device=device)
        if dtype == torch.int32:  # counters start at zero: zeroed on this thread's stream, in order
            buf.zero_()
        _BUFFERS[key] = buf
    return buf


def split_k_buffers(device, n_scratch, n_counters=0):
    """(scratch, counters) for one launch on the current stream: fp32 scratch of at least n_scratch
    values, whatever the last user left in it, and at least n_counters int32 zeros (every kernel
    that counts in them leaves them at zero; None when n_counters is 0)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        scratch = torch.empty(max(n_scratch, 1), dtype=torch.float32, device=device)
        return scratch, torch.zeros(n_counters, dtype=torch.int32, device=device) if n_counters else None
    stream = _stream_key(device)
    scratch = _buffer(("scratch", device, stream), n_scratch, torch.float32, device, MIN_SCRATCH)
    if not n_counters:
        return scratch, None
    return scratch, _buffer(("counters", device, stream), n_counters, torch.int32, device, MIN_COUNTERS)
