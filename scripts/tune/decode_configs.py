"""GPU sweep of decode attention's launch configs, contiguous and paged, at the shapes where the paged
kernel trailed the contiguous one: (BLOCK_N, num_warps, num_stages) x split count, GPU us (CUDA
graphs, common.timing.graph_time_ms). Sets PAGED_SPLIT_MIN_BLOCK_N, PAGED_ONE_BLOCK_STAGES,
PAGED_LONG_TOKENS and SPLIT_TABLE's paged column in inference/triton_inference_attention.py; the
figures behind them are in docs/tuning/inference.md.

    python scripts/tune/decode_configs.py          (~4 min on an H100)
    python scripts/tune/decode_configs.py waves    (one to four programs an SM, B * Hkv 256-512:
                                                    the shipped split count and its neighbours)
    python scripts/tune/decode_configs.py hd=96    (either sweep at another head dim; a padded one,
                                                    80 or 96, runs 128-wide tiles)
    python scripts/tune/decode_configs.py bench hd=80
                                                   (inference_bench's head-dim shapes, deeper
                                                    pipelines; the shipped split and its neighbours)

Each line: a shape, the shipped heuristics' pick and time for both kernels, then the five fastest
configs of each, "BLOCK_N/warps/stages/splits us".
"""

import sys
import time

import torch
import triton

import llmk.inference.triton_inference_attention as ia
from llmk.common.device import sm_count
from llmk.common.timing import graph_time_ms
from llmk.inference.kv_cache import as_token_minor, quantize_kv
from llmk.inference.paged_kv_cache import as_value_pages, to_pages

H, PS = 32, 16  # PS: tokens a page
D = int(next((arg[3:] for arg in sys.argv[1:] if arg.startswith("hd=")), 128))
SHAPES = [
    (1, 32, 512),
    (1, 32, 1024),
    (1, 8, 512),
    (16, 8, 512),
    (16, 8, 1024),
    (16, 8, 2048),  # (B, Hkv, T)
    (1, 32, 8192),
    (1, 8, 8192),
    (16, 8, 8192),
    (16, 32, 2048),
    (4, 8, 8192),
]
BLOCKS = [(32, 4, 2), (32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 8, 2), (128, 8, 3)]
WAVES = "waves" in sys.argv[1:] or "bench" in sys.argv[1:]
if "waves" in sys.argv[1:]:
    SHAPES = [(16, 32, 1024), (16, 32, 4096), (8, 32, 8192), (32, 8, 8192), (64, 8, 8192), (16, 32, 16384)]
    BLOCKS = [(32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (128, 8, 3)]
if "bench" in sys.argv[1:]:  # inference_bench's head-dim rows, deeper pipelines for the padded dims' smaller blocks
    SHAPES = [(1, 32, 8192), (16, 32, 4096), (16, 8, 4096), (64, 8, 8192)]
    BLOCKS = [(64, 4, 3), (64, 4, 4), (64, 4, 5), (64, 8, 4), (128, 4, 3), (128, 8, 3), (32, 4, 4), (32, 4, 6)]
if "e4m3" in sys.argv[1:]:  # the bytes halve: deeper pipelines and larger blocks for the same bytes in flight
    SHAPES = [(1, 8, 8192), (1, 8, 32768), (16, 8, 8192), (16, 8, 32768), (64, 8, 8192), (16, 32, 8192)]
    BLOCKS = [
        (32, 4, 3),
        (64, 4, 2),
        (64, 4, 3),
        (64, 4, 4),
        (64, 8, 3),
        (128, 4, 2),
        (128, 4, 3),
        (128, 8, 3),
        (128, 8, 4),
        (256, 8, 2),
    ]
E4M3 = "e4m3" in sys.argv[1:]
MAX_PROGRAMS = 8 * 132


def gpu_us(fn):
    return 1e3 * graph_time_ms(fn, reps=10, warmup_ms=5, rep_ms=25)


def decode_inputs(b, hkv, t):
    """q (B, H, D), caches (B, T, Hkv, D), lengths all T, a shuffled block table (B, T / PS) int32
    and the same caches in PS-token pages, fp16 on the GPU: (q, k, v, lengths, table, k_pages, v_pages)."""
    q = torch.randn(b, H, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, t, hkv, D, device="cuda", dtype=torch.float16) for _ in range(2))
    lengths = torch.full((b,), t, dtype=torch.int32, device="cuda")
    perm = torch.randperm(b * t // PS, device="cuda").view(b, t // PS)
    return q, k, v, lengths, perm.to(torch.int32), to_pages(k, perm, PS), to_pages(v, perm, PS)


def main():
    t00 = time.perf_counter()
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__, f"hd {D}", flush=True)
    n_sms = sm_count(0, ia.INTERPRET_SMS)
    for b, hkv, t in SHAPES:
        q, k, v, lengths, table, kp, vp = decode_inputs(b, hkv, t)
        ref = ia.decode_attention(q, k, v, lengths, max_length=t).float()
        base_us = gpu_us(lambda: ia.decode_attention(q, k, v, lengths, max_length=t))
        if E4M3:  # the same inputs quantized; the error gate below holds e4m3's rounding (2^-4 of a value)
            (kb, ks), (vb, vs) = quantize_kv(k), quantize_kv(v)
            # v token-minor, as KVCache and PagedKVCache store an e4m3 v
            k, v = kb.view(torch.float8_e4m3fn), as_token_minor(vb).view(torch.float8_e4m3fn)
            kp = to_pages(kb, table.long(), PS).view(torch.float8_e4m3fn)
            vp = as_value_pages(to_pages(vb, table.long(), PS)).view(torch.float8_e4m3fn)
            ksp, vsp = (to_pages(x[..., None], table.long(), PS)[..., 0] for x in (ks, vs))
            scales, paged_scales = dict(k_scale=ks, v_scale=vs), dict(k_scale=ksp, v_scale=vsp)
        else:
            scales = paged_scales = {}
        calls = {
            "contig": lambda cfg: ia.decode_attention(q, k, v, lengths, max_length=t, config=cfg, **scales),
            "paged": lambda cfg: ia.paged_decode_attention(
                q, kp, vp, table, lengths, max_length=t, config=cfg, **paged_scales
            ),
        }
        cells = [f"16-bit contig {base_us:.1f}"]
        for kind, call in calls.items():
            auto = ia.decode_config(b, hkv, H // hkv, D, t, n_sms, kind == "paged", e4m3=E4M3)
            auto_us = gpu_us(lambda: call(None))
            found = []
            for bn, warps, stages in BLOCKS:
                for s in (1, 2, 4, 8, 16, 32, 64):
                    if s * bn > t or b * hkv * s > MAX_PROGRAMS and not WAVES:
                        continue
                    if WAVES and s not in (auto.num_splits // 2, auto.num_splits, 2 * auto.num_splits):
                        continue
                    cfg = ia.DecodeConfig(bn, warps, stages, True, s)
                    err = (call(cfg).float() - ref).abs().max().item()
                    if err > (0.1 * ref.abs().max().item() if E4M3 else 1e-2):
                        print("BAD", kind, cfg, err, flush=True)
                        continue
                    found.append((gpu_us(lambda: call(cfg)), f"{bn}/{warps}/{stages}/{s}"))
            found.sort()
            ratio = f" ({base_us / auto_us:.2f}x, best {base_us / found[0][0]:.2f}x)" if E4M3 and found else ""
            cells.append(
                f"{kind} auto {auto.BLOCK_N}/{auto.num_warps}/{auto.num_stages}/{auto.num_splits} "
                f"{auto_us:.1f}{ratio}; best " + ", ".join(f"{name} {us:.1f}" for us, name in found[:5])
            )
        print(f"B{b} Hkv{hkv} T{t}: " + " || ".join(cells), flush=True)
    print(f"total {time.perf_counter() - t00:.0f} s")


if __name__ == "__main__":
    main()
