"""Tests for gemm/triton_gemv.py (M = 1) against the fp64 product of the same fp16/bf16 inputs and
PyTorch's same-dtype torch.matmul with its bias and activation ops, with gemm/matmul_cases.py's
reference and tolerance (fp32 accumulation over K, one rounding; at most 2x PyTorch's own error
plus atol).

    python gemm/test_gemv.py        (or: pytest gemm/test_gemv.py)

Both layouts of b (row-major (K, N) and W.T of an nn.Linear weight W (N, K)) and a b contiguous in
neither dimension; N and K that are multiples of no block (1, 17, 100, 257); K split over several
programs (forced, and as planned on the interpreter's small GPU) and not; each epilogue with and
without a bias; strided a, b, c and bias; a NaN-filled c (an unwritten column fails); two calls in
a row (the arrival counters must be back at zero). A slice lost, counted twice or given the
epilogue on its own is off by a whole partial sum, far past the tolerance.
"""

import torch

from llmk.common.device import DEVICE, INTERPRET, sm_count
from llmk.common.ints import cdiv
from llmk.common.workspace import split_k_buffers
from llmk.devtools.testing import (
    TOLERANCES,
    Case,
    Outcome,
    Tol,
    compare,
    dtype_name,
    interpreter_dtype,
    main,
    poisoned,
    rand,
)
from llmk.gemm.matmul_cases import reference, tolerance, torch_same_dtype
from llmk.gemm.triton_gemv import (
    GEMV_CONFIGS,
    INTERPRET_SMS,
    MIN_SLICE_STEPS,
    gemv_plan,
    is_row_major,
    launch_gemv,
    plan_for,
)

DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("row-major", "W.T")
EPILOGUES = [(bias, act) for act in (None, "gelu", "gelu_tanh", "silu") for bias in (False, True)]


def epilogue_label(bias, activation):
    return "+".join(["bias"] * bias + [activation] * (activation is not None)) or "plain"


def make_a(k, dtype, view=None):
    """a (1, K): its own tensor; "row": a row of a matrix with a padded row stride; "column": a
    column of a (K, 5) matrix, transposed (stride_ak = 5)."""
    if view == "row":
        return rand((3, k), dtype, pad=(0, 5))[1:2]
    if view == "column":
        return rand((k, 5), dtype)[:, 2:3].t()
    return rand((1, k), dtype)


def make_b(k, n, dtype, layout, pad=False):
    """b (K, N): row-major, W.T of a (N, K) weight, or "strided": every other column of a (K, 2N)
    matrix (contiguous in neither dimension). pad: a wider row stride of the underlying matrix."""
    if layout == "row-major":
        return rand((k, n), dtype, pad=(0, 7) if pad else None)
    if layout == "W.T":
        return rand((n, k), dtype, pad=(0, 9) if pad else None).t()
    return rand((k, 2 * n), dtype)[:, ::2]


def counters_clear(device):
    """The current stream's counters (the ones launch_gemv counted in) are all zero again."""
    counters = split_k_buffers(device, 0, 1)[1]
    return Outcome("arrival counters back at zero", bool((counters == 0).all().item()))


def check(
    n,
    k,
    dtype,
    layout="row-major",
    bias=False,
    bias_dtype=None,
    activation=None,
    split_k=None,
    a_view=None,
    strided=False,
    planned_split=None,
    calls=1,
):
    """launch_gemv into a NaN-filled c against the fp64 reference. strided: b padded, c a column of
    an (N, 3) buffer (stride_cn = 3), bias every other element of a (2N,) vector. split_k forces
    a split (None: the plan's); planned_split also checks the plan's choice for this shape; calls:
    that many launches in a row, each into a fresh NaN-filled c."""
    a = make_a(k, dtype, a_view)
    b = make_b(k, n, dtype, layout, pad=strided)
    bias_t = None
    if bias:
        bias_t = rand((2 * n,), bias_dtype or dtype)[::2] if strided else rand((n,), bias_dtype or dtype)
    ref = reference(a, b, bias_t, activation)
    torch_out = torch_same_dtype(a, b, bias_t, activation)
    tol = tolerance(a, b)
    outcomes = []
    for call in range(calls):
        buffer = poisoned((n, 3) if strided else (1, n), dtype)
        c = buffer[:, 1:2].t() if strided else buffer
        launch_gemv(a, b, bias_t, activation, c, split_k=split_k)
        outcomes.append(compare(f"c (call {call + 1})" if calls > 1 else "c", c, ref, tol, torch_out=torch_out))
        if strided:
            outcomes.append(Outcome("c's neighbours untouched", bool(buffer[:, 0::2].isnan().all().item())))
    if calls > 1:
        outcomes.append(counters_clear(a.device))
    if planned_split is not None:
        chosen = gemv_plan(n, k, is_row_major(b), sm_count(a.device, INTERPRET_SMS))[-1]
        outcomes.append(Outcome(f"plan: SPLIT_K {chosen}, expected {planned_split}", chosen == planned_split))
    return outcomes


def check_empty_k(dtype, layout):
    """K = 0: an empty dot product is 0, so c = activation(bias)."""
    a, b, bias = make_a(0, dtype), make_b(0, 7, dtype, layout), rand((7,), dtype)
    plain, with_epilogue = poisoned((1, 7), dtype), poisoned((1, 7), dtype)
    launch_gemv(a, b, None, None, plain)
    launch_gemv(a, b, bias, "silu", with_epilogue)
    return [
        compare("K = 0: zeros", plain, torch.zeros(1, 7, dtype=torch.float64, device=DEVICE)),
        compare("K = 0: silu(bias)", with_epilogue, torch.nn.functional.silu(bias.double())[None]),
    ]


def check_gpu_plan():
    """The GPU table's plans on an H100's 132 SMs, checked without one: the grid fits the row's
    programs per SM, no slice is empty or shorter than MIN_SLICE_STEPS steps (when split), and
    few strips are split."""
    outcomes = []
    for layout, config in GEMV_CONFIGS.items():
        for n, k in [(4096, 4096), (2048, 4096), (8192, 4096), (14336, 4096), (4096, 14336), (4096, 64), (1, 4096)]:
            block_n, block_k, _, _, split = plan_for(n, k, config, 132)
            strips, k_steps = cdiv(n, block_n), cdiv(k, block_k)
            slice_steps = cdiv(k_steps, split)
            ok = (
                strips * split <= max(strips, config[-1] * 132)
                and (split == 1 or slice_steps >= MIN_SLICE_STEPS)
                and cdiv(k_steps, slice_steps) == split
            )
            if strips * 2 <= config[-1] * 132 and k_steps >= 2 * 2 * MIN_SLICE_STEPS:
                ok = ok and split >= 2  # a GPU less than half full, with K to spare, splits
            outcomes.append(Outcome(f"{layout} N={n} K={k}: {strips} strips x {split}", ok))
    return outcomes


def check_huge(dtype):
    """K * N past 2^31 elements in both layouts (4 GB of b each): offsets that would wrap in 32 bits.
    fp32 reference by chunks of K, tolerance from the inputs' known scale (normal(0, 1))."""
    n, k = 1024, 2**21 + 3
    a = rand((1, k), dtype)
    outcomes = []
    for layout in LAYOUTS:
        b = make_b(k, n, dtype, layout)
        ref = sum(a[:, i : i + 2**18].float() @ b[i : i + 2**18].float() for i in range(0, k, 2**18))
        c = poisoned((1, n), dtype)
        launch_gemv(a, b, None, None, c)
        tol = Tol(max(1e-5, k * 2**-20), TOLERANCES[dtype].rtol, "fp32 accumulation over K, one rounding")
        outcomes.append(compare(layout, c, ref, tol))
        del b
    return outcomes


def check_config(layout, dtype):
    """GEMV_CONFIGS' row for `layout`, forced, on a shape with a strip past N, a K tail and enough K
    steps for its plan to split K on this device; with bias+gelu in fp16. Also checks that the plan
    split (every row runs its split path) and left the counters at zero."""
    config = GEMV_CONFIGS[layout]
    block_n, block_k = config[:2]
    n, k = 2 * block_n + 1, (2 * MIN_SLICE_STEPS + 1) * block_k + 7
    a, b = make_a(k, dtype), make_b(k, n, dtype, "row-major" if layout == "row_major" else "W.T")
    split = gemv_plan(n, k, is_row_major(b), sm_count(a.device, INTERPRET_SMS), config)[-1]
    outcomes = [Outcome(f"plan splits K: {split}", split > 1)]
    epilogues = [(False, None)] + ([(True, "gelu")] if dtype == torch.float16 else [])
    for bias, activation in epilogues:
        bias_t = rand((n,), dtype) if bias else None
        c = poisoned((1, n), dtype)
        launch_gemv(a, b, bias_t, activation, c, config=config)
        outcomes.append(
            compare(
                f"c, {epilogue_label(bias, activation)}",
                c,
                reference(a, b, bias_t, activation),
                tolerance(a, b),
                torch_out=torch_same_dtype(a, b, bias_t, activation),
            )
        )
    outcomes.append(counters_clear(a.device))
    return outcomes


def check_tables_forced():
    """Every GEMV_CONFIGS row is forced by a case that runs on this device."""
    runnable = [c for c in CASES if not (c.gpu_only and INTERPRET)]
    forced = {c.kwargs["layout"] for c in runnable if c.fn is check_config}
    missing = sorted(set(GEMV_CONFIGS) - forced)
    return [Outcome("every GEMV_CONFIGS row forced", not missing, note=f"missing {missing}" if missing else "")]


def cases():
    out = []

    def add(name, fn=check, gpu_only=False, **kwargs):
        out.append(Case(name, fn, kwargs, gpu_only))

    for dtype in DTYPES:
        dt = dtype_name(dtype)
        for layout in LAYOUTS:
            tag = f"{dt} {layout}"
            listed = []  # (name, fn, kwargs) of this dtype and layout
            # N and K multiples of no block, one column, one element, a K tail, as planned
            for n, k in [(1, 1), (17, 17), (1, 300), (257, 100), (100, 257), (17, 257), (33, 64)]:
                listed.append((f"({n}, {k}) {tag}", check, dict(n=n, k=k)))
            # forced splits: uneven slices (the last shorter), K a multiple of every BLOCK_K (no
            # masks), more slices asked than K steps (lowered to one a step), and forced off
            for n, k, split_k in [(17, 257, 4), (100, 257, 3), (100, 256, 3), (257, 300, 2), (5, 40, 7), (17, 257, 1)]:
                listed.append((f"({n}, {k}) {tag} split {split_k}", check, dict(n=n, k=k, split_k=split_k)))
            # each epilogue on the split path and on the direct store
            for bias, activation in EPILOGUES:
                label = epilogue_label(bias, activation)
                epilogue = dict(bias=bias, activation=activation)
                listed.append((f"(100, 257) {tag} split 3 {label}", check, dict(n=100, k=257, split_k=3, **epilogue)))
                listed.append((f"(100, 70) {tag} {label}", check, dict(n=100, k=70, split_k=1, **epilogue)))
            listed += [
                (f"(33, 200) {tag} a row, split 2", check, dict(n=33, k=200, a_view="row", split_k=2)),
                (f"(33, 200) {tag} a column", check, dict(n=33, k=200, a_view="column", split_k=1)),
                (
                    f"(65, 300) {tag} a column, strided b c bias, split 3 bias+gelu",
                    check,
                    dict(n=65, k=300, a_view="column", strided=True, bias=True, activation="gelu", split_k=3),
                ),
                (f"(17, 257) {tag} twice, split 4", check, dict(n=17, k=257, split_k=4, calls=2)),
                (f"K = 0 {tag}", check_empty_k, {}),
            ]
            # the interpreter runs each in one dtype, alternating down the list from the other dtype
            # in the other layout (the GPU runs both): every shape, split and epilogue (on each path)
            # still meets both layouts and both dtypes
            for i, (name, fn, kwargs) in enumerate(listed, start=LAYOUTS.index(layout)):
                add(name, fn, gpu_only=dtype != interpreter_dtype(i), dtype=dtype, layout=layout, **kwargs)
        add(
            f"(40, 100) {dt} b contiguous in neither dim, split 2",
            n=40,
            k=100,
            dtype=dtype,
            layout="strided",
            split_k=2,
        )
        # the plan on the interpreter's small GPU: split where the strips are few, not where they
        # fill it or K is short
        if INTERPRET:
            add(f"(17, 257) {dt} planned split 4", n=17, k=257, dtype=dtype, planned_split=4)
            add(f"(17, 257) {dt} W.T planned split 3", n=17, k=257, dtype=dtype, layout="W.T", planned_split=3)
            add(
                f"(100, 257) {dt} planned split 2 bias+silu",
                n=100,
                k=257,
                dtype=dtype,
                bias=True,
                activation="silu",
                planned_split=2,
            )
            add(f"(17, 40) {dt} short K: planned no split", n=17, k=40, dtype=dtype, planned_split=1)
        # full size on the GPU: the decode shapes of a 4096-wide model, as planned
        for layout in LAYOUTS:
            for n, k in [(4096, 4096), (2048, 4096), (14336, 4096), (4096, 14336), (4095, 4097)]:
                add(f"({n}, {k}) {dt} {layout}", gpu_only=True, n=n, k=k, dtype=dtype, layout=layout)
            add(
                f"(4096, 4096) {dt} {layout} bias+silu twice",
                gpu_only=True,
                n=4096,
                k=4096,
                dtype=dtype,
                layout=layout,
                bias=True,
                activation="silu",
                calls=2,
            )
    add(
        "(100, 257) bf16 fp32 bias+gelu_tanh split 3",
        n=100,
        k=257,
        dtype=torch.bfloat16,
        bias=True,
        bias_dtype=torch.float32,
        activation="gelu_tanh",
        split_k=3,
    )
    add(
        "(100, 257) fp16 W.T fp32 bias+silu",
        n=100,
        k=257,
        dtype=torch.float16,
        layout="W.T",
        bias=True,
        bias_dtype=torch.float32,
        activation="silu",
        split_k=1,
    )
    add("GPU plan (132 SMs)", check_gpu_plan)
    add("K * N past 2^31 fp16", check_huge, gpu_only=True, dtype=torch.float16)
    for dtype in DTYPES:  # each GEMV_CONFIGS row, forced (the interpreter runs them in fp16)
        for layout, config in GEMV_CONFIGS.items():
            add(
                f"config {layout} {config} {dtype_name(dtype)}",
                check_config,
                gpu_only=dtype != torch.float16,
                layout=layout,
                dtype=dtype,
            )
    add("every launch-table row forced", check_tables_forced)
    return out


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("gemv", CASES)
