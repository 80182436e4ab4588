"""GPU A/B of the attention forward's two kernels, in one process: the Gluon kernel for sm_90
(attention/gluon_flash_attention_fwd.py, each config of --configs) against the tl kernel, SDPA's
cuDNN and flash backends, on the attention benchmark's forward shapes (16384 tokens, H * D = 2048),
bf16, full and causal; and the public flash_attention on the Gluon path, as attention_bench times it,
and from CUDA graphs (common.timing.graph_time_ms: the GPU's time alone, where do_bench's time of a
call includes whatever of the host's work outlasts the L2 flush before it); then the host's time a
call of each path.

    python scripts/tune/gluon_attention_ab.py                      (H100/H200, Triton 3.6: ~2 min)
    python scripts/tune/gluon_attention_ab.py --dims 128 --configs 128,64,3,1,0 128,128,2,1,1 128,128,2,1,1,1
    python scripts/tune/gluon_attention_ab.py --dims 128 --configs 128,128,2,1,1,0 128,128,2,1,1,1 --l2-mb 8 16 32
    python scripts/tune/gluon_attention_ab.py --dims 128 --configs 128,128,2,1,1,1 128,128,2,1,1,2   (the deals)

Each Gluon config is first compared with SDPA in fp32 (max |error| printed; a config off by more
than the tl kernel's error x 2 + 1e-2 prints BAD and is not timed), then timed with
triton.testing.do_bench (median). TFLOP/s count the visible pairs, 4 * B * H * D * pairs. A kernel
that hangs (an mbarrier phase bug) ends the script after WATCHDOG_S with a message.
"""

import argparse
import os
import threading

import torch
import triton

from llmk.attention import gluon_flash_attention_fwd as gluon_fwd
from llmk.attention.attention_paths import forced_path, gluon_forward
from llmk.attention.flash_attention_ops import flash_attention
from llmk.attention.gluon_flash_attention_fwd import GLUON_HEAD_DIMS, gluon_config, launch_gluon_attention
from llmk.attention.triton_flash_attention_fwd import launch_flash_attention
from llmk.benchmarks.attention_bench import attention_flops, sdpa
from llmk.common.timing import graph_time_ms
from llmk.devtools.bench import host_time_us

TOKENS, WIDTH = 16384, 2048
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
WATCHDOG_S = 240


def parse_config(text):
    parts = tuple(int(p) for p in text.split(","))
    flags_ok = all(f in (0, 1) for f in parts[3:5]) and parts[5:] in ((), (0,), (1,), (2,))
    if len(parts) not in (4, 5, 6) or not flags_ok:
        raise argparse.ArgumentTypeError(
            "a config is BLOCK_M,BLOCK_N,STAGES,PINGPONG[,SPLIT_RELEASE[,GRID]] (flags "
            f"0 or 1; GRID 0 one tile a program, 1 static, 2 dynamic), got {text!r}"
        )
    return parts + (0,) * (6 - len(parts))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=int, nargs="+", default=list(GLUON_HEAD_DIMS))
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument(
        "--configs",
        type=parse_config,
        nargs="*",
        default=None,
        help="Gluon configs to A/B (default: the table's full and causal rows, per head dim)",
    )
    parser.add_argument(
        "--l2-mb",
        type=int,
        nargs="+",
        default=None,
        help="persistent configs (GRID 1 or 2) only: L2_BYTES values (MB) to A/B, the size of the "
        "groups of (batch, head) pairs a masked persistent grid takes at once (default: the "
        "module's)",
    )
    args = parser.parse_args()
    default_l2 = gluon_fwd.L2_BYTES
    l2_sizes = [mb << 20 for mb in args.l2_mb] if args.l2_mb else [default_l2]

    def hang():
        print(f"TIMEOUT: a kernel ran past {WATCHDOG_S} s (an mbarrier phase or count bug?)", flush=True)
        os._exit(3)

    from torch.nn.attention import SDPBackend

    peers = {"sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    print("shape | kernel | TFLOP/s | vs cudnn | max |err| vs fp32", flush=True)
    for d in args.dims:
        configs = args.configs or sorted({gluon_config(d, causal) for causal in (False, True)})  # the table's
        for t in args.lengths:
            b, h = max(1, TOKENS // t), WIDTH // d
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                with torch.no_grad():
                    ref = sdpa(SDPBackend.EFFICIENT_ATTENTION)(q.float(), k.float(), v.float(), causal)
                scale = d**-0.5
                name = f"B{b} H{h} T{t} D{d} {'causal' if causal else 'full'}"
                out = torch.empty_like(q)
                rows = {}
                timer = threading.Timer(WATCHDOG_S, hang)
                timer.start()
                tl_call = lambda: launch_flash_attention(q, k, v, out, causal, scale)  # noqa: E731
                tl_call()
                tl_err = (out.float() - ref).abs().max().item()
                rows["tl"] = (triton.testing.do_bench(tl_call), tl_err)
                for config, l2 in [(c, l2) for c in configs for l2 in (l2_sizes if c[5] else l2_sizes[:1])]:
                    gluon_fwd.L2_BYTES = l2  # read at each launch
                    label = f"gluon {config}" + (f" L2 {l2 >> 20} MB" if config[5] and args.l2_mb else "")
                    out.fill_(float("nan"))
                    call = lambda c=config: launch_gluon_attention(q, k, v, out, causal, scale, config=c)  # noqa: E731
                    call()
                    torch.cuda.synchronize()
                    err = (out.float() - ref).abs().max().item()
                    if not err <= 2 * tl_err + 1e-2:
                        print(f"{name} | {label} | BAD | | {err:.3g} (tl {tl_err:.3g})", flush=True)
                        continue
                    ms = triton.testing.do_bench(call)
                    err = max(err, (out.float() - ref).abs().max().item())  # after hundreds of launches
                    rows[label] = (ms, err)
                # the public op on the Gluon path at the table's config, as attention_bench times it
                # (its causal rows have measured 5-13% below this script's launches of the same config)
                gluon_fwd.L2_BYTES = default_l2
                with forced_path("gluon"):
                    if gluon_forward(q, k, v, causal, out, None, None, None):  # the call the op makes, Gluon's or not
                        public = lambda: flash_attention(q, k, v, causal=causal)  # noqa: E731
                        rows["flash_attention, gluon path"] = (triton.testing.do_bench(public), float("nan"))
                        rows["flash_attention, gluon path, CUDA graph"] = (graph_time_ms(public), float("nan"))
                for peer, fn in peers.items():
                    try:
                        rows[peer] = (triton.testing.do_bench(lambda fn=fn: fn(q, k, v, causal)), float("nan"))
                    except RuntimeError as e:
                        print(f"{name} | {peer} | refused: {str(e)[:80]}", flush=True)
                timer.cancel()
                f = attention_flops(b, h, t, d, causal)
                base = rows.get("sdpa-cudnn", (float("nan"),))[0]
                for kernel, (ms, err) in rows.items():
                    print(f"{name} | {kernel} | {f / ms / 1e9:.0f} | {base / ms:.2f} | {err:.3g}", flush=True)

    print("host time a call (us, no sync: B1 H1 T128, GPU work shorter than the host's)", flush=True)
    for d in args.dims:
        q, k, v = (torch.randn(1, 1, 128, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        for causal in (False, True):
            calls = [
                ("tl", "launch_gluon_attention", lambda: launch_gluon_attention(q, k, v, out, causal, d**-0.5)),
                ("tl", "launch_flash_attention (tl)", lambda: launch_flash_attention(q, k, v, out, causal, d**-0.5)),
                ("tl", "sdpa-cudnn", lambda: peers["sdpa-cudnn"](q, k, v, causal)),
                ("gluon", "flash_attention, gluon path", lambda: flash_attention(q, k, v, causal=causal)),
                ("tl", "flash_attention, tl path", lambda: flash_attention(q, k, v, causal=causal)),
            ]
            for path, name, fn in calls:
                with forced_path(path):
                    us = host_time_us(fn)
                print(f"D{d} {'causal' if causal else 'full'} | {name} | {us:.1f} us", flush=True)


if __name__ == "__main__":
    main()
