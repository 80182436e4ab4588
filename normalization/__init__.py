"""Normalization: RMSNorm, LayerNorm and residual + RMSNorm, forward and backward.

`from llmk.normalization import rmsnorm` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "rmsnorm": "triton_rmsnorm",
        "layernorm": "triton_layernorm",
        "residual_rmsnorm": "residual_rmsnorm_ops",
    },
)
