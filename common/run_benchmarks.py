"""`make bench` (GPU) and `make bench-smoke` (anywhere, tiny shapes, scratch folder): run every
benchmarks/*_bench.py in turn; exit nonzero if any fails."""
import pathlib
import subprocess
import sys

import common  # noqa: F401  (interpreter switch before triton is imported)
from common.device import INTERPRET

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(args):
    smoke = "--smoke" in args
    if INTERPRET and not smoke:
        print("make bench: no CUDA GPU on this machine; benchmarks need one "
              "(`make bench-smoke` runs their code on tiny shapes in the interpreter)", file=sys.stderr)
        return 2
    failed = []
    for script in sorted((ROOT / "benchmarks").glob("*_bench.py")):
        rel = script.relative_to(ROOT)
        print(f"\n=== {rel} {' '.join(args)}", flush=True)
        if subprocess.call([sys.executable, "-u", str(rel), *args], cwd=ROOT) != 0:
            failed.append(str(rel))
    if failed:
        print(f"\nbenchmarks that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
