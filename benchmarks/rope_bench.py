"""Rotary embeddings on q and k: apply_rope against the Hugging Face way in eager PyTorch and under
torch.compile (attention/reference_rope.py's apply_rope_ref on the same tensors), as GB/s and as a share of
the copy bandwidth of the same run; in training (forward and backward), Liger-Kernel too.

Bytes moved (q (B, H, T, D), k (B, Hkv, T, D) of e bytes; cos, sin (1, T, D) of e_c bytes, here the
input dtype as LlamaRotaryEmbedding returns them; benchmarks/sweeps.py):
    rope              read q, k, write q_out, k_out, read cos and sin once:
                      2*(B*H*T*D + B*Hkv*T*D)*e + 2*T*D*e_c
    rope_interleaved  the same bytes counted (our kernel reads only half of cos and sin)
Shapes are B x H x Hkv x T x D. Sweeps: T = 512..16384 at B1 H32 Hkv8 D128 (Llama-3-8B's heads)
and B = 1, 4 at T = 4096; the interleaved layout at T = 2048 and 8192. bf16 and fp16 (smoke: bf16).
max_err: the larger of q's and k's against the reference in fp32.
Training rows (op "rope", bf16, half layout, mode in the row) at the Llama shapes T = 4096, 8192,
16384 (B1) and B4 T4096, q, k and the upstream gradients dq_out, dk_out stored (B, T, H, D) and
seen as (B, H, T, D), as a Llama block's projections give them and as Liger takes them:
    bwd       read dq_out, dk_out, write dq, dk, read cos and sin: the forward's count
    fwd+bwd   the forward, then the backward: twice the forward's count
peak_MB: memory a call allocates above its inputs and upstream gradients. Providers: triton,
eager, torch.compile, liger (LigerRopeFunction, which rotates q, k in place in the forward and
dq_out, dk_out in place in the backward, so it allocates next to nothing; skipped where
liger_kernel is not installed). max_err: the larger of dq's and dk's against autograd in fp32.
    python benchmarks/rope_bench.py            (GPU; writes benchmarks/results/rope.json and PNGs)
    python benchmarks/rope_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/rope_bench.py --only rope_interleaved --dtype bf16   (a subset)
"""

import torch

from llmk.attention.reference_rope import apply_rope_ref, rope_cos_sin
from llmk.attention.triton_rope import apply_rope
from llmk.benchmarks.sweeps import (
    ROPE_SMOKE_SWEEPS,
    ROPE_SWEEPS,
    ROPE_TRAIN_SMOKE_SWEEPS,
    ROPE_TRAIN_SWEEPS,
    rope_bytes,
    rope_inputs,
    rope_train_bytes,
    shapes_of,
)
from llmk.common.validation import DTYPE_NAMES
from llmk.devtools.bench import compile_fn, train_call
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.peers import LIGER, liger_rope
from llmk.devtools.results import plot_sweeps

TRAIN_DTYPE = torch.bfloat16
TRAIN_MODES = ("fwd+bwd", "bwd")
WRT = (0, 1)  # q and k


def setup(shape, dtype, interleaved):
    q, k, cos, sin = rope_inputs(shape, dtype)
    return (q, k, cos, sin, interleaved), apply_rope_ref(q.float(), k.float(), cos.float(), sin.float(), interleaved)


def train_setup(shape, dtype):
    """Inputs (q, k, cos, sin, dq_out, dk_out), q, k and the gradients in (B, T, H, D) storage, and
    the fp32 reference gradients (dq, dk). The table is a true HF one, (1, T, D) in dtype, its two
    halves equal: Liger reads only the first half."""
    q, k = rope_inputs(shape, dtype, layout="BTHD")[:2]
    dq_out, dk_out = rope_inputs(shape, dtype, layout="BTHD")[:2]
    seq_len, head_dim = shape[3], shape[4]
    cos, sin = (t[None] for t in rope_cos_sin(torch.arange(seq_len, device=q.device), head_dim, dtype=dtype))
    q32, k32 = q.float().requires_grad_(), k.float().requires_grad_()
    grads = torch.autograd.grad(
        apply_rope_ref(q32, k32, cos.float(), sin.float()), (q32, k32), (dq_out.float(), dk_out.float())
    )
    return (q, k, cos, sin, dq_out, dk_out), grads


def cases(sweeps, dtypes, train_sweeps):
    providers = {"triton": apply_rope, "eager": apply_rope_ref, "torch.compile": compile_fn(apply_rope_ref)}
    for op, op_sweeps in sweeps.items():
        for dtype in dtypes:
            for shape in shapes_of(op_sweeps):
                yield BenchCase(
                    op,
                    shape,
                    dtype,
                    providers,
                    lambda shape=shape, dtype=dtype, op=op: setup(shape, dtype, op == "rope_interleaved"),
                    n_bytes=rope_bytes(*shape, dtype.itemsize, dtype.itemsize),
                )
    # liger last: it rotates the case's q, k and upstream gradients in place (module docstring)
    train_providers = {**providers, LIGER: liger_rope()}
    e = TRAIN_DTYPE.itemsize
    for mode in TRAIN_MODES:
        for shape in shapes_of(train_sweeps):
            yield BenchCase(
                "rope",
                shape,
                TRAIN_DTYPE,
                train_providers,
                lambda shape=shape: train_setup(shape, TRAIN_DTYPE),
                n_bytes=rope_train_bytes(*shape, e, e, mode),
                mode=mode,
                peak=True,
                bind=lambda name, inputs, mode=mode: train_call(
                    train_providers[name], inputs[:4], WRT, mode, inputs[4:]
                ),
            )


def charts(args, sweeps, train_sweeps):
    def draw(meta, rows):
        for op, op_sweeps in sweeps.items():
            for dtype in dict.fromkeys(r["dtype"] for r in rows):
                sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype and "mode" not in r]
                plot_sweeps(args.out / f"{op}_{dtype}.png", f"{op} {dtype}", sel, op_sweeps, meta)
        dtype = DTYPE_NAMES[TRAIN_DTYPE]
        sel = [r for r in rows if r["op"] == "rope" and r["dtype"] == dtype and r.get("mode") == "fwd+bwd"]
        plot_sweeps(
            args.out / f"rope_rope_{dtype}_train.png", f"rope {dtype}, forward + backward", sel, train_sweeps, meta
        )

    return draw


def main():
    args = parse_args(__doc__)
    sweeps = ROPE_SMOKE_SWEEPS if args.smoke else ROPE_SWEEPS
    train_sweeps = ROPE_TRAIN_SMOKE_SWEEPS if args.smoke else ROPE_TRAIN_SWEEPS
    dtypes = (torch.bfloat16,) if args.smoke else (torch.bfloat16, torch.float16)  # smoke: compile time
    run(args, "rope", charts(args, sweeps, train_sweeps), cases=lambda: cases(sweeps, dtypes, train_sweeps))


if __name__ == "__main__":
    main()
