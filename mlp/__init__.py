"""MLP activations: SwiGLU, GeGLU and bias + GELU.

`from llmk.mlp import swiglu` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "swiglu": "triton_glu",
        "geglu": "triton_glu",
        "bias_gelu": "triton_bias_gelu",
    },
)
