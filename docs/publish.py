"""What publishing needs from the repository, kept in one place.

- The repository's URL is one setting: `[project.urls] Repository` in pyproject.toml; the release they open is
  another: `[tool.course_lib] release`, a git tag (a term's notebooks then never meet a later term's checks).
  The site's launch buttons (docs/conf.py) and every notebook's install cell are made from both.
- The install cell: the first code cell (right under the title) of every lecture, exercise and practicum. Opened outside the course's
  environment (Colab, or a Binder built without it), it pip-installs course_lib from the repository; where
  course_lib is importable (`make lab`, Binder, the grader, CI) it does nothing.
- The course map on the site's home page is README's table, with each lecture linked to its page, its exercise
  page and the API pages of the modules in its "backed by" column (the README stays the one copy).
- A lecture page links to the API pages of the course_lib modules the notebook imports.

    python docs/publish.py            # write the install cells (notebooks/, solutions/), regenerate exercises/
    python docs/publish.py --check    # exit 1 naming every notebook whose install cell is missing or stale
"""
from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INSTALL_TAG = "install-course-lib"
# Folders whose notebooks carry the install cell; exercises/ is generated from solutions/ and follows it.
SYNCED = ("notebooks", "solutions")


def repository_url() -> str:
    """The repository's URL, from pyproject.toml's [project.urls] Repository (the one place it is set).

    Read with a pattern rather than tomllib, which Python 3.10 (the oldest the course supports) lacks."""
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'^\[project\.urls\][^\[]*?^Repository\s*=\s*"([^"]+)"', text, re.M | re.S)
    if not found:
        raise ValueError('pyproject.toml needs [project.urls] Repository = "https://github.com/OWNER/NAME"')
    return found.group(1).rstrip("/")


def release() -> str:
    """The git tag (or branch) that install cells and launch buttons open: pyproject.toml's [tool.course_lib]."""
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'^\[tool\.course_lib\][^\[]*?^release\s*=\s*"([^"]+)"', text, re.M | re.S)
    if not found:
        raise ValueError('pyproject.toml needs [tool.course_lib] release = "TAG" (the term\'s git tag)')
    return found.group(1)


@functools.cache
def tested_torch() -> str:
    """The torch release requirements.lock pins (on the newest Python, where the lock forks)."""
    sys.path.insert(0, str(REPO))
    from course_lib.versions import locked

    return max((p.version for p in locked(REPO / "requirements.lock") if p.name == "torch"),
               key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))


def _code(nb: dict) -> str:
    """The notebook's code, but its install cell (whose own comments must not decide what they say)."""
    return "\n".join("".join(c["source"]) for c in nb["cells"]
                     if c["cell_type"] == "code" and INSTALL_TAG not in c.get("metadata", {}).get("tags", []))


def install_cell_source(path: Path, nb: dict) -> str:
    """The first code cell of `nb`: install course_lib only where it is not importable."""
    code = _code(nb)
    extra = "[frameworks]" if path.name.startswith("16_") else ""
    lines = ["# Opened outside the course's environment (Colab, Binder without it)? This installs course_lib",
             "# once; where course_lib is importable (make lab, the grader) it does nothing."]
    if re.search(r"\blaunch\(|torchrun|mp\.spawn", code):
        lines += ["# Colab gives 1 GPU and 2 CPU cores: this notebook's multi-process launches run there as",
                  "# CPU processes (gloo) sharing the 2 cores, as on a laptop."]
    if "recorded.show(" in code:      # GPU results recorded on one, shown where there is none
        lines += ["# On Colab, Runtime > Change runtime type > GPU runs the GPU cells; without a GPU they",
                  "# show results recorded on one."]
    elif "cuda" in code:
        lines += ["# On Colab, Runtime > Change runtime type > GPU also runs the cells that need a GPU."]
    lines += ["import importlib.util",
              "import subprocess",
              "import sys",
              "",
              'if importlib.util.find_spec("course_lib") is None:',
              "    # pip adds what the runtime lacks; the runtime's own torch stays where it fits course_lib's range",
              "    from importlib.metadata import PackageNotFoundError, version",
              "    try:",
              f'        print(f"This runtime brings torch {{version(\'torch\')}}; the course was tested with torch '
              f'{tested_torch()}.")',
              "    except PackageNotFoundError:",
              "        pass",
              f'    spec = "course_lib{extra} @ git+{repository_url()}@{release()}"',
              '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)']
    return "\n".join(lines)


def _install_cell_index(nb: dict) -> int | None:
    for i, cell in enumerate(nb["cells"]):
        if INSTALL_TAG in cell.get("metadata", {}).get("tags", []):
            return i
    return None


def synced(path: Path) -> tuple[dict, bool]:
    """`path`'s notebook with its install cell right under the title cell, and whether that changed anything."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    source = install_cell_source(path, nb)
    at = _install_cell_index(nb)
    if at == 1 and nb.cells[at].source == source:
        return nb, False
    if at is None:
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": [INSTALL_TAG, "hide-input"]})
    else:
        cell = nb.cells.pop(at)   # keeps its other metadata (slides)
        cell.source = source
    nb.cells.insert(1, cell)
    return nb, True


def notebooks() -> list[Path]:
    return [p for folder in SYNCED for p in sorted((REPO / folder).glob("*.ipynb"))]


def sync(check: bool) -> int:
    import nbformat

    stale = []
    for path in notebooks():
        nb, changed = synced(path)
        if changed:
            stale.append(path.relative_to(REPO))
            if not check:
                path.write_text(nbformat.writes(nb) + "\n")
    if check:
        for p in stale:
            print(f"{p}: install cell missing or stale; run python docs/publish.py")
        return 1 if stale else 0
    if any(p.parts[0] == "solutions" for p in stale):
        subprocess.run([sys.executable, "-m", "course_lib.exercises"], cwd=REPO, check=True)
    print(f"updated {len(stale)} notebooks")
    return 0


@functools.lru_cache(maxsize=None)   # conf.py asks for each lecture twice: which API pages, which links
def imported_modules(path: Path) -> tuple[str, ...]:
    """The course_lib modules a notebook's code imports (`from course_lib.x import y` names course_lib.x, and
    course_lib.x.y where y is a module)."""
    nb = json.loads(path.read_text())
    found: list[str] = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "\n".join(line for line in "".join(cell["source"]).splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name.split(".")[0] == "course_lib" and _is_module(name) and name not in found:
                    found.append(name)
    # `from course_lib.distributed import ddp` names the package only to reach the module: list the module
    return tuple(m for m in found if not m.startswith("course_lib.checks")
                 and not any(other.startswith(m + ".") for other in found))


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (REPO / rel).with_suffix(".py").is_file() or (REPO / rel / "__init__.py").is_file()


def course_map_rows() -> list[list[str]]:
    """README's course-map table, one list of cells per lecture row."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Course map", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if re.match(r"\|\s*\d\d\s*\|", line)]


def course_map_markdown(built: set[str]) -> str:
    """README's course map as MyST, each lecture linked to its page and exercises, each module to its API page.

    `built` is the set of docnames in this build: names of pages left out of a partial build stay plain text.
    """
    lectures = {p.name[:2]: p for p in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
    out = ["| # | lecture | exercises | what you learn | backed by (`course_lib.`) |", "|---|---|---|---|---|"]
    for number, title, learn, backed, _status in course_map_rows():
        nb = lectures[number]
        doc, exdoc = f"notebooks/{nb.stem}", f"exercises/{nb.stem}_exercises"
        page = f"[{title}](/{doc}.ipynb)" if doc in built else title
        ex = f"[exercises](/{exdoc}.ipynb)" if exdoc in built else ""
        modules = []
        prefix = "course_lib"
        for item in re.findall(r"`([^`]+)`", backed):
            # README abbreviates siblings: `distributed.ring`, `.collectives` -> course_lib.distributed.collectives
            name = f"{prefix.rsplit('.', 1)[0]}{item}" if item.startswith(".") else f"course_lib.{item}"
            prefix = name
            modules.append(f"{{py:mod}}`{item} <{name}>`" if f"docs/api/{name}" in built else f"`{item}`")
        out.append(f"| {number} | {page} | {ex} | {learn} | {', '.join(modules)} |")
    return "\n".join(out) + "\n"


def api_modules() -> list[str]:
    """Every module of course_lib for the API reference, but the exercise checks and the benchmarks (the
    harness a learner does not call) and `__main__` entry points."""
    names = []
    for path in sorted((REPO / "course_lib").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        name = ".".join(parts)
        if parts[-1] != "__main__" and not name.startswith(("course_lib.checks", "course_lib.bench")):
            names.append(name)
    return names


def api_page(module: str) -> str:
    # autodoc writes reStructuredText, so the directive runs inside eval-rst, not as a MyST directive
    # :ignore-module-all: a package re-exports its modules' functions in __all__ (simulate.replay is a module and
    # a function): each object is documented once, on the page of the module that defines it
    return f"# `{module}`\n\n```{{eval-rst}}\n.. automodule:: {module}\n   :ignore-module-all:\n```\n"


def api_index(modules: list[str]) -> str:
    entries = "\n".join(modules)
    return ("# API reference\n\nEvery module of `course_lib`, from its docstrings. The technique layer is what the "
            "lectures teach; `course_lib.grading` and the two entry points `course_lib.grade` and "
            "`course_lib.exercises` are the harness that grades.\n\n"
            f"```{{toctree}}\n:maxdepth: 1\n\n{entries}\n```\n")


def library_hash() -> str:
    """A short hash of course_lib's sources. jupyter-cache keys outputs by a notebook's code cells only; a
    lecture's outputs also show the library (show_source, its results), so they are cached per library version."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "course_lib").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def data_description(quick: bool) -> dict:
    """What the notebooks' outputs are computed on, read from the data that is there (never assumed), and a
    short key for the execution cache folder, so that outputs of one data set never show under another's name."""
    import torch

    from course_lib.data import train_split_size, training_set_name

    n, name = train_split_size(), training_set_name()
    mode = "quick mode (COURSE_QUICK=1)" if quick else "normal mode"
    device = "a GPU" if torch.cuda.is_available() else "a CPU (no GPU)"
    key = f"{n}-{re.sub(r'[^a-z0-9]+', '-', name.split(':')[0].lower()).strip('-')}-{'quick' if quick else 'normal'}"
    return {"text": f"{n:,} training images ({name}) and the MNIST test set, in {mode}, on {device}, "
                    f"torch {torch.__version__.split('+')[0]}", "key": key}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report notebooks whose install cell is stale")
    return sync(ap.parse_args(argv).check)


if __name__ == "__main__":
    sys.exit(main())
