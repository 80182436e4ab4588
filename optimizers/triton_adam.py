"""Fused AdamW in Triton: one kernel launch per step (and param dtype) over every param of every group.

Per element, in fp32 and in torch.optim.AdamW's order of operations (see optimizers/adam.py):

    w = w * (1 - lr * weight_decay)
    m = lerp(m, g, 1 - beta1)
    v = v * beta2 + (1 - beta2) * g * g
    w = w - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)

The per-param scalars are computed on the host in float64 and rounded to fp32, as PyTorch does
with its Python-number arguments; sqrt and the divisions round to nearest (sqrt_rn, div_rn) like
PyTorch's kernels, so the result agrees with torch.optim.AdamW to an ulp or two per step.

Bytes moved per element: read w, g, m, v, write w, m, v: 28 for fp32 params; 22 for bf16 params
(w and g bf16, m and v fp32).

Launch: the params are cut into blocks of BLOCK elements and program i updates block i, so a list
of hundreds of small tensors costs one launch. Tables on the device say where a program works:
- the block table (tensor index, block index within it), which depends only on the param sizes;
- the address table: addresses of w, g, m, v, the size and an alignment flag of each tensor. Its
  content is its cache key, and grads usually come back at the same addresses after zero_grad(),
  so it is uploaded only when an address changes;
- the AdamW scalars (lr, bias corrections, ...): passed by value when every tensor of the launch
  shares one group and step count, the usual case, and uploaded as a per-tensor table otherwise.
A step with nothing new to upload does no host-to-device copy, which keeps small steps cheap.

Limits: params fp32 or bf16 (m and v in fp32 either way), dense (contiguous or a permutation of
contiguous), on the kernel device; dense grads only; amsgrad, maximize, capturable and
differentiable are refused; foreach and fused are accepted and ignored (this is the fused path).
"""
import contextlib

import common  # noqa: F401  (interpreter switch before triton is imported)
import torch
import triton
import triton.language as tl

from common.device import DEVICE

# (BLOCK elements a program, num_warps) per param dtype. fp32: 8 values a thread per array (two
# 16-byte loads each of w, g, m, v); 2048 would need enough registers to nearly halve the programs
# an SM. bf16 takes 2048 so that its w and g loads are 16 bytes too. Sized from the registers of
# the kernel compiled for sm_90 (H100, H200), not swept: docs/tuning/optimizers.md.
CONFIGS = {torch.float32: (1024, 4), torch.bfloat16: (2048, 4)}
ADDR_COLS = 6    # tensor table, int64: w, g, m, v addresses, numel, 1 if all four 16-byte aligned
SCALAR_COLS = 8  # tensor table, fp32: see _scalars()
PARAM_DTYPES = (torch.float32, torch.bfloat16)
# torch.optim.AdamW options this kernel does not implement, with the one value it takes; they stay
# in the param groups so that state dicts load into either optimizer
FIXED_OPTIONS = {"amsgrad": False, "maximize": False, "capturable": False, "differentiable": False,
                 "decoupled_weight_decay": True}


@triton.jit
def _adamw_block(row, start, numel, decay, lerp_weight, beta2, one_minus_beta2, bc2_sqrt, eps,
                 neg_step_size, PARAM_BF16: tl.constexpr, SIZE: tl.constexpr, FAST: tl.constexpr):
    """Elements [start, start + SIZE) of one tensor; row is its row of the address table, the
    scalars are its columns of _scalars(). FAST: all SIZE elements exist and w, g, m, v are
    16-byte aligned."""
    param_ty = tl.bfloat16 if PARAM_BF16 else tl.float32
    w_ptr = tl.load(row + 0).to(tl.pointer_type(param_ty))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(param_ty))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
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
    m = tl.load(m_ptr + offs, mask=mask, other=other, eviction_policy="evict_first")
    v = tl.load(v_ptr + offs, mask=mask, other=other, eviction_policy="evict_first")
    w = w * decay
    # torch.lerp's two formulas, picked by the weight, so m rounds as PyTorch's does
    m = tl.where(lerp_weight < 0.5, m + lerp_weight * (g - m), g - (g - m) * (1.0 - lerp_weight))
    v = v * beta2 + one_minus_beta2 * (g * g)
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    w = w + neg_step_size * tl.div_rn(m, denom)
    tl.store(w_ptr + offs, w.to(param_ty), mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


@triton.jit
def _adamw_kernel(
    # tables
    block_table,   # int32 (n_blocks, 2): tensor index, block index within that tensor
    addr_table,    # int64 (n_tensors, ADDR_COLS): w, g, m, v addresses, numel, aligned flag
    scalar_table,  # fp32 (n_tensors, SCALAR_COLS): per-tensor AdamW scalars, see _scalars()
    # the scalars of every tensor when they are all the same (UNIFORM), by value
    decay, lerp_weight, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size,
    # meta-parameters
    PARAM_BF16: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr,
    ADDR_COLS: tl.constexpr, SCALAR_COLS: tl.constexpr, UNIFORM: tl.constexpr,
):
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
        _adamw_block(row, start, numel, decay, lerp_weight, beta2, one_minus_beta2, bc2_sqrt, eps,
                     neg_step_size, PARAM_BF16, BLOCK, FAST=True)
    else:
        # a tensor's last block, or an unaligned view: masked 4-byte accesses, each holding a
        # 64-bit address, so in TAIL pieces that need no more registers than the fast path
        for sub in range(start, tl.minimum(start + BLOCK, numel), TAIL):
            _adamw_block(row, sub, numel, decay, lerp_weight, beta2, one_minus_beta2, bc2_sqrt, eps,
                         neg_step_size, PARAM_BF16, TAIL, FAST=False)


class TritonAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW with its update done by `_adamw_kernel`, one launch per step and param dtype.

    Same arguments, param groups, state layout (state[p] = {"step": CPU fp32 scalar tensor,
    "exp_avg", "exp_avg_sq"}) and state dicts as torch.optim.AdamW, so a run can move between the
    two mid-training. Params without a grad are skipped and keep their step count. bf16 params
    keep m and v in fp32 (torch's AdamW keeps them in bf16; a state dict carries either).
    A step checks every param, grad and group first, and raises before it writes anything.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        defaults = dict(lr=lr, betas=tuple(betas) if isinstance(betas, list) else betas, eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        foreach=foreach, capturable=capturable, differentiable=differentiable,
                        fused=fused, decoupled_weight_decay=True)
        _check_group(defaults, "")
        self._block_tables, self._addr_tables = {}, {}
        super().__init__(params, defaults)  # calls add_param_group, which checks every group

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
        self._block_tables = getattr(self, "_block_tables", {})
        self._addr_tables = getattr(self, "_addr_tables", {})
        for group in self.param_groups:  # as torch.optim.AdamW does for older state dicts
            for key, value in FIXED_OPTIONS.items():
                group.setdefault(key, value)
            group.setdefault("foreach", None)
            group.setdefault("fused", None)
            group["decoupled_weight_decay"] = True

    def load_state_dict(self, state_dict):
        """torch.optim.Optimizer's load, which casts m and v to each param's dtype; then m and v of
        bf16 params are taken again from the saved tensors, in fp32, and step counts moved to the
        CPU (a fused torch.optim.AdamW keeps them on the GPU)."""
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, p in zip(saved_ids, params):
            state = self.state.get(p)
            if not state:
                continue
            saved = state_dict["state"].get(saved_id, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if p.dtype != torch.float32 and isinstance(saved.get(key), torch.Tensor):
                    state[key] = saved[key].to(device=p.device, dtype=torch.float32)
            step = state.get("step")
            if step is not None and not (isinstance(step, torch.Tensor) and step.device.type == "cpu"):
                state["step"] = torch.tensor(float(step), dtype=_step_dtype(), device="cpu")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for items in self._collect().values():  # every check first: a bad input writes nothing
            self._update(items)
        return loss

    def _collect(self):
        """{(device, dtype): [(param, grad, hyperparameters)]} over the params with a grad, after
        checking every group, param, grad and existing state."""
        batches = {}
        index = -1
        for gi, group in enumerate(self.param_groups):
            hyper = _check_group(group, f"param_groups[{gi}]: ")
            for j, p in enumerate(group["params"]):
                index += 1
                g = p.grad
                if g is None:
                    continue
                name = f"param {index} (param_groups[{gi}]['params'][{j}])"
                _check_param(name, p)
                _check_grad(name, p, g)
                state = self.state.get(p)
                if state:
                    _check_state(name, p, state)
                batches.setdefault((p.device, p.dtype), []).append((p, g, hyper))
        return batches

    def _state(self, p):
        """p's state, created at its first step, with m and v in fp32 and in p's memory layout."""
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=_step_dtype(), device="cpu")
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
            return state
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            if t.dtype != torch.float32 or not _same_layout(t, p):
                state[key] = torch.empty_like(p, dtype=torch.float32).copy_(t)
        if not isinstance(state["step"], torch.Tensor) or state["step"].device.type != "cpu":
            state["step"] = torch.tensor(float(state["step"]), dtype=_step_dtype(), device="cpu")
        return state

    def _update(self, items):
        """One launch for checked params of one device and dtype: [(param, grad, hyperparameters)]."""
        device, dtype = items[0][0].device, items[0][0].dtype
        block, num_warps = CONFIGS[dtype]
        states = [self._state(p) for p, _, _ in items]
        steps = [state["step"] for state in states]
        counts = [c + 1 for c in torch.stack(steps).tolist()]  # this step's count, per param
        # as torch.optim.AdamW does it: a tensor 1 is 4x faster than a Python 1 for CPU scalars
        torch._foreach_add_(steps, torch.ones((), dtype=steps[0].dtype, device="cpu"), alpha=1.0)
        rows, keys, numels, keep = [], [], [], []
        for (p, g, hyper), state, count in zip(items, states, counts):
            n = p.numel()
            if n == 0:
                continue
            if not _same_layout(g, p):  # an expanded or transposed grad: one copy in p's layout
                g = torch.empty_like(p).copy_(g)
                keep.append(g)
            ptrs = (p.data_ptr(), g.data_ptr(), state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr())
            rows.append((*ptrs, n, int((ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3]) % 16 == 0)))
            keys.append((*hyper, count))
            numels.append(n)
        torch.autograd.graph.increment_version([p for p, _, _ in items])  # as an in-place op would
        if not numels:
            return
        blocks = self._block_table(device, block, numels)
        addr_table = self._addr_table(device, tuple(rows))
        distinct = dict.fromkeys(keys)
        if len(distinct) == 1:  # the usual case: the scalars go by value, nothing is uploaded
            scalars, scalar_table = _scalars(*keys[0])[:7], addr_table  # the table is not read
        else:
            for key in distinct:  # params of one group at one step count share their scalars
                distinct[key] = _scalars(*key)
            host = torch.tensor([v for key in keys for v in distinct[key]], dtype=torch.float32)
            scalars, scalar_table = (0.0,) * 7, _to_device(host, device)
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            _adamw_kernel[(blocks.shape[0],)](
                blocks, addr_table, scalar_table, *scalars,
                PARAM_BF16=dtype == torch.bfloat16, BLOCK=block, TAIL=block // 4,
                ADDR_COLS=ADDR_COLS, SCALAR_COLS=SCALAR_COLS, UNIFORM=len(distinct) == 1,
                num_warps=num_warps)
        del keep  # grad copies are freed after the launch is queued (stream-ordered reuse)

    def _addr_table(self, device, rows):
        """(n_tensors, ADDR_COLS) int64 on `device`. Its content is its key (the addresses and
        sizes), so a cached table is right whenever it is found; grads usually come back at the
        same addresses step after step, so the upload is rare."""
        key = (device, rows)
        table = self._addr_tables.get(key)
        if table is None:
            table = _to_device(torch.tensor(rows, dtype=torch.int64), device)
            if len(self._addr_tables) >= 8:
                self._addr_tables.pop(next(iter(self._addr_tables)))
            self._addr_tables[key] = table
        return table

    def _block_table(self, device, block, numels):
        """(n_blocks, 2) int32 on `device`: tensor index and block index within it, for every
        block of BLOCK elements. It depends on the sizes alone (not on which tensors), so it is
        cached by them: a training loop builds it once, or once per pattern of missing grads."""
        key = (device, block, tuple(numels))
        table = self._block_tables.get(key)
        if table is None:
            counts = torch.tensor([-(-n // block) for n in numels])
            first = torch.cumsum(counts, 0) - counts
            tensor_index = torch.repeat_interleave(torch.arange(len(numels)), counts)
            block_index = torch.arange(int(counts.sum())) - torch.repeat_interleave(first, counts)
            table = torch.stack([tensor_index, block_index], dim=1).to(torch.int32).to(device)
            if len(self._block_tables) >= 8:
                self._block_tables.pop(next(iter(self._block_tables)))
            self._block_tables[key] = table
        return table


def _to_device(host, device):
    """Pinned and asynchronous, so the host does not wait for the GPU."""
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


def _scalars(lr, beta1, beta2, eps, weight_decay, step):
    """The SCALAR_COLS fp32 columns of one tensor, from float64 as torch.optim.AdamW computes them."""
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    return (1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, bias_correction2 ** 0.5, eps,
            -(lr / bias_correction1), 0.0)


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
    for name, value in FIXED_OPTIONS.items():
        if group.get(name, value) != value:
            raise ValueError(f"{where}{name}={group[name]!r} is not supported by TritonAdamW "
                             f"(only {name}={value})")
    lr = _number(where, "lr", group["lr"])
    if not lr >= 0:
        raise ValueError(f"{where}lr must be >= 0, got {lr}")
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{where}betas must be a pair (beta1, beta2), got {betas!r}")
    beta1, beta2 = (_number(where, f"betas[{i}]", b) for i, b in enumerate(betas))
    for i, b in enumerate((beta1, beta2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{where}betas[{i}] must be in [0, 1), got {b}")
    eps = _number(where, "eps", group["eps"])
    if not eps >= 0:
        raise ValueError(f"{where}eps must be >= 0, got {eps}")
    weight_decay = _number(where, "weight_decay", group["weight_decay"])
    if not weight_decay >= 0:
        raise ValueError(f"{where}weight_decay must be >= 0, got {weight_decay}")
    return lr, beta1, beta2, eps, weight_decay


def _check_param(name, p):
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(p).__name__}")
    if p.dtype not in PARAM_DTYPES:
        raise TypeError(f"{name} must have dtype fp32 or bf16; got {p.dtype}")
    if p.device.type != DEVICE:
        raise ValueError(f"{name} must be on the {DEVICE} device, got a tensor on {p.device}")
    if not _is_dense(p):
        raise ValueError(f"{name} must be dense (contiguous, or contiguous with its dims permuted); "
                         f"got shape {tuple(p.shape)} with strides {p.stride()}")


def _check_grad(name, p, g):
    if g.layout != torch.strided:
        raise ValueError(f"{name} has a sparse grad ({g.layout}); AdamW needs dense grads "
                         "(torch.optim.SparseAdam takes sparse ones)")
    if g.shape != p.shape:
        raise ValueError(f"{name}: grad shape {tuple(g.shape)} differs from the param's shape {tuple(p.shape)}")
    if g.dtype != p.dtype:
        raise TypeError(f"{name}: grad dtype {g.dtype} differs from the param's dtype {p.dtype}")
    if g.device != p.device:
        raise ValueError(f"{name}: grad is on {g.device} but the param is on {p.device}")


def _check_state(name, p, state):
    """State loaded from elsewhere must fit its param; m and v of another dtype are converted later."""
    for key in ("step", "exp_avg", "exp_avg_sq"):
        if key not in state:
            raise ValueError(f"{name}: optimizer state lacks {key!r} (not an Adam/AdamW state?)")
    for key in ("exp_avg", "exp_avg_sq"):
        t = state[key]
        if not isinstance(t, torch.Tensor) or t.shape != p.shape or t.device != p.device \
                or not t.is_floating_point():
            raise ValueError(f"{name}: state {key!r} must be a float tensor of shape {tuple(p.shape)} "
                             f"on {p.device}, like the param")


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
