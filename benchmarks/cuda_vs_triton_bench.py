"""Hand-written CUDA C++ kernels (cuda_cpp/ops.py) against the Triton kernels on RMSNorm, RoPE and SwiGLU,
as GB/s and as a share of the copy bandwidth of the same run.

Sweeps and byte formulas are the per-op benchmarks' own, imported from them (e = element size):
    rmsnorm            benchmarks/norm_bench.py: read x, write y, read weight:  2*M*N*e + N*e
    rope,              benchmarks/rope_bench.py: read q, k, write q_out, k_out, read cos and sin once:
    rope_interleaved       2*(B*H*T*D + B*Hkv*T*D)*e + 2*T*D*e_c   (shapes B x H x Hkv x T x D)
    swiglu             benchmarks/mlp_bench.py: read gate and up, write y:      3*M*I*e
Providers: triton (normalization/triton_rmsnorm.py, attention/triton_rope.py, mlp/triton_swiglu.py)
and cuda, on the same tensors; max_err is against the fp32 reference. The CUDA kernels are compiled
first (well under a minute on a fresh machine; the time is printed); the timings are do_bench medians of 50 ms.
    python benchmarks/cuda_vs_triton_bench.py          (GPU; benchmarks/results/cuda_vs_triton.json, PNGs)
    python benchmarks/cuda_vs_triton_bench.py --smoke  (tiny shapes; without a GPU, Triton in the
                                                        interpreter only: the CUDA kernels need one)
"""
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402

from attention.rope import apply_rope_ref  # noqa: E402
from attention.triton_rope import apply_rope as triton_rope  # noqa: E402
from benchmarks import mlp_bench, norm_bench, rope_bench  # noqa: E402
from common.bench import time_ms  # noqa: E402
from common.device import DEVICE, INTERPRET  # noqa: E402
from common.results import load_or_measure, make_row, parse_args, plot_sweeps, shape_str, start_run  # noqa: E402
from common.testing import dtype_name  # noqa: E402
from cuda_cpp import ops as cuda_kernels  # noqa: E402
from cuda_cpp.extension import extension, unavailable_reason  # noqa: E402
from mlp.gelu import swiglu_ref  # noqa: E402
from mlp.triton_swiglu import swiglu as triton_swiglu  # noqa: E402
from normalization.rmsnorm import rmsnorm_ref  # noqa: E402
from normalization.triton_rmsnorm import rmsnorm as triton_rmsnorm  # noqa: E402

# op -> (sweeps, smoke sweeps); both providers run every shape of every sweep
SWEEPS = {
    "rmsnorm": (norm_bench.FULL_SWEEPS, norm_bench.SMOKE_SWEEPS),
    "rope": (rope_bench.FULL_SWEEPS["rope"], rope_bench.SMOKE_SWEEPS["rope"]),
    "rope_interleaved": (rope_bench.FULL_SWEEPS["rope_interleaved"], rope_bench.SMOKE_SWEEPS["rope_interleaved"]),
    "swiglu": (mlp_bench.FULL_SWEEPS, mlp_bench.SMOKE_SWEEPS),
}
RMSNORM_BYTES = norm_bench.OPS["rmsnorm"][-1]  # bytes(M, N, e)
SWIGLU_BYTES = mlp_bench.OPS["swiglu"][-1]     # bytes(M, I, e)


def cases(op, shape, dtype):
    """(inputs, fp32 reference, bytes moved, {provider: fn}) of one op at one shape."""
    if op == "rmsnorm":
        m, n = shape
        x, w = torch.randn(m, n, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype)
        return ((x, w), rmsnorm_ref(x.float(), w.float()), RMSNORM_BYTES(m, n, x.element_size()),
                {"triton": triton_rmsnorm, "cuda": cuda_kernels.rmsnorm})
    if op == "swiglu":
        m, n = shape
        gate, up = (torch.randn(m, n, device=DEVICE).to(dtype) for _ in range(2))
        return ((gate, up), swiglu_ref(gate.float(), up.float()), SWIGLU_BYTES(m, n, gate.element_size()),
                {"triton": triton_swiglu, "cuda": cuda_kernels.swiglu})
    batch, heads, kv_heads, seq_len, head_dim = shape
    interleaved = op == "rope_interleaved"
    q = torch.randn(batch, heads, seq_len, head_dim, device=DEVICE).to(dtype)
    k = torch.randn(batch, kv_heads, seq_len, head_dim, device=DEVICE).to(dtype)
    angles = torch.rand(1, seq_len, head_dim, device=DEVICE) * 100  # a (1, T, D) table as HF's
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    expected = apply_rope_ref(q.float(), k.float(), cos.float(), sin.float(), interleaved)
    n_bytes = rope_bench.rope_bytes(*shape, q.element_size(), cos.element_size())
    return ((q, k, cos, sin, interleaved), expected, n_bytes,
            {"triton": triton_rope, "cuda": cuda_kernels.apply_rope})


def max_err(out, expected):
    if isinstance(out, tuple):
        return max((o.float() - e).abs().max().item() for o, e in zip(out, expected))
    return (out.float() - expected).abs().max().item()


def measure(smoke, dtypes, skip_cuda):
    """Time every op, dtype, shape and provider; returns (meta, rows)."""
    meta = start_run(smoke)
    rows = []
    for op, (full, small) in SWEEPS.items():
        shapes = list(dict.fromkeys(s for _, points in (small if smoke else full) for _, s in points))
        for dtype in dtypes:
            for shape in shapes:
                inputs, expected, n_bytes, providers = cases(op, shape, dtype)
                for provider, fn in providers.items():
                    if provider == "cuda" and skip_cuda:
                        continue
                    err = max_err(fn(*inputs), expected)  # also the warm-up
                    ms = time_ms(lambda: fn(*inputs), warmup_ms=10, rep_ms=50)
                    row = make_row(op, shape_str(shape), dtype_name(dtype), provider, ms, meta["copy_GBps"],
                                   n_bytes=n_bytes, max_err=err)
                    rows.append(row)
                    print(f"{op:16s} {row['shape']:>18s} {row['dtype']} {provider:6s} {ms:9.4f} ms "
                          f"{row['GBps']:8.1f} GB/s {row['pct_copy']:5.1f}% of copy  err {err:.2g}", flush=True)
                del inputs, expected
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()  # the widest shapes need the memory the last ones held
    return meta, rows


def summary(rows):
    """One line per op, dtype and shape: both providers' share of the copy bandwidth, and cuda / triton."""
    cell = {(r["op"], r["dtype"], r["shape"], r["provider"]): r for r in rows}
    if not any(r["provider"] == "cuda" for r in rows):
        return
    print(f"\n{'op':16s} {'dtype':5s} {'shape':>18s} {'triton %':>9s} {'cuda %':>7s} {'cuda/triton':>11s}")
    for (op, dtype, shape, provider), r in cell.items():
        cuda_row = cell.get((op, dtype, shape, "cuda"))
        if provider == "triton" and cuda_row:
            print(f"{op:16s} {dtype:5s} {shape:>18s} {r['pct_copy']:9.1f} {cuda_row['pct_copy']:7.1f} "
                  f"{r['ms'] / max(cuda_row['ms'], 1e-9):11.2f}")  # same bytes: speed ratio = time ratio


def main():
    args = parse_args(__doc__.splitlines()[0])
    reason = unavailable_reason() or ("TRITON_INTERPRET=1 puts the inputs on the CPU" if INTERPRET else None)
    if reason is not None:
        print(f"cuda provider skipped: {reason}", flush=True)
    elif not args.replot:
        t0 = time.perf_counter()
        extension()
        print(f"CUDA kernels built or loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    dtypes = (torch.float16,) if args.smoke else (torch.float16, torch.bfloat16)  # smoke: interpreter time
    meta, rows = load_or_measure(args, "cuda_vs_triton", lambda: measure(args.smoke, dtypes, reason is not None))
    summary(rows)
    for op, (full, small) in SWEEPS.items():
        for dtype in dict.fromkeys(r["dtype"] for r in rows):
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
            plot_sweeps(args.out / f"cuda_vs_triton_{op}_{dtype}.png", f"{op} {dtype}: CUDA C++ vs Triton", sel,
                        small if args.smoke else full, meta)


if __name__ == "__main__":
    main()
