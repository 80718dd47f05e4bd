"""The course's exercises as data: what the progress record, the hints and the solution reveal need to know about
every exercise notebook, shipped in the package (catalog.json), so that all of it works on Colab and on the site,
where there is no clone. Generated from solutions/ by `python -m course_lib.exercises` (course_lib.grading.catalog
builds it; `--check` fails when it is out of date), never hand-edited.

Per notebook: its name, its lecture, title, estimated minutes (its header's "**Estimated time:** 15 minutes
(exercise 1: 5, exercise 2: 10)."; a practicum's header gives the total alone, the upper end of "60–90 minutes"),
whether it is a graded practicum; per exercise: the answer and test grade_ids, points, the heading above it, its
minutes (null for a practicum's), the check_* functions its visible test lines call and those lines (what the hook
recognises), the student's stub and the solution (the answer cell without nbgrader's markers; null for the
practica: a graded solution never ships). No hidden test is in it. `reveal` is pyproject.toml's
`[tool.course_lib] solution_reveal`: the one setting an instructor flips for a class. The grader hides this file
from a student's sandbox.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

FILE = Path(__file__).with_name("catalog.json")
FORMAT = 1
ESTIMATE = re.compile(r"\*\*Estimated time:\*\*\s*(\d+)(?:\s*[–-]\s*(\d+))?\s*minutes(?:\s*\(([^)]*)\))?")


def estimate_text(parts: list[int]) -> str:
    """The header's estimate for exercises taking `parts` minutes each (what --medians --apply writes)."""
    listed = ", ".join(f"exercise {i}: {n}" for i, n in enumerate(parts, 1))
    return f"**Estimated time:** {sum(parts)} minutes ({listed})"


@functools.lru_cache(maxsize=1)
def load() -> dict:
    """The packaged catalog."""
    return json.loads(FILE.read_text(encoding="utf-8"))


def exercise(grade_id: str) -> tuple[dict, dict]:
    """(notebook entry, exercise entry) of an answer's or a test's grade_id; KeyError naming it otherwise."""
    for notebook in load()["notebooks"]:
        for entry in notebook["exercises"]:
            if grade_id in (entry["answer"], entry["test"]):
                return notebook, entry
    raise KeyError(f"no exercise has the grade_id {grade_id!r} (see course_lib/learn/catalog.json)")
