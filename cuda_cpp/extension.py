"""Build and load the CUDA kernels of cuda_cpp/csrc at first use (torch.utils.cpp_extension.load_inline).

The .cu sources (kernels and their host launchers, no torch headers) are compiled by nvcc as one
unit, bindings.cpp (pybind11, integers only) by the host compiler; ninja caches the objects in
build/cuda-ext and rebuilds only when a source or header changes. The first build takes well under
a minute (about a minute on a torch whose load_inline lacks no_implicit_headers).

Flags: -O3; no --use_fast_math. The kernels are memory-bound, so it would buy nothing, and its
flush-to-zero would change results: every bf16 subnormal is an fp32 subnormal, and would become 0
(SwiGLU of a subnormal gate). The one transcendental, exp in SwiGLU, calls __expf directly.
"""

import functools
import hashlib
import inspect
import os
import pathlib
import shutil
import sys
import time

import torch

CSRC = pathlib.Path(__file__).resolve().parent / "csrc"
BUILD_DIR = pathlib.Path(__file__).resolve().parents[1] / "build" / "cuda-ext"
CUDA_SOURCES = ("rmsnorm.cu", "rope.cu", "swiglu.cu")
HEADERS = ("common.cuh", "launchers.h")
NAME = "llm_kernels_cuda"


@functools.lru_cache(maxsize=None)
def unavailable_reason():
    """None when the kernels can be built and run here; otherwise why not, in one line."""
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    from torch.utils import cpp_extension

    nvcc = os.environ.get("PYTORCH_NVCC") or (
        os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc") if cpp_extension.CUDA_HOME else None
    )
    if not nvcc or not (os.path.exists(nvcc) or shutil.which(nvcc)):
        return "no nvcc (set CUDA_HOME to a CUDA toolkit, or put nvcc on PATH)"
    if not cpp_extension.is_ninja_available():
        return "no ninja (torch.utils.cpp_extension builds with it)"
    return None


_build_error = None  # a failed build fails every later call at once, instead of building again


@functools.lru_cache(maxsize=None)
def extension():
    """The compiled module (functions rmsnorm, rope, swiglu of csrc/bindings.cpp), built on first call."""
    global _build_error
    if _build_error is not None:
        raise RuntimeError(f"the CUDA kernels failed to build earlier in this process ({_build_error})")
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"the CUDA kernels cannot run here: {reason}")
    from torch.utils.cpp_extension import load_inline

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    options = {}
    if "no_implicit_headers" in inspect.signature(load_inline).parameters:
        # no torch headers in either file: the build takes seconds instead of a minute
        options["no_implicit_headers"] = True
    arch_was_set = "TORCH_CUDA_ARCH_LIST" in os.environ
    if not arch_was_set:  # this GPU only (9.0 on an H100 / H200), not every arch torch knows
        major, minor = torch.cuda.get_device_capability()
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    # load_inline rebuilds when a source string changes; the headers' hash makes their edits count
    stamp = "// headers " + hashlib.sha1(b"".join((CSRC / h).read_bytes() for h in HEADERS)).hexdigest()
    t0 = time.perf_counter()
    print(f"building the CUDA kernels in {BUILD_DIR} (cached after the first build) ...", file=sys.stderr, flush=True)
    try:
        module = load_inline(
            name=NAME,
            cpp_sources=[stamp, (CSRC / "bindings.cpp").read_text()],
            cuda_sources=[stamp] + [(CSRC / name).read_text() for name in CUDA_SOURCES],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"],
            extra_include_paths=[str(CSRC)],
            build_directory=str(BUILD_DIR),
            verbose=False,
            **options,
        )
    except Exception as e:
        # in full on stderr: a test table keeps only the start of an exception's message
        print(
            f"building the CUDA kernels of {CSRC} failed; build files in {BUILD_DIR}:\n{e}", file=sys.stderr, flush=True
        )
        _build_error = f"{type(e).__name__}, compiler output above"
        raise RuntimeError(f"building the CUDA kernels failed ({_build_error})") from e
    finally:
        if not arch_was_set:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
    print(f"CUDA kernels ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return module
