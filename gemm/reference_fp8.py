"""quantize_fp8's formula in PyTorch ops (gemm/triton_fp8_quant.py): the truth its tests compare
with bit for bit, and the eager and compiled baselines of gemm_bench's quantize_fp8 rows.

A group's amax (NaN if it holds one, as torch's amax gives it), floored at AMAX_FLOOR; 448 / amax
and amax / 448 as divisions of two tensors (IEEE: on CUDA torch runs a division by a Python float
as a multiply by its reciprocal, an ulp off for some amax); x * (448 / amax) clamped and rounded to
e4m3, to nearest even.
"""

import torch

from llmk.gemm.fp8_ops import FP8
from llmk.gemm.triton_fp8_quant import AMAX_FLOOR, FP8_MAX, GROUP, scale_shape


def reference_quantize(x, granularity):
    """PyTorch's (q, scale), the kernel's formula: a group's amax, floored; 448 / amax and
    amax / 448 as IEEE divisions; x * (448 / amax) clamped and rounded to e4m3."""
    m, k = x.shape
    xf = x.float()
    if granularity == "row":
        groups = xf.reshape(m, 1, k)
    elif granularity == "1x128":
        groups = xf.reshape(m, k // GROUP, GROUP)
    else:  # 128 x 128 blocks; the last one's missing rows are zeros, which no amax sees
        pad = -m % GROUP
        full = torch.cat([xf, xf.new_zeros(pad, k)])
        groups = full.reshape(-1, GROUP, k // GROUP, GROUP).permute(0, 2, 1, 3).reshape(-1, k // GROUP, GROUP * GROUP)
    amax = groups.abs().amax(-1).clamp_min(AMAX_FLOOR)
    fp8_max = torch.full_like(amax, FP8_MAX)
    factor = fp8_max / amax
    scale = amax / fp8_max
    q = (groups * factor[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    if granularity == "128x128":
        q = q.reshape(-1, k // GROUP, GROUP, GROUP).permute(0, 2, 1, 3).reshape(-1, k)[:m]
        return q, scale
    return q.reshape(m, k), scale.reshape(scale_shape(m, k, granularity))
