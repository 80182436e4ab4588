"""Test scripts sharing one GPU (`make test JOBS=4`): who may run a case now, and with how much memory.

Every case of a script runs holding a shared turn on its GPU, taken through two lock files (flock,
released by the kernel if a process dies): any number of scripts hold shared turns at once. A case
that needs most of the card runs holding the only turn:

- a case that declares it (Case(gpu_gb=...)): before it starts, when its need is more than a
  share of the card (total / SHARE_OF);
- a case that ran out of memory while holding a shared turn: once more, holding the only turn
  (scripts running at once each take what they need, and four large cases can meet).

The exclusive turn goes through a turnstile that shared turns also pass, so a waiting large case
is not starved by the others' stream of small ones: new cases wait behind it, the running ones end,
and it starts. Before and after each case a script returns its cached blocks to the driver
(torch.cuda.empty_cache), so a turn's memory is free for whoever runs next. A case that needs more
than the card has is skipped, with its need and the card's size as the reason; one that waits past
WAIT_S for its turn fails, saying so.
"""

import contextlib
import fcntl
import os
import tempfile
import time

import torch

SHARE_OF = 4  # a case needing more than total / SHARE_OF runs alone: four scripts run at once (JOBS=4)
WAIT_S = 1800  # longest wait for the exclusive turn; the longest case of the suite runs ~3 minutes
GB = 1e9


def _lock_path(device, name):
    return os.path.join(tempfile.gettempdir(), f"llmk-tests-cuda{device}-{name}.lock")


def _flock(path, mode, deadline):
    """An open file holding lock `mode` (fcntl.LOCK_SH / LOCK_EX) on `path`, or None past `deadline`."""
    f = open(path, "a")
    while True:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                return None
            time.sleep(0.2)


def _release(*files):
    for f in files:
        if f is not None:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()


def is_out_of_memory(error):
    """A CUDA allocation failure, from the caching allocator or from a library's own allocation."""
    text = str(error)
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in text or "ALLOC_FAILED" in text


@contextlib.contextmanager
def turn(exclusive):
    """Hold a turn on the current CUDA device for one case: shared, or the only one. Yields None,
    or why there is no turn (the wait ran out)."""
    device = torch.cuda.current_device()
    deadline = time.monotonic() + WAIT_S
    torch.cuda.empty_cache()
    gate = _flock(_lock_path(device, "turnstile"), fcntl.LOCK_EX, deadline)
    held = None
    if gate is not None:
        held = _flock(_lock_path(device, "cases"), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline)
        if not exclusive:
            _release(gate)
            gate = None
    if held is None:
        _release(gate)
        yield f"waited {WAIT_S} s for the GPU"
        return
    try:
        yield None
    finally:
        try:  # a sticky CUDA error raises here: the locks go back all the same
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        finally:
            _release(held, gate)


def too_big(gpu_gb):
    """The skip reason of a case needing gpu_gb on this card, or None if it fits."""
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if gpu_gb * GB > total:
        return f"needs {gpu_gb:g} GB, the GPU has {total / GB:.0f} GB"
    return None


def needs_the_card(gpu_gb):
    """Whether a case of gpu_gb (None: not declared) takes the exclusive turn from the start."""
    if gpu_gb is None:
        return False
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return gpu_gb * GB > total / SHARE_OF
