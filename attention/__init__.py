"""Attention: FlashAttention (dense, packed and padded), row softmax and rotary embeddings.

`from llmk.attention import flash_attention` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "flash_attention": "flash_attention_ops",
        "flash_attention_varlen": "flash_attention_ops",
        "softmax": "triton_softmax",
        "apply_rope": "triton_rope",
    },
)
