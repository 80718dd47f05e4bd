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
