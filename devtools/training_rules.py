"""The training tests' error rules: a patched bf16 model's loss and gradients against the fp32
reference (the same weights widened, exact), bounded by the unpatched bf16 model's own error against
that reference. Used by models/test_hf_patch.py (one step on one device) and models/test_fsdp2.py
(steps over sharded ranks)."""

import torch

from llmk.devtools.testing import UNIT_ROUNDOFF, Outcome, Tol, compare

# e4m3's unit roundoff, 2^-4, is 16x bf16's 2^-8: the 2x rule scaled by that for an FP8 model
FP8_FACTOR = 2 * 16


def training_rule(name, got, want, theirs, slack=0.0, factor=2, floor=0.0):
    """The training tests' rule (bf16 models against the fp32 reference): got within `factor` (2x)
    the unpatched bf16 model's error, |theirs - want| or `floor` if larger, plus one rounding of
    max|want|, plus slack."""
    err = max((theirs - want).abs().max().item(), floor)
    return compare(
        name,
        got,
        want,
        Tol(
            factor * err + UNIT_ROUNDOFF[torch.bfloat16] * want.abs().max().item() + slack,
            0.0,
            f"{factor}x the unpatched bf16 model's error + u * max|ref|",
            rounding_check=False,
        ),
    )


def token_losses(logits, ids):
    """A causal LM's per-token losses, fp64 and flat: logits (B, T, V) of ids (B, T), each position
    predicting the next token."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].detach().double().flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
    )


def token_loss_noise(model, ref, ids):
    """The typical size of a causal LM's mean loss error over ids (B, T): the RMS of the per-token
    losses' errors of `model` against the fp32 `ref`, over sqrt(the token count). The mean loss's own
    error is one draw of that mean; a lucky draw can be 7x smaller (TEST_SEED=1928498737 of the FP8
    step: 0.00024 against 0.0016), and a rule that scales it by FP8_FACTOR would then hold the FP8
    model to less than a bf16 rounding of its own noise."""
    with torch.no_grad():
        e = token_losses(model(input_ids=ids).logits, ids) - token_losses(ref(input_ids=ids).logits, ids)
    return (e.norm() / e.numel()).item()


def gradient_share(got, want, theirs, factor=2):
    """How much of its bound a gradient's error takes (pass: <= 1): the larger of its norm's error
    over factor x the unpatched model's plus one bf16 rounding, and the same of its largest element
    over twice that (see gradients_rule). 1e-9 keeps a gradient that is zero in all three models at 0."""
    u = UNIT_ROUNDOFF[torch.bfloat16]

    def ratio(size):  # size: the error measure, norm or max |.|
        return size(got - want) / (factor * size(theirs - want) + u * size(want) + 1e-9)

    return max(ratio(lambda t: t.norm().item()), ratio(lambda t: t.abs().max().item()) / 2)


def gradients_rule(grads, ref_grads, plain_grads, prefix="", factor=2):
    """training_rule for every parameter's gradient at once, {name: grad} of the patched model, the
    fp32 reference and the unpatched bf16 model, on each gradient's norm (its error over the whole
    tensor, where a step's bf16 noise averages out), and elementwise within twice that: one element
    of a small tensor (a 32-value q_norm weight) can take 2.3x the unpatched model's error by chance
    (TEST_SEED=2138056200), where the norms' ratios stay under 0.6. One outcome, naming the
    parameter nearest its bound. factor: the 2 of "twice", larger for a model that rounds more by
    design (FP8)."""
    worst = max((gradient_share(grads[n], ref_grads[n], plain_grads[n], factor), n) for n in ref_grads)
    return Outcome(
        f"{prefix}{len(ref_grads)} parameter gradients within the rule",
        worst[0] <= 1.0,
        note=f"worst: {worst[1]} at {worst[0]:.2f} of its bound",
    )


__all__ = ["FP8_FACTOR", "gradient_share", "gradients_rule", "token_loss_noise", "token_losses", "training_rule"]
