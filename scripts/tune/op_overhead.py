"""Host cost of the ways a kernel can become a PyTorch operator, on one kernel (RMSNorm, 1 x 4096
bf16, a launch-bound call): CPU us a call (common.bench.host_time_us: 200 calls without a sync,
best of 3), eager and under torch.no_grad.

    python scripts/tune/op_overhead.py          (GPU, ~1 min; --smoke: the interpreter, numbers meaningless)

Rows: a bare Triton launch of an empty kernel; our launcher called directly (rmsnorm); the same
launcher behind torch.library.custom_op (+ register_fake); behind torch.library.triton_op with
wrap_triton; the custom_op called through torch.ops (the dispatcher path a compiled graph takes);
and F.rms_norm for reference. The operators are registered in a namespace of this script's own.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # repo root, for `common`
import common  # noqa: E402,F401  (interpreter switch before triton is imported)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from common.bench import host_time_us  # noqa: E402
from common.device import DEVICE, INTERPRET, describe  # noqa: E402
from common.validation import check_norm_args  # noqa: E402
from normalization.triton_rmsnorm import launch_rmsnorm, rmsnorm  # noqa: E402


@triton.jit
def _empty_kernel(x_ptr):
    pass


def register_ops():
    """(custom_op rmsnorm, triton_op rmsnorm), both calling launch_rmsnorm on checked arguments."""
    @torch.library.custom_op("op_overhead::rmsnorm_custom", mutates_args=())
    def rmsnorm_custom(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y = torch.empty_like(x)
        launch_rmsnorm(x, None, weight, eps, y, None)
        return y

    @rmsnorm_custom.register_fake
    def _(x, weight, eps):
        return torch.empty_like(x)

    import normalization.triton_rmsnorm as module
    saved = {name: getattr(module, name) for name in ("_rmsnorm_fused_kernel", "_rmsnorm_looped_kernel")}
    wrapped = {name: torch.library.wrap_triton(kernel) for name, kernel in saved.items()}

    @torch.library.triton_op("op_overhead::rmsnorm_triton", mutates_args=())
    def rmsnorm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        y = torch.empty_like(x)
        for name, kernel in wrapped.items():  # launch_rmsnorm launches the wrapped kernels
            setattr(module, name, kernel)
        try:
            launch_rmsnorm(x, None, weight, eps, y, None)
        finally:
            for name, kernel in saved.items():
                setattr(module, name, kernel)
        return y

    return rmsnorm_custom, rmsnorm_triton


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="interpreter: the code runs, numbers mean nothing")
    args = parser.parse_args()
    if INTERPRET and not args.smoke:
        sys.exit("op_overhead needs a CUDA GPU (or --smoke for the interpreter)")
    x = torch.randn(1, 4096, device=DEVICE).to(torch.bfloat16)
    w = torch.randn(4096, device=DEVICE).to(torch.bfloat16)
    custom, triton_op = register_ops()

    def checked(op):
        def call():
            check_norm_args(x, w, 1e-6)  # the Python function keeps its checks before the op
            return op(x, w, 1e-6)
        return call

    rows = {
        "bare Triton launch (empty kernel)": lambda: _empty_kernel[(1,)](x),
        "rmsnorm, our launcher": lambda: rmsnorm(x, w, 1e-6),
        "custom_op": checked(custom),
        "torch.ops custom_op (no checks)": lambda: torch.ops.op_overhead.rmsnorm_custom(x, w, 1e-6),
        "triton_op + wrap_triton": checked(triton_op),
        "F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6),
    }
    ref = rmsnorm(x, w, 1e-6).float()
    print(f"{describe()}, torch {torch.__version__}, triton {triton.__version__}; CPU us a call", flush=True)
    for grad_mode in ("eager", "no_grad"):
        with torch.no_grad() if grad_mode == "no_grad" else torch.enable_grad():
            for name, fn in rows.items():
                out = fn()
                if name not in ("bare Triton launch (empty kernel)", "F.rms_norm"):
                    assert (out.float() - ref).abs().max().item() == 0, name
                print(f"  {grad_mode:8s} {name:36s} {host_time_us(fn, calls=20 if args.smoke else 200):8.1f}",
                      flush=True)


if __name__ == "__main__":
    main()
