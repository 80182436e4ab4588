"""One script run as `python <script> <args>` would run it, for `make test` and `make bench`: its
stdout and stderr as one text stream, then its exit code.

    use_fork_server()                       # once, in Triton's interpreter only
    output, wait = start("attention/test_rope.py", env={"LLMK_TEST_SHARD": "1/2"})
    for line in output: ...
    code = wait()

A script is a fresh interpreter, or, after use_fork_server(), a child of one fork server that has
imported torch, Triton and the test harness once (PRELOAD). In the interpreter those imports are
~2 s of CPU a script, a tenth of CI's two test lanes and its smoke benchmarks. The child runs the
script as `python <script>` from the repository root would: its folder first on sys.path, its argv,
cwd and extra environment, its own `random` state (random reseeds in a forked child). What it
shares with its siblings: the server's str hash seed, and whatever the preloaded modules read from
the environment when imported (TRITON_INTERPRET, OMP_NUM_THREADS: the runner's, as for every
script). It ends through multiprocessing, so atexit handlers do not run (no script registers one),
and an uncaught exception's traceback is headed by the child's process name. On a GPU, where the
imports are a small share of a script's time, each script is a fresh interpreter.
"""

import multiprocessing
import multiprocessing.connection
import os
import pathlib
import runpy
import subprocess
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
# what every test and benchmark script imports first
PRELOAD = ["torch", "triton", "triton.language", "numpy", "llmk.devtools.testing"]
_server = None  # the fork server's multiprocessing context, once use_fork_server() has run
# multiprocessing's bookkeeping of its children is not thread-safe: start() polls every live child
# and a join reads a child's exit status once, so two threads at once can lose a status (read as
# 255). Starts and joins take turns; the waits for an end happen outside
_CHILDREN = threading.Lock()


def use_fork_server():
    """Start the scripts from here on as children of a fork server that has imported PRELOAD."""
    global _server
    if _server is None:
        _server = multiprocessing.get_context("forkserver")
        _server.set_forkserver_preload(PRELOAD)


def _child(rel, args, env, writer):
    """The fork server's child: script `rel` run as `python rel *args`, stdout and stderr into
    `writer`; its SystemExit is the child's exit code (multiprocessing's bootstrap)."""
    os.dup2(writer.fileno(), 1)
    os.dup2(writer.fileno(), 2)
    writer.close()
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
    os.environ.update(env)
    path = str(ROOT / rel)
    os.chdir(ROOT)
    sys.argv = [str(rel), *args]
    sys.path[0] = os.path.dirname(path)
    runpy.run_path(path, run_name="__main__")


def start(rel, args=(), env=None):
    """Start script `rel` (a path from the repository root) with `args` and the extra environment
    variables `env`: (its output, a text stream of lines that ends when the script does; a call
    that returns its exit code, made after the output has ended)."""
    env = env or {}
    if _server is not None:
        reader, writer = _server.Pipe(duplex=False)
        child = _server.Process(target=_child, args=(str(rel), list(args), env, writer))
        with _CHILDREN:
            child.start()
        writer.close()  # the child's copy is then the only writer: the output ends when it exits
        output = open(os.dup(reader.fileno()), encoding="utf-8", errors="replace")
        reader.close()

        def wait():
            output.close()
            multiprocessing.connection.wait([child.sentinel])
            with _CHILDREN:
                child.join()
                code = child.exitcode
                child.close()
            return code

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
