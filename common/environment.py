"""A context manager that sets one environment variable for a block: the switches our kernels read
per call (LLMK_ATTENTION_PATH, LLMK_CHECK_SEQLENS) set for a region of code or a test."""

import contextlib
import os


@contextlib.contextmanager
def environment(name, value):
    """os.environ[name] = value inside the block, then restored (unset again if it was)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
