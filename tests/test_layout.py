"""The package's architecture, kept true: two layers, no import cycle, no dev tools needed to import it.

The technique layer (what students read: the loop, the launch, every technique) is every module of
course_lib except the harness: `grading/` (grader, kernel runner, exercise generator, practicum
harnesses), `checks/` (the exercise check functions), `bench/` (benchmarks) and the two command
entry points `course_lib.grade` and `course_lib.exercises`.
"""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import course_lib

PACKAGE = Path(course_lib.__file__).parent
HARNESS = ("course_lib.grading", "course_lib.checks", "course_lib.bench")
ENTRY_POINTS = ("course_lib.grade", "course_lib.exercises")
DEV_ONLY = ("nbformat", "nbclient", "nbgrader", "nbval", "pytest", "jupyter_client")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_harness(name: str) -> bool:
    return name in ENTRY_POINTS or any(name == h or name.startswith(h + ".") for h in HARNESS)


TECHNIQUE = sorted(name for name in MODULES if not is_harness(name))


def imports(name: str) -> set[str]:
    """Every module `name` imports, at the top or inside a function, as absolute names."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return found


def internal_graph() -> dict[str, set[str]]:
    graph = {}
    for name in MODULES:
        targets = set()
        for imported in imports(name):
            # `from course_lib.distributed import ddp` imports the package and the module
            while imported and imported not in MODULES:
                imported = imported.rpartition(".")[0]
            # a package's __init__ always runs before its submodules: not an edge that can close a cycle
            if imported and imported != name and not name.startswith(imported + "."):
                targets.add(imported)
        graph[name] = targets
    return graph


def test_the_layers_are_what_the_docstring_says():
    assert "course_lib.train" in TECHNIQUE and "course_lib.loop" in TECHNIQUE
    assert "course_lib.distributed.ddp" in TECHNIQUE and "course_lib.compression.pruning" in TECHNIQUE
    assert not any(name.startswith(HARNESS) for name in TECHNIQUE)
    assert any(name.startswith("course_lib.grading.") for name in MODULES)


@pytest.mark.parametrize("name", TECHNIQUE)
def test_the_technique_layer_does_not_import_the_harness_or_notebook_tools(name):
    bad = sorted(i for i in imports(name) if i.startswith(HARNESS) or i.split(".")[0] in DEV_ONLY)
    assert not bad, f"{name} imports {bad}: students read this module; grading and dev tools stay out of it"


def test_no_import_cycle_in_course_lib():
    graph, state, stack = internal_graph(), {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)


# A package's docstring is its map: one line per module, "- `name`: what for" or "name.py  what for".
MAPPED_PACKAGES = ("course_lib.distributed", "course_lib.grading")
MAP_ENTRY = re.compile(r"^\s*(?:- `(\w+)`:|(\w+)\.py\s)", re.MULTILINE)


@pytest.mark.parametrize("package", MAPPED_PACKAGES)
def test_the_package_map_lists_every_module_of_the_package(package):
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    listed = {a or b for a, b in MAP_ENTRY.findall(doc)}
    modules = {name.rpartition(".")[2] for name in MODULES if name.rpartition(".")[0] == package}
    assert not modules - listed, f"{package}'s docstring does not list {sorted(modules - listed)}: add a line each"
    assert not listed - modules, f"{package}'s docstring lists {sorted(listed - modules)}, which are not its modules"


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
sys.meta_path.insert(0, Block())
import importlib
for name in {modules!r}:
    importlib.import_module(name)
try:
    import course_lib.frameworks
except ImportError as exc:
    print("FRAMEWORKS:", exc)
print("IMPORTED", len({modules!r}))
"""


def test_the_technique_layer_imports_without_dev_tools_or_lightning():
    """A learner's `pip install course_lib` has no nbformat, nbclient, pytest, lightning, ignite or keras."""
    modules = [m for m in TECHNIQUE if m not in ("course_lib.frameworks", "course_lib.frameworks_ignite",
                                                 "course_lib.__main__")]
    code = BLOCKER.format(blocked=[*DEV_ONLY, "lightning", "ignite", "keras"], modules=modules)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"IMPORTED {len(modules)}" in out.stdout
    assert "FRAMEWORKS:" in out.stdout and "pip install 'course_lib[frameworks]'" in out.stdout
