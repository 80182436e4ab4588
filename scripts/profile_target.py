"""Run one of our kernels a few times at a representative shape, for a profiler to attach to.

    python scripts/profile_target.py KERNEL        (KERNEL: one of TARGETS below)

scripts/profile_ncu.sh wraps this under Nsight Compute. Each target builds its inputs, runs the
kernel WARMUP times (the first call compiles and autotunes), then PROFILED times inside an NVTX
range named "profile", the only launches the profiler looks at. Shapes are the benchmarks' headline
shapes, large enough to be past L2 (50 MB) where the kernel streams memory.
"""

import sys

import torch

WARMUP, PROFILED = 3, 1


def _rmsnorm():
    from llmk.normalization.triton_rmsnorm import rmsnorm

    x = torch.randn(16384, 4096, device="cuda", dtype=torch.float16)
    w = torch.randn(4096, device="cuda", dtype=torch.float16)
    return lambda: rmsnorm(x, w)


def _softmax():
    from llmk.attention.triton_softmax import softmax

    x = torch.randn(16384, 4096, device="cuda", dtype=torch.float16)
    return lambda: softmax(x)


def _swiglu():
    from llmk.mlp.triton_glu import swiglu

    g = torch.randn(8192, 14336, device="cuda", dtype=torch.bfloat16)
    u = torch.randn_like(g)
    return lambda: swiglu(g, u)


def _rope():
    from llmk.attention.triton_rope import apply_rope

    q = torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 8192, 128, device="cuda", dtype=torch.bfloat16)
    cos = torch.randn(8192, 128, device="cuda", dtype=torch.bfloat16)
    sin = torch.randn_like(cos)
    return lambda: apply_rope(q, k, cos, sin)


def _flash_attention():
    from llmk.attention.flash_attention_ops import flash_attention

    q, k, v = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    return lambda: flash_attention(q, k, v)


def _matmul():
    from llmk.gemm.matmul_ops import matmul

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    return lambda: matmul(a, b)


def _decode_attention():
    from llmk.inference.triton_inference_attention import decode_attention

    B, H, HKV, T, D = 16, 32, 8, 4096, 128
    q = torch.randn(B, H, D, device="cuda", dtype=torch.float16)
    k = torch.randn(B, T, HKV, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    lengths = torch.full((B,), T, device="cuda", dtype=torch.int32)
    return lambda: decode_attention(q, k, v, lengths)


# name -> (builder, regex of the kernel names to profile: Triton names a kernel after its function)
TARGETS = {
    "rmsnorm": (_rmsnorm, "rmsnorm"),
    "softmax": (_softmax, "softmax"),
    "swiglu": (_swiglu, "swiglu"),
    "rope": (_rope, "rope"),
    "flash_attention": (_flash_attention, "flash_attention"),
    "matmul": (_matmul, "matmul"),
    "decode_attention": (_decode_attention, "decode"),
}


def main(argv):
    if len(argv) != 1 or argv[0] not in TARGETS:
        raise SystemExit(f"usage: profile_target.py KERNEL, KERNEL one of {', '.join(TARGETS)}")
    if not torch.cuda.is_available():
        raise SystemExit("profile_target.py needs a CUDA GPU")
    run = TARGETS[argv[0]][0]()
    for _ in range(WARMUP):  # compiles, autotunes: outside the profiled range
        run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")  # profile_ncu.sh profiles only launches inside this range
    for _ in range(PROFILED):
        run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main(sys.argv[1:])
