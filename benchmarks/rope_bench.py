"""Rotary embeddings on q and k: apply_rope against the Hugging Face way in eager PyTorch and under
torch.compile (attention/rope.py's apply_rope_ref on the same tensors), as GB/s and as a share of
the copy bandwidth of the same run.

Bytes moved (q (B, H, T, D), k (B, Hkv, T, D) of e bytes; cos, sin (1, T, D) of e_c bytes, here the
input dtype as LlamaRotaryEmbedding returns them; benchmarks/sweeps.py):
    rope              read q, k, write q_out, k_out, read cos and sin once:
                      2*(B*H*T*D + B*Hkv*T*D)*e + 2*T*D*e_c
    rope_interleaved  the same bytes counted (our kernel reads only half of cos and sin)
Shapes are B x H x Hkv x T x D. Sweeps: T = 512..16384 at B1 H32 Hkv8 D128 (Llama-3-8B's heads)
and B = 1, 4 at T = 4096; the interleaved layout at T = 2048 and 8192. bf16 and fp16 (smoke: bf16).
max_err: the larger of q's and k's against the reference in fp32.
    python benchmarks/rope_bench.py            (GPU; writes benchmarks/results/rope.json and PNGs)
    python benchmarks/rope_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/rope_bench.py --only rope_interleaved --dtype bf16   (a subset)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402

from attention.rope import apply_rope_ref  # noqa: E402
from attention.triton_rope import apply_rope  # noqa: E402
from benchmarks.sweeps import ROPE_SMOKE_SWEEPS, ROPE_SWEEPS, rope_bytes, rope_inputs, shapes_of  # noqa: E402
from common.bench import compile_fn  # noqa: E402
from common.harness import Case, parse_args, run  # noqa: E402
from common.results import plot_sweeps  # noqa: E402


def setup(shape, dtype, interleaved):
    q, k, cos, sin = rope_inputs(shape, dtype)
    return (q, k, cos, sin, interleaved), apply_rope_ref(q.float(), k.float(), cos.float(), sin.float(), interleaved)


def cases(sweeps, dtypes):
    providers = {"triton": apply_rope, "eager": apply_rope_ref, "torch.compile": compile_fn(apply_rope_ref)}
    for op, op_sweeps in sweeps.items():
        for dtype in dtypes:
            for shape in shapes_of(op_sweeps):
                yield Case(op, shape, dtype, providers,
                           lambda shape=shape, dtype=dtype, op=op: setup(shape, dtype, op == "rope_interleaved"),
                           n_bytes=rope_bytes(*shape, dtype.itemsize, dtype.itemsize))


def charts(args, sweeps):
    def draw(meta, rows):
        for op, op_sweeps in sweeps.items():
            for dtype in dict.fromkeys(r["dtype"] for r in rows):
                sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
                plot_sweeps(args.out / f"{op}_{dtype}.png", f"{op} {dtype}", sel, op_sweeps, meta)
    return draw


def main():
    args = parse_args(__doc__)
    sweeps = ROPE_SMOKE_SWEEPS if args.smoke else ROPE_SWEEPS
    dtypes = (torch.bfloat16,) if args.smoke else (torch.bfloat16, torch.float16)  # smoke: compile time
    run(args, "rope", charts(args, sweeps), cases=lambda: cases(sweeps, dtypes))


if __name__ == "__main__":
    main()
