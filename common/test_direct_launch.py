"""common/direct_launch.py's Launcher: its key is at least as fine as Triton's specialization, and a
kernel launched through it computes what the kernel computes, across specializations.

    python common/test_direct_launch.py        (or: pytest common/test_direct_launch.py)

A key coarser than Triton's would run a kernel compiled for other arguments (an aligned pointer's
vector loads on an unaligned one, a stride specialized to 1 on a stride of 3): wrong results
without an error. The first case holds arg_key against Triton's own specializer on arguments at
every boundary it draws (both lanes: the specializer is Triton's C++, no GPU needed). The second
launches a strided copy through two Launchers (constexprs by name, and by position) with arguments
that cross those boundaries one at a time and compares each result with torch's; on a GPU, every
launch after a key's first is the direct one, and the case counts them.
"""

import itertools

import numpy as np
import torch
import triton
import triton.language as tl
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.tools.tensor_descriptor import TensorDescriptor

from llmk.common.device import DEVICE, INTERPRET
from llmk.common.direct_launch import Launcher, arg_key, specialization_key
from llmk.devtools.testing import Case, Outcome, main


def sample_args():
    """Arguments at each boundary Triton's specializer draws: tensors of several dtypes with 16-byte
    aligned and unaligned bases; ints at 1, 16's multiples and the int32/int64/uint64 limits; floats,
    numpy's float, bools, None; descriptors of several dtypes and block shapes."""
    base = torch.empty(4096, dtype=torch.uint8)
    tensors = [base[i : i + 256].view(dt) for i in (0, 16, 8, 2) for dt in (torch.uint8, torch.float16)]
    tensors += [base[:512].view(torch.float32), base[4:516].view(torch.float32), base[:256].view(torch.float8_e4m3fn)]
    ints = [
        0,
        1,
        2,
        15,
        16,
        17,
        32,
        -1,
        -16,
        2**31 - 16,
        2**31 - 1,
        2**31,
        -(2**31),
        -(2**31) - 16,
        2**63 - 16,
        2**63,
        2**64 - 16,
        2**64 - 1,
    ]
    grid = base[:4096].view(64, 64)
    descs = [
        TensorDescriptor(grid, [64, 64], [64, 1], [16, 32]),
        TensorDescriptor(grid[:, 16:], [64, 48], [64, 1], [16, 32]),
        TensorDescriptor(grid, [64, 64], [64, 1], [32, 32]),
        TensorDescriptor(grid.view(torch.float16), [64, 32], [32, 1], [16, 32]),
    ]
    return tensors + ints + [0.5, 1.0, 3.0, np.float64(2.5), True, False, None] + descs


def triton_spec(x):
    return native_specialize_impl(BaseBackend, x, False, True, True)


def check_key_fine_enough():
    """Two arguments with one arg_key get one specialization from Triton: the key never merges what
    Triton tells apart (it may tell apart more)."""
    args = sample_args()
    merged = [
        (a, b)
        for a, b in itertools.combinations(args, 2)
        if arg_key(a) == arg_key(b) and triton_spec(a) != triton_spec(b)
    ]
    outcomes = [
        Outcome(
            f"{len(args)} arguments: one key, one specialization",
            not merged,
            note="; ".join(f"{triton_spec(a)} vs {triton_spec(b)}" for a, b in merged[:3]),
        )
    ]
    # the check can fail: a key that drops alignment merges what Triton does not
    coarse = [
        (a, b)
        for a, b in itertools.combinations(args[:8], 2)
        if arg_key(a)[0] == arg_key(b)[0] and triton_spec(a) != triton_spec(b)
    ]
    # specialization_key keys sizes and tensors inline: each element must be arg_key's
    inline = specialization_key(args)
    differ = [(a, k) for a, k in zip(args, inline) if k != arg_key(a)]
    return outcomes + [
        Outcome("a key without the alignment bit is caught", bool(coarse)),
        Outcome(
            "specialization_key is arg_key of each argument",
            len(inline) == len(args) and not differ,
            note="; ".join(f"{a!r}: {k} vs {arg_key(a)}" for a, k in differ[:3]),
        ),
    ]


@triton.jit
def _strided_copy_kernel(x_ptr, y_ptr, n, stride_x, scale, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    """y[i] = x[i * stride_x] (times scale where SCALE), i < n."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs * stride_x, mask=offs < n)
    if SCALE:
        x = x * scale
    tl.store(y_ptr + offs, x, mask=offs < n)


def check_launches():
    """Launchers whose arguments cross one specialization boundary at a time (the base's alignment,
    n and the stride at 1 and 16's multiples, a constexpr, the grid), each twice (the second is a
    direct launch on a GPU), each against torch: one launcher takes the constexprs by name, one by
    position (a key without their values would run SCALE=False's kernel for SCALE=True)."""
    by_name, by_position = Launcher(_strided_copy_kernel), Launcher(_strided_copy_kernel)
    src = torch.randn(8192, device=DEVICE)
    runs = [
        (0, 64, 1, False),
        (0, 64, 1, True),
        (1, 64, 1, False),
        (0, 63, 1, False),
        (0, 1, 1, False),
        (0, 64, 16, False),
        (0, 64, 3, False),
        (3, 17, 5, True),
        (0, 1000, 7, False),
        (0, 64, 1, False),
    ]
    outcomes = []
    for launcher, name in ((by_name, "by name"), (by_position, "by position")):
        for offset, n, stride, scale in runs:
            for attempt in range(2):
                x = src[offset:]
                y = torch.full((n + 8,), float("nan"), device=DEVICE)  # poisoned past n: nothing written there
                if launcher is by_name:
                    launcher[(triton.cdiv(n, 32),)](x, y, n, stride, 1.5, BLOCK=32, SCALE=scale)
                else:
                    launcher[(triton.cdiv(n, 32),)](x, y, n, stride, 1.5, 32, scale)
                want = x[: n * stride : stride] * (1.5 if scale else 1.0)
                ok = torch.equal(y[:n], want) and bool(y[n:].isnan().all())
                outcomes.append(
                    Outcome(
                        f"constexprs {name}: offset {offset} n {n} stride {stride} scale {scale} launch {attempt + 1}",
                        ok,
                    )
                )
        keys = len(launcher._compiled)
        outcomes.append(
            Outcome(
                f"constexprs {name}: {keys} compiled keys for {len(runs) - 1} distinct launches",
                INTERPRET or keys == len(runs) - 1,
            )
        )
    return outcomes


def check_order():
    """A non-constexpr parameter passed by name is refused with a clear error, in the interpreter
    too (where the launch itself would go through the kernel), so that CI sees such a call."""
    x = torch.zeros(4, device=DEVICE)
    try:
        Launcher(_strided_copy_kernel)[(1,)](x, x, 4, stride_x=1, scale=1.0, BLOCK=32, SCALE=False)
    except TypeError as e:
        return [Outcome("a non-constexpr parameter by name refused", "by position" in str(e), note=str(e)[:80])]
    return [Outcome("a non-constexpr parameter by name refused", False, note="no error")]


CASES = [
    Case("arg_key is as fine as Triton's specialization", check_key_fine_enough),
    Case("launches across specializations", check_launches),
    Case("non-constexpr parameters by position", check_order),
]


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("direct launch", CASES)
