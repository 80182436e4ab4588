"""Inference: decode attention over contiguous and paged KV caches, and the caches.

`from llmk.inference import decode_attention` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "decode_attention": "triton_inference_attention",
        "paged_decode_attention": "triton_inference_attention",
        "KVCache": "kv_cache",
        "PagedKVCache": "paged_kv_cache",
    },
)
