"""Attention forward (prefill): our fused kernel against SDPA's backends and the two PyTorch
references, as TFLOP/s, plus the peak memory of each at T = 8192.

FLOPs: two matmuls of 2 * T * T * D per head, so 4 * B * H * T^2 * D for full attention and
4 * B * H * D * T(T+1)/2 for causal (only the visible query-key pairs count).

Shapes: 16384 tokens per batch (B = 16384 / T) at T = 512..16384, with H * D = 2048 (H 32 at hd 64,
H 16 at hd 128), full and causal, fp16 and bf16. Providers: `triton` (attention/
flash_attention_ops.py with LLMK_ATTENTION_PATH=tl: the tl kernel), `triton-gluon` (the same call with
LLMK_ATTENTION_PATH=gluon: the Gluon forward of attention/gluon_flash_attention_fwd.py, sm_90 only;
also on the packed, window and softcap rows), `sdpa-flash` (FlashAttention-2 inside PyTorch),
`sdpa-cudnn`, `sdpa-efficient`, `naive` (scores materialized in fp32) and `blocked` (online softmax over key
blocks in PyTorch, up to T = 4096). max_err is against SDPA in fp32 on the same inputs.

Training rows (bf16, hd 64 and 128; mode "fwd+bwd" and "bwd", peak_MB): dq, dk, dv on one set of
upstream gradients dO for every provider, against SDPA's memory-efficient backend in fp32 (no T x T
buffer). FLOPs, flash-attention's convention: bwd 2.5x the forward's (its four products and the
recomputed q k^T), fwd+bwd 3.5x. Providers: triton (the tl kernels), triton-gluon (the Gluon forward
and backward), sdpa-flash, sdpa-cudnn, and naive where its
fp32 scores take at most 2 GiB (the interpreter's baseline for the max_err gate). Shapes: B4 H32 T4096
full and causal, B16 H32 T1024 causal, B1 H32 T16384 causal at hd 128; B8 H32 T2048 full and
causal at hd 64; and (op "attention-causal-gqa") the llama-1.5b training step's attention
(benchmarks/train_bench.py): B2 H32 T4096 hd 64 causal over 8 KV heads, SDPA's backends called
with enable_gqa as transformers' SDPA attention calls them, the reference on K and V repeated.

Packed sequences (op "attention-varlen", bf16 hd128, H 32, causal, fwd and fwd+bwd): 64 sequences
of 128..8192 tokens (VARLEN_TOKENS in all) through flash_attention_varlen, against the same batch
padded to its longest sequence through sdpa-cudnn and through our dense kernel. FLOPs are the
packed batch's own (4 * H * D * sum of T(T+1)/2), for every provider: the padded calls do more
work for the same result, which is the point of the comparison.

Sliding window and logit softcap (ops "attention-window" and "attention-softcap", bf16 hd128 H 32,
causal, fwd and fwd+bwd): a window of 4096 keys (window=(4095, 0)) at T 16384, and softcap 50 (Gemma
2's) at B4 T4096. FLOPs count the visible pairs only, for every provider: 4 * B * H * D * pairs, pairs
= L(L+1)/2 + (T - L)(L + 1) for a window of L + 1 keys. Providers: `triton` with the option,
`flex` (torch.nn.attention.flex_attention compiled, a block mask for the
window, a score_mod for the cap) and, for the window, `sdpa-efficient-mask` (an explicit boolean
mask; SDPA's flash and cuDNN backends take no window). max_err is against the fp32 reference with the
same mask and cap (on a GPU, SDPA's memory-efficient backend, causal or with the window's mask,
where there is no cap; the naive attention a batch at a time where there is). Beside them, ops
"attention-window off" and "attention-softcap off": our kernel, sdpa-flash and sdpa-cudnn on the same
shapes without the option (plain causal, its own causal pairs counted): the window's target is its
TFLOP/s on visible pairs, the softcap's at most 10% more time.
    python benchmarks/attention_bench.py            (GPU; benchmarks/results/attention.json and PNGs)
    python benchmarks/attention_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/attention_bench.py --only causal,sdpa-flash --dtype bf16   (a subset)
"""

import functools

import torch
import torch.nn.functional as F

from llmk.attention.attention_paths import forced_path, gluon_runs_here
from llmk.attention.flash_attention_ops import flash_attention, flash_attention_varlen
from llmk.attention.reference_attention import naive_attention, visible_mask
from llmk.attention.reference_blocked_attention import blocked_attention
from llmk.common.device import DEVICE
from llmk.devtools.bench import train_call
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.results import plot_sweeps
from llmk.devtools.testing import COMPILE_BACKEND

DTYPES = (torch.float16, torch.bfloat16)
TOKENS = 16384
FULL_T = (512, 1024, 2048, 4096, 8192, 16384)
MEMORY_T = 8192  # peak memory is recorded at this length
BLOCKED_MAX_T = 4096  # the PyTorch online softmax is a Python loop over key blocks: slow past this


def sweeps(head_dims, lengths, tokens, width):
    """[(xlabel, [(T, (B, H, T, D))])] per head dim, with H * D = width and B * T = tokens."""
    return [
        (
            f"sequence length T (hd {d}, H {width // d}, {tokens} tokens)",
            [(t, (max(1, tokens // t), width // d, t, d)) for t in lengths],
        )
        for d in head_dims
    ]


def sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def call(q, k, v, causal):
        with sdpa_kernel(backend):  # GQA (fewer K and V heads) as transformers' SDPA attention passes it
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])

    return call


def on_path(path, fn):
    """fn with LLMK_ATTENTION_PATH=path around each call."""

    def call(*args, **kwargs):
        with forced_path(path):
            return fn(*args, **kwargs)

    return call


def on_tl(fn):
    """`triton`: fn on the tl forward on every GPU (the default path takes the Gluon one on sm_90,
    which the `triton-gluon` rows time)."""
    return on_path("tl", fn)


def on_gluon(fn):
    """`triton-gluon`: fn on the Gluon kernels (sm_90 with a tested Triton: the forward, and the
    backward where attention_paths.gluon_backward takes the call: head dims 64 and 128;
    the tl backward elsewhere), or why that row is skipped here."""
    if not gluon_runs_here():
        return "the Gluon forward runs on sm_90 with a tested Triton (attention/attention_paths.py)"
    return on_path("gluon", fn)


OURS = ("triton", "triton-gluon")


def providers(t):
    from torch.nn.attention import SDPBackend

    found = {"triton": on_tl(flash_attention), "triton-gluon": on_gluon(flash_attention)}
    if DEVICE == "cuda":  # the fused SDPA backends exist on CUDA only
        found |= {
            "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
            "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
            "sdpa-efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        }
    return found | {
        "naive": naive_attention,
        "blocked": blocked_attention if t <= BLOCKED_MAX_T else f"T > BLOCKED_MAX_T ({BLOCKED_MAX_T})",
    }


def attention_flops(b, h, t, d, causal, window_left=None):
    """4 * B * H * D * the visible pairs: all T^2, the causal T(T+1)/2, or those of a causal window
    of window_left + 1 keys."""
    if window_left is not None:
        return 4 * b * h * d * window_pairs(t, window_left)
    pairs = t * (t + 1) // 2 if causal else t * t
    return 4 * b * h * d * pairs


def peak_mib(fn):
    """Memory allocated by one call beyond what was live before it (MiB)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - before) / 2**20, 1)


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
                yield BenchCase(
                    "attention-causal" if causal else "attention",
                    (b, h, t, d),
                    dtype,
                    providers(t),
                    lambda shape=(b, h, t, d), dtype=dtype, causal=causal: setup(shape, dtype, causal),
                    flops=attention_flops(b, h, t, d, causal),
                    extra=(lambda name, inputs, call: {"peak_MiB": peak_mib(call)}) if memory else None,
                    skip_on=(RuntimeError, torch.cuda.OutOfMemoryError),
                )  # a backend that refuses the shape


TRAIN_DTYPE = torch.bfloat16
WRT = (0, 1, 2)  # q, k, v get gradients
# (B, H, T, D, causal) of the training rows
TRAIN_SHAPES = [
    (4, 32, 4096, 128, False),
    (4, 32, 4096, 128, True),
    (16, 32, 1024, 128, True),
    (1, 32, 16384, 128, True),
    (8, 32, 2048, 64, False),
    (8, 32, 2048, 64, True),
]
SMOKE_TRAIN_SHAPES = [(1, 2, 33, 32, False), (1, 2, 33, 32, True)]
# (B, H, Hkv, T, D) of the GQA training rows (op "attention-causal-gqa", causal): the attention of
# benchmarks/train_bench.py's llama-1.5b step (hidden 2048: 32 heads of 64 over 8 KV heads, B2 x T4096)
TRAIN_GQA_SHAPES = [(2, 32, 8, 4096, 64)]
SMOKE_TRAIN_GQA_SHAPES = [(1, 4, 2, 33, 32)]


NAIVE_TRAIN_MAX_BYTES = 2**31  # the naive backward keeps a few fp32 score matrices of this size


def train_providers(b, h, t):
    from torch.nn.attention import SDPBackend

    found = {"triton": on_tl(flash_attention), "triton-gluon": on_gluon(flash_attention)}
    if DEVICE == "cuda":
        found |= {"sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    scores = b * h * t * t * 4
    found["naive"] = (
        naive_attention
        if scores <= NAIVE_TRAIN_MAX_BYTES
        else f"scores of {scores / 2**30:.0f} GiB in fp32: past NAIVE_TRAIN_MAX_BYTES"
    )
    return found


def reference_grads(inputs, causal, dys):
    """dq, dk, dv in fp32: SDPA's memory-efficient backend on a GPU (no T x T buffer; under GQA on K
    and V repeated to q's heads, so dk and dv sum over each group), the naive attention in the
    interpreter."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    leaves = [t.detach().float().requires_grad_() for t in inputs]
    if DEVICE == "cuda":
        q, k, v = leaves
        group = q.shape[1] // k.shape[1]
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            out = F.scaled_dot_product_attention(
                q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=causal
            )
    else:
        out = naive_attention(*leaves, causal)
    return torch.autograd.grad(out, leaves, [d.float() for d in dys])


def train_setup(shape, causal, kv_heads=None):
    """A training row's inputs (q (B, H, T, D); k and v with kv_heads heads, H where None), its
    upstream gradient and the fp32 reference gradients."""
    b, h, t, d = shape
    q = torch.randn(*shape, device=DEVICE, dtype=TRAIN_DTYPE)
    k, v = (torch.randn(b, kv_heads or h, t, d, device=DEVICE, dtype=TRAIN_DTYPE) for _ in range(2))
    dys = [torch.randn(*shape, device=DEVICE, dtype=TRAIN_DTYPE)]
    return (q, k, v, causal, dys), reference_grads((q, k, v), causal, dys)


# Our providers' paths for a training row's whole call: the backward runs after the forward's call
# returns, so the path around the forward alone would leave the backward to the default dispatch
TRAIN_PATHS = {"triton": "tl", "triton-gluon": "gluon"}


def bind_mode(providers, mode):
    """BenchCase's bind: the provider's forward ("fwd") or its training call (train_call's modes),
    ours on their path (TRAIN_PATHS) forward and backward."""

    def bind(name, inputs):
        *tensors, dys = inputs
        if mode == "fwd":
            return lambda: providers[name](*tensors)
        call = train_call(providers[name], tensors, WRT, mode, dys)
        return on_path(TRAIN_PATHS[name], call) if name in TRAIN_PATHS else call

    return bind


def train_cases(shapes, gqa_shapes=()):
    """The training rows: shapes' (B, H, T, D, causal), op "attention" or "attention-causal"; and
    gqa_shapes' (B, H, Hkv, T, D), causal, op "attention-causal-gqa" (the shape column B, H, T, D;
    FLOPs on the query heads)."""
    rows = [(b, h, None, t, d, causal) for b, h, t, d, causal in shapes]
    rows += [(b, h, hkv, t, d, True) for b, h, hkv, t, d in gqa_shapes]
    for b, h, hkv, t, d, causal in rows:
        providers = train_providers(b, h, t)
        op = "attention-causal-gqa" if hkv else "attention-causal" if causal else "attention"
        for mode, factor in (("fwd+bwd", 3.5), ("bwd", 2.5)):
            yield BenchCase(
                op,
                (b, h, t, d),
                TRAIN_DTYPE,
                providers,
                lambda shape=(b, h, t, d), causal=causal, hkv=hkv: train_setup(shape, causal, hkv),
                flops=int(factor * attention_flops(b, h, t, d, causal)),
                mode=mode,
                peak=True,
                bind=bind_mode(providers, mode),
                skip_on=(RuntimeError, torch.cuda.OutOfMemoryError),
            )


VARLEN_TOKENS = 131072
VARLEN_SEQS, VARLEN_MIN, VARLEN_MAX = 64, 128, 8192
VARLEN_HEADS, VARLEN_DIM = 32, 128


def varlen_lengths(n, low, high, total):
    """n lengths in [low, high] summing to `total` (a fixed draw: the same batch every run)."""
    gen = torch.Generator().manual_seed(0)
    raw = torch.rand(n, generator=gen) ** 2  # more short sequences than long, as packed data has
    lengths = (low + raw / raw.sum() * (total - n * low)).floor().long().clamp(max=high)
    lengths[torch.argmin(lengths)] += total - int(lengths.sum())
    return lengths.tolist()


def padded_rows(lengths):
    """Row of each packed token in the padded batch's (B * max T) rows: sequence i's tokens start
    row i * max T. One gather each way (index_copy, index_select): padding as a model's collator
    would, without a Python loop of copies whose backward clones the whole padded gradient per
    sequence."""
    t_max = max(lengths)
    return torch.cat([i * t_max + torch.arange(n) for i, n in enumerate(lengths)]).to(DEVICE)


def pad(x, rows, lengths):
    """(total, H, D) packed -> (B, H, max T, D) view of a zero-padded (B, max T, H, D) tensor."""
    b, t_max = len(lengths), max(lengths)
    out = x.new_zeros((b * t_max,) + tuple(x.shape[1:])).index_copy(0, rows, x)
    return out.view(b, t_max, *x.shape[1:]).transpose(1, 2)


def unpad(y, rows):
    """(B, H, max T, D) -> (total, H, D): the packed tokens' rows."""
    return y.transpose(1, 2).reshape(-1, y.shape[1], y.shape[3]).index_select(0, rows)


def varlen_setup(lengths, heads, dim, mode):
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, dim, device=DEVICE, dtype=TRAIN_DTYPE) for _ in range(3))
    cu = torch.tensor([0] + lengths, device=DEVICE).cumsum(0).to(torch.int32)
    dys = [torch.randn_like(q)]
    outs = []
    for i in range(len(lengths)):  # the fp32 reference, one sequence at a time
        s = slice(int(cu[i]), int(cu[i + 1]))
        one = [t[s].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        outs.append((one, [dys[0][s].transpose(0, 1).unsqueeze(0)]))
    if mode == "fwd":
        with torch.no_grad():
            want = torch.cat(
                [
                    F.scaled_dot_product_attention(*[t.float() for t in one], is_causal=True)[0].transpose(0, 1)
                    for one, _ in outs
                ]
            )
    else:
        grads = [reference_grads(one, True, dy) for one, dy in outs]
        want = tuple(torch.cat([g[j][0].transpose(0, 1) for g in grads]) for j in range(3))
    return (q, k, v, cu, max(lengths), dys), want


def varlen_providers(lengths):
    from torch.nn.attention import SDPBackend

    def packed(q, k, v, cu, t_max):
        return flash_attention_varlen(q, k, v, cu, cu, t_max, t_max, causal=True)

    rows = padded_rows(lengths)

    def padded(attend):
        # each sequence's keys are its own tokens, at the start of its padded row: the causal mask
        # hides the padding from every real query (top-left and bottom-right alignment agree at Tq = Tk)
        return lambda q, k, v, cu, t_max: unpad(attend(*(pad(t, rows, lengths) for t in (q, k, v)), True), rows)

    found = {"triton": on_tl(packed), "triton-gluon": on_gluon(packed), "triton-padded": padded(on_tl(flash_attention))}
    if DEVICE == "cuda":
        found["sdpa-cudnn-padded"] = padded(sdpa(SDPBackend.CUDNN_ATTENTION))
    return found


def varlen_cases(lengths, heads, dim):
    providers = varlen_providers(lengths)
    flops = sum(attention_flops(1, heads, n, dim, True) for n in lengths)
    for mode in ("fwd", "fwd+bwd"):
        yield BenchCase(
            "attention-varlen",
            (len(lengths), heads, sum(lengths), dim),
            TRAIN_DTYPE,
            providers,
            lambda mode=mode: varlen_setup(lengths, heads, dim, mode),
            flops=int((3.5 if mode == "fwd+bwd" else 1) * flops),
            mode=mode,
            peak=mode != "fwd",
            bind=bind_mode(providers, mode),
            skip_on=(RuntimeError, torch.cuda.OutOfMemoryError),
        )


WINDOW_SHAPE, WINDOW_LEFT = (1, 32, 16384, 128), 4095
SOFTCAP_SHAPE, SOFTCAP = (4, 32, 4096, 128), 50.0
SMOKE_WINDOW = ((1, 2, 40, 32), 9)
SMOKE_SOFTCAP = ((1, 2, 33, 32), 5.0)


def window_pairs(t, left):
    """Query-key pairs a causal window of left + 1 keys sees at length t."""
    left = min(left, t - 1)
    return left * (left + 1) // 2 + (t - left) * (left + 1)


@functools.cache
def window_mask(t, left):
    """(T, T) bool: query i sees key j when i - left <= j <= i. Made at the first row that needs
    it (not while the cases are listed), once for its provider and its reference."""
    return visible_mask(t, t, DEVICE, causal=True, window=(left, 0))


@functools.cache
def block_mask(t, left=None):
    """FlexAttention's block mask, causal, within a window of left + 1 keys where left is given;
    made at first use, as window_mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    def visible(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) if left is None else (q_idx >= kv_idx) & (q_idx - kv_idx <= left)

    return create_block_mask(visible, B=None, H=None, Q_LEN=t, KV_LEN=t, device=DEVICE)


def flex(window_left=None, score_mod=None):
    """torch.nn.attention.flex_attention, compiled, causal (within a window of window_left + 1 keys
    where given), with a score_mod where given; compiled and its block mask made at the first call."""
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention, dynamic=False, backend=COMPILE_BACKEND)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask(q.shape[2], window_left), score_mod=score_mod)


def option_providers(window_left, softcap):
    """The window's (window_left not None) or the softcap's providers (module docstring)."""
    if window_left is not None:
        ours = functools.partial(flash_attention, causal=True, window=(window_left, 0))
        found = {"triton": on_tl(ours), "triton-gluon": on_gluon(ours), "flex": flex(window_left)}
        if DEVICE == "cuda":
            from torch.nn.attention import SDPBackend

            found["sdpa-efficient-mask"] = lambda q, k, v: sdpa_masked(
                SDPBackend.EFFICIENT_ATTENTION, q, k, v, window_mask(q.shape[2], window_left)
            )
        return found

    def cap(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / softcap) * softcap

    ours = functools.partial(flash_attention, causal=True, softcap=softcap)
    return {"triton": on_tl(ours), "triton-gluon": on_gluon(ours), "flex": flex(score_mod=cap)}


def off_providers():
    """The "off" twins' providers: our causal kernel, and SDPA's flash and cuDNN backends, which
    run causal attention but take neither option (the gate's PyTorch baseline where the naive
    scores do not fit)."""
    ours = functools.partial(flash_attention, causal=True)
    found = {"triton": on_tl(ours), "triton-gluon": on_gluon(ours)}
    if DEVICE == "cuda":
        from torch.nn.attention import SDPBackend

        found |= {
            name: functools.partial(sdpa(backend), causal=True)
            for name, backend in (
                ("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
            )
        }
    return found


def sdpa_masked(backend, q, k, v, mask):
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def option_reference(inputs, window_left, softcap, dys):
    """The fp32 output (dys None) or dq, dk, dv: the naive attention with the window and cap in
    the interpreter; on a GPU, SDPA's memory-efficient backend, causal or with the window's mask
    (the naive scores of B1 H32 T16384 alone are 32 GiB in fp32), and for the cap the naive
    attention one batch at a time (its scores then take B times less memory)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    leaves = [t.detach().float().requires_grad_(dys is not None) for t in inputs]
    window = None if window_left is None else (window_left, 0)
    with torch.set_grad_enabled(dys is not None):
        if DEVICE == "cuda" and softcap is None:
            mask = None if window is None else window_mask(inputs[0].shape[2], window_left)
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                out = F.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=mask is None)
        else:
            out = torch.cat(
                [
                    naive_attention(*(t[i : i + 1] for t in leaves), True, window=window, softcap=softcap)
                    for i in range(inputs[0].shape[0])
                ]
            )
    if dys is None:
        return out.detach()
    return torch.autograd.grad(out, leaves, [d.float() for d in dys])


def option_cases(op, shape, window_left, softcap):
    """The option's rows (op), and ours, sdpa-flash's and sdpa-cudnn's without it on the same shape
    (op + " off", plain causal: the window's target compares TFLOP/s, the softcap's times)."""
    b, h, t, d = shape
    scores = b * h * t * t * 4
    window = None if window_left is None else (window_left, 0)

    def naive(**options):  # the gate's same-dtype baseline, where its fp32 scores fit
        if scores > NAIVE_TRAIN_MAX_BYTES:
            return f"scores of {scores / 2**30:.0f} GiB in fp32: past NAIVE_TRAIN_MAX_BYTES"
        return lambda q, k, v: naive_attention(q, k, v, True, **options)

    for name, window, cap, providers in (
        (
            op,
            window_left,
            softcap,
            option_providers(window_left, softcap) | {"naive": naive(window=window, softcap=softcap)},
        ),
        (f"{op} off", None, None, off_providers() | {"naive": naive()}),
    ):
        flops = attention_flops(b, h, t, d, True, window)

        def setup(mode, window=window, cap=cap):
            q, k, v = (torch.randn(*shape, device=DEVICE, dtype=TRAIN_DTYPE) for _ in range(3))
            dys = [torch.randn(*shape, device=DEVICE, dtype=TRAIN_DTYPE)] if mode != "fwd" else None
            return (q, k, v, dys), option_reference((q, k, v), window, cap, dys)

        for mode in ("fwd", "fwd+bwd"):
            yield BenchCase(
                name,
                shape,
                TRAIN_DTYPE,
                providers,
                lambda mode=mode, setup=setup: setup(mode),
                flops=int((3.5 if mode == "fwd+bwd" else 1) * flops),
                mode=mode,
                peak=mode != "fwd",
                bind=bind_mode(providers, mode),
                skip_on=(RuntimeError, torch.cuda.OutOfMemoryError),
            )


def charts(args, panels):
    def draw(meta, rows):
        for op in ("attention", "attention-causal"):
            for dtype in ("fp16", "bf16"):
                sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype and r.get("mode", "fwd") == "fwd"]
                plot_sweeps(args.out / f"{op}_{dtype}.png", f"{op} forward {dtype}", sel, panels, meta, metric="TFLOPs")

    return draw


def main():
    args = parse_args(__doc__)
    panels = sweeps((32, 64), (16, 33), 33, 64) if args.smoke else sweeps((64, 128), FULL_T, TOKENS, 2048)
    train_shapes = (SMOKE_TRAIN_SHAPES, SMOKE_TRAIN_GQA_SHAPES) if args.smoke else (TRAIN_SHAPES, TRAIN_GQA_SHAPES)
    if args.smoke:
        varlen = ([5, 1, 30, 12], 2, 32)
    else:
        varlen = (varlen_lengths(VARLEN_SEQS, VARLEN_MIN, VARLEN_MAX, VARLEN_TOKENS), VARLEN_HEADS, VARLEN_DIM)
    (window_shape, left), (softcap_shape, softcap) = (
        (SMOKE_WINDOW, SMOKE_SOFTCAP) if args.smoke else ((WINDOW_SHAPE, WINDOW_LEFT), (SOFTCAP_SHAPE, SOFTCAP))
    )
    run(
        args,
        "attention",
        charts(args, panels),
        cases=lambda: [
            *cases(panels),
            *train_cases(*train_shapes),
            *varlen_cases(*varlen),
            *option_cases("attention-window", window_shape, left, None),
            *option_cases("attention-softcap", softcap_shape, None, softcap),
        ],
        ours=OURS,
    )


if __name__ == "__main__":
    main()
