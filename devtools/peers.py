"""Peer libraries as benchmark providers, where they are installed.

Liger-Kernel is not a dependency: on a GPU machine without network it travels as a wheel
(`pip download liger-kernel==0.8.5 --no-deps`, installed with `pip install --no-deps --target`),
and where it is missing its rows are reported as skipped, with the reason.
"""

import importlib

LIGER = "liger"  # the provider name of Liger-Kernel's rows


def liger(module, attr):
    """Liger-Kernel's `liger_kernel.ops.<module>.<attr>` (an autograd.Function's apply, a function),
    or, where it cannot be imported, a one-line reason: the harness skips a provider given as a string."""
    try:
        mod = importlib.import_module(f"liger_kernel.ops.{module}")
    except Exception as e:  # not installed, or it needs what this machine lacks (a GPU, a Triton build)
        return f"liger-kernel unavailable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:90]
    return getattr(mod, attr)


def liger_rmsnorm():
    """Liger's RMSNorm as the norm benchmarks call it: offset 0, Llama's casting, in_place=False
    (in place it would overwrite a shared upstream gradient), row_mode chosen by Liger; or why
    it is unavailable. The others below likewise."""
    fn = liger("rms_norm", "LigerRMSNormFunction")
    return fn if isinstance(fn, str) else lambda x, w: fn.apply(x, w, 1e-6, 0.0, "llama", False, None)


def liger_layernorm():
    fn = liger("layer_norm", "LigerLayerNormFunction")
    return fn if isinstance(fn, str) else lambda x, w, b: fn.apply(x, w, b, 1e-5)


def liger_residual_rmsnorm():
    fn = liger("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    return fn if isinstance(fn, str) else lambda x, r, w: fn.apply(x, r, w, 1e-6, 0.0, "llama", False)


def liger_rope():
    fn = liger("rope", "LigerRopeFunction")
    return fn if isinstance(fn, str) else (lambda q, k, cos, sin: fn.apply(q, k, cos, sin))


def _liger_gated(module, name):
    """Liger's gated unit act(gate) * up; it writes dgate and dup over gate and up."""
    fn = liger(module, name)
    return fn if isinstance(fn, str) else lambda gate, up: fn.apply(gate, up)


def liger_swiglu():
    return _liger_gated("swiglu", "LigerSiLUMulFunction")


def liger_geglu():
    """gelu(gate, approximate="tanh") * up."""
    return _liger_gated("geglu", "LigerGELUMulFunction")


def liger_ce():
    """The mean loss over logits (BT, V); Liger writes dlogits over them."""
    fn = liger("cross_entropy", "LigerCrossEntropyFunction")
    return fn if isinstance(fn, str) else lambda logits, target: fn.apply(logits, target, None)[0]


def liger_lce():
    fn = liger("fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyFunction")
    return fn if isinstance(fn, str) else lambda hidden, weight, target: fn.apply(hidden, weight, target)[0]


def liger_moe():
    """Liger's fused MoE experts: (x (T, H), w_gate_up (E, 2I, H), w_down (E, H, I), ids (T, top_k)
    int32, weights (T, top_k)) -> (T, H), SwiGLU; or why it is unavailable."""
    fn = liger("fused_moe", "LigerFusedMoEFunction")
    return fn if isinstance(fn, str) else fn.apply
