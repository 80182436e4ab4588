"""The tolerance of a decode output, for inference/test_inference_attention.py and
inference/test_kv_cache.py: attention/attention_cases.py's error model (p rounded to the input dtype
before p @ v, O rounded once) on decode's probabilities, one query per sequence over its cache."""

import torch

from llmk.attention.attention_cases import attention_tol, fp32_score_err
from llmk.devtools.testing import UNIT_ROUNDOFF
from llmk.inference.reference_decode_attention import decode_probs, grouped_scores


def decode_tol(q, k, v, lengths, sm_scale, window_left=-1, softcap=None, e4m3=False):
    """attention_tol for decode: q (B, H, D), k and v caches (B, T_max, Hkv, D), lengths (B,);
    window_left and softcap as the decode kernels take them. With the fp32 scores' error
    (fp32_score_err): an e4m3 cache's spread scales put scores in the hundreds. e4m3: k and v are
    an e4m3 cache's exact values, whose products round every weight to fp16 (attention_tol's
    weight_unit)."""
    p, visible = decode_probs(q.double(), k.double(), lengths, sm_scale, window_left, softcap)
    scores = (grouped_scores(q.double(), k) * sm_scale).masked_fill(~visible[:, None, None, :], float("-inf"))
    magnitudes = grouped_scores(q.double().abs(), k.abs()) * sm_scale
    v = v.double().masked_fill(~visible[:, :, None, None], 0.0).permute(0, 2, 1, 3)  # (B, Hkv, T, D)
    return attention_tol(
        q.dtype,
        p,
        v,
        q.shape,
        fp32_score_err(scores, magnitudes, q.shape[-1], softcap),
        UNIT_ROUNDOFF[torch.float16] if e4m3 else None,
    )
