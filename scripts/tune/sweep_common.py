"""What the kernel sweeps (norm, softmax, rope, attention, mlp) share: the command line, the check
that a full sweep runs on a GPU and --smoke in the interpreter, the copy bandwidth a sweep's GB/s
are read against, and the one line a config prints (checked first, then timed).

Import it after `common`, whose import sets the interpreter switch before triton is imported.
"""

import argparse
import sys

from llmk.common.device import INTERPRET, describe
from llmk.common.timing import time_ms
from llmk.devtools.bench import copy_bandwidth_GBps, gbps, tflops

# A wrong config is off by about the values' own size; a right one's rounding stays well under 2%.
MAX_REL_ERR = 0.02


def parse_sweep_args(doc, name, dtypes, kernels=None, flags=None):
    """The sweep's arguments: --kernel (repeatable; only where `kernels` is given), --dtype (a key of
    `dtypes`, the first by default), a store_true option for each {"--flag": help} of `flags`, and
    --smoke. Exits unless --smoke runs in the interpreter and a full sweep on a GPU."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if kernels:
        default = "both" if len(kernels) == 2 else "all"
        parser.add_argument(
            "--kernel", choices=kernels, action="append", help=f"kernel(s) to sweep (default: {default})"
        )
    parser.add_argument("--dtype", choices=dtypes, default=next(iter(dtypes)))
    for flag, text in (flags or {}).items():
        parser.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--smoke", action="store_true", help="interpreter, tiny shapes: numbers mean nothing")
    args = parser.parse_args()
    if args.smoke and not INTERPRET:
        sys.exit(f"{name} --smoke runs in the interpreter: set TRITON_INTERPRET=1 on a GPU machine")
    if not args.smoke and INTERPRET:
        sys.exit(f"{name} needs a CUDA GPU (or --smoke for the interpreter)")
    return args


def precompile(warm, tasks, jobs):
    """Runs warm(task) for every task in `jobs` processes at once, each launching a config's
    kernels on small inputs that share the timed shapes' specializations (the same constexprs, ints
    of the same divisibility), so Triton's on-disk cache holds them before the sweep's own first
    call. Compiling, not timing, is most of a sweep's time, and it needs only host cores. warm must
    be a module-level function (the workers are spawned) that swallows a config's refusal. Nothing
    to do in the interpreter or with jobs <= 1."""
    if INTERPRET or jobs <= 1 or not tasks:
        return
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(warm, tasks))


def measure_copy(args, *details):
    """Measures the device-to-device copy bandwidth (GB/s) and returns it, after printing the header
    line: the device, the dtype, `details`, and that bandwidth."""
    copy_GBps = copy_bandwidth_GBps(1 << 20 if args.smoke else 1 << 30)
    print(", ".join([describe(), args.dtype, *details, f"copy {copy_GBps:.0f} GB/s"]), flush=True)
    return copy_GBps


def report_config(
    name,
    call,
    out,
    ref,
    picked,
    n_bytes=None,
    copy_GBps=None,
    flops=None,
    sdpa_TFLOPs=None,
    may_refuse=False,
    versus="SDPA",
):
    """Runs call() once, checks `out` against `ref` (tensors, or tuples of them), then times it and
    prints one line: GB/s and % of copy_GBps for `n_bytes` a call, or TFLOP/s and the ratio to
    sdpa_TFLOPs (the baseline named `versus`) for `flops`. A wrong result prints BAD; where may_refuse, a
    call that raises (out of shared memory or registers) prints REFUSED; neither is timed. '*' marks the
    config the tables pick.
    Returns the rate printed, None for BAD or REFUSED."""
    if (n_bytes is None) == (flops is None):
        raise ValueError("report_config: give exactly one of n_bytes and flops")
    if (n_bytes is not None and copy_GBps is None) or (flops is not None and sdpa_TFLOPs is None):
        raise ValueError("report_config: n_bytes needs copy_GBps, flops needs sdpa_TFLOPs")
    mark = "*" if picked else " "
    try:
        call()
    except Exception as e:
        if not may_refuse:
            raise
        print(f"  {mark} {name}  REFUSED ({type(e).__name__})", flush=True)
        return None
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    err = max((o.float() - r.float()).abs().max().item() for o, r in zip(outs, refs))
    scale = max(r.float().abs().max().item() for r in refs)
    if not err <= MAX_REL_ERR * scale:  # far off, or NaN
        print(f"  {mark} {name}  BAD (max |err| {err:.3g})", flush=True)
        return None
    ms = time_ms(call)
    if n_bytes is not None:
        rate = gbps(n_bytes, ms)
        print(f"  {mark} {name}  {rate:7.0f} GB/s  {100 * rate / copy_GBps:5.1f}% copy", flush=True)
    else:
        rate = tflops(flops, ms)
        print(f"  {mark} {name}  {rate:6.0f} TFLOP/s  {rate / sdpa_TFLOPs:5.2f}x {versus}", flush=True)
    return rate
