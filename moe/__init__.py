"""Mixture-of-experts: the router's top-k (moe_route), the expert-sorted order of the routed
tokens (moe_permute) and the experts' gated MLPs as grouped GEMMs, forward and backward (moe_experts).

`from llmk.moe import moe_route` imports the module that defines the name when it is first asked
for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "moe_experts": "moe_experts_ops",
        "moe_permute": "triton_moe_routing",
        "moe_route": "triton_moe_routing",
    },
)
