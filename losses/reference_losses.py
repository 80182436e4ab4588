"""PyTorch references for the losses: cross-entropy over logits, and the LM head's linear layer
followed by cross-entropy.

Conventions shared by every loss in this folder (F.cross_entropy's, with the class dimension last):
- logits (..., V), target (...) of class indices in [0, V); a target equal to ignore_index adds
  nothing to the loss and gets no gradient, and "mean" divides by the number of targets that are
  not ignored (NaN when every target is: 0 / 0, as PyTorch gives).
- label_smoothing eps: the target distribution is (1 - eps) on the target plus eps / V on every
  class, so a row's loss is (1 - eps) * (lse - x_t) + eps * (lse - mean_j x_j), lse = logsumexp(x).
- softcap c (fused linear cross-entropy, as Gemma 2's final logits): x -> c * tanh(x / c) before
  the softmax.
The math runs in fp32 (fp64 for fp64 inputs, as the tests' references do); the loss comes back in
the logits' dtype, as F.cross_entropy's does.
"""
import torch

REDUCTIONS = ("mean", "sum", "none")


def _compute_dtype(t):
    return torch.promote_types(t.dtype, torch.float32)


def cross_entropy_ref(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """logits (..., V), target (...) -> the loss (a scalar, or (...) for "none") in logits' dtype."""
    x = logits.to(_compute_dtype(logits)).reshape(-1, logits.shape[-1])
    t = target.reshape(-1).long()
    loss = torch.nn.functional.cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction,
                                             label_smoothing=label_smoothing)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return loss.to(logits.dtype)


def linear_cross_entropy_ref(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                             label_smoothing=0.0, softcap=None):
    """hidden (..., H), weight (V, H), bias (V,) or None -> cross_entropy_ref of
    hidden @ weight.T + bias (softcapped), every step in the compute dtype."""
    dtype = _compute_dtype(hidden)
    logits = hidden.to(dtype) @ weight.to(dtype).T
    if bias is not None:
        logits = logits + bias.to(dtype)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return cross_entropy_ref(logits, target, ignore_index, reduction, label_smoothing).to(hidden.dtype)


def linear_cross_entropy_same_dtype(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                                    label_smoothing=0.0, softcap=None):
    """What a user writes in PyTorch: the logits in the input dtype (one GEMM, rounded), then
    F.cross_entropy on them (the error the tests' 2x rule allows)."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1).long(),
                                             ignore_index=ignore_index, reduction=reduction,
                                             label_smoothing=label_smoothing)
    return loss.reshape(target.shape) if reduction == "none" else loss
