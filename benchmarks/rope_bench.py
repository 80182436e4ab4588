"""Rotary embeddings on q and k: apply_rope against the Hugging Face way in eager PyTorch and under
torch.compile (attention/rope.py's apply_rope_ref on the same tensors), as GB/s and as a share of
the copy bandwidth of the same run.

Bytes moved (q (B, H, T, D), k (B, Hkv, T, D) of e bytes; cos, sin (1, T, D) of e_c bytes, here the
input dtype as LlamaRotaryEmbedding returns them):
    rope              read q, k, write q_out, k_out, read cos and sin once:
                      2*(B*H*T*D + B*Hkv*T*D)*e + 2*T*D*e_c
    rope_interleaved  the same bytes counted (our kernel reads only half of cos and sin)
Shapes are B x H x Hkv x T x D. Sweeps: T = 512..16384 at B1 H32 Hkv8 D128 (Llama-3-8B's heads)
and B = 1, 4 at T = 4096; the interleaved layout at T = 2048 and 8192.
    python benchmarks/rope_bench.py            (GPU; writes benchmarks/results/rope.json and PNGs)
    python benchmarks/rope_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402

from attention.rope import apply_rope_ref  # noqa: E402
from attention.triton_rope import apply_rope  # noqa: E402
from common.bench import compile_fn, time_ms  # noqa: E402
from common.device import DEVICE  # noqa: E402
from common.results import load_or_measure, make_row, parse_args, plot_sweeps, shape_str, start_run  # noqa: E402
from common.testing import dtype_name  # noqa: E402


def llama(batch, seq_len):
    return (batch, 32, 8, seq_len, 128)


FULL_SWEEPS = {
    "rope": [("sequence length T (B1 H32 Hkv8 D128)", [(t, llama(1, t)) for t in (512, 1024, 2048, 4096, 8192, 16384)]),
             ("batch B (T = 4096)", [(b, llama(b, 4096)) for b in (1, 4)])],
    "rope_interleaved": [("sequence length T (B1 H32 Hkv8 D128)", [(t, llama(1, t)) for t in (2048, 8192)])],
}
SMOKE_SWEEPS = {
    "rope": [("sequence length T", [(t, (1, 4, 1, t, 64)) for t in (8,)]),
             ("batch B", [(b, (b, 4, 1, 8, 64)) for b in (1, 2)])],
    "rope_interleaved": [("sequence length T", [(8, (1, 4, 1, 8, 64))])],
}


def rope_bytes(batch, heads, kv_heads, seq_len, head_dim, e, e_table):
    return 2 * (batch * heads * seq_len * head_dim + batch * kv_heads * seq_len * head_dim) * e \
        + 2 * seq_len * head_dim * e_table


def measure(sweeps, dtypes, smoke):
    """Time every op, dtype, shape and provider; returns (meta, rows)."""
    meta = start_run(smoke)
    compiled = compile_fn(apply_rope_ref)
    rows = []
    for op, op_sweeps in sweeps.items():
        interleaved = op == "rope_interleaved"
        providers = {"triton": apply_rope, "eager": apply_rope_ref, "torch.compile": compiled}
        shapes = list(dict.fromkeys(s for _, points in op_sweeps for _, s in points))
        for dtype in dtypes:
            for batch, heads, kv_heads, seq_len, head_dim in shapes:
                q = torch.randn(batch, heads, seq_len, head_dim, device=DEVICE).to(dtype)
                k = torch.randn(batch, kv_heads, seq_len, head_dim, device=DEVICE).to(dtype)
                angles = torch.rand(1, seq_len, head_dim, device=DEVICE) * 100  # a (1, T, D) table as HF's
                cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
                expected = apply_rope_ref(q.float(), k.float(), cos.float(), sin.float(), interleaved)
                n_bytes = rope_bytes(batch, heads, kv_heads, seq_len, head_dim, q.element_size(), cos.element_size())
                for provider, fn in providers.items():
                    out = fn(q, k, cos, sin, interleaved)  # also the warm-up (and compile)
                    err = max((o.float() - e).abs().max().item() for o, e in zip(out, expected))
                    del out
                    ms = time_ms(lambda: fn(q, k, cos, sin, interleaved))
                    row = make_row(op, shape_str((batch, heads, kv_heads, seq_len, head_dim)), dtype_name(dtype),
                                   provider, ms, meta["copy_GBps"], n_bytes=n_bytes, max_err=err)
                    rows.append(row)
                    print(f"{op:16s} {row['shape']:>18s} {row['dtype']} {provider:13s} {ms:9.4f} ms "
                          f"{row['GBps']:8.1f} GB/s {row['pct_copy']:5.1f}% of copy  err {err:.2g}", flush=True)
                del q, k, cos, sin, expected
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
    return meta, rows


def main():
    args = parse_args(__doc__.splitlines()[0])
    sweeps = SMOKE_SWEEPS if args.smoke else FULL_SWEEPS
    dtypes = (torch.bfloat16,) if args.smoke else (torch.bfloat16, torch.float16)  # smoke: compile time
    meta, rows = load_or_measure(args, "rope", lambda: measure(sweeps, dtypes, args.smoke))
    for op, op_sweeps in sweeps.items():
        for dtype in dict.fromkeys(r["dtype"] for r in rows):
            sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
            plot_sweeps(args.out / f"{op}_{dtype}.png", f"{op} {dtype}", sel, op_sweeps, meta)


if __name__ == "__main__":
    main()
