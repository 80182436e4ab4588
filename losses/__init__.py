"""Losses: cross-entropy and the LM head fused with it.

`from llmk.losses import cross_entropy` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "cross_entropy": "triton_cross_entropy",
        "LossOutput": "triton_cross_entropy",
        "fused_linear_cross_entropy": "fused_linear_cross_entropy_ops",
    },
)
