"""PyTorch references for the losses: cross-entropy over logits, and the LM head's linear layer
followed by cross-entropy.

Conventions shared by every loss in this folder (F.cross_entropy's, with the class dimension last):
- logits (..., V), target (...) of class indices in [0, V); a target equal to ignore_index adds
  nothing to the loss and gets no gradient, and "mean" divides by the number of targets that are
  not ignored (NaN when every target is: 0 / 0, as PyTorch gives).
- label_smoothing eps: the target distribution is (1 - eps) on the target plus eps / V on every
  class, so a row's loss is (1 - eps) * (lse - x_t) + eps * (lse - mean_j x_j), lse = logsumexp(x).
- softcap c (as Gemma 2's final logits): x -> c * tanh(x / c) before the softmax.
- class weights w (V,), F.cross_entropy's: a row's loss is w_t (lse - x_t); with smoothing
  (1 - eps) w_t (lse - x_t) + eps / V * sum_j w_j (lse - x_j); "mean" divides by the sum of the
  targets' weights (Liger-Kernel's formulas are the same).
- z-loss s (PaLM's, Liger-Kernel's semantics): s * lse^2 added to each row not ignored; its "mean"
  divides by the count of targets not ignored, unweighted even with class weights.
- token accuracy: the share of targets not ignored that are their row's first largest logit.
The math runs in fp32 (fp64 for fp64 inputs, as the tests' references do); the loss comes back in
the logits' dtype, as F.cross_entropy's does.
"""

import torch

REDUCTIONS = ("mean", "sum", "none")


def _compute_dtype(t):
    return torch.promote_types(t.dtype, torch.float32)


def _capped(x, softcap):
    return x if softcap is None else softcap * torch.tanh(x / softcap)


def _kept_mean(rows, kept, reduction):
    """rows (N,) reduced: "none" as they are, "sum", or "mean" over the kept rows."""
    if reduction == "none":
        return rows
    return rows.sum() / kept.sum() if reduction == "mean" else rows.sum()


def z_loss_ref(logits, target, ignore_index=-100, reduction="mean", lse_square_scale=0.0, softcap=None):
    """The z-loss lse_square_scale * lse^2 of the rows not ignored (0 for the others), reduced:
    "mean" over the count of targets not ignored, whatever the class weights (Liger-Kernel's);
    in the compute dtype."""
    x = _capped(logits.to(_compute_dtype(logits)).reshape(-1, logits.shape[-1]), softcap)
    kept = target.reshape(-1) != ignore_index
    rows = lse_square_scale * torch.where(kept, torch.logsumexp(x, -1).square(), 0.0)
    z = _kept_mean(rows, kept, reduction)
    return z.reshape(target.shape) if reduction == "none" else z


def token_accuracy_ref(logits, target, ignore_index=-100, reduction="mean", softcap=None):
    """Whether each row's first largest (capped) logit is its target, fp32: 1.0 or 0.0 a row (0
    for an ignored one) for "none", else the share of the targets not ignored."""
    x = _capped(logits.to(_compute_dtype(logits)).reshape(-1, logits.shape[-1]), softcap)
    t = target.reshape(-1).long()
    kept = t != ignore_index
    hits = (kept & (x.argmax(-1) == t)).float()
    if reduction == "none":
        return hits.reshape(target.shape)
    return hits.sum() / kept.sum()


def cross_entropy_ref(
    logits,
    target,
    ignore_index=-100,
    reduction="mean",
    label_smoothing=0.0,
    weight=None,
    lse_square_scale=0.0,
    softcap=None,
):
    """logits (..., V), target (...) -> the loss (a scalar, or (...) for "none") in logits' dtype:
    F.cross_entropy (with class weights (V,) as given) of the softcapped logits, plus z_loss_ref."""
    x = _capped(logits.to(_compute_dtype(logits)).reshape(-1, logits.shape[-1]), softcap)
    t = target.reshape(-1).long()
    w = None if weight is None else weight.to(x.dtype)
    loss = torch.nn.functional.cross_entropy(
        x, t, weight=w, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )
    if lse_square_scale:
        loss = loss + z_loss_ref(x, t, ignore_index, reduction, lse_square_scale)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return loss.to(logits.dtype)


def linear_cross_entropy_ref(
    hidden,
    weight,
    target,
    bias=None,
    ignore_index=-100,
    reduction="mean",
    label_smoothing=0.0,
    softcap=None,
    class_weight=None,
    lse_square_scale=0.0,
):
    """hidden (..., H), weight (V, H), bias (V,) or None -> cross_entropy_ref of
    hidden @ weight.T + bias (softcapped), every step in the compute dtype."""
    dtype = _compute_dtype(hidden)
    logits = hidden.to(dtype) @ weight.to(dtype).T
    if bias is not None:
        logits = logits + bias.to(dtype)
    return cross_entropy_ref(
        logits, target, ignore_index, reduction, label_smoothing, class_weight, lse_square_scale, softcap
    ).to(hidden.dtype)


def linear_cross_entropy_same_dtype(
    hidden,
    weight,
    target,
    bias=None,
    ignore_index=-100,
    reduction="mean",
    label_smoothing=0.0,
    softcap=None,
    class_weight=None,
    lse_square_scale=0.0,
):
    """What a user writes in PyTorch: the logits in the input dtype (one GEMM, rounded), then
    F.cross_entropy on them and the z-loss of their logsumexp (the error the tests' 2x rule allows)."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    logits = _capped(logits, softcap).reshape(-1, weight.shape[0])
    t = target.reshape(-1).long()
    loss = torch.nn.functional.cross_entropy(
        logits,
        t,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
        weight=None if class_weight is None else class_weight.to(logits.dtype),
    )
    if lse_square_scale:
        kept = t != ignore_index
        rows = lse_square_scale * torch.where(kept, torch.logsumexp(logits, -1).square(), 0.0)
        loss = loss + _kept_mean(rows, kept, reduction).to(loss.dtype)
    return loss.reshape(target.shape) if reduction == "none" else loss
