"""Optimizers: AdamW with fused Triton steps.

`from llmk.optimizers import TritonAdamW` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "TritonAdamW": "triton_adam",
    },
)
