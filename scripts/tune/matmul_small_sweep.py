"""GPU sweep for the few-tile shapes of gemm/triton_matmul_tiled.py (decode M = 1 to 16, M = 128,
1024^3): one-kernel configs and split-K (tile x SPLIT_K) against torch.matmul, to set CONFIGS and
SPLIT_TABLE from measurement (the figures behind them: docs/tuning/gemm.md).

    python scripts/tune/matmul_small_sweep.py            (bf16; ~30 s on an H200, compiles included)
    python scripts/tune/matmul_small_sweep.py --fp16     (fp16)
    python scripts/tune/matmul_small_sweep.py --quick    (only cuBLAS and matmul() as shipped, with the path it took)
    python scripts/tune/matmul_small_sweep.py --quick --bench   (that for every matmul shape of gemm_bench; ~45 s)

Per shape (M x N x K, b row-major (K, N) as in benchmarks/gemm_bench.py), microseconds (do_bench
median, L2 flushed) and, in brackets, cuBLAS time / ours (>= 0.90 is the target):
  cuBLAS | matmul() as shipped (path it took) | best one-kernel config | best split-K candidate
  then the GPU time alone (CUDA graph replay, L2 warm) and the host time of one call, cuBLAS
  and matmul(): do_bench's L2 flush (~80 us of GPU time) hides a host time below it;
  then "1k" lines: every one-kernel config (B_MxB_NxB_K w s); "sK" lines: one split tile, its
  output tile count and tiles/SM, then SPLIT_K = 2, 4, 8, 16 (a slice keeps >= 2 BLOCK_K steps).
Every candidate's result is checked against an fp32 product first (max |err| / max |ref| < 2^-6);
a wrong one prints "BAD".
Read off:
  - SPLIT_TABLE: for each split tile, at which M and tiles/SM ratio each SPLIT_K beats the
    one-kernel best; the row boundaries go where the winner changes (M = 1, 4, 8 and N = 2048,
    4096, 8192, 14336 bracket them).
  - CONFIGS: a one-kernel config that is best where split-K does not help (M = 128, 1024^3)
    joins the table (prune_configs must let it through for that M); "matmul()" shows whether the
    autotuner then finds it.
"""

import sys
import time

import torch
import triton
import triton.testing

from llmk.common.device import sm_count
from llmk.devtools.bench import host_time_us
from llmk.gemm.matmul_ops import launch_matmul, matmul
from llmk.gemm.triton_matmul_tiled import INTERPRET_SMS, plan, tuned

DTYPE = torch.float16 if "--fp16" in sys.argv else torch.bfloat16
QUICK = "--quick" in sys.argv
SHAPES = [(1024, 1024, 1024)] + [
    (m, n, k) for m in (1, 16, 128) for k, n in ((4096, 4096), (4096, 14336), (14336, 4096))
]
SHAPES += [(1, 2048, 4096), (1, 8192, 4096), (4, 4096, 4096), (8, 4096, 4096), (8, 4096, 14336)]  # table edges
if "--bench" in sys.argv:  # benchmarks/gemm_bench.py's matmul shapes
    SHAPES = [(s, s, s) for s in (1024, 2048, 4096, 8192)] + [
        (m, n, k) for k, n in ((4096, 4096), (4096, 14336), (14336, 4096)) for m in (1, 16, 128, 2048, 4096, 8192)
    ]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); a shape tries those with BLOCK_M <= its M
# rounded up to 16 and, past 256 rows, BLOCK_M >= 64 (as prune_configs)
ONE_KERNEL = [
    (16, 32, 256, 4, 4),
    (16, 64, 128, 4, 4),
    (16, 128, 128, 4, 4),
    (32, 64, 128, 4, 4),
    (64, 64, 64, 4, 6),
    (64, 64, 128, 4, 4),
    (64, 64, 128, 4, 5),
    (64, 64, 128, 4, 6),
    (64, 64, 256, 4, 3),
    (64, 128, 64, 4, 4),
    (64, 128, 64, 4, 5),
    (64, 128, 128, 4, 3),
    (128, 64, 64, 4, 4),
    (128, 64, 64, 4, 5),
    (128, 64, 64, 4, 6),
    (128, 64, 128, 4, 3),
    (128, 128, 64, 4, 4),
    (128, 256, 64, 8, 3),
]
SPLIT_TILES = [
    (16, 64, 128, 4, 4),
    (16, 128, 128, 4, 4),
    (16, 256, 64, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (128, 128, 64, 4, 4),
]
SPLITS = (2, 4, 8, 16)


def bench_us(fn):
    return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median") * 1e3


def graph_us(fn):
    """GPU time alone: replays of a CUDA graph (no host launch cost, L2 not flushed)."""
    return triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median") * 1e3


def fits(config, m):
    bm, mb = config[0], max(16, triton.next_power_of_2(m))
    return bm <= mb and (mb <= 256 or bm >= 64)


def name(config):
    bm, bn, bk, w, s = config
    return f"{bm}x{bn}x{bk} w{w} s{s}"


def run_candidate(a, b, c, expected, config, split_k):
    """us of one candidate, or None when it fails to compile or is wrong."""
    fn = lambda: launch_matmul(a, b, None, None, c, config=config, split_k=split_k)  # noqa: E731
    try:
        c.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
    except Exception as e:  # out of shared memory or registers
        print(f"    {name(config)} split {split_k}: {type(e).__name__} {str(e)[:80]}")
        return None
    err = ((c.float() - expected).abs().max() / expected.abs().max()).item()
    if not err < 2**-6:
        print(f"    {name(config)} split {split_k}: BAD (rel err {err:.3g})")
        return None
    return bench_us(fn)


def cell(us, cublas):
    return f"{us:7.1f} ({cublas / us:4.2f})" if us is not None else f"{'-':>14s}"


def sweep_shape(m, n, k, num_sms):
    a = torch.randn(m, k, device="cuda").to(DTYPE)
    b = torch.randn(k, n, device="cuda").to(DTYPE)
    c = torch.empty(m, n, device="cuda", dtype=DTYPE)
    cublas = bench_us(lambda: torch.matmul(a, b))
    matmul(a, b)  # autotune, if the one-kernel path is taken
    shipped = bench_us(lambda: matmul(a, b))
    config, split_k = plan(m, n, k, num_sms)
    if split_k > 1:
        path = f"split {split_k} x {name(config)}"
    else:
        picked = tuned().best_config
        kw = picked.kwargs
        path = f"autotune {kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{picked.num_warps} s{picked.num_stages}"
    ours = lambda: matmul(a, b)  # noqa: E731
    head = (
        f"{f'{m}x{n}x{k}':>16s} cuBLAS {cublas:7.1f}  matmul() {cell(shipped, cublas)} [{path}]\n"
        f"    graphs: cuBLAS {graph_us(lambda: torch.matmul(a, b)):6.1f} matmul() {graph_us(ours):6.1f}; "
        f"host: cuBLAS {host_time_us(lambda: torch.matmul(a, b), calls=100):5.1f} "
        f"matmul() {host_time_us(ours, calls=100):5.1f}"
    )
    if QUICK:
        print(head, flush=True)
        return
    expected = a.float() @ b.float()
    one = {cfg: run_candidate(a, b, c, expected, cfg, 1) for cfg in ONE_KERNEL if fits(cfg, m)}
    split_lines, best_split = [], (None, "")
    for cfg in SPLIT_TILES:
        if not fits(cfg, m):
            continue
        tiles = triton.cdiv(m, cfg[0]) * triton.cdiv(n, cfg[1])
        cells = []
        for s in SPLITS:
            if triton.cdiv(k, cfg[2]) < 2 * s:
                cells.append(f"{'-':>14s}")
                continue
            us = run_candidate(a, b, c, expected, cfg, s)
            cells.append(cell(us, cublas))
            if us is not None and (best_split[0] is None or us < best_split[0]):
                best_split = (us, f"{name(cfg)} split {s}")
        split_lines.append(f"    sK {name(cfg):>20s} {tiles:4d} tiles {tiles / num_sms:5.2f}/SM " + " ".join(cells))
    timed = {cfg: us for cfg, us in one.items() if us is not None}
    best_one = min(timed, key=timed.get) if timed else None
    print(
        head + f"\n    best 1k {cell(timed.get(best_one), cublas)} [{name(best_one) if best_one else '-'}]"
        f"  best sK {cell(best_split[0], cublas)} [{best_split[1]}]"
    )
    print("    1k " + "  ".join(f"{name(cfg)} {cell(us, cublas)}" for cfg, us in one.items()))
    print("\n".join(split_lines), flush=True)
    del a, b, c, expected
    torch.cuda.empty_cache()


if __name__ == "__main__":
    t0 = time.perf_counter()
    num_sms = sm_count(torch.device("cuda", torch.cuda.current_device()), INTERPRET_SMS)
    print(
        torch.cuda.get_device_name(),
        num_sms,
        "SMs; triton",
        triton.__version__,
        "torch",
        torch.__version__,
        "dtype",
        DTYPE,
    )
    print("sK columns: SPLIT_K = " + ", ".join(map(str, SPLITS)) + "; us (cuBLAS / ours)")
    for shape in SHAPES:
        sweep_shape(*shape, num_sms)
    print(f"total {time.perf_counter() - t0:.0f} s")
