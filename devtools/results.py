"""Benchmark results: the JSON every benchmark writes, its CSV form, and the charts drawn from it.

File format, `<name>.json`:
    {"meta": {"gpu", "torch", "triton", "copy_GBps", "date", "command", "commit", "dirty"},
     "rows": [{"op", "shape", "dtype", "provider", "ms", "GBps", "TFLOPs", "pct_copy", "max_err", ...}]}
"""

import csv
import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys

import torch

from llmk.common.device import describe

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
SMOKE_DIR = ROOT / "build" / "bench-smoke"
PARTIAL_DIR = ROOT / "build" / "bench-partial"


def shape_str(shape):
    """(16384, 4096) -> "16384x4096", the shape key of result rows and charts; a string stays as is."""
    return shape if isinstance(shape, str) else "x".join(str(d) for d in shape)


def start_run(smoke, out_dir):
    """Measure the copy bandwidth (1 GB, far past L2; 1 MB in smoke mode) and return the run's meta."""
    from llmk.devtools.bench import copy_bandwidth_GBps

    meta = make_meta(copy_bandwidth_GBps(1 << 20 if smoke else 1 << 30), out_dir)
    print(
        f"copy bandwidth {meta['copy_GBps']:.0f} GB/s on {meta['gpu']}, commit {meta['commit']}"
        + (" (dirty)" if meta["dirty"] else ""),
        flush=True,
    )
    return meta


def git_state(out_dir):
    """(commit, dirty) of the checkout, the results folder being written left out of "dirty".
    BENCH_COMMIT and BENCH_DIRTY ("1"/"0"), when set, say it instead: a copy of the tree run
    elsewhere (the GPU machine's) may carry no .git, or an older one than the files it runs.
    (None, None) when neither says."""
    if os.environ.get("BENCH_COMMIT"):
        dirty = os.environ.get("BENCH_DIRTY")
        return os.environ["BENCH_COMMIT"], None if dirty is None else dirty.strip().lower() in ("1", "true", "yes")
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        out = pathlib.Path(out_dir).resolve()
        exclude = [f":(exclude){out.relative_to(ROOT)}"] if out.is_relative_to(ROOT) and out != ROOT else []
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", *exclude], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return commit, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return None, None


def make_meta(copy_GBps, out_dir=RESULTS_DIR):
    import triton

    commit, dirty = git_state(out_dir)
    return {
        "gpu": describe(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_GBps": float(f"{copy_GBps:.5g}"),
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "commit": commit,
        "dirty": dirty,
    }


def make_row(op, shape, dtype, provider, ms, copy_GBps, n_bytes=None, flops=None, max_err=None):
    """One result row; bytes give GB/s and the share of the copy bandwidth, flops give TFLOP/s."""
    from llmk.devtools.bench import gbps, tflops

    bw = gbps(n_bytes, ms) if n_bytes is not None else None
    return {
        "op": op,
        "shape": shape,
        "dtype": dtype,
        "provider": provider,
        "ms": round(ms, 5),
        "GBps": round(bw, 1) if bw is not None else None,
        "TFLOPs": round(tflops(flops, ms), 2) if flops is not None else None,
        "pct_copy": round(100 * bw / copy_GBps, 1) if bw is not None and copy_GBps > 0 else None,
        "max_err": None if max_err is None else float(f"{max_err:.3g}"),
    }


def read_json(out_dir, name):
    data = json.loads((pathlib.Path(out_dir) / f"{name}.json").read_text())
    return data["meta"], data["rows"]


def write_json(out_dir, name, meta, rows):
    path = pathlib.Path(out_dir) / f"{name}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def write_csv(path, rows):
    """The rows as CSV, one column per field any row has (in first-seen order), blank where absent."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


def plot_sweeps(path, title, rows, sweeps, meta, metric="GBps"):
    """One PNG, one panel per sweep: `metric` against the swept dimension for every provider, with
    the copy bandwidth as a line when the metric is GB/s. Nothing is drawn for no rows (a filtered run).

    rows: the result rows of one op and dtype. sweeps: [(xlabel, [(x, shape tuple), ...]), ...].
    """
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    providers = list(dict.fromkeys(r["provider"] for r in rows))
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4.2), squeeze=False)
    for ax, (xlabel, points) in zip(axes[0], sweeps):
        for i, provider in enumerate(providers):
            by_shape = {r["shape"]: r[metric] for r in rows if r["provider"] == provider}
            xy = [(x, by_shape[shape_str(s)]) for x, s in points if by_shape.get(shape_str(s)) is not None]
            if xy:  # a provider's color fixed by its place, so a panel it has no rows in shifts no other
                ax.plot(*zip(*xy), marker="o", label=provider, color=f"C{i % 10}")
        if metric == "GBps":
            ax.axhline(meta["copy_GBps"], color="gray", linestyle="--", label="copy bandwidth")
        ax.set_xscale("log", base=2)
        xs = sorted({x for x, _ in points})
        if any(x & (x - 1) for x in xs if isinstance(x, int)):  # not all powers of two: name each point
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel({"GBps": "GB/s (bytes read + written)", "TFLOPs": "TFLOP/s"}[metric])
        ax.grid(True, alpha=0.3)
    handles = {}  # every provider once, whichever panel has it
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    axes[0][0].legend(handles.values(), handles.keys(), fontsize=8)
    fig.suptitle(f"{title} on {meta['gpu']} ({meta['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
