"""`make test`: run every */test_*.py as its own process, stream its table, and end with one line
`N passed, M failed` counting cases over all scripts. Exit 1 if any case failed or a script died."""
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
COUNT = re.compile(r"^(\d+) passed, (\d+) failed$")


def main(patterns):
    scripts = sorted(p for pat in patterns for p in ROOT.glob(pat))
    passed = failed = 0
    broken = []
    for script in scripts:
        rel = script.relative_to(ROOT)
        print(f"\n=== {rel}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-u", str(rel)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        counts = None
        for line in proc.stdout:
            print(line, end="", flush=True)
            m = COUNT.match(line.strip())
            counts = (int(m[1]), int(m[2])) if m else counts
        proc.wait()
        print(f"=== {rel}: exit {proc.returncode} in {time.perf_counter() - t0:.0f}s", flush=True)
        if counts is None:  # died before its table: count it as one failed case
            broken.append(str(rel))
            counts = (0, 1)
        elif proc.returncode != 0 and counts[1] == 0:
            broken.append(str(rel))
            counts = (counts[0], 1)
        passed, failed = passed + counts[0], failed + counts[1]
    if broken:
        print(f"\nscripts that did not finish cleanly: {', '.join(broken)}")
    print(f"\n{passed} passed, {failed} failed")
    return 1 if failed or not scripts else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["*/test_*.py"]))
