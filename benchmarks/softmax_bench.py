"""Row softmax: Triton against torch.softmax (eager) and torch.compile, as GB/s and as a share of
the copy bandwidth of the same run; in training (forward and backward), Liger-Kernel too.

Bytes moved (e = element size, M rows of N): read x, write y: 2*M*N*e. That is the ideal count:
the looped and split paths read x twice (the second time mostly from L2), which is not counted.
Training rows (bf16, op "softmax", mode in the row), the ideal counts again:
    bwd       read y and dy, write dx:                                   3*M*N*e
    fwd+bwd   read x, write y, then read y and dy, write dx:             5*M*N*e
peak_MB: memory a call allocates above its inputs and dy (y saved for the backward, dx, scratch).
Providers: triton (llmk::softmax and llmk::softmax_backward), eager torch.softmax, torch.compile of
it, liger (LigerSoftmaxFunction; skipped where liger_kernel is not installed). max_err: dx against
autograd through torch.softmax in fp32.

Sweeps: width N = 1024..262144 at 16M elements (M = 16M / N: 16384 x 1024 ... 64 x 262144), and
rows M = 1..16384 at N = 4096; fp16 and bf16. max_err: against torch.softmax in fp32. Training:
N = 4096..262144 at 64M-256M elements, and 64 rows of 262144 (the split path).
    python benchmarks/softmax_bench.py            (GPU; writes benchmarks/results/softmax.json and PNGs)
    python benchmarks/softmax_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/softmax_bench.py --only 4096 --dtype bf16 --csv softmax.csv   (a subset)
"""

import torch

from llmk.attention.triton_softmax import softmax
from llmk.benchmarks.sweeps import shapes_of
from llmk.common.validation import DTYPE_NAMES
from llmk.devtools.bench import compile_fn, train_call
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.peers import LIGER, liger
from llmk.devtools.results import plot_sweeps
from llmk.devtools.testing import rand

DTYPES = (torch.float16, torch.bfloat16)
ELEMENTS = 16 * 2**20
FULL_SWEEPS = [
    (
        "width N (16M elements)",
        [(n, (ELEMENTS // n, n)) for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)],
    ),
    ("rows M (N = 4096)", [(m, (m, 4096)) for m in (1, 64, 1024, 4096, 16384)]),
]
# tiny shapes through each path in the interpreter (4 x 64: fused, 4 x 9000: looped, 1 x 9000: split)
SMOKE_SWEEPS = [("width N", [(n, (4, n)) for n in (64, 9000)]), ("rows M", [(m, (m, 9000)) for m in (1, 4)])]
# training rows: the shapes (16384 x 4096, 4096 x 32768, 1024 x 262144), one between, and
# few wide rows (the split path)
TRAIN_SWEEPS = [
    ("width N", [(n, (m, n)) for m, n in ((16384, 4096), (8192, 8192), (4096, 32768), (1024, 262144))]),
    ("rows M (N = 262144)", [(m, (m, 262144)) for m in (64, 1024)]),
]
TRAIN_SMOKE_SWEEPS = [("width N", [(n, (4, n)) for n in (64, 9000)]), ("rows M", [(1, (1, 9000))])]
TRAIN_DTYPE = torch.bfloat16
TRAIN_MODES = {"fwd+bwd": 5, "bwd": 3}  # mode: tensors of M*N moved (module docstring)


def eager(x):
    return torch.softmax(x, -1)


def setup(m, n, dtype):
    x = rand((m, n), dtype)
    return (x,), torch.softmax(x.float(), -1)


def train_setup(m, n, dtype):
    """Inputs (x, dy) and the fp32 reference gradient (dx,)."""
    x, dy = rand((m, n), dtype), rand((m, n), dtype)
    x32 = x.float().requires_grad_()
    return (x, dy), torch.autograd.grad(torch.softmax(x32, -1), x32, dy.float())


def liger_softmax():
    fn = liger("softmax", "LigerSoftmaxFunction")
    return fn if isinstance(fn, str) else fn.apply


def cases(sweeps, train_sweeps):
    providers = {"triton": softmax, "eager": eager, "torch.compile": compile_fn(eager)}
    for dtype in DTYPES:
        for m, n in shapes_of(sweeps):
            yield BenchCase(
                "softmax",
                (m, n),
                dtype,
                providers,
                lambda m=m, n=n, dtype=dtype: setup(m, n, dtype),
                n_bytes=2 * m * n * dtype.itemsize,
            )
    train_providers = {**providers, LIGER: liger_softmax()}
    for mode, tensors in TRAIN_MODES.items():
        for m, n in shapes_of(train_sweeps):
            # inputs = (x, dy): every provider gets the same upstream gradient
            yield BenchCase(
                "softmax",
                (m, n),
                TRAIN_DTYPE,
                train_providers,
                lambda m=m, n=n: train_setup(m, n, TRAIN_DTYPE),
                n_bytes=tensors * m * n * TRAIN_DTYPE.itemsize,
                mode=mode,
                peak=True,
                bind=lambda name, inputs, mode=mode: train_call(
                    train_providers[name], inputs[:1], (0,), mode, inputs[1:]
                ),
            )


def charts(args, sweeps, train_sweeps):
    def draw(meta, rows):
        for dtype in ("fp16", "bf16"):
            sel = [r for r in rows if r["op"] == "softmax" and r["dtype"] == dtype and "mode" not in r]
            plot_sweeps(args.out / f"softmax_{dtype}.png", f"softmax {dtype}", sel, sweeps, meta)
        dtype = DTYPE_NAMES[TRAIN_DTYPE]
        sel = [r for r in rows if r["op"] == "softmax" and r["dtype"] == dtype and r.get("mode") == "fwd+bwd"]
        plot_sweeps(
            args.out / f"softmax_softmax_{dtype}_train.png",
            f"softmax {dtype}, forward + backward (5MNe)",
            sel,
            train_sweeps,
            meta,
        )

    return draw


def main():
    args = parse_args(__doc__)
    sweeps = SMOKE_SWEEPS if args.smoke else FULL_SWEEPS
    train_sweeps = TRAIN_SMOKE_SWEEPS if args.smoke else TRAIN_SWEEPS
    run(args, "softmax", charts(args, sweeps, train_sweeps), cases=lambda: cases(sweeps, train_sweeps))


if __name__ == "__main__":
    main()
