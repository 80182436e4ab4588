"""`make` runs this first, as a plain script (stdlib only, not through the `common` package, whose
imports it may be about to install): install whatever requirements.txt names that is missing or
too old, and nothing when all is there (so it also works on a machine without network access)."""
import pathlib
import re
import subprocess
import sys
from importlib import metadata

REQUIREMENTS = pathlib.Path(__file__).resolve().parents[1] / "requirements.txt"


def _version_tuple(version):
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def missing():
    """Requirement lines whose package is absent or below its `>=` bound."""
    out = []
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, _, minimum = line.partition(">=")
        try:
            have = metadata.version(name.strip())
        except metadata.PackageNotFoundError:
            out.append(line)
            continue
        if minimum and _version_tuple(have) < _version_tuple(minimum):
            out.append(line)
    return out


if __name__ == "__main__":
    todo = missing()
    if todo:
        print(f"installing missing requirements: {' '.join(todo)}", flush=True)
        sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "-q", *todo]))
