"""The loop and the command line every benchmarks/*_bench.py shares.

A benchmark lists its rows as Cases (op, shape, dtype, providers, inputs, bytes or FLOPs). For each
provider of a case the harness makes a warm-up call, takes its max_err against the case's fp32
reference, times it (common.timing.time_ms, do_bench's median; graph_time_ms where the case asks),
makes the row and prints a progress line; then it writes <name>.json (and --csv), draws the charts
and applies the max_err gate.

max_err gate: a row of ours (provider "triton", plus what the benchmark names) fails when
    max_err > GATE_FACTOR * baseline + atol,
where baseline is the largest max_err at the same op, shape and dtype among the benchmark's PyTorch
providers (every provider that is not ours: eager, the vendor op, cuBLAS, sdpa-*, torch.compile;
called once untimed where a filter left them out, or named `untimed` where none is timed), 0 when
there is none, and atol is one ulp at 1.0 of the dtype (torch.finfo(dtype).eps) unless the benchmark
states its own. A failing run still writes its results, then prints the rows and exits 1.
"""

import argparse
import pathlib
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from llmk.common.device import DEVICE, INTERPRET
from llmk.common.validation import DTYPE_NAMES
from llmk.devtools.results import (
    PARTIAL_DIR,
    RESULTS_DIR,
    SMOKE_DIR,
    make_row,
    read_json,
    shape_str,
    start_run,
    write_csv,
    write_json,
)

GATE_FACTOR = 2
OURS = ("triton",)
MODES = ("fwd", "bwd", "fwd+bwd")
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}  # "fp16" -> torch.float16, ...


def parse_args(doc, warmup_ms=25, rep_ms=100):
    """The shared command line; `doc` is the benchmark's docstring (first line: description, the
    rest: the epilog). A full run needs a CUDA GPU: without one, say so in one line and exit 2."""
    parser = argparse.ArgumentParser(
        description=doc.strip().splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(doc.strip().splitlines()[1:]) + "\n\nA run filtered by --only, --dtype or --mode writes into "
        f"{PARTIAL_DIR.relative_to(PARTIAL_DIR.parents[1])}/ unless --out is given, so the committed "
        "results stay whole.\nExit status 1: a row of ours failed the max_err gate "
        f"(max_err > {GATE_FACTOR} x the PyTorch baseline's + one ulp at 1.0; devtools/harness.py).",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes, any device, results into build/bench-smoke (numbers meaningless)",
    )
    parser.add_argument("--replot", action="store_true", help="redraw the charts from the results JSON")
    parser.add_argument("--out", type=str, default=None, metavar="DIR", help="results folder")
    parser.add_argument(
        "--warmup",
        type=float,
        default=warmup_ms,
        metavar="MS",
        help=f"do_bench warm-up budget in ms (default {warmup_ms})",
    )
    parser.add_argument(
        "--rep", type=float, default=rep_ms, metavar="MS", help=f"do_bench measuring budget in ms (default {rep_ms})"
    )
    parser.add_argument(
        "--only",
        "--shapes",
        default=None,
        metavar="FILTER",
        help="run only rows whose op, shape or provider contains one of these comma-separated "
        "strings (e.g. rmsnorm,4096 or triton; =rmsnorm: that name exactly)",
    )
    parser.add_argument("--dtype", default=None, metavar="LIST", help=f"comma list of {', '.join(DTYPES)}")
    parser.add_argument(
        "--mode", default=None, metavar="LIST", help=f"comma list of {', '.join(MODES)}: run only rows of these modes"
    )
    parser.add_argument("--csv", default=None, metavar="PATH", help="also write the rows as CSV to PATH")
    args = parser.parse_args()
    args.only = [t for t in args.only.split(",") if t] if args.only else None
    args.dtypes = None
    if args.dtype:
        args.dtypes = [t.strip() for t in args.dtype.split(",") if t.strip()]
        unknown = [t for t in args.dtypes if t not in DTYPES]
        if unknown:
            parser.error(f"--dtype: unknown {', '.join(unknown)}; expected a comma list of {', '.join(DTYPES)}")
    args.modes = None
    if args.mode:
        args.modes = [t.strip() for t in args.mode.split(",") if t.strip()]
        unknown = [t for t in args.modes if t not in MODES]
        if unknown:
            parser.error(f"--mode: unknown {', '.join(unknown)}; expected a comma list of {', '.join(MODES)}")
    if args.warmup <= 0 or args.rep <= 0:
        parser.error("--warmup and --rep: expected milliseconds > 0")
    if not args.smoke and not args.replot and INTERPRET:
        print(
            f"{parser.prog}: no CUDA GPU here; a benchmark needs one (use --smoke to run the code on tiny shapes)",
            file=sys.stderr,
        )
        sys.exit(2)
    args.partial = bool(args.only or args.dtypes or args.modes)
    default_out = PARTIAL_DIR if args.partial else SMOKE_DIR if args.smoke else RESULTS_DIR
    args.out = default_out if args.out is None else pathlib.Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


@dataclass
class BenchCase:
    """The rows of one op, shape and dtype: one per provider.

    providers: {name: fn(*inputs) -> output, or a string: why the provider is skipped here}.
    setup: () -> (inputs tuple, fp32 reference output); called only when a provider is selected.
    n_bytes, flops: what one call moves and computes (GB/s and % of copy, TFLOP/s).
    graph: providers also timed with graph_time_ms (a collection of names), or a function of the
        case's rows -> bool, asked after every provider is timed (their calls are kept until then).
    extra: (provider, inputs, call) -> dict of row fields (config, splits, peak_MiB...), asked after
        the warm-up call.
    mode: "fwd" (the default), "bwd" or "fwd+bwd": what a call times (devtools.bench.train_call makes
        the calls of the training modes); a row field, and part of the key the max_err gate compares.
        A fwd+bwd case times every provider in GPU time too (graph_ms), unless it says otherwise
        in `graph`: autograd's host work (a Python backward, the engine's hand-off between threads)
        can outlast kernels of a few hundred microseconds, and do_bench then times the host, where
        a training step queues its kernels ahead of the GPU. A bwd row cannot be captured (its
        backward runs on the stream of a forward made outside the capture): do_bench only.
    peak: also measure each provider's peak_MB (devtools.bench.peak_extra_MB) on one more call.
    bind: (provider, inputs) -> call, or (call, dict of row fields), for a provider that must build
        state first (an optimizer, a copy of the inputs); default: lambda: providers[name](*inputs).
    compare: (output, reference) -> max_err; default: largest |out - ref| over tensors or pairs.
    untimed: providers (of `providers`) called once for the gate's baseline, with no row.
    skip_on: exceptions by which a provider of ours refuses a shape (the row is then reported as
        skipped); a peer's exception of any kind skips its row, with the reason.
    skip: a reason to skip the whole case.
    """

    op: str
    shape: object
    dtype: torch.dtype
    providers: dict
    setup: Callable
    n_bytes: Optional[int] = None
    flops: Optional[int] = None
    graph: object = ()
    extra: Optional[Callable] = None
    bind: Optional[Callable] = None
    compare: Optional[Callable] = None
    untimed: tuple = ()
    skip_on: tuple = ()
    skip: Optional[str] = None
    mode: str = "fwd"
    peak: bool = False
    key: tuple = field(init=False)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"BenchCase.mode: expected one of {MODES}, got {self.mode!r}")
        if self.mode == "fwd+bwd" and not self.graph:
            self.graph = lambda rows: True
        self.key = (self.op, shape_str(self.shape), DTYPE_NAMES.get(self.dtype, str(self.dtype)))


def max_err(out, expected):
    if isinstance(out, (tuple, list)):
        return max(max_err(o, e) for o, e in zip(out, expected))
    return (out.float() - expected.float()).abs().max().item()


class Run:
    """One run's rows, the errors of the baselines the gate reads, the filters and the progress count."""

    def __init__(self, args, meta, ours=OURS):
        self.args, self.meta, self.ours = args, meta, tuple(ours)
        self.rows, self.baselines, self.done, self.total = [], {}, 0, None

    def selected(self, op, shape, provider):
        only = self.args.only
        fields = (op, shape, provider)
        return not only or any(t[1:] in fields if t.startswith("=") else any(t in f for f in fields) for t in only)

    def wants_dtype(self, dtype_name):
        return not self.args.dtypes or dtype_name in self.args.dtypes

    def wants_mode(self, mode):
        return not getattr(self.args, "modes", None) or mode in self.args.modes

    def _prefix(self):
        self.done += 1
        return f"[{self.done}/{self.total}]" if self.total else f"[{self.done}]"

    def add(self, row):
        """Record a row (a baseline's error too, for the gate) and print its progress line."""
        self.rows.append(row)
        if row["provider"] not in self.ours and row["max_err"] is not None:
            self.baseline(gate_key(row), row["max_err"])
        parts = [f"{row['ms']:9.4f} ms"]
        if row.get("GBps") is not None:
            parts.append(
                f"{row['GBps']:8.1f} GB/s" + (f" {row['pct_copy']:5.1f}% copy" if row["pct_copy"] is not None else "")
            )
        if row.get("TFLOPs") is not None:
            parts.append(f"{row['TFLOPs']:7.1f} TFLOP/s")
        if row.get("graph_ms") is not None:
            parts.append(f"graph {row['graph_ms']:.4f} ms")
        parts.append(f"err {row['max_err']:.2g}")
        base = {
            "op",
            "shape",
            "dtype",
            "provider",
            "ms",
            "GBps",
            "TFLOPs",
            "pct_copy",
            "max_err",
            "graph_ms",
            "graph_pct_copy",
            "mode",
        }
        parts += [f"{k} {v}" for k, v in row.items() if k not in base]
        mode = f" {row['mode']:7s}" if "mode" in row else ""
        print(
            f"{self._prefix()} {row['op']:16s} {row['shape']:>18s} {row['dtype']}{mode} {row['provider']:15s} "
            + "  ".join(parts),
            flush=True,
        )

    def skip(self, key, provider, why):
        op, shape, dtype = key
        print(f"{self._prefix()} {op:16s} {shape:>18s} {dtype} {provider:15s} skipped ({why})", flush=True)

    def baseline(self, key, err):
        self.baselines[key] = max(self.baselines.get(key, 0.0), err)


def gate_key(row):
    """The rows whose errors the gate compares: one op, shape, dtype and mode (fwd when absent)."""
    return row["op"], row["shape"], row["dtype"], row.get("mode", "fwd")


def run_bench_cases(run, cases):
    """Every selected provider of every selected case, in order."""
    plan = []
    for case in cases:
        if run.wants_dtype(case.key[2]) and run.wants_mode(case.mode):
            names = [p for p in case.providers if p not in case.untimed and run.selected(case.key[0], case.key[1], p)]
            if names:
                plan.append((case, names))
    run.total = sum(len(names) for _, names in plan)
    for case, names in plan:
        if case.skip:
            for name in names:
                run.skip(case.key, name, case.skip)
            continue
        _run_case(run, case, names)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()  # the largest shapes need the memory the last ones held


def _run_case(run, case, names):
    inputs, expected = case.setup()
    compare = case.compare or max_err
    untimed = [p for p in case.providers if p not in names and (p not in run.ours or p in case.untimed)]
    kept = []  # (call, row) where graph times are decided once the case is timed
    for name in names + untimed:
        if isinstance(case.providers.get(name), str):
            if name in names:
                run.skip(case.key, name, case.providers[name])
            continue
        result = _call_provider(run, case, name, inputs, expected, compare, timed=name in names)
        if result is not None and callable(case.graph):
            kept.append(result)
    if kept and case.graph([row for _, row in kept]):
        for call, row in kept:
            _add_graph(row, call, case.n_bytes, run)
    for _, row in kept:
        run.add(row)


def _call_provider(run, case, name, inputs, expected, compare, timed):
    """Warm-up, max_err, timing and row of one provider; the row is added unless the case decides
    graph times later, when (call, row) is returned instead."""
    try:
        bound = case.bind(name, inputs) if case.bind else _bind(case.providers[name], inputs)
        call, fields = bound if isinstance(bound, tuple) else (bound, {})
        err = compare(call(), expected)  # also the warm-up (autotune, compile)
        if not timed:
            if name not in run.ours:
                run.baseline((*case.key, case.mode), err)
            return None
        ms = _time(call, run.args)
        if case.peak:
            from llmk.devtools.bench import peak_extra_MB

            fields = {**fields, "peak_MB": peak_extra_MB(call)}
        fields = {**fields, **(case.extra(name, inputs, call) if case.extra else {})}
    except Exception as e:
        # a shape a provider refuses (case.skip_on), or a peer's error of any kind (Liger refusing
        # a row width, say): the row is skipped with the reason; an error of ours stops the run
        if not isinstance(e, case.skip_on) and name in run.ours:
            raise
        if timed:
            run.skip(case.key, name, str(e).splitlines()[0][:90] if str(e) else type(e).__name__)
        return None
    op, shape, dtype = case.key
    row = make_row(
        op, shape, dtype, name, ms, run.meta["copy_GBps"], n_bytes=case.n_bytes, flops=case.flops, max_err=err
    )
    if case.mode != "fwd":
        row["mode"] = case.mode
    row.update(fields)
    if callable(case.graph):
        return call, row
    if name in case.graph:
        _add_graph(row, call, case.n_bytes, run)
    run.add(row)
    return None


def _bind(fn, inputs):
    return lambda: fn(*inputs)


def _time(call, args):
    from llmk.common.timing import time_ms

    return time_ms(call, warmup_ms=args.warmup, rep_ms=args.rep)


def _add_graph(row, call, n_bytes, run):
    """graph_ms, and graph_pct_copy where the row counts bytes (GB/s is given)."""
    from llmk.common.timing import graph_time_ms
    from llmk.devtools.bench import gbps

    try:
        row["graph_ms"] = round(graph_time_ms(call, warmup_ms=run.args.warmup, rep_ms=run.args.rep), 5)
    except Exception as e:  # a provider that cannot be captured keeps its do_bench row, with the reason
        row["graph_ms"] = row["graph_pct_copy"] = None
        row["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:90]
        return
    row["graph_pct_copy"] = (
        None
        if row["pct_copy"] is None
        else round(100 * gbps(n_bytes, max(row["graph_ms"], 1e-9)) / run.meta["copy_GBps"], 1)
    )


def gate(run, atol=None):
    """Rows of ours whose max_err exceeds GATE_FACTOR * baseline + atol (module docstring)."""
    atol = atol or {}
    failures = []
    for row in run.rows:
        if row["provider"] not in run.ours or row["max_err"] is None:
            continue
        key = gate_key(row)
        tol = atol.get(row["dtype"], torch.finfo(DTYPES[row["dtype"]]).eps if row["dtype"] in DTYPES else 0.0)
        limit = GATE_FACTOR * run.baselines.get(key, 0.0) + tol
        if row["max_err"] > limit:
            failures.append((row, limit))
    return failures


def run(args, name, charts, cases=None, measure=None, ours=OURS, atol=None):
    """The whole benchmark: --replot draws the charts from <out>/<name>.json; otherwise measure
    (`cases`: () -> Cases for the shared loop, or `measure`: run -> None filling run.rows), write
    the JSON (and --csv), draw `charts(meta, rows)`, and exit 1 on a failed max_err gate."""
    if args.replot:
        charts(*read_json(args.out, name))
        return
    meta = start_run(args.smoke, args.out)
    bench = Run(args, meta, ours)
    if cases is not None:
        run_bench_cases(bench, cases())
    else:
        measure(bench)
    if not bench.rows:
        print(f"{name}: no rows matched --only/--dtype", file=sys.stderr)
        sys.exit(2)
    write_json(args.out, name, meta, bench.rows)
    if args.csv:
        write_csv(args.csv, bench.rows)
    charts(meta, bench.rows)
    failures = gate(bench, atol)
    if failures:
        print(
            f"\n{name}: max_err gate failed (max_err > {GATE_FACTOR} x baseline + atol) on {len(failures)} rows:",
            file=sys.stderr,
        )
        for row, limit in failures:
            print(
                f"  {row['op']} {row['shape']} {row['dtype']} {row['provider']}: max_err {row['max_err']:.3g} "
                f"> {limit:.3g}",
                file=sys.stderr,
            )
        sys.exit(1)
