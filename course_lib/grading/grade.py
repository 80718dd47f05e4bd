"""Grade a submitted exercise or practicum notebook: points per grade_id, hidden tests included.

    python -m course_lib.grade submission.ipynb                  # source: solutions/<same file name>
    python -m course_lib.grade submission.ipynb --json           # last line: {"score", "max_score", "points", ...}
    python -m course_lib.grade submission.ipynb --source /private/practicum_scale_out.ipynb
    COURSE_SOLUTIONS_DIR=/private/sources python -m course_lib.grade submission.ipynb

The notebook that runs is built from the instructor's SOURCE (the solutions/ notebook, with
hidden tests), not from the submission: every cell comes from the source except the answer cells
(nbgrader `solution: true`), which are taken from the submission by `grade_id`. A deleted answer
becomes a stub that raises; a duplicated one counts once (the last copy, as "Run all" would leave
it); the order of the submission's cells and any cells the student added are ignored. It runs in
a fresh kernel in a private temporary folder (course_lib.grading.kernel), with a deadline per cell
and in total; a cell that hangs or kills the kernel scores 0 and the cells after it still run.
A test cell earns its points when it ran to its end without an error. The source is found as:
--source, else $COURSE_SOLUTIONS_DIR/<name>, else solutions/<name> under the current folder (run
it from the course's root); if no file has the submission's name (a renamed download), the source
notebook in that folder that holds its grade_ids. Needs the grading extra (nbformat, nbclient).
Exit status: 0 graded; 1 graded 0 because the submission is not a readable notebook (not JSON, or a
malformed one: its shape is checked by course_lib.grading.validate_notebook before anything runs, and
the report's error says in one line what is wrong and where); 2 no submission or no usable source.

Threat model. Students run arbitrary code in the grading kernel, before the tests, so a
determined student can always cheat (rewrite later cells with an IPython input transformer, patch
torch, trace and alter the test's frames, edit course_lib on disk). What is defended:
- tests, hidden tests and setup cells come from the source; nothing of the submission but the
  answer cells runs, and the submission file is only read;
- before every test cell all `course_lib` modules are dropped from sys.modules and the source's
  import statements run again, so `def check_x(*a): pass`, `m.check_x = lambda f: None` or a
  patched `course_lib.checks.expect` are replaced by fresh copies;
- a test passes only if the kernel reports it ended without an error AND it printed a random
  marker, unknown in advance, as its last statement: an overridden AssertionError, a silenced
  traceback display, `sys.exit()` or a swallowed exception cannot turn a failing test into a pass;
- `os._exit()`, crashes and infinite loops cost that cell's points only (a new kernel runs the rest);
- solutions and hidden tests are never written where a student can read them: cells go to the
  kernel as messages; its working folder, IPython dir and history (in memory) are private and deleted.
Not defended: anything that rewrites or intercepts code in the kernel after the answers run.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import secrets
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

try:
    import nbformat
except ImportError as exc:
    raise ImportError(f"grading needs nbformat and nbclient ({exc}): pip install 'course_lib[grading]'") from exc

from .kernel import run_cells
from .validate_notebook import notebook_problem

SOLUTIONS_DIR = Path("solutions")   # relative: under the folder the grader runs in
FRESH_MODULES = """import sys as _grader_sys
[_grader_sys.modules.pop(_m) for _m in [_m for _m in _grader_sys.modules if _m.split(".")[0] == "course_lib"]]
del _grader_sys
"""


@dataclass
class Report:
    """What `grade` found; `points` maps each test cell's grade_id to the points it earned."""

    submission: str
    source: str
    score: float = 0.0
    max_score: float = 0.0
    points: dict = field(default_factory=dict)
    max_points: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)     # grade_id -> "passed" / "failed" / "timeout" / ...
    messages: dict = field(default_factory=dict)   # grade_id -> why it failed (one line)
    notes: list = field(default_factory=list)      # about the submission's answer cells
    error: str = ""                                # the submission could not be read at all
    seconds: float = 0.0


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def is_answer(cell) -> bool:
    return bool(_meta(cell).get("solution"))


def is_test(cell) -> bool:
    meta = _meta(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def read_notebook(path) -> nbformat.NotebookNode:
    """Read a notebook, or raise ValueError saying in one line why it is not one. A submission is
    untrusted: its shape is checked (validate_notebook) before nbformat or the grader touch it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        problem = notebook_problem(json.loads(text)) if text.strip() else "the file is empty"
        if not problem:
            return nbformat.reads(text, as_version=4)
    except json.JSONDecodeError as exc:
        problem = f"it is not JSON ({exc})"
    except Exception as exc:   # unreadable, not UTF-8, nested too deep for json, or refused by nbformat
        problem = f"{type(exc).__name__}: {exc}"
    raise ValueError(f"{path} is not a readable notebook: {problem.strip().splitlines()[0]}")


def find_source(submission: Path, nb=None, source=None) -> Path:
    """The instructor's notebook for `submission` (see the module docstring for the order)."""
    if source is not None:
        if not Path(source).is_file():
            raise FileNotFoundError(f"--source {source} does not exist")
        return Path(source)
    folder = Path(os.environ.get("COURSE_SOLUTIONS_DIR") or Path.cwd() / SOLUTIONS_DIR)
    if (folder / submission.name).is_file():
        return folder / submission.name
    if not folder.is_dir():
        raise FileNotFoundError(f"no source notebook for {submission.name}: there is no folder {folder} (run from the "
                                "course's root folder, pass --source or set COURSE_SOLUTIONS_DIR)")
    wanted = {_meta(c).get("grade_id") for c in (nb.cells if nb else [])} - {None}
    matches = [p for p in sorted(folder.glob("*.ipynb"))
               if wanted & {_meta(c).get("grade_id") for c in read_notebook(p).cells}]
    if len(matches) == 1:
        return matches[0]
    raise FileNotFoundError(f"no source notebook for {submission.name} in {folder} ("
                            + (f"its grade_ids match {[m.name for m in matches]}" if matches else "none has its name "
                               "or its grade_ids") + "); pass --source or set COURSE_SOLUTIONS_DIR")


def _imports(cells) -> str:
    """The top-level import statements of `cells` (setup code), to run again before each test."""
    lines = []
    for cell in cells:
        code = "\n".join(ln for ln in cell.source.splitlines() if not ln.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        lines += [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return "\n".join(dict.fromkeys(lines))


def build(source_nb, submission_nb, marker: str):
    """(cell sources to run, [(index, grade_id, points)] of the test cells, [(index, grade_id)] of the
    answer cells, notes about the answers)."""
    answers = defaultdict(list)
    for cell in (submission_nb.cells if submission_nb is not None else []):
        if _meta(cell).get("grade_id"):
            answers[_meta(cell)["grade_id"]].append(cell)
    sources, tests, notes, setup, answer_cells = [], [], [], [], []
    for cell in source_nb.cells:
        if cell.cell_type != "code":
            continue
        grade_id = _meta(cell).get("grade_id")
        if is_answer(cell):
            found = [c for c in answers.get(grade_id, []) if c.get("cell_type") == "code"]
            if not found:
                notes.append(f"answer cell {grade_id!r} is missing from the submission (deleted, or its metadata lost)")
                sources.append(f"raise NotImplementedError('answer cell {grade_id} is missing from the submission')")
                continue
            if len(found) > 1:
                notes.append(f"answer cell {grade_id!r} appears {len(found)} times; the last one was graded")
            answer_cells.append((len(sources), grade_id))
            sources.append(found[-1].source)
        elif is_test(cell):
            tests.append((len(sources), grade_id, float(_meta(cell).get("points", 0))))
            sources.append(f"{FRESH_MODULES}{_imports(setup)}\n{cell.source}\nprint({marker!r}, flush=True)")
        else:
            setup.append(cell)
            sources.append(cell.source)
    return sources, tests, answer_cells, notes


def _verdict(result, marker: str) -> tuple[str, str]:
    if result.status == "ok" and marker in result.stdout:
        return "passed", ""
    if result.status == "ok":
        return "failed", "the test ended without its completion marker (was print or sys.stdout replaced?)"
    if result.status == "error":
        return "failed", result.error
    return result.status, {"timeout": "the cell ran past its time limit", "died": "the kernel died in this cell",
                           "not run": "not run: the total time limit was reached"}.get(result.status, "")


def grade(submission, source=None, cell_timeout: float = 120.0, timeout: float = 900.0) -> Report:
    """Grade the notebook at `submission` against its source; never modifies either file."""
    start, submission = time.monotonic(), Path(submission)
    if not submission.exists():
        raise FileNotFoundError(f"the submission {submission} was not found")
    try:
        sub_nb, error = read_notebook(submission), ""
    except ValueError as exc:
        sub_nb, error = None, str(exc)
    source = find_source(submission, sub_nb, source)
    source_nb = read_notebook(source)
    marker = f"course-grade-{secrets.token_hex(16)}"
    sources, tests, answers, notes = build(source_nb, sub_nb, marker)
    # unreadable: the error says why in one line; "answer missing" notes for every cell would only hide it
    report = Report(str(submission), str(source), notes=notes if sub_nb is not None else [], error=error)
    results = run_cells(sources, cell_timeout, timeout) if sub_nb is not None else None
    for index, grade_id in answers if results else []:
        if results[index].status != "ok":
            report.notes.append(f"answer cell {grade_id!r}: {_verdict(results[index], marker)[1][:200]}")
    for index, grade_id, points in tests:
        status, message = (_verdict(results[index], marker) if results
                           else ("failed", "not run: the submission is not a readable notebook (see its error)"))
        report.max_points[grade_id], report.status[grade_id] = points, status
        report.points[grade_id] = points if status == "passed" else 0.0
        if message:
            report.messages[grade_id] = message.replace(marker, "<marker>")[:400]
    report.score, report.max_score = sum(report.points.values()), sum(report.max_points.values())
    report.seconds = round(time.monotonic() - start, 1)
    return report


def format_report(report: Report) -> str:
    lines = [f"{report.submission} (graded against {report.source})"]
    if report.error:
        lines.append(f"  could not read the submission: {report.error}")
    width = max((len(g) for g in report.points), default=10)
    for grade_id, points in report.points.items():
        text = f"  {grade_id:<{width}}  {points:g}/{report.max_points[grade_id]:g}  {report.status[grade_id]}"
        message = report.messages.get(grade_id, "").strip().splitlines()
        if message:   # the first line says what is wrong; for a crash the last line names the error
            text += f": {message[0][:160]}" + (f" ... {message[-1][:120]}" if len(message) > 1 else "")
        lines.append(text)
    lines += [f"  note: {note}" for note in report.notes]
    lines.append(f"score {report.score:g}/{report.max_score:g}  ({report.seconds:.0f} s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.grade", description=__doc__.split("\n\n")[0])
    p.add_argument("submission", help="the student's .ipynb")
    p.add_argument("--source", default=None, help="the instructor's notebook (default: see COURSE_SOLUTIONS_DIR)")
    p.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    p.add_argument("--cell-timeout", type=float, default=120.0, help="seconds per cell")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole notebook")
    args = p.parse_args(argv)
    if not args.cell_timeout > 0 or not args.timeout > 0:
        p.error("--cell-timeout and --timeout must be > 0")
    try:
        report = grade(args.submission, args.source, args.cell_timeout, args.timeout)
    except (FileNotFoundError, ValueError) as exc:   # no submission, no source, or an unreadable source
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        print(json.dumps(asdict(report)))
    return 1 if report.error else 0


if __name__ == "__main__":
    sys.exit(main())
