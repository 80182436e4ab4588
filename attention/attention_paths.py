"""Which kernels a flash-attention call runs: the Gluon kernels for Hopper (attention/
gluon_flash_attention_fwd.py, gluon_flash_attention_bwd.py) or the portable tl kernels
(triton_flash_attention_fwd.py, triton_flash_attention_bwd.py). The forward:

LLMK_ATTENTION_PATH picks: "auto" (the default) runs the Gluon kernel where it can run and was
measured faster (AUTO_TL_SHAPES holds where it was not), the tl kernel elsewhere; "gluon" runs the
Gluon kernel wherever it can run; "tl" always runs the tl kernel. The Gluon kernel can run where:
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
# Where "auto" keeps the tl kernel though the Gluon one could run: (head dim, causal, longest query
# length up to). On the H200 the Gluon kernel leads at hd 128 (1.1-1.4x) and ties at hd 64 (0.98-1.03x)
# except causal at T <= 1024 (0.88-0.96x: benchmarks/results/attention.json, triton-gluon / triton)
AUTO_TL_SHAPES = ((64, True, 1024),)


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
    """LLMK_ATTENTION_PATH, checked: "auto" (the default), "gluon" or "tl"."""
    value = os.environ.get(PATH_ENV, "auto")
    if value not in PATHS:
        raise ValueError(f"{PATH_ENV} must be one of {PATHS}, got {value!r}")
    return value


def auto_takes_gluon(head_dim, causal, max_queries):
    """Whether "auto" takes the Gluon kernel for this head dim, causal flag and longest query
    length where both kernels can run (AUTO_TL_SHAPES)."""
    return not any(head_dim == d and bool(causal) == c and max_queries <= t for d, c, t in AUTO_TL_SHAPES)


def gluon_forward(q, k, v, causal, out, lse, cu_seqlens, config):
    """Whether this forward runs the Gluon kernel: q, out (B, H, Tq, D), k, v (B, Hkv, Tk, D),
    checked and non-empty; causal the call's flag; lse None or fp32 (B, H, Tq); cu_seqlens None or
    a packed batch's (cu_seqlens_q, cu_seqlens_k, max_seqlen_q) as launch_flash_attention takes
    it; config a forced tl config or None."""
    setting = path_setting()
    if setting == "tl" or config is not None or q.device.type != "cuda":
        return False
    if q.shape[3] not in GLUON_HEAD_DIMS:
        return False
    if setting == "auto" and not auto_takes_gluon(
        q.shape[3], causal, q.shape[2] if cu_seqlens is None else cu_seqlens[2]
    ):
        return False
    if not _gluon_device(q.device.index if q.device.index is not None else torch.cuda.current_device()):
        return False
    from llmk.attention.gluon_flash_attention_fwd import gluon_layout_ok

    return gluon_layout_ok(q, k, v, out) and (lse is None or lse.stride(-1) == 1)


def gluon_backward(q, forced):
    """Whether a backward runs the Gluon dk/dv and dq kernels (attention/gluon_flash_attention_bwd.py):
    q (B, H, Tq, D) on its device, dense or packed, any mask; forced, whether the caller forced a
    tl config or schedule. "tl" never, "auto" and "gluon" alike where they can run: on the H200
    both Gluon kernels together ran the benchmark's training shapes 1.05-1.27x faster than the tl
    kernels' best schedule, a window 1.22x, a softcap 1.03x (docs/tuning/attention.md, the Gluon
    backward). The layouts are the launcher's to check."""
    if path_setting() == "tl" or forced or q.device.type != "cuda" or q.shape[3] not in GLUON_HEAD_DIMS:
        return False
    return _gluon_device(q.device.index if q.device.index is not None else torch.cuda.current_device())
