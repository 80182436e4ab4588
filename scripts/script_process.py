"""One script run as `python <script> <args>` would run it, for `make test` and `make bench`: its
stdout and stderr as one text stream, then its exit code.

    use_fork_server()                       # once, in Triton's interpreter only
    output, wait = start("attention/test_rope.py", env={"LLMK_TEST_SHARD": "1/2"})
    for line in output: ...
    code = wait()

A script is a fresh interpreter, or, after use_fork_server(), a child of one fork server that has
imported torch, Triton and the test harness once (PRELOAD). In the interpreter those imports are
~2 s of CPU a script, a tenth of CI's two test lanes and its smoke benchmarks. The child still runs
the script as a fresh interpreter would: its folder first on sys.path, its own argv and environment,
a fresh `random` seed (the harness's TEST_SEED). Not on a GPU: a forked process must not inherit
CUDA state, and there the imports are a small share of a script's time.
"""

import multiprocessing
import os
import pathlib
import random
import runpy
import subprocess
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
# what every test and benchmark script imports first
PRELOAD = ["torch", "triton", "triton.language", "numpy", "llmk.devtools.testing"]
_SERVER = []  # the fork server's multiprocessing context, once use_fork_server() has run
_STARTING = threading.Lock()  # one child started at a time: the runners' threads share the server


def use_fork_server():
    """Start the scripts from here on as children of a fork server that has imported PRELOAD."""
    if not _SERVER:
        _SERVER.append(multiprocessing.get_context("forkserver"))
        _SERVER[0].set_forkserver_preload(PRELOAD)


def _child(rel, args, env, writer):
    """The fork server's child: script `rel` run as `python rel *args`, stdout and stderr into
    `writer`; its SystemExit is the child's exit code (multiprocessing's bootstrap)."""
    os.dup2(writer.fileno(), 1)
    os.dup2(writer.fileno(), 2)
    writer.close()
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
    os.environ.update(env)
    random.seed()  # the server's state would be every child's
    path = str(ROOT / rel)
    os.chdir(ROOT)
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(path)
    runpy.run_path(path, run_name="__main__")


def start(rel, args=(), env=None):
    """Start script `rel` (a path from the repository root) with `args` and the extra environment
    variables `env`: (its output, a text stream of lines that ends when the script does; a call
    that returns its exit code, made after the output has ended)."""
    env = env or {}
    if _SERVER:
        reader, writer = _SERVER[0].Pipe(duplex=False)
        child = _SERVER[0].Process(target=_child, args=(str(rel), list(args), env, writer))
        with _STARTING:
            child.start()
        writer.close()  # the child's copy is then the only writer: the output ends when it exits
        output = open(os.dup(reader.fileno()), encoding="utf-8", errors="replace")
        reader.close()

        def wait():
            output.close()
            child.join()
            return child.exitcode

        return output, wait
    proc = subprocess.Popen(
        [sys.executable, "-u", str(rel), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, **env) if env else None,
    )
    return proc.stdout, proc.wait
