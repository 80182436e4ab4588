"""Scratch memory that split kernels keep between launches, one set per device and stream.

A split-K kernel (gemm/triton_matmul.py, gemm/triton_rmsnorm_linear.py) has several programs
share one output tile: each stores its fp32 partial sums in a scratch buffer and counts itself in
the tile's int32 arrival counter; the last to arrive adds the partials up, finishes the tile and
sets the counter back to zero. One launch instead of a second, summing kernel. Split-KV decode
attention (inference/) keeps its partial softmaxes here too.

Allocating these buffers on every call costs host time (~4 us a torch.empty) next to GPU times
of 10-20 us, so they are allocated once and grown. Launches on one stream run one after another, so one
buffer serves them all; each stream gets its own. An outgrown buffer is kept, not freed: a CUDA
graph that captured a launch still points at it.
"""
import torch

MIN_COUNTERS = 1024   # int32 counters (4 KB)
MIN_SCRATCH = 1 << 18  # fp32 values (1 MB): every decode-size split of this repo fits

_BUFFERS = {}
_OUTGROWN = []


def _stream_key(device):
    # the raw handle of the current stream, as Triton's launcher and Inductor's generated code read
    # it: building a torch.cuda.Stream object (torch.cuda.current_stream) costs ~5 us of host time
    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0


def _buffer(key, numel, make):
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < numel:
        if buf is not None:  # kept alive; at least doubling keeps the outgrown ones few
            _OUTGROWN.append(buf)
            numel = max(numel, 2 * buf.numel())
        buf = _BUFFERS[key] = make(numel)
    return buf


def split_k_buffers(device, n_scratch, n_counters=0):
    """(scratch, counters) for one launch on the current stream: fp32 scratch of at least n_scratch
    values, whatever the last user left in it, and at least n_counters int32 zeros (every kernel
    that counts in them leaves them at zero; None when n_counters is 0)."""
    stream = _stream_key(device)
    scratch = _buffer(("scratch", device, stream), n_scratch,
                      lambda numel: torch.empty(max(numel, MIN_SCRATCH), dtype=torch.float32, device=device))
    if not n_counters:
        return scratch, None
    counters = _buffer(("counters", device, stream), n_counters,
                       lambda numel: torch.zeros(max(numel, MIN_COUNTERS), dtype=torch.int32, device=device))
    return scratch, counters
