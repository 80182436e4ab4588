"""Benchmark results: the JSON every benchmark writes and the charts drawn from it.

File format, `<name>.json`:
    {"meta": {"gpu", "torch", "triton", "copy_GBps", "date", "command"},
     "rows": [{"op", "shape", "dtype", "provider", "ms", "GBps", "TFLOPs", "pct_copy", "max_err"}]}
"""
import argparse
import datetime
import json
import pathlib
import shlex
import sys

import torch

from common.device import INTERPRET, describe

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
SMOKE_DIR = ROOT / "build" / "bench-smoke"


def shape_str(shape):
    """(16384, 4096) -> "16384x4096", the shape key of result rows and charts."""
    return "x".join(str(d) for d in shape)


def parse_args(description):
    """Every benchmark's command line: --smoke runs tiny shapes in the interpreter into a scratch
    folder; --replot redraws the charts from the JSON already in the results folder. A full run
    needs a CUDA GPU; without one, say so in one line and exit 2."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, any device, results into build/bench-smoke (numbers meaningless)")
    parser.add_argument("--replot", action="store_true", help="redraw the charts from the results JSON")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="results folder")
    args = parser.parse_args()
    if not args.smoke and not args.replot and INTERPRET:
        print(f"{pathlib.Path(sys.argv[0]).name}: no CUDA GPU here; a benchmark needs one "
              "(use --smoke to run the code on tiny shapes)", file=sys.stderr)
        sys.exit(2)
    args.out = args.out or (SMOKE_DIR if args.smoke else RESULTS_DIR)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def start_run(smoke):
    """Measure the copy bandwidth (1 GB, far past L2; 1 MB in smoke mode) and return the run's meta."""
    from common.bench import copy_bandwidth_GBps
    meta = make_meta(copy_bandwidth_GBps(1 << 20 if smoke else 1 << 30))
    print(f"copy bandwidth {meta['copy_GBps']:.0f} GB/s on {meta['gpu']}", flush=True)
    return meta


def load_or_measure(args, name, measure):
    """--replot: the meta and rows already in the results folder; otherwise run measure() -> (meta,
    rows) and write them to <out>/<name>.json."""
    if args.replot:
        return read_json(args.out, name)
    meta, rows = measure()
    write_json(args.out, name, meta, rows)
    return meta, rows


def make_meta(copy_GBps):
    import triton
    return {"gpu": describe(), "torch": torch.__version__, "triton": triton.__version__,
            "copy_GBps": round(copy_GBps, 1), "date": datetime.date.today().isoformat(),
            "command": "python " + " ".join(shlex.quote(a) for a in sys.argv)}


def make_row(op, shape, dtype, provider, ms, copy_GBps, n_bytes=None, flops=None, max_err=None):
    """One result row; bytes give GB/s and the share of the copy bandwidth, flops give TFLOP/s."""
    from common.bench import gbps, tflops
    bw = gbps(n_bytes, ms) if n_bytes is not None else None
    return {"op": op, "shape": shape, "dtype": dtype, "provider": provider, "ms": round(ms, 5),
            "GBps": round(bw, 1) if bw is not None else None,
            "TFLOPs": round(tflops(flops, ms), 2) if flops is not None else None,
            "pct_copy": round(100 * bw / copy_GBps, 1) if bw is not None else None,
            "max_err": None if max_err is None else float(f"{max_err:.3g}")}


def read_json(out_dir, name):
    data = json.loads((pathlib.Path(out_dir) / f"{name}.json").read_text())
    return data["meta"], data["rows"]


def write_json(out_dir, name, meta, rows):
    path = pathlib.Path(out_dir) / f"{name}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def plot_sweeps(path, title, rows, sweeps, meta, metric="GBps"):
    """One PNG, one panel per sweep: `metric` against the swept dimension for every provider, with
    the copy bandwidth as a line when the metric is GB/s.

    rows: the result rows of one op and dtype. sweeps: [(xlabel, [(x, shape tuple), ...]), ...].
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    providers = list(dict.fromkeys(r["provider"] for r in rows))
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4.2), squeeze=False)
    for ax, (xlabel, points) in zip(axes[0], sweeps):
        for provider in providers:
            by_shape = {r["shape"]: r[metric] for r in rows if r["provider"] == provider}
            xy = [(x, by_shape[shape_str(s)]) for x, s in points if by_shape.get(shape_str(s)) is not None]
            if xy:
                ax.plot(*zip(*xy), marker="o", label=provider)
        if metric == "GBps":
            ax.axhline(meta["copy_GBps"], color="gray", linestyle="--", label="copy bandwidth")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel({"GBps": "GB/s (bytes read + written)", "TFLOPs": "TFLOP/s"}[metric])
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{title} on {meta['gpu']} ({meta['date']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
