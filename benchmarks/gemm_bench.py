"""GEMM: our matmul against cuBLAS (torch.matmul), the fused bias+activation epilogue against
cuBLAS followed by the separate ops, and rmsnorm_linear against RMSNorm followed by cuBLAS.

Work and bytes (M, N, K; e = element size):
    FLOPs  2*M*N*K                     (TFLOP/s: the figure for every row)
    bytes  (M*K + K*N + M*N) * e       read a and b once, write c (GB/s, given for M <= 128 only:
                                       there the GEMM is bound by reading b, and GB/s against the
                                       copy bandwidth says how close to that bound it runs)
    epilogue rows add the bias (N*e); rmsnorm_linear rows add the norm weight (K*e) and count the
    RMSNorm's own FLOPs as nothing.
graph_ms (rows with M <= 64, and every provider of a shape where one takes under 50 us): the
    same call's GPU time with the host out of the loop (common.timing.graph_time_ms: CUDA-graph
    replays after an L2 flush). A decode-size GEMM (or 1024^3) runs for 10-50 us, about what one
    launch costs the host (Triton's more than cuBLAS's), so do_bench's "ms" there partly measures
    the host; serving engines replay decode steps from CUDA graphs, where only graph_ms counts.
config (our matmul's rows): the kernel and tile that ran (gemm.matmul_ops.kernel_choice).

Shapes are keyed "MxNxK". Sweeps (fp16 and bf16): square M = N = K = 1024..8192; tokens
M = 1..8192 at the (K, N) of a 4096-wide model's projections: attention (4096, 4096), MLP up
(4096, 14336), MLP down (14336, 4096).
Decode against an nn.Linear weight's transpose (op "matmul_linear", b = W.T): M = 1, 16 at the
same (K, N).
Epilogue (bias+gelu, bias+silu; bf16): M = 16, 256, 2048 at (K, N) = (4096, 14336), against
"cuBLAS+eager" (torch.matmul, then act(y + bias)) and torch.compile of the same function.
rmsnorm_linear (bf16): M = 1..4096 at K = 4096, N = 4096 and 14336, against "F.rms_norm+cuBLAS"
and "triton-rmsnorm+cuBLAS" (normalization/triton_rmsnorm.py, then torch.matmul).

Training rows (bf16, mode "fwd+bwd" and "bwd", peak_MB; TRAIN sweeps): matmul with no epilogue,
bias+gelu and bias+silu (ops "matmul", "matmul_bias_gelu", "matmul_bias_silu") on a (M, K) and an
nn.Linear weight W (N, K), read as W.T; gradients of a, W (and bias) against autograd through the
fp32 reference, on the same upstream gradient for every provider. Providers: triton (matmul;
under grad the forward also writes z = a @ W.T + bias for the backward), "cuBLAS" (F.linear,
then the eager activation, under autograd: cuBLAS's two GEMMs plus PyTorch's activation backward
and bias reduction) and torch.compile of it. rmsnorm_linear: gradients of x, norm_weight and W,
against F.rms_norm + F.linear and its torch.compile. Work (no Liger row: Liger has neither op):
    FLOPs  fwd+bwd 6*M*N*K (the forward GEMM and the backward's two: da = dz @ W, dW = dz^T @ a)
           bwd     4*M*N*K
    the epilogue derivative (dz = dc * act'(z), read dc and z, write dz: 3*M*N*e) and the bias
    gradient (a sum over rows of dz) count as no FLOPs, nor does the RMSNorm (its recomputation
    and backward, 4*M*K*e and more); peak_MB shows what each provider keeps (z: M*N*e).
FP8 rows (op "fp8_matmul", bf16 out; gemm/fp8_ops.py): x (M, K) and an nn.Linear weight W (N, K)
quantized to e4m3, c = x @ W.T. Providers: triton (fp8_matmul, row-wise scales, sums promoted into
fp32 every 128 of K), triton-fast-accum (fast_accum=True: the whole K loop in the tensor cores'
accumulator), triton-block (1 x 128 activation and 128 x 128 weight blocks), torch-scaled-mm-rowwise
and torch-scaled-mm-tensorwise (torch._scaled_mm, cuBLASLt; its default, precise accumulation),
torch-scaled-mm-rowwise-fast-accum (use_fast_accum=True: the peer of triton-fast-accum), and the
bf16 product beside them (cuBLAS-bf16, triton-bf16). Each
provider's inputs are quantized before the timing; max_err is against the bf16 inputs' product in
fp32, so it is each recipe's quantization error. Bytes (M <= 128): M*K + K*N + 2*M*N. Shapes:
square 4096 and 8192, M = 1..16384 at the three (K, N) above. Quantization rows (op "quantize_fp8",
row-wise): triton against the same formula in PyTorch ops, eager and torch.compile; bytes
3*M*K + 4*M (read bf16, write e4m3 and a scale a row). FP8 producers (ops "rmsnorm_fp8" and
"swiglu_fp8", gemm/triton_fp8_producers.py: the kernel that makes the values casts them): triton
against "triton+quantize" (our 16-bit kernel, then quantize_fp8: the values written and read once
more) and the PyTorch composition, eager and torch.compile; bytes 3*M*K + 4*M for rmsnorm_fp8 (x
read, q and the scales written; the weight is L2's), 5*M*K + 4*M for swiglu_fp8 (gate and up read);
max_err is max |q * scale - y| against the fp32 y, each provider's rounding to e4m3.
    python benchmarks/gemm_bench.py            (GPU; writes benchmarks/results/gemm.json and PNGs)
    python benchmarks/gemm_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/gemm_bench.py --only matmul_linear --dtype bf16   (a subset)
"""

import torch
import torch.nn.functional as F

from llmk.benchmarks.sweeps import shapes_of
from llmk.common.device import DEVICE
from llmk.devtools.bench import compile_fn, compile_train_fn, train_call
from llmk.devtools.harness import BenchCase, parse_args, run
from llmk.devtools.results import plot_sweeps
from llmk.devtools.testing import grads_of, rand
from llmk.gemm.fp8_ops import fp8_matmul, quantize_fp8
from llmk.gemm.matmul_ops import kernel_choice, matmul
from llmk.gemm.reference_fp8 import reference_quantize
from llmk.gemm.triton_fp8_producers import rmsnorm_fp8, swiglu_fp8
from llmk.gemm.triton_fp8_quant import AMAX_FLOOR, FP8_MAX
from llmk.gemm.triton_rmsnorm_linear import rmsnorm_linear
from llmk.mlp.reference_mlp import swiglu_ref
from llmk.mlp.triton_glu import swiglu
from llmk.normalization.reference_rmsnorm import rmsnorm_ref
from llmk.normalization.triton_rmsnorm import rmsnorm

EPS = 1e-6
# the max_err gate's rows (devtools/harness.py)
OURS = ("triton", "triton-fast-accum", "triton-block", "triton-bf16", "triton+quantize")
BYTES_UP_TO_M = 128  # GB/s for the rows bound by reading b
GRAPH_UP_TO_M = 64  # GPU time (CUDA graphs) beside do_bench's for decode-size rows
GRAPH_BELOW_MS = 0.05  # and for any shape a provider runs in under 50 us (1024^3: ~10 us), where the host shows


def llm_sweep(ms, k, n, label):
    return (f"tokens M, {label} (K={k}, N={n})", [(m, (m, n, k)) for m in ms])


FULL = dict(
    matmul=[("M = N = K", [(s, (s, s, s)) for s in (1024, 2048, 4096, 8192)])]
    + [
        llm_sweep((1, 16, 128, 2048, 4096, 8192), k, n, label)
        for k, n, label in ((4096, 4096, "attention"), (4096, 14336, "MLP up"), (14336, 4096, "MLP down"))
    ],
    # decode against b = W.T, an nn.Linear weight (N, K) as a model holds it (the sweeps above use a
    # row-major (K, N) b; one-row products take a different kernel for each)
    matmul_linear=[
        llm_sweep((1, 16), k, n, label)
        for k, n, label in ((4096, 4096, "attention"), (4096, 14336, "MLP up"), (14336, 4096, "MLP down"))
    ],
    epilogue=[llm_sweep((16, 256, 2048), 4096, 14336, "MLP up")],
    rmsnorm_linear=[llm_sweep((1, 4, 16, 32, 64, 256, 1024, 4096), 4096, n, f"N={n}") for n in (4096, 14336)],
    # training (bf16): a 4096-wide model's attention projection at 4096 and 8192 tokens, MLP up and down
    train=[
        llm_sweep((4096, 8192), 4096, 4096, "attention"),
        llm_sweep((8192,), 4096, 14336, "MLP up"),
        llm_sweep((8192,), 14336, 4096, "MLP down"),
    ],
    rmsnorm_linear_train=[llm_sweep((4096,), 4096, 4096, "attention"), llm_sweep((8192,), 4096, 14336, "MLP up")],
    fp8=[("M = N = K", [(s, (s, s, s)) for s in (4096, 8192)])]
    + [
        llm_sweep((1, 16, 128, 1024, 4096, 16384), k, n, label)
        for k, n, label in ((4096, 4096, "attention"), (4096, 14336, "MLP up"), (14336, 4096, "MLP down"))
    ],
    quantize=[llm_sweep((4096, 16384), 4096, 4096, "K = 4096"), llm_sweep((8192,), 14336, 14336, "K = 14336")],
    producers=[llm_sweep((4096, 16384), 4096, 4096, "hidden 4096"), llm_sweep((8192,), 14336, 14336, "width 14336")],
)
SMOKE = dict(
    matmul=[("M = N = K", [(s, (s, s, s)) for s in (32, 64)]), llm_sweep((1, 16), 64, 96, "tiny")],
    matmul_linear=[llm_sweep((1, 16), 64, 96, "tiny")],
    epilogue=[llm_sweep((16,), 64, 96, "tiny")],
    rmsnorm_linear=[llm_sweep((1, 4), 64, 64, "tiny")],
    train=[llm_sweep((48,), 64, 96, "tiny")],
    rmsnorm_linear_train=[llm_sweep((40,), 64, 96, "tiny")],
    fp8=[llm_sweep((16, 33), 256, 96, "tiny")],
    quantize=[llm_sweep((33,), 256, 256, "tiny")],
    producers=[llm_sweep((33,), 300, 300, "tiny")],
)
ACTIVATIONS = {"gelu": F.gelu, "silu": F.silu}


def gemm_case(op, shape, dtype, providers, setup, extra_bytes=0, config=True):
    """One GEMM shape: TFLOP/s for every row, GB/s up to BYTES_UP_TO_M, graph times for decode
    sizes and wherever a provider's do_bench median is below GRAPH_BELOW_MS, and our matmul's
    kernel config (asked after the warm-up call has tuned it)."""
    m, n, k = shape
    n_bytes = (m * k + k * n + m * n + extra_bytes) * dtype.itemsize
    return BenchCase(
        op,
        shape,
        dtype,
        providers,
        setup,
        n_bytes=n_bytes if m <= BYTES_UP_TO_M else None,
        flops=2 * m * n * k,
        graph=lambda rows: m <= GRAPH_UP_TO_M or min(r["ms"] for r in rows) < GRAPH_BELOW_MS,
        extra=lambda name, inputs, call: {"config": kernel_choice(*inputs[:2])} if config and name == "triton" else {},
    )


def matmul_setup(m, n, k, dtype, linear):
    """b row-major (K, N); linear: b = W.T for W (N, K) contiguous."""
    a = rand((m, k), dtype)
    b = rand((n, k), dtype).t() if linear else rand((k, n), dtype)
    return (a, b), a.float() @ b.float()


def epilogue_setup(m, n, k, dtype, act):
    a, b, bias = rand((m, k), dtype), rand((k, n), dtype), rand((n,), dtype)
    return (a, b, bias), act(a.float() @ b.float() + bias.float())


def rmsnorm_linear_setup(m, n, k, dtype):
    x = rand((m, k), dtype)
    norm_w = (1 + 0.1 * torch.randn(k, device=DEVICE)).to(dtype)
    w = (torch.randn(n, k, device=DEVICE) * k**-0.5).to(dtype)
    xf = x.float()
    return (x, norm_w, w), (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * norm_w.float()) @ w.float().t()


def fp8_setup(m, n, k):
    """x (M, K) and an nn.Linear weight W (N, K) in bf16, and what each FP8 provider reads: both
    quantized row-wise (ours and _scaled_mm's), in blocks (ours), tensor-wise (_scaled_mm's). The
    reference is the bf16 inputs' product in fp32, so max_err is each recipe's quantization error."""
    x, w = rand((m, k), torch.bfloat16), (torch.randn(n, k, device=DEVICE) * k**-0.5).to(torch.bfloat16)
    (a, sa), (qw, sw) = quantize_fp8(x), quantize_fp8(w)
    (ab, sab), (qwb, swb) = quantize_fp8(x, "1x128"), quantize_fp8(w, "128x128")
    at, st = tensorwise_fp8(x)
    wt, stw = tensorwise_fp8(w)
    inputs = (x, w.t(), a, qw.t(), sa, sw, ab, qwb.t(), sab, swb.t(), at, wt.t(), st, stw)
    return inputs, x.float() @ w.float().t()


def tensorwise_fp8(t):
    """t in e4m3 with one fp32 scale (the tensor-wise recipe), for torch._scaled_mm."""
    scale = t.float().abs().amax().clamp_min(AMAX_FLOOR) / FP8_MAX
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def fp8_providers():
    """FP8 GEMMs on fp8_setup's inputs: ours (row-wise, block scales), torch._scaled_mm (row-wise,
    tensor-wise; it takes M, N, K multiples of 16), and the bf16 product (cuBLAS, our matmul)."""

    def pick(fn, *idx):
        return lambda *t: fn(*(t[i] for i in idx))

    return {
        "triton": pick(lambda a, b, sa, sb: fp8_matmul(a, b, sa, sb), 2, 3, 4, 5),
        "triton-fast-accum": pick(lambda a, b, sa, sb: fp8_matmul(a, b, sa, sb, fast_accum=True), 2, 3, 4, 5),
        "triton-block": pick(lambda a, b, sa, sb: fp8_matmul(a, b, sa, sb), 6, 7, 8, 9),
        "torch-scaled-mm-rowwise": pick(
            lambda a, b, sa, sb: torch._scaled_mm(
                a, b, scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16
            ),
            2,
            3,
            4,
            5,
        ),
        "torch-scaled-mm-rowwise-fast-accum": pick(
            lambda a, b, sa, sb: torch._scaled_mm(
                a, b, scale_a=sa[:, None], scale_b=sb[None, :], out_dtype=torch.bfloat16, use_fast_accum=True
            ),
            2,
            3,
            4,
            5,
        ),
        "torch-scaled-mm-tensorwise": pick(
            lambda a, b, sa, sb: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16),
            10,
            11,
            12,
            13,
        ),
        "cuBLAS-bf16": pick(torch.matmul, 0, 1),
        "triton-bf16": pick(matmul, 0, 1),
    }


def quantize_reference(x):
    """quantize_fp8's row-wise formula in PyTorch ops (gemm/reference_fp8.py): eager and compiled."""
    return reference_quantize(x, "row")


def quantize_setup(m, k):
    x = rand((m, k), torch.bfloat16)
    return (x,), tuple(t.float() for t in quantize_reference(x))


def rmsnorm_fp8_reference(x, w):
    """RMSNorm, then quantize_fp8's formula, in PyTorch ops: the eager and compiled baselines."""
    return reference_quantize(rmsnorm_ref(x, w, EPS), "row")


def swiglu_fp8_reference(gate, up):
    """SwiGLU, then quantize_fp8's formula, in PyTorch ops."""
    return reference_quantize(swiglu_ref(gate, up), "row")


def dequantized_err(out, y):
    """max |q * scale - y| over the fp32 y: each provider's error, its rounding to e4m3 above all."""
    q, scale = out[0], out[1]
    return (q.float() * scale[:, None] - y).abs().max().item()


def producer_setup(op, m, k):
    """(inputs, fp32 y): x and a norm weight for rmsnorm_fp8, gate and up for swiglu_fp8."""
    a, b = rand((m, k), torch.bfloat16), rand((k,) if op == "rmsnorm_fp8" else (m, k), torch.bfloat16)
    y = rmsnorm_ref(a.float(), b.float(), EPS) if op == "rmsnorm_fp8" else swiglu_ref(a.float(), b.float())
    return (a, b), y


TRAIN_DTYPE = torch.bfloat16
TRAIN_MODES = {"fwd+bwd": 6, "bwd": 4}  # FLOPs per M*N*K: three GEMMs, or the backward's two


def linear_train_setup(m, n, k, bias, ref):
    """(a, W, bias or None, upstream gradient), and the gradients of `ref` (fp32) for a, W, bias."""
    a = rand((m, k), TRAIN_DTYPE)
    w = (torch.randn(n, k, device=DEVICE) * k**-0.5).to(TRAIN_DTYPE)
    b = rand((n,), TRAIN_DTYPE) if bias else None
    dc = rand((m, n), TRAIN_DTYPE)
    inputs = (a, w, b)
    _, grads = grads_of(ref, inputs, (0, 1, 2) if bias else (0, 1), [dc], dtype=torch.float32)
    return inputs + (dc,), grads


def rmsnorm_linear_train_setup(m, n, k, ref):
    (x, norm_w, w), _ = rmsnorm_linear_setup(m, n, k, TRAIN_DTYPE)
    dy = rand((m, n), TRAIN_DTYPE)
    _, grads = grads_of(ref, (x, norm_w, w), (0, 1, 2), [dy], dtype=torch.float32)
    return (x, norm_w, w, dy), grads


def compiled_for(mode, fn):
    return compile_train_fn(fn, mode)


def train_case(op, shape, mode, providers, wrt, setup):
    """One training row per provider: the gradients in `wrt` on the setup's upstream gradient
    (its inputs' last element), TFLOP/s with TRAIN_MODES' count, peak_MB."""
    m, n, k = shape
    return BenchCase(
        op,
        shape,
        TRAIN_DTYPE,
        providers,
        setup,
        flops=TRAIN_MODES[mode] * m * n * k,
        mode=mode,
        peak=True,
        bind=lambda name, inputs: train_call(providers[name], inputs[:-1], wrt, mode, [inputs[-1]]),
    )


def train_cases(config):
    for name, act in (("", None), *(("_bias_" + a, a) for a in ACTIVATIONS)):
        torch_act = ACTIVATIONS[act] if act else (lambda y: y)

        def peer(a, w, bias, torch_act=torch_act):
            return torch_act(F.linear(a, w, bias))

        def ref(a, w, bias, torch_act=torch_act):  # fp32 math on (cast) inputs
            return torch_act(a @ w.t() + (bias if bias is not None else 0))

        wrt = (0, 1, 2) if act else (0, 1)
        for mode in TRAIN_MODES:
            providers = {
                "triton": lambda a, w, bias, act=act: matmul(a, w.T, bias, act),
                "cuBLAS": peer,
                "torch.compile": compiled_for(mode, peer),
            }
            for shape in shapes_of(config["train"]):
                yield train_case(
                    f"matmul{name}",
                    shape,
                    mode,
                    providers,
                    wrt,
                    lambda shape=shape, act=act, ref=ref: linear_train_setup(*shape, act is not None, ref),
                )

    def rl_peer(x, norm_w, w):
        return F.linear(F.rms_norm(x, (x.shape[-1],), norm_w, EPS), w)

    def rl_ref(x, norm_w, w):
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * norm_w) @ w.t()

    for mode in TRAIN_MODES:
        providers = {
            "triton": lambda x, norm_w, w: rmsnorm_linear(x, norm_w, w, EPS),
            "F.rms_norm+cuBLAS": rl_peer,
            "torch.compile": compiled_for(mode, rl_peer),
        }
        for shape in shapes_of(config["rmsnorm_linear_train"]):
            yield train_case(
                "rmsnorm_linear",
                shape,
                mode,
                providers,
                (0, 1, 2),
                lambda shape=shape: rmsnorm_linear_train_setup(*shape, rl_ref),
            )


def cases(config):
    providers = {"triton": matmul, "cuBLAS": torch.matmul}
    for op, linear in (("matmul", False), ("matmul_linear", True)):
        for dtype in (torch.float16, torch.bfloat16):
            for m, n, k in shapes_of(config[op]):
                yield gemm_case(
                    op,
                    (m, n, k),
                    dtype,
                    providers,
                    lambda m=m, n=n, k=k, dtype=dtype, linear=linear: matmul_setup(m, n, k, dtype, linear),
                )
    dtype = torch.bfloat16
    for name, act in ACTIVATIONS.items():

        def eager(a, b, bias, act=act):
            return act(torch.matmul(a, b) + bias)

        providers = {
            "triton": lambda a, b, bias, name=name: matmul(a, b, bias, name),
            "cuBLAS+eager": eager,
            "torch.compile": compile_fn(eager),
        }
        for m, n, k in shapes_of(config["epilogue"]):
            yield gemm_case(
                f"matmul_bias_{name}",
                (m, n, k),
                dtype,
                providers,
                lambda m=m, n=n, k=k, act=act: epilogue_setup(m, n, k, dtype, act),
                extra_bytes=n,
            )
    providers = {
        "triton": lambda x, norm_w, w: rmsnorm_linear(x, norm_w, w, EPS),
        "F.rms_norm+cuBLAS": lambda x, norm_w, w: torch.matmul(F.rms_norm(x, (x.shape[-1],), norm_w, EPS), w.t()),
        "triton-rmsnorm+cuBLAS": lambda x, norm_w, w: torch.matmul(rmsnorm(x, norm_w, EPS), w.t()),
    }
    for m, n, k in shapes_of(config["rmsnorm_linear"]):
        yield gemm_case(
            "rmsnorm_linear",
            (m, n, k),
            dtype,
            providers,
            lambda m=m, n=n, k=k: rmsnorm_linear_setup(m, n, k, dtype),
            extra_bytes=k,
            config=False,
        )
    providers = fp8_providers()
    for m, n, k in shapes_of(config["fp8"]):
        # bytes: one a value of a and b, c in bf16
        yield BenchCase(
            "fp8_matmul",
            (m, n, k),
            dtype,
            providers,
            lambda m=m, n=n, k=k: fp8_setup(m, n, k),
            n_bytes=m * k + k * n + 2 * m * n if m <= BYTES_UP_TO_M else None,
            flops=2 * m * n * k,
            graph=lambda rows, m=m: m <= GRAPH_UP_TO_M or min(r["ms"] for r in rows) < GRAPH_BELOW_MS,
            skip_on=(RuntimeError,),
        )
    providers = {
        "triton": lambda x: quantize_fp8(x),
        "torch": quantize_reference,
        "torch.compile": compile_fn(quantize_reference),
    }
    for m, _, k in shapes_of(config["quantize"]):
        # bytes: x read (bf16), q written (one a value), a scale a row
        yield BenchCase(
            "quantize_fp8",
            (m, k),
            dtype,
            providers,
            lambda m=m, k=k: quantize_setup(m, k),
            n_bytes=3 * m * k + 4 * m,
            compare=lambda out, ref: max((o.float() - r).abs().max().item() for o, r in zip(out, ref)),
        )
    yield from producer_cases(config, dtype)


def producer_cases(config, dtype):
    """rmsnorm_fp8 and swiglu_fp8 (e4m3 and a scale a row out of the kernel that makes the values)
    against the 16-bit kernel followed by quantize_fp8, and the PyTorch composition."""
    providers = {
        "rmsnorm_fp8": {
            "triton": lambda x, w: tuple(rmsnorm_fp8(x, w, EPS)[:2]),
            "triton+quantize": lambda x, w: quantize_fp8(rmsnorm(x, w, EPS)),
            "torch": rmsnorm_fp8_reference,
            "torch.compile": compile_fn(rmsnorm_fp8_reference),
        },
        "swiglu_fp8": {
            "triton": lambda g, u: tuple(swiglu_fp8(g, u)[:2]),
            "triton+quantize": lambda g, u: quantize_fp8(swiglu(g, u)),
            "torch": swiglu_fp8_reference,
            "torch.compile": compile_fn(swiglu_fp8_reference),
        },
    }
    for op, inputs_bytes in (("rmsnorm_fp8", 2), ("swiglu_fp8", 4)):
        for m, _, k in shapes_of(config["producers"]):
            # bytes: the 16-bit inputs read (x; or gate and up), q written (one a value), a scale a row
            yield BenchCase(
                op,
                (m, k),
                dtype,
                providers[op],
                lambda op=op, m=m, k=k: producer_setup(op, m, k),
                n_bytes=(inputs_bytes + 1) * m * k + 4 * m,
                compare=dequantized_err,
            )


def charts(args, config):
    def draw(meta, rows):
        panels = (
            [("matmul", config["matmul"])]
            + [(f"matmul_bias_{a}", config["epilogue"]) for a in ACTIVATIONS]
            + [("rmsnorm_linear", config["rmsnorm_linear"])]
        )
        for op, sweeps in panels:
            for dtype in ("fp16", "bf16"):
                sel = [r for r in rows if r["op"] == op and r["dtype"] == dtype and r.get("mode", "fwd") == "fwd"]
                plot_sweeps(args.out / f"gemm_{op}_{dtype}.png", f"{op} {dtype}", sel, sweeps, meta, metric="TFLOPs")
        # training rows, fwd+bwd (6MNK FLOPs)
        for op in ("matmul", *(f"matmul_bias_{a}" for a in ACTIVATIONS), "rmsnorm_linear"):
            sel = [r for r in rows if r["op"] == op and r.get("mode") == "fwd+bwd"]
            sweeps = config["rmsnorm_linear_train" if op == "rmsnorm_linear" else "train"]
            plot_sweeps(
                args.out / f"gemm_{op}_bf16_train.png",
                f"{op} bf16 fwd+bwd (6MNK FLOPs)",
                sel,
                sweeps,
                meta,
                metric="TFLOPs",
            )
        sel = [r for r in rows if r["op"] == "fp8_matmul"]
        plot_sweeps(
            args.out / "gemm_fp8_matmul.png",
            "fp8_matmul (e4m3 in, bf16 out)",
            sel,
            config["fp8"],
            meta,
            metric="TFLOPs",
        )
        # the decode rows against the memory bound, GPU time beside do_bench's
        for op, sweeps, title in (
            ("matmul", config["matmul"][1:], "matmul"),
            ("matmul_linear", config["matmul_linear"], "matmul, b = W.T"),
        ):
            for dtype in ("fp16", "bf16"):
                sel = [
                    r
                    for r in rows
                    if r["op"] == op and r["dtype"] == dtype and r["GBps"] is not None and r.get("mode", "fwd") == "fwd"
                ]
                sel += [
                    dict(r, provider=f"{r['provider']} (graph)", GBps=round(r["GBps"] * r["ms"] / r["graph_ms"], 1))
                    for r in sel
                    if r.get("graph_ms")
                ]
                name = "decode" if op == "matmul" else "linear_decode"
                plot_sweeps(
                    args.out / f"gemm_matmul_{name}_{dtype}.png",
                    f"{title} {dtype}, M <= {BYTES_UP_TO_M}",
                    sel,
                    [(label, [(x, s) for x, s in points if s[0] <= BYTES_UP_TO_M]) for label, points in sweeps],
                    meta,
                )

    return draw


def main():
    args = parse_args(__doc__)
    config = SMOKE if args.smoke else FULL
    run(args, "gemm", charts(args, config), cases=lambda: [*cases(config), *train_cases(config)], ours=OURS)


if __name__ == "__main__":
    main()
