"""Argument checks of the attention options shared by the flash kernels and decode attention
(inference/): packed batches' cumulative lengths, sliding windows, logit softcaps."""

import math
import os
from typing import NamedTuple

import torch

from llmk.common.validation import check_same_device, check_tensor


def check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q):
    """The layout of a packed batch's cumulative lengths (no values read: no device sync): int32,
    1-D with B + 1 >= 1 entries, on q's device, one length for q's and k's."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(name, cu, (torch.int32,))
        check_same_device(name, cu, "q", q)
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"{name} must be 1-D with B + 1 >= 1 entries, got shape {tuple(cu.shape)}")
    if cu_seqlens_k.shape != cu_seqlens_q.shape:
        raise ValueError(
            f"cu_seqlens_k must have cu_seqlens_q's length {cu_seqlens_q.shape[0]} (B + 1), got {cu_seqlens_k.shape[0]}"
        )


# A debug switch: LLMK_CHECK_SEQLENS=1 has the packed-batch launchers read cu_seqlens on the host
# before a launch on a GPU too (a device sync each call, so off by default)
CHECK_SEQLENS_ENV = "LLMK_CHECK_SEQLENS"


def seqlens_checked(cu_seqlens):
    """Whether a launch on these cumulative lengths reads them on the host first
    (check_cu_seqlens_values): always on the CPU (the interpreter, where a length past the end
    would corrupt the heap; reading them costs nothing there); on a GPU only when the environment
    sets LLMK_CHECK_SEQLENS=1 (the read waits for the device), and never while a CUDA graph is
    being captured (which forbids a sync)."""
    if cu_seqlens.device.type == "cpu":
        return True
    if os.environ.get(CHECK_SEQLENS_ENV, "0") != "1":
        return False
    return not torch.cuda.is_current_stream_capturing()


def check_cu_seqlens_values(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q, max_seqlen_k):
    """The values of a packed batch's cumulative lengths (layout checked by check_cu_seqlens), read
    in one transfer: each starts at 0, stays within and ends at its packed length (total_q =
    q.shape[0], total_k = k.shape[0]), never decreases, and no sequence is longer than
    max_seqlen_q / max_seqlen_k. Raises ValueError naming the argument, the position and the value."""
    values = torch.stack((cu_seqlens_q, cu_seqlens_k)).tolist()
    for cu, name, total, max_name, max_len in zip(
        values,
        ("cu_seqlens_q", "cu_seqlens_k"),
        (total_q, total_k),
        ("max_seqlen_q", "max_seqlen_k"),
        (max_seqlen_q, max_seqlen_k),
    ):
        side = name[-1]
        if cu[0] != 0:
            raise ValueError(f"{name} must start at 0; got {name}[0] = {cu[0]}")
        for i, (before, value) in enumerate(zip(cu, cu[1:]), start=1):
            if value > total:
                raise ValueError(f"{name}[{i}] = {value} is past the packed length {total} ({side}.shape[0])")
            if value < before:
                raise ValueError(
                    f"{name} must be non-decreasing (cumulative lengths); got {name}[{i}] = {value} "
                    f"< {name}[{i - 1}] = {before}"
                )
        if cu[-1] != total:
            raise ValueError(
                f"{name} must end at the packed length {total} ({side}.shape[0]); got {name}[{len(cu) - 1}] = {cu[-1]}"
            )
        lengths = [after - before for before, after in zip(cu, cu[1:])]
        if lengths and max(lengths) > max_len:
            b = lengths.index(max(lengths))
            raise ValueError(
                f"{max_name} = {max_len} is less than sequence {b}'s length {lengths[b]} "
                f"({name}[{b + 1}] - {name}[{b}])"
            )


def check_window(window, name="window"):
    """window: None, or (left, right), two ints >= -1 (-1: no bound on that side). Returns the
    operators' (window_left, window_right), (-1, -1) for None. name: the argument, for errors."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"{name} must be None or a (left, right) pair of ints, got {window!r}")
    for side in window:
        if not isinstance(side, int) or isinstance(side, bool):
            raise TypeError(f"{name} must be None or a (left, right) pair of ints, got {window!r}")
        if side < -1:
            raise ValueError(f"{name}'s sides must be ints >= -1 (-1: unbounded), got {window!r}")
    return int(window[0]), int(window[1])


class AttentionMask(NamedTuple):
    """A flash-attention call's mask options, checked (attention_mask): the window's sides, -1
    unbounded, and the logit softcap, 0.0 off. The operators take them as their last three
    arguments, in this order; the launchers take the tuple."""

    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0


NO_MASK = AttentionMask()


def attention_mask(window=None, softcap=None, name="window"):
    """window (None or (left, right)) and softcap (None or c >= 0) checked into one AttentionMask:
    what the public functions pass to the operators, and what the operators check again for a
    caller that reaches them directly. name: the window's argument, for errors."""
    return AttentionMask(*check_window(window, name), check_softcap(softcap))


def check_softcap(softcap):
    """softcap: None or 0 (off), or a positive finite number. Returns the operators' float, 0.0 for off."""
    if softcap is None:
        return 0.0
    if not isinstance(softcap, (int, float)) or isinstance(softcap, bool):
        raise TypeError(f"softcap must be None or a number >= 0, got {type(softcap).__name__}")
    if not (math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be a finite number >= 0 (0 or None: off), got {softcap!r}")
    return float(softcap)
