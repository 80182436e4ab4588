"""GPU sweep for attention/triton_rope.py: times tiles of positions x heads and warps at each head
dim, to set ROPE_TABLE from measurement.

    python scripts/tune/rope_sweep.py            (GPU, bf16, half layout: ~5 min, compiles included)
    python scripts/tune/rope_sweep.py --smoke    (interpreter, tiny shapes: proves the script runs)

Shape: B1, 32 q heads and 8 k heads, T8192 (T2048 for D >= 512), a (T, D) fp32 table. Bytes a call:
read q and k, write q_out and k_out (2 * B*T*(H + Hkv)*D*e) plus the table once (2 * T*D*4). Each
config is checked against attention/reference_rope.py's reference in fp32 first (a wrong one prints BAD and
is not timed), then timed with common.timing.time_ms. One line a config: GB/s and its share of the
copy bandwidth measured at the start; '*' marks rope_config's choice. Read off: the best per D.
"""

import torch

from llmk.attention.reference_rope import apply_rope_ref, rope_cos_sin
from llmk.attention.triton_rope import RopeConfig, launch_rope, rope_config
from llmk.common.device import DEVICE
from llmk.common.ints import next_power_of_2

from sweep_common import measure_copy, parse_sweep_args, report_config

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HEAD_DIMS = (64, 128, 256, 512, 1024)
HEADS, KV_HEADS = 32, 8


def candidates(seq_len, head_dim, smoke):
    """Tiles of up to 8192 values: positions x heads, each with 4 and 8 warps."""
    block_d = next_power_of_2(head_dim)
    configs = []
    for block_t in (1, 2, 4, 8, 16):
        for block_h in (1, 2, 4, 8, 16):
            if block_t * block_h * block_d <= 8192 and block_t <= seq_len:
                for warps in (4, 8):
                    configs.append(RopeConfig(block_t, block_h, min(block_h, KV_HEADS), warps))
    return configs[:2] + configs[-2:] if smoke else configs


def main():
    args = parse_sweep_args(
        __doc__, "rope_sweep", DTYPES, flags={"--interleaved": "pairs (x[2i], x[2i+1]) instead of halves"}
    )
    dtype = DTYPES[args.dtype]
    copy_GBps = measure_copy(args, f"{'interleaved' if args.interleaved else 'half'} layout")
    for head_dim in (64, 128) if args.smoke else HEAD_DIMS:
        seq_len = 5 if args.smoke else (8192 if head_dim < 512 else 2048)
        q = torch.randn(1, HEADS, seq_len, head_dim, device=DEVICE).to(dtype)
        k = torch.randn(1, KV_HEADS, seq_len, head_dim, device=DEVICE).to(dtype)
        cos, sin = rope_cos_sin(torch.arange(seq_len, device=DEVICE), head_dim)
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        q_ref, k_ref = apply_rope_ref(q.float(), k.float(), cos, sin, args.interleaved)
        n_bytes = 2 * (q.numel() + k.numel()) * q.element_size() + 2 * cos.numel() * 4
        picked = rope_config(seq_len, HEADS, KV_HEADS, head_dim)
        print(f"B1 H{HEADS}/{KV_HEADS} T{seq_len} D{head_dim}", flush=True)
        for cfg in dict.fromkeys(candidates(seq_len, head_dim, args.smoke) + [picked]):
            call = lambda: launch_rope(q, k, cos, sin, q_out, k_out, args.interleaved, cfg)  # noqa: E731
            name = f"{cfg.BLOCK_T:2d} positions x {cfg.BLOCK_HQ:2d} heads, {cfg.num_warps} warps"
            report_config(
                name, call, (q_out, k_out), (q_ref, k_ref), cfg == picked, n_bytes=n_bytes, copy_GBps=copy_GBps
            )


if __name__ == "__main__":
    main()
