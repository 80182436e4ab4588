"""Decode attention (one new token per sequence against its KV cache): our contiguous and paged
kernels against SDPA's backends at q_len 1 and the fp32 reference, as GB/s of K and V read and as a
share of the copy bandwidth measured in the same run.

Bytes: K and V read once, 2 * B * Hkv * T * D * e (e = 2 bytes, fp16). q and O (B * H * D * e
each) are under 0.1% of that at every shape here and are left out.

Shapes: H = 32 query heads, hd 128, fp16, every sequence at length T (= T_max); Hkv = 32 (op
"decode-mha") and Hkv = 8 (op "decode-gqa", GQA 32/8). Panels: T = 512..32768 at B = 1 and at
B = 16, and B = 1..64 at T = 8192. Head dims 80 and 96 (Phi-2's, Phi-3-mini's; the kernels pad
them to 128-wide tiles and read D columns) beside 128 at three of those points, B1 T8192, B16 T4096
and B64 T8192 (their own PNG, inference_<op>_head_dims_fp16.png): a row's bytes scale with D, its
share of copy compares across head dims. Caches past CACHE_MAX_BYTES are skipped. Providers:
    triton          inference/triton_inference_attention.py decode_attention on a (B, T, Hkv, D)
                    cache (inference/kv_cache.py's layout); its split count is in the row
    triton-paged    paged_decode_attention on the same tokens in 16-token pages, shuffled
    sdpa-flash, sdpa-efficient, sdpa-math
                    F.scaled_dot_product_attention with q (B, H, 1, D) and its preferred contiguous
                    (B, Hkv, T, D) K and V, each backend forced with sdpa_kernel; GQA by
                    enable_gqa=True, or, for a backend that refuses it, K and V expanded to H heads
                    once outside the timing (the row then has "kv_expanded": true); a backend that
                    refuses the shape is reported as skipped
    naive           inference/reference_decode_attention.py (fp32 math), caches up to NAIVE_MAX_BYTES
e4m3 caches (ops "decode-mha-e4m3", "decode-gqa-e4m3", the same shapes): K and V quantized to
e4m3 with an fp32 scale a (token, kv head) (inference/kv_cache.py), read by the same kernels
(triton-e4m3, triton-paged-e4m3) and by naive on the dequantized cache. Bytes: 2 * B * Hkv * T *
(D + 4). max_err is against the fp32 reference on the 16-bit cache, so it shows what e4m3 costs;
the gate's baseline is the reference on the dequantized cache's first sequences (untimed, every
shape). The summary compares their GPU time with the 16-bit rows' at the same shape.
max_err: against the fp32 reference on the first (up to) two sequences. The max_err gate holds
    triton and triton-paged to the SDPA backends' and naive's error (devtools/harness.py).
graph_ms, graph_pct_copy: the same call's GPU time with the host out of the loop (devtools.bench.
    graph_time_ms: CUDA-graph replays after an L2 flush), for triton, triton-paged, sdpa-flash and
    sdpa-efficient. ms (do_bench) includes what the GPU waits for the host: at B1 a Triton launch
    costs more host time (~30 us a kernel with triton 3.6) than the kernel's GPU time, while serving
    engines replay decode steps from CUDA graphs, where only graph_ms counts.
    python benchmarks/inference_bench.py            (GPU; benchmarks/results/inference.json and PNGs)
    python benchmarks/inference_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/inference_bench.py --only decode-gqa,triton   (a subset)
"""

import torch
import torch.nn.functional as F

from llmk.common.device import DEVICE, sm_count
from llmk.devtools.harness import BenchCase, max_err, parse_args, run
from llmk.devtools.results import plot_sweeps, shape_str
from llmk.inference.kv_cache import as_token_minor, dequantize_kv, quantize_kv
from llmk.inference.paged_kv_cache import as_value_pages, to_pages
from llmk.inference.reference_decode_attention import decode_attention_reference
from llmk.inference.triton_inference_attention import (
    FP8,
    INTERPRET_SMS,
    decode_attention,
    decode_config,
    paged_decode_attention,
)

OURS = ("triton", "triton-paged", "triton-e4m3", "triton-paged-e4m3")
E4M3 = ("triton-e4m3", "triton-paged-e4m3")
N_HEADS, HEAD_DIM, DTYPE, PAGE_SIZE = 32, 128, torch.float16, 16
# head_dims: the other head dims, at the (B, T) points of head_dim_points, beside d
FULL = dict(
    heads=N_HEADS,
    kv_heads=(32, 8),
    d=HEAD_DIM,
    lengths=(512, 1024, 2048, 4096, 8192, 16384, 32768),
    t_batches=(1, 16),
    batches=(1, 2, 4, 8, 16, 32, 64),
    b_length=8192,
    head_dims=(80, 96),
    head_dim_points=((1, 8192), (16, 4096), (64, 8192)),
)
SMOKE = dict(
    heads=4,
    kv_heads=(4, 2),
    d=64,
    lengths=(16, 48),
    t_batches=(1,),
    batches=(1, 2),
    b_length=16,
    head_dims=(40,),
    head_dim_points=((2, 16),),
)
CACHE_MAX_BYTES = 20 * 2**30  # K + V; with a second copy (pages, SDPA's layout) the peak is twice this
NAIVE_MAX_BYTES = 1 * 2**30  # the reference copies the cache to fp32 (and v once more): 3x this
MATH_MAX_BYTES = 2 * 2**30  # SDPA's math backend materializes fp32 scores and, for GQA, expands K/V
EXPAND_MAX_BYTES = 16 * 2**30  # K/V expanded to H heads for a backend that refuses enable_gqa
GRAPHED = ("triton", "triton-paged", "sdpa-flash", "sdpa-efficient")


def kv_bytes(b, hkv, t, d, e=2):
    return 2 * b * hkv * t * d * e


def e4m3_bytes(b, hkv, t, d):
    """K and V of an e4m3 cache: a byte a value and a 4-byte scale a (token, kv head)."""
    return 2 * b * hkv * t * (d + 4)


def panels(cfg, hkv):
    """[(xlabel, [(x, (B, H, Hkv, T, D))])] for one kv head count."""
    h, d = cfg["heads"], cfg["d"]
    out = [
        (f"sequence length T (B {b}, H {h}/{hkv}, hd {d})", [(t, (b, h, hkv, t, d)) for t in cfg["lengths"]])
        for b in cfg["t_batches"]
    ]
    t = cfg["b_length"]
    out.append((f"batch B (T {t}, H {h}/{hkv}, hd {d})", [(b, (b, h, hkv, t, d)) for b in cfg["batches"]]))
    return out


def head_dim_panels(cfg, hkv):
    """[(xlabel, [(D, (B, H, Hkv, T, D))])]: the head dims at each (B, T) of head_dim_points."""
    h, dims = cfg["heads"], sorted((*cfg["head_dims"], cfg["d"]))
    return [
        (f"head dim (B {b}, T {t}, H {h}/{hkv})", [(d, (b, h, hkv, t, d)) for d in dims])
        for b, t in cfg["head_dim_points"]
    ]


def op_name(h, hkv):
    return "decode-mha" if hkv == h else "decode-gqa"


def sdpa_backends():
    from torch.nn.attention import SDPBackend

    return {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "sdpa-math": SDPBackend.MATH,
    }


def sdpa_call(backend, q4, k4, v4, gqa):
    from torch.nn.attention import sdpa_kernel

    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=gqa)

    return call


def bind_sdpa(provider, q, k, v):
    """SDPA forced to one backend on its preferred contiguous (B, Hkv, T, D) K and V, with q (B, H,
    1, D); for a backend that refuses enable_gqa, K and V expanded to H heads once, outside the
    timing (row field kv_expanded). Raises RuntimeError where the backend refuses the shape."""
    h, hkv, n_bytes = q.shape[1], k.shape[2], k.numel() * k.element_size() * 2
    backend, q4 = sdpa_backends()[provider], q[:, :, None, :]
    k4, v4 = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    try:
        call = sdpa_call(backend, q4, k4, v4, hkv != h)
        call()
        return call
    except RuntimeError as e:
        why = str(e).splitlines()[0][:90] if str(e) else type(e).__name__
        if hkv == h or n_bytes * h // hkv > EXPAND_MAX_BYTES:
            raise RuntimeError(why) from None
    k_exp, v_exp = (x.repeat_interleave(h // hkv, dim=1) for x in (k4, v4))
    del k4, v4
    try:
        call = sdpa_call(backend, q4, k_exp, v_exp, False)
        call()
    except RuntimeError as e:
        raise RuntimeError(f"{why}; expanded: {str(e).splitlines()[0][:60]}") from None
    return call, {"kv_expanded": True}


def bind_e4m3(provider, inputs):
    """triton-e4m3 and triton-paged-e4m3 on the quantized cache, v token-minor as KVCache and
    PagedKVCache store it; naive on its dequantized values."""
    q, k, v, lengths, t = inputs
    (kb, ks), (vb, vs) = quantize_kv(k), quantize_kv(v)  # e4m3 bytes as uint8: what indexing copies
    kq, vq = kb.view(FP8), vb.view(FP8)
    if provider == "triton-e4m3":
        v_minor = as_token_minor(vb).view(FP8)
        return lambda: decode_attention(q, kq, v_minor, lengths, max_length=t, k_scale=ks, v_scale=vs)
    if provider == "triton-paged-e4m3":
        b = q.shape[0]
        perm = torch.randperm(b * t // PAGE_SIZE, device=DEVICE).reshape(b, -1)
        k_pages = to_pages(kb, perm, PAGE_SIZE).view(FP8)
        v_pages = as_value_pages(to_pages(vb, perm, PAGE_SIZE)).view(FP8)
        table = perm.to(torch.int32)
        k_scales, v_scales = (to_pages(x[..., None], perm, PAGE_SIZE)[..., 0] for x in (ks, vs))
        return lambda: paged_decode_attention(
            q, k_pages, v_pages, table, lengths, max_length=t, k_scale=k_scales, v_scale=v_scales
        )
    n = q.shape[0] if provider == "naive" else min(q.shape[0], 2)  # "naive-first2": what compare reads
    k_deq, v_deq = (dequantize_kv(x[:n], s[:n], q.dtype) for x, s in ((kq, ks), (vq, vs)))
    return lambda: decode_attention_reference(q[:n], k_deq, v_deq, lengths[:n])


def bind(provider, inputs):
    q, k, v, lengths, t = inputs
    if provider == "triton":
        return lambda: decode_attention(q, k, v, lengths, max_length=t)
    if provider == "triton-paged":
        b = q.shape[0]
        perm = torch.randperm(b * t // PAGE_SIZE, device=DEVICE).reshape(b, -1)
        k_pages, v_pages, table = to_pages(k, perm, PAGE_SIZE), to_pages(v, perm, PAGE_SIZE), perm.to(torch.int32)
        return lambda: paged_decode_attention(q, k_pages, v_pages, table, lengths, max_length=t)
    if provider == "naive":
        return lambda: decode_attention_reference(q, k, v, lengths)
    return bind_sdpa(provider, q, k, v)


def setup(shape):
    b, h, hkv, t, d = shape
    q = torch.randn((b, h, d), device=DEVICE, dtype=DTYPE)
    k, v = (torch.randn((b, t, hkv, d), device=DEVICE, dtype=DTYPE) for _ in range(2))
    lengths = torch.full((b,), t, dtype=torch.int32, device=DEVICE)
    n_check = min(b, 2)
    expected = decode_attention_reference(q[:n_check].float(), k[:n_check], v[:n_check], lengths[:n_check]).float()
    return (q, k, v, lengths, t), expected


def compare(out, expected):
    """The first sequences' error; SDPA's output (B, H, 1, D) is read as (B, H, D)."""
    return max_err((out[:, :, 0] if out.dim() == 4 else out)[: expected.shape[0]], expected)


def splits(name, inputs, call):
    if name not in OURS:
        return {}
    q, k, _, _, t = inputs
    n_sms = sm_count(torch.device(DEVICE).index or 0, INTERPRET_SMS)
    return {
        "splits": decode_config(
            q.shape[0], k.shape[2], q.shape[1] // k.shape[2], q.shape[2], t, n_sms, "paged" in name, e4m3=name in E4M3
        ).num_splits
    }


def cases(cfg):
    for hkv in cfg["kv_heads"]:
        sweeps = panels(cfg, hkv) + head_dim_panels(cfg, hkv)
        for shape in list(dict.fromkeys(s for _, points in sweeps for _, s in points)):
            b, h, hkv, t, d = shape
            n_bytes = kv_bytes(b, hkv, t, d)
            providers = dict.fromkeys(("triton", "triton-paged", "naive") + tuple(sdpa_backends()), bind)
            if n_bytes > NAIVE_MAX_BYTES:
                providers["naive"] = "cache past NAIVE_MAX_BYTES"
            if n_bytes > MATH_MAX_BYTES:
                providers["sdpa-math"] = "cache past MATH_MAX_BYTES"
            too_big_why = f"cache {n_bytes / 2**30:.1f} GiB > {CACHE_MAX_BYTES / 2**30:.0f} GiB"
            yield BenchCase(
                op_name(h, hkv),
                shape,
                DTYPE,
                providers,
                lambda shape=shape: setup(shape),
                n_bytes=n_bytes,
                graph=GRAPHED,
                extra=splits,
                bind=bind,
                compare=compare,
                skip_on=(RuntimeError,),
                skip=too_big_why if n_bytes > CACHE_MAX_BYTES else None,
            )
            # the gate's baseline at every shape: the reference on the dequantized cache's first
            # sequences, untimed (its error, like ours, holds e4m3's against the 16-bit cache)
            providers = dict.fromkeys(E4M3 + ("naive", "naive-first2"), bind_e4m3)
            if n_bytes > NAIVE_MAX_BYTES:
                providers["naive"] = "cache past NAIVE_MAX_BYTES"
            yield BenchCase(
                f"{op_name(h, hkv)}-e4m3",
                shape,
                DTYPE,
                providers,
                lambda shape=shape: setup(shape),
                n_bytes=e4m3_bytes(b, hkv, t, d),
                graph=E4M3,
                extra=splits,
                bind=bind_e4m3,
                compare=compare,
                untimed=("naive-first2",),
                skip_on=(RuntimeError,),
                skip=too_big_why if n_bytes > CACHE_MAX_BYTES else None,
            )


def summarize(rows, cfg):
    """The figures the kernel is judged by, one line each: on do_bench time ("ms", "pct_copy"), then
    on GPU time ("graph_ms", "graph_pct_copy"), where the launch cost is out of the figure."""
    h, kv_heads = cfg["heads"], cfg["kv_heads"]

    def pick(provider, shape):
        return next((r for r in rows if r["provider"] == provider and r["shape"] == shape), None) or {}

    lines = []
    big = [
        r
        for r in rows
        if r["provider"] == "triton" and int(r["shape"].split("x")[0]) >= 8 and int(r["shape"].split("x")[3]) >= 4096
    ]
    for label, ms, pct in (("", "ms", "pct_copy"), ("graph: ", "graph_ms", "graph_pct_copy")):
        timed = [r for r in big if pct in r]
        if timed:
            worst = min(timed, key=lambda r: r[pct])
            lines.append(
                f"{label}triton at B >= 8, T >= 4096: worst {worst[pct]}% of copy ({worst['shape']}; target 85%)"
            )
        for hkv in kv_heads:
            shape = shape_str((1, h, hkv, 8192, HEAD_DIM))
            ours, flash = pick("triton", shape), pick("sdpa-flash", shape)
            if ms in ours and ms in flash:
                lines.append(
                    f"{label}B1 T8192 H{h}/{hkv}: triton {ours[ms] * 1e3:.1f} us vs sdpa-flash "
                    f"{flash[ms] * 1e3:.1f} us ({flash[ms] / ours[ms]:.2f}x; target > 1)"
                )
        for provider, base in (("triton-e4m3", "triton"), ("triton-paged-e4m3", "triton-paged")):
            speed = sorted(
                pick(base, r["shape"])[ms] / r[ms]
                for r in rows
                if r["provider"] == provider and ms in r and ms in pick(base, r["shape"])
            )
            if speed:
                lines.append(
                    f"{label}{provider} / {base} (16-bit cache) speed: worst {speed[0]:.2f}, median "
                    f"{speed[len(speed) // 2]:.2f}, best {speed[-1]:.2f}"
                )
        ratios = sorted(
            r[ms] / pick("triton-paged", r["shape"])[ms]
            for r in rows
            if r["provider"] == "triton" and ms in r and ms in pick("triton-paged", r["shape"])
        )
        if ratios:
            lines.append(
                f"{label}paged / contiguous speed: worst {ratios[0]:.2f}, "
                f"median {ratios[len(ratios) // 2]:.2f} "
                "(target >= 0.9)"
            )
        # padded head dims against hd 128 at the same (B, T): the same share of copy is the target
        for hkv in kv_heads:
            for xlabel, points in head_dim_panels(cfg, hkv):
                for provider in ("triton", "triton-paged"):
                    share = {d: pick(provider, shape_str(shape)).get(pct) for d, shape in points}
                    if all(v is not None for v in share.values()):
                        lines.append(
                            f"{label}{provider} {xlabel}: % of copy "
                            + ", ".join(f"hd {d} {v}" for d, v in share.items())
                            + f" (target: hd {cfg['d']}'s)"
                        )
    return lines


def charts(args, cfg):
    def draw(meta, rows):
        for line in summarize(rows, cfg):
            print(line)
        for hkv in cfg["kv_heads"]:
            op = op_name(cfg["heads"], hkv)
            sel = [r for r in rows if r["op"] == op]
            # GPU time (CUDA graphs) beside do_bench's for ours and flash: same bytes, so GB/s scales by ms
            sel += [
                dict(r, provider=f"{r['provider']} (graph)", GBps=round(r["GBps"] * r["ms"] / r["graph_ms"], 1))
                for r in sel
                if r["provider"] in ("triton", "sdpa-flash") and r.get("graph_ms")
            ]
            plot_sweeps(args.out / f"inference_{op}_fp16.png", f"{op} (q_len 1) fp16", sel, panels(cfg, hkv), meta)
            plot_sweeps(
                args.out / f"inference_{op}_head_dims_fp16.png",
                f"{op} (q_len 1) fp16, head dims",
                sel,
                head_dim_panels(cfg, hkv),
                meta,
            )

    return draw


def main():
    args = parse_args(__doc__)
    cfg = SMOKE if args.smoke else FULL
    run(args, "inference", charts(args, cfg), cases=lambda: cases(cfg), ours=OURS)


if __name__ == "__main__":
    main()
