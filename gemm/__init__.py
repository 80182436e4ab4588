"""GEMM: matmul with fused epilogues (tiled, persistent TMA, GEMV) and RMSNorm + linear.

`from llmk.gemm import matmul` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""
from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "matmul": "matmul_ops",
    "rmsnorm_linear": "triton_rmsnorm_linear",
})
