"""Attention forward (prefill): our fused kernel against SDPA's backends and the two PyTorch
references, as TFLOP/s, plus the peak memory of each at T = 8192.

FLOPs: two matmuls of 2 * T * T * D per head, so 4 * B * H * T^2 * D for full attention and
4 * B * H * D * T(T+1)/2 for causal (only the visible query-key pairs count).

Shapes: 16384 tokens per batch (B = 16384 / T) at T = 512..16384, with H * D = 2048 (H 32 at hd 64,
H 16 at hd 128), full and causal, fp16 and bf16. Providers: `triton` (attention/
flash_attention_triton.py), `sdpa-flash` (FlashAttention-2 inside PyTorch), `sdpa-cudnn`,
`sdpa-efficient`, `naive` (scores materialized in fp32) and `blocked` (online softmax over key
blocks in PyTorch, up to T = 4096). max_err is against SDPA in fp32 on the same inputs.
    python benchmarks/attention_bench.py            (GPU; benchmarks/results/attention.json and PNGs)
    python benchmarks/attention_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/attention_bench.py --only causal,sdpa-flash --dtype bf16   (a subset)
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attention.blocked_attention import blocked_attention  # noqa: E402
from attention.flash_attention_triton import flash_attention  # noqa: E402
from attention.naive_attention import naive_attention  # noqa: E402
from common.device import DEVICE  # noqa: E402
from common.harness import Case, parse_args, run  # noqa: E402
from common.results import plot_sweeps  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16)
TOKENS = 16384
FULL_T = (512, 1024, 2048, 4096, 8192, 16384)
MEMORY_T = 8192      # peak memory is recorded at this length
BLOCKED_MAX_T = 4096  # the PyTorch online softmax is a Python loop over key blocks: slow past this


def sweeps(head_dims, lengths, tokens, width):
    """[(xlabel, [(T, (B, H, T, D))])] per head dim, with H * D = width and B * T = tokens."""
    return [(f"sequence length T (hd {d}, H {width // d}, {tokens} tokens)",
             [(t, (max(1, tokens // t), width // d, t, d)) for t in lengths]) for d in head_dims]


def sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def call(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call


def providers(t):
    from torch.nn.attention import SDPBackend
    found = {"triton": flash_attention}
    if DEVICE == "cuda":  # the fused SDPA backends exist on CUDA only
        found |= {"sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                  "sdpa-efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION)}
    return found | {"naive": naive_attention,
                    "blocked": blocked_attention if t <= BLOCKED_MAX_T else f"T > BLOCKED_MAX_T ({BLOCKED_MAX_T})"}


def attention_flops(b, h, t, d, causal):
    pairs = t * (t + 1) // 2 if causal else t * t
    return 4 * b * h * d * pairs


def peak_mib(fn):
    """Memory allocated by one call beyond what was live before it (MiB)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - before) / 2 ** 20, 1)


def setup(shape, dtype, causal):
    q, k, v = (torch.randn(*shape, device=DEVICE, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    return (q, k, v, causal), expected


def cases(panels):
    for dtype in DTYPES:
        for b, h, t, d in [s for _, points in panels for _, s in points]:
            for causal in (False, True):
                memory = DEVICE == "cuda" and t == MEMORY_T
                yield Case("attention-causal" if causal else "attention", (b, h, t, d), dtype, providers(t),
                           lambda shape=(b, h, t, d), dtype=dtype, causal=causal: setup(shape, dtype, causal),
                           flops=attention_flops(b, h, t, d, causal),
                           extra=(lambda name, inputs, call: {"peak_MiB": peak_mib(call)}) if memory else None,
                           skip_on=(RuntimeError, torch.cuda.OutOfMemoryError))  # a backend that refuses the shape


def charts(args, panels):
    def draw(meta, rows):
        for op in ("attention", "attention-causal"):
            for dtype in ("fp16", "bf16"):
                sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype]
                plot_sweeps(args.out / f"{op}_{dtype}.png", f"{op} forward {dtype}", sel, panels, meta,
                            metric="TFLOPs")
    return draw


def main():
    args = parse_args(__doc__)
    panels = sweeps((32, 64), (16, 33), 33, 64) if args.smoke else sweeps((64, 128), FULL_T, TOKENS, 2048)
    run(args, "attention", charts(args, panels), cases=lambda: cases(panels))


if __name__ == "__main__":
    main()
