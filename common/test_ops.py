"""Every kernel as a PyTorch operator (common/ops.py): one row per (operator, check).

    python common/test_ops.py        (or: pytest common/test_ops.py)

For each operator torch.ops.llmk.<name>, on small shapes with fresh inputs:
- opcheck: torch.library.opcheck of the functional op and of its `_out` twin (schema, fake tensors
  against the real kernel, autograd registration, AOT dispatch);
- grad mode, for an op with a backward: opcheck again with the inputs of `wrt` requiring grad (its
  autograd registration and the backward traced by AOT dispatch); the gradients through the public
  function equal those through torch.ops.llmk.<name>, bit for bit; the `_out` twin raises
  (forward-only); under torch.no_grad() and torch.inference_mode() the outputs are the plain ones
  with no grad. (The gradients' accuracy is each folder's test.)
- forward-only, for an op without one: with grad mode on and an input that requires grad, the
  public function and the op itself raise a RuntimeError naming llmk::<name>; under torch.no_grad()
  and torch.inference_mode() the public function returns what it returns on plain inputs, bit for
  bit, with no grad;
- torch.compile: the public function and a `* 2` around it, compiled with fullgraph=True (aot_eager
  in the interpreter, inductor on a GPU), called twice on fresh inputs of one shape: one frame (no
  graph break, no recompile), equal to eager bit for bit (doubling is exact, fused or not); for an
  op with a backward, also a compiled training call (forward, then the gradients of `wrt`): one
  frame, gradients equal to eager's bit for bit;
- CUDA graphs (GPU only; these rows run first, so each captures the op's first call in the process
  with no warm-up; only cuBLAS's handle is made first, see warm_cublas): replay after copying fresh
  inputs into the captured ones equals an eager call on them; and
  torch.compile(mode="reduce-overhead") of a decode step (rmsnorm, matmul at M = 1, split-KV decode
  attention) called three times on new data equals eager.
TritonAdamW's step() updates its params in place through llmk::adamw_step: its rows are opcheck
of the op calls one step() makes, step() on params that require grad (its normal use), and the op in
a compiled function (functionalized: it writes its lists in place). step() itself does not compile
with fullgraph=True: it reads the step counts on the host (torch's own AdamW compiles through its
capturable mode, which TritonAdamW does not implement).

An operator that is not registered fails its rows with that message, it is never skipped. The
GPU-only rows are left out in the interpreter (they need CUDA), as every test script's gpu_only
cases are: the header line counts them.
"""

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch._dynamo.testing
from torch.utils._python_dispatch import TorchDispatchMode

from llmk.attention.flash_attention_ops import flash_attention, flash_attention_varlen
from llmk.attention.reference_rope import rope_cos_sin
from llmk.attention.triton_rope import apply_rope
from llmk.attention.triton_softmax import softmax
from llmk.common.device import DEVICE, INTERPRET
from llmk.common.ops import NAMESPACE, OPS, Op
from llmk.common.torch_private import schema_arguments
from llmk.devtools.testing import (
    COMPILE_BACKEND,
    EXACT,
    UNIT_ROUNDOFF,
    Case,
    Outcome,
    Tol,
    compare,
    expect_raises,
    main,
    opcheck,
    poisoned,
    rand,
)
from llmk.gemm.fp8_linear_ops import fp8_linear
from llmk.gemm.fp8_ops import fp8_matmul, quantize_fp8
from llmk.gemm.matmul_ops import matmul
from llmk.gemm.triton_fp8_producers import rmsnorm_fp8, swiglu_fp8
from llmk.gemm.triton_rmsnorm_linear import rmsnorm_linear
from llmk.inference.kv_cache import quantize_kv
from llmk.inference.triton_inference_attention import decode_attention, paged_decode_attention
from llmk.losses.fused_linear_cross_entropy_ops import fused_linear_cross_entropy_none_op
from llmk.losses.triton_cross_entropy import cross_entropy_op
from llmk.mlp.triton_bias_gelu import bias_gelu
from llmk.mlp.triton_glu import geglu, swiglu
from llmk.moe.moe_experts_ops import moe_experts
from llmk.moe.triton_moe_routing import moe_route
from llmk.normalization.residual_rmsnorm_ops import residual_rmsnorm
from llmk.normalization.triton_layernorm import layernorm
from llmk.normalization.triton_rmsnorm import rmsnorm
from llmk.optimizers.triton_adam import TritonAdamW

f16, bf16 = torch.float16, torch.bfloat16


@dataclass(frozen=True)
class OpSpec:
    """One operator and how to call it. inputs(): fresh inputs by name, small shapes. call(t): the
    public function on them. args(t): the functional op's arguments, in schema order. out_args(t):
    the `_out` op's, with new output buffers (None: no `_out` op). grad: the input that requires
    grad in the forward-only row. wrt: the inputs that get gradients in the grad-mode rows of an
    op with a backward."""

    label: str
    name: str
    inputs: Callable[[], dict]
    call: Callable[[dict], object]
    args: Callable[[dict], tuple]
    out_args: Optional[Callable[[dict], tuple]]
    grad: str
    wrt: tuple = ()
    opcheck_skip: tuple = ()  # opcheck tests left out (devtools.testing.opcheck)


def like(t):
    """An output buffer for the `_out` ops: contiguous, t's shape and dtype, full of NaN."""
    return poisoned(t.shape, t.dtype)


def norm_inputs(shape, dtype, bias=False, residual=False):
    t = dict(x=rand(shape, dtype, pad=(0,) * (len(shape) - 1) + (8,)), weight=rand(shape[-1:], dtype))
    if bias:
        t["bias"] = rand(shape[-1:], dtype)
    if residual:
        t["residual"] = rand(shape, dtype)
    return t


def rope_inputs(d=64, rotary_dim=64):
    # 3 positions in the interpreter: its cost is a program per tile of one or two positions, and
    # opcheck runs the op a dozen times; what the rows check does not depend on the length
    b, h, hkv, seq = 2, 4, 2, 3 if INTERPRET else 8
    cos, sin = rope_cos_sin(torch.arange(seq, device=DEVICE), rotary_dim)
    return dict(q=rand((b, seq, h, d), bf16).transpose(1, 2), k=rand((b, hkv, seq, d), bf16), cos=cos, sin=sin)


# query and KV heads of the attention and decode rows: a group of two, over one KV head in the
# interpreter, where each head costs a program per block of every call and the rows make dozens
HEADS, KV_HEADS = (2, 1) if INTERPRET else (4, 2)


def attention_inputs():
    return dict(q=rand((1, HEADS, 16, 64), f16), k=rand((1, KV_HEADS, 24, 64), f16), v=rand((1, KV_HEADS, 24, 64), f16))


VARLEN_Q, VARLEN_K = (5, 0, 11), (7, 3, 11)  # lengths of a packed batch's three sequences


def varlen_inputs():
    cu = lambda lengths: torch.tensor((0,) + lengths, device=DEVICE).cumsum(0).to(torch.int32)  # noqa: E731
    return dict(
        q=rand((sum(VARLEN_Q), HEADS, 32), bf16),
        k=rand((sum(VARLEN_K), KV_HEADS, 32), bf16),
        v=rand((sum(VARLEN_K), KV_HEADS, 32), bf16),
        cu_q=cu(VARLEN_Q),
        cu_k=cu(VARLEN_K),
    )


def loss_inputs():
    return dict(
        logits=rand((6, 100), bf16),
        target=torch.tensor([3, -100, 0, 99, 7, 50], device=DEVICE),
        hidden=rand((6, 32), bf16),
        weight=rand((100, 32), bf16),
        bias=rand((100,), bf16),
        class_weight=torch.rand(100, device=DEVICE) + 0.5,
    )


def linear_inputs(m, n, k, dtype, bias=False):
    """a (M, K) and an nn.Linear weight w (N, K); the matmul reads w.T in place."""
    t = dict(a=rand((m, k), dtype), w=rand((n, k), dtype))
    if bias:
        t["bias"] = rand((n,), dtype)
    return t


# Experts of the moe_experts rows: 4 in the interpreter, where every expert costs its row tiles and
# weight-gradient tiles, each a program, whatever its rows (moe/test_moe_experts.py tests the counts)
MOE_EXPERTS = 4 if INTERPRET else 8


def moe_inputs(t=9, hidden=32, inter=24, e=MOE_EXPERTS, k=2):
    weights, ids = moe_route(rand((t, e), torch.float32), k)
    return dict(
        x=rand((t, hidden), bf16),
        weights=weights,
        ids=ids,
        w_gate_up=rand((e, 2 * inter, hidden), bf16),
        w_down=rand((e, hidden, inter), bf16),
    )


def lengths_of(batch, t_max):
    """Fresh int32 lengths in 1..t_max: the kernel reads them on the device."""
    return torch.randint(1, t_max + 1, (batch,), dtype=torch.int32, device=DEVICE)


def decode_inputs(b=2, h=HEADS, hkv=KV_HEADS, t_max=40, d=64, dtype=f16):
    return dict(
        q=rand((b, h, d), dtype),
        k_cache=rand((b, t_max, hkv, d), dtype),
        v_cache=rand((b, t_max, hkv, d), dtype),
        lengths=lengths_of(b, t_max),
    )


def fp8_decode_inputs():
    """decode_inputs with the cache in e4m3 and its scales (inference/kv_cache.py's layout)."""
    t = decode_inputs()
    (kb, ks), (vb, vs) = quantize_kv(t["k_cache"]), quantize_kv(t["v_cache"])
    return dict(t, k_cache=kb.view(torch.float8_e4m3fn), v_cache=vb.view(torch.float8_e4m3fn), k_scale=ks, v_scale=vs)


def paged_inputs(b=2, h=HEADS, hkv=KV_HEADS, page_size=16, pages_per_seq=3, d=64, dtype=bf16):
    n_pages = b * pages_per_seq + 1  # one page no sequence uses
    table = torch.randperm(n_pages, device=DEVICE)[: b * pages_per_seq].view(b, pages_per_seq).to(torch.int32)
    return dict(
        q=rand((b, h, d), dtype),
        k_pages=rand((n_pages, page_size, hkv, d), dtype),
        v_pages=rand((n_pages, page_size, hkv, d), dtype),
        block_table=table,
        lengths=lengths_of(b, pages_per_seq * page_size),
    )


def fp8_inputs():
    """x to quantize; a and b = W.T quantized row-wise, their scales, a bias (the forward-only rows'
    grad input: e4m3 tensors take no gradient)."""
    x, w = rand((6, 128), bf16), rand((48, 128), bf16)
    (a, sa), (qw, sw) = quantize_fp8(x), quantize_fp8(w)
    return dict(x=x, a=a, b=qw.T, sa=sa, sb=sw, bias=rand((48,), bf16))


EPS = 1e-6
DECODE_SPLITS = 2  # forced: the interpreter's heuristics would not split these short caches

SPECS = [
    OpSpec(
        "rmsnorm",
        "rmsnorm",
        lambda: norm_inputs((3, 5, 64), f16),
        lambda t: rmsnorm(t["x"], t["weight"], EPS),
        lambda t: (t["x"], t["weight"], EPS, 0.0),
        lambda t: (t["x"], t["weight"], EPS, 0.0, like(t["x"])),
        "weight",
        ("x", "weight"),
    ),
    OpSpec(
        "rmsnorm offset=1 (Gemma)",
        "rmsnorm",
        lambda: norm_inputs((3, 5, 64), bf16),
        lambda t: rmsnorm(t["x"], t["weight"], EPS, offset=1.0),
        lambda t: (t["x"], t["weight"], EPS, 1.0),
        lambda t: (t["x"], t["weight"], EPS, 1.0, like(t["x"])),
        "x",
        ("x", "weight"),
    ),
    OpSpec(
        "rmsnorm weight=None",
        "rmsnorm",
        lambda: norm_inputs((3, 5, 64), bf16),
        lambda t: rmsnorm(t["x"], None, EPS, offset=1.0),
        lambda t: (t["x"], None, EPS, 1.0),
        lambda t: (t["x"], None, EPS, 1.0, like(t["x"])),
        "x",
        ("x",),
    ),
    OpSpec(
        "layernorm",
        "layernorm",
        lambda: norm_inputs((4, 96), bf16, bias=True),
        lambda t: layernorm(t["x"], t["weight"], t["bias"], EPS),
        lambda t: (t["x"], t["weight"], t["bias"], EPS),
        lambda t: (t["x"], t["weight"], t["bias"], EPS, like(t["x"])),
        "x",
        ("x", "weight", "bias"),
    ),
    OpSpec(
        "residual_rmsnorm",
        "residual_rmsnorm",
        lambda: norm_inputs((6, 64), bf16, residual=True),
        lambda t: residual_rmsnorm(t["x"], t["residual"], t["weight"], EPS),
        lambda t: (t["x"], t["residual"], t["weight"], EPS, 0.0),
        lambda t: (t["x"], t["residual"], t["weight"], EPS, 0.0, like(t["x"]), like(t["x"])),
        "residual",
        ("x", "residual", "weight"),
    ),
    OpSpec(
        "residual_rmsnorm weight=None",
        "residual_rmsnorm",
        lambda: norm_inputs((6, 64), f16, residual=True),
        lambda t: residual_rmsnorm(t["x"], t["residual"], None, EPS),
        lambda t: (t["x"], t["residual"], None, EPS, 0.0),
        lambda t: (t["x"], t["residual"], None, EPS, 0.0, like(t["x"]), like(t["x"])),
        "x",
        ("x", "residual"),
    ),
    OpSpec(
        "softmax",
        "softmax",
        lambda: dict(x=rand((6, 100), f16, pad=(0, 4))),
        lambda t: softmax(t["x"]),
        lambda t: (t["x"],),
        lambda t: (t["x"], like(t["x"])),
        "x",
        ("x",),
    ),
    OpSpec(
        "apply_rope",
        "apply_rope",
        rope_inputs,
        lambda t: apply_rope(t["q"], t["k"], t["cos"], t["sin"]),
        lambda t: (t["q"], t["k"], t["cos"], t["sin"], False),
        lambda t: (t["q"], t["k"], t["cos"], t["sin"], False, like(t["q"]), like(t["k"])),
        "k",
        ("q", "k"),
    ),
    OpSpec(
        "apply_rope partial rotary D 59 R 48",
        "apply_rope",
        lambda: rope_inputs(59, 48),
        lambda t: apply_rope(t["q"], t["k"], t["cos"], t["sin"], True),
        lambda t: (t["q"], t["k"], t["cos"], t["sin"], True),
        lambda t: (t["q"], t["k"], t["cos"], t["sin"], True, like(t["q"]), like(t["k"])),
        "q",
        ("q", "k"),
    ),
    OpSpec(
        "flash_attention causal",
        "flash_attention",
        attention_inputs,
        lambda t: flash_attention(t["q"], t["k"], t["v"], causal=True),
        lambda t: (t["q"], t["k"], t["v"], True, None, None),
        lambda t: (t["q"], t["k"], t["v"], True, None, None, like(t["q"])),
        "v",
        ("q", "k", "v"),
    ),
    OpSpec(
        "flash_attention window softcap",
        "flash_attention",
        attention_inputs,
        lambda t: flash_attention(t["q"], t["k"], t["v"], causal=True, window=(4, 0), softcap=5.0),
        lambda t: (t["q"], t["k"], t["v"], True, None, None, 4, 0, 5.0),
        lambda t: (t["q"], t["k"], t["v"], True, None, None, like(t["q"]), 4, 0, 5.0),
        "v",
        ("q", "k", "v"),
    ),
    OpSpec(
        "flash_attention_varlen causal",
        "flash_attention_varlen",
        varlen_inputs,
        lambda t: flash_attention_varlen(
            t["q"], t["k"], t["v"], t["cu_q"], t["cu_k"], max(VARLEN_Q), max(VARLEN_K), causal=True
        ),
        lambda t: (t["q"], t["k"], t["v"], t["cu_q"], t["cu_k"], max(VARLEN_Q), max(VARLEN_K), True, None, None),
        None,
        "q",
        ("q", "k", "v"),
    ),
    # the losses' public functions reduce the operators' rows in PyTorch: these rows call the
    # operators' Op wrappers (eager: their autograd.Function) against the dispatcher. The mean/sum
    # fused linear cross-entropy (it returns its gradients too) has its own rows in
    # losses/test_fused_linear_cross_entropy.py
    OpSpec(
        "cross_entropy",
        "cross_entropy",
        loss_inputs,
        lambda t: cross_entropy_op(t["logits"], t["target"], -100, 0.1),
        lambda t: (t["logits"], t["target"], -100, 0.1),
        None,
        "logits",
        ("logits",),
    ),
    OpSpec(
        "fused_linear_cross_entropy_none",
        "fused_linear_cross_entropy_none",
        loss_inputs,
        lambda t: fused_linear_cross_entropy_none_op(t["hidden"], t["weight"], t["target"], t["bias"], -100, 0.0, None),
        lambda t: (t["hidden"], t["weight"], t["target"], t["bias"], -100, 0.0, None),
        None,
        "hidden",
        ("hidden", "weight", "bias"),
    ),
    OpSpec(
        "cross_entropy weight softcap accuracy",
        "cross_entropy",
        loss_inputs,
        lambda t: cross_entropy_op(t["logits"], t["target"], -100, 0.1, t["class_weight"], 5.0, True),
        lambda t: (t["logits"], t["target"], -100, 0.1, t["class_weight"], 5.0, True),
        None,
        "logits",
        ("logits",),
    ),
    OpSpec(
        "fused_linear_cross_entropy_none class_weight accuracy",
        "fused_linear_cross_entropy_none",
        loss_inputs,
        lambda t: fused_linear_cross_entropy_none_op(
            t["hidden"], t["weight"], t["target"], t["bias"], -100, 0.1, 30.0, t["class_weight"], True
        ),
        lambda t: (t["hidden"], t["weight"], t["target"], t["bias"], -100, 0.1, 30.0, t["class_weight"], True),
        None,
        "hidden",
        ("hidden", "weight", "bias"),
    ),
    OpSpec(
        "bias_gelu tanh",
        "bias_gelu",
        lambda: dict(x=rand((5, 96), f16), bias=rand((96,), f16)),
        lambda t: bias_gelu(t["x"], t["bias"], "tanh"),
        lambda t: (t["x"], t["bias"], "tanh"),
        lambda t: (t["x"], t["bias"], "tanh", like(t["x"])),
        "bias",
        ("x", "bias"),
    ),
    OpSpec(
        "swiglu",
        "swiglu",
        lambda: dict(gate=rand((3, 7, 96), bf16), up=rand((3, 7, 96), bf16)),
        lambda t: swiglu(t["gate"], t["up"]),
        lambda t: (t["gate"], t["up"]),
        lambda t: (t["gate"], t["up"], like(t["gate"])),
        "gate",
        ("gate", "up"),
    ),
    OpSpec(
        "swiglu grad_in_place",
        "swiglu_grad_in_place",
        lambda: dict(gate=rand((3, 7, 96), bf16), up=rand((3, 7, 96), bf16)),
        lambda t: swiglu(t["gate"], t["up"], grad_in_place=True),
        lambda t: (t["gate"], t["up"]),
        None,
        "gate",
        ("gate", "up"),
    ),
    OpSpec(
        "geglu tanh",
        "geglu",
        lambda: dict(gate=rand((3, 7, 96), f16), up=rand((3, 7, 96), f16)),
        lambda t: geglu(t["gate"], t["up"], "tanh"),
        lambda t: (t["gate"], t["up"], "tanh"),
        lambda t: (t["gate"], t["up"], "tanh", like(t["gate"])),
        "up",
        ("gate", "up"),
    ),
    OpSpec(
        "geglu grad_in_place",
        "geglu_grad_in_place",
        lambda: dict(gate=rand((3, 7, 96), bf16), up=rand((3, 7, 96), bf16)),
        lambda t: geglu(t["gate"], t["up"], "none", grad_in_place=True),
        lambda t: (t["gate"], t["up"], "none"),
        None,
        "gate",
        ("gate", "up"),
    ),
    OpSpec(
        "matmul",
        "matmul",
        lambda: linear_inputs(5, 48, 64, f16),
        lambda t: matmul(t["a"], t["w"].T),
        lambda t: (t["a"], t["w"].T, None, None),
        lambda t: (t["a"], t["w"].T, None, None, poisoned((5, 48), f16)),
        "w",
        ("a", "w"),
    ),
    OpSpec(
        "matmul bias+gelu",
        "matmul",
        lambda: linear_inputs(5, 48, 64, bf16, bias=True),
        lambda t: matmul(t["a"], t["w"].T, t["bias"], "gelu"),
        lambda t: (t["a"], t["w"].T, t["bias"], "gelu"),
        lambda t: (t["a"], t["w"].T, t["bias"], "gelu", poisoned((5, 48), bf16)),
        "bias",
        ("a", "w", "bias"),
    ),
    OpSpec(
        "rmsnorm_linear",
        "rmsnorm_linear",
        lambda: dict(x=rand((2, 64), f16), norm_weight=rand((64,), f16), weight=rand((48, 64), f16)),
        lambda t: rmsnorm_linear(t["x"], t["norm_weight"], t["weight"], EPS),
        lambda t: (t["x"], t["norm_weight"], t["weight"], EPS, None),
        None,
        "weight",
        ("x", "norm_weight", "weight"),
    ),
    OpSpec(
        "quantize_fp8 1x128",
        "quantize_fp8",
        fp8_inputs,
        lambda t: quantize_fp8(t["x"], "1x128"),
        lambda t: (t["x"], "1x128"),
        None,
        "x",
    ),
    OpSpec(
        "fp8_matmul bias+silu",
        "fp8_matmul",
        fp8_inputs,
        lambda t: fp8_matmul(t["a"], t["b"], t["sa"], t["sb"], t["bias"], "silu"),
        lambda t: (t["a"], t["b"], t["sa"], t["sb"], t["bias"], "silu", bf16),
        None,
        "bias",
        # test_schema compares the inputs before and after with float8 arithmetic torch lacks
        opcheck_skip=("test_schema",),
    ),
    OpSpec(
        "rmsnorm_fp8 residual keep_y",
        "rmsnorm_fp8",
        lambda: norm_inputs((3, 5, 64), bf16, residual=True),
        lambda t: tuple(rmsnorm_fp8(t["x"], t["weight"], EPS, residual=t["residual"], keep_y=True)),
        lambda t: (t["x"], t["residual"], t["weight"], EPS, 0.0, True),
        None,
        "x",
        ("x", "residual", "weight"),
        # opcheck's AOT test sums every output, e4m3 ones too, which torch cannot: the compiled
        # training rows trace the backward instead
        opcheck_skip=("test_aot_dispatch_dynamic",),
    ),
    OpSpec(
        "swiglu_fp8 keep_y",
        "glu_fp8",
        lambda: dict(gate=rand((4, 96), bf16), up=rand((4, 96), bf16)),
        lambda t: tuple(swiglu_fp8(t["gate"], t["up"], keep_y=True)[:3]),
        lambda t: (t["gate"], t["up"], "silu", True),
        None,
        "gate",
        ("gate", "up"),
        opcheck_skip=("test_aot_dispatch_dynamic",),
    ),
    OpSpec(
        "moe_route E60 top4",
        "moe_route",
        lambda: dict(logits=rand((9, 60), bf16)),
        lambda t: moe_route(t["logits"], 4),
        lambda t: (t["logits"], 4, "softmax", True),
        None,
        "logits",
        ("logits",),
    ),
    OpSpec(
        f"moe_experts E{MOE_EXPERTS} top2",
        "moe_experts",
        moe_inputs,
        lambda t: moe_experts(t["x"], t["weights"], t["ids"], t["w_gate_up"], t["w_down"]),
        lambda t: (t["x"], t["weights"], t["ids"], t["w_gate_up"], t["w_down"], "silu", True),
        None,
        "x",
        ("x", "weights", "w_gate_up", "w_down"),
    ),
    OpSpec(
        "fp8_linear bias",
        "fp8_linear",
        lambda: linear_inputs(6, 48, 128, bf16, bias=True),
        lambda t: fp8_linear(t["a"], t["w"], t["bias"]),
        lambda t: (t["a"], t["w"], t["bias"]),
        None,
        "w",
        ("a", "w", "bias"),
    ),
    OpSpec(
        f"decode_attention split {DECODE_SPLITS}",
        "decode_attention",
        decode_inputs,
        lambda t: decode_attention(t["q"], t["k_cache"], t["v_cache"], t["lengths"], num_splits=DECODE_SPLITS),
        lambda t: (t["q"], t["k_cache"], t["v_cache"], t["lengths"], None, DECODE_SPLITS, None),
        lambda t: (t["q"], t["k_cache"], t["v_cache"], t["lengths"], None, DECODE_SPLITS, None, like(t["q"])),
        "q",
    ),
    OpSpec(
        "decode_attention e4m3 cache",
        "decode_attention",
        fp8_decode_inputs,
        lambda t: decode_attention(
            t["q"],
            t["k_cache"],
            t["v_cache"],
            t["lengths"],
            num_splits=DECODE_SPLITS,
            k_scale=t["k_scale"],
            v_scale=t["v_scale"],
        ),
        lambda t: (
            t["q"],
            t["k_cache"],
            t["v_cache"],
            t["lengths"],
            None,
            DECODE_SPLITS,
            None,
            -1,
            0.0,
            t["k_scale"],
            t["v_scale"],
        ),
        lambda t: (
            t["q"],
            t["k_cache"],
            t["v_cache"],
            t["lengths"],
            None,
            DECODE_SPLITS,
            None,
            like(t["q"]),
            -1,
            0.0,
            t["k_scale"],
            t["v_scale"],
        ),
        "q",
        # test_schema compares the inputs before and after with float8 arithmetic torch lacks
        opcheck_skip=("test_schema",),
    ),
    OpSpec(
        "decode_attention hd 96 window softcap",
        "decode_attention",
        lambda: decode_inputs(d=96),
        lambda t: decode_attention(t["q"], t["k_cache"], t["v_cache"], t["lengths"], window=(9, 0), softcap=5.0),
        lambda t: (t["q"], t["k_cache"], t["v_cache"], t["lengths"], None, None, None, 9, 5.0),
        lambda t: (t["q"], t["k_cache"], t["v_cache"], t["lengths"], None, None, None, like(t["q"]), 9, 5.0),
        "q",
    ),
    OpSpec(
        "paged_decode_attention hd 80",
        "paged_decode_attention",
        lambda: paged_inputs(d=80),
        lambda t: paged_decode_attention(t["q"], t["k_pages"], t["v_pages"], t["block_table"], t["lengths"]),
        lambda t: (t["q"], t["k_pages"], t["v_pages"], t["block_table"], t["lengths"], None, None, None),
        lambda t: (t["q"], t["k_pages"], t["v_pages"], t["block_table"], t["lengths"], None, None, None, like(t["q"])),
        "k_pages",
    ),
]


def registered(name):
    """torch.ops.llmk.<name>.default, or None when no operator of that name is registered."""
    try:
        return getattr(getattr(torch.ops, NAMESPACE), name).default
    except (AttributeError, RuntimeError):
        return None


def missing(check, name):
    return [Outcome(check, False, note=f"{NAMESPACE}::{name} is not registered (not an operator yet?)")]


def tensors_of(result):
    """The output tensors of a call, as a tuple (one tensor, or a tuple of them)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def outputs_equal(check, got, want):
    got, want = tensors_of(got), tensors_of(want)
    if len(got) != len(want):
        return [Outcome(check, False, note=f"{len(got)} outputs, expected {len(want)}")]
    return [
        compare(check if len(got) == 1 else f"{check} [{i}]", g, w, EXACT) for i, (g, w) in enumerate(zip(got, want))
    ]


def check_opcheck(spec):
    outcomes = []
    variants = [(spec.name, spec.args)] + ([(f"{spec.name}_out", spec.out_args)] if spec.out_args else [])
    for name, args in variants:
        overload = registered(name)
        if overload is None:
            outcomes += missing(f"opcheck {NAMESPACE}::{name}", name)
            continue
        skipped = f" (less {', '.join(spec.opcheck_skip)})" if spec.opcheck_skip else ""
        outcomes.append(
            opcheck(f"opcheck {NAMESPACE}::{name}{skipped}", overload, args(spec.inputs()), spec.opcheck_skip)
        )
    return outcomes


def without_grad(spec, with_grad, want):
    """Under torch.no_grad() and torch.inference_mode() a call on inputs that require grad returns
    `want` (the call on plain inputs), bit for bit, with no grad."""
    outcomes = []
    for mode_name, mode in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        with mode():
            got = spec.call(with_grad)
        outcomes += outputs_equal(f"under {mode_name}", got, want)
        flags = [t.requires_grad for t in tensors_of(got)]
        outcomes.append(
            Outcome(
                f"under {mode_name}: no grad", not any(flags), note="" if not any(flags) else f"requires_grad {flags}"
            )
        )
    return outcomes


def check_forward_only(spec):
    overload = registered(spec.name)
    if overload is None:
        return missing("forward-only", spec.name)
    inputs = spec.inputs()
    want = spec.call(inputs)  # grad mode on, nothing requires grad
    with_grad = dict(inputs)
    with_grad[spec.grad] = inputs[spec.grad].detach().requires_grad_()  # a leaf, same strides and data
    op_name = f"{NAMESPACE}::{spec.name}"
    outcomes = [
        expect_raises(
            f"{spec.grad} requires grad: public function raises", lambda: spec.call(with_grad), RuntimeError, op_name
        ),
        expect_raises(
            f"{spec.grad} requires grad: torch.ops.{NAMESPACE}.{spec.name} raises",
            lambda: overload(*spec.args(with_grad)),
            RuntimeError,
            op_name,
        ),
    ]
    return outcomes + without_grad(spec, with_grad, want)


def differentiable(spec):
    op = OPS.get(spec.name)
    return op is not None and op.differentiable


def with_grads(spec, inputs):
    """The inputs with those of spec.wrt made leaves that require grad (same data and strides)."""
    t = dict(inputs)
    for name in spec.wrt:
        t[name] = inputs[name].detach().requires_grad_()
    return t


def grads(spec, t, result, grad_outputs):
    """Gradients of result (the call's outputs on inputs t) for spec.wrt; None where undefined.
    Outputs without a gradient (the losses' token hits) take no part."""
    pairs = [(o, g) for o, g in zip(tensors_of(result), grad_outputs) if o.requires_grad]
    return torch.autograd.grad(
        [o for o, _ in pairs], [t[name] for name in spec.wrt], [g for _, g in pairs], allow_unused=True
    )


def fresh_grad_outputs(spec, inputs):
    """A random upstream gradient for each 16- or 32-bit floating output (None for an integer one,
    e.g. expert ids, and for e4m3 values, which take none)."""
    with torch.no_grad():
        return [
            torch.randn_like(o) if o.is_floating_point() and o.dtype.itemsize > 1 else None
            for o in tensors_of(spec.call(inputs))
        ]


def grads_equal(check, got, want):
    outcomes = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None or w is None:
            outcomes.append(Outcome(f"{check} [{i}]", g is None and w is None, note="a gradient is None"))
        else:
            outcomes.append(compare(f"{check} [{i}]", g, w, EXACT))
    return outcomes


def check_grad_mode(spec):
    """An op with a backward: opcheck under grad, public function = torch.ops (gradients too),
    `_out` forward-only, no_grad/inference_mode unchanged. Without one: check_forward_only."""
    if not differentiable(spec):
        return check_forward_only(spec)
    overload = registered(spec.name)
    inputs = spec.inputs()
    outcomes = [
        opcheck(
            f"opcheck {NAMESPACE}::{spec.name}, {', '.join(spec.wrt)} require grad",
            overload,
            spec.args(with_grads(spec, inputs)),
            spec.opcheck_skip,
        )
    ]
    dys = fresh_grad_outputs(spec, inputs)
    t1, t2 = with_grads(spec, inputs), with_grads(spec, inputs)
    public = grads(spec, t1, spec.call(t1), dys)
    via_ops = grads(spec, t2, overload(*spec.args(t2)), dys)
    outcomes += grads_equal("grads: public function = torch.ops", public, via_ops)
    if spec.out_args:
        outcomes.append(
            expect_raises(
                f"{spec.name}_out under grad raises (forward-only)",
                lambda: registered(f"{spec.name}_out")(*spec.out_args(with_grads(spec, inputs))),
                RuntimeError,
                f"{NAMESPACE}::{spec.name}_out",
            )
        )
    return outcomes + without_grad(spec, with_grads(spec, inputs), spec.call(inputs))


def check_compile_training(spec):
    """Forward and backward compiled together (fullgraph): gradients equal eager's bit for bit,
    one frame after two calls on fresh inputs."""
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(COMPILE_BACKEND)
    compiled = torch.compile(lambda t: times_two(spec.call(t)), fullgraph=True, backend=counter)
    outcomes = []
    for call in (1, 2):
        inputs = spec.inputs()
        dys = fresh_grad_outputs(spec, inputs)
        t = with_grads(spec, inputs)
        check = f"{COMPILE_BACKEND} training call {call}: grads = eager"
        result, failed = compiled_call(check, compiled, t)
        if failed:
            return outcomes + [failed]
        got, failed = compiled_call(check, grads, spec, t, result, dys)
        if failed:
            return outcomes + [failed]
        t_eager = with_grads(spec, inputs)
        outcomes += grads_equal(check, got, grads(spec, t_eager, times_two(spec.call(t_eager)), dys))
    outcomes.append(Outcome(f"frames compiled: {counter.frame_count}, expected 1", counter.frame_count == 1))
    return outcomes


def compiled_call(check, fn, *args, **kwargs):
    """(fn's result, None), or (None, a failed Outcome naming the root cause): Dynamo wraps the
    error of a traced call (a refused argument, a graph break) in its own exceptions."""
    try:
        return fn(*args, **kwargs), None
    except Exception as e:
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        return None, Outcome(check, False, note=f"{type(cause).__name__}: {str(cause).splitlines()[0]}"[:200])


def times_two(result):
    """One torch op around the kernel's: doubling is exact, so a fused copy of it is too (of an
    e4m3 tensor in fp32: torch has no float8 arithmetic)."""
    double = lambda t: (t.float() if t.dtype == torch.float8_e4m3fn else t) * 2  # noqa: E731
    got = tensors_of(result)
    return tuple(double(t) for t in got) if isinstance(result, (tuple, list)) else double(got[0])


def check_compile(spec):
    if registered(spec.name) is None:
        return missing("torch.compile", spec.name)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(COMPILE_BACKEND)
    compiled = torch.compile(lambda t: times_two(spec.call(t)), fullgraph=True, backend=counter)
    outcomes = []
    for call in (1, 2):  # the second call on fresh inputs of the same shapes must reuse the graph
        inputs = spec.inputs()
        check = f"{COMPILE_BACKEND} call {call} = eager"
        got, failed = compiled_call(check, compiled, inputs)
        if failed:
            return outcomes + [failed]
        outcomes += outputs_equal(check, got, times_two(spec.call(inputs)))
    outcomes.append(Outcome(f"frames compiled: {counter.frame_count}, expected 1", counter.frame_count == 1))
    if differentiable(spec):
        outcomes += check_compile_training(spec)
    return outcomes


# ---------------------------------------------------------------------------------------------
# CUDA graphs (GPU only)


def matmul_graph_tolerance(a, w):
    """Capture runs an untuned matmul key with the first config the pruner keeps (timing candidates
    would break the capture); the eager call after it tunes and may pick another tile. Both sum
    the same fp32 products in another order, each rounded once: an ulp of the output apart, plus
    twice the fp32 summation error bound K * u32 * (|a| @ |w.T|)."""
    k = a.shape[1]
    bound = 2 * k * UNIT_ROUNDOFF[torch.float32] * (a.float().abs() @ w.float().abs().T)
    return Tol(
        bound,
        2 * UNIT_ROUNDOFF[a.dtype],
        "two tile configs: an ulp plus the fp32 sum-order bound",
        rounding_check=False,
    )


def warm_cublas(inputs):
    """A torch.mm and torch.addmm in each floating dtype of `inputs`: cuBLAS makes its handles on
    its first calls in a process, which a capture cannot hold (torch.mm alone fails the same way).
    The ops that call cuBLAS (the fused linear cross-entropy's chunk products) need them made, not
    their own first call warmed: Triton's compiles and launches are still captured cold."""
    # float8 has no cuBLAS mm (torch._scaled_mm makes the same handles through cuBLASLt's fp16 path)
    for dtype in {
        t.dtype
        for t in inputs.values()
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.element_size() > 1
    }:
        a = torch.ones(16, 16, device=DEVICE, dtype=dtype)
        torch.mm(a, a), torch.addmm(a[0], a, a)  # the cuBLAS and cuBLASLt handles
    torch.cuda.synchronize()


def check_cuda_graph(spec, tolerance=None):
    """Capture the op's first call (no warm-up), copy fresh inputs (lengths, block tables too) into
    the captured tensors, replay, compare with an eager call on those inputs."""
    if registered(spec.name) is None:
        return missing("CUDA graph", spec.name)
    static = spec.inputs()
    warm_cublas(static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = spec.call(static)
    fresh = spec.inputs()
    for key, t in static.items():
        if isinstance(t, torch.Tensor):
            t.copy_(fresh[key])
    graph.replay()
    want = spec.call(fresh)
    if tolerance is None:
        return outputs_equal("replay = eager on new inputs", captured, want)
    return [compare("replay = eager on new inputs", captured, want, tolerance(fresh))]


def check_cuda_graph_training(spec):
    """Forward and backward (the gradients of spec.wrt) captured in one CUDA graph after one eager
    warm-up on a side stream (autograd's first call sets up state, as make_graphed_callables does),
    replayed on fresh inputs copied into the captured leaves: gradients equal an eager call's."""
    static = with_grads(spec, spec.inputs())
    dys = fresh_grad_outputs(spec, static)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grads(spec, static, spec.call(static), dys)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = grads(spec, static, spec.call(static), dys)
    fresh = spec.inputs()
    with torch.no_grad():
        for key, t in static.items():
            if isinstance(t, torch.Tensor):
                t.copy_(fresh[key])
    graph.replay()
    t = with_grads(spec, fresh)
    return grads_equal("replay grads = eager on new inputs", captured, grads(spec, t, spec.call(t), dys))


# M = 8 against an nn.Linear weight: a shape no other row runs, so the autotuner has no pick yet
GRAPH_MATMUL = OpSpec(
    "matmul M=8 untuned",
    "matmul",
    lambda: linear_inputs(8, 96, 128, f16, bias=True),
    lambda t: matmul(t["a"], t["w"].T, t["bias"], "silu"),
    None,
    None,
    "w",
)


def decode_step(x, norm_weight, w_q, k_cache, v_cache, lengths):
    """One decode step's q path: RMSNorm, the q projection at M = 1, split-KV decode attention."""
    q = matmul(rmsnorm(x, norm_weight, EPS), w_q.T)
    return decode_attention(q.view(1, -1, k_cache.shape[3]), k_cache, v_cache, lengths, num_splits=4)


def decode_step_inputs(h=8, hkv=2, d=64, hidden=256, t_max=512):
    return dict(
        x=rand((1, hidden), f16),
        norm_weight=rand((hidden,), f16),
        w_q=rand((h * d, hidden), f16),
        k_cache=rand((1, t_max, hkv, d), f16),
        v_cache=rand((1, t_max, hkv, d), f16),
        lengths=lengths_of(1, t_max),
    )


def check_reduce_overhead():
    torch._dynamo.reset()
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    compiled = torch.compile(decode_step, mode="reduce-overhead", fullgraph=True)
    outcomes = []
    for call in (1, 2, 3):  # warm-up, record, replay of CUDA graph trees
        inputs = decode_step_inputs()
        # compared before the next call: a replay writes its outputs into the same memory
        outcomes += outputs_equal(f"call {call} = eager", compiled(**inputs), decode_step(**inputs))
    skipped = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] - skips
    # Inductor falls back to running without CUDA graphs (and logs why) where it cannot use them
    outcomes.append(
        Outcome(
            "ran as a CUDA graph (no cudagraph skip)",
            skipped == 0,
            note=f"{skipped} cudagraph skips: see the warning above" if skipped else "",
        )
    )
    return outcomes


# ---------------------------------------------------------------------------------------------
# TritonAdamW


class OpCalls(TorchDispatchMode):
    """Records each call of an operator of our namespace (under a dispatch mode, an Op goes
    through the dispatcher) and runs it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == NAMESPACE:
            self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


def adamw_setup(dtype=torch.float32):
    """Params of two shapes (one a transposed view of its storage) with grads, and their optimizer."""
    params = [
        torch.nn.Parameter(rand((33, 20), dtype)),
        torch.nn.Parameter(rand((40, 17), dtype).T),
        torch.nn.Parameter(rand((300,), dtype)),
    ]
    for p in params:
        p.grad = rand(p.shape, dtype)
    return params, TritonAdamW(params, lr=1e-2, weight_decay=0.1)


def adamw_clone(args):
    """A copy of an op call's arguments, tensors (and lists of them) cloned, as opcheck mutates
    them, and detached: step() calls the forward-only op under torch.no_grad(), opcheck with grad on."""

    def one(a):
        if isinstance(a, torch.Tensor):
            return a.detach().clone()
        if isinstance(a, (list, tuple)):
            return type(a)(one(x) for x in a)
        return a

    return tuple(one(a) for a in args)


def flat(tensors):
    """A list of tensors as one vector, for one comparison."""
    return torch.cat([t.detach().flatten() for t in tensors])


def check_adamw_opcheck():
    params, opt = adamw_setup()
    opt.step()  # the first step creates the state outside the recording
    with OpCalls() as recorder:
        opt.step()
    if not recorder.calls:
        return [Outcome("opcheck", False, note=f"step() called no {NAMESPACE}:: operator (not an operator yet?)")]
    return [opcheck(f"opcheck {func.name()}", func, adamw_clone(args)) for func, args in recorder.calls]


def check_adamw_grad():
    """A step on params that require grad (its normal use) updates them, under grad mode."""
    params, opt = adamw_setup()
    before = [p.detach().clone() for p in params]
    opt.step()
    changed = all(not torch.equal(p.detach(), b) for p, b in zip(params, before))
    return [
        Outcome("step() on params that require grad", changed, note="" if changed else "params unchanged"),
        Outcome("params still require grad", all(p.requires_grad for p in params)),
    ]


ADAMW_OP = "adamw_step"
ADAMW_HYPER = [1e-2, 0.9, 0.999, 1e-8, 0.1, 3.0]  # lr, beta1, beta2, eps, weight_decay, this step's count


def adamw_op_inputs():
    """A param list as one step() hands it to the op: dense fp32 params (one transposed), grads,
    and m and v in each param's layout."""
    params = [rand((33, 20), torch.float32), rand((40, 17), torch.float32).T, rand((300,), torch.float32)]
    return dict(
        params=params,
        grads=[rand(p.shape, p.dtype) for p in params],
        exp_avgs=[torch.randn_like(p) for p in params],
        exp_avg_sqs=[torch.rand_like(p) for p in params],
    )


def adamw_update(params, grads, exp_avgs, exp_avg_sqs):
    """One torch op (doubling the grads, exact) and the op, which writes params, m and v in place."""
    getattr(torch.ops, NAMESPACE).adamw_step(params, [g * 2 for g in grads], exp_avgs, exp_avg_sqs, ADAMW_HYPER)


def check_adamw_op_compile():
    """llmk::adamw_step in a compiled function: functionalized (its lists are written in place),
    one frame, and params, m and v equal to an eager call's on copies."""
    if registered(ADAMW_OP) is None:
        return missing("torch.compile", ADAMW_OP)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(COMPILE_BACKEND)
    compiled = torch.compile(adamw_update, fullgraph=True, backend=counter)
    outcomes = []
    for call in (1, 2):
        inputs = adamw_op_inputs()
        copies = {key: [t.clone() for t in ts] for key, ts in inputs.items()}
        _, failed = compiled_call(f"call {call}", compiled, **inputs)
        if failed:
            return outcomes + [failed]
        adamw_update(**copies)
        outcomes += [
            compare(f"call {call}: {key} = eager", flat(inputs[key]), flat(copies[key]), EXACT)
            for key in ("params", "exp_avgs", "exp_avg_sqs")
        ]
    outcomes.append(Outcome(f"frames compiled: {counter.frame_count}, expected 1", counter.frame_count == 1))
    return outcomes


def check_forward_arity():
    """Every differentiable op's eager autograd.Function binds exactly its schema's arguments:
    torch 2.14's apply fills in forward's defaults, and an input beyond the schema would be one
    the backward returns no gradient for (autograd raises). It guards the construction in
    common/ops.py (a forward of the schema's arguments, not the impl itself) on any torch; the
    failure itself shows only on torch 2.14 and newer, which CI's newest lane runs."""
    outcomes = []
    for name, op in sorted(OPS.items()):
        if op.function is not None:
            bound = inspect.signature(op.function.forward).bind(*range(op._n_args))
            bound.apply_defaults()
            outcomes.append(
                Outcome(f"{name}: {len(bound.args)} inputs, schema {op._n_args}", len(bound.args) == op._n_args)
            )
    return outcomes


def check_bind():
    """Every op bound by name (Op.bind, what a call with keywords runs): each argument named in
    reverse order lands in its schema place, a trailing default left out is filled in, and a name
    the schema lacks, a name given twice and a required argument left out raise TypeError naming
    it. Then one op called both ways on tensors: the same output, eager and compiled."""
    outcomes = []
    for name, op in sorted(OPS.items()):
        arguments = schema_arguments(op.overload)
        names = [a.name for a in arguments]
        values = [object() for _ in names]
        by_name = op.bind(**dict(reversed(list(zip(names, values)))))
        ok = all(a is b for a, b in zip(by_name, values)) and len(by_name) == len(names)
        required = [i for i, a in enumerate(arguments) if not a.has_default_value()]
        short = op.bind(*values[: len(required)])  # the schema puts its defaults last
        ok = (
            ok
            and len(short) == len(names)
            and all(
                short[i] is values[i] if i < len(required) else short[i] == arguments[i].default_value
                for i in range(len(names))
            )
        )
        errors = []
        for call in (
            lambda: op.bind(*values, not_an_argument=1),
            lambda: op.bind(*values, **{names[0]: 1}),
            lambda: op.bind(),
        ):
            try:
                call()
                errors.append(None)
            except TypeError as e:
                errors.append(str(e))
        ok = (
            ok
            and errors[0] is not None
            and "not_an_argument" in errors[0]
            and errors[1] is not None
            and names[0] in errors[1]
            and (errors[2] is not None or not required)
        )
        outcomes.append(Outcome(f"{name}: {len(names)} arguments by name", ok, note=" | ".join(map(str, errors))[:80]))
    from llmk.normalization.triton_rmsnorm import rmsnorm_op

    x, w = rand((5, 96), torch.float32), rand((96,), torch.float32)
    positional = rmsnorm_op(x, w, 1e-6, 0.5)
    named = rmsnorm_op(x, weight=w, offset=0.5, eps=1e-6)
    # an Op made afresh, whose first call by name is traced by torch.compile
    fresh = Op(rmsnorm_op.name, rmsnorm_op.impl, rmsnorm_op.overload, rmsnorm_op.function)
    compiled = torch.compile(lambda x, w: fresh(x, w, offset=0.5, eps=1e-6), backend=COMPILE_BACKEND, fullgraph=True)(
        x, w
    )
    outcomes.append(Outcome("rmsnorm_op by name = by position, eager", torch.equal(named, positional)))
    outcomes.append(Outcome("rmsnorm_op by name = by position, compiled", torch.equal(compiled, positional)))
    # an _out op's buffer by name, `out=`, a strided one: Dynamo reads an out= keyword that reaches the
    # dispatcher as an out= variant's and refuses a non-contiguous one
    from llmk.attention.flash_attention_ops import flash_attention_op, flash_attention_out_op

    q, k, v = (rand((1, 2, 16, 64), torch.float16) for _ in range(3))
    want = flash_attention_op(q, k, v, True, None, None)
    out = torch.full((1, 16, 2, 64), float("nan"), dtype=torch.float16, device=DEVICE).transpose(1, 2)
    torch.compile(
        lambda q, k, v, o: flash_attention_out_op(q, k, v, causal=True, sm_scale=None, config=None, out=o),
        backend=COMPILE_BACKEND,
        fullgraph=True,
    )(q, k, v, out)
    outcomes.append(Outcome("flash_attention_out_op(..., out=strided) by name, compiled", torch.equal(out, want)))
    return outcomes


def cases():
    gpu_rows = [
        Case(f"{spec.label}: CUDA graph, no warm-up", check_cuda_graph, dict(spec=spec), gpu_only=True)
        for spec in SPECS
        if spec.name != "matmul"
    ]
    gpu_rows.append(
        Case(
            f"{GRAPH_MATMUL.label}: CUDA graph, no warm-up",
            check_cuda_graph,
            dict(spec=GRAPH_MATMUL, tolerance=lambda t: matmul_graph_tolerance(t["a"], t["w"])),
            gpu_only=True,
        )
    )
    gpu_rows += [
        Case(
            f"{spec.label}: CUDA graph of forward and backward",
            check_cuda_graph_training,
            dict(spec=spec),
            gpu_only=True,
        )
        for spec in SPECS
        if spec.wrt
    ]
    rows = []
    for spec in SPECS:
        rows += [
            Case(f"{spec.label}: opcheck", check_opcheck, dict(spec=spec)),
            Case(f"{spec.label}: grad mode", check_grad_mode, dict(spec=spec)),
            Case(f"{spec.label}: torch.compile", check_compile, dict(spec=spec)),
        ]
    rows += [
        Case("TritonAdamW: opcheck", check_adamw_opcheck),
        Case("TritonAdamW: step() with params that require grad", check_adamw_grad),
        Case(f"TritonAdamW: {NAMESPACE}::{ADAMW_OP} in torch.compile", check_adamw_op_compile),
        Case("decode step: torch.compile reduce-overhead", check_reduce_overhead, gpu_only=True),
        Case("autograd.Function forward: the schema's arguments", check_forward_arity),
        Case("operators called by name", check_bind),
    ]
    return gpu_rows + rows  # the CUDA graph rows first: they capture each op's first call


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("operators", CASES)
