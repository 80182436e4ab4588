"""Our kernels work whatever the caller imported first: torch, triton or transformers.

    python common/test_import_order.py        (or: pytest common/test_import_order.py)

Each case is a fresh Python process, because the order only matters at the first import: Triton
decides at decoration time whether a @triton.jit function is compiled or interpreted, so a triton
imported before `llmk.common` (by transformers, say) would leave triton.language's own helpers built for
a GPU on a CPU-only machine. The process imports the given modules, then ours, runs a few kernels
on small inputs in whichever lane this machine has, and prints their errors against PyTorch.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

import torch

from llmk.devtools.testing import Case, Outcome, Skip, main

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Runs in the child after its first imports: every kernel family once, each against PyTorch.
PROBE = """
import torch
from llmk.common.device import DEVICE
from llmk.normalization.triton_rmsnorm import rmsnorm
from llmk.attention.triton_softmax import softmax
from llmk.attention.flash_attention_ops import flash_attention
from llmk.gemm.matmul_ops import matmul
torch.manual_seed(0)
x = torch.randn(4, 96, device=DEVICE)
w = torch.randn(96, device=DEVICE)
errs = [(rmsnorm(x, w) - torch.nn.functional.rms_norm(x, (96,), w, 1e-6)).abs().max().item(),
        (softmax(x) - torch.softmax(x, -1)).abs().max().item()]
q = torch.randn(1, 2, 40, 32, device=DEVICE, dtype=torch.float16)
ref = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
errs.append((flash_attention(q, q, q, causal=True).float() - ref).abs().max().item())
a, b = torch.randn(33, 64, device=DEVICE).half(), torch.randn(64, 40, device=DEVICE).half()
errs.append((matmul(a, b).float() - a.float() @ b.float()).abs().max().item())
print("errors", *errs)
"""

ORDERS = {
    "torch first": ["torch"],
    "triton first": ["triton", "triton.language"],
    "torch, then triton": ["torch", "triton"],
    "transformers' Llama first": ["transformers.models.llama.modeling_llama"],
}
LIMITS = (1e-5, 1e-6, 1e-2, 1e-1)  # fp32 rmsnorm and softmax; fp16 attention and a K = 64 fp16 GEMM


def check(first):
    if first[0].startswith("transformers") and importlib.util.find_spec("transformers") is None:
        raise Skip("transformers not installed")
    code = "".join(f"import {m}\n" for m in first) + PROBE
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env.pop("TRITON_INTERPRET", None)  # set by this process's `llmk.common`: the child must find it unset
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode:
        return [Outcome("kernels run", False, note=proc.stderr.strip().splitlines()[-1][:120])]
    errors = [float(e) for e in proc.stdout.split("errors", 1)[1].split()]
    names = ("rmsnorm", "softmax", "flash_attention", "matmul")
    return [
        Outcome(name, err <= limit, max_abs=err, limit=f"{limit:.0e}")
        for name, err, limit in zip(names, errors, LIMITS)
    ]


CASES = [Case(name, check, dict(first=first)) for name, first in ORDERS.items()]


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("import order", CASES)
