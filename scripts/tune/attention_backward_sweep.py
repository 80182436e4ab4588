"""GPU sweep for the FlashAttention backward (attention/flash_attention_bwd.py): times dk/dv and dq
launch configs (BLOCK_M, BLOCK_N, num_warps, num_stages) at each BACKWARD_TABLE head dim, full and
causal, against SDPA's cuDNN and flash backends, to set BACKWARD_TABLE from measurement. (The
forward's configs against cuDNN: scripts/tune/attention_sweep.py --cudnn.)

    python scripts/tune/attention_backward_sweep.py            (GPU, bf16; compiles included)
    python scripts/tune/attention_backward_sweep.py --smoke    (interpreter, tiny shapes)

Backward FLOPs a call: 2.5x the forward's (4 * B*H*T*T*D full, half causal), flash-attention's
convention. Each dk/dv config is timed with the table's dq config and each dq config with the
table's dk/dv config (the whole backward: preprocess, dk/dv, dq); ratios are to sdpa-cudnn's
backward. A config whose gradients differ from the table config's by more than 2% of their largest
value prints BAD; one that does not fit prints REFUSED (sweep_common.report_config). '*' marks the
table's pick.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attention.flash_attention_bwd import backward_config, launch_flash_attention_backward  # noqa: E402
from attention.flash_attention_triton import flash_attention_train_op  # noqa: E402
from common.bench import tflops, time_ms  # noqa: E402
from common.device import DEVICE, describe  # noqa: E402
from sweep_common import parse_sweep_args, report_config  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SHAPES = ((4, 32, 4096, 128), (4, 32, 4096, 64), (2, 16, 4096, 256))
SMOKE_SHAPES = ((1, 2, 40, 64),)

DKDV = {
    128: [(32, 128, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3),
          (128, 128, 8, 2)],
    256: [(32, 64, 8, 1), (32, 64, 4, 2), (16, 64, 4, 2), (64, 64, 8, 1), (32, 32, 4, 2)],
}
DQ = {
    128: [(128, 32, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 32, 4, 3)],
    256: [(64, 32, 8, 1), (64, 32, 4, 2), (64, 64, 8, 1), (32, 32, 4, 2)],
}


def sdpa_backward_ms(q, k, v, do, causal, backend):
    from torch.nn.attention import sdpa_kernel
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return time_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))


def sweep_backward(b, h, t, d, dtype, smoke):
    from torch.nn.attention import SDPBackend
    q, k, v, do = (torch.randn(b, h, t, d, device=DEVICE).to(dtype) for _ in range(4))
    scale = d ** -0.5
    for causal in (False, True):
        flops = 2.5 * 4 * b * h * t * t * d / (2 if causal else 1)
        with torch.no_grad():
            o, lse = flash_attention_train_op(q, k, v, causal, None, None)
        grads = tuple(torch.empty_like(x) for x in (q, k, v))
        picked = backward_config(d)
        launch_flash_attention_backward(do, q, k, v, o, lse, *grads, causal, scale)
        want = tuple(g.clone() for g in grads)
        # the interpreter has no cuDNN or flash backend: its math backend stands in (numbers mean nothing)
        backends = {"math": SDPBackend.MATH} if smoke else \
            {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
        rates = {name: tflops(flops, sdpa_backward_ms(q, k, v, do, causal, backend))
                 for name, backend in backends.items()}
        print(f"B{b} H{h} T{t} D{d} {'causal' if causal else 'full'} backward: "
              + ", ".join(f"sdpa-{name} {rate:.0f}" for name, rate in rates.items()) + " TFLOP/s", flush=True)
        baseline = next(iter(rates))  # cuDNN on the GPU
        row = 256 if d > 128 else 128
        trials = [("dkdv", (c, picked[1])) for c in DKDV[row]] + [("dq", (picked[0], c)) for c in DQ[row]]
        if smoke:
            trials = [("dkdv", ((16, 16, 1, 1), (16, 16, 1, 1)))]
        for which, config in dict.fromkeys(trials + [("table", picked)]):
            call = lambda: launch_flash_attention_backward(do, q, k, v, o, lse, *grads, causal, scale, config=config)  # noqa: E731
            report_config(f"{which:5s} dkdv {config[0]} dq {config[1]}", call, grads, want, config == picked,
                          flops=flops, sdpa_TFLOPs=rates[baseline], may_refuse=True, versus=f"sdpa-{baseline}")


def main():
    args = parse_sweep_args(__doc__, "attention_backward_sweep", DTYPES)
    print(f"{describe()}, {args.dtype}", flush=True)
    for shape in SMOKE_SHAPES if args.smoke else SHAPES:
        sweep_backward(*shape, DTYPES[args.dtype], args.smoke)


if __name__ == "__main__":
    main()
