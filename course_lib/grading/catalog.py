"""Builds course_lib/learn/catalog.json (see course_lib.learn.catalog) from solutions/: run by
`python -m course_lib.exercises` beside the exercises it generates, with nbgrader's own stubs.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..learn.catalog import ESTIMATE, FILE, FORMAT, estimate_text, load

MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)
CHECK_CALL = re.compile(r"\b(check_\w+)\s*\(")
# "**Estimated time:** 15 minutes (exercise 1: 5, exercise 2: 10)." - the practica give "60–90 minutes" only
PART = re.compile(r"^exercise (\d+): (\d+)$")


def estimate(header: str, name: str, exercises: int | None) -> tuple[int, list[int] | None]:
    """(minutes for the notebook, minutes per exercise) from a header; `exercises` None: the total alone will do
    (a practicum). ValueError naming the notebook when the header lacks either, or they disagree."""
    found = ESTIMATE.search(header)
    if found is None:
        raise ValueError(f"{name}: its first cell needs '**Estimated time:** N minutes (exercise 1: A, ...).'")
    total = int(found.group(2) or found.group(1))
    if exercises is None:
        return total, None
    parts = [PART.match(p.strip()) for p in (found.group(3) or "").split(",")]
    if not all(parts) or [int(p.group(1)) for p in parts] != list(range(1, exercises + 1)):
        raise ValueError(f"{name}: its header's estimate must give each of its {exercises} exercises its minutes: "
                         f"'{estimate_text([5] * exercises)}.' (got {found.group(0)!r})")
    minutes = [int(p.group(2)) for p in parts]
    if sum(minutes) != total:
        raise ValueError(f"{name}: its header's exercises add up to {sum(minutes)} minutes, not {total}")
    return total, minutes


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _reveal_setting(pyproject: Path) -> bool:
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    section = re.search(r"^\[tool\.course_lib\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    value = re.search(r"^solution_reveal\s*=\s*(true|false)\s*$", section.group(1), re.M) if section else None
    return value is None or value.group(1) == "true"


def _notebook(source: Path, student_version) -> dict:
    import nbformat
    nb = nbformat.read(str(source), as_version=4)
    stubs = {_nbgrader(c).get("grade_id"): c.source for c in student_version(nb).cells}
    header = nb.cells[0].source if nb.cells and nb.cells[0].cell_type == "markdown" else ""
    title = re.search(r"^#\s+(.+)$", header, re.M)
    if not title:
        raise ValueError(f"{source.name}: its first cell needs a '# title' line")
    practicum = source.stem.startswith("practicum")
    exercises, heading, answer = [], "", None
    for cell in nb.cells:
        meta = _nbgrader(cell)
        if cell.cell_type == "markdown":
            found = re.findall(r"^#{2,}\s+(.+)$", cell.source, re.M)
            heading = found[-1].strip() if found else heading
        elif meta.get("solution") and not meta.get("grade"):
            answer = cell
        elif meta.get("grade"):
            if answer is None:
                raise ValueError(f"{source.name}: the test cell {meta['grade_id']} has no answer cell before it")
            solution = "\n".join(line for line in answer.source.splitlines() if not MARKERS.match(line))
            visible = HIDDEN.sub("", cell.source).strip()
            exercises.append({"answer": _nbgrader(answer)["grade_id"], "test": meta["grade_id"],
                              "points": meta.get("points", 0), "title": heading, "minutes": None,
                              "checks": list(dict.fromkeys(CHECK_CALL.findall(visible))),
                              "test_source": visible,
                              "stub": stubs[_nbgrader(answer)["grade_id"]],
                              "solution": None if practicum else solution})
    total, parts = estimate(header, source.name, None if practicum else len(exercises))
    for entry, minutes in zip(exercises, parts or []):
        entry["minutes"] = minutes
    return {"notebook": source.stem, "lecture": None if practicum else source.stem.removesuffix("_exercises"),
            "title": title.group(1).strip(), "practicum": practicum, "minutes": total, "exercises": exercises}


def build(solutions_dir: Path, pyproject: Path, student_version) -> dict:
    """The catalog of every notebook in `solutions_dir` (sorted by name: the course's order); `student_version`
    (course_lib.grading.exercises') makes the stubs, exactly as the exercises get them."""
    return {"format": FORMAT, "reveal": _reveal_setting(Path(pyproject)),
            "notebooks": [_notebook(p, student_version) for p in sorted(Path(solutions_dir).glob("*.ipynb"))]}


def render(catalog: dict) -> str:
    return json.dumps(catalog, indent=1, ensure_ascii=False) + "\n"


def sync(solutions_dir: Path, pyproject: Path, student_version, check: bool = False, target: Path = FILE) -> bool:
    """Whether `target` was out of date with `solutions_dir` (rewritten unless `check`)."""
    text = render(build(solutions_dir, pyproject, student_version))
    stale = not target.is_file() or target.read_text(encoding="utf-8") != text
    if stale and not check:
        target.write_text(text, encoding="utf-8")
        load.cache_clear()
    return stale
