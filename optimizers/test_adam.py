"""Tests for optimizers/triton_adam.py: TritonAdamW against torch.optim.AdamW and the reference of
optimizers/reference_adam.py, STEPS steps with fresh random grads each step.

fp32 params: the reference runs in float64 on the same start values and grads; our error against
it must be within FP32 and at most twice torch.optim.AdamW's own error (plus atol), and we must
be within FP32 of torch.optim.AdamW itself. bf16 params: the reference keeps m and v in fp32 and
rounds w to bf16 once a step, which is the kernel's bf16 mode. A bf16 state (state_dtype bf16, or
None for bf16 params, as torch's AdamW keeps it): the reference runs the same fp32 math and rounds
m and v to bf16 once a step.

    python optimizers/test_adam.py        (or: pytest optimizers)
"""

import copy

import torch

from llmk.common.device import DEVICE
from llmk.devtools.testing import EXACT, Case, Outcome, Tol, compare, expect_raises, main, opcheck, rand, select_cases
from llmk.optimizers import triton_adam
from llmk.optimizers.reference_adam import adamw_step_ref
from llmk.optimizers.triton_adam import TritonAdamW

STEPS = 20
FP32 = Tol(
    1e-6,
    5e-6,
    "elementwise fp32 math, no sums: a step rounds w, m, v an ulp or two (2^-24 "
    "relative each); 20 steps: 40 * 2^-24 = 2.4e-6, twice that; m cancels near 0: atol",
)
BF16 = Tol(
    1e-5,
    2**-6,
    "w rounded to bf16 once a step, as the reference does; an fp32 ulp of "
    "difference (the GPU contracts w*decay + step into an FMA, the reference "
    "does not) flips that rounding for ~1e-4 of the values a step, so over 20 "
    "steps and 10^6 values some flip twice: two bf16 ulps (2^-6 relative)",
)
# A flip next to a power of two can put our w and the reference's on either side of it. There they
# part: above, a step smaller than half the larger ulp rounds back to where w was; below, the same
# step moves w an ulp. One w then stalls while the other walks, by at most lr |m / sqrt(v)| (about
# lr) a step. So 1 in 10^5 values may pass BF16, each by no more than BF16_STALL_STEPS steps of 2 lr
# (H100: 1 of 10^6 values, 0.2520 against 0.2461, 6 ulps below 0.25, after 20 steps of lr 1e-3).
BF16_OUTLIERS = 1e-5
BF16_STALL_STEPS = STEPS
MLP_SHAPES = [(64, 32), (64,), (64,), (64,), (64, 64), (64,), (10, 64), (10,)]  # Linear, LayerNorm, Linear, Linear
GROUPS = [  # several groups with their own hyperparameters; betas[0] = 0.3 takes lerp's other formula
    {"shapes": [(33, 7), (5,)], "lr": 3e-3, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1},
    {"shapes": [(1000,), (2, 3, 4), (1,)], "weight_decay": 0.0},
    {"shapes": [(17,), (300,)], "lr": 1e-2, "betas": (0.3, 0.5), "weight_decay": 0.05},
]


def no_grad_at(skip=(), even_only=()):
    """has_grad(group, index, step): False for `skip` params always and `even_only` params on odd
    steps, so step counts differ between params of one group."""
    return lambda gi, j, s: (gi, j) not in skip and ((gi, j) not in even_only or s % 2 == 0)


class Trio:
    """The same start values in TritonAdamW, torch.optim.AdamW (compared on fp32 params only) and
    the reference, stepped with identical grads. groups: [{"shapes": [...], "dtype": ..., **hyper}]."""

    def __init__(self, groups, scheduler=None, state_dtype=torch.float32):
        self.dtypes = [g.get("dtype", torch.float32) for g in groups]
        self.state_dtype = state_dtype
        hyper = [{k: v for k, v in g.items() if k not in ("shapes", "dtype")} for g in groups]
        start = [[rand(s, torch.float32).to(dt) for s in g["shapes"]] for g, dt in zip(groups, self.dtypes)]
        self.start = [[x.clone() for x in xs] for xs in start]
        self.ours = [[x.clone().requires_grad_() for x in xs] for xs in start]
        self.theirs = [[x.clone().requires_grad_() for x in xs] for xs in start]
        # fp32 params and state: a float64 reference; bf16 params or a bf16 state: the kernel's
        # roundings (w to its dtype, m and v to theirs, once a step) on fp32 math
        self.exact_ref = state_dtype == torch.float32
        self.ref = [
            [x.double() if x.dtype == torch.float32 and self.exact_ref else x.clone() for x in xs] for xs in start
        ]
        state_dtype = [
            torch.float64 if dt == torch.float32 and self.exact_ref else (state_dtype or dt) for dt in self.dtypes
        ]
        self.ref_m = [[torch.zeros(x.shape, dtype=sd, device=DEVICE) for x in xs] for xs, sd in zip(start, state_dtype)]
        self.ref_v = [[m.clone() for m in ms] for ms in self.ref_m]
        self.ref_step = [[0] * len(xs) for xs in start]
        self.opt = TritonAdamW([{"params": ps, **h} for ps, h in zip(self.ours, hyper)], state_dtype=self.state_dtype)
        self.torch_opt = torch.optim.AdamW([{"params": ps, **h} for ps, h in zip(self.theirs, hyper)])
        self.schedulers = [scheduler(o) for o in (self.opt, self.torch_opt)] if scheduler else []

    def step(self, s, has_grad=lambda gi, j, s: True):
        for gi, xs in enumerate(self.start):
            for j, x in enumerate(xs):
                g = rand(x.shape, torch.float32).to(x.dtype) if has_grad(gi, j, s) else None
                self.ours[gi][j].grad = None if g is None else g.clone()
                self.theirs[gi][j].grad = None if g is None else g.clone()
                if g is not None:
                    group = self.opt.param_groups[gi]  # lr as our scheduler set it
                    self.ref_step[gi][j] += 1
                    adamw_step_ref(
                        self.ref[gi][j],
                        g,
                        self.ref_m[gi][j],
                        self.ref_v[gi][j],
                        self.ref_step[gi][j],
                        lr=group["lr"],
                        beta1=group["betas"][0],
                        beta2=group["betas"][1],
                        eps=group["eps"],
                        weight_decay=group["weight_decay"],
                    )
        self.opt.step()
        self.torch_opt.step()
        for sched in self.schedulers:
            sched.step()

    def run(self, steps=STEPS, has_grad=lambda gi, j, s: True):
        for s in range(steps):
            self.step(s, has_grad)
        return self.outcomes()

    def outcomes(self):
        """w, m, v of every param that has state, per param dtype, flattened into one check each;
        step counts; params that never had a grad untouched and without state."""
        out = []
        for dtype in dict.fromkeys(self.dtypes):
            idx = [
                (gi, j)
                for gi, dt in enumerate(self.dtypes)
                if dt == dtype
                for j in range(len(self.ours[gi]))
                if self.ref_step[gi][j]
            ]
            if not idx:
                continue
            name = "fp32" if dtype == torch.float32 else "bf16"

            def flat(rows, idx=idx):
                return torch.cat([rows[gi][j].detach().flatten() for gi, j in idx])

            def flat_state(opt, params, key, idx=idx):
                return torch.cat([opt.state[params[gi][j]][key].flatten() for gi, j in idx])

            w = flat(self.ours)
            refs = {"w": flat(self.ref), "exp_avg": flat(self.ref_m), "exp_avg_sq": flat(self.ref_v)}
            if dtype == torch.float32 and self.exact_ref:
                theirs = {
                    "w": flat(self.theirs),
                    **{k: flat_state(self.torch_opt, self.theirs, k) for k in ("exp_avg", "exp_avg_sq")},
                }
                for key in refs:
                    ours = w if key == "w" else flat_state(self.opt, self.ours, key)
                    out.append(compare(f"{name} {key} vs fp64 ref", ours, refs[key], FP32, torch_out=theirs[key]))
                    out.append(compare(f"{name} {key} vs torch", ours, theirs[key], FP32))
            else:
                lr = max(g["lr"] for g in self.opt.param_groups)
                out.append(compare_bf16_w(f"{name} w vs ref", w, refs["w"], lr))
                state_tol = FP32 if refs["exp_avg"].dtype == torch.float32 else BF16
                for key in ("exp_avg", "exp_avg_sq"):
                    ours = flat_state(self.opt, self.ours, key)
                    if state_tol is BF16:
                        out.append(compare_bf16(f"{name} {key} vs ref", ours, refs[key], BF16_STATE_STALL))
                    else:
                        out.append(compare(f"{name} {key} vs ref", ours, refs[key], state_tol))
                    if ours.dtype != refs[key].dtype:
                        out.append(
                            Outcome(f"{name} {key} dtype", False, note=f"{ours.dtype}, expected {refs[key].dtype}")
                        )
        steps = [[self.opt.state[p]["step"].item() if p in self.opt.state else 0 for p in ps] for ps in self.ours]
        out.append(Outcome("step counts", steps == self.ref_step, note=str(steps)[:70]))
        untouched = [
            torch.equal(p.detach(), x) and p not in self.opt.state
            for ps, xs, counts in zip(self.ours, self.start, self.ref_step)
            for p, x, c in zip(ps, xs, counts)
            if c == 0
        ]
        if untouched:
            out.append(Outcome("no-grad params untouched, no state", all(untouched)))
        return out


def compare_bf16(check, ours, ref, stall):
    """compare(ours, ref, BF16), with BF16_OUTLIERS of the values (at least one) allowed past it by
    a stall: each within the Tol `stall`."""
    out = compare(check, ours, ref, BF16)
    n_bad = int(out.bad.split("/")[0]) if out.bad else 0
    if out.passed or out.note or not 0 < n_bad <= max(1, BF16_OUTLIERS * ours.numel()):
        return out
    within = compare(check, ours, ref, stall)
    out.passed = within.passed
    out.note = f"{n_bad} past two ulps, each within {within.limit} (a stall)"
    return out


def compare_bf16_w(check, w, ref, lr):
    """compare_bf16 of bf16 weights: a stalled w lags by at most a step, about lr, a step (2 lr
    allowed), over BF16_STALL_STEPS steps."""
    return compare_bf16(check, w, ref, Tol(BF16_STALL_STEPS * 2 * lr, 0.0, "a stall", rounding_check=False))


# m and v kept in bf16 stall too: an update below half an ulp rounds back, so of two values an ulp
# apart (an fp32 difference flipped one rounding) one can stay while the other walks, lagging by
# under half an ulp (2^-8 relative) a step (seen: m -0.0598 against -0.0581, 7 ulps, 1 of 2240
# values, 20 steps)
BF16_STATE_STALL = Tol(1e-5, BF16_STALL_STEPS * 2**-8, "a stall: half an ulp a step", rounding_check=False)


def check_tensor(numel, weight_decay):
    return Trio([{"shapes": [(numel,)], "weight_decay": weight_decay}]).run()


def check_mlp(weight_decay):
    return Trio([{"shapes": MLP_SHAPES, "weight_decay": weight_decay}]).run()


def check_groups():
    """Three groups with their own hyperparameters, a param that never gets a grad, one that gets
    one every other step (its step count lags), and an LR scheduler on each optimizer."""
    trio = Trio(GROUPS, scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (1 + 0.1 * s)))
    out = trio.run(has_grad=no_grad_at(skip=[(1, 2)], even_only=[(0, 1)]))
    lrs = [g["lr"] for g in trio.opt.param_groups]
    return out + [
        Outcome(
            "scheduler set lr",
            lrs == [g["lr"] for g in trio.torch_opt.param_groups] and lrs[0] < GROUPS[0]["lr"],
            note=str(lrs)[:70],
        )
    ]


def check_bf16(shapes, weight_decay):
    return Trio([{"shapes": shapes, "dtype": torch.bfloat16, "weight_decay": weight_decay}]).run()


def check_state_dtype(state_dtype, dtypes):
    """m and v in bf16 (state_dtype bf16, or None: each param's dtype), against the reference with
    the same roundings; one launch a step still."""
    trio = Trio(
        [{"shapes": MLP_SHAPES[:4], "dtype": dtypes[0]}, {"shapes": MLP_SHAPES[4:], "dtype": dtypes[1]}],
        state_dtype=state_dtype,
    )
    return trio.run() + [launches_per_step(trio, expected=len(set(dtypes)))]


def check_dtensor():
    """DTensor params, as FSDP2's fully_shard makes them, on a one-rank mesh: each is stepped by its
    local shard, its m and v made as DTensors placed like it; against the same values as plain
    tensors. A grad placed unlike its param raises, naming the param."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh(DEVICE, (1,))
        start = [rand(s, torch.float32) for s in MLP_SHAPES[:4]]
        grads = [[rand(s, torch.float32) for s in MLP_SHAPES[:4]] for _ in range(3)]
        sharded = [torch.nn.Parameter(distribute_tensor(x.clone(), mesh, [Shard(0)])) for x in start]
        plain = [torch.nn.Parameter(x.clone()) for x in start]
        ours, theirs = TritonAdamW(sharded), TritonAdamW(plain)
        for step_grads in grads:
            for p, q, g in zip(sharded, plain, step_grads):
                p.grad, q.grad = distribute_tensor(g.clone(), mesh, [Shard(0)]), g.clone()
            ours.step()
            theirs.step()
        w = torch.cat([p.detach().full_tensor().flatten() for p in sharded])
        out = [
            compare("w", w, torch.cat([q.detach().flatten() for q in plain]), EXACT),
            Outcome(
                "m, v kept as DTensors",
                all(isinstance(ours.state[p][k], DTensor) for p in sharded for k in ("exp_avg", "exp_avg_sq")),
            ),
        ]
        sharded[0].grad = distribute_tensor(grads[0][0].clone(), mesh, [Replicate()])
        before = snapshot(ours)
        out.append(expect_raises("grad placed unlike its param", ours.step, ValueError, "param 0"))
        after = snapshot(ours)
        out.append(
            Outcome(
                "grad placed unlike its param: untouched, step counts too",
                all(
                    torch.equal(p, q) and all(torch.equal(s[k], t[k]) for k in s)
                    for (p, s), (q, t) in zip(before, after)
                ),
            )
        )
        return out
    finally:
        if started:
            dist.destroy_process_group()


def check_mixed_dtypes():
    """fp32 and bf16 params in one optimizer: one launch for each dtype."""
    trio = Trio([{"shapes": MLP_SHAPES[:4]}, {"shapes": MLP_SHAPES[4:], "dtype": torch.bfloat16}])
    return trio.run() + [launches_per_step(trio, expected=2)]


def launches_per_step(trio, expected):
    """Count kernel launches of one more step (the module global is looked up at each launch)."""
    calls = []
    launch = triton_adam._launch
    triton_adam._launch = lambda *args: calls.append(args) or launch(*args)
    try:
        trio.step(STEPS)
    finally:
        triton_adam._launch = launch
    return Outcome(f"{expected} launch(es) a step", len(calls) == expected, note=f"{len(calls)} launches")


def check_one_launch():
    trio = Trio([{"shapes": MLP_SHAPES}, {"shapes": [(1000,), (3,)], "lr": 1e-2}])
    trio.run(steps=2)
    return [launches_per_step(trio, expected=1)]


def switch_run(start, grads, first, second, switch_at):
    """GROUPS trained from `start` with grads[step][group][index] (None: no grad), by `first` until
    step `switch_at`, then by a fresh `second` loaded with first's state_dict."""
    params = [[x.clone().requires_grad_() for x in xs] for xs in start]
    groups = [{"params": ps, **{k: v for k, v in g.items() if k != "shapes"}} for ps, g in zip(params, GROUPS)]
    opt = first(groups)
    for s, step_grads in enumerate(grads):
        if s == switch_at:
            saved = copy.deepcopy(opt.state_dict())  # deep: load_state_dict shares the step tensors
            opt = second(groups)
            opt.load_state_dict(saved)
        for ps, gs in zip(params, step_grads):
            for p, g in zip(ps, gs):
                p.grad = None if g is None else g.clone()
        opt.step()
    return params, opt


def check_state_dict(first_name):
    """Train with one optimizer for half the steps, continue with the other from its state_dict;
    must match torch.optim.AdamW trained throughout."""
    kinds = {"torch": torch.optim.AdamW, "triton": TritonAdamW}
    first, second = kinds[first_name], kinds["triton" if first_name == "torch" else "torch"]
    has_grad = no_grad_at(skip=[(1, 2)], even_only=[(0, 1)])
    start = [[rand(s, torch.float32) for s in g["shapes"]] for g in GROUPS]
    grads = [
        [
            [rand(s, torch.float32) if has_grad(gi, j, step) else None for j, s in enumerate(g["shapes"])]
            for gi, g in enumerate(GROUPS)
        ]
        for step in range(STEPS)
    ]
    params, opt = switch_run(start, grads, first, second, STEPS // 2)
    base_params, base = switch_run(start, grads, torch.optim.AdamW, torch.optim.AdamW, None)
    flat = lambda ps: torch.cat([p.detach().flatten() for group in ps for p in group])  # noqa: E731
    sd, base_sd = opt.state_dict(), base.state_dict()
    out = [compare("w", flat(params), flat(base_params), FP32)]
    for key in ("exp_avg", "exp_avg_sq"):
        out.append(
            compare(
                key,
                torch.cat([v[key].flatten() for v in sd["state"].values()]),
                torch.cat([v[key].flatten() for v in base_sd["state"].values()]),
                FP32,
            )
        )
    same_steps = {k: v["step"].item() for k, v in sd["state"].items()} == {
        k: v["step"].item() for k, v in base_sd["state"].items()
    }
    same_kinds = all(
        v["step"].dtype == base_sd["state"][k]["step"].dtype and v["step"].device.type == "cpu"
        for k, v in sd["state"].items()
    )
    out.append(
        Outcome(
            "state keys and step counts", same_steps and same_kinds and sd["state"].keys() == base_sd["state"].keys()
        )
    )
    out.append(
        Outcome(
            "param_groups equal",
            sd["param_groups"] == base_sd["param_groups"],
            note="" if sd["param_groups"] == base_sd["param_groups"] else str(sd["param_groups"][0])[:70],
        )
    )
    return out


def check_bf16_state_dict():
    """bf16 params: our fp32 m and v come back unrounded from a state_dict (torch.optim.Optimizer's
    load casts state to the param's dtype), and torch.optim.AdamW's bf16 state loads as fp32."""
    params = [rand(s, torch.bfloat16).requires_grad_() for s in MLP_SHAPES[:3]]
    opt = TritonAdamW(params)
    for _ in range(3):
        for p in params:
            p.grad = rand(p.shape, torch.bfloat16)
        opt.step()
    loaded = TritonAdamW(params)
    loaded.load_state_dict(copy.deepcopy(opt.state_dict()))
    keys = ("exp_avg", "exp_avg_sq")
    kept = all(
        loaded.state[p][k].dtype == torch.float32 and torch.equal(loaded.state[p][k], opt.state[p][k])
        for p in params
        for k in keys
    )
    theirs = [p.detach().clone().requires_grad_() for p in params]
    torch_opt = torch.optim.AdamW(theirs)
    torch_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # rounds m and v to bf16
    back = TritonAdamW(params)
    back.load_state_dict(copy.deepcopy(torch_opt.state_dict()))
    upcast = all(
        back.state[p][k].dtype == torch.float32 and torch.equal(back.state[p][k], torch_opt.state[q][k].float())
        for p, q in zip(params, theirs)
        for k in keys
    )
    same = TritonAdamW(params, state_dtype=None)  # torch's bf16 state kept as it is
    same.load_state_dict(copy.deepcopy(torch_opt.state_dict()))
    kept_bf16 = all(
        same.state[p][k].dtype == torch.bfloat16 and torch.equal(same.state[p][k], torch_opt.state[q][k])
        for p, q in zip(params, theirs)
        for k in keys
    )
    rounded = TritonAdamW(params, state_dtype=None)  # our fp32 state rounded once, to bf16
    rounded.load_state_dict(copy.deepcopy(opt.state_dict()))
    rounded.step()
    converted = all(rounded.state[p][k].dtype == torch.bfloat16 for p in params for k in keys)
    return [
        Outcome("ours -> ours: fp32 m, v unrounded", kept),
        Outcome("torch bf16 -> ours: fp32 m, v", upcast),
        Outcome("torch bf16 -> ours, state_dtype=None: bf16 kept", kept_bf16),
        Outcome("ours fp32 -> ours, state_dtype=None: bf16 after a step", converted),
    ]


def check_layouts():
    """A transposed param, a grad in another layout than its param, and params at addresses that
    are not 16-byte aligned (the kernel's masked path for whole tensors)."""
    start = [rand((5000,), torch.float32), rand((48, 40), torch.float32), rand((6, 4), torch.float32)]

    def make():  # 4 bytes into a buffer, transposed (strides (1, 48)), plain
        unaligned = torch.empty(5001, device=DEVICE)[1:].copy_(start[0])
        transposed = torch.empty(40, 48, device=DEVICE).t().copy_(start[1])
        return [unaligned.requires_grad_(), transposed.requires_grad_(), start[2].clone().requires_grad_()]

    ours, theirs = make(), make()
    bf16 = torch.empty(3001, dtype=torch.bfloat16, device=DEVICE)[1:]  # 2 bytes in
    bf16.copy_(rand((3000,), torch.bfloat16)).requires_grad_()
    bf16_ref, m, v = bf16.detach().clone(), torch.zeros(3000, device=DEVICE), torch.zeros(3000, device=DEVICE)
    opt, torch_opt = TritonAdamW(ours + [bf16]), torch.optim.AdamW(theirs)
    for s in range(1, 6):
        grads = [rand(x.shape, torch.float32) for x in start[:2]] + [rand((4, 6), torch.float32).t()]
        for p, q, g in zip(ours, theirs, grads):
            p.grad, q.grad = g.clone(), g.clone()
        bf16.grad = rand((3000,), torch.bfloat16)
        adamw_step_ref(bf16_ref, bf16.grad, m, v, s, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2)
        opt.step()
        torch_opt.step()
    out = [
        compare(f"fp32 {name}", p.detach(), q.detach(), FP32)
        for name, p, q in zip(("unaligned", "transposed", "grad strides"), ours, theirs)
    ]
    out.append(compare("bf16 unaligned", bf16.detach(), bf16_ref, BF16))
    out.append(Outcome("transposed state keeps the layout", opt.state[ours[1]]["exp_avg"].stride() == (1, 48)))
    return out


def check_misc():
    """Empty params, a closure, zero_grad both ways."""
    ours = [rand(s, torch.float32).requires_grad_() for s in ((0,), (7,), (0, 3))]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    opt, torch_opt = TritonAdamW(ours), torch.optim.AdamW(theirs)
    for _ in range(3):
        for p, q in zip(ours, theirs):
            g = rand(p.shape, torch.float32)
            p.grad, q.grad = g.clone(), g.clone()
        loss = opt.step(lambda: torch.tensor(2.5))
        torch_opt.step()
    out = [
        Outcome("closure's loss returned", float(loss) == 2.5),
        compare("w", ours[1].detach(), theirs[1].detach(), FP32),
        Outcome(
            "empty params counted steps",
            [opt.state[p]["step"].item() for p in ours] == [torch_opt.state[q]["step"].item() for q in theirs],
        ),
    ]
    opt.zero_grad(set_to_none=False)
    out.append(Outcome("zero_grad(set_to_none=False)", all(p.grad is not None and not p.grad.any() for p in ours)))
    opt.zero_grad()
    out.append(Outcome("zero_grad()", all(p.grad is None for p in ours)))
    before = [p.detach().clone() for p in ours]
    opt.step()  # no grads: nothing to do
    out.append(Outcome("step without grads", all(torch.equal(p, b) for p, b in zip(ours, before))))
    return out


def snapshot(opt):
    return [
        (p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()})
        for g in opt.param_groups
        for p in g["params"]
    ]


def check_errors():
    """Bad input raises before anything is written: params and state stay bit-identical."""
    params = [rand((5,), torch.float32).requires_grad_() for _ in range(6)]
    opt = TritonAdamW(params)
    for _ in range(2):
        for p in params:
            p.grad = rand((5,), torch.float32)
        opt.step()
    before = snapshot(opt)

    def untouched(label):
        after = snapshot(opt)
        same = all(
            torch.equal(p, q) and all(torch.equal(s[k], t[k]) for k in s) for (p, s), (q, t) in zip(before, after)
        )
        return Outcome(f"{label}: untouched", same)

    def step_with(label, edit, undo, match, exc=(ValueError, TypeError)):
        edit()
        outcome = expect_raises(label, opt.step, exc, match)
        undo()
        return [outcome, untouched(label)]

    group = opt.param_groups[0]
    grad4 = params[4].grad
    sparse = grad4.to_sparse()
    out = []
    out += step_with(
        "sparse grad of param 4",
        lambda: setattr(params[4], "grad", sparse),
        lambda: setattr(params[4], "grad", grad4),
        "param 4",
    )

    def set_wrong_shape():
        params[4].grad = rand((5,), torch.float32)
        params[4].grad.data = rand((2, 3), torch.float32)  # .data skips the shape check of .grad's setter

    out += step_with("grad shape != param shape", set_wrong_shape, lambda: setattr(params[4], "grad", grad4), "(2, 3)")
    for key, bad, match in (
        ("lr", -1e-3, "lr"),
        ("betas", (1.0, 0.999), "betas[0]"),
        ("betas", (0.9, -0.1), "betas[1]"),
        ("eps", -1e-8, "eps"),
        ("weight_decay", -0.1, "weight_decay"),
        ("amsgrad", True, "amsgrad"),
    ):
        good = group[key]
        out += step_with(
            f"group {key}={bad}",
            lambda k=key, b=bad: group.__setitem__(k, b),
            lambda k=key, g=good: group.__setitem__(k, g),
            match,
        )
    p = params[0]
    other = "cpu" if DEVICE == "cuda" else "meta"
    out += [
        expect_raises("lr < 0", lambda: TritonAdamW([p], lr=-1.0), ValueError, "lr"),
        expect_raises("beta1 = 1", lambda: TritonAdamW([p], betas=(1.0, 0.999)), ValueError, "betas[0]"),
        expect_raises("beta2 < 0", lambda: TritonAdamW([p], betas=(0.9, -0.5)), ValueError, "betas[1]"),
        expect_raises("eps < 0", lambda: TritonAdamW([p], eps=-1e-8), ValueError, "eps"),
        expect_raises("weight_decay < 0", lambda: TritonAdamW([p], weight_decay=-1.0), ValueError, "weight_decay"),
        expect_raises(
            "group lr < 0", lambda: TritonAdamW([{"params": [p], "lr": -1.0}]), ValueError, "param_groups[0]"
        ),
        expect_raises("amsgrad", lambda: TritonAdamW([p], amsgrad=True), ValueError, "amsgrad"),
        expect_raises("maximize", lambda: TritonAdamW([p], maximize=True), ValueError, "maximize"),
        expect_raises(
            "state_dtype fp16", lambda: TritonAdamW([p], state_dtype=torch.float16), TypeError, "state_dtype"
        ),
        expect_raises("fp16 param", lambda: TritonAdamW([rand((3,), torch.float16)]), TypeError, "fp32 or bf16"),
        expect_raises(
            "int param",
            lambda: TritonAdamW([torch.zeros(3, dtype=torch.int32, device=DEVICE)]),
            TypeError,
            "fp32 or bf16",
        ),
        expect_raises(f"param on {other}", lambda: TritonAdamW([torch.zeros(3, device=other)]), ValueError, "device"),
        expect_raises(
            "overlapping param", lambda: TritonAdamW([torch.zeros(1, device=DEVICE).expand(4)]), ValueError, "dense"
        ),
    ]
    return out


def check_op():
    """llmk::adamw_step as an operator: opcheck on one step's lists (one transposed param, grads in
    another layout, per-param scalars); the kernel through the dispatcher equals the direct call;
    forward-only: with grad mode on and a param that requires grad it raises naming the op."""

    def inputs():
        params = [rand((33, 7), torch.float32), rand((20, 9), torch.float32).t(), rand((300,), torch.float32)]
        grads = [
            rand((33, 7), torch.float32).t().contiguous().t(),  # both in another layout than their param
            rand((9, 20), torch.float32),
            rand((300,), torch.float32),
        ]
        exp_avgs = [torch.randn_like(p) for p in params]
        exp_avg_sqs = [torch.rand_like(p) for p in params]
        hyper = [1e-2, 0.9, 0.999, 1e-8, 0.1, 3.0] * 2 + [1e-3, 0.8, 0.99, 1e-6, 0.0, 1.0]
        return params, grads, exp_avgs, exp_avg_sqs, hyper

    out = []
    out.append(opcheck("opcheck llmk::adamw_step", torch.ops.llmk.adamw_step.default, inputs()))
    direct = inputs()
    through = tuple([t.clone() for t in ts] if isinstance(ts[0], torch.Tensor) else ts for ts in direct)
    triton_adam.adamw_step_op(*direct)
    torch.ops.llmk.adamw_step.default(*through)
    for i, key in ((0, "params"), (2, "exp_avgs"), (3, "exp_avg_sqs")):
        out.append(
            compare(
                f"dispatcher = direct: {key}",
                torch.cat([t.flatten() for t in direct[i]]),
                torch.cat([t.flatten() for t in through[i]]),
                EXACT,
            )
        )
    params, *rest = inputs()
    params[0].requires_grad_()
    out.append(
        expect_raises(
            "grad mode, param requires grad",
            lambda: triton_adam.adamw_step_op(params, *rest),
            RuntimeError,
            "llmk::adamw_step",
        )
    )
    with torch.no_grad():
        triton_adam.adamw_step_op(params, *rest)
    out.append(Outcome("under torch.no_grad(): runs", True))
    bad = inputs()
    bad[2][1] = bad[2][1].contiguous()  # m not in its transposed param's layout
    out.append(
        expect_raises(
            "m in another layout than its param", lambda: triton_adam.adamw_step_op(*bad), ValueError, "tensor 1"
        )
    )
    return out


def check_requires_grad():
    """The normal case: nn.Parameters that require grad, step() under its own no_grad, the grad
    mode left as it was; the optimizer's step hooks run (with the profiler's label only when one
    is on, see TritonAdamW.profile_hook_step)."""
    params = [torch.nn.Parameter(rand(s, torch.float32)) for s in ((17, 5), (40,))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, torch_opt = TritonAdamW(params), torch.optim.AdamW(theirs)
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    for _ in range(3):
        for p, q in zip(params, theirs):
            p.grad = rand(p.shape, torch.float32)
            q.grad = p.grad.clone()
        opt.step()
        torch_opt.step()
    flat = lambda ps: torch.cat([p.detach().flatten() for p in ps])  # noqa: E731
    out = [
        compare("w vs torch", flat(params), flat(theirs), FP32),
        Outcome(
            "params still require grad, grad mode on", all(p.requires_grad for p in params) and torch.is_grad_enabled()
        ),
        Outcome("step hooks ran", calls == ["pre", "post"] * 3, note=str(calls)[:70]),
    ]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    label = f"Optimizer.step#{TritonAdamW.__name__}.step"
    return out + [Outcome("profiler label", any(e.name == label for e in prof.events()), note=label)]


def check_huge(n):
    """Past 2^31 elements: the block index times BLOCK must not wrap. The first and last elements
    against the reference."""
    p = torch.randn(n, device=DEVICE).requires_grad_()
    p.grad = torch.randn(n, device=DEVICE)
    ends = [slice(0, 4096), slice(n - 4096, n)]
    ref = [(p.detach()[e].clone(), p.grad[e].clone()) for e in ends]
    TritonAdamW([p], lr=1e-2).step()
    out = []
    for e, (w, g), name in zip(ends, ref, ("first", "last")):
        m, v = torch.zeros_like(w), torch.zeros_like(w)
        adamw_step_ref(w, g, m, v, 1, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2)
        out.append(compare(f"{name} 4096", p.detach()[e], w, FP32))
    return out


CASES = (
    [
        Case(f"{n} params wd={wd}", check_tensor, dict(numel=n, weight_decay=wd), gpu_only=n > 10**5)
        for n in (1, 1000, 65539, 10**6 + 3)
        for wd in (0.0, 1e-2)
        if (n, wd) != (65539, 0.0)
    ]
    + [Case(f"MLP params wd={wd}", check_mlp, dict(weight_decay=wd)) for wd in (0.0, 1e-2)]
    + [
        Case("param groups, no-grad param, lagging step, scheduler", check_groups),
        Case("bf16 MLP params", check_bf16, dict(shapes=MLP_SHAPES, weight_decay=1e-2)),
        Case("bf16 10^6+3 params", check_bf16, dict(shapes=[(10**6 + 3,)], weight_decay=1e-2), gpu_only=True),
        Case("fp32 + bf16 params", check_mixed_dtypes),
        Case("DTensor params (FSDP2), one rank", check_dtensor),
        Case(
            "bf16 params, state_dtype=None (bf16 m, v)",
            check_state_dtype,
            dict(state_dtype=None, dtypes=(torch.bfloat16, torch.bfloat16)),
        ),
        Case(
            "fp32 + bf16 params, state_dtype=bf16",
            check_state_dtype,
            dict(state_dtype=torch.bfloat16, dtypes=(torch.float32, torch.bfloat16)),
        ),
        Case("one launch for a model's list", check_one_launch),
        Case("state_dict torch -> triton", check_state_dict, dict(first_name="torch")),
        Case("state_dict triton -> torch", check_state_dict, dict(first_name="triton")),
        Case("bf16 state_dict", check_bf16_state_dict),
        Case("layouts", check_layouts),
        Case("empty params, closure, zero_grad", check_misc),
        Case("bad input", check_errors),
        Case("llmk::adamw_step operator", check_op),
        Case("params that require grad, step hooks", check_requires_grad),
        Case("2^31+ elements", check_huge, dict(n=2**31 + 5), gpu_only=True, gpu_gb=36),
    ]  # 34.4 GB printed
)
# the case of this tier that runs each CONFIGS entry (one per param dtype)
CONFIG_CASES = {torch.float32: "MLP params wd=0.01", torch.bfloat16: "bf16 MLP params"}


def check_table_rows():
    """Every CONFIGS entry has a case of this tier that runs it: a dtype added to CONFIGS without
    one fails here."""
    names = {c.name for c in select_cases(CASES)}
    missing = [dtype for dtype in triton_adam.CONFIGS if CONFIG_CASES.get(dtype) not in names]
    return [Outcome("every CONFIGS entry run", not missing, note=f"no case runs {missing}" if missing else "")]


CASES = CASES + [Case("every launch-table row reached", check_table_rows)]


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("adamw", CASES)
