"""Check that a notebook's JSON has the shape the grader relies on, before nbformat or any code sees it.

    notebook_problem(json.loads(text))   # -> "" or e.g. "cell 3 of 7: metadata.nbgrader.grade_id
                                         #    must be a string; got a list"

A submission is untrusted input: a hand-edited or broken file must get a score of 0 and one line
saying what is wrong and where, not a traceback from deep inside the grader. Only what grade.py
reads is checked (nbformat 4, the cells, their type and source, and the nbgrader fields grade_id,
solution, grade, points); anything else is left to nbformat. Cells are counted from 1, from the top.
"""
from __future__ import annotations

from ..validate import is_number

CELL_TYPES = ("code", "markdown", "raw")


def _got(mapping: dict, key: str) -> str:
    """How the value under `key` is named in a message: short scalars as written, containers by type."""
    if key not in mapping:
        return "nothing (it is missing)"
    value = mapping[key]
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    return "null" if value is None else "true" if value is True else "false" if value is False else repr(value)[:40]


def _cell_problem(cell) -> str:
    if not isinstance(cell, dict):
        return f"a cell must be an object; got {_got({'cell': cell}, 'cell')}"
    if cell.get("cell_type") not in CELL_TYPES:
        return f"cell_type must be one of {', '.join(CELL_TYPES)}; got {_got(cell, 'cell_type')}"
    source = cell.get("source")
    if not (isinstance(source, str) or isinstance(source, list) and all(isinstance(s, str) for s in source)):
        return f"source must be a string or a list of strings; got {_got(cell, 'source')}" + (
            " holding a non-string" if isinstance(source, list) else "")
    metadata = cell.get("metadata", {})
    if not isinstance(metadata, dict):
        return f"metadata must be an object; got {_got(cell, 'metadata')}"
    nbgrader = metadata.get("nbgrader", {})
    if not isinstance(nbgrader, dict):
        return f"metadata.nbgrader must be an object; got {_got(metadata, 'nbgrader')}"
    if "grade_id" in nbgrader and not isinstance(nbgrader["grade_id"], str):
        return f"metadata.nbgrader.grade_id must be a string; got {_got(nbgrader, 'grade_id')}"
    for flag in ("solution", "grade"):
        if flag in nbgrader and not isinstance(nbgrader[flag], bool):
            return f"metadata.nbgrader.{flag} must be true or false; got {_got(nbgrader, flag)}"
    if "points" in nbgrader and not (is_number(nbgrader["points"]) and nbgrader["points"] >= 0):
        return f"metadata.nbgrader.points must be a number >= 0; got {_got(nbgrader, 'points')}"
    return ""


def notebook_problem(nb) -> str:
    """What makes the parsed JSON `nb` unusable as a notebook to grade, in one line; "" if nothing."""
    if not isinstance(nb, dict):
        return f"the file must hold a JSON object (a notebook); got {_got({'nb': nb}, 'nb')}"
    if nb.get("nbformat") != 4:   # for {} nbformat would assume version 1 and fail inside its converter
        return f"nbformat must be 4 (a Jupyter notebook; save it again with Jupyter); got {_got(nb, 'nbformat')}"
    if not isinstance(nb.get("cells"), list):
        return f"cells must be a list; got {_got(nb, 'cells')}"
    for number, cell in enumerate(nb["cells"], 1):
        problem = _cell_problem(cell)
        if problem:
            return f"cell {number} of {len(nb['cells'])}: {problem}"
    return ""
