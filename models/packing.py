"""One set of token sequences as the two batches a causal LM trains on: one padding-free row, as
transformers' DataCollatorWithFlattening builds it, and a right-padded batch with its attention
mask. Both hold the same (context, target) pairs, so their losses agree."""

import torch

IGNORE_INDEX = -100  # HF's causal-LM loss ignores these labels


def packed_and_padded(seqs):
    """seqs: 1-D int64 token tensors on one device. Returns (padding-free, padded) model inputs:
    padding-free: input_ids and position_ids (1, sum of lengths), the positions restarting at 0 for
    each sequence, labels the ids with IGNORE_INDEX at each sequence's first token (so that no token
    predicts the next sequence's); padded: input_ids (B, longest), attention_mask, labels with
    IGNORE_INDEX at the padding."""
    device = seqs[0].device
    ids = torch.cat(seqs)[None]
    position_ids = torch.cat([torch.arange(len(s), device=device) for s in seqs])[None]
    labels = ids.masked_fill(position_ids == 0, IGNORE_INDEX)
    padded = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=ids.dtype, device=device)
    mask = torch.zeros_like(padded)
    for row, seq in enumerate(seqs):
        padded[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    return (
        dict(input_ids=ids, position_ids=position_ids, labels=labels),
        dict(input_ids=padded, attention_mask=mask, labels=padded.masked_fill(mask == 0, IGNORE_INDEX)),
    )
