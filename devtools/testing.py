"""Comparison against a reference, the PASS/FAIL table, and the two test tiers.

A test script holds one list, `CASES`, of `Case`s. `run_cases` runs it as a script (progress line
per case, then a tabulate table, then `N passed, M failed`, exit code 1 on any failure); the root
`conftest.py` hands the same list to pytest, so there is one source of cases. Cases marked
`gpu_only` are too big for Triton's interpreter and run only when a CUDA device is present.

A script whose cases cannot run on this machine at all (no CUDA toolchain, an optional package
missing) passes `skip_reason`: its cases count as skipped, with the reason, in the closing line
`N passed, M failed, K skipped (reason)`. A script that runs no case and gives no reason fails.
One case that finds nothing it can check here raises `Skip(reason)`, and counts the same way:
a case never passes without checking something.
On a GPU each case runs in a turn that other test scripts share (devtools/gpu_turns.py: `make test
JOBS=4`); one that declares most of the card (`gpu_gb`) or runs out of memory beside them runs
alone, and one larger than the card is skipped with its need as the reason. Each progress line
gives the case's peak GPU memory.

Tolerance rule (from flash-attention's tests): an output passes when every element is within
`atol + rtol * |ref|` of a reference computed in fp32/fp64 from the same inputs, and, when the test
supplies PyTorch's own same-dtype result, its max error is at most 2x PyTorch's plus `atol`.
An fp16/bf16 output must also be rounded to nearest: see `rounding_bias`.
"""

import contextlib
import math
import os
import random
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from llmk.common.device import DEVICE, INTERPRET, describe, interpreter_problem
from llmk.common.validation import DTYPE_NAMES


@dataclass(frozen=True)
class Tol:
    """Per element: |out - ref| <= atol + rtol * |ref|. atol: a float, or a tensor of ref's shape
    (a bound for each element, from an error model that varies over the output). rounding_check:
    whether compare() also tests fp16/bf16 outputs for a rounding bias (off for error models that
    are not one rounding of an accurate fp32 value)."""

    atol: float
    rtol: float
    why: str
    rounding_check: bool = True


# Bit for bit: two calls of one kernel (or of one kernel through two paths) on the same inputs
EXACT = Tol(0.0, 0.0, "the same kernel on the same inputs", rounding_check=False)

# Unit roundoff u of each dtype: the largest relative error of one rounding to nearest (half an ulp at 1).
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}

# Half the spacing of each dtype's subnormals (its smallest numbers): a correctly rounded result
# that lands there can be this far from the exact value, whatever its relative bound says (an
# fp16 gradient of 1.23e-7 rounds to 1.19e-7, two steps of 2^-24). compare() bounds the rounding's
# share of the error by at least this: below the smallest normal number, never above it.
SUBNORMAL_HALF_SPACING = {torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134, torch.float32: 2.0**-150}

# One table for every kernel whose output is computed in fp32 and rounded once to the output dtype.
# A kernel with a different error model (long fp32 dot products, ...) passes its own Tol to compare().
TOLERANCES = {
    torch.float32: Tol(
        1e-5,
        1e-5,
        "fp32 math throughout; only the order of summation differs from the fp64 reference (~log2(N) * 2^-24 relative)",
    ),
    torch.float16: Tol(
        1e-5,
        2**-10,
        "one rounding of an fp32 result to fp16 is half an ulp (2^-11 "
        "relative); summation order can flip a rounding: one ulp",
    ),
    torch.bfloat16: Tol(1e-5, 2**-7, "the same rule for bf16's 8-bit significand: one ulp, 2^-7"),
}


class Skip(Exception):
    """Raised by a case's function that cannot check anything on this machine (an optional package
    missing, an older Python): the case counts as skipped, with the message as its reason."""


@dataclass
class Outcome:
    """One checked output (or one expected error) of a case; a row of the report."""

    check: str
    passed: bool
    max_abs: float = float("nan")
    max_rel: float = float("nan")
    bad: str = ""
    first_bad: str = ""
    limit: str = ""
    torch_err: float = float("nan")
    note: str = ""


# Rounding to nearest leaves a mean signed error (in |value|, per ulp of the reference) of ~0;
# rounding toward zero (truncation) leaves -0.5, away from zero +0.5. Over 512 values the mean of
# uniform errors in [-0.5, 0.5] ulp has a standard deviation of 0.29 / sqrt(512) = 0.013 ulp, so
# 0.25 is 20 standard deviations from a false alarm and half the distance to truncation.
ROUNDING_BIAS_LIMIT = 0.25
ROUNDING_MIN_VALUES = 512


def rounding_bias(out, ref, dtype):
    """Mean of (|out| - |ref|) / ulp(ref) over the reference values that are normal numbers in
    `dtype` (fp16 or bf16) and whose error is at most one ulp, or None with fewer than
    ROUNDING_MIN_VALUES distinct values of `dtype` among them. out, ref: fp64 copies.
    Errors past an ulp are left out: they come from elsewhere than the output's rounding (a
    kernel's fp32 intermediates, larger than an ulp of a small output), and they can lean one way.
    gelu's far negative tail, 0.5 x (1 + erf(x / sqrt 2)) with 1 + erf cancelling in fp32, is
    such: clipped to one ulp and counted, PyTorch's own fp32 gelu rounded once to bf16 read as a
    -0.35 ulp bias. A kernel that truncates instead of rounding to nearest errs by up to one ulp,
    all one way, and is still seen (-0.45 ulp on the same outputs).
    References that round to one value of `dtype` count once, by their mean error: a value
    repeated over the output (softmax rows of tied maxima, a row of equal values), or a cluster of
    nearby ones (the target entries of a cross-entropy gradient, all near -(1 - smoothing) / n),
    is one rounding whose error of up to half an ulp would otherwise pass for a bias."""
    tiny, eps = torch.finfo(dtype).tiny, torch.finfo(dtype).eps
    keep = out.isfinite() & ref.isfinite() & (ref.abs() >= tiny)
    r, order = ref[keep].sort()
    o = out[keep][order]
    _, exponent = torch.frexp(r)  # |r| = m * 2^exponent, m in [0.5, 1): the ulp is eps * 2^(exponent - 1)
    ulp = torch.ldexp(torch.full_like(r, eps), exponent - 1)
    err = (o.abs() - r.abs()) / ulp
    near = err.abs() <= 1.0
    r, err = r[near], err[near]
    # one mean error per value of `dtype` the references round to (rounding is monotonic: the
    # references of one cell are adjacent in the sorted order)
    _, cell, counts = torch.unique_consecutive(r.to(dtype), return_inverse=True, return_counts=True)
    if counts.numel() < ROUNDING_MIN_VALUES:
        return None
    per_cell = torch.zeros(counts.numel(), dtype=err.dtype, device=err.device).index_add_(0, cell, err)
    return (per_cell / counts).mean().item()


def compare(check, out, ref, tol=None, torch_out=None):
    """Compare `out` with `ref` (computed in fp32 or fp64 from the same inputs).

    out, ref: same shape. tol: a Tol, by default TOLERANCES[out.dtype]. torch_out: PyTorch's own
    result in out's dtype, if there is one; its error against `ref` bounds ours (2x plus atol).
    The rounding's share, rtol |ref|, is at least SUBNORMAL_HALF_SPACING[out.dtype] (one rounding
    of a subnormal result), which changes the bound below the dtype's smallest normal number only.
    NaN where the reference is finite, or a different NaN/inf pattern, always fails. An fp16 or
    bf16 output of 512+ values must not be biased by more than ROUNDING_BIAS_LIMIT ulp (a kernel
    that truncates instead of rounding to nearest fails, though each value is within an ulp).
    """
    tol = tol or TOLERANCES[out.dtype]
    if tuple(out.shape) != tuple(ref.shape):
        return Outcome(check, False, note=f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    o, r = out.detach().double(), ref.detach().double()
    atol = tol.atol.detach().double() if torch.is_tensor(tol.atol) else tol.atol
    floor = SUBNORMAL_HALF_SPACING.get(out.dtype, 0.0)
    atol_max = ((atol.max().item() if atol.numel() else 0.0) if torch.is_tensor(atol) else atol) + floor
    diff = (o - r).abs()
    same_special = (o.isnan() & r.isnan()) | (o.isinf() & (o == r))
    # the rounding's share is rtol |ref| for normal values, at least half a subnormal step below them
    ok = (diff <= atol + (tol.rtol * r.abs()).clamp_min(floor)) | same_special
    finite = ~same_special
    max_abs = diff[finite].max().item() if finite.any() else 0.0
    rel = diff / r.abs().clamp_min(1e-30)
    relative = finite & (r.abs() > atol)
    max_rel = rel[relative].max().item() if relative.any() else 0.0
    n_bad = int((~ok).sum().item())
    first_bad = ""
    if n_bad:
        flat = int((~ok).flatten().nonzero()[0].item())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), o.shape))
        first_bad = f"{idx}: {o[idx].item():.6g} vs {r[idx].item():.6g}"
    passed = n_bad == 0
    torch_err = float("nan")
    notes = []
    if torch_out is not None:
        torch_err = (torch_out.detach().double() - r).abs().nan_to_num(nan=math.inf).max().item() if r.numel() else 0.0
        if not max_abs <= 2 * torch_err + atol_max:
            passed = False
            notes.append("error above 2x PyTorch's own")
    if tol.rounding_check and out.dtype in (torch.float16, torch.bfloat16):
        bias = rounding_bias(o, r, out.dtype)
        if bias is not None and abs(bias) > ROUNDING_BIAS_LIMIT:
            passed = False
            notes.append(f"rounding bias {bias:+.2f} ulp (round to nearest: ~0)")
    note = "; ".join(notes)
    return Outcome(
        check,
        passed,
        max_abs,
        max_rel,
        f"{n_bad}/{o.numel()}",
        first_bad,
        f"{'<=' if torch.is_tensor(atol) else ''}{atol_max:.0e}+{tol.rtol:.1e}|ref|",
        torch_err,
        note,
    )


def _leaves(inputs, wrt, dtype=None):
    """Copies of `inputs` for one autograd run: the tensors at positions `wrt` become leaves that
    require grad (same data and strides, or cast to `dtype`); other arguments pass as they are."""
    out = []
    for i, a in enumerate(inputs):
        if torch.is_tensor(a):
            a = a.detach() if dtype is None or not a.is_floating_point() else a.detach().to(dtype)
            if i in wrt:
                a.requires_grad_()
        out.append(a)
    return out


def _outputs(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def grads_of(fn, inputs, wrt, grad_outputs, dtype=None):
    """Gradients of fn(*inputs) with respect to the inputs at positions `wrt`, given the upstream
    gradients `grad_outputs` (one per output, cast to the outputs' dtype), via torch.autograd.grad.
    dtype: run fn on copies of the floating-point inputs cast to it (the fp64 reference).
    Returns (outputs, grads), each a tuple; a gradient autograd leaves undefined is None."""
    leaves = _leaves(inputs, wrt, dtype)
    outs = _outputs(fn(*leaves))
    pairs = [(o, g.to(o.dtype)) for o, g in zip(outs, grad_outputs) if o.requires_grad]
    grads = torch.autograd.grad(
        [o for o, _ in pairs], [leaves[i] for i in wrt], [g for _, g in pairs], allow_unused=True
    )
    return tuple(o.detach() for o in outs), grads


def check_grads(label, fn, reference, inputs, wrt, names, tol, torch_fn=None, grad_outputs=None):
    """Gradients of our `fn` against autograd through `reference` in fp64, one Outcome per input in
    `wrt` (positions in `inputs`; `names` names them), on fresh upstream gradients.

    tol: a Tol, or a function (name, grad) -> Tol, for the gradients. torch_fn: PyTorch's own
    computation in the inputs' dtype; its gradients' error bounds ours (2x plus atol, compare()).
    grad_outputs: the upstream gradients (default: fresh normal values shaped like each output).
    Also checks that every input not in `wrt` gets no gradient and that the outputs under grad
    equal the outputs without it, bit for bit."""
    with torch.no_grad():
        plain = _outputs(fn(*inputs))
    if grad_outputs is None:
        grad_outputs = [torch.randn(o.shape, device=o.device).to(o.dtype) for o in plain]
    outs, got = grads_of(fn, inputs, wrt, grad_outputs)
    _, want = grads_of(reference, inputs, wrt, grad_outputs, dtype=torch.float64)
    theirs = grads_of(torch_fn, inputs, wrt, grad_outputs)[1] if torch_fn is not None else [None] * len(wrt)
    outcomes = []
    for i, (o, p) in enumerate(zip(outs, plain)):
        same = o.shape == p.shape and bool(((o == p) | (o.isnan() & p.isnan())).all())
        outcomes.append(Outcome(f"{label} output {i} under grad = no_grad", same))
    for pos, g, w, t in zip(wrt, got, want, theirs):
        name = names[pos] if isinstance(names, (list, tuple)) else names
        check = f"{label} d{name}"
        if g is None or w is None:
            outcomes.append(
                Outcome(
                    check,
                    g is None and w is None,
                    note=f"grad {g is None and 'None'}, reference {w is None and 'None'}",
                )
            )
            continue
        expected = inputs[pos]
        if g.shape != expected.shape or g.dtype != expected.dtype:
            outcomes.append(
                Outcome(
                    check,
                    False,
                    note=f"grad {tuple(g.shape)} {g.dtype}, input {tuple(expected.shape)} {expected.dtype}",
                )
            )
            continue
        outcomes.append(compare(check, g, w, tol(name, w) if callable(tol) else tol, torch_out=t))
    return outcomes


def opcheck(check, overload, args, skip=()):
    """torch.library.opcheck's four tests (schema, autograd registration, fake tensor, AOT dispatch),
    less those named in skip (e.g. "test_schema", whose mutation check does arithmetic that torch has
    no float8 kernels for)."""
    tests = tuple(
        t
        for t in ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        if t not in skip
    )
    try:
        torch.library.opcheck(overload, args, test_utils=tests)
    except Exception as e:  # OpCheckError, or the op itself raising: the row fails with the reason
        # "opcheck(op, ...): test_faketensor failed with When comparing ...: Shapes ... are not equal!"
        msg = str(e).split(" (scroll up")[0].replace("opcheck(op, ...): ", "")
        test, _, why = msg.partition(" failed with ")
        note = f"{test} failed: {why.rsplit('metadata: ', 1)[-1]}" if why else f"{type(e).__name__}: {msg}"
        return Outcome(check, False, note=note[:200])
    return Outcome(check, True)


def expect_raises(check, fn, exc_types=(ValueError, TypeError), match=""):
    """The call must raise one of `exc_types` with `match` (an argument name) in its message."""
    try:
        fn()
    except exc_types as e:
        msg = str(e)
        ok = match.lower() in msg.lower()
        return Outcome(check, ok, note=(msg if ok else f"message lacks {match!r}: {msg}")[:70])
    except Exception as e:  # the wrong kind of error is a failure, not a crash of the script
        return Outcome(check, False, note=f"{type(e).__name__}: {e}"[:70])
    return Outcome(check, False, note="no error raised")


def poisoned(shape, dtype):
    """An output buffer full of NaN: an element the kernel fails to write shows up as a mismatch."""
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def rand(shape, dtype, *, pad=None, scale=1.0):
    """Fresh normal(0, scale) input of `shape`. pad (one int per dim) returns a strided view: a
    tensor `pad` larger in each dim, cut back to `shape`, so its strides are not the packed ones
    (pad=(0, 8) gives rows with a wider stride; padding a middle dim gives leading dims that
    cannot be merged into one row index)."""
    pad = pad or (0,) * len(shape)
    full = torch.randn(*(s + p for s, p in zip(shape, pad)), device=DEVICE) * scale
    return full.to(dtype)[tuple(slice(0, s) for s in shape)]


@contextlib.contextmanager
def table_entry(table, key, value):
    """table[key] = value inside the block, then restored: a launcher's config table, which it reads
    at each launch, or a module's setting through vars(module)."""
    before = table[key]
    table[key] = value
    try:
        yield
    finally:
        table[key] = before


def dtype_name(dtype):
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


@dataclass
class Case:
    """One test case: `fn(**kwargs)` builds fresh inputs and returns a list of Outcomes."""

    name: str
    fn: Callable[..., list]
    kwargs: dict = field(default_factory=dict)
    gpu_only: bool = False
    gpu_gb: float = None  # GPU memory it needs, where that is most of a card (devtools/gpu_turns.py)

    def run(self, base_seed, out_of_memory=None):
        """Outcomes of one run. out_of_memory: a list that gets the error's message, instead of a
        crashed outcome, when the case runs out of GPU memory (the caller may run it again, alone;
        the error itself is not kept, as its traceback would keep the case's tensors alive)."""
        torch.manual_seed(base_seed ^ zlib.crc32(self.name.encode()))
        try:
            return self.fn(**self.kwargs)
        except Skip:
            raise
        except Exception as e:  # a crash is one failed case, and the script goes on
            if out_of_memory is not None and DEVICE == "cuda":
                from llmk.devtools.gpu_turns import is_out_of_memory

                if is_out_of_memory(e):
                    out_of_memory.append(str(e))
                    return []
            return [Outcome("(crashed)", False, note=f"{type(e).__name__}: {e}"[:120])]

    def run_on_shared_gpu(self, base_seed):
        """(outcomes, skip reason or None) on a GPU that other test scripts may be using: in a turn
        (devtools/gpu_turns.py), alone if it declares most of the card or ran out of memory beside
        other scripts' cases. A case larger than the card is skipped; one whose turn never came
        fails."""
        from llmk.devtools import gpu_turns

        if self.gpu_gb is not None and gpu_turns.too_big(self.gpu_gb):
            return [], gpu_turns.too_big(self.gpu_gb)
        alone = gpu_turns.needs_the_card(self.gpu_gb)
        oom = []
        with gpu_turns.turn(alone) as waited:
            if waited:
                return [Outcome("(no turn on the GPU)", False, note=waited)], None
            outcomes = self.run(base_seed, None if alone else oom)
        if oom:
            with gpu_turns.turn(True) as waited:
                if waited:
                    return [Outcome("(no turn on the GPU)", False, note=f"{waited}, after: {oom[0]}"[:120])], None
                outcomes = self.run(base_seed)
        return outcomes, None

    def run_or_skip(self, base_seed):
        """(outcomes, skip reason or None): on a GPU in a turn (run_on_shared_gpu), else run."""
        try:
            return self.run_on_shared_gpu(base_seed) if DEVICE == "cuda" else (self.run(base_seed), None)
        except Skip as skip:
            return [], str(skip)

    def check(self):
        """pytest entry point: raise AssertionError naming every failed output (pytest's skip for
        a case that raises Skip)."""
        try:
            outcomes = self.run(base_seed())
        except Skip as skip:
            import pytest

            pytest.skip(str(skip))
        failed = [o for o in outcomes if not o.passed]
        assert not failed, "; ".join(f"{o.check}: bad {o.bad} first {o.first_bad} {o.note}" for o in failed)


def shape_case(fn, shape, dtype, gpu_only=False, **extra):
    """A Case named "(shape) dtype key=value ..." that calls fn(shape=, dtype=, **extra)."""
    label = " ".join(f"{k}={dtype_name(v) if isinstance(v, torch.dtype) else v}" for k, v in extra.items())
    return Case(
        f"{tuple(shape)} {dtype_name(dtype)} {label}".strip(), fn, dict(shape=shape, dtype=dtype, **extra), gpu_only
    )


def base_seed():
    """TEST_SEED=<int> reruns a failure with the same inputs; otherwise every run draws new ones."""
    if "TEST_SEED" not in os.environ:
        os.environ["TEST_SEED"] = str(random.randrange(2**31))
    return int(os.environ["TEST_SEED"])


def select_cases(cases):
    """The interpreter tier (small shapes) on the CPU; every case on a GPU."""
    return [c for c in cases if not (INTERPRET and c.gpu_only)]


def interpreter_dtype(index, dtypes=(torch.float16, torch.bfloat16)):
    """The dtype the interpreter runs the index-th case of a list in, where a GPU runs each case in
    every one of `dtypes`: dtypes[index % len(dtypes)]; a test marks the case's other dtypes
    gpu_only (gpu_only=dtype != interpreter_dtype(i)). Consecutive cases alternate, so each dtype
    still meets every kind of case in the list. For kernels whose masks, tiles and loops do not
    depend on the dtype (it changes the element type of their loads, products and stores): an
    interpreted program costs the same in either, and a second dtype doubles the time of the list
    without reaching another branch."""
    return dtypes[index % len(dtypes)]


def one_dtype_here(cases, dtype, fns=None, dtypes=(torch.float16, torch.bfloat16)):
    """interpreter_dtype over a list: `cases` are the cases of `dtype` of a list made alike for each
    of `dtypes` (one loop over them); those the interpreter would run (with `fns`, those whose fn is
    one of them) run there in one dtype each, alternating down the list, and the rest are marked
    gpu_only. Every case of the list still runs once in the interpreter, and all of them on a GPU."""
    listed = [c for c in cases if not c.gpu_only and (fns is None or c.fn in fns)]
    for i, case in enumerate(listed):
        case.gpu_only = dtype != interpreter_dtype(i, dtypes)


def _fmt(x):
    return "" if isinstance(x, float) and math.isnan(x) else (f"{x:.3g}" if isinstance(x, float) else x)


def count_line(n_pass, n_fail, n_skip=0, skip_reason=None):
    """The closing line run_tests reads: `N passed, M failed[, K skipped (reason)]`."""
    return f"{n_pass} passed, {n_fail} failed" + (f", {n_skip} skipped ({skip_reason})" if n_skip else "")


# torch.compile's backend in tests and smoke benchmarks: Inductor on a GPU; in the interpreter
# aot_eager, whose Dynamo and AOTAutograd trace the same graphs (a graph break or a fake-tensor error
# still shows) without Inductor's C++ builds on the CPU
COMPILE_BACKEND = "aot_eager" if INTERPRET else "inductor"
STRIDE_ENV = "LLMK_TEST_STRIDE"
SHARD_ENV = "LLMK_TEST_SHARD"


def case_stride():
    """LLMK_TEST_STRIDE (default 1): run one case in that many of each script (every stride-th from
    an offset the run's TEST_SEED picks), the rest counted as skipped. CI's newest-versions lane
    takes 10: a new release's breakage shows in many cases, and the pinned lane runs them all.
    pytest runs every case whatever it says."""
    text = os.environ.get(STRIDE_ENV, "1")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{STRIDE_ENV} must be a positive integer, got {text!r}")
    return int(text)


def case_shard():
    """LLMK_TEST_SHARD=i/n (default 1/1): this process runs cases i, i + n, i + 2n, ... (counting
    from 1) of the script's chosen ones, and says nothing of the others: `make test` runs its
    longest scripts as n processes at once (scripts/run_tests.py SHARDS), whose counts add up to
    the script's."""
    text = os.environ.get(SHARD_ENV, "1/1")
    i, _, n = text.partition("/")
    if not (i.isdigit() and n.isdigit() and 1 <= int(i) <= int(n)):
        raise ValueError(f"{SHARD_ENV} must read i/n with 1 <= i <= n, got {text!r}")
    return int(i), int(n)


def run_cases(title, cases, skip_reason=None):
    """Run the tier's cases with a progress line each, print the table and the count; return the
    exit code (1 if any case failed, or if no case ran and there is no skip_reason).

    skip_reason: why none of `cases` can run on this machine (a short phrase, e.g. "no CUDA
    toolchain"); every case then counts as skipped and none runs."""
    from tabulate import tabulate

    shard, shards = case_shard()
    if shards > 1:  # the shard's own cases: the counts of a script's shards add up to the script's
        cases = cases[shard - 1 :: shards]
        title = f"{title} ({SHARD_ENV}={shard}/{shards})"
    if skip_reason is not None:
        print(f"{title}: {len(cases)} cases skipped: {skip_reason}")
        print(count_line(0, 0, len(cases), skip_reason), flush=True)
        return 0
    problem = interpreter_problem()
    if problem:
        print(f"{title}: not run: {problem}")
        print(count_line(0, len(cases)), flush=True)
        return 1
    seed = base_seed()
    chosen = select_cases(cases)
    rows, n_pass, n_fail, skips = [], 0, 0, {}
    stride = case_stride()
    if stride > 1 and len(chosen) > 1:
        # from an offset the seed picks: a run's choice replays with its TEST_SEED, and runs differ,
        # so cases made in loops of `stride` do not always drop the same variant
        strided = chosen[seed % stride :: stride] or chosen[:1]
        skips[f"{STRIDE_ENV}={stride}: one case in {stride}"] = len(chosen) - len(strided)
        chosen = strided
    print(f"{title}: {len(chosen)} of {len(cases)} cases on {describe()}, TEST_SEED={seed}", flush=True)
    for i, case in enumerate(chosen, 1):
        t0 = time.perf_counter()
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        outcomes, skip = case.run_or_skip(seed)
        # the case's peak: what its gpu_gb should say, where that is a large share of the card
        peak = f", {torch.cuda.max_memory_allocated() / 1e9:.1f} GB" if DEVICE == "cuda" else ""
        if skip:
            skips[skip] = skips.get(skip, 0) + 1
            print(f"  [{i}/{len(chosen)}] {case.name} ... skipped: {skip}", flush=True)
            continue
        ok = all(o.passed for o in outcomes) and bool(outcomes)
        n_pass, n_fail = n_pass + ok, n_fail + (not ok)
        print(
            f"  [{i}/{len(chosen)}] {case.name} ... {'PASS' if ok else 'FAIL'} ({time.perf_counter() - t0:.1f}s{peak})",
            flush=True,
        )
        for o in outcomes:
            rows.append(
                [
                    case.name,
                    o.check,
                    _fmt(o.max_abs),
                    _fmt(o.max_rel),
                    o.bad,
                    o.first_bad,
                    o.limit,
                    _fmt(o.torch_err),
                    "PASS" if o.passed else "FAIL",
                    o.note,
                ]
            )
    print(
        tabulate(
            rows,
            headers=[
                "case",
                "check",
                "max abs",
                "max rel",
                "bad",
                "first bad",
                "tolerance",
                "torch err",
                "result",
                "note",
            ],
        )
    )
    if not chosen and shards == 1:
        print(f"{title}: no case ran, and no reason to skip was given")
    print(count_line(n_pass, n_fail, sum(skips.values()), "; ".join(skips)), flush=True)
    return 1 if n_fail or not (chosen or shards > 1) else 0


USAGE_EPILOG = """environment:
  TEST_SEED=<int>   replay a run's random inputs (each run prints the seed it drew)
  LLMK_TEST_STRIDE=<n>
                    run one case in n (the rest count as skipped; CI's newest-versions lane)
  LLMK_TEST_SHARD=<i>/<n>
                    run cases i, i + n, ... only (`make test` splits its longest scripts so)
  TRITON_INTERPRET=1
                    force Triton's interpreter (the default without a CUDA device)

Without a CUDA device the interpreter runs the small-shape cases; cases marked gpu_only need a GPU.
The same cases run under pytest: `pytest path/to/test_x.py -k WORD`."""


def parse_args(title, argv):
    """The command line of every test script: --help, -k (a case filter) and --list."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else None,
        description=f"Run the {title} test cases and print a PASS/FAIL table; the last line reads "
        "`N passed, M failed`, and the exit code is 1 if any case failed.",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-k",
        dest="keyword",
        action="append",
        default=[],
        metavar="WORD",
        help="run only the cases whose name contains WORD (repeat: a case matching any)",
    )
    parser.add_argument("--list", action="store_true", help="list the cases' names and exit")
    return parser.parse_args(argv)


def filter_cases(cases, keywords):
    """The cases whose name contains one of `keywords` (all of them when there is none)."""
    return [c for c in cases if not keywords or any(k in c.name for k in keywords)]


def main(title, cases, skip_reason=None, argv=None):
    """A test script's entry point: parse its command line (`--help` prints the usage), run the
    chosen cases and exit with run_cases' code."""
    args = parse_args(title, sys.argv[1:] if argv is None else argv)
    chosen = filter_cases(cases, args.keyword)
    if args.list:
        print("\n".join(c.name + (" (gpu_only)" if c.gpu_only else "") for c in chosen))
        sys.exit(0)
    if args.keyword and not chosen:
        print(f"{title}: no case name contains {' or '.join(map(repr, args.keyword))}; --list shows them")
        sys.exit(1)
    if args.keyword and INTERPRET and all(c.gpu_only for c in chosen):  # chosen, but none runs here
        print(f"{title}: the {len(chosen)} chosen cases are gpu_only: a CUDA GPU runs them")
        print(count_line(0, 0, len(chosen), "gpu_only: needs a CUDA GPU"), flush=True)
        sys.exit(0)
    sys.exit(run_cases(title, chosen, skip_reason))
