"""`make test`: run every */test_*.py as its own process, stream its table, and end with one line
counting cases over all scripts: `N passed, M failed`, then `, K skipped (reason)` when some script
could not run its cases here (no CUDA toolchain, an optional package missing), one reason per kind
of skip. Just above it, the rows that failed, by script, so the tail of a long log names them.
Exit 1 if any case failed, or a script died or ran nothing without saying why.

On a GPU with --jobs above 1 the longest scripts (SHARDS) run as several processes at once, each a
share of the cases (devtools.testing's LLMK_TEST_SHARD): their compiles, not the GPU, bound them,
and without the split one script is the whole suite's wall time. Not in the interpreter: there
no script is near the suite's time a job, and each shard would pay the script's set-up again
(CI, two jobs: the split scripts took 30% longer summed).
In the interpreter the scripts are children of one fork server that has imported torch and Triton
(scripts/script_process.py)."""

import argparse
import concurrent.futures
import pathlib
import re
import sys
import time

from llmk.scripts.script_process import start, use_fork_server

ROOT = pathlib.Path(__file__).resolve().parents[1]
# devtools.testing.count_line writes it
COUNT = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped \((.*)\))?$")
# a table row whose verdict column reads FAIL (devtools.testing.print_table)
FAILED_ROW = re.compile(r"\sFAIL(\s|$)")
# script -> the processes it runs as (at most --jobs): on the H200, JOBS=4, one process each,
# test_flash_attention took 966 s of the suite's 966 (3555 s summed over scripts),
# test_inference_attention 465, test_matmul 302, test_gluon_attention 263
SHARDS = {
    "attention/test_flash_attention.py": 4,
    "inference/test_inference_attention.py": 2,
    "gemm/test_matmul.py": 2,
    "attention/test_gluon_attention.py": 2,
}


def run_script(rel, stream, shard=None):
    """Run one test script (or its `shard`, "i/n"); (passed, failed, skipped, skip reason) or None
    if it printed no count line, its exit code, its output (streamed as it comes when `stream`,
    else returned whole), and its failed rows, each table's title line (with its seed) first."""
    output, wait = start(rel, env={"LLMK_TEST_SHARD": shard} if shard else None)
    counts, lines, failures, seed_line = None, [], [], None
    for line in output:
        if stream:
            print(line, end="", flush=True)
        else:
            lines.append(line)
        m = COUNT.match(line.strip())
        counts = (int(m[1]), int(m[2]), int(m[3] or 0), m[4]) if m else counts
        if "TEST_SEED=" in line:  # a table's title: its seed reproduces a failure in it
            seed_line = line.rstrip()[:240]
        elif FAILED_ROW.search(line):
            if seed_line:
                failures.append(seed_line)
                seed_line = None
            failures.append(line.rstrip()[:240])
    return counts, wait(), "".join(lines), failures


def timed_run(rel, stream, shard):
    t0 = time.perf_counter()
    return (*run_script(rel, stream, shard), time.perf_counter() - t0)


def units(scripts, jobs, interpret):
    """(script, shard or None) to run: on a GPU (not `interpret`) with jobs > 1 the SHARDS scripts
    as min(their count, jobs) shards each, first (the longest start first), then the rest in order."""
    split = [
        (rel, f"{i}/{n}")
        for rel in scripts
        if jobs > 1 and not interpret and (n := min(SHARDS.get(str(rel), 1), jobs)) > 1
        for i in range(1, n + 1)
    ]
    whole = [(rel, None) for rel in scripts if not any(rel == r for r, _ in split)]
    return split + whole


def main(patterns, jobs=1):
    """Run the scripts matching `patterns`, `jobs` at a time (each script's output is then printed
    whole when it ends, in the order they end: compiling dominates on a GPU, and uses CPU cores)."""
    from llmk.common.device import INTERPRET, interpreter_problem

    problem = interpreter_problem()
    if problem:  # every script would fail, many with wrong numbers rather than errors: say why once
        print(f"make test: not run: {problem}")
        return 1
    scripts = sorted(p.relative_to(ROOT) for pat in patterns for p in ROOT.glob(pat))
    started = time.perf_counter()
    if INTERPRET:
        use_fork_server()
    passed = failed = 0
    skipped = {}  # reason -> cases
    broken, failures = [], {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        if jobs == 1:
            for rel in scripts:
                print(f"\n=== {rel}", flush=True)
        futures = {
            pool.submit(timed_run, rel, jobs == 1, shard): (rel, shard)
            for rel, shard in units(scripts, jobs, INTERPRET)
        }
        for future in concurrent.futures.as_completed(futures):
            rel, shard = futures[future]
            rel = f"{rel} (shard {shard})" if shard else rel
            counts, code, output, rows, seconds = future.result()
            if rows:
                failures[str(rel)] = rows
            if jobs > 1:
                print(f"\n=== {rel}\n{output}", end="", flush=True)
            print(f"=== {rel}: exit {code} in {seconds:.0f}s", flush=True)
            if counts is None:  # died before its count line: one failed case
                broken.append(str(rel))
                counts = (0, 1, 0, None)
            elif code != 0 and counts[1] == 0:  # ran nothing and gave no reason, or died after its table
                broken.append(str(rel))
                counts = (counts[0], 1, counts[2], counts[3])
            passed, failed = passed + counts[0], failed + counts[1]
            if counts[2]:
                skipped[counts[3]] = skipped.get(counts[3], 0) + counts[2]
    for rel, rows in sorted(failures.items()):
        print(f"\nfailed in {rel}:")
        for row in rows[:20]:
            print(f"  {row}")
    if broken:
        print(f"\nscripts that did not finish cleanly: {', '.join(sorted(broken))}")
    line = f"{passed} passed, {failed} failed"
    if skipped:
        reasons = "; ".join(reason if len(skipped) == 1 else f"{n} {reason}" for reason, n in skipped.items())
        line += f", {sum(skipped.values())} skipped ({reasons})"
    print(f"\n{len(scripts)} test scripts, {jobs} at a time, in {time.perf_counter() - started:.0f} s")
    print(f"\n{line}")
    return 1 if failed or not scripts else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run test scripts; the last line counts their cases.")
    parser.add_argument("patterns", nargs="*", default=["*/test_*.py"], help="globs from the repository root")
    parser.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=1,
        help="scripts run at once (default 1, streamed; more prints each script when it ends)",
    )
    args = parser.parse_args()
    sys.exit(main(args.patterns, max(1, args.jobs)))
