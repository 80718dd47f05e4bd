"""Grade a submitted exercise or practicum notebook: points per grade_id, hidden tests included.

    python -m course_lib.grade submission.ipynb                  # source: solutions/<same file name>
    python -m course_lib.grade submission.ipynb --json           # last line: {"score", "max_score", "points", ...}
    python -m course_lib.grade submission.ipynb --report r.json  # the same object, in a file only the grader writes
    python -m course_lib.grade submission.ipynb --source /private/practicum_scale_out.ipynb
    python -m course_lib.grade submission.ipynb --gradescope results.json  # Gradescope's results format
    COURSE_SOLUTIONS_DIR=/private/sources python -m course_lib.grade submission.ipynb
    python -m course_lib.grade submitted/ --out graded/ --jobs 4       # a whole class: see grading.classroom

What runs is built from the instructor's SOURCE (the solutions/ notebook, with hidden tests), not
from the submission: every cell comes from the source except the answer cells (nbgrader
`solution: true`), which are taken from the submission by `grade_id`. A deleted answer becomes a
stub that raises; a duplicated one counts once (the last copy, as "Run all" would leave it); the
order of the submission's cells and any cells the student added are ignored. There is a deadline
per cell and in total; a cell that hangs or crashes the sandbox scores 0 and the cells after it
still run. A test cell earns its points when it ran to its end without an error. The source is found as:
--source, else $COURSE_SOLUTIONS_DIR/<name>, else solutions/<name> under the current folder (run
it from the course's root); if no file has the submission's name (a renamed download), the source
notebook in that folder that holds its grade_ids. Needs the grading extra (nbformat, nbclient).
Exit status: 0 graded; 1 graded 0 because the submission is not a readable notebook (not JSON, or a
malformed one: its shape is checked by course_lib.grading.validate_notebook before anything runs, and
the report's error says in one line what is wrong and where); 2 no submission or no usable source.

Trust boundary (the instructor guide's "What the grader protects against" says it for instructors):
- the student's cells (the answer cells, with the source's setup cells) run in a sandbox process
  (course_lib.grading.remote, course_lib.grading.answers) inside a jail where the machine allows it
  (course_lib.grading.jail: read-only file system but a private folder, private /tmp, the source
  notebook and the submission's folder hidden, own PID namespace, user nobody when the grader is root);
- the test cells, hidden tests and check functions run HERE, in the grader's process, where no
  student code ever ran; the answer's names (those the source's answer cells define) are proxies
  that call into the sandbox and get plain data back (course_lib.grading.wire: never a pickled
  student object), so nothing the student does can rewrite, skip or swap a test;
- a test passes when its cell ran to its end here without an exception; a sandbox that hangs or
  dies fails that test only (a fresh sandbox runs the cells again for the tests after it);
- student processes start from an allow-list of this process's environment (course_lib.grading.environment),
  so a secret in the grader's shell cannot reach a report;
- the student's output goes to the sandbox's own log, never to this process's stdout; the report
  (--report FILE) is written by this process after every sandbox process is dead.
What the student's code measures about itself (e.g. the bytes a ring all-reduce sent, counted in
its own process) can still be faked by a determined student; what it returns is checked here.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import io
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

try:
    import nbformat
except ImportError as exc:
    raise ImportError(f"grading needs nbformat and nbclient ({exc}): pip install 'course_lib[grading]'") from exc

from ..learn.catalog import FILE as CATALOG_FILE
from . import jail, variants
from .limits import Limits
from .remote import COURSE_ROOT, Sandbox, SandboxLost, StudentError, grading
from .validate_notebook import notebook_problem

SOLUTIONS_DIR = Path("solutions")   # relative: under the folder the grader runs in
STARTUP_S = 120.0                   # how long a sandbox may take to start, outside every cell's time limit


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
    sandbox: str = ""                              # what isolated the student's code (jail.describe())


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


def defined_names(source: str) -> list[str]:
    """The names a cell's top-level statements bind (def, class, =, import), in order."""
    code = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
        else:
            for target in getattr(node, "targets", None) or [getattr(node, "target", None)]:
                names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)] if target else []
    return list(dict.fromkeys(names))


@dataclass
class Plan:
    """What runs where: `sandbox` cells (setup and answers, in order) run in the student's sandbox;
    `trusted` cells (setup and tests, in order) run here; `names` are the answer's names to bind here."""

    sandbox: list = field(default_factory=list)     # (source, grade_id or None for setup)
    trusted: list = field(default_factory=list)     # (source, grade_id or None, points)
    names: list = field(default_factory=list)
    sources: dict = field(default_factory=dict)     # name -> the submission's code of the cells that define it
    notes: list = field(default_factory=list)


def build(source_nb, submission_nb) -> Plan:
    """Split the source into sandbox and trusted cells, with the submission's answers in place."""
    answers = defaultdict(list)
    for cell in (submission_nb.cells if submission_nb is not None else []):
        if _meta(cell).get("grade_id"):
            answers[_meta(cell)["grade_id"]].append(cell)
    plan, setup_names, answer_names = Plan(), set(dir(builtins)), []
    for cell in source_nb.cells:
        if cell.cell_type != "code":
            continue
        grade_id = _meta(cell).get("grade_id")
        if is_answer(cell):
            answer_names += defined_names(cell.source)
            found = [c for c in answers.get(grade_id, []) if c.get("cell_type") == "code"]
            if not found:
                plan.notes.append(f"answer cell {grade_id!r} is missing from the submission (deleted, or its "
                                  "metadata lost)")
                plan.sandbox.append((f"raise NotImplementedError('answer cell {grade_id} is missing from the "
                                     "submission')", grade_id))
                continue
            if len(found) > 1:
                plan.notes.append(f"answer cell {grade_id!r} appears {len(found)} times; the last one was graded")
            plan.sandbox.append((found[-1].source, grade_id))
            for name in defined_names(found[-1].source):
                plan.sources[name] = (plan.sources.get(name, "") + "\n\n" + found[-1].source).strip()
        elif is_test(cell):
            plan.trusted.append((cell.source, grade_id, float(_meta(cell).get("points", 0))))
            setup_names.update(defined_names(cell.source))
        else:
            plan.sandbox.append((cell.source, None))
            plan.trusted.append((cell.source, None, 0.0))
            setup_names.update(defined_names(cell.source))
    # only names the instructor's answer cells define, never a check's, a setup cell's or a builtin's
    plan.names = [n for n in dict.fromkeys(answer_names) if n not in setup_names]
    return plan


class _Deadline(BaseException):
    """A trusted cell ran past its time limit."""


@contextlib.contextmanager
def _alarm(seconds: float):
    """Raise _Deadline in this (main) thread after `seconds`; elsewhere only the sandbox's deadline holds."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ring(*_):
        raise _Deadline

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


REVEAL_DATA = CATALOG_FILE.resolve()   # the solutions the package ships for a learner's reveal


def _hidden(source: Path, submission: Path) -> list:
    """What the sandbox must not see: the source notebook, the solutions folder, other submissions, and the
    solutions the package ships for a learner's reveal
    (a folder only when it does not hold the course, Python or the data, which the sandbox needs)."""
    needed = [COURSE_ROOT, Path(sys.prefix).resolve(), Path(os.environ.get("COURSE_DATA_DIR") or COURSE_ROOT),
              Path(tempfile.gettempdir()).resolve()]       # the sandbox's own folder is made there
    hide = []
    for path in (source.resolve(), submission.resolve()):
        folder = path.parent
        holds = any(n == folder or folder in n.parents for n in needed)
        hide.append(path if holds else folder)
    if os.environ.get("COURSE_SOLUTIONS_DIR"):
        hide.append(Path(os.environ["COURSE_SOLUTIONS_DIR"]).resolve())
    hide.append(REVEAL_DATA)    # the exercises' solutions, shipped for the learner's reveal (course_lib.learn)
    return list(dict.fromkeys(hide))


def _first_line(source: str) -> str:
    """A cell named by its first line of code (setup cells have no grade_id)."""
    lines = [line.strip() for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    return (lines[0][:60] + ("..." if len(lines[0]) > 60 else "")) if lines else "(empty)"


class _Runner:
    """The sandbox and the trusted namespace for one submission; restarts the sandbox when it is lost."""

    def __init__(self, plan: Plan, folder: Path, hide: list, cell_timeout: float, deadline: float):
        self.plan, self.folder, self.hide = plan, folder, hide
        self.cell_timeout, self.deadline = cell_timeout, deadline
        self.box, self.generation, self.skip, self.answer_errors, self.setup_errors = None, 0, {}, {}, {}
        self.ns = {"__name__": "__grading__", "__builtins__": builtins}

    def left(self) -> float:
        return min(self.cell_timeout, self.deadline - time.monotonic())

    def sandbox(self) -> Sandbox:
        """A live sandbox that has run the setup and answer cells (skipping any that hung or crashed it)."""
        while self.box is None:
            if self.deadline - time.monotonic() < 1:
                raise SandboxLost("not run: the total time limit was reached")
            if self.generation > len(self.plan.sandbox) + 2:   # every cell was blamed once: it cannot start
                raise SandboxLost("the sandbox could not start (see the grader's notes)")
            box = Sandbox(self.folder, self.hide, self.generation)
            self.generation += 1
            try:
                # its start (Python, IPython, torch: seconds on a busy machine) is not the student's time
                box.deadline = time.monotonic() + min(STARTUP_S, self.deadline - time.monotonic())
                box.run_cell("pass")
                for i, (source, grade_id) in enumerate(self.plan.sandbox):
                    if i in self.skip:
                        continue
                    box.deadline = time.monotonic() + self.left()
                    try:
                        reply = box.run_cell(source)
                    except SandboxLost as exc:
                        self.skip[i] = str(exc)
                        if grade_id:
                            self.answer_errors[grade_id] = str(exc)
                        raise
                    if reply.get("status") != "ok":
                        errors = self.answer_errors if grade_id else self.setup_errors
                        errors.setdefault(grade_id or _first_line(source),
                                          f"{reply.get('error')}: {str(reply.get('message'))[:300]}")
                box.deadline = time.monotonic() + self.left()
                values = box.get(self.plan.names)
            except SandboxLost:
                box.kill()
                continue
            for name, value in values.items():
                if hasattr(value, "source") and type(value).__name__ == "Remote":
                    object.__setattr__(value, "source", self.plan.sources.get(name))
            for name in self.plan.names:
                self.ns.pop(name, None)
            self.ns.update(values)
            self.box = box
        return self.box

    def run(self, source: str, grade_id) -> tuple[str, str]:
        """Run a trusted cell here: (status, message)."""
        try:
            box = self.sandbox()
        except SandboxLost as exc:
            return ("not run" if "total time" in str(exc) else "died"), str(exc)
        box.deadline = time.monotonic() + self.left()
        try:
            with _alarm(self.left() + 1), contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                exec(compile(source, f"<cell {grade_id or 'setup'}>", "exec"), self.ns)
        except SandboxLost as exc:
            self.box = None
            return ("timeout" if "time limit" in str(exc) else "died"), str(exc)
        except _Deadline:
            self.close()
            return "timeout", "the cell ran past its time limit"
        except StudentError as exc:
            return "failed", f"your code raised {exc}"
        except Exception as exc:  # noqa: BLE001 - a failed check, whatever it raised
            return "failed", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return "passed", ""

    def close(self) -> None:
        if self.box is not None:
            self.box.close()
            self.box = None


def grade(submission, source=None, cell_timeout: float = 120.0, timeout: float = 900.0,
          limits: Limits | None = None, student: str | None = None) -> Report:
    """Grade the notebook at `submission` against its source; never modifies either file. `limits`: the
    resource limits of every process that runs the student's code (default: Limits()). `student`: the id
    per-student variants are drawn from (course_lib.grading.variants), set as COURSE_STUDENT_ID for the
    checks here and for the sandbox; None: $COURSE_STUDENT_ID if set, else the anonymous defaults (never
    the grader's own JupyterHub name)."""
    limits = limits or Limits()
    start, submission = time.monotonic(), Path(submission)
    if not submission.exists():
        raise FileNotFoundError(f"the submission {submission} was not found")
    try:
        sub_nb, error = read_notebook(submission), ""
    except ValueError as exc:
        sub_nb, error = None, str(exc)
    try:
        source = find_source(submission, sub_nb, source)
    except FileNotFoundError as exc:   # say first that the file itself is broken: that is the student's to fix
        raise FileNotFoundError(f"{error}; and {exc}" if error else str(exc)) from None
    plan = build(read_notebook(source), sub_nb)
    # unreadable: the error says why in one line; "answer missing" notes for every cell would only hide it
    report = Report(str(submission), str(source), notes=plan.notes if sub_nb is not None else [], error=error,
                    sandbox=f"{jail.describe()}; {limits.describe()}")
    tests = [(s, g, p) for s, g, p in plan.trusted if g]
    if sub_nb is None:
        for _, grade_id, points in tests:
            report.max_points[grade_id], report.points[grade_id] = points, 0.0
            report.status[grade_id] = "failed"
            report.messages[grade_id] = "not run: the submission is not a readable notebook (see its error)"
    else:
        hide = _hidden(source, submission)
        who = student or os.environ.get(variants.ENV) or variants.ANONYMOUS
        if source.stem in variants.VARIANTS:   # say which variant was graded: a mismatch must be visible
            report.notes.append(f"graded as the {variants.describe(source.stem, who).split(' (')[0]}")
        with variants.as_student(who), \
                tempfile.TemporaryDirectory(prefix="course-grade-") as tmp, grading(hide, limits):
            runner = _Runner(plan, Path(tmp), hide, cell_timeout, start + timeout)
            try:
                for source_code, grade_id, points in plan.trusted:
                    status, message = runner.run(source_code, grade_id)
                    if not grade_id and status != "passed":   # the source's own cell, beside the checks
                        runner.setup_errors.setdefault(_first_line(source_code), f"(in the grader) {message}")
                    elif grade_id:
                        report.max_points[grade_id], report.status[grade_id] = points, status
                        report.points[grade_id] = points if status == "passed" else 0.0
                        if message:
                            report.messages[grade_id] = message[:400]
            finally:
                runner.close()
        # one line each: a message the student's code raised cannot add lines that look like the report's own
        report.notes += [f"answer cell {g!r}: {' '.join(m.split())[:200]}" for g, m in runner.answer_errors.items()]
        # the instructor's setup cells: one failing after the answers ran usually means an answer broke a name
        report.notes += [f"setup cell `{c}` failed: {' '.join(m.split())[:200]}" for c, m in runner.setup_errors.items()]
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


def write_report(report: Report, path) -> None:
    """The report as JSON at `path`, written whole or not at all (a temporary file, then a rename)."""
    path = Path(path)
    with tempfile.NamedTemporaryFile("w", dir=path.parent or ".", prefix=f".{path.name}.", delete=False) as f:
        json.dump(asdict(report), f)
        f.write("\n")
    os.replace(f.name, path)
