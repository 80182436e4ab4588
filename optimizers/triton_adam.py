"""Fused AdamW in Triton: one kernel launch per step (and param dtype) over every param of every group.

Per element, in fp32 and in torch.optim.AdamW's order of operations (see optimizers/reference_adam.py):

    w = w * (1 - lr * weight_decay)
    m = lerp(m, g, 1 - beta1)
    v = v * beta2 + (1 - beta2) * g * g
    w = w - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)

The per-param scalars are computed on the host in float64 and rounded to fp32, as PyTorch does
with its Python-number arguments; sqrt and the divisions round to nearest (sqrt_rn, div_rn) like
PyTorch's kernels, so the result agrees with torch.optim.AdamW to an ulp or two per step.

m and v are kept in fp32 by default (state_dtype=torch.float32), also for bf16 params; with
state_dtype=None they take each param's dtype, as torch.optim.AdamW keeps them (bf16 m and v for
bf16 params, 4 bytes a param less), and the math still runs in fp32 between a load and a store.
fp32 is the default because of beta2: v moves by (1 - beta2) = 0.1% of itself a step, below half
a bf16 ulp (2^-9 = 0.2%), so a bf16 v rounds back to where it was: it never decays, and it grows
only when g^2 exceeds it about 3x. m (1 - beta1 = 10% a step) rounds well enough.

Bytes moved per element: read w, g, m, v, write w, m, v: 28 for fp32 params; 22 for bf16 params
with fp32 m and v; 14 for bf16 params and state.

Launch: the params are cut into blocks of BLOCK elements and program i updates block i, so a list
of hundreds of small tensors costs one launch. Tables on the device say where a program works:
- the block table (tensor index, block index within it), which depends only on the param sizes;
- the address table: addresses of w, g, m, v, the size and an alignment flag of each tensor. Its
  content is its cache key, and grads usually come back at the same addresses after zero_grad(),
  so it is uploaded only when an address changes;
- the AdamW scalars (lr, bias corrections, ...): passed by value when every tensor of the launch
  shares one group and step count, the usual case, and uploaded as a per-tensor table otherwise.
A step with nothing new to upload does no host-to-device copy, which keeps small steps cheap.

The launch is the operator llmk::adamw_step (common/ops.py): lists of params, grads, m and v, and
the hyperparameters with this step's count, shared or per param. TritonAdamW keeps the checks that
name a param, the state and the step counts. Below ~10M params a step is bound by its host work
(on the H100's host torch's fused AdamW spends 50-100 us a step), so the hot path is kept short:
one test of the usual case per param before the checks that name it, no second check of the
same lists inside the operator (_checked_adamw_step_op), the launch tables found by one lookup,
the compiled kernel launched without JITFunction.run's argument binding (_launch), and torch's
profiler label around step() opened only while a profiler runs (profile_hook_step).
docs/tuning/optimizers.md has the figures.

DTensor params (FSDP2's fully_shard): each rank updates its own shards, with m and v made and
kept as DTensors placed like their params (as torch.optim.AdamW keeps them, for distributed
checkpoints).

Limits: params fp32 or bf16, m and v fp32 or bf16, dense (contiguous or a permutation of
contiguous), on the kernel device; dense grads only; amsgrad, maximize, capturable and
differentiable are refused; foreach and fused are accepted and ignored (this is the fused path).
step() does not compile under torch.compile: Dynamo sets capturable=True in the param groups, and
the step counts are read on the host (the operator itself compiles, functionalized).
"""

import functools

import torch
import triton
import triton.language as tl
from torch.optim import optimizer as torch_optimizer

from llmk.common.device import DEVICE, INTERPRET
from llmk.common.direct_launch import run_compiled
from llmk.common.ops import Op, define_op, no_outputs

# (BLOCK elements a program, num_warps) per param dtype. fp32: 8 values a thread per array (two
# 16-byte loads each of w, g, m, v); 2048 would need enough registers to nearly halve the programs
# an SM. bf16 takes 2048 so that its w and g loads are 16 bytes too. Sized from the registers of
# the kernel compiled for sm_90 (H100, H200), not swept: docs/tuning/optimizers.md.
CONFIGS = {torch.float32: (1024, 4), torch.bfloat16: (2048, 4)}
ADDR_COLS = 6  # tensor table, int64: w, g, m, v addresses, numel, 1 if all four 16-byte aligned
SCALAR_COLS = 8  # tensor table, fp32: see _scalars()
HYPER_COLS = 6  # llmk::adamw_step's hyper, per param or shared: lr, beta1, beta2, eps, weight_decay, step
PARAM_DTYPES = (torch.float32, torch.bfloat16)
_PARAM_DTYPE_SET = _STATE_DTYPE_SET = frozenset(PARAM_DTYPES)  # m and v: the same two dtypes
# torch.optim.AdamW options this kernel does not implement, with the one value it takes; they stay
# in the param groups so that state dicts load into either optimizer
FIXED_OPTIONS = {
    "amsgrad": False,
    "maximize": False,
    "capturable": False,
    "differentiable": False,
    "decoupled_weight_decay": True,
}
_FIXED_VALUES = tuple(FIXED_OPTIONS.values())
_PLAIN_NUMBERS = frozenset((float, int))  # not bool, which _number refuses
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # not a DTensor (FSDP2's params) or another subclass


@triton.jit
def _adamw_block(
    row,
    start,
    numel,
    decay,
    lerp_weight,
    beta2,
    one_minus_beta2,
    bc2_sqrt,
    eps,
    neg_step_size,
    PARAM_BF16: tl.constexpr,
    STATE_BF16: tl.constexpr,
    SIZE: tl.constexpr,
    FAST: tl.constexpr,
):
    """Elements [start, start + SIZE) of one tensor; row is its row of the address table, the
    scalars are its columns of _scalars(). FAST: all SIZE elements exist and w, g, m, v are
    16-byte aligned."""
    param_ty = tl.bfloat16 if PARAM_BF16 else tl.float32
    state_ty = tl.bfloat16 if STATE_BF16 else tl.float32
    w_ptr = tl.load(row + 0).to(tl.pointer_type(param_ty))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(param_ty))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(state_ty))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(state_ty))
    offs = start + tl.arange(0, SIZE)
    if FAST:
        # the host checked the alignment; an address loaded from memory carries no such fact,
        # and without it the compiler emits 4-byte accesses instead of 16-byte ones
        w_ptr = tl.multiple_of(w_ptr, 16)
        g_ptr = tl.multiple_of(g_ptr, 16)
        m_ptr = tl.multiple_of(m_ptr, 16)
        v_ptr = tl.multiple_of(v_ptr, 16)
        mask = None
        other = None
    else:
        mask = offs < numel
        other = 0.0
    # every value is read once and written once: keep them from evicting the tables from L2
    w = tl.load(w_ptr + offs, mask=mask, other=other, eviction_policy="evict_first").to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=other, eviction_policy="evict_first").to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=other, eviction_policy="evict_first").to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask, other=other, eviction_policy="evict_first").to(tl.float32)
    w = w * decay
    # torch.lerp's two formulas, picked by the weight, so m rounds as PyTorch's does
    m = tl.where(lerp_weight < 0.5, m + lerp_weight * (g - m), g - (g - m) * (1.0 - lerp_weight))
    v = v * beta2 + one_minus_beta2 * (g * g)
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    w = w + neg_step_size * tl.div_rn(m, denom)
    tl.store(w_ptr + offs, w.to(param_ty), mask=mask)
    tl.store(m_ptr + offs, m.to(state_ty), mask=mask)
    tl.store(v_ptr + offs, v.to(state_ty), mask=mask)


@triton.jit
def _adamw_kernel(
    # tables
    block_table,   # int32 (n_blocks, 2): tensor index, block index within that tensor
    addr_table,    # int64 (n_tensors, ADDR_COLS): w, g, m, v addresses, numel, aligned flag
    scalar_table,  # fp32 (n_tensors, SCALAR_COLS): per-tensor AdamW scalars, see _scalars()
    # the scalars of every tensor when they are all the same (UNIFORM), by value
    decay, lerp_weight, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size,
    # meta-parameters
    PARAM_BF16: tl.constexpr, STATE_BF16: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr,
    ADDR_COLS: tl.constexpr, SCALAR_COLS: tl.constexpr, UNIFORM: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    t = tl.load(block_table + 2 * pid).to(tl.int64)
    start = tl.load(block_table + 2 * pid + 1).to(tl.int64) * BLOCK  # 64-bit: tensors past 2^31
    row = addr_table + t * ADDR_COLS
    numel = tl.load(row + 4)
    aligned = tl.load(row + 5)
    if not UNIFORM:  # groups or step counts differ: this tensor's columns of _scalars()
        s = scalar_table + t * SCALAR_COLS
        decay = tl.load(s + 0)
        lerp_weight = tl.load(s + 1)
        beta2 = tl.load(s + 2)
        one_minus_beta2 = tl.load(s + 3)
        bc2_sqrt = tl.load(s + 4)
        eps = tl.load(s + 5)
        neg_step_size = tl.load(s + 6)
    if (aligned != 0) & (start + BLOCK <= numel):
        _adamw_block(
            row,
            start,
            numel,
            decay,
            lerp_weight,
            beta2,
            one_minus_beta2,
            bc2_sqrt,
            eps,
            neg_step_size,
            PARAM_BF16,
            STATE_BF16,
            BLOCK,
            FAST=True,
        )
    else:
        # a tensor's last block, or an unaligned view: masked 4-byte accesses, each holding a
        # 64-bit address, so in TAIL pieces that need no more registers than the fast path
        for sub in range(start, tl.minimum(start + BLOCK, numel), TAIL):
            _adamw_block(
                row,
                sub,
                numel,
                decay,
                lerp_weight,
                beta2,
                one_minus_beta2,
                bc2_sqrt,
                eps,
                neg_step_size,
                PARAM_BF16,
                STATE_BF16,
                TAIL,
                FAST=False,
            )


# Device tables, cached by content on the host and shared by every optimizer, so a table is right
# whenever its key is found: the block tables by the tensors' sizes, and the (block table, address
# table) pair of a launch by its address table's rows. CACHE_SIZE entries of each cover a few
# optimizers, each with a few patterns of missing grads, before an upload repeats.
CACHE_SIZE = 16
_BLOCK_TABLES, _LAUNCH_TABLES = {}, {}
_COMPILED = {}  # (device, num_warps, constexpr values) -> _adamw_kernel compiled for them, see _launch
CONSTEXPR_NAMES = ("PARAM_BF16", "STATE_BF16", "BLOCK", "TAIL", "ADDR_COLS", "SCALAR_COLS", "UNIFORM")


def _remember(cache, key, value):
    if len(cache) >= CACHE_SIZE:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def _block_table(device, block, numels):
    """((n_blocks, 2) int32 on `device`: tensor index and block index within it for every block of
    BLOCK elements, n_blocks). It depends on the sizes alone, not on which tensors, so a training
    loop builds it once, or once per pattern of missing grads."""
    key = (device, block, numels)
    table = _BLOCK_TABLES.get(key)
    if table is None:
        counts = torch.tensor([-(-n // block) for n in numels])
        first = torch.cumsum(counts, 0) - counts
        tensor_index = torch.repeat_interleave(torch.arange(len(numels)), counts)
        block_index = torch.arange(int(counts.sum())) - torch.repeat_interleave(first, counts)
        blocks = torch.stack([tensor_index, block_index], dim=1).to(torch.int32)
        table = _remember(_BLOCK_TABLES, key, (_to_device(blocks, device), blocks.shape[0]))
    return table


def _launch_tables(device, block, rows):
    """(block table, n_blocks, address table) of a launch: rows are the address table's
    (n_tensors, ADDR_COLS) int64 content. Grads usually come back at the same addresses step after
    step (zero_grad, then backward), so the upload is rare."""
    key = (device, block, rows)
    tables = _LAUNCH_TABLES.get(key)
    if tables is None:
        blocks, n_blocks = _block_table(device, block, tuple(row[4] for row in rows))
        addr_table = _to_device(torch.tensor(rows, dtype=torch.int64), device)
        tables = _remember(_LAUNCH_TABLES, key, (blocks, n_blocks, addr_table))
    return tables


def _tensors_error(i, p, g, m, v, device, dtype, state_dtype):
    """The error for tensor i of an llmk::adamw_step call that failed its fast check, or None."""
    if p.dtype != dtype or g.dtype != dtype or m.dtype != state_dtype or v.dtype != state_dtype:
        return TypeError(
            f"adamw_step: tensor {i}: expected params and grads of {dtype}, m and v of "
            f"{state_dtype} (the first param's and state's); got {p.dtype}, {g.dtype}, "
            f"{m.dtype}, {v.dtype}"
        )
    if not p.device == g.device == m.device == v.device == device:
        return ValueError(f"adamw_step: tensor {i}: every tensor must be on {device} (the first param's)")
    if not p.shape == g.shape == m.shape == v.shape:
        return ValueError(
            f"adamw_step: tensor {i}: grad, exp_avg and exp_avg_sq must have the param's shape {tuple(p.shape)}"
        )
    if not (_is_dense(p) and _same_layout(m, p) and _same_layout(v, p)):
        return ValueError(
            f"adamw_step: tensor {i}: the param must be dense, exp_avg and exp_avg_sq in "
            f"its layout (strides {p.stride()})"
        )
    return None


def _adamw_step(params, grads, exp_avgs, exp_avg_sqs, hyper, checked=False):
    """One AdamW step in place on params, exp_avgs and exp_avg_sqs: one launch of `_adamw_kernel`.

    params: fp32 or bf16 tensors on one device, all of one dtype, dense. grads: shaped like their
    param, same dtype, any strides (one in another layout is copied first). exp_avgs, exp_avg_sqs:
    all fp32 or all bf16 (the math is fp32 either way), shaped and laid out like their param.
    hyper: (lr, beta1, beta2, eps, weight_decay,
    step) of every param, or those HYPER_COLS values for each param in turn; step counts this step
    (1 for the first).

    Checked here: what keeps the kernel inside the tensors' memory (lengths, one device and dtype,
    shapes, layouts). checked=True (TritonAdamW's eager calls, _checked_adamw_step_op) skips what
    its own checks, which name the param, have already made sure of.
    """
    n = len(params)
    if not len(grads) == len(exp_avgs) == len(exp_avg_sqs) == n:
        raise ValueError(
            f"adamw_step: params, grads, exp_avgs and exp_avg_sqs must have one length, got "
            f"{n}, {len(grads)}, {len(exp_avgs)}, {len(exp_avg_sqs)}"
        )
    if len(hyper) not in (HYPER_COLS, HYPER_COLS * n):
        raise ValueError(
            f"adamw_step: hyper must hold {HYPER_COLS} values (every param's) or {HYPER_COLS} "
            f"per param ({HYPER_COLS * n}), got {len(hyper)}"
        )
    if n == 0:
        return
    device, dtype = params[0].device, params[0].dtype
    if dtype not in CONFIGS:
        raise TypeError(f"adamw_step: params must be fp32 or bf16, got {dtype}")
    block, num_warps = CONFIGS[dtype]
    state_dtype = exp_avgs[0].dtype
    if state_dtype not in _STATE_DTYPE_SET:
        raise TypeError(f"adamw_step: exp_avgs and exp_avg_sqs must be fp32 or bf16, got {state_dtype}")
    rows, keep = [], []
    for i, (p, g, m, v) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        # the usual case in one test: contiguous tensors of the expected dtypes, shapes and device
        if not checked and not (
            p.dtype == g.dtype == dtype
            and m.dtype == v.dtype == state_dtype
            and p.shape == g.shape == m.shape == v.shape
            and p.device == g.device == m.device == v.device == device
            and p.is_contiguous()
            and m.is_contiguous()
            and v.is_contiguous()
        ):
            error = _tensors_error(i, p, g, m, v, device, dtype, state_dtype)
            if error is not None:
                raise error
        if not _same_layout(g, p):  # an expanded or transposed grad: one copy in p's layout
            g = torch.empty_like(p).copy_(g)
            keep.append(g)
        ptrs = (p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr())
        rows.append((*ptrs, p.numel(), int((ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3]) % 16 == 0)))
    torch.autograd.graph.increment_version([*params, *exp_avgs, *exp_avg_sqs])  # as in-place ops would
    blocks, n_blocks, addr_table = _launch_tables(device, block, tuple(rows))
    if n_blocks == 0:  # every tensor is empty
        return
    keys = None
    if len(hyper) > HYPER_COLS:
        keys = [tuple(hyper[i : i + HYPER_COLS]) for i in range(0, len(hyper), HYPER_COLS)]
        distinct = dict.fromkeys(keys)
        if len(distinct) == 1:
            keys = None
    if keys is None:  # the usual case: the scalars go by value, nothing is uploaded
        scalars, scalar_table = _scalars(*map(float, hyper[:HYPER_COLS]))[:7], addr_table  # the table is not read
    else:
        for key in distinct:  # params of one group at one step count share their scalars
            distinct[key] = _scalars(*key)
        host = torch.tensor([x for key in keys for x in distinct[key]], dtype=torch.float32)
        scalars, scalar_table = (0.0,) * 7, _to_device(host, device)
    constexprs = (
        dtype == torch.bfloat16,
        state_dtype == torch.bfloat16,
        block,
        block // 4,
        ADDR_COLS,
        SCALAR_COLS,
        keys is None,
    )
    _launch(device, n_blocks, (blocks, addr_table, scalar_table, *scalars), constexprs, num_warps)
    del keep  # grad copies are freed after the launch is queued (stream-ordered reuse)


def _launch(device, n_blocks, args, constexprs, num_warps):
    """One launch of _adamw_kernel over n_blocks programs. args: its tables and scalars;
    constexprs: its constexpr parameters' values, in order (CONSTEXPR_NAMES).

    From the second launch of a configuration on, the compiled kernel is launched directly, by the
    call that JITFunction.run makes once it has found the kernel in its cache (Triton 3.6 to 3.9).
    run's binding and specializing of every argument, which cannot change here (the tables are
    int32, int64 and int64/fp32 torch allocations, the scalars Python floats), cost 20 us of host
    time a step on the H100's host, the direct launch 10."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            return _launch(device, n_blocks, args, constexprs, num_warps)
    key = (device, num_warps, constexprs)
    kernel = _COMPILED.get(key)
    if kernel is None:
        kernel = _adamw_kernel[(n_blocks,)](*args, **dict(zip(CONSTEXPR_NAMES, constexprs)), num_warps=num_warps)
        if not INTERPRET:
            _COMPILED[key] = kernel
        return
    run_compiled(kernel, (n_blocks,), device.index, (*args, *constexprs))


adamw_step_op = define_op(
    "adamw_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
    "float[] hyper) -> ()",
    _adamw_step,
    no_outputs,
)
# TritonAdamW's eager calls: the same operator, whose implementation skips the checks that
# TritonAdamW has made already (a third of a 201-tensor step's host time). Under torch.compile or a
# dispatch mode the call goes through the dispatcher to adamw_step_op's checked implementation.
_checked_adamw_step_op = Op(adamw_step_op.name, functools.partial(_adamw_step, checked=True), adamw_step_op.overload)


class TritonAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW with its update done by the operator llmk::adamw_step (`_adamw_kernel`),
    one launch per step and param dtype.

    Same arguments, param groups, state layout (state[p] = {"step": CPU fp32 scalar tensor,
    "exp_avg", "exp_avg_sq"}) and state dicts as torch.optim.AdamW, so a run can move between the
    two mid-training. Params without a grad are skipped and keep their step count.

    state_dtype: the dtype of m and v: torch.float32 (the default, for every param: module
    docstring), torch.bfloat16, or None for each param's own dtype, as torch.optim.AdamW keeps them
    (bf16 params then keep bf16 m and v). A state dict carries either; a loaded state is converted.
    A step checks every param, grad and group first, and raises before it writes anything.
    """

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=1e-2,
        amsgrad=False,
        *,
        maximize=False,
        foreach=None,
        capturable=False,
        differentiable=False,
        fused=None,
        state_dtype=torch.float32,
    ):
        if state_dtype is not None and state_dtype not in _STATE_DTYPE_SET:
            raise TypeError(
                f"state_dtype must be torch.float32, torch.bfloat16 or None (each param's dtype), got {state_dtype!r}"
            )
        self.state_dtype = state_dtype
        defaults = dict(
            lr=lr,
            betas=tuple(betas) if isinstance(betas, list) else betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
        )
        _check_group(defaults, "")
        super().__init__(params, defaults)  # calls add_param_group, which checks every group

    @staticmethod
    def profile_hook_step(func):
        """torch.optim.Optimizer wraps every optimizer's step() in a profiler label and its step
        hooks (Optimizer._patch_step_function). This wrapper runs torch's whenever a profiler runs,
        a step hook is registered or torch.compile traces; otherwise it skips the label, whose
        record_function costs ~8 us of host time a step on the H100's host, a tenth of a small
        step."""
        hooked = torch.optim.Optimizer.profile_hook_step(func)

        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            if (
                torch.compiler.is_compiling()
                or torch.autograd._profiler_enabled()
                or self._optimizer_step_pre_hooks
                or self._optimizer_step_post_hooks
                or _global_step_hooks()
            ):
                return hooked(self, *args, **kwargs)
            out = func(self, *args, **kwargs)
            self._optimizer_step_code()  # where a profiler tracing Python finds the step
            return out

        return wrapper

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        group = self.param_groups[index]
        try:
            _check_group(group, f"param_groups[{index}]: ")
            for j, p in enumerate(group["params"]):
                _check_param(f"param_groups[{index}]['params'][{j}]", p)
        except (TypeError, ValueError):
            self.param_groups.pop()
            raise

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("state_dtype", torch.float32)  # pickled before the option existed
        for group in self.param_groups:  # as torch.optim.AdamW does for older state dicts
            for key, value in FIXED_OPTIONS.items():
                group.setdefault(key, value)
            group.setdefault("foreach", None)
            group.setdefault("fused", None)
            group["decoupled_weight_decay"] = True

    def load_state_dict(self, state_dict):
        """torch.optim.Optimizer's load, which casts m and v to each param's dtype; then m and v
        that this optimizer keeps in another dtype are taken again from the saved tensors (fp32 m
        and v of bf16 params come back unrounded), and step counts moved to the CPU (a fused
        torch.optim.AdamW keeps them on the GPU)."""
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, p in zip(saved_ids, params):
            state = self.state.get(p)
            if not state:
                continue
            saved = state_dict["state"].get(saved_id, {})
            wanted = self.state_dtype or p.dtype
            for key in ("exp_avg", "exp_avg_sq"):
                if p.dtype != wanted and isinstance(saved.get(key), torch.Tensor):
                    state[key] = saved[key].to(device=p.device, dtype=wanted)
            step = state.get("step")
            if step is not None and not (isinstance(step, torch.Tensor) and step.device.type == "cpu"):
                state["step"] = torch.tensor(float(step), dtype=_step_dtype(), device="cpu")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for (_, _, sharded), batch in self._collect().items():  # every check first: a bad input writes nothing
            self._update(*batch, sharded)
        return loss

    def _collect(self):
        """{(device, dtype, sharded): (params, grads, hyperparameters, states)} over the params
        with a grad, after checking every group, param, grad and existing state; a state is None
        where _state() has to make it (first step) or make it ready (a loaded one). sharded: the
        params are DTensors (their grads are; _check_placements made sure the rest are alike)."""
        batches = {}
        index = -1
        state = self.state
        for gi, group in enumerate(self.param_groups):
            hyper = _check_group(group, f"param_groups[{gi}]: ")
            for j, p in enumerate(group["params"]):
                index += 1
                g = p.grad
                if g is None:
                    continue
                p_state = state.get(p)  # not state[p]: a defaultdict's lookup makes an entry
                sharded = False
                if not _fits(p, g, p_state, self.state_dtype):  # then the checks that name the param
                    name = (index, gi, j)
                    _check_param(name, p)
                    _check_grad(name, p, g)
                    if p_state:
                        _check_state(name, p, p_state)
                    if type(g) is not torch.Tensor or type(p) not in _PLAIN_TENSORS:
                        sharded = _check_placements(name, p, g, p_state)
                    p_state = None  # made ready by _state()
                key = (p.device, p.dtype, sharded)
                batch = batches.get(key)
                if batch is None:
                    batch = batches[key] = ([], [], [], [])
                batch[0].append(p)
                batch[1].append(g)
                batch[2].append(hyper)
                batch[3].append(p_state or None)
        return batches

    def _state(self, p):
        """p's state, created at its first step, with m and v of state_dtype (p's dtype for None)
        and in p's memory layout."""
        state = self.state[p]
        wanted = self.state_dtype or p.dtype
        if not state:
            state["step"] = torch.tensor(0.0, dtype=_step_dtype(), device="cpu")
            state["exp_avg"] = torch.zeros_like(p, dtype=wanted, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=wanted, memory_format=torch.preserve_format)
            return state
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            if t.dtype != wanted or not _same_layout(t, p):
                state[key] = torch.empty_like(p, dtype=wanted).copy_(t)
        step = state["step"]
        if not isinstance(step, torch.Tensor) or step.device.type != "cpu":
            state["step"] = torch.tensor(float(step), dtype=_step_dtype(), device="cpu")
        return state

    def _update(self, params, grads, hypers, states, sharded=False):
        """One llmk::adamw_step for checked params of one device and dtype, with their grads,
        (lr, beta1, beta2, eps, weight_decay) tuples and states (None: not ready yet)."""
        states = [state or self._state(p) for p, state in zip(params, states)]
        steps = [state["step"] for state in states]
        # as torch.optim.AdamW does it: a tensor 1 is 4x faster than a Python 1 for CPU scalars
        torch._foreach_add_(steps, _one(steps[0].dtype), alpha=1.0)
        counts = [steps[0].item()] if len(steps) == 1 else torch.stack(steps).tolist()  # this step's, per param
        first = hypers[0]
        if all(h is first for h in hypers) and counts.count(counts[0]) == len(counts):
            hyper = [*first, counts[0]]  # one group, one step count: the usual case
        else:
            hyper = [x for h, c in zip(hypers, counts) for x in (*h, c)]
        tensors = params, grads, [state["exp_avg"] for state in states], [state["exp_avg_sq"] for state in states]
        if sharded:
            tensors = _local_shards(*tensors)
        _checked_adamw_step_op(*tensors, hyper=hyper)


_DTENSOR = []  # torch.distributed.tensor.DTensor once a step has met a tensor subclass, or None


def _dtensor_type():
    if not _DTENSOR:
        available = torch.distributed.is_available()
        if available:
            from torch.distributed.tensor import DTensor
        _DTENSOR.append(DTensor if available else None)
    return _DTENSOR[0]


def _local_shards(params, grads, exp_avgs, exp_avg_sqs):
    """The four lists with every DTensor (FSDP2's sharded params, their grads and the state made
    like them) replaced by this rank's shard. AdamW is elementwise, so each rank updating its
    shard in place is the whole step, whatever the placement, as long as the four tensors of a
    param are placed alike (_check_placements made sure of it)."""
    dtensor = _dtensor_type()
    lists = [list(x) for x in (params, grads, exp_avgs, exp_avg_sqs)]
    for values in lists:
        for i, t in enumerate(values):
            if dtensor is not None and isinstance(t, dtensor):
                values[i] = t._local_tensor  # the shard itself, not to_local()'s autograd view of it
    return lists


def _check_placements(name, p, g, state):
    """A DTensor param's grad, and its state where it has one, must be DTensors placed like it;
    a plain param takes plain tensors. Raises ValueError naming the param; returns whether p is
    a DTensor."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return False
    others = [g] + [state[k] for k in ("exp_avg", "exp_avg_sq") if state and isinstance(state.get(k), torch.Tensor)]
    if not isinstance(p, dtensor):
        if any(isinstance(t, dtensor) for t in others):
            raise ValueError(f"{_name(name)} is a plain tensor, but its grad or state is a DTensor")
        return False
    if any(
        not isinstance(t, dtensor) or t.placements != p.placements or t.device_mesh != p.device_mesh for t in others
    ):
        got = [getattr(t, "placements", type(t).__name__) for t in others]
        raise ValueError(
            f"{_name(name)} is a DTensor placed {p.placements}: its grad, exp_avg and exp_avg_sq must "
            f"be DTensors placed alike; got {got}"
        )
    return True


def _global_step_hooks():
    """True if a global optimizer step hook is registered, or if torch no longer keeps them where
    this looks (then torch's wrapper runs every step)."""
    pre = getattr(torch_optimizer, "_global_optimizer_pre_hooks", True)
    return bool(pre) or bool(getattr(torch_optimizer, "_global_optimizer_post_hooks", True))


_ONES = {}


def _one(dtype):
    """A CPU scalar tensor 1 of `dtype`, made once."""
    one = _ONES.get(dtype)
    if one is None:
        one = _ONES[dtype] = torch.ones((), dtype=dtype)
    return one


def _to_device(host, device):
    """Pinned and asynchronous, so the host does not wait for the GPU."""
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


def _scalars(lr, beta1, beta2, eps, weight_decay, step):
    """The SCALAR_COLS fp32 columns of one tensor, from float64 as torch.optim.AdamW computes them."""
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    return (
        1 - lr * weight_decay,
        1 - beta1,
        beta2,
        1 - beta2,
        bias_correction2**0.5,
        eps,
        -(lr / bias_correction1),
        0.0,
    )


def _step_dtype():
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _number(where, name, x):
    if isinstance(x, torch.Tensor):  # torch.optim.AdamW takes a 1-element tensor lr or betas
        if x.numel() != 1:
            raise ValueError(f"{where}{name} must be a number or a 1-element tensor, got shape {tuple(x.shape)}")
        return x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{where}{name} must be a number, got {type(x).__name__}")
    return float(x)


def _check_group(group, where):
    """Raise ValueError (TypeError for a non-number) naming the first bad hyperparameter or
    unsupported option of a param group; return (lr, beta1, beta2, eps, weight_decay)."""
    lr, betas, eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    # every step of a training loop: plain numbers in range and the fixed options at their values
    if (
        type(lr) in _PLAIN_NUMBERS
        and type(eps) in _PLAIN_NUMBERS
        and type(weight_decay) in _PLAIN_NUMBERS
        and type(betas) is tuple
        and len(betas) == 2
        and type(betas[0]) in _PLAIN_NUMBERS
        and type(betas[1]) in _PLAIN_NUMBERS
        and lr >= 0
        and 0 <= betas[0] < 1
        and 0 <= betas[1] < 1
        and eps >= 0
        and weight_decay >= 0
        and tuple(group.get(name) for name in FIXED_OPTIONS) == _FIXED_VALUES
    ):
        return float(lr), float(betas[0]), float(betas[1]), float(eps), float(weight_decay)
    for name, value in FIXED_OPTIONS.items():
        if group.get(name, value) != value:
            raise ValueError(f"{where}{name}={group[name]!r} is not supported by TritonAdamW (only {name}={value})")
    lr = _number(where, "lr", lr)
    if not lr >= 0:
        raise ValueError(f"{where}lr must be >= 0, got {lr}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{where}betas must be a pair (beta1, beta2), got {betas!r}")
    beta1, beta2 = (_number(where, f"betas[{i}]", b) for i, b in enumerate(betas))
    for i, b in enumerate((beta1, beta2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{where}betas[{i}] must be in [0, 1), got {b}")
    eps = _number(where, "eps", eps)
    if not eps >= 0:
        raise ValueError(f"{where}eps must be >= 0, got {eps}")
    weight_decay = _number(where, "weight_decay", weight_decay)
    if not weight_decay >= 0:
        raise ValueError(f"{where}weight_decay must be >= 0, got {weight_decay}")
    return lr, beta1, beta2, eps, weight_decay


def _name(where):
    """A param's name in messages: a string, or (index, group, position) of a param in a step,
    formatted only when a check fails."""
    if isinstance(where, str):
        return where
    index, gi, j = where
    return f"param {index} (param_groups[{gi}]['params'][{j}])"


def _fits(p, g, state, state_dtype):
    """The usual case of a step's param in one test, for the hot loop: p and g plain tensors (not
    DTensors), contiguous, of one supported dtype, on the kernel device, same shape; no state, or
    one ready for the kernel
    (m and v of state_dtype, or p's dtype for None, contiguous like p; a CPU step tensor). False
    sends the param through the checks that name it, and its state through _state()."""
    dtype, device = p.dtype, p.device
    if not (
        type(g) is torch.Tensor
        and type(p) in _PLAIN_TENSORS
        and dtype in _PARAM_DTYPE_SET
        and device.type == DEVICE
        and g.layout == torch.strided
        and g.dtype == dtype
        and g.device == device
        and g.shape == p.shape
        and p.is_contiguous()
    ):
        return False
    if not state:
        return True
    m, v, step = state.get("exp_avg"), state.get("exp_avg_sq"), state.get("step")
    return (
        type(m) is torch.Tensor
        and type(v) is torch.Tensor
        and type(step) is torch.Tensor
        and m.dtype == v.dtype == (state_dtype or dtype)
        and m.shape == p.shape == v.shape
        and m.device == device == v.device
        and m.is_contiguous()
        and v.is_contiguous()
        and step.is_cpu
    )


def _check_param(name, p):
    """name: a string or a (index, group, position) tuple, see _name()."""
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{_name(name)} must be a torch.Tensor, got {type(p).__name__}")
    if p.dtype not in PARAM_DTYPES:
        raise TypeError(f"{_name(name)} must have dtype fp32 or bf16; got {p.dtype}")
    if p.device.type != DEVICE:
        raise ValueError(f"{_name(name)} must be on the {DEVICE} device, got a tensor on {p.device}")
    if not _is_dense(p):
        raise ValueError(
            f"{_name(name)} must be dense (contiguous, or contiguous with its dims permuted); "
            f"got shape {tuple(p.shape)} with strides {p.stride()}"
        )


def _check_grad(name, p, g):
    if g.layout != torch.strided:
        raise ValueError(
            f"{_name(name)} has a sparse grad ({g.layout}); AdamW needs dense grads "
            "(torch.optim.SparseAdam takes sparse ones)"
        )
    if g.shape != p.shape:
        raise ValueError(f"{_name(name)}: grad shape {tuple(g.shape)} differs from the param's shape {tuple(p.shape)}")
    if g.dtype != p.dtype:
        raise TypeError(f"{_name(name)}: grad dtype {g.dtype} differs from the param's dtype {p.dtype}")
    if g.device != p.device:
        raise ValueError(f"{_name(name)}: grad is on {g.device} but the param is on {p.device}")


def _check_state(name, p, state):
    """State loaded from elsewhere must fit its param; m and v of another dtype are converted later."""
    for key in ("step", "exp_avg", "exp_avg_sq"):
        if key not in state:
            raise ValueError(f"{_name(name)}: optimizer state lacks {key!r} (not an Adam/AdamW state?)")
    for key in ("exp_avg", "exp_avg_sq"):
        t = state[key]
        if not isinstance(t, torch.Tensor) or t.shape != p.shape or t.device != p.device or not t.is_floating_point():
            raise ValueError(
                f"{_name(name)}: state {key!r} must be a float tensor of shape {tuple(p.shape)} "
                f"on {p.device}, like the param"
            )


def _is_dense(t):
    """No gaps and no overlaps: a permutation of a contiguous layout."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _same_layout(t, p):
    """t (shaped like p) walks its memory in p's order, so one flat index addresses both."""
    return (t.is_contiguous() and p.is_contiguous()) or (t.stride() == p.stride() and _is_dense(t))
