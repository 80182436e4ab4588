"""GEMM: matmul with fused epilogues (tiled, persistent TMA, GEMV), RMSNorm + linear, and FP8
(quantize_fp8, fp8_matmul, fp8_linear, and the producers rmsnorm_fp8, swiglu_fp8, geglu_fp8).

`from llmk.gemm import matmul` imports the module that defines the name when it is first
asked for (common/exports.py): importing the folder imports no kernel."""

from llmk.common.exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "fp8_linear": "fp8_linear_ops",
        "fp8_matmul": "fp8_ops",
        "geglu_fp8": "triton_fp8_producers",
        "matmul": "matmul_ops",
        "quantize_fp8": "fp8_ops",
        "rmsnorm_fp8": "triton_fp8_producers",
        "rmsnorm_linear": "triton_rmsnorm_linear",
        "swiglu_fp8": "triton_fp8_producers",
    },
)
