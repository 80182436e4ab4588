"""GEMM: our matmul against cuBLAS (torch.matmul), the fused bias+activation epilogue against
cuBLAS followed by the separate ops, and rmsnorm_linear against RMSNorm followed by cuBLAS.

Work and bytes (M, N, K; e = element size):
    FLOPs  2*M*N*K                     (TFLOP/s: the figure for every row)
    bytes  (M*K + K*N + M*N) * e       read a and b once, write c (GB/s, given for M <= 128 only:
                                       there the GEMM is bound by reading b, and GB/s against the
                                       copy bandwidth says how close to that bound it runs)
    epilogue rows add the bias (N*e); rmsnorm_linear rows add the norm weight (K*e) and count the
    RMSNorm's own FLOPs as nothing.
graph_ms (rows with M <= 64, and every provider of a shape where one takes under 50 us): the
    same call's GPU time with the host out of the loop (common.bench.graph_time_ms: CUDA-graph
    replays after an L2 flush). A decode-size GEMM (or 1024^3) runs for 10-50 us, about what one
    launch costs the host (Triton's more than cuBLAS's), so do_bench's "ms" there partly measures
    the host; serving engines replay decode steps from CUDA graphs, where only graph_ms counts.
config (our matmul's rows): the kernel and tile that ran (gemm.triton_matmul.kernel_choice).

Shapes are keyed "MxNxK". Sweeps (fp16 and bf16): square M = N = K = 1024..8192; tokens
M = 1..8192 at the (K, N) of a 4096-wide model's projections: attention (4096, 4096), MLP up
(4096, 14336), MLP down (14336, 4096).
Decode against an nn.Linear weight's transpose (op "matmul_linear", b = W.T): M = 1, 16 at the
same (K, N).
Epilogue (bias+gelu, bias+silu; bf16): M = 16, 256, 2048 at (K, N) = (4096, 14336), against
"cuBLAS+eager" (torch.matmul, then act(y + bias)) and torch.compile of the same function.
rmsnorm_linear (bf16): M = 1..4096 at K = 4096, N = 4096 and 14336, against "F.rms_norm+cuBLAS"
and "triton-rmsnorm+cuBLAS" (normalization/triton_rmsnorm.py, then torch.matmul).
    python benchmarks/gemm_bench.py            (GPU; writes benchmarks/results/gemm.json and PNGs)
    python benchmarks/gemm_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common.bench import compile_fn, graph_time_ms, time_ms  # noqa: E402
from common.device import DEVICE  # noqa: E402
from common.results import load_or_measure, make_row, parse_args, plot_sweeps, shape_str, start_run  # noqa: E402
from common.testing import dtype_name  # noqa: E402
from gemm.triton_matmul import kernel_choice, matmul  # noqa: E402
from gemm.triton_rmsnorm_linear import rmsnorm_linear  # noqa: E402
from normalization.triton_rmsnorm import rmsnorm  # noqa: E402

EPS = 1e-6
BYTES_UP_TO_M = 128  # GB/s for the rows bound by reading b
GRAPH_UP_TO_M = 64   # GPU time (CUDA graphs) beside do_bench's for decode-size rows
GRAPH_BELOW_MS = 0.05  # and for any shape a provider runs in under 50 us (1024^3: ~10 us), where the host shows


def llm_sweep(ms, k, n, label):
    return (f"tokens M, {label} (K={k}, N={n})", [(m, (m, n, k)) for m in ms])


FULL = dict(
    matmul=[("M = N = K", [(s, (s, s, s)) for s in (1024, 2048, 4096, 8192)])]
    + [llm_sweep((1, 16, 128, 2048, 4096, 8192), k, n, label)
       for k, n, label in ((4096, 4096, "attention"), (4096, 14336, "MLP up"), (14336, 4096, "MLP down"))],
    # decode against b = W.T, an nn.Linear weight (N, K) as a model holds it (the sweeps above use a
    # row-major (K, N) b; one-row products take a different kernel for each)
    matmul_linear=[llm_sweep((1, 16), k, n, label)
                   for k, n, label in ((4096, 4096, "attention"), (4096, 14336, "MLP up"), (14336, 4096, "MLP down"))],
    epilogue=[llm_sweep((16, 256, 2048), 4096, 14336, "MLP up")],
    rmsnorm_linear=[llm_sweep((1, 4, 16, 32, 64, 256, 1024, 4096), 4096, n, f"N={n}") for n in (4096, 14336)],
)
SMOKE = dict(
    matmul=[("M = N = K", [(s, (s, s, s)) for s in (32, 64)]), llm_sweep((1, 16), 64, 96, "tiny")],
    matmul_linear=[llm_sweep((1, 16), 64, 96, "tiny")],
    epilogue=[llm_sweep((16,), 64, 96, "tiny")],
    rmsnorm_linear=[llm_sweep((1, 4), 64, 64, "tiny")],
)
ACTIVATIONS = {"gelu": F.gelu, "silu": F.silu}


def shapes_of(sweeps):
    return list(dict.fromkeys(s for _, points in sweeps for _, s in points))


def add_rows(rows, copy_GBps, op, shape, dtype, providers, expected, n_bytes, configs=None):
    """Time every provider (fn of no arguments) of one shape; max_err against `expected` (fp32).
    GPU times (graph_ms) too for decode sizes and wherever a provider's do_bench median is below
    GRAPH_BELOW_MS. configs: {provider: fn of no arguments} naming the kernel config that ran (the
    row's "config"), asked after the warm-up call has tuned it."""
    m, n, k = shape
    shape_rows = []
    for provider, fn in providers.items():
        err = (fn().float() - expected).abs().max().item()  # also the warm-up (autotune, compile)
        ms = time_ms(fn)
        row = make_row(op, shape_str(shape), dtype_name(dtype), provider, ms, copy_GBps,
                       n_bytes=n_bytes if m <= BYTES_UP_TO_M else None, flops=2 * m * n * k, max_err=err)
        if configs and provider in configs:
            row["config"] = configs[provider]()
        shape_rows.append((fn, err, row))
    with_graph = m <= GRAPH_UP_TO_M or min(row["ms"] for _, _, row in shape_rows) < GRAPH_BELOW_MS
    for fn, err, row in shape_rows:
        graph = ""
        if with_graph:
            row["graph_ms"] = round(graph_time_ms(fn), 5)
            scale = row["ms"] / max(row["graph_ms"], 1e-9)
            row["graph_pct_copy"] = round(row["pct_copy"] * scale, 1) if row["pct_copy"] is not None else None
            graph = f"  graph {row['graph_ms']:9.4f} ms"
        rows.append(row)
        bw = f"{row['GBps']:8.1f} GB/s" if row["GBps"] is not None else " " * 13
        print(f"{op:17s} {row['shape']:>16s} {row['dtype']} {row['provider']:22s} {row['ms']:9.4f} ms "
              f"{row['TFLOPs']:7.1f} TFLOP/s {bw}{graph}  err {err:.2g}  {row.get('config', '')}", flush=True)


def free():
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def measure_matmul(rows, copy_GBps, sweeps, linear=False):
    """op "matmul": b row-major (K, N); linear: op "matmul_linear", b = W.T for W (N, K) contiguous."""
    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in shapes_of(sweeps):
            a = torch.randn(m, k, device=DEVICE).to(dtype)
            b = torch.randn(n, k, device=DEVICE).to(dtype).t() if linear else torch.randn(k, n, device=DEVICE).to(dtype)
            expected = a.float() @ b.float()
            providers = {"triton": lambda: matmul(a, b), "cuBLAS": lambda: torch.matmul(a, b)}
            add_rows(rows, copy_GBps, "matmul_linear" if linear else "matmul", (m, n, k), dtype, providers, expected,
                     (m * k + k * n + m * n) * a.element_size(), {"triton": lambda: kernel_choice(a, b)})
            del a, b, expected
            free()


def measure_epilogue(rows, copy_GBps, sweeps):
    dtype = torch.bfloat16
    for name, act in ACTIVATIONS.items():
        def eager(a, b, bias, act=act):
            return act(torch.matmul(a, b) + bias)
        compiled = compile_fn(eager)
        for m, n, k in shapes_of(sweeps):
            a, b = torch.randn(m, k, device=DEVICE).to(dtype), torch.randn(k, n, device=DEVICE).to(dtype)
            bias = torch.randn(n, device=DEVICE).to(dtype)
            expected = act(a.float() @ b.float() + bias.float())
            providers = {"triton": lambda: matmul(a, b, bias, name), "cuBLAS+eager": lambda: eager(a, b, bias),
                         "torch.compile": lambda: compiled(a, b, bias)}
            add_rows(rows, copy_GBps, f"matmul_bias_{name}", (m, n, k), dtype, providers, expected,
                     (m * k + k * n + m * n + n) * a.element_size(), {"triton": lambda: kernel_choice(a, b)})
            del a, b, bias, expected
            free()


def measure_rmsnorm_linear(rows, copy_GBps, sweeps):
    dtype = torch.bfloat16
    for m, n, k in shapes_of(sweeps):
        x = torch.randn(m, k, device=DEVICE).to(dtype)
        norm_w = (1 + 0.1 * torch.randn(k, device=DEVICE)).to(dtype)
        w = (torch.randn(n, k, device=DEVICE) * k ** -0.5).to(dtype)
        xf = x.float()
        expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * norm_w.float()) @ w.float().t()
        providers = {
            "triton": lambda: rmsnorm_linear(x, norm_w, w, EPS),
            "F.rms_norm+cuBLAS": lambda: torch.matmul(F.rms_norm(x, (k,), norm_w, EPS), w.t()),
            "triton-rmsnorm+cuBLAS": lambda: torch.matmul(rmsnorm(x, norm_w, EPS), w.t()),
        }
        add_rows(rows, copy_GBps, "rmsnorm_linear", (m, n, k), dtype, providers, expected,
                 (m * k + k * n + m * n + k) * x.element_size())
        del x, norm_w, w, xf, expected
        free()


def measure(config, smoke):
    """Time every op, dtype, shape and provider; returns (meta, rows)."""
    meta = start_run(smoke)
    rows = []
    measure_matmul(rows, meta["copy_GBps"], config["matmul"])
    measure_matmul(rows, meta["copy_GBps"], config["matmul_linear"], linear=True)
    measure_epilogue(rows, meta["copy_GBps"], config["epilogue"])
    measure_rmsnorm_linear(rows, meta["copy_GBps"], config["rmsnorm_linear"])
    return meta, rows


def main():
    args = parse_args(__doc__.splitlines()[0])
    config = SMOKE if args.smoke else FULL
    meta, rows = load_or_measure(args, "gemm", lambda: measure(config, args.smoke))
    charts = [("matmul", config["matmul"])] + [(f"matmul_bias_{a}", config["epilogue"]) for a in ACTIVATIONS] \
        + [("rmsnorm_linear", config["rmsnorm_linear"])]
    for op, sweeps in charts:
        for dtype in ("fp16", "bf16"):
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
            if sel:
                plot_sweeps(args.out / f"gemm_{op}_{dtype}.png", f"{op} {dtype}", sel, sweeps, meta, metric="TFLOPs")
    # the decode rows against the memory bound, GPU time beside do_bench's
    for op, sweeps, title in (("matmul", config["matmul"][1:], "matmul"),
                              ("matmul_linear", config["matmul_linear"], "matmul, b = W.T")):
        for dtype in ("fp16", "bf16"):
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype and r["GBps"] is not None]
            sel += [dict(r, provider=f"{r['provider']} (graph)", GBps=round(r["GBps"] * r["ms"] / r["graph_ms"], 1))
                    for r in sel if r.get("graph_ms")]
            name = "decode" if op == "matmul" else "linear_decode"
            plot_sweeps(args.out / f"gemm_matmul_{name}_{dtype}.png", f"{title} {dtype}, M <= {BYTES_UP_TO_M}", sel,
                        [(label, [(x, s) for x, s in points if s[0] <= BYTES_UP_TO_M]) for label, points in sweeps], meta)


if __name__ == "__main__":
    main()
