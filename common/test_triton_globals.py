"""Every @triton.jit function reads only the globals Triton's compiler accepts.

    python common/test_triton_globals.py        (or: pytest common/test_triton_globals.py)

Triton's code generator refuses a global of a plain Python type (an int or float constant, say)
inside a kernel: only tl.constexpr values, modules, other jit functions and triton.language's own
objects may be read (`NameError: Cannot access global variable ...`). The interpreter, which CI
runs, has no such rule, so a kernel that breaks on a GPU at its first compile passes there. This
test reads each kernel module's jit functions and fails on every name they load from the module's
globals that holds a bool, int, float or str that is not a tl.constexpr. One case a package.
"""

import ast
import importlib
import inspect
import pathlib
import textwrap

import triton.language as tl

from llmk.devtools.testing import Case, Outcome, main

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = (
    "attention",
    "common",
    "cuda_cpp",
    "gemm",
    "inference",
    "losses",
    "mlp",
    "models",
    "normalization",
    "optimizers",
)
PLAIN = (bool, int, float, str)


def kernel_modules(package):
    """The package's modules other than tests, as import names."""
    for path in sorted((ROOT / package).glob("*.py")):
        if not path.name.startswith("test_") and path.name != "__init__.py":
            yield f"llmk.{package}.{path.stem}"


def jit_functions(module):
    """(name, Python function) of each @triton.jit function defined in `module` (compiled or
    interpreted: both keep the function as .fn)."""
    for name, obj in vars(module).items():
        fn = getattr(obj, "fn", None)
        if inspect.isfunction(fn) and fn.__module__ == module.__name__ and hasattr(obj, "arg_names"):
            yield name, fn


def plain_globals(source, scope):
    """The names the function in `source` loads from `scope` (its module's globals) that hold a
    plain (non-constexpr) Python value."""
    func = ast.parse(textwrap.dedent(source)).body[0]
    names = [n for n in ast.walk(func) if isinstance(n, ast.Name)]
    local = {a.arg for a in func.args.args + func.args.kwonlyargs}
    local |= {n.id for n in names if isinstance(n.ctx, ast.Store)}
    return sorted(
        {
            n.id
            for n in names
            if isinstance(n.ctx, ast.Load)
            and n.id not in local
            and isinstance(scope.get(n.id), PLAIN)
            and not isinstance(scope[n.id], tl.constexpr)
        }
    )


def check(package):
    outcomes, n_kernels = [], 0
    for module_name in kernel_modules(package):
        module = importlib.import_module(module_name)
        for name, fn in jit_functions(module):
            n_kernels += 1
            bad = plain_globals(inspect.getsource(fn), fn.__globals__)
            if bad:
                outcomes.append(
                    Outcome(
                        f"{module_name}.{name}",
                        False,
                        note=f"plain globals {bad}: make them tl.constexpr or pass them in",
                    )
                )
    return outcomes + [Outcome(f"{n_kernels} jit functions read only constexpr globals", not outcomes)]


def check_detects():
    """The check finds a plain global and passes a constexpr one and a parameter of the same name."""
    scope = {"PLAIN_VALUE": 0.5, "CONST_VALUE": tl.constexpr(0.5)}
    return [
        Outcome(
            "a float global is found",
            plain_globals("def f(x):\n    return x * PLAIN_VALUE\n", scope) == ["PLAIN_VALUE"],
        ),
        Outcome("a tl.constexpr global is not", plain_globals("def f(x):\n    return x * CONST_VALUE\n", scope) == []),
        Outcome(
            "a parameter named like a global is not",
            plain_globals("def f(x, PLAIN_VALUE):\n    return x * PLAIN_VALUE\n", scope) == [],
        ),
    ]


CASES = [Case(package, check, dict(package=package)) for package in PACKAGES] + [
    Case("the check detects a plain global", check_detects)
]


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("kernel globals", CASES)
