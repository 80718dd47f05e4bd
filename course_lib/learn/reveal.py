"""The course's solution to one exercise, shown beside the learner's answer as a highlighted diff, once the
learner has earned it: after their check passed, or after `REVEAL_AFTER` failed attempts since the last
pass (by then they have had the check's message, the concept and the lecture section).

The solution comes from the package (`catalog.json`, generated from solutions/), so the reveal works on Colab
and on the site, where there is no clone. Never for the practica (graded; the catalog carries no solution for
them), and never when an instructor switched it off for a class: `[tool.course_lib] solution_reveal = false` in
pyproject.toml (baked into the catalog) or `COURSE_REVEAL=off` in the environment.

    from course_lib.learn.reveal import show_solution
    show_solution("ex00_count_parameters")        # the answer's or the test's grade_id
"""
from __future__ import annotations

import ast
import difflib
import html
import os

from . import catalog, record

# 3: by the third failure since the last pass the learner has had three different kinds of help, one per failed
# try (the check's message, the concept, the lecture section); a fourth try with nothing new to go on mostly repeats
# the third, and seeing a worked answer beside one's own is then the faster way on. hints.py offers the comparison
# at the same count.
REVEAL_AFTER = 3

OFF = {"off", "0", "false", "no"}
STYLE = ("<style>.course-diff td{font-family:monospace;white-space:pre;padding:0 .4em;text-align:left}"
         ".course-diff .diff_add{background:#cdffd8}.course-diff .diff_chg{background:#fff5b1}"
         ".course-diff .diff_sub{background:#ffdce0}.course-diff .diff_header{color:#888}</style>")


def defined_names(source: str) -> set:
    """Top-level functions, classes and assigned names of a cell (what an answer cell hands the check)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def answer_cell(history: list, stub: str) -> str | None:
    """The learner's answer: the last cell in `history` (IPython's In) that defines what the stub defines."""
    wanted = defined_names(stub)
    if not wanted:
        return None
    return next((cell for cell in reversed(history) if wanted & defined_names(cell)), None)


def allowed(grade_id: str, failures: int | None = None, passed: bool | None = None) -> tuple[bool, str]:
    """(whether the solution of `grade_id` may be shown now, why not). `failures` and `passed` default to what
    the progress record says."""
    notebook, exercise = catalog.exercise(grade_id)
    test = exercise["test"]
    if notebook["practicum"] or exercise.get("solution") is None:
        return False, f"{notebook['notebook']} is a graded practicum: its solution is not shown"
    if not catalog.load().get("reveal", True) or os.environ.get("COURSE_REVEAL", "").strip().lower() in OFF:
        return False, "your instructor switched the solutions off for this class"
    failures = record.failures_since_pass(test) if failures is None else failures
    passed = record.has_passed(test) if passed is None else passed
    if passed or failures >= REVEAL_AFTER:
        return True, ""
    left = REVEAL_AFTER - failures
    return False, (f"the solution of {exercise['answer']} opens once its check passes or after "
                   f"{left} more failed attempt{'s' if left != 1 else ''} (failed so far: {failures})")


def diff_html(answer: str | None, solution: str) -> str:
    """A side-by-side table: the learner's answer (left) and the solution (right), changed lines highlighted."""
    if not answer:
        body = f"<pre>{html.escape(solution)}</pre>"
        return STYLE + "<p>(your answer cell was not found in this kernel's history: the solution alone)</p>" + body
    table = difflib.HtmlDiff(wrapcolumn=80).make_table(answer.splitlines(), solution.splitlines(),
                                                        "your answer", "the course's solution")
    return STYLE + f'<div class="course-diff">{table}</div>'


def offer(test: str, answer: str | None, failures: int | None = None, passed: bool | None = None) -> str:
    """HTML for the hook after a check: the diff folded in a <details> when allowed, else ""."""
    ok, _ = allowed(test, failures, passed)
    if not ok:
        return ""
    _, exercise = catalog.exercise(test)
    return (f"<details class='course-reveal'><summary>Compare your answer with the course's solution "
            f"({html.escape(exercise['answer'])})</summary>{diff_html(answer, exercise['solution'])}</details>")


def show_solution(grade_id: str) -> None:
    """Display the diff for `grade_id` in a notebook, or say in one line why not yet."""
    from IPython.display import HTML, display
    ok, why = allowed(grade_id)
    if not ok:
        print(f"not yet: {why}")
        return
    _, exercise = catalog.exercise(grade_id)
    try:
        from IPython import get_ipython
        history = list(get_ipython().user_ns.get("In", []))
    except (ImportError, AttributeError):
        history = []
    display(HTML(diff_html(answer_cell(history, exercise["stub"]), exercise["solution"])))
