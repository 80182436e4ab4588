"""Host (CPU) time of one call of every kernel: the public function, its operator through the
dispatcher, its launcher alone, and the PyTorch call it stands in for, at decode sizes.

At decode sizes a kernel runs on the GPU for 5-20 us, about what its call costs the CPU, so the
host's cost per call bounds a step that is not replayed from a CUDA graph. For every op, CPU us a
call (devtools.bench.host_time_us: 200 calls without a sync, best of 9, after a warm-up call), under
torch.no_grad() and again under torch.inference_mode(), of
    public     (a) the public function (rmsnorm(x, w), ...): argument checks, then its operator, its
               options passed by name (Op.bind puts them in the schema's order)
    op         (b) the operator's eager entry, the common.ops.Op objects the public function called,
               on the arguments it passed them, by position: on plain tensors Op.__call__
               decides (not compiling, no dispatch mode, no tensor subclass, no input that needs
               grad) and runs the implementation
    impl       (c) those operators' implementations called directly: output allocation and the
               launch, without the operator layer
    torch.ops  (d) the same operators through the dispatcher, torch.ops.llmk.<name>.default: what a
               torch.compile graph calls. Under no_grad it runs our Python autograd kernel, then
               the CUDA kernel (Python); inference_mode skips the autograd one
    launcher   (e) the launcher (launch_rmsnorm, ...) on prepared arguments and output: the launch
               alone. TritonAdamW has no launcher of its own: the operator's implementation stands in
    pytorch    (f) the PyTorch counterpart: F.rms_norm, F.layer_norm, x + r then F.rms_norm,
               torch.softmax, rotate_half RoPE (attention/reference_rope.py), SDPA, F.gelu(x + b),
               F.silu(g) * u, F.linear, F.rms_norm then F.linear, SDPA with one query,
               torch.optim.AdamW(fused=True).step()
The operator layer's cost is (b) - (c); (a) - (b) is the argument checks and the binding by name;
(c) - (e) the output allocation (and, for some ops, reshaping views). The providers of one row are timed in turns,
round after round, each keeping its best round, so that a slow spell of the host (its figures
drift by 2x over a minute) falls on all of them alike.
Also: a bare Triton launch of an empty kernel, and rmsnorm registered the two other ways, behind
torch.library.custom_op (+ register_fake) and behind torch.library.triton_op with wrap_triton
(in a namespace of this script's own), with the same checks before the call: why common/ops.py
uses torch.library.Library.

Shapes (bf16, Llama-3-8B: hidden 4096, 32 query and 8 KV heads of 128, MLP 14336, one sequence):
norms 1x4096; softmax 32x4096 (one step's attention scores at T = 4096); apply_rope q 1x32x1x128
and k 1x8x1x128; flash_attention a causal 256-token chunk; bias_gelu 1x16384; swiglu 1x14336
(halves of a fused gate/up projection); matmul M = 1 and 8 against W.T, W 4096x4096; rmsnorm_linear
M = 1 and 8 against the fused QKV weight 6144x4096; decode_attention and paged_decode_attention
one token against T = 4096 (16-token pages); TritonAdamW.step() on one 1M-param tensor.
A row that fails (an operator not registered, a launcher's signature changed) is kept with its
error; the run then exits 1 after writing the results.

Training, rows of mode "fwd+bwd": CPU us of one forward + backward call, grad mode on, for every op
with a backward, at micro-batch sizes where the GPU waits on the host. The timed call, the same for
every provider, is devtools.bench.train_call's: the forward on leaves that require grad, then
torch.autograd.grad(its outputs, those leaves, upstream gradients). The gradients are returned,
never accumulated into .grad, so each call does the same work. Each provider has its own copy of
the inputs and of one set of upstream gradients (Liger writes gradients over its inputs, and its
RoPE over the upstream ones). Ours is called once first and its gradients compared with PyTorch's
(a difference past 2% of the largest is a wrong call, an error row). Timed in turns as above, of
    public         ours, the public function
    liger          Liger-Kernel's autograd.Function, called as the norm, mlp, rope and losses
                   benchmarks call it: LigerRMSNormFunction, LigerLayerNormFunction,
                   LigerFusedAddRMSNormFunction, LigerRopeFunction, LigerSiLUMulFunction,
                   LigerCrossEntropyFunction, LigerFusedLinearCrossEntropyFunction; skipped, with
                   the reason, where it is not installed or has no such op, and in the interpreter
    torch.compile  the PyTorch counterpart compiled (devtools.bench.compile_train_fn: static shapes)
    pytorch        the PyTorch counterpart, as (f) above; cross_entropy: F.cross_entropy;
                   fused_linear_cross_entropy: F.linear, then F.cross_entropy
Shapes (bf16) and the inputs that get gradients: rmsnorm (x, weight), layernorm (x, weight, bias),
residual_rmsnorm (x, residual, weight) 1x4096; apply_rope (q, k) q 1x32x128x128 and k 1x8x128x128
stored (B, T, H, D) as projections give them; flash_attention (q, k, v) causal, 1x32/8x128x128, a
128-token micro-batch; bias_gelu (x, bias) 1x16384; swiglu (gate, up) 1x14336; matmul (a, W)
8x4096 against W.T, W 4096x4096; rmsnorm_linear (x, norm weight, W) 8 rows, W 6144x4096;
cross_entropy (logits) 8x32000; fused_linear_cross_entropy (hidden, weight) 8 tokens, hidden 4096,
vocabulary 4096: a 32 MB weight, as matmul's (at a 32000 vocabulary the forward's and backward's
passes over the weight and its gradient, about 1 GB, keep the GPU busy longer than the host, and
the row would time the GPU). A peer that fails (Liger, torch.compile) is reported as skipped, with
the reason; a failure of ours or of eager PyTorch is an error row.
    python benchmarks/host_bench.py            (GPU; writes benchmarks/results/host.json)
    python benchmarks/host_bench.py --smoke    (interpreter, tiny shapes, build/bench-smoke)
    python benchmarks/host_bench.py --only rmsnorm   (a subset)
    python benchmarks/host_bench.py --mode fwd+bwd   (the training rows only; --mode fwd: the others)
"""

import math
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
import triton

from llmk.common.device import DEVICE, INTERPRET
from llmk.common.ops import Op
from llmk.devtools.bench import compile_train_fn, host_time_us, train_call
from llmk.devtools.harness import max_err, parse_args, run
from llmk.devtools.peers import (
    LIGER,
    liger_ce,
    liger_layernorm,
    liger_lce,
    liger_residual_rmsnorm,
    liger_rmsnorm,
    liger_rope,
    liger_swiglu,
)
from llmk.devtools.testing import rand

DTYPE = torch.bfloat16
PROVIDERS = ("public", "op", "impl", "torch.ops", "launcher", "pytorch")
MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
TRAIN_MODE = "fwd+bwd"
TRAIN_PROVIDERS = ("public", LIGER, "torch.compile", "pytorch")
# rows: M of the training rows' matmul, rmsnorm_linear and losses; micro_batch: tokens of their
# rope and flash_attention; head_vocab: fused_linear_cross_entropy's (module docstring)
FULL = dict(
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    mlp=14336,
    gelu=16384,
    qkv=6144,
    scores=32,
    chunk=256,
    cache=4096,
    params=1_000_000,
    rows=8,
    micro_batch=128,
    vocab=32000,
    head_vocab=4096,
    calls=200,
    rounds=9,
)
# the interpreter runs a launch in milliseconds: few calls of tiny shapes, numbers meaningless
SMOKE = dict(
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=64,
    mlp=96,
    gelu=64,
    qkv=48,
    scores=4,
    chunk=16,
    cache=32,
    params=1000,
    rows=4,
    micro_batch=16,
    vocab=300,
    head_vocab=300,
    calls=2,
    rounds=1,
)
PAGE = 16
EPS = 1e-6


@triton.jit
def _empty_kernel(x_ptr):
    pass


@dataclass
class HostCase:
    """One row of the table: build() makes the inputs and returns {provider: zero-argument call}.
    A call it leaves out is found: "torch.ops" from the llmk operators the public call reaches,
    "launcher" (where None) from those operators' implementations. pytorch_name: the counterpart."""

    op: str
    shape: str
    pytorch_name: str
    build: Callable


def recorded_ops(fn):
    """(result of fn(), [(Op, args)] of the llmk operators it called, outermost only)."""
    calls, depth = [], [0]
    original = Op.__call__

    def recording(op, *args, **kwargs):
        if not depth[0]:  # by position: what Op.bind makes of a call by name
            calls.append((op, op.bind(*args, **kwargs) if kwargs else args))
        depth[0] += 1
        try:
            return original(op, *args, **kwargs)
        finally:
            depth[0] -= 1

    Op.__call__ = recording
    try:
        result = fn()
    finally:
        Op.__call__ = original
    return result, calls


def through(calls, attribute):
    """One call of every recorded operator, by its dispatcher overload or its implementation."""
    bound = [(getattr(op, attribute), args) for op, args in calls]
    if len(bound) == 1:
        fn, args = bound[0]
        return lambda: fn(*args)
    return lambda: [fn(*args) for fn, args in bound]


def largest(a):
    if isinstance(a, (tuple, list)):
        return max(largest(x) for x in a)
    return a.float().abs().max().item()


# ---------------------------------------------------------------------------------------------
# the cases: each build() imports its kernel, so a module that fails to import is one error row


def norm_cases(s):
    n = s["hidden"]

    def build_rmsnorm():
        from llmk.normalization.triton_rmsnorm import launch_rmsnorm, rmsnorm

        x, w, y = rand((1, n), DTYPE), rand((n,), DTYPE), torch.empty(1, n, dtype=DTYPE, device=DEVICE)

        def launcher():
            launch_rmsnorm(x, None, w, EPS, y, None)
            return y

        return {
            "public": lambda: rmsnorm(x, w, EPS),
            "launcher": launcher,
            "pytorch": lambda: F.rms_norm(x, (n,), w, EPS),
        }

    def build_layernorm():
        from llmk.normalization.triton_layernorm import launch_layernorm, layernorm

        x, w, b = rand((1, n), DTYPE), rand((n,), DTYPE), rand((n,), DTYPE)
        y = torch.empty(1, n, dtype=DTYPE, device=DEVICE)

        def launcher():
            launch_layernorm(x, w, b, 1e-5, y)
            return y

        return {
            "public": lambda: layernorm(x, w, b, 1e-5),
            "launcher": launcher,
            "pytorch": lambda: F.layer_norm(x, (n,), w, b, 1e-5),
        }

    def build_residual():
        from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm
        from llmk.normalization.triton_rmsnorm import launch_rmsnorm

        x, r, w = rand((1, n), DTYPE), rand((1, n), DTYPE), rand((n,), DTYPE)
        y, u = (torch.empty(1, n, dtype=DTYPE, device=DEVICE) for _ in range(2))

        def launcher():
            launch_rmsnorm(x, r, w, EPS, y, u)
            return y, u

        def pytorch():
            h = x + r
            return F.rms_norm(h, (n,), w, EPS), h

        return {"public": lambda: residual_rmsnorm(x, r, w, EPS), "launcher": launcher, "pytorch": pytorch}

    shape = f"1x{n}"
    return [
        HostCase("rmsnorm", shape, "F.rms_norm", build_rmsnorm),
        HostCase("layernorm", shape, "F.layer_norm", build_layernorm),
        HostCase("residual_rmsnorm", shape, "x + r, F.rms_norm", build_residual),
    ]


def rmsnorm_registered_cases(s):
    """rmsnorm behind torch.library.custom_op and behind triton_op + wrap_triton: the same launcher
    and the same checks as rmsnorm(), another registration."""
    n = s["hidden"]
    registered = {}  # kind -> (op, torch.ops overload): each name can be defined once a process

    def register_custom():
        from llmk.normalization.triton_rmsnorm import launch_rmsnorm

        @torch.library.custom_op("host_bench::rmsnorm_custom", mutates_args=())
        def rmsnorm_custom(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
            y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            launch_rmsnorm(x, None, weight, eps, y, None)
            return y

        @rmsnorm_custom.register_fake
        def _(x, weight, eps):
            return x.new_empty(x.shape)

        return rmsnorm_custom, torch.ops.host_bench.rmsnorm_custom.default

    def register_triton():
        import llmk.normalization.triton_rmsnorm as module
        from llmk.normalization.triton_rmsnorm import launch_rmsnorm

        kernels = {name: getattr(module, name) for name in ("_rmsnorm_fused_kernel", "_rmsnorm_looped_kernel")}
        wrapped = {name: torch.library.wrap_triton(kernel) for name, kernel in kernels.items()}

        @torch.library.triton_op("host_bench::rmsnorm_triton", mutates_args=())
        def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
            y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            # launch_rmsnorm launches the module's kernels: swap in the wrapped ones for the call
            for name, kernel in wrapped.items():
                setattr(module, name, kernel)
            try:
                launch_rmsnorm(x, None, weight, eps, y, None)
            finally:
                for name, kernel in kernels.items():
                    setattr(module, name, kernel)
            return y

        return rmsnorm_triton, torch.ops.host_bench.rmsnorm_triton.default

    def builder(kind):
        def build():
            from llmk.normalization.checks import check_norm_args
            from llmk.normalization.triton_rmsnorm import launch_rmsnorm

            if kind not in registered:
                registered[kind] = (register_custom if kind == "custom" else register_triton)()
            op, overload = registered[kind]
            x, w, y = rand((1, n), DTYPE), rand((n,), DTYPE), torch.empty(1, n, dtype=DTYPE, device=DEVICE)

            def public():
                check_norm_args(x, w, EPS)  # what rmsnorm() checks before its operator
                return op(x, w, float(EPS))

            def launcher():
                launch_rmsnorm(x, None, w, EPS, y, None)
                return y

            return {
                "public": public,
                "torch.ops": lambda: overload(x, w, float(EPS)),
                "launcher": launcher,
                "pytorch": lambda: F.rms_norm(x, (n,), w, EPS),
            }

        return build

    shape = f"1x{n}"
    return [
        HostCase("rmsnorm via custom_op", shape, "F.rms_norm", builder("custom")),
        HostCase("rmsnorm via triton_op", shape, "F.rms_norm", builder("triton")),
    ]


def attention_cases(s):
    h, hkv, d, t, chunk = s["heads"], s["kv_heads"], s["head_dim"], s["cache"], s["chunk"]

    def build_softmax():
        from llmk.attention.triton_softmax import launch_softmax, softmax

        x = rand((s["scores"], t), DTYPE)
        y = torch.empty_like(x)

        def launcher():
            launch_softmax(x, y)
            return y

        return {"public": lambda: softmax(x), "launcher": launcher, "pytorch": lambda: torch.softmax(x, -1)}

    def build_rope():
        from llmk.attention.reference_rope import apply_rope_ref, rope_cos_sin
        from llmk.attention.triton_rope import apply_rope, launch_rope

        q, k = rand((1, h, 1, d), DTYPE), rand((1, hkv, 1, d), DTYPE)
        cos, sin = rope_cos_sin(torch.tensor([t - 1], device=DEVICE), d)  # the next token's position
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)

        def launcher():
            launch_rope(q, k, cos, sin, q_out, k_out, False)
            return q_out, k_out

        return {
            "public": lambda: apply_rope(q, k, cos, sin),
            "launcher": launcher,
            "pytorch": lambda: apply_rope_ref(q, k, cos, sin),
        }

    def build_flash():
        from llmk.attention.attention_paths import gluon_forward
        from llmk.attention.flash_attention_ops import flash_attention, launch_flash_attention

        q, k, v = rand((1, h, chunk, d), DTYPE), rand((1, hkv, chunk, d), DTYPE), rand((1, hkv, chunk, d), DTYPE)
        out = torch.empty_like(q)
        launch = launch_flash_attention
        if gluon_forward(q, k, v, True, out, None, None, None):  # the kernel the public call takes here
            from llmk.attention.gluon_flash_attention_fwd import launch_gluon_attention as launch

        def launcher():
            launch(q, k, v, out, True, 1.0 / math.sqrt(d))
            return out

        return {
            "public": lambda: flash_attention(q, k, v, causal=True),
            "launcher": launcher,
            "pytorch": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        }

    return [
        HostCase("softmax", f"{s['scores']}x{t}", "torch.softmax", build_softmax),
        HostCase("apply_rope", f"1x{h}/{hkv}x1x{d}", "rotate_half (attention/reference_rope.py)", build_rope),
        HostCase("flash_attention", f"1x{h}/{hkv}x{chunk}x{d} causal", "SDPA", build_flash),
    ]


def mlp_cases(s):
    def build_bias_gelu():
        from llmk.mlp.triton_bias_gelu import bias_gelu, launch_bias_gelu

        x, b = rand((1, s["gelu"]), DTYPE), rand((s["gelu"],), DTYPE)
        y = torch.empty_like(x)

        def launcher():
            launch_bias_gelu(x, b, "none", y)
            return y

        return {"public": lambda: bias_gelu(x, b), "launcher": launcher, "pytorch": lambda: F.gelu(x + b)}

    def build_swiglu():
        from llmk.mlp.triton_glu import launch_glu, swiglu

        gate, up = rand((1, 2 * s["mlp"]), DTYPE).chunk(2, dim=-1)  # halves of one gate/up projection
        y = torch.empty(gate.shape, dtype=DTYPE, device=DEVICE)

        def launcher():
            launch_glu(gate, up, y, "silu")
            return y

        return {"public": lambda: swiglu(gate, up), "launcher": launcher, "pytorch": lambda: F.silu(gate) * up}

    return [
        HostCase("bias_gelu", f"1x{s['gelu']}", "F.gelu(x + b)", build_bias_gelu),
        HostCase("swiglu", f"1x{s['mlp']}", "F.silu(g) * u", build_swiglu),
    ]


def gemm_cases(s):
    k = s["hidden"]

    def build_matmul(m):
        def build():
            from llmk.gemm.matmul_ops import launch_matmul, matmul

            a, w = rand((m, k), DTYPE), rand((k, k), DTYPE)  # w: an nn.Linear weight (N, K)
            c = torch.empty(m, k, dtype=DTYPE, device=DEVICE)

            def launcher():
                launch_matmul(a, w.T, None, None, c)
                return c

            return {"public": lambda: matmul(a, w.T), "launcher": launcher, "pytorch": lambda: F.linear(a, w)}

        return build

    def build_rmsnorm_linear(m):
        def build():
            from llmk.gemm.triton_rmsnorm_linear import launch_decode, rmsnorm_linear

            x, norm_w, w = rand((m, k), DTYPE), rand((k,), DTYPE), rand((s["qkv"], k), DTYPE)
            y = torch.empty(m, s["qkv"], dtype=DTYPE, device=DEVICE)

            def launcher():  # M <= 16: the fused decode path
                launch_decode(x, norm_w, w, EPS, y)
                return y

            return {
                "public": lambda: rmsnorm_linear(x, norm_w, w, EPS),
                "launcher": launcher,
                "pytorch": lambda: F.linear(F.rms_norm(x, (k,), norm_w, EPS), w),
            }

        return build

    return [HostCase("matmul", f"{m}x{k}x{k} (W.T)", "F.linear", build_matmul(m)) for m in (1, 8)] + [
        HostCase("rmsnorm_linear", f"{m}x{s['qkv']}x{k}", "F.rms_norm, F.linear", build_rmsnorm_linear(m))
        for m in (1, 8)
    ]


def decode_cases(s):
    h, hkv, d, t = s["heads"], s["kv_heads"], s["head_dim"], s["cache"]

    def inputs():
        q = rand((1, h, d), DTYPE)
        k_cache, v_cache = rand((1, t, hkv, d), DTYPE), rand((1, t, hkv, d), DTYPE)
        lengths = torch.full((1,), t, dtype=torch.int32, device=DEVICE)
        out = torch.empty_like(q)
        # SDPA's preferred layout: contiguous (B, Hkv, T, D) K and V, q as (B, H, 1, D)
        k4, v4 = k_cache.transpose(1, 2).contiguous(), v_cache.transpose(1, 2).contiguous()
        sdpa = lambda: F.scaled_dot_product_attention(q[:, :, None], k4, v4, enable_gqa=True)  # noqa: E731
        return q, k_cache, v_cache, lengths, out, sdpa

    def build_decode():
        from llmk.inference.triton_inference_attention import _launch, decode_attention

        q, k_cache, v_cache, lengths, out, sdpa = inputs()

        def launcher():
            return _launch(q, k_cache, v_cache, lengths, None, 1, t, out, None, None, None)

        return {"public": lambda: decode_attention(q, k_cache, v_cache, lengths), "launcher": launcher, "pytorch": sdpa}

    def build_paged():
        from llmk.inference.triton_inference_attention import _launch, paged_decode_attention

        q, k_cache, v_cache, lengths, out, sdpa = inputs()
        pages = t // PAGE
        k_pages, v_pages = k_cache.view(pages, PAGE, hkv, d), v_cache.view(pages, PAGE, hkv, d)
        table = torch.arange(pages, dtype=torch.int32, device=DEVICE)[None]

        def launcher():
            return _launch(q, k_pages, v_pages, lengths, table, PAGE, pages * PAGE, out, None, None, None)

        return {
            "public": lambda: paged_decode_attention(q, k_pages, v_pages, table, lengths),
            "launcher": launcher,
            "pytorch": sdpa,
        }

    shape = f"1x{h}/{hkv}x{t}x{d}"
    return [
        HostCase("decode_attention", shape, "SDPA, one query", build_decode),
        HostCase("paged_decode_attention", shape + f" pages of {PAGE}", "SDPA, one query", build_paged),
    ]


def optimizer_cases(s):
    def build():
        from llmk.optimizers.triton_adam import TritonAdamW

        def param():
            p = torch.nn.Parameter(rand((s["params"],), DTYPE))
            p.grad = rand((s["params"],), DTYPE)
            return p

        ours, theirs = TritonAdamW([param()]), torch.optim.AdamW([param()], fused=True)
        # launcher: None, the operator's implementation on the arguments step() gave it
        return {"public": ours.step, "launcher": None, "pytorch": theirs.step}

    return [HostCase("TritonAdamW.step", f"{s['params']}", "torch.optim.AdamW(fused=True).step", build)]


def cases(s):
    return (
        norm_cases(s)
        + rmsnorm_registered_cases(s)
        + attention_cases(s)
        + mlp_cases(s)
        + gemm_cases(s)
        + decode_cases(s)
        + optimizer_cases(s)
    )


# ---------------------------------------------------------------------------------------------
# the training cases: one forward + backward call


@dataclass
class TrainCase:
    """One fwd+bwd row: build() returns (inputs, wrt: the positions of the inputs that get
    gradients, {provider: fn(*inputs), or why it is not timed}); "torch.compile", where build()
    leaves it out, is its "pytorch" compiled. pytorch_name: the counterpart."""

    op: str
    shape: str
    pytorch_name: str
    build: Callable


NO_LIGER = "Liger-Kernel has no such op"


def liger_call(make):
    """Liger's call from a benchmark's helper (make: () -> fn, or why it is unavailable)."""
    return "liger: its kernels do not run in Triton's interpreter" if INTERPRET else make()


def train_cases(s):
    n, h, hkv, d, t, m = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["micro_batch"], s["rows"]

    def build_rmsnorm():
        from llmk.normalization.triton_rmsnorm import rmsnorm

        return (
            (rand((1, n), DTYPE), rand((n,), DTYPE)),
            (0, 1),
            {
                "public": lambda x, w: rmsnorm(x, w, EPS),
                LIGER: liger_call(liger_rmsnorm),
                "pytorch": lambda x, w: F.rms_norm(x, (n,), w, EPS),
            },
        )

    def build_layernorm():
        from llmk.normalization.triton_layernorm import layernorm

        return (
            (rand((1, n), DTYPE), rand((n,), DTYPE), rand((n,), DTYPE)),
            (0, 1, 2),
            {
                "public": lambda x, w, b: layernorm(x, w, b, 1e-5),
                LIGER: liger_call(liger_layernorm),
                "pytorch": lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5),
            },
        )

    def build_residual():
        from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm

        def pytorch(x, r, w):
            u = x + r
            return F.rms_norm(u, (n,), w, EPS), u

        return (
            (rand((1, n), DTYPE), rand((1, n), DTYPE), rand((n,), DTYPE)),
            (0, 1, 2),
            {
                "public": lambda x, r, w: residual_rmsnorm(x, r, w, EPS),
                LIGER: liger_call(liger_residual_rmsnorm),
                "pytorch": pytorch,
            },
        )

    def build_rope():
        from llmk.attention.reference_rope import apply_rope_ref, rope_cos_sin
        from llmk.attention.triton_rope import apply_rope

        q, k = (rand((1, t, heads, d), DTYPE).transpose(1, 2) for heads in (h, hkv))  # (B, T, H, D) storage
        cos, sin = (c[None] for c in rope_cos_sin(torch.arange(t, device=DEVICE), d, dtype=DTYPE))
        return (
            (q, k, cos, sin),
            (0, 1),
            {"public": apply_rope, LIGER: liger_call(liger_rope), "pytorch": apply_rope_ref},
        )

    def build_flash():
        from llmk.attention.flash_attention_ops import flash_attention

        q, k, v = rand((1, h, t, d), DTYPE), rand((1, hkv, t, d), DTYPE), rand((1, hkv, t, d), DTYPE)
        return (
            (q, k, v),
            (0, 1, 2),
            {
                "public": lambda q, k, v: flash_attention(q, k, v, causal=True),
                LIGER: NO_LIGER,
                "pytorch": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            },
        )

    def build_bias_gelu():
        from llmk.mlp.triton_bias_gelu import bias_gelu

        return (
            (rand((1, s["gelu"]), DTYPE), rand((s["gelu"],), DTYPE)),
            (0, 1),
            {"public": bias_gelu, LIGER: NO_LIGER, "pytorch": lambda x, b: F.gelu(x + b)},
        )

    def build_swiglu():
        from llmk.mlp.triton_glu import swiglu

        gate, up = rand((1, 2 * s["mlp"]), DTYPE).chunk(2, dim=-1)  # halves of one gate/up projection
        return (
            (gate, up),
            (0, 1),
            {"public": swiglu, LIGER: liger_call(liger_swiglu), "pytorch": lambda g, u: F.silu(g) * u},
        )

    def build_matmul():
        from llmk.gemm.matmul_ops import matmul

        return (
            (rand((m, n), DTYPE), rand((n, n), DTYPE)),
            (0, 1),  # w: an nn.Linear weight (N, K)
            {"public": lambda a, w: matmul(a, w.T), LIGER: NO_LIGER, "pytorch": F.linear},
        )

    def build_rmsnorm_linear():
        from llmk.gemm.triton_rmsnorm_linear import rmsnorm_linear

        return (
            (rand((m, n), DTYPE), rand((n,), DTYPE), rand((s["qkv"], n), DTYPE)),
            (0, 1, 2),
            {
                "public": lambda x, nw, w: rmsnorm_linear(x, nw, w, EPS),
                LIGER: NO_LIGER,
                "pytorch": lambda x, nw, w: F.linear(F.rms_norm(x, (n,), nw, EPS), w),
            },
        )

    def build_cross_entropy():
        from llmk.losses.triton_cross_entropy import cross_entropy

        target = torch.randint(0, s["vocab"], (m,), device=DEVICE)
        return (
            (rand((m, s["vocab"]), DTYPE), target),
            (0,),
            {"public": cross_entropy, LIGER: liger_call(liger_ce), "pytorch": F.cross_entropy},
        )

    def build_linear_cross_entropy():
        from llmk.losses.fused_linear_cross_entropy_ops import fused_linear_cross_entropy

        v = s["head_vocab"]
        target = torch.randint(0, v, (m,), device=DEVICE)
        return (
            (rand((m, n), DTYPE), rand((v, n), DTYPE, scale=n**-0.5), target),
            (0, 1),
            {
                "public": fused_linear_cross_entropy,
                LIGER: liger_call(liger_lce),
                "pytorch": lambda x, w, y: F.cross_entropy(F.linear(x, w), y),
            },
        )

    norm = f"1x{n}"
    attention = f"1x{h}/{hkv}x{t}x{d}"
    return [
        TrainCase("rmsnorm", norm, "F.rms_norm", build_rmsnorm),
        TrainCase("layernorm", norm, "F.layer_norm", build_layernorm),
        TrainCase("residual_rmsnorm", norm, "x + r, F.rms_norm", build_residual),
        TrainCase("apply_rope", attention, "rotate_half (attention/reference_rope.py)", build_rope),
        TrainCase("flash_attention", attention + " causal", "SDPA", build_flash),
        TrainCase("bias_gelu", f"1x{s['gelu']}", "F.gelu(x + b)", build_bias_gelu),
        TrainCase("swiglu", f"1x{s['mlp']}", "F.silu(g) * u", build_swiglu),
        TrainCase("matmul", f"{m}x{n}x{n} (W.T)", "F.linear", build_matmul),
        TrainCase("rmsnorm_linear", f"{m}x{s['qkv']}x{n}", "F.rms_norm, F.linear", build_rmsnorm_linear),
        TrainCase("cross_entropy", f"{m}x{s['vocab']}", "F.cross_entropy", build_cross_entropy),
        TrainCase(
            "fused_linear_cross_entropy",
            f"{m}x{n}x{s['head_vocab']}",
            "F.linear, F.cross_entropy",
            build_linear_cross_entropy,
        ),
    ]


# ---------------------------------------------------------------------------------------------
# the loop


def error_text(e):
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}"[:200]


def make_row(op, shape, provider, mode, us=None, error=None, **extra):
    row = {
        "op": op,
        "shape": shape,
        "dtype": "bf16",
        "provider": provider,
        "mode": mode,
        "us": None if us is None else round(us, 2),
        "error": error,
    }
    row.update(extra)
    return row


def prepare(case):
    """({provider: call, or why there is none}, the llmk operators' names): the public function is
    called once, recording its operators, and the launcher's output checked against its own."""
    calls = case.build()
    if "torch.ops" in calls:  # registered another way (custom_op, triton_op): no Op to time
        calls.setdefault("op", None)
        calls.setdefault("impl", None)
    try:
        with torch.no_grad():
            result, ops = recorded_ops(calls["public"])
    except Exception as e:  # noqa: BLE001  (the PyTorch row and a given launcher can still be timed)
        why = f"the public function raised {error_text(e)}"
        calls["public"] = why
        calls.setdefault("torch.ops", why)
        if calls.get("launcher") is None:
            calls["launcher"] = why
        return calls, ""
    names = " + ".join(f"llmk::{op.name}" for op, _ in ops)
    missing = "the public function called no llmk operator (common.ops.define_op): not converted yet?"
    for provider, attribute in (("op", "__call__"), ("impl", "impl")):
        if provider not in calls:
            calls[provider] = through(ops, attribute) if ops else missing
    if "torch.ops" not in calls:
        calls["torch.ops"] = (
            through(ops, "overload")
            if ops
            else ("the public function called no llmk operator (common.ops.define_op): not converted yet?")
        )
    if calls.get("launcher") is None:
        calls["launcher"] = through(ops, "impl") if ops else "no llmk operator whose implementation could stand in"
    elif result is not None:  # the same kernel on the same inputs: a different output is a wrong launcher call
        try:
            with torch.no_grad():
                diff = max_err(calls["launcher"](), result)
            if not diff <= 0.02 * (1 + largest(result)):
                calls["launcher"] = f"its output differs from the public function's by {diff:.3g}: a wrong call"
        except Exception as e:  # noqa: BLE001  (a launcher whose signature changed, say)
            calls["launcher"] = error_text(e)
    return calls, names


def measure_case(bench, case, s):
    wanted = [p for p in PROVIDERS if bench.selected(case.op, case.shape, p)]
    if not wanted:
        return
    try:
        calls, names = prepare(case)
    except Exception as e:  # noqa: BLE001  (any failure is the row's result)
        calls, names = dict.fromkeys(PROVIDERS, f"setup: {error_text(e)}"), ""
    for mode, context in MODES.items():
        timed = {p: calls[p] for p in wanted if callable(calls.get(p))}
        us, errors = interleaved_us(timed, context, s)
        for provider in wanted:
            call = calls.get(provider)
            if call is None:  # not a provider of this row
                continue
            extra = {"pytorch_call": case.pytorch_name} if provider == "pytorch" else {}
            if provider in ("op", "impl", "torch.ops") and names:
                extra["operators"] = names
            error = call if isinstance(call, str) else errors.get(provider)
            row = make_row(case.op, case.shape, provider, mode, None if error else us[provider], error, **extra)
            bench.rows.append(row)
            shown = f"{row['us']:9.2f} us" if row["us"] is not None else f"ERROR {row['error']}"
            print(f"{case.op:24s} {case.shape:>28s} {mode:14s} {provider:9s} {shown}", flush=True)


def train_calls(case):
    """({provider: the timed call}, {provider: why it is not timed}, {provider: error}). Every
    provider's call takes its own copy of the inputs and of one set of upstream gradients; ours is
    called once and its gradients checked against PyTorch's."""
    inputs, wrt, fns = case.build()
    fns.setdefault("torch.compile", compile_train_fn(fns["pytorch"], TRAIN_MODE))
    with torch.no_grad():
        outs = fns["pytorch"](*inputs)
    grad_outputs = [
        torch.randn(o.shape, device=o.device).to(o.dtype)
        for o in (outs if isinstance(outs, (tuple, list)) else (outs,))
    ]
    calls, skipped, errors = {}, {}, {}
    for provider in TRAIN_PROVIDERS:
        fn = fns.get(provider)
        if isinstance(fn, str):
            skipped[provider] = fn
        else:
            calls[provider] = train_call(
                fn, [a.clone() for a in inputs], wrt, TRAIN_MODE, [g.clone() for g in grad_outputs]
            )
    grads = {}
    for provider in ("public", "pytorch"):
        try:
            with torch.enable_grad():
                grads[provider] = calls[provider]()
        except Exception as e:  # noqa: BLE001  (a failure is the row's result)
            errors[provider] = error_text(e)
            del calls[provider]
    if len(grads) == 2:  # the same inputs and upstream gradients: a different result is a wrong call
        diff = max_err(grads["public"], grads["pytorch"])
        if not diff <= 0.02 * (1 + largest(grads["pytorch"])):
            errors["public"] = f"its gradients differ from PyTorch's by {diff:.3g}: a wrong call"
            del calls["public"]
    return calls, skipped, errors


def measure_train_case(bench, case, s):
    wanted = [p for p in TRAIN_PROVIDERS if bench.selected(case.op, case.shape, p)]
    if not wanted:
        return
    try:
        calls, skipped, errors = train_calls(case)
    except Exception as e:  # noqa: BLE001  (any failure is the row's result)
        calls, skipped, errors = {}, {}, dict.fromkeys(TRAIN_PROVIDERS, f"setup: {error_text(e)}")
    us, timing_errors = interleaved_us({p: calls[p] for p in wanted if p in calls}, torch.enable_grad, s)
    errors.update(timing_errors)
    for provider in wanted:
        error = errors.get(provider)
        if error and provider in (LIGER, "torch.compile"):  # a peer that fails is skipped, with the reason
            skipped[provider], error = error, None
        extra = {"pytorch_call": case.pytorch_name} if provider in ("pytorch", "torch.compile") else {}
        if provider in skipped:
            extra["skipped"] = skipped[provider]
        timed = provider in us and not error and provider not in skipped
        row = make_row(case.op, case.shape, provider, TRAIN_MODE, us[provider] if timed else None, error, **extra)
        bench.rows.append(row)
        shown = f"{row['us']:9.2f} us" if timed else f"ERROR {error}" if error else f"skipped ({skipped[provider]})"
        print(f"{case.op:26s} {case.shape:>24s} {TRAIN_MODE:8s} {provider:13s} {shown}", flush=True)


def interleaved_us(calls, context, s):
    """({provider: CPU us a call}, {provider: error}): every call timed in turn for s["rounds"]
    rounds of s["calls"] calls (devtools.bench.host_time_us's count), each keeping its best round."""
    us, errors = {p: float("inf") for p in calls}, {}
    with context():
        for _ in range(s["rounds"]):
            for provider, call in calls.items():
                if provider in errors:
                    continue
                try:
                    us[provider] = min(us[provider], host_time_us(call, calls=s["calls"], rounds=1))
                except Exception as e:  # noqa: BLE001  (a failure is the row's result)
                    errors[provider] = error_text(e)
    return us, errors


def measure(s):
    def fill(bench):
        if not bench.wants_dtype("bf16"):  # every row is bf16
            return
        bench.meta["timer"] = (
            f"devtools.bench.host_time_us: {s['calls']} calls without a sync, best of {s['rounds']}, CPU us a call"
        )
        forward = bench.wants_mode("fwd")  # the no_grad and inference_mode rows
        if forward and bench.selected("empty kernel", "1", "launcher"):
            x = torch.empty(1, dtype=DTYPE, device=DEVICE)
            for mode, context in MODES.items():
                with context():
                    us = host_time_us(lambda: _empty_kernel[(1,)](x), calls=s["calls"], rounds=s["rounds"])
                bench.rows.append(make_row("empty kernel", "1", "launcher", mode, us))
                print(f"{'empty kernel':24s} {'1':>28s} {mode:14s} launcher  {us:9.2f} us", flush=True)
        if forward:
            for case in cases(s):
                measure_case(bench, case, s)
                if not INTERPRET:
                    torch.cuda.empty_cache()
        if bench.wants_mode(TRAIN_MODE):
            for case in train_cases(s):
                measure_train_case(bench, case, s)
                if not INTERPRET:
                    torch.cuda.empty_cache()

    return fill


def main():
    args = parse_args(__doc__)
    s = SMOKE if args.smoke else FULL
    failed = []

    def charts(meta, rows):  # no charts: the docs page is a table (scripts/report.py, area "host")
        failed.extend(r for r in rows if r.get("error"))

    run(args, "host", charts, measure=measure(s), ours=())
    if failed:
        print(f"\nhost: {len(failed)} rows failed:", file=sys.stderr)
        for r in failed:
            print(f"  {r['op']} {r['provider']} {r['mode']}: {r['error']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
