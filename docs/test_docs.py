"""Tests for the user docs: the README's example runs, every relative link resolves, the generated
results pages and the README's table agree with the committed JSON, and the README stays short.

    python docs/test_docs.py        (or: pytest docs/test_docs.py)

The example cases run the README's Python block and docs/example.py in fresh processes from the
repository root, as a reader would paste them; without transformers the README block (which
patches a model) is skipped with a note, and docs/example.py skips its model part itself.
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from llmk.devtools.testing import Case, Outcome, Skip, main
from llmk.scripts import report

ROOT = pathlib.Path(__file__).resolve().parents[1]

README_MAX_LINES = 300
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def docs_pages():
    """README.md and every markdown page under docs/."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def broken_links(path):
    """Relative links in a markdown file (outside code blocks) whose target does not exist."""
    text = FENCE.sub("", path.read_text())
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        if not (path.parent / target.split("#")[0]).exists():
            out.append(target)
    return out


def check_links():
    outcomes = []
    for page in docs_pages():
        bad = broken_links(page)
        outcomes.append(
            Outcome(f"links in {page.relative_to(ROOT)}", not bad, bad=str(len(bad)), note=", ".join(bad)[:120])
        )
    return outcomes


def check_generated():
    """`make report` would change nothing: the pages and the README table match the JSON."""
    stale = [
        str(p.relative_to(ROOT)) for p, text in report.outputs().items() if not p.exists() or p.read_text() != text
    ]
    return [
        Outcome(
            "docs/results and README table up to date",
            not stale,
            bad=str(len(stale)),
            note=("run `make report`: " + ", ".join(stale))[:120] if stale else "",
        )
    ]


def check_readme_length():
    n = len((ROOT / "README.md").read_text().splitlines())
    return [Outcome("README.md length", n <= README_MAX_LINES, limit=f"<= {README_MAX_LINES} lines", note=f"{n} lines")]


def check_report_robust():
    """The generator on results with a provider, some rows and a whole file missing, and meta
    fields it does not know (a commit, a dirty tree, a nested dict): it writes every other page."""
    import json
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for path in report.RESULTS.glob("*.json"):
            shutil.copy(path, tmp / path.name)
        data = json.loads((tmp / "norm.json").read_text())
        first = data["rows"][0]["shape"]
        data["rows"] = [r for r in data["rows"] if r["provider"] != "torch.compile" and r["shape"] != first]
        data["meta"].update(commit="0123456789abcdef", dirty=True, harness={"rep_ms": 100})
        (tmp / "norm.json").write_text(json.dumps(data))
        (tmp / "e2e.json").unlink()
        readme = tmp / "README.md"
        readme.write_text(f"intro\n{report.SUMMARY_BEGIN}\nSTALE TABLE\n{report.SUMMARY_END}\nend\n")
        out = report.outputs(results=tmp, pages=tmp / "pages", readme=readme)
    pages = {p.name: text for p, text in out.items()}
    n_pages = sum(name.endswith(".md") and name != "README.md" for name in pages)
    with_json = sum((report.RESULTS / f"{a}.json").exists() for a in report.AREA_NAMES) - 1  # e2e.json removed
    return [
        Outcome("every area with a JSON gets a page", n_pages == with_json, note=f"{n_pages} pages"),
        Outcome("commit shown", "`0123456789ab` (uncommitted changes)" in pages.get("norm.md", "")),
        Outcome(
            "README table replaced between the markers",
            "STALE TABLE" not in pages["README.md"]
            and "| RMSNorm |" in pages["README.md"]
            and pages["README.md"].endswith("end\n"),
        ),
    ]


def run_python(args, label, env=None, cwd=ROOT):
    """Run python with args in a fresh process (from the repository root unless cwd), as a reader
    would; it passes when it exits 0, prints only its one `generated ...` line (no object echoed at
    the prompt) and writes nothing to stderr (no warning)."""
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=600,
    )
    ok = proc.returncode == 0
    tail = ((proc.stdout if ok else proc.stderr).strip().splitlines() or [""])[-1]
    printed = proc.stdout.strip().splitlines()
    quiet = len(printed) == 1 and printed[0].startswith("generated ") and not proc.stderr.strip()
    extra = next((line for line in proc.stderr.strip().splitlines() + printed[:-1]), "")
    return [
        Outcome(label, ok, note=tail[:120]),
        Outcome(f"{label}: nothing printed but its result", quiet, note=extra[:120]),
    ]


# Feeds a file's lines one at a time to an interactive console, as a reader pasting them at the
# `>>>` prompt would, and exits 1 on the first error the console reports (it prints and goes on).
CONSOLE = """
import code, sys
class Console(code.InteractiveConsole):
    failed = False
    def write(self, data):
        Console.failed = True
        sys.stderr.write(data)
console = Console()
for line in open(sys.argv[1]).read().splitlines() + [""]:
    console.push(line)
    if Console.failed:
        sys.exit(1)
"""


def readme_example():
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    example = [b for b in blocks if "patch_model" in b]
    return example[0] if example else None


def check_readme_example():
    """docs/example.py's code is the README's block."""
    example = readme_example()
    if example is None:
        return [Outcome("README example", False, note="no ```python block that calls patch_model")]
    script = (ROOT / "docs" / "example.py").read_text()
    body = script.split('"""\n', 2)[-1]  # after the module docstring
    return [Outcome("docs/example.py's code = the README's block", body == example)]


def check_readme_example_runs():
    """The README's block, a line at a time at an interactive prompt, from a folder outside the
    checkout (it builds a transformers model)."""
    example = readme_example()
    if example is None:
        return [Outcome("README example", False, note="no ```python block that calls patch_model")]
    if importlib.util.find_spec("transformers") is None:
        raise Skip("transformers not installed")
    with tempfile.TemporaryDirectory() as tmp:
        pasted = pathlib.Path(tmp) / "pasted.py"
        pasted.write_text(example)
        return run_python(["-c", CONSOLE, str(pasted)], "README example, pasted line by line", cwd=tmp)


def check_example_file():
    return run_python([str(ROOT / "docs" / "example.py")], "docs/example.py")


CASES = [
    Case("relative links resolve", check_links),
    Case("generated pages up to date", check_generated),
    Case("README length", check_readme_length),
    Case("report with rows, providers and a file missing", check_report_robust),
    Case("README example = docs/example.py", check_readme_example),
    Case("README example runs", check_readme_example_runs),
    Case("docs/example.py runs", check_example_file),
]


def test_case(case):
    case.check()


if __name__ == "__main__":
    main("user docs: README, docs/results, the example", CASES)
