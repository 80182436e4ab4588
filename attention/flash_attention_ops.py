"""FlashAttention in Triton, forward and backward, on padded batches and on packed sequences.

    flash_attention(q, k, v, causal=False, sm_scale=None, *, window=None, softcap=None)
                                                                   q (B, H, Tq, D), k, v (B, Hkv, Tk, D)
    flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=False, sm_scale=None, *, window=None, softcap=None)
                                                                   q (total_q, H, D), k, v (total_k, Hkv, D)

Both compute softmax(q k^T * sm_scale) v without the T x T matrix (the kernels:
attention/triton_flash_attention_fwd.py and attention/triton_flash_attention_bwd.py), and both are
differentiable in q, k and v: under grad the forward also writes each query's log-sum-exp (4
bytes a query), and the backward recomputes the probabilities from it. Memory stays O(T) per head
in both passes.

Operators (common/ops.py), all in torch.ops.llmk:
- flash_attention, flash_attention_varlen -> O. What a call without grad runs (the packed one
  writes LSE too, into scratch). Their autograd formula recomputes O and LSE first (a second
  forward), for a caller that calls the operator itself under grad; the public functions take
  the _train operators then.
- flash_attention_train, flash_attention_varlen_train -> (O, LSE): the forward under grad; the
  backward reads the saved LSE. LSE is differentiable too (its gradient enters the backward's
  delta), for callers of the operator that use it.
- flash_attention_backward -> (dq, dk, dv), for both layouts: what the formulas call, so a
  torch.compile'd training step holds both passes (traced through the fake implementations).
- flash_attention_out: the forward into a caller's buffer; forward-only.

The backward's schedule: by default the one BACKWARD_TABLE picks for the head dim, which may add
dq's parts with fp32 atomics (its last bits then vary between runs, as flash_attn_func's do);
`deterministic=True` takes the two-pass schedule, bit-identical on every run.

Conventions are those of attention/reference_attention.py: GQA by `h // (H // Hkv)`, causal aligned to
the bottom right when Tq != Tk (per sequence in a packed batch), zeros for a query that sees no
key; such a query's LSE is -inf and its gradients are zero. Sliding windows (window=(left, right),
flash-attn's convention) align the same way, and softcap=c caps the scaled scores at c * tanh(s / c)
(Gemma 2) before the softmax; the operators take them as `int window_left, int window_right,
float softcap`, their last arguments, -1, -1 and 0.0 (off) by default, so that every call written
before them means what it did.
"""

import math

import torch

from llmk.attention.attention_checks import (
    AttentionMask,
    attention_mask,
    check_cu_seqlens,
    check_cu_seqlens_values,
    seqlens_checked,
)
from llmk.attention.attention_paths import gluon_forward
from llmk.attention.triton_flash_attention_bwd import launch_flash_attention_backward
from llmk.attention.triton_flash_attention_fwd import CONFIG_TABLE, MAX_HEAD_DIM, launch_flash_attention, table_config
from llmk.common.ops import define_op, define_ops, needs_grad
from llmk.common.validation import check_same_device, check_tensor

__all__ = ["flash_attention", "flash_attention_varlen", "CONFIG_TABLE", "MAX_HEAD_DIM", "table_config"]


def _check_qkv(q, k, v, n_dims, layout):
    """q, k, v: tensors on the kernel device, fp16 or bf16, one dtype and device, `n_dims`-D."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, (torch.float16, torch.bfloat16), min_dim=n_dims)
        if t.dim() != n_dims:
            raise ValueError(f"{name} must be {n_dims}-D ({layout}), got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        check_same_device(name, t, "q", q)
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")


def _check_heads(q, k, v, h, hkv, d, sm_scale):
    """v shaped like k, a head dim the kernels take, H a multiple of Hkv, a valid sm_scale."""
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if d > MAX_HEAD_DIM or d < 1:
        raise ValueError(f"head_dim (last dim of q) must be 1..{MAX_HEAD_DIM}, got {d}")
    if hkv < 1 or h % hkv:
        raise ValueError(f"q's head count {h} must be a multiple of k's head count {hkv} (MHA, GQA or MQA)")
    if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and sm_scale > 0 and math.isfinite(sm_scale)):
        raise ValueError(f"sm_scale must be a positive finite number or None, got {sm_scale!r}")


def check_attention_args(q, k, v, sm_scale):
    """Validate before launch; returns (B, H, Hkv, Tq, Tk, D)."""
    _check_qkv(q, k, v, 4, "batch, heads, tokens, head_dim")
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k must be (B={b}, Hkv, Tk, D={d}) to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    _check_heads(q, k, v, h, hkv, d, sm_scale)
    for name, t in (("q", q), ("k", k), ("v", v)):
        # batch, head and sequence-start offsets are 64-bit in the kernels; offsets inside one head are
        # 32-bit (the backward's preprocess, which sees a packed batch as one sequence, uses 64)
        span = sum((s - 1) * abs(st) for s, st in zip(t.shape[2:], t.stride()[2:]))
        if span >= 2**31:
            raise ValueError(
                f"{name}: one head spans {span} elements; the kernel indexes within a head "
                "with 32-bit offsets (at most 2^31 - 1)"
            )
    return b, h, hkv, tq, tk, d


def check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale):
    """Validate a packed batch before launch (shapes and types only: the lengths live on the
    device; their values are checked in the operators, check_varlen_values); returns (number of
    sequences, H, Hkv, D)."""
    _check_qkv(q, k, v, 3, "total tokens, heads, head_dim")
    _, h, d = q.shape
    hkv = k.shape[1]
    if k.shape[2] != d:
        raise ValueError(f"k must be (total_k, Hkv, D={d}) to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    _check_heads(q, k, v, h, hkv, d, sm_scale)
    check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q)
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise TypeError(f"{name} must be an int >= 0, got {n!r}")
    for name, t, n in (("q", q, max_seqlen_q), ("k", k, max_seqlen_k), ("v", v, max_seqlen_k)):
        span = max(n - 1, 0) * abs(t.stride(0)) + (d - 1) * abs(t.stride(2))
        if span >= 2**31:  # offsets inside one sequence and head are 32-bit
            raise ValueError(
                f"{name}: one sequence spans {span} elements; the kernel indexes within a "
                "sequence with 32-bit offsets (at most 2^31 - 1)"
            )
    return cu_seqlens_q.shape[0] - 1, h, hkv, d


def check_varlen_values(q, k, cu_q, cu_k, max_q, max_k):
    """The operators' check of cu_seqlens' values before a launch reads through them: on the CPU
    always, on a GPU under LLMK_CHECK_SEQLENS=1 (attention/attention_checks.py's seqlens_checked): a length
    past the packed tensors would read and write out of bounds. The operators run it, not the
    public function, so direct and compiled calls are checked too."""
    if seqlens_checked(cu_q):
        check_cu_seqlens(cu_q, cu_k, q)
        check_cu_seqlens_values(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)


def check_config(config):
    """A forced launch config must be (BLOCK_M, BLOCK_N, num_warps, num_stages), positive ints, the
    blocks powers of two of at least 16 (tl.dot's smallest tile)."""
    if not (isinstance(config, tuple) and len(config) == 4 and all(isinstance(c, int) and c > 0 for c in config)):
        raise ValueError(
            f"config must be a (BLOCK_M, BLOCK_N, num_warps, num_stages) tuple of positive ints, got {config!r}"
        )
    for name, block in zip(("BLOCK_M", "BLOCK_N"), config[:2]):
        if block < 16 or block & (block - 1):
            raise ValueError(f"config's {name} must be a power of two >= 16, got {block}")


def _mask(window_left, window_right, softcap):
    """The operators' last three arguments as the launchers take them: an AttentionMask, checked
    (attention_mask) for a caller that reaches an operator without its public function."""
    if window_left == -1 and window_right == -1 and softcap == 0.0:
        return AttentionMask()  # off, as every call without a window or a cap passes it: nothing to check
    return attention_mask((window_left, window_right), softcap, "(window_left, window_right)")


def _mask_options(mask):
    """The operators' mask arguments by name, from an AttentionMask or an operator's bound inputs
    (both have the three fields)."""
    return dict(window_left=mask.window_left, window_right=mask.window_right, softcap=mask.softcap)


def _scale(q, sm_scale):
    """sm_scale as the kernels take it; checked here too, for direct calls of the operators (the
    unmasked key loop relies on a positive scale: the row max commutes with it)."""
    if sm_scale is not None and not (sm_scale > 0 and math.isfinite(sm_scale)):
        raise ValueError(f"sm_scale must be a positive finite number or None, got {sm_scale!r}")
    return 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale


def _within_32_bits(t, n_dims):
    """Whether the offsets inside one (batch, head) of t, the last n_dims dims, fit in 32 bits."""
    return sum((s - 1) * abs(st) for s, st in zip(t.shape[-n_dims:], t.stride()[-n_dims:])) < 2**31


def packed(t):
    """(total, H, D) -> the (1, H, total, D) view the kernels read (no copy); (H, total) LSE ->
    (1, H, total)."""
    return t.unsqueeze(0).transpose(1, 2) if t.dim() == 3 else t.unsqueeze(0)


# ---------------------------------------------------------------------------------------------
# forward


def _attend_into(
    q, k, v, causal, sm_scale, config, out, lse=None, cu_seqlens=None, window_left=-1, window_right=-1, softcap=0.0
):
    """O into out (and LSE into lse) for checked (B, H, T, D) arguments: the empty cases here, the
    kernel for the rest, Gluon's where attention/attention_paths.py's gluon_forward says so."""
    mask = _mask(window_left, window_right, softcap)
    if out.numel() == 0:
        return
    if k.shape[2] == 0:  # no keys: every query sees nothing
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return
    if gluon_forward(q, k, v, causal, out, lse, cu_seqlens, config):
        from llmk.attention.gluon_flash_attention_fwd import launch_gluon_attention

        launch_gluon_attention(q, k, v, out, causal, _scale(q, sm_scale), lse, mask, cu_seqlens=cu_seqlens)
        return
    launch_flash_attention(
        q, k, v, out, causal, _scale(q, sm_scale), lse, cu_seqlens, None if config is None else tuple(config), mask=mask
    )


def _empty_lse(q):
    return q.new_empty(q.shape[:3], dtype=torch.float32)


def _train_out(q):
    """O under grad, (B, H, Tq, D) stored as (B, Tq, H, D), as SDPA returns it: the projection
    after attention then reads O.transpose(1, 2) as a (B * Tq, H * D) matrix in place, and the O
    kept for the backward is the only copy (laid out like a (B, H, Tq, D) q, the reshape before
    that projection would copy it, a second tensor of O's size a layer until the backward).
    Made with those strides, not as a transposed view: a view returned by an autograd function
    could not be modified in place. Laid out like q where a head's offsets in that layout would
    pass 32 bits (the kernels index within a head in 32 bits)."""
    b, h, t, d = q.shape
    if (t - 1) * h * d + d >= 2**31:
        return torch.empty_like(q)
    return q.new_empty_strided((b, h, t, d), (t * h * d, d, h * d, 1))


def _attention_train(
    q, k, v, causal, sm_scale, config, deterministic=False, window_left=-1, window_right=-1, softcap=0.0
):
    """(O, LSE): the forward under grad; `deterministic` is for its backward."""
    out, lse = _train_out(q), _empty_lse(q)
    _attend_into(q, k, v, causal, sm_scale, config, out, lse, None, window_left, window_right, softcap)
    return out, lse


def _varlen_empty(q, k, v, *rest):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _varlen_train(
    q,
    k,
    v,
    cu_q,
    cu_k,
    max_q,
    max_k,
    causal,
    sm_scale,
    config,
    deterministic=False,
    window_left=-1,
    window_right=-1,
    softcap=0.0,
):
    check_varlen_values(q, k, cu_q, cu_k, max_q, max_k)
    out, lse = _varlen_empty(q, k, v)
    _attend_into(
        packed(q),
        packed(k),
        packed(v),
        causal,
        sm_scale,
        config,
        packed(out),
        packed(lse),
        (cu_q, cu_k, max_q),
        window_left,
        window_right,
        softcap,
    )
    return out, lse


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, sm_scale, config, window_left=-1, window_right=-1, softcap=0.0):
    """llmk::flash_attention_varlen: O of _varlen_train (which takes `deterministic` before the mask)."""
    return _varlen_train(
        q, k, v, cu_q, cu_k, max_q, max_k, causal, sm_scale, config, False, window_left, window_right, softcap
    )[0]


# ---------------------------------------------------------------------------------------------
# backward


def _backward(
    grad_out,
    q,
    k,
    v,
    out,
    lse,
    grad_lse,
    cu_q,
    cu_k,
    max_q,
    max_k,
    causal,
    sm_scale,
    deterministic,
    window_left=-1,
    window_right=-1,
    softcap=0.0,
):
    """(dq, dk, dv) shaped like q, k, v: the kernels on (B, H, T, D) views, zeros where a side is
    empty (no keys: dq = 0; no queries: dk = dv = 0)."""
    mask = _mask(window_left, window_right, softcap)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    lse = lse.contiguous()  # the kernels index delta, made contiguous, with LSE's strides
    if not _within_32_bits(grad_out, 2 if cu_q is None else 3):  # dO's strides are the caller's
        grad_out = grad_out.contiguous()
    if cu_q is not None:
        check_varlen_values(q, k, cu_q, cu_k, max_q, max_k)
        views = [packed(t) for t in (grad_out, q, k, v, out, lse, dq, dk, dv)]
        grad_lse = None if grad_lse is None else packed(grad_lse)
        cu_seqlens = (cu_q, cu_k, max_q, max_k)
    else:
        views, cu_seqlens = [grad_out, q, k, v, out, lse, dq, dk, dv], None
    if q.numel() == 0 or k.numel() == 0:
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv
    launch_flash_attention_backward(
        *views, causal, _scale(q, sm_scale), grad_lse, cu_seqlens, deterministic=deterministic, mask=mask
    )
    return dq, dk, dv


flash_attention_backward_op = define_op(
    "flash_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    "Tensor? grad_lse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
    "bool causal, float? sm_scale, bool deterministic, int window_left=-1, int window_right=-1, "
    "float softcap=0.0) -> (Tensor, Tensor, Tensor)",
    _backward,
    lambda grad_out, q, k, v, *rest: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)),
)


def _grads(ctx, grad_out, grad_lse, q, k, v, out, lse, cu=(None, None, 0, 0)):
    """The (dq, dk, dv) an autograd formula returns: None for an input that needs none."""
    if grad_out is None:  # only LSE was used
        grad_out = torch.zeros_like(out)
    cu_q, cu_k, max_q, max_k = cu
    grads = flash_attention_backward_op(
        grad_out,
        q,
        k,
        v,
        out,
        lse,
        grad_lse,
        cu_q,
        cu_k,
        max_seqlen_q=max_q,
        max_seqlen_k=max_k,
        causal=ctx.causal,
        sm_scale=ctx.sm_scale,
        deterministic=ctx.deterministic,
        **ctx.mask,
    )
    return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:3]))


def _setup(ctx, inputs, output):
    """The setup of all four differentiable operators (inputs bound by name, common/ops.py): what
    the formulas read. q, k, v (and O, LSE for the _train ops, whose output is a pair), a packed
    batch's cu_seqlens_q, cu_seqlens_k (saved) and max_seqlen_q, max_seqlen_k, and the options;
    `deterministic` is the _train ops' (the others' formulas run the default schedule)."""
    saved = (inputs.q, inputs.k, inputs.v, *output) if isinstance(output, tuple) else (inputs.q, inputs.k, inputs.v)
    ctx.causal, ctx.sm_scale = inputs.causal, inputs.sm_scale
    ctx.deterministic = getattr(inputs, "deterministic", False)
    ctx.mask = _mask_options(inputs)
    ctx.varlen = hasattr(inputs, "cu_seqlens_q")
    if ctx.varlen:
        ctx.max_seqlens = (inputs.max_seqlen_q, inputs.max_seqlen_k)
        saved += (inputs.cu_seqlens_q, inputs.cu_seqlens_k)
    ctx.save_for_backward(*saved)
    ctx.set_materialize_grads(False)


def _saved(ctx):
    """((q, k, v) or (q, k, v, O, LSE), the backward op's (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k))."""
    saved = ctx.saved_tensors
    if ctx.varlen:
        return saved[:-2], (*saved[-2:], *ctx.max_seqlens)
    return saved, (None, None, 0, 0)


def _recompute_backward(ctx, grad_out):
    """The formula of flash_attention / flash_attention_varlen (no LSE saved): forward again, then
    the backward."""
    (q, k, v), cu = _saved(ctx)
    if grad_out is None:
        return (None,) * len(ctx.needs_input_grad)
    options = dict(causal=ctx.causal, sm_scale=ctx.sm_scale, config=None, deterministic=ctx.deterministic, **ctx.mask)
    if cu[0] is not None:
        cu_q, cu_k, max_q, max_k = cu
        out, lse = flash_attention_varlen_train_op(
            q, k, v, cu_q, cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, **options
        )
    else:
        out, lse = flash_attention_train_op(q, k, v, **options)
    return (*_grads(ctx, grad_out, None, q, k, v, out, lse, cu), *[None] * (len(ctx.needs_input_grad) - 3))


def _train_backward(ctx, grad_out, grad_lse):
    (q, k, v, out, lse), cu = _saved(ctx)
    if grad_out is None and grad_lse is None:
        return (None,) * len(ctx.needs_input_grad)
    return (*_grads(ctx, grad_out, grad_lse, q, k, v, out, lse, cu), *[None] * (len(ctx.needs_input_grad) - 3))


DENSE_ARGS = "Tensor q, Tensor k, Tensor v, bool causal, float? sm_scale, int[]? config"
VARLEN_ARGS = (
    "Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, bool causal, float? sm_scale, int[]? config"
)
# The _train ops' backward also takes `deterministic` (the two-pass schedule, see
# attention/triton_flash_attention_bwd.py); the others' formulas run the default schedule.
TRAIN_OPTION = "bool deterministic=False"
# Sliding window and logit softcap, defaulted to off (-1 an unbounded side, 0.0 no softcap): the same
# three last in every operator of the family, after an _out twin's buffer (define_ops' options).
MASK_OPTIONS = "int window_left=-1, int window_right=-1, float softcap=0.0"


def _dense_empty(q, *rest):
    return torch.empty_like(q)  # laid out like a dense q


def _attend_out(q, k, v, causal, sm_scale, config, out, window_left=-1, window_right=-1, softcap=0.0):
    """llmk::flash_attention_out: its buffer `out` between the arguments and the mask options, as
    define_ops lays out an _out twin's schema."""
    _attend_into(q, k, v, causal, sm_scale, config, out, None, None, window_left, window_right, softcap)


flash_attention_op, flash_attention_out_op = define_ops(
    "flash_attention",
    DENSE_ARGS,
    _dense_empty,
    _attend_out,
    backward=_recompute_backward,
    setup_context=_setup,
    options=MASK_OPTIONS,
)
flash_attention_train_op = define_op(
    f"flash_attention_train({DENSE_ARGS}, {TRAIN_OPTION}, {MASK_OPTIONS}) -> (Tensor, Tensor)",
    _attention_train,
    lambda q, k, v, *rest: (_train_out(q), _empty_lse(q)),
    backward=_train_backward,
    setup_context=_setup,
)
flash_attention_varlen_op = define_op(
    f"flash_attention_varlen({VARLEN_ARGS}, {MASK_OPTIONS}) -> Tensor",
    _varlen,
    lambda *a: _varlen_empty(*a)[0],
    backward=_recompute_backward,
    setup_context=_setup,
)
flash_attention_varlen_train_op = define_op(
    f"flash_attention_varlen_train({VARLEN_ARGS}, {TRAIN_OPTION}, {MASK_OPTIONS}) -> (Tensor, Tensor)",
    _varlen_train,
    _varlen_empty,
    backward=_train_backward,
    setup_context=_setup,
)


def _options(causal, sm_scale, config, deterministic):
    """The public functions' options checked and in the operators' types: (causal, sm_scale as a
    float or None, config as a list or None)."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if config is not None:
        check_config(config)
        config = list(config)
    return causal, None if sm_scale is None else float(sm_scale), config


# ---------------------------------------------------------------------------------------------
# public functions


def flash_attention(
    q, k, v, causal=False, sm_scale=None, out=None, *, config=None, deterministic=False, window=None, softcap=None
):
    """Attention, fused (operators llmk::flash_attention, llmk::flash_attention_train and
    llmk::flash_attention_out; the module docstring has the backward).

    q: (B, H, Tq, D); k, v: (B, Hkv, Tk, D); fp16 or bf16, one dtype; H a multiple of Hkv; D up to
    256 (not a power of two: padded to one in registers and masked). Any strides: a (B, T, H, D)
    tensor passed as `.transpose(1, 2)` is read in place. causal (a bool) aligns the mask to the
    bottom right. sm_scale defaults to 1/sqrt(D).
    window: None (no window), or (left, right), ints >= -1, -1 an unbounded side (flash-attn's
    window_size): query i sees keys j with i' - left <= j <= i' + right, i' = i + Tk - Tq (aligned
    to the bottom right like the causal mask); with causal, right is 0 at most. Key blocks outside
    every query's window are skipped: FLOPs are 4 * D * (visible (query, key) pairs) per (batch,
    head), as for causal, where full attention's are 4 * B * H * Tq * Tk * D. A query that sees no
    key gets zeros.
    softcap: None or 0 (off), or c > 0: the scores s = q k^T * sm_scale become c * tanh(s / c)
    before the softmax (Gemma 2's attention logit softcapping), in the backward too.
    out: optional (B, H, Tq, D) buffer of q's dtype, any strides; forward-only (under grad with an
    input that requires grad, llmk::flash_attention_out raises).
    config: optional forward (BLOCK_M, BLOCK_N, num_warps, num_stages) to launch instead of the
    table's choice (tests and tuning sweeps); it travels to the operator as its `int[]? config`.
    deterministic: the backward's two-pass schedule, bit-identical gradients on every run; the
    default (False, as flash_attn_func's) may add dq's parts with atomics in a run-dependent order,
    where that is faster (attention/triton_flash_attention_bwd.py's BACKWARD_TABLE).
    Returns O (B, H, Tq, D) in q's dtype (out itself when given), laid out like q when q is dense
    (so a transposed (B, T, H, D) q gives an O that is a (B, T, H, D) tensor viewed the same way);
    under grad (an input that requires grad) stored as (B, Tq, H, D) whatever q's layout, as SDPA
    returns it, so that O.transpose(1, 2).reshape(B, Tq, H * D) is a view, not a second copy.
    Differentiable in q, k and v; the gradients come back shaped like them.
    """
    check_attention_args(q, k, v, sm_scale)
    causal, sm_scale, config = _options(causal, sm_scale, config, deterministic)
    options = dict(causal=causal, sm_scale=sm_scale, config=config, **_mask_options(attention_mask(window, softcap)))
    if out is None:
        if needs_grad(q, k, v):
            return flash_attention_train_op(q, k, v, deterministic=deterministic, **options)[0]
        return flash_attention_op(q, k, v, **options)
    if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(
            f"out must be a tensor of q's shape {tuple(q.shape)}, dtype {q.dtype} and device "
            f"{q.device}; got "
            f"{out if not isinstance(out, torch.Tensor) else (tuple(out.shape), out.dtype, out.device)}"
        )
    if not _within_32_bits(out, 2):
        raise ValueError(
            "out: one head spans 2^31 elements or more; the kernel indexes within a head with 32-bit offsets"
        )
    flash_attention_out_op(q, k, v, out=out, **options)
    return out


def flash_attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal=False,
    sm_scale=None,
    *,
    config=None,
    deterministic=False,
    window=None,
    softcap=None,
):
    """Attention over a packed batch of sequences of different lengths, no padding (operators
    llmk::flash_attention_varlen and llmk::flash_attention_varlen_train), as flash-attn's
    `flash_attn_varlen_func` takes it.

    q: (total_q, H, D); k, v: (total_k, Hkv, D); fp16 or bf16, any strides (a slice of a packed qkv
    tensor is read in place); heads and head dims as for flash_attention.
    cu_seqlens_q, cu_seqlens_k: int32 (B + 1,) on q's device, cumulative lengths from 0: sequence b
    is q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]] against k, v[cu_seqlens_k[b]:cu_seqlens_k[b + 1]].
    Lengths may be 0. They must start at 0, be non-decreasing and end at total_q / total_k.
    max_seqlen_q, max_seqlen_k: ints at least the longest sequence's lengths; they size the grids.
    Checks of the values (ValueError naming the argument, the position and the value): always on
    the CPU (the interpreter); on a GPU the kernels read the lengths on the device, and nothing
    waits for them, unless the environment sets LLMK_CHECK_SEQLENS=1, a debug switch that reads
    them on the host before every launch (a device sync; skipped while a CUDA graph is captured).
    Unchecked, a bad length reads and writes out of bounds, and a max_seqlen too small leaves
    results undefined.
    causal: per sequence, aligned to its bottom right. sm_scale defaults to 1/sqrt(D).
    window, softcap: as for flash_attention, the window per sequence (i' = i + Tk_b - Tq_b): FLOPs
    4 * D * (visible pairs) summed over the sequences and heads.
    config, deterministic: as for flash_attention.
    Returns O (total_q, H, D) in q's dtype, contiguous. Differentiable in q, k and v.
    """
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale)
    causal, sm_scale, config = _options(causal, sm_scale, config, deterministic)
    args = (q, k, v, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous())
    options = dict(
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        causal=causal,
        sm_scale=sm_scale,
        config=config,
        **_mask_options(attention_mask(window, softcap)),
    )
    if needs_grad(q, k, v):
        return flash_attention_varlen_train_op(*args, deterministic=deterministic, **options)[0]
    return flash_attention_varlen_op(*args, **options)
