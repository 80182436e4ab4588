"""`make bench` (GPU) and `make bench-smoke` (anywhere, tiny shapes, scratch folder): run
benchmarks/*_bench.py in turn, every one or those named; exit nonzero if any fails (an error, or a
row over the max_err gate). A smoke run may take several at once (--jobs: each printed whole when
it ends); a GPU run takes one at a time, since benchmarks sharing the GPU time each other's work."""

import argparse
import concurrent.futures
import pathlib
import sys
import time

from llmk.scripts.script_process import start, use_fork_server

ROOT = pathlib.Path(__file__).resolve().parents[1]
# a smoke run with --jobs starts these first, the longest in CI's interpreter (seconds on 2 cores:
# train 107, decode_step 64, attention 43, gemm 39), so none of them is left running alone at the end
SMOKE_LONGEST = ("train", "decode_step", "attention", "gemm")


def benchmarks():
    """{name: script path relative to the root}: "norm" for benchmarks/norm_bench.py."""
    return {p.name[: -len("_bench.py")]: p.relative_to(ROOT) for p in sorted((ROOT / "benchmarks").glob("*_bench.py"))}


def parse_args(argv):
    names = benchmarks()
    parser = argparse.ArgumentParser(
        prog="python -m llmk.scripts.run_benchmarks",
        description=" ".join(__doc__.split()),
        epilog="Any other option goes to every benchmark (--only, --dtype, --warmup, --rep, --out, --replot; "
        "see python benchmarks/norm_bench.py --help). "
        "make bench BENCH=norm,attention and make bench-smoke BENCH=norm ARGS='--dtype bf16' pass the same.",
    )
    parser.add_argument(
        "--bench",
        default=None,
        metavar="NAMES",
        help=f"comma list of benchmarks to run (default: all of {', '.join(names)})",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes in the interpreter, into build/bench-smoke")
    parser.add_argument(
        "--jobs", "-j", type=int, default=1, help="with --smoke: benchmarks run at once (default 1, streamed)"
    )
    args, rest = parser.parse_known_args(argv)
    if args.jobs < 1 or (args.jobs > 1 and not args.smoke):
        parser.error(f"--jobs: 1, or more with --smoke (a GPU run times one benchmark at a time), got {args.jobs}")
    chosen = [n.strip() for n in args.bench.split(",") if n.strip()] if args.bench else list(names)
    unknown = [n for n in chosen if n not in names]
    if unknown:
        parser.error(f"--bench: unknown {', '.join(unknown)}; expected names from {', '.join(names)}")
    if args.smoke and args.jobs > 1:
        chosen.sort(key=lambda n: SMOKE_LONGEST.index(n) if n in SMOKE_LONGEST else len(SMOKE_LONGEST))
    return args, [names[n] for n in chosen], rest


def run_one(rel, forwarded, stream):
    """Run one benchmark script: (exit code, its output unless streamed, seconds)."""
    t0 = time.perf_counter()
    if stream:
        print(f"\n=== {rel} {' '.join(forwarded)}", flush=True)
    output, wait = start(rel, forwarded)
    lines = []
    for line in output:
        if stream:
            print(line, end="", flush=True)
        else:
            lines.append(line)
    return wait(), "".join(lines), time.perf_counter() - t0


def main(argv):
    args, scripts, rest = parse_args(argv)
    from llmk.common.device import INTERPRET

    if INTERPRET and not args.smoke and "--replot" not in rest:
        print(
            "make bench: no CUDA GPU on this machine; benchmarks need one "
            "(`make bench-smoke` runs their code on tiny shapes in the interpreter)",
            file=sys.stderr,
        )
        return 2
    forwarded = (["--smoke"] if args.smoke else []) + rest
    if INTERPRET:
        use_fork_server()
    failed = []
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_one, rel, forwarded, args.jobs == 1): rel for rel in scripts}
        for future in concurrent.futures.as_completed(futures):
            rel = futures[future]
            code, output, seconds = future.result()
            if args.jobs > 1:
                print(
                    f"\n=== {rel} {' '.join(forwarded)}\n{output}",
                    end="" if output.endswith("\n") else "\n",
                    flush=True,
                )
            print(f"=== {rel}: exit {code} in {seconds:.0f}s", flush=True)
            if code != 0:
                failed.append(str(rel))
    out = "build/bench-smoke" if args.smoke else "benchmarks/results"
    print(
        f"\n{len(scripts) - len(failed)} of {len(scripts)} benchmarks ran, {len(failed)} failed, "
        f"in {time.perf_counter() - began:.0f}s; JSON and charts in {out}",
        flush=True,
    )
    if failed:
        print(f"benchmarks that failed: {', '.join(sorted(failed))}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
