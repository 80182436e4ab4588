"""pytest collects every test script's CASES, the same list the script runs on its own."""

from llmk.common.device import INTERPRET, quiet_interpreter
from llmk.devtools.testing import select_cases


def pytest_configure(config):
    if INTERPRET:  # pytest resets the warning filters per test: install ours among its own
        quiet_interpreter()


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames and hasattr(metafunc.module, "CASES"):
        cases = select_cases(metafunc.module.CASES)
        metafunc.parametrize("case", cases, ids=[c.name for c in cases])
