"""What every results page (docs/results/<area>.md, scripts/report.py) is built from: the Group of
rows a sentence sums up, an area's Area (title, intro, groups, notes), and the shape predicates
the groups select rows with. Each area's own Area is its PAGE, in benchmarks/<area>_page.py beside
its benchmark. Standard library only: the report runs without torch.
"""

import math
from dataclasses import dataclass, field
from typing import Callable

BIG = 1 << 24  # 16M elements: past every L2, where a memory-bound kernel meets the copy bandwidth

# ---------------------------------------------------------------------------------------------
# shapes


def dims(shape):
    """ "16384x4096" -> (16384, 4096); a named shape ("llama-1.1B(201 tensors)") -> ()."""
    parts = shape.split("x")
    return tuple(int(d) for d in parts) if all(d.isdigit() for d in parts) else ()


def elements(shape):
    """Element count of a shape; a named shape (a model's parameter list) counts as large."""
    d = dims(shape)
    return math.prod(d) if d else math.inf


def big(shape):
    return elements(shape) >= BIG


def gemm_m(shape):
    d = dims(shape)
    return d[0] if d else 0


# ---------------------------------------------------------------------------------------------
# what each page says beyond its numbers


@dataclass
class Group:
    """A class of rows that a sentence (and maybe a README row) sums up.

    ops: the ops it covers; keep(shape): the shapes it covers; graph: compare GPU times (graph_ms)
    instead of do_bench's ms; label: the shape class in words; mode: the rows' mode ("fwd",
    "bwd", "fwd+bwd"; a row without one is fwd)."""

    ops: tuple
    label: str
    keep: Callable = lambda shape: True
    graph: bool = False
    mode: str = "fwd"
    ours: str = "triton"
    peers: tuple = ()  # the providers ours is measured against; () = every provider not ours
    why: str = ""  # why a peer leads where it does, in place of the area's leader_notes


@dataclass
class Area:
    title: str
    intro: str  # one paragraph: which kernels, where their code lives
    groups: list  # what the page sums up, in order
    notes: list = field(default_factory=list)  # facts of the method, true whatever the figures
    # peer, or (peer, graph), -> why it can lead; shown under a group where it does
    leader_notes: dict = field(default_factory=dict)
    lower_is_better: bool = False  # tables in ms (end to end)
    # the name of scripts/report.py's function (meta, rows) -> the page's lines after the run table,
    # in place of the sentences and tables of kernels against peers (host: CPU time, not GPU time);
    # a name, since this module must not import the report
    render: str = ""


DECODE_STEP_LAYERS = ("llama3-8b", "qwen2-7b")  # the decode_step area's ops
TRAIN = "16M+ elements, GPU time"  # the training groups' label
TRAIN_NOTE = (
    "Training rows (bf16): `fwd+bwd` is the forward and `torch.autograd.grad` of its outputs, "
    "compared in GPU time (one CUDA graph of the calls, L2 flushed between them), as a training "
    "step queues its kernels ahead of the GPU; `ms` also holds do_bench's time, which includes "
    "autograd's host work (several hundred microseconds on this host, more than small kernels). "
    "`bwd` is the backward alone on a kept forward graph (do_bench: it cannot be captured), so "
    "small rows measure the host. `peak_MB` is the memory a call allocates above what existed "
    "before it: outputs, saved tensors, gradients and scratch. Liger-Kernel (0.8.5) writes some "
    "gradients into its inputs' buffers (SwiGLU, RoPE), which costs it no allocation, and "
    "refuses rows wider than 65536."
)
