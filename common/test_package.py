"""The repository as the package `llmk` (pyproject.toml): what it declares, which way its imports
run (common/ is the ground floor), and its wheel installed into a fresh virtual environment outside
the checkout, running a kernel and its backward there.

    python common/test_package.py        (or: pytest common/test_package.py)

The environment shares this interpreter's site-packages (torch and triton: installing them again
would take minutes and the network): the base interpreter's through --system-site-packages, and
through a .pth file the folders this interpreter imports the dependencies from, which differ when
it runs in a virtual environment itself. The check fails unless `llmk` imports from the wheel's
copy in that environment, not from this checkout.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile

from llmk.devtools.testing import Case, Outcome, Skip, main
from llmk.scripts.deps import build_backend_minimum, builds_offline, requirement_specs, requirements

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Runs in the environment, from a folder outside the checkout: RMSNorm forward and backward
# against PyTorch's, and where llmk came from.
PROBE = """
import llmk, torch
from llmk.common.device import DEVICE
from llmk.normalization.triton_rmsnorm import rmsnorm
x = torch.randn(5, 96, device=DEVICE, requires_grad=True)
w = torch.randn(96, device=DEVICE, requires_grad=True)
y = rmsnorm(x, w, 1e-6)
ref = torch.nn.functional.rms_norm(x, (96,), w, 1e-6)
dy = torch.randn_like(y)
got, want = torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(ref, (x, w), dy)
errs = [(y - ref).abs().max().item()] + [(g - r).abs().max().item() for g, r in zip(got, want)]
print("from", llmk.__file__)
print("version", llmk.__version__)
print("errors", *errs)
"""


def pyproject():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return None
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def check_declared():
    """requirements.txt lists pyproject's dependencies and its dev extras but transformers and ruff
    (optional lines there: `make` installs what requirements.txt names, and a GPU machine without
    network runs `make test` without them) with the same bounds, and pyproject lists every folder
    that is a package."""
    project = pyproject()
    if project is None:
        raise Skip("tomllib needs Python 3.11")
    deps = requirement_specs(project["project"]["dependencies"])
    dev = requirement_specs(project["project"]["optional-dependencies"]["dev"])
    dev.pop("transformers")
    dev.pop("ruff")
    listed = requirements()
    packages = set(project["tool"]["setuptools"]["packages"])
    folders = {
        "llmk." + ".".join(p.parent.relative_to(ROOT).parts)
        for p in ROOT.rglob("__init__.py")
        if p.parent != ROOT and not {"build", ".venv"} & set(p.relative_to(ROOT).parts)
    } | {"llmk"}
    return [
        Outcome(
            "requirements.txt = dependencies + dev extras",
            listed == {**deps, **dev},
            note=f"requirements {listed} pyproject {deps} dev {dev}"[:200],
        ),
        Outcome(
            "every package folder in pyproject's packages",
            packages == folders,
            note=f"missing {sorted(folders - packages)}, extra {sorted(packages - folders)}",
        ),
    ]


KERNEL_FOLDERS = (
    "attention",
    "cuda_cpp",
    "gemm",
    "inference",
    "losses",
    "mlp",
    "models",
    "moe",
    "normalization",
    "optimizers",
    "benchmarks",
    "scripts",
    "devtools",
)


def check_floors():
    """common/, the ground floor (the runtime), imports no kernel folder, benchmark or tool, devtools/
    included (its tests may)."""
    import ast

    bad = []
    for path in sorted((ROOT / "common").glob("*.py")):
        if path.name.startswith("test_"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            bad += [f"{path.name}: {n}" for n in names if n.split(".")[:2] in [["llmk", f] for f in KERNEL_FOLDERS]]
    return [Outcome("common/ imports only common/ of llmk", not bad, note=", ".join(bad)[:200])]


def run(command, cwd, label, pythonpath=None):
    """command's stdout; its environment's own import paths only, plus `pythonpath` when given."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
        raise RuntimeError(f"{label} failed: {tail[0][:150]}")
    return proc.stdout


def dependency_folders():
    """The folders this interpreter imports the declared dependencies from. A .pth file's lines
    only extend sys.path (the .pth files inside them do not run), so this checkout's editable
    install, if there is one, stays out of the environment. A folder inside the checkout is kept (a
    `.venv` there is where the README's set-up installs torch); the checkout itself, or a folder
    from which `import llmk` would find it, is not."""
    specs = [s for s in map(importlib.util.find_spec, requirements()) if s is not None]
    folders = [
        pathlib.Path(s.origin).parent.parent if s.submodule_search_locations else pathlib.Path(s.origin).parent
        for s in specs
    ]  # a package's folder's parent; a one-file module's folder
    return list(dict.fromkeys(str(f) for f in folders if not exposes_checkout(f)))


def exposes_checkout(folder):
    """Whether `folder` on sys.path would import this checkout: it is the checkout, or holds it
    under the package's name."""
    return folder.resolve() == ROOT or (folder / "llmk").resolve() == ROOT


def check_wheel():
    """Build the wheel, install it (without dependencies) into a new environment, and run the
    probe there from an empty folder."""
    if not builds_offline():  # pip would fetch a newer setuptools: a machine without network fails there
        raise Skip(f"building the wheel offline needs setuptools >= {build_backend_minimum()} here")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        build = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(ROOT),
        ]
        run(build, tmp, "pip wheel")
        (wheel,) = (tmp / "dist").glob("llmk-*.whl")
        names = zipfile.ZipFile(wheel).namelist()
        run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "env")], tmp, "venv")
        python = tmp / "env" / ("Scripts" if os.name == "nt" else "bin") / "python"
        run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp, "pip install")
        site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, "venv")
        (pathlib.Path(site.strip()) / "llmk_test_deps.pth").write_text("\n".join(dependency_folders()) + "\n")
        (tmp / "work").mkdir()
        out = run([str(python), "-W", "ignore", "-c", PROBE], tmp / "work", "the probe")
        where = out.split("from ", 1)[1].split()[0]
        version = out.split("version ", 1)[1].split()[0]
        meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        errors = [float(e) for e in out.split("errors", 1)[1].split()]
    return [
        Outcome(
            "the wheel holds the kernels and the CUDA sources",
            "llmk/normalization/triton_rmsnorm.py" in names
            and "llmk/cuda_cpp/csrc/rmsnorm.cu" in names
            and not any(n.startswith("llmk/build/") for n in names),
            note=wheel.name,
        ),
        Outcome(
            "the wheel's license is MIT, with its LICENSE file",
            "License-Expression: MIT" in meta and any(n.endswith("licenses/LICENSE") for n in names),
        ),
        Outcome(
            "llmk.__version__ is the wheel's version",
            wheel.name.startswith(f"llmk-{version}-"),
            note=f"{version} {wheel.name}",
        ),
        Outcome(
            "llmk imported from the environment, not the checkout",
            where.startswith(str(tmp / "env")) and not where.startswith(str(ROOT)),
            note=where[-80:],
        ),
        Outcome(
            "rmsnorm forward and backward there, against PyTorch",
            max(errors) < 1e-4,
            max_abs=max(errors),
            limit="1e-04",
        ),
    ]


def check_old_triton():
    """A Triton too old for the interpreter lane is named, with the version to install, by
    interpreter_problem (which `make test` and every test script stop on), and a new enough one,
    or the GPU path, passes."""
    from unittest import mock

    from llmk.common import device

    def problem(version, interpret=True):
        with (
            mock.patch.object(device.metadata, "version", lambda name: version),
            mock.patch.object(device, "INTERPRET", interpret),
        ):
            return device.interpreter_problem()

    old = problem("3.8.0")
    return [
        Outcome(
            "Triton 3.8 in the interpreter: named, with what to install",
            old is not None and "3.8.0" in old and 'pip install "triton>=3.9"' in old,
            note=(old or "")[:100],
        ),
        Outcome("Triton 3.9 and 3.10: no problem", problem("3.9.0") is None and problem("3.10.1") is None),
        Outcome("the GPU path: no problem whatever the version", problem("3.6.0", interpret=False) is None),
    ]


FACADE_PROBE = """
import importlib, json, sys
out = {}
for folder in %r:
    package = importlib.import_module("llmk." + folder)
    loaded = sorted(m for m in sys.modules if m.startswith("llmk." + folder + "."))
    names = {}
    for name in package.__all__:
        value = getattr(package, name)
        names[name] = getattr(value, "__module__", "")
    try:
        getattr(package, "no_such_name")
        missing = "no error"
    except AttributeError as e:
        missing = str(e)
    out[folder] = dict(loaded_on_import=loaded, names=names, missing=missing,
                       in_dir=all(n in dir(package) for n in package.__all__))
print(json.dumps(out))
"""
FACADES = ("normalization", "attention", "mlp", "gemm", "losses", "inference", "optimizers", "models")


def check_facades():
    """Each folder's facade (common/exports.py), in a fresh interpreter: importing the folder loads
    none of its modules; every name of its __all__ resolves to an object defined in that folder and
    is in dir(); an unknown name raises AttributeError naming it."""
    import json

    import llmk

    # the folder this process imports llmk from (an install, or a PYTHONPATH entry holding it)
    where = os.pathsep.join([str(pathlib.Path(llmk.__file__).parent.parent), os.environ.get("PYTHONPATH", "")])
    found = json.loads(
        run(
            [sys.executable, "-c", FACADE_PROBE % (FACADES,)], ROOT, "facade probe", where.rstrip(os.pathsep)
        ).splitlines()[-1]
    )
    outcomes = []
    for folder in FACADES:
        got = found[folder]
        outside = {n: m for n, m in got["names"].items() if not m.startswith(f"llmk.{folder}.")}
        outcomes += [
            Outcome(
                f"{folder}: importing it loads no module of it",
                not got["loaded_on_import"],
                note=", ".join(got["loaded_on_import"])[:150],
            ),
            Outcome(
                f"{folder}: {len(got['names'])} names from its own modules, in dir()",
                bool(got["names"]) and not outside and got["in_dir"],
                note=str(outside)[:150],
            ),
            Outcome(
                f"{folder}: an unknown name raises AttributeError",
                "no_such_name" in got["missing"],
                note=got["missing"][:100],
            ),
        ]
    return outcomes


CASES = [
    Case("pyproject and requirements.txt", check_declared),
    Case("floors", check_floors),
    Case("folder facades", check_facades),
    Case("wheel in a fresh environment", check_wheel),
    Case("a Triton too old for the interpreter", check_old_triton),
]


def test_case(case):  # pytest: the root conftest parametrizes `case` from CASES
    case.check()


if __name__ == "__main__":
    main("the llmk package", CASES)
