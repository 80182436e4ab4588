"""Row softmax: Triton against torch.softmax (eager) and torch.compile, as GB/s and as a share of
the copy bandwidth of the same run.

Bytes moved (e = element size, M rows of N): read x, write y: 2*M*N*e. That is the ideal count:
the looped and split paths read x twice (the second time mostly from L2), which is not counted.

Sweeps: width N = 1024..262144 at 16M elements (M = 16M / N: 16384 x 1024 ... 64 x 262144), and
rows M = 1..16384 at N = 4096; fp16 and bf16. max_err: against torch.softmax in fp32.
    python benchmarks/softmax_bench.py            (GPU; writes benchmarks/results/softmax.json and PNGs)
    python benchmarks/softmax_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/softmax_bench.py --only 4096 --dtype bf16 --csv softmax.csv   (a subset)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402

from attention.triton_softmax import softmax  # noqa: E402
from benchmarks.sweeps import shapes_of  # noqa: E402
from common.bench import compile_fn  # noqa: E402
from common.harness import Case, parse_args, run  # noqa: E402
from common.results import plot_sweeps  # noqa: E402
from common.testing import rand  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16)
ELEMENTS = 16 * 2 ** 20
FULL_SWEEPS = [
    ("width N (16M elements)", [(n, (ELEMENTS // n, n)) for n in (1024, 2048, 4096, 8192, 16384, 32768,
                                                                    65536, 131072, 262144)]),
    ("rows M (N = 4096)", [(m, (m, 4096)) for m in (1, 64, 1024, 4096, 16384)]),
]
# tiny shapes through each path in the interpreter (4 x 64: fused, 4 x 9000: looped, 1 x 9000: split)
SMOKE_SWEEPS = [("width N", [(n, (4, n)) for n in (64, 9000)]),
                ("rows M", [(m, (m, 9000)) for m in (1, 4)])]


def eager(x):
    return torch.softmax(x, -1)


def setup(m, n, dtype):
    x = rand((m, n), dtype)
    return (x,), torch.softmax(x.float(), -1)


def cases(sweeps):
    providers = {"triton": softmax, "eager": eager, "torch.compile": compile_fn(eager)}
    for dtype in DTYPES:
        for m, n in shapes_of(sweeps):
            yield Case("softmax", (m, n), dtype, providers, lambda m=m, n=n, dtype=dtype: setup(m, n, dtype),
                       n_bytes=2 * m * n * dtype.itemsize)


def charts(args, sweeps):
    def draw(meta, rows):
        for dtype in ("fp16", "bf16"):
            sel = [r for r in rows if r["op"] == "softmax" and r["dtype"] == dtype]
            plot_sweeps(args.out / f"softmax_{dtype}.png", f"softmax {dtype}", sel, sweeps, meta)
    return draw


def main():
    args = parse_args(__doc__)
    sweeps = SMOKE_SWEEPS if args.smoke else FULL_SWEEPS
    run(args, "softmax", charts(args, sweeps), cases=lambda: cases(sweeps))


if __name__ == "__main__":
    main()
