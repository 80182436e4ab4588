"""PyTorch reference for AdamW (decoupled weight decay, bias correction), one tensor at a time.

The order of operations is torch.optim.AdamW's (`_single_tensor_adam` in torch/optim/adam.py):

    w = w * (1 - lr * weight_decay)                       decoupled: not folded into g
    m = lerp(m, g, 1 - beta1)                             = beta1 * m + (1 - beta1) * g
    v = v * beta2 + (1 - beta2) * g * g
    w = w - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)

The math runs in the state's dtype (fp32, or fp64 when the tests want a reference of the
references) and the param is rounded to its own dtype once per step, which is also the bf16 mode
of the Triton kernel: bf16 params, fp32 state, fp32 math. A bf16 state is loaded into fp32, the
math runs there, and m and v are rounded back to bf16 once per step (the kernel's state_dtype=None
for bf16 params, and torch's fused AdamW).
"""

import torch


def adamw_step_ref(param, grad, exp_avg, exp_avg_sq, step, *, lr, beta1, beta2, eps, weight_decay):
    """One AdamW step, in place on param, exp_avg and exp_avg_sq. `step` counts this step (1 first).

    param, grad: same shape, any float dtype. exp_avg, exp_avg_sq: like param, fp32, fp64 or bf16.
    """
    state = (exp_avg, exp_avg_sq)
    if exp_avg.dtype == torch.bfloat16:  # fp32 math on a bf16 state, rounded back at the end
        exp_avg, exp_avg_sq = exp_avg.float(), exp_avg_sq.float()
    compute = exp_avg.dtype
    w = param.detach().to(compute)  # param itself when the dtypes agree: updated in place
    g = grad.to(compute)
    # bias corrections in Python floats (float64), as torch does for a float lr and betas
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    if weight_decay != 0:
        w.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    w.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
    if w is not param:
        param.detach().copy_(w)  # the one rounding to the param's dtype
    if exp_avg is not state[0]:
        state[0].copy_(exp_avg)
        state[1].copy_(exp_avg_sq)
