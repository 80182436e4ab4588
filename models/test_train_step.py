"""Training with our operators: an RMSNorm + SwiGLU MLP block (models/mlp_block.py) trained for
20 steps (10 in the interpreter) on ours and on PyTorch's from the same seed and data; the losses
must agree to bf16 noise.

    python models/test_train_step.py        (or: pytest models/test_train_step.py)

Each run: fp32 master weights, bf16 compute, AdamW on the masters (TritonAdamW for ours, PyTorch's
for PyTorch's), a regression loss (mean squared error against a fixed random target, computed in
fp32). Three runs from one initialization and one data stream: ours in bf16, PyTorch in bf16, and
PyTorch in fp32 (the reference). bf16 noise is what PyTorch's own bf16 run deviates from the fp32
one; ours passes when, at every step, its loss is within 2x the largest such deviation so far plus
2^-8 of the loss (one bf16 rounding), and when the loss fell (a dropped gradient stalls it).
Eagerly, and under torch.compile(fullgraph=True) (aot_eager in the interpreter, inductor on a GPU).
"""

import torch

from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.testing import COMPILE_BACKEND, UNIT_ROUNDOFF, Case, Outcome, main
from llmk.models.mlp_block import forward, make_params
from llmk.optimizers.triton_adam import TritonAdamW

# 10 in the interpreter (its loss falls 0.41 -> 0.17 there, against the 30% the test asks), where
# each step of the compiled case costs a third of a second
STEPS = 10 if INTERPRET else 20
BATCHES = 2  # cycled: a small data set the block can fit within STEPS, so the loss falls clearly
LR = 1e-2


def batches(tokens, hidden, seed):
    """STEPS (x, target) pairs in fp32 (BATCHES of them, cycled), the same for every run: the target is x plus a
    random smooth function of x, so the block's MLP (not its residual path) has something to fit."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    teacher = torch.randn(hidden, hidden, generator=gen) / hidden**0.5
    pairs = []
    for _ in range(BATCHES):
        x = torch.randn(tokens, hidden, generator=gen)
        pairs.append((x.to(DEVICE), (x + torch.tanh(x @ teacher)).to(DEVICE)))
    return [pairs[step % BATCHES] for step in range(STEPS)]


def train(ops, dtype, data, shape, seed, compiled=False):
    """Losses of STEPS steps from the initialization `seed`."""
    params = make_params(*shape, DEVICE, seed)
    opt = (TritonAdamW if ops == "llmk" else torch.optim.AdamW)(list(params.values()), lr=LR, weight_decay=0.0)

    def loss_of(x, target):
        y = forward(params, x.to(dtype), ops, dtype)
        return (y.float() - target).pow(2).mean()

    step_loss = torch.compile(loss_of, fullgraph=True, backend=COMPILE_BACKEND) if compiled else loss_of
    losses = []
    for x, target in data:
        opt.zero_grad(set_to_none=True)
        loss = step_loss(x, target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_training(tokens, hidden, intermediate, compiled=False):
    seed = int(torch.randint(0, 2**31, (1,)).item())  # fresh per run; the case seed makes it repeatable
    data = batches(tokens, hidden, seed)
    shape = (hidden, intermediate)
    ref = train("torch", torch.float32, data, shape, seed)
    theirs = train("torch", torch.bfloat16, data, shape, seed)
    ours = train("llmk", torch.bfloat16, data, shape, seed, compiled)
    outcomes, noise = [], 0.0
    worst = (0.0, -1, 0.0)  # (excess over the bound, step, our deviation)
    for step, (r, t, o) in enumerate(zip(ref, theirs, ours)):
        noise = max(noise, abs(t - r))
        bound = 2 * noise + UNIT_ROUNDOFF[torch.bfloat16] * abs(r)
        if abs(o - r) - bound > worst[0] or step == 0:
            worst = (max(abs(o - r) - bound, 0.0), step, abs(o - r))
        if not abs(o - r) <= bound:
            outcomes.append(
                Outcome(
                    f"step {step}: loss within bf16 noise",
                    False,
                    abs(o - r),
                    note=f"ours {o:.6g}, torch bf16 {t:.6g}, fp32 {r:.6g}, bound {bound:.3g}",
                )
            )
            break
    else:
        outcomes.append(
            Outcome(
                f"{STEPS} steps: losses within 2x torch's bf16 noise + 2^-8 |loss|",
                True,
                note=f"final: ours {ours[-1]:.5g}, torch bf16 {theirs[-1]:.5g}, fp32 {ref[-1]:.5g}",
            )
        )
    fell = ours[-1] < 0.7 * ours[0]
    outcomes.append(
        Outcome("the loss fell (gradients reach every parameter)", fell, note=f"{ours[0]:.4g} -> {ours[-1]:.4g}")
    )
    return outcomes


def cases():
    small = dict(tokens=48, hidden=64, intermediate=96)
    large = dict(tokens=4096, hidden=1024, intermediate=2816)
    return [
        Case("MLP block T48 H64 I96, eager", check_training, small),
        Case(f"MLP block T48 H64 I96, torch.compile ({COMPILE_BACKEND})", check_training, dict(small, compiled=True)),
        Case("MLP block T4096 H1024 I2816, eager", check_training, large, gpu_only=True),
        Case("MLP block T4096 H1024 I2816, torch.compile", check_training, dict(large, compiled=True), gpu_only=True),
    ]


CASES = cases()


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("training step", CASES)
