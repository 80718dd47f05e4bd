"""Helpers for tests that read notebooks: load the functions an exercise notebook defines."""
from __future__ import annotations

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def is_grade_cell(cell) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("grade"))


def notebook_namespace(path, skip_grade_cells: bool = True) -> dict:
    """Execute a notebook's code cells in one namespace (test cells skipped); return it.

    Lines starting with `%` or `!` (IPython magics) are dropped: exercise notebooks keep their
    non-test cells cheap and magic-free so that tests can reuse the reference solutions.
    """
    nb = nbformat.read(str(path), as_version=4)
    ns: dict = {"__name__": "__exercise__"}
    for cell in nb.cells:
        if cell.cell_type != "code" or (skip_grade_cells and is_grade_cell(cell)):
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        exec(compile(source, f"{Path(path).name}", "exec"), ns)
    return ns


def solution_module(path, tmp_path):
    """A notebook's non-grade code cells as a real module file: checks that ship a function's source to
    other processes (inspect.getsource) need it to come from a file, as Jupyter's cells do."""
    import importlib.util
    nb = nbformat.read(str(path), as_version=4)
    source = "\n\n".join(c.source for c in nb.cells if c.cell_type == "code" and not is_grade_cell(c))
    name = "nb_" + Path(path).stem.replace("-", "_")
    module_path = tmp_path / f"{name}.py"
    module_path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
