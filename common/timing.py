"""Timing the runtime needs: the GEMM autotuners time their candidates with autotune_bench (GPU time
of one call, host out of the loop); the benchmarks (devtools/bench.py) use the same clocks.
In the interpreter a host clock stands in, meaning nothing but that the code runs.
"""

import time

import torch

from llmk.common.device import DEVICE, INTERPRET


def time_ms(fn, warmup_ms=25, rep_ms=100):
    """Median milliseconds of one call of `fn`."""
    if INTERPRET:
        # a smoke run's figure, which times the interpreter and means nothing: one call, timed. The
        # benchmarks' harness calls each provider once before (its max_err, devtools/harness.py), so
        # a smoke run still calls each twice; a warm-up here would add a third interpreted call
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


GRAPH_MS = 50  # a graph_time_ms graph holds about this much work: fewer calls when each is long


def graph_time_ms(fn, reps=20, warmup_ms=25, rep_ms=100):
    """GPU milliseconds of one call of `fn` with the host out of the loop: up to `reps` calls, each
    after an L2 flush, captured in one CUDA graph, minus a graph of the flushes alone. Calls longer
    than GRAPH_MS / reps go fewer to a graph (one, past GRAPH_MS): a 20-call graph of a 0.5 s call
    would take do_bench minutes to warm up and estimate. For calls whose GPU time is below their
    launch cost (decode at small batch), where time_ms measures the host; serving engines replay
    decode steps from CUDA graphs for the same reason. fn must be capturable (no host syncs). The
    interpreter has no graphs: time_ms stands in.

    The flush reads a 256 MB buffer rather than writing it (do_bench zeroes one): a written flush
    leaves L2 full of dirty lines, and writing them back costs the next kernel ~12 us of traffic on
    an H200 (50 MB), 10% of a 70 us decode call; a kernel in a model finds mostly clean lines there
    (weights just read)."""
    if INTERPRET:
        return time_ms(fn)
    import triton.testing

    flush = torch.ones(64 * 2**20, dtype=torch.int32, device=DEVICE)  # 256 MB, 5x an H100's L2
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture asks
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
    end.synchronize()
    reps = max(1, min(reps, int(GRAPH_MS / max(start.elapsed_time(end), 1e-3))))
    torch.cuda.current_stream().wait_stream(side)
    totals = []
    for with_fn in (True, False):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                flush.amax()
                if with_fn:
                    fn()
        graph.replay()
        totals.append(triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
        del graph
    return max(totals[0] - totals[1], 0.0) / reps


def autotune_bench(fn, quantiles=None):
    """The timer of this repository's autotuners (triton.autotune(do_bench=autotune_bench)): GPU
    time of one call, graph_time_ms on a shorter budget. Triton's default, do_bench, zeroes a
    256 MB buffer before each call (dirty lines the timed call then writes back) and, where a
    launch's host work outlasts that flush, times the host: at decode sizes it picked configs up
    to 35% slower in GPU time (scripts/tune/host_and_picks.py auto). Returns the figure once per
    requested quantile, as the autotuner expects."""
    ms = graph_time_ms(fn, warmup_ms=10, rep_ms=40)
    return [ms] * len(quantiles) if quantiles else ms
