"""What a check cell leaves behind in a learner's Jupyter kernel: one line in the progress record and the next
tier of help.

Importing `course_lib.checks` inside IPython calls `install()`, which registers one `post_run_cell` callback.
After every cell it looks for the visible lines of an exercise's test cell (the catalog holds them per test
grade_id): a cell that holds all of one exercise's check lines is that exercise's check, whatever the learner
added around them. The outcome (the cell raised or not) goes to `record.record`, with a hash of the learner's answer
cell: the last cell run that defines the answer's function or names (the source itself is never stored).
Then, on a failure, `hints.tier` says what to show for this many failures since the last pass; on a pass, the
comparison with the solution is offered (reveal.py). The practica are left alone: they are graded.

Nothing here may break a learner's cell: any error of the hook itself becomes one printed note per kernel.
"""
from __future__ import annotations

import dataclasses
import sys

_NOTED = []   # the hook's own errors already reported in this kernel
_KERNEL: dict = {}   # test grade_id -> (failures since the last pass, passed once) in this kernel: where the
#                      record is off or unwritable, the tiers still escalate within one session


def install(shell=None) -> bool:
    """Register the callback on `shell` (default: the running IPython) once; False outside IPython (a grader,
    a script: IPython is not even imported then, so this costs nothing there)."""
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or getattr(shell, "_course_lib_learn_hook", False):
        return shell is not None
    shell.events.register("post_run_cell", lambda result: _after_cell(shell, result))
    shell._course_lib_learn_hook = True
    return True


def _statements(source: str) -> set:
    return {line.strip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")}


def test_of_cell(source: str, course: dict | None = None) -> str | None:
    """The test grade_id whose visible check lines `source` all holds, if exactly one exercise's; None for any
    other cell (a lecture that calls a check on its own examples, `check_x(x_wrong)`, is not an attempt)."""
    lines = _statements(source)
    if not any("check_" in line for line in lines):
        return None
    from . import catalog
    course = course or catalog.load()
    found = {ex["test"] for nb in course["notebooks"] for ex in nb["exercises"]
             if ex.get("test_source") and _statements(ex["test_source"]) <= lines}
    return found.pop() if len(found) == 1 else None


def _after_cell(shell, result) -> None:
    try:
        from . import catalog, record     # here, not at import: importing the checks stays as cheap as before
        from .reveal import answer_cell
        test = test_of_cell(result.info.raw_cell or "")
        if test is None:
            return
        notebook, exercise = catalog.exercise(test)
        if notebook["practicum"]:
            return
        passed = result.error_before_exec is None and result.error_in_exec is None
        answer = answer_cell(list(shell.user_ns.get("In", [])), exercise["stub"])
        failures, ever = _KERNEL.get(test, (0, False))
        _KERNEL[test] = (0, True) if passed else (failures + 1, ever)
        if record.record(test, passed, answer_source=answer, notebook=notebook["notebook"]) is not None:
            data = record.load()       # read once for both counts
            _KERNEL[test] = (record.failures_since_pass(test, data), record.has_passed(test, data))
        _show(test, passed, answer, *_KERNEL[test])
    except Exception as exc:  # noqa: BLE001 - the learner's cell already ran; the hook must not add an error
        if not _NOTED:
            _NOTED.append(exc)
            print(f"note: the course's progress hook failed ({type(exc).__name__}: {exc}); your cell is unaffected")


def _show(test: str, passed: bool, answer: str | None, failures: int, ever_passed: bool) -> None:
    from IPython.display import HTML, Markdown, display

    from . import hints, reveal
    offer = reveal.offer(test, answer, failures, ever_passed)
    if not passed:
        tier = hints.tier(test, failures)
        if tier is not None:    # the folded diff below is the solution tier: no show_solution line above it too
            display(Markdown(dataclasses.replace(tier, solution=tier.solution and not offer).markdown()))
    if offer:
        display(HTML(offer))
