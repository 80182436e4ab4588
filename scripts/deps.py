"""`make` runs this first, as a plain script (stdlib only, not through the `llmk` package, whose
imports it may be about to install): install whatever requirements.txt names that is missing or
too old, then this checkout as the package `llmk` if it is not installed (`pip install -e .`, the
README's set-up), and nothing when all is there (so it also works on a machine without network
access). An `llmk` installed from another checkout stops it: the tests would run that one's code."""

import importlib.util
import pathlib
import re
import subprocess
import sys
from importlib import metadata

ROOT = pathlib.Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements.txt"


def _version_tuple(version):
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def requirement_specs(lines):
    """{name: version spec} of requirement strings ("torch>=2.4" -> {"torch": ">=2.4"}, "numpy" ->
    {"numpy": ""}); comments and blank lines skipped."""
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            name = re.split(r"[<>=!~ ]", line, maxsplit=1)[0]
            out[name.lower()] = line[len(name) :].strip()
    return out


def requirements():
    """requirements.txt as requirement_specs."""
    return requirement_specs(REQUIREMENTS.read_text().splitlines())


def missing():
    """Requirement lines whose package is absent or below its `>=` bound."""
    out = []
    for name, spec in requirements().items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(name + spec)
            continue
        minimum = spec.partition(">=")[2]
        if minimum and _version_tuple(have) < _version_tuple(minimum):
            out.append(name + spec)
    return out


def installed_root():
    """The folder `llmk` imports from, or None when it is not installed."""
    spec = importlib.util.find_spec("llmk")
    return None if spec is None or spec.origin is None else pathlib.Path(spec.origin).resolve().parent


def build_backend_minimum():
    """The setuptools version pyproject.toml's [build-system] requires, as a string."""
    found = re.search(r'requires\s*=\s*\["setuptools>=([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    return found[1]


def builds_offline():
    """Whether pip can build this checkout with the setuptools at hand (--no-build-isolation), so
    without fetching one: at least the version pyproject.toml's build backend requires."""
    try:
        return _version_tuple(metadata.version("setuptools")) >= _version_tuple(build_backend_minimum())
    except metadata.PackageNotFoundError:
        return False


def install_checkout():
    """pip install -e <this checkout> --no-deps; offline when builds_offline(), as on a machine
    without network access."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)]
    if builds_offline():
        command.append("--no-build-isolation")
    print(f"installing this checkout as llmk: {' '.join(command[2:])}", flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    todo = missing()
    if todo:
        print(f"installing missing requirements: {' '.join(todo)}", flush=True)
        if subprocess.call([sys.executable, "-m", "pip", "install", "-q", *todo]):
            sys.exit(1)
    where = installed_root()
    if where is None:
        sys.exit(install_checkout())
    if where != ROOT:
        sys.exit(f"llmk is installed from {where}, not from this checkout ({ROOT}): pip install -e {ROOT}")
