"""GPU A/B of decode attention at head dims 80, 96 and 128: the kernel's head dim in two parts
(head_dim_parts) against one padded tile, beside two read-only kernels that bound what any kernel
with the same reads can reach:

    per-head stream   decode's grid and reads (one program a (sequence, kv head, split), blocks of
                      BLOCK_N tokens x D columns, D * e bytes a token at a stride of Hkv * D * e),
                      summed instead of attended: no dots, no softmax
    contiguous stream the same bytes read as one flat range a program (whole token rows)

GPU us (CUDA graphs, common.timing.graph_time_ms) and K+V bytes per second as a share of the copy
bandwidth measured in the same run (devtools.bench.copy_bandwidth_GBps, as inference_bench measures it).
docs/tuning/inference.md has the figures.

    python scripts/tune/decode_head_dims.py        (~2 min on an H200)
"""

import dataclasses
import time

import torch
import triton
import triton.language as tl

import llmk.inference.triton_inference_attention as ia
from llmk.common.device import sm_count
from llmk.common.timing import graph_time_ms
from llmk.devtools.bench import copy_bandwidth_GBps

H = 32
SHAPES = [(1, 32, 8192), (16, 32, 4096), (64, 32, 8192), (1, 8, 8192), (16, 8, 4096), (64, 8, 8192)]  # (B, Hkv, T)
HEAD_DIMS = (80, 96, 128)
STREAM_BLOCK_N = 64


@triton.jit
def _per_head_stream(
    k_ptr,
    v_ptr,
    out_ptr,
    stride_kb,
    stride_kt,
    stride_kh,
    n_kv_heads,
    T,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid // n_kv_heads).to(tl.int64)
    h = (pid % n_kv_heads).to(tl.int64)
    per_split = T // tl.num_programs(1)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    base = b * stride_kb + h * stride_kh
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start in range(split * per_split, (split + 1) * per_split, BLOCK_N):
        rows = (start + offs_n).to(tl.int64) * stride_kt
        ptrs = base + rows[:, None] + offs_d[None, :]
        mask = (offs_d < HEAD_DIM)[None, :]
        k = tl.load(k_ptr + ptrs, mask=mask, other=0.0)
        v = tl.load(v_ptr + ptrs, mask=mask, other=0.0)
        acc += tl.sum(k.to(tl.float32) + v.to(tl.float32), 0)
    tl.store(out_ptr + (pid * tl.num_programs(1) + split) * BLOCK_D + offs_d, acc)


@triton.jit
def _contiguous_stream(k_ptr, v_ptr, out_ptr, n_per_program, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_per_program, BLOCK):
        i = pid * n_per_program + start + offs
        acc += tl.load(k_ptr + i).to(tl.float32) + tl.load(v_ptr + i).to(tl.float32)
    tl.store(out_ptr + pid * BLOCK + offs, acc)


def main():
    t0 = time.perf_counter()
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__, flush=True)
    copy_gbs = copy_bandwidth_GBps()  # as benchmarks/inference_bench.py measures it
    print(f"copy {copy_gbs:.0f} GB/s (read + written)", flush=True)
    n_sms = sm_count(0, ia.INTERPRET_SMS)
    for b, hkv, t in SHAPES:
        cells = []
        for d in HEAD_DIMS:
            q = torch.randn(b, H, d, device="cuda", dtype=torch.float16)
            k, v = (torch.randn(b, t, hkv, d, device="cuda", dtype=torch.float16) for _ in range(2))
            lengths = torch.full((b,), t, dtype=torch.int32, device="cuda")
            nbytes = 2 * k.numel() * 2
            share = lambda us: f"{nbytes / us / 1e3 / copy_gbs:.0%}"  # noqa: E731
            shipped = ia.decode_config(b, hkv, H // hkv, d, t, n_sms)
            splits = shipped.num_splits
            row, outs = {}, {}
            for name, parts in (("two parts", True), ("one tile", False)):  # the shipped blocks and splits
                cfg = dataclasses.replace(shipped, head_parts=parts)
                outs[name] = ia.decode_attention(q, k, v, lengths, max_length=t, config=cfg).float()
                row[name] = graph_time_ms(lambda: ia.decode_attention(q, k, v, lengths, max_length=t, config=cfg)) * 1e3
            diff = (outs["one tile"] - outs["two parts"]).abs().max().item()
            block_d = ia.one_tile(d)
            out = torch.empty(b * hkv * splits * block_d, device="cuda")
            row["per-head stream"] = (
                graph_time_ms(
                    lambda: _per_head_stream[(b * hkv, splits)](
                        k,
                        v,
                        out,
                        k.stride(0),
                        k.stride(1),
                        k.stride(2),
                        hkv,
                        t,
                        HEAD_DIM=d,
                        BLOCK_D=block_d,
                        BLOCK_N=STREAM_BLOCK_N,
                        num_warps=4,
                        num_stages=3,
                    )
                )
                * 1e3
            )
            n = k.numel()
            programs = b * hkv * splits
            while n % (programs * 4096):
                programs //= 2
            out2 = torch.empty(programs * 4096, device="cuda")
            row["contiguous stream"] = (
                graph_time_ms(
                    lambda: _contiguous_stream[(programs,)](k, v, out2, n // programs, BLOCK=4096, num_warps=8)
                )
                * 1e3
            )
            cells.append(
                f"hd {d}: "
                + ", ".join(f"{name} {us:.1f} us {share(us)}" for name, us in row.items())
                + f" (one tile - two parts: max {diff:.1e})"
            )
        print(f"B{b} Hkv{hkv} T{t} (splits as shipped)\n  " + "\n  ".join(cells), flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
