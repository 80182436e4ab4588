"""Which forward kernel a flash-attention call runs: the Gluon kernel for Hopper
(attention/gluon_flash_attention_fwd.py) or the portable tl kernel (triton_flash_attention_fwd.py).

LLMK_ATTENTION_PATH picks: "tl" (the default) always runs the tl kernel; "gluon" runs the Gluon
kernel where all of the following hold, the tl kernel elsewhere; "auto" is "gluon" where the Gluon
kernel is measured faster (GLUON_BY_DEFAULT: not yet, docs/tuning/attention.md) and "tl" until
then. The Gluon kernel's conditions:
- a GPU of compute capability 9.0 (H100, H200), not the interpreter;
- a Triton whose Gluon the kernel was written and tested against (GLUON_TRITON_VERSIONS: Gluon's
  API changes between releases, so a newer Triton takes the tl path until the kernel is ported);
- no forced tl config, a head dim of GLUON_HEAD_DIMS and layouts TMA can read in place; dense and
  packed batches alike (its grid is one-dimensional: no cap on the (batch, head) pairs).
The choice happens per call on the host and needs no device sync, so it is safe under CUDA graph
capture and inside torch.compile'd graphs (the operators are opaque to the compiler).
"""
import functools
import os

import torch

from llmk.common.device import INTERPRET
from llmk.common.environment import environment

GLUON_TRITON_VERSIONS = ("3.6.0",)
# GLUON_CONFIG_TABLE's head dims, spelled here so that the tl path never imports Gluon (the
# dispatch test checks that the two agree)
GLUON_HEAD_DIMS = (64, 128)
PATH_ENV = "LLMK_ATTENTION_PATH"
PATHS = ("tl", "gluon", "auto")
# Whether "auto" takes the Gluon kernel: not yet. On the H200 it leads the tl kernel at hd 128
# (1.1-1.4x; causal T 1024 bf16 0.87x in one run) and trails it at hd 64 causal T <= 1024
# (0.88-0.96x; docs/results/attention.md): a choice by shape, and the whole suite run on the GPU
# with it as the default, come first
GLUON_BY_DEFAULT = False


@functools.lru_cache(maxsize=None)
def _gluon_device(index):
    """Whether device `index` and this Triton run the Gluon kernel (read once a device)."""
    if INTERPRET:
        return False
    import triton

    return triton.__version__ in GLUON_TRITON_VERSIONS and torch.cuda.get_device_capability(index) == (9, 0)


def gluon_runs_here(device=None):
    """Whether `device` (a CUDA device or its index; the current one by default) and this Triton
    run the Gluon kernel where a call meets its other conditions."""
    if INTERPRET or not torch.cuda.is_available():
        return False
    index = device if isinstance(device, int) else torch.device("cuda" if device is None else device).index
    return _gluon_device(torch.cuda.current_device() if index is None else index)


def forced_path(path):
    """A context manager: LLMK_ATTENTION_PATH = path ("tl", "gluon" or "auto") inside the block,
    restored after: the benchmark's triton-gluon rows, or a caller that wants one kernel for a
    region of code."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return environment(PATH_ENV, path)


def path_setting():
    """LLMK_ATTENTION_PATH, checked, "auto" resolved: "tl" (the default) or "gluon"."""
    value = os.environ.get(PATH_ENV, "tl")
    if value not in PATHS:
        raise ValueError(f"{PATH_ENV} must be one of {PATHS}, got {value!r}")
    if value == "auto":
        return "gluon" if GLUON_BY_DEFAULT else "tl"
    return value


def gluon_forward(q, k, v, out, lse, cu_seqlens, config):
    """Whether this forward runs the Gluon kernel: q, out (B, H, Tq, D), k, v (B, Hkv, Tk, D),
    checked and non-empty; lse None or fp32 (B, H, Tq); cu_seqlens None or a packed batch's
    (cu_seqlens_q, ...) as launch_flash_attention takes it; config a forced tl config or None."""
    if path_setting() == "tl" or config is not None or q.device.type != "cuda":
        return False
    if q.shape[3] not in GLUON_HEAD_DIMS:
        return False
    if not _gluon_device(q.device.index if q.device.index is not None else torch.cuda.current_device()):
        return False
    from llmk.attention.gluon_flash_attention_fwd import gluon_layout_ok

    return gluon_layout_ok(q, k, v, out) and (lse is None or lse.stride(-1) == 1)
