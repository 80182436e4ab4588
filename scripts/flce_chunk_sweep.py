"""The fused linear cross-entropy's chunk size (losses/fused_linear_cross_entropy_ops.py, CHUNK_ROWS):
time and memory of one fwd+bwd call per chunk size, against Liger-Kernel's, at losses_bench's two
shapes (bf16, mean loss, hidden and weight requiring grad).

Per row: ms (do_bench median), TFLOP/s of 6*BT*H*V, and memory in MB (1e6 bytes) above what was
allocated before the call: peak, after the forward (the gradients the forward computed and kept),
and the gradients themselves (grad_hidden + grad_weight); peak - grads is the scratch.

    python scripts/flce_chunk_sweep.py            (GPU; Liger where importable)
    python scripts/flce_chunk_sweep.py --smoke    (interpreter, a tiny shape: the code runs)
"""

import argparse

import torch

import llmk.losses.fused_linear_cross_entropy_ops as flce
from llmk.common.device import DEVICE, INTERPRET
from llmk.common.timing import time_ms
from llmk.devtools.peers import liger

SHAPES = [(8192, 4096, 128256), (16384, 4096, 151936)]
CHUNKS = (128, 192, 256, 320, 384, 512, 640, 768, 1024, 1536, 2048)  # rows
MB = 1e6


def memory(call):
    """(peak, after the forward, kept gradients) in MB above the allocation before the call."""
    if INTERPRET:
        return None, None, None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss, after_fwd = call(forward_only=True)
    fwd = torch.cuda.memory_allocated() - before
    grads = call(backward_of=loss)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    kept = sum(g.numel() * g.element_size() for g in grads)
    del loss, after_fwd, grads
    return round(peak / MB, 1), round(fwd / MB, 1), round(kept / MB, 1)


def provider(fn, hidden, weight, target):
    h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()

    def call(forward_only=False, backward_of=None):
        if backward_of is not None:
            return torch.autograd.grad(backward_of, (h, w))
        loss = fn(h, w, target)
        if forward_only:
            return loss, None
        return torch.autograd.grad(loss, (h, w))

    return call


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    shapes = [(24, 32, 300)] if args.smoke else SHAPES
    chunks = (8,) if args.smoke else CHUNKS
    lig = None if args.smoke else liger("fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyFunction")
    default = flce.CHUNK_ROWS, flce.MAX_CHUNK_BYTES
    print(
        f"{'shape':>22} {'provider':>14} {'rows C':>7} {'ms':>8} {'TFLOP/s':>8} {'peak MB':>8} "
        f"{'fwd MB':>8} {'grads MB':>9} {'scratch':>8}",
        flush=True,
    )
    for n, h, v in shapes:
        torch.manual_seed(0)
        hidden = torch.randn(n, h, device=DEVICE, dtype=torch.bfloat16)
        weight = (torch.randn(v, h, device=DEVICE) * h**-0.5).to(torch.bfloat16)
        target = torch.randint(0, v, (n,), device=DEVICE)
        runs = [(f"ours {c} rows", None, c) for c in chunks]
        if lig is not None and not isinstance(lig, str):
            runs.append(("liger", lambda a, b, t: lig.apply(a, b, t)[0], None))
        elif lig is not None:
            print(f"liger skipped: {lig}")
        for name, fn, c in runs:
            if c is not None:
                flce.CHUNK_ROWS, flce.MAX_CHUNK_BYTES = c, 2**40
                fn = flce.fused_linear_cross_entropy
                rows = flce.chunk_rows(n, v, 2)
            else:
                rows = "-"
            call = provider(fn, hidden, weight, target)
            call()
            ms = time_ms(call)
            peak, fwd, kept = memory(call)
            scratch = None if peak is None else round(peak - kept, 1)
            print(
                f"{f'{n}x{h}x{v}':>22} {name:>14} {rows:>7} {ms:8.2f} {6 * n * h * v / ms / 1e9:8.1f} "
                f"{peak!s:>8} {fwd!s:>8} {kept!s:>9} {scratch!s:>8}",
                flush=True,
            )
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        flce.CHUNK_ROWS, flce.MAX_CHUNK_BYTES = default


if __name__ == "__main__":
    main()
