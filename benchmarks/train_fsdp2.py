"""Training under FSDP2: a full step (forward, backward, optimizer) of benchmarks/train_bench.py's
llama-1.5b sharded with torch.distributed.fsdp.fully_shard (each decoder layer, then the root) over
the GPUs of one host, B2 x T4096 on each GPU, bf16 parameters and gradients, use_cache=False.

Providers, each on a fresh model from the same seed (train_bench.build / prepare / optimizer), one
process a GPU, all in step:
  eager               transformers as it ships, torch.optim.AdamW(fused=True)
  triton              patched with models/hf_patch.py (before sharding), TritonAdamW (fp32 m and v,
                      each rank stepping its own shards)
  triton+torch-adamw  the patched model with torch's fused AdamW
  liger               Liger-Kernel's apply_liger_kernel_to_llama (before sharding); skipped where
                      liger_kernel does not import
Each rank trains on its own batches (train_bench.batches, one stream dealt round the ranks).

Row: op "train_step_fsdp2", shape "<model> BxT xN GPUs" (B x T a GPU), ms a step (the median over
STEPS timed steps after WARMUP of the slowest rank's time: every rank synchronizes the device after
each step), tokens_per_s = N*B*T / step over all GPUs, peak_MB = the largest
torch.cuda.max_memory_allocated of any rank over the timed steps, first_loss = the first step's
loss (mean over the ranks) and max_err = |first_loss - eager's|, gated as train_bench gates it;
world_size = N; state_MB = the optimizer state's bytes on the fullest rank (each param's exp_avg and
exp_avg_sq, a DTensor's local shard) and steady_MB = its torch.cuda.memory_allocated after the
timed steps (parameters, gradients, state), which split peak_MB into what stays and what a step adds.
meta adds world_size, gpus (each rank's torch.cuda.get_device_name), skipped (provider: reason).

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        benchmarks/train_fsdp2.py                 (-> benchmarks/results/train_fsdp2.json)
    python benchmarks/train_fsdp2.py              (the same: starts the two ranks under torchrun)
    python benchmarks/train_fsdp2.py --smoke      (train_bench's tiny model into build/bench-smoke; with
                                                   fewer than 2 GPUs, two CPU ranks over gloo, our
                                                   kernels in Triton's interpreter)
--only filters the providers.
Needs transformers (optional for the repository): without it the script says so and exits 0.
"""

import importlib.util
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch

from llmk.benchmarks.train_bench import (
    FULL_PLAN,
    LOSS_ATOL,
    MODELS,
    SMOKE_MODELS,
    SMOKE_PLAN,
    batches,
    build,
    optimizer,
    prepare,
    release,
    run_steps,
)
from llmk.common.device import DEVICE, INTERPRET
from llmk.devtools.harness import Run, parse_args, run
from llmk.devtools.peers import LIGER
from llmk.devtools.results import make_row
from llmk.models.fsdp2 import rank_device, shard

ROOT = pathlib.Path(__file__).resolve().parents[1]

NAME = "train_fsdp2"  # benchmarks/results/train_fsdp2.json
OP = "train_step_fsdp2"
N_GPUS = 2  # ranks started when not already under torchrun
FSDP2_MODELS = {"llama-1.5b": MODELS["llama-1.5b"]}
PROVIDERS = ("eager", "triton", "triton+torch-adamw", LIGER)
OURS = ("triton", "triton+torch-adamw")
# a peer that may refuse sharded parameters: its row is skipped with the error, where an error of
# ours or of eager stops the run
REFUSABLE = {LIGER: "liger-kernel under FSDP2"}


def under_torchrun():
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _over_ranks(values, op):
    """values (floats) reduced elementwise over the ranks with `op`, as a list."""
    t = torch.tensor(values, dtype=torch.float64, device=rank_device())
    torch.distributed.all_reduce(t, op=op)
    return t.tolist()


def state_bytes(opt):
    """Bytes of the optimizer's tensors on this rank (a DTensor's: its local shard's)."""
    total = 0
    for state in opt.state.values():
        for t in state.values():
            if isinstance(t, torch.Tensor) and t.device.type != "cpu":
                local = getattr(t, "_local_tensor", t)
                total += local.numel() * local.element_size()
    return total


def timed_steps(model, opt, data, plan):
    """(median ms a step of the slowest rank, {peak_MB, steady_MB, state_MB} of the fullest rank,
    first loss averaged over the ranks): the first step (its loss), WARMUP - 1 more, then STEPS
    timed ones."""
    dist = torch.distributed
    first, samples = run_steps(model, opt, data, plan, before_timing=dist.barrier)  # timed steps start together
    first = _over_ranks([first], dist.ReduceOp.SUM)[0] / dist.get_world_size()
    slowest = _over_ranks(samples, dist.ReduceOp.MAX)
    memory = {}
    if not INTERPRET:
        figures = [torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated(), state_bytes(opt)]
        peak, steady, state = _over_ranks([x / 1e6 for x in figures], dist.ReduceOp.MAX)
        memory = dict(peak_MB=round(peak, 1), steady_MB=round(steady, 1), state_MB=round(state, 1))
    return statistics.median(slowest), memory, first


def measure_provider(bench, kind, config, provider, data, plan):
    """(ms, memory figures, first loss) of one provider on a fresh sharded model, or the reason it was refused."""
    model = build(kind, config)  # use_cache=False
    undo = prepare(model, kind, provider, bench.args.smoke)
    try:
        shard(model)
        opt = optimizer(model, provider, plan["lr"])
        try:
            return timed_steps(model, opt, data, plan)
        except Exception as e:  # every rank meets it alike: the same model, code and shapes
            if provider not in REFUSABLE:
                raise
            return f"{REFUSABLE[provider]}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    finally:
        del model
        release(undo)


def measure(bench, models, plan):
    """Every provider of every model, in the same order on every rank; rank 0 records the rows."""
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    gpus = [None] * world
    dist.all_gather_object(gpus, torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu")
    if rank == 0:
        script = " ".join(bench.meta["command"].split()[1:])  # "python <this file> <options>" on each rank
        bench.meta.update(
            command=f"python -m torch.distributed.run --standalone --nproc_per_node {world} {script}",
            world_size=world,
            gpus=gpus,
            plan=plan,
            skipped={},
            fsdp2="fully_shard each decoder layer, then the root; torch's defaults otherwise",
            NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE"),
        )
    bench.total = len(models) * len(PROVIDERS)
    t0 = time.perf_counter()
    for name, (kind, config) in models.items():
        units = "GPUs" if DEVICE == "cuda" else "CPU ranks"
        shape = f"{name} {plan['batch']}x{plan['seq']} x{world} {units}"
        n_steps = plan["warmup"] + plan["steps"]
        data = batches(config["vocab_size"], plan, n_steps * world)[rank::world]  # this rank's share
        eager_first = None
        for provider in PROVIDERS:
            if not bench.selected(OP, shape, provider) and provider != "eager":  # eager: the loss baseline
                continue
            if provider == LIGER and (INTERPRET or importlib.util.find_spec("liger_kernel") is None):
                result = "liger-kernel unavailable here"
            else:
                result = measure_provider(bench, kind, config, provider, data, plan)
            if rank != 0:
                continue
            if isinstance(result, str):  # the reason it was skipped
                bench.skip((OP, shape, "bf16"), provider, result)
                bench.meta["skipped"][provider] = result
                continue
            ms, memory, first = result
            if provider == "eager":
                eager_first = first
            err = abs(first - eager_first) if eager_first is not None else None
            row = make_row(OP, shape, "bf16", provider, ms, bench.meta["copy_GBps"], max_err=err)
            row.update(
                tokens_per_s=round(world * plan["batch"] * plan["seq"] * 1e3 / ms, 1),
                peak_MB=memory.get("peak_MB"),
                first_loss=first,
                world_size=world,
                steady_MB=memory.get("steady_MB"),
                state_MB=memory.get("state_MB"),
            )
            bench.add(row)
    if rank == 0:
        bench.meta["run_s"] = round(time.perf_counter() - t0, 1)


def _no_charts(meta, rows):
    """The FSDP2 rows are a table (docs); train_bench.py draws the loss curves."""


def _rank_main(args):
    """One rank: rank 0 runs the harness (copy bandwidth, rows, JSON, the max_err gate) around
    measure(); the others run measure() beside it, recording nothing."""
    import datetime

    import torch.distributed as dist

    if DEVICE == "cuda":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # read when NCCL makes its communicator
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", timeout=datetime.timedelta(minutes=20))
    models, plan = (SMOKE_MODELS, SMOKE_PLAN) if args.smoke else (FSDP2_MODELS, FULL_PLAN)
    try:
        if dist.get_rank() == 0:
            run(
                args,
                NAME,
                _no_charts,
                measure=lambda bench: measure(bench, models, plan),
                ours=OURS,
                atol={"bf16": LOSS_ATOL},
            )
        else:
            measure(Run(args, None, OURS), models, plan)
    finally:
        dist.destroy_process_group()
    return 0


def _launch(argv):
    """This file under torchrun, N_GPUS ranks, with `argv`; its exit code. Where there are fewer
    GPUs (--smoke only), the ranks run on the CPU, over gloo, our kernels in Triton's interpreter."""
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    if torch.cuda.device_count() < N_GPUS:
        env["TRITON_INTERPRET"] = "1"  # common.device then puts every tensor on the CPU
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // N_GPUS)))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(N_GPUS),
        str(pathlib.Path(__file__).resolve().relative_to(ROOT)),
        *argv,
    ]
    print(f"{NAME}: {' '.join(command[1:])}", flush=True)
    code = subprocess.call(command, cwd=ROOT, env=env)
    if code != 0:
        print(
            f"{NAME}: torchrun exited {code} (a rank failed, or a row of ours failed the max_err gate: "
            "see the output above)",
            file=sys.stderr,
        )
    return code


def main_fsdp2(args):
    """The FSDP2 rows. args: devtools.harness.parse_args's options (--smoke, --only, --out, ...).
    Under torchrun this process is one rank; otherwise it starts N_GPUS ranks of this file under
    torchrun with this command's options and returns their exit code."""
    if importlib.util.find_spec("transformers") is None:
        print(f"{NAME}: skipped, transformers is not installed (optional: pip install transformers==5.17.0)")
        return 0
    if args.replot:
        print(f"{NAME}: no charts to draw (the FSDP2 rows are a table)")
        return 0
    if under_torchrun():
        return _rank_main(args)
    if not args.smoke and torch.cuda.device_count() < N_GPUS:
        print(
            f"{NAME}: needs {N_GPUS} CUDA GPUs, found {torch.cuda.device_count()} (--smoke runs the code on CPU ranks)",
            file=sys.stderr,
        )
        return 2
    return _launch(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main_fsdp2(parse_args(__doc__)))
