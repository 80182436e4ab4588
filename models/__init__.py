"""Models: the Hugging Face model patch, its e4m3 KV cache, a decoder layer of our ops, FSDP2 helpers.

`from llmk.models import patch_model` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "patch_model": "hf_patch",
        "unpatch_model": "hf_patch",
        "kernel_calls": "hf_patch",
        "FP8KVCache": "fp8_kv_cache",
    },
)
