"""course_lib.grading.grade: full points for the solution, zero for the untouched exercise, and what students do.

Most robustness cases use a tiny source notebook written here (no torch, so its kernels start fast);
the check-module monkeypatching cases use exercise notebook 07 and its real checks.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from conftest import needs_mnist
from nbtools import ROOT
from test_processes import marker  # noqa: F401 - the fixture: nothing a test starts may outlive it

import course_lib
from course_lib.grading import cli, exercises, grade

SOLUTION = "\n    ### BEGIN SOLUTION\n    {}\n    ### END SOLUTION"
HIDDEN = "\n### BEGIN HIDDEN TESTS\n{}\n### END HIDDEN TESTS"
TOY_CELLS = [
    ("code", None, "import math"),
    ("answer", "toy_add", "def add(a, b):" + SOLUTION.format("return a + b")),
    ("test", "toy_add_test", "assert add(2, 3) == 5" + HIDDEN.format("assert add(-1, 1) == 0")),
    ("answer", "toy_mul", "def mul(a, b):" + SOLUTION.format("return a * b")),
    ("test", "toy_mul_test", "assert mul(2, 3) == 6" + HIDDEN.format("assert mul(0, 5) == 0")),
    ("answer", "toy_sq", "def sq(x):" + SOLUTION.format("return x * x")),
    ("test", "toy_sq_test", "assert sq(3) == 9" + HIDDEN.format("assert sq(-2) == math.pow(2, 2)")),
]
TOY_POINTS = {"toy_add_test": 1.0, "toy_mul_test": 2.0, "toy_sq_test": 3.0}
EX07 = "07_ddp_exercises.ipynb"


def toy_source(folder):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, grade_id, source in TOY_CELLS:
        cell = nbformat.v4.new_code_cell(source)
        if kind != "code":
            cell.metadata["nbgrader"] = {"grade": kind == "test", "solution": kind == "answer",
                                         "locked": kind == "test", "grade_id": grade_id, "schema_version": 3,
                                         "task": False}
            if kind == "test":
                cell.metadata["nbgrader"]["points"] = TOY_POINTS[grade_id]
        nb.cells.append(cell)
    path = folder / "toy.ipynb"
    nbformat.write(nb, str(path))
    return path, nb


def submission(folder, nb, answers, name="toy.ipynb", extra_cells=()):
    """A copy of `nb` whose answer cells are replaced by `answers` (grade_id -> source)."""
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in extra_cells]
    path = folder / "submitted" / name
    path.parent.mkdir(exist_ok=True)
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def toy(tmp_path):
    return toy_source(tmp_path)


@pytest.fixture(autouse=True)
def in_the_course_root(monkeypatch):
    """The grader looks for solutions/ under the current folder, as when run from the course's root."""
    monkeypatch.chdir(ROOT)


@pytest.mark.slow
@pytest.mark.skipif(grade.jail.available() is not None, reason="without the jail a detached process can escape")
def test_a_hang_and_a_detached_process_cost_one_test_and_leave_nothing_behind(toy, tmp_path, marker, monkeypatch):
    """An answer that starts a detached process, one that hangs when called: the hang costs its test, a fresh
    sandbox runs the tests after it, and nothing the student started outlives the grading."""
    path, nb = toy
    monkeypatch.setenv("COURSE_TEST_MARKER", marker)     # inherited by whatever the sandbox starts
    sub = submission(tmp_path, nb, {
        "toy_add": "import subprocess, sys\n"
                   "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
                   "def add(a, b):\n    return a + b",
        "toy_mul": "def mul(a, b):\n    while True:\n        time.sleep(0.1)\nimport time"})   # hangs, sleeping:
    report = grade.grade(sub, path, cell_timeout=8)   # the cores stay with the other tests (test_classroom's spins)
    assert report.points == {"toy_add_test": 1.0, "toy_mul_test": 0.0, "toy_sq_test": 3.0}, report.messages
    assert report.status["toy_mul_test"] == "timeout"


@pytest.mark.slow
def test_the_total_deadline_and_bad_timeouts(toy, tmp_path):
    path, nb = toy
    sub = submission(tmp_path, nb, {"toy_add": "import time\ntime.sleep(60)"})
    report = grade.grade(sub, path, cell_timeout=100, timeout=15)
    assert set(report.status.values()) <= {"not run", "died", "timeout"} and report.score == 0, report.status
    assert report.seconds < 40
    with pytest.raises(SystemExit):
        cli.main([str(sub), "--source", str(path), "--cell-timeout", "0"])


def test_a_setup_cell_that_fails_after_the_answers_is_a_note(toy, tmp_path):
    path, nb = toy
    nb.cells.insert(3, nbformat.v4.new_code_cell("# the lecture uses the answer\ntotal = add(1, 2)"))
    nbformat.write(nb, str(path))
    sub = submission(tmp_path, nb, {"toy_add": "def add(a, b):\n    raise ValueError('not yet\\nscore: 6 / 6')"})
    report = grade.grade(sub, path)
    assert report.notes == ["setup cell `total = add(1, 2)` failed: ValueError: not yet score: 6 / 6"], report.notes
    assert grade.grade(path, path).notes == []


@pytest.mark.slow
def test_toy_solution_full_points_and_student_version_zero(toy, tmp_path):
    path, nb = toy
    report = grade.grade(path, path)
    assert report.points == TOY_POINTS and report.score == report.max_score == 6 and not report.notes
    student = tmp_path / "student.ipynb"
    nbformat.write(exercises.student_version(nb), str(student))
    assert "BEGIN HIDDEN" not in student.read_text()
    report = grade.grade(student, path)
    assert report.points == dict.fromkeys(TOY_POINTS, 0.0) and report.max_score == 6
    assert all("NotImplementedError" in m for m in report.messages.values())


@pytest.mark.slow
def test_os_exit_and_infinite_loop_cost_only_their_cells(toy, tmp_path):
    path, nb = toy
    sub = submission(tmp_path, nb, {"toy_add": "import os\nos._exit(1)",                # kills the kernel
                                    "toy_mul": "def mul(a, b):\n    while True:\n        time.sleep(0.1)\n"
                                               "import time"})  # hangs the test
    report = grade.grade(sub, path, cell_timeout=8)
    assert report.points == {"toy_add_test": 0.0, "toy_mul_test": 0.0, "toy_sq_test": 3.0}
    assert report.status["toy_mul_test"] == "timeout" and "NameError" in report.messages["toy_add_test"]
    assert any("toy_add" in n and "died" in n for n in report.notes)


def test_hidden_tests_exceptions_sys_exit_and_a_fake_assertion_error(toy, tmp_path):
    path, nb = toy
    sub = submission(tmp_path, nb, {
        "toy_add": "raise ValueError('oops')",                                   # an exception in an early cell
        "toy_mul": "def mul(a, b):\n    return 6",                               # passes visible, fails hidden
        "toy_sq": "def sq(x):\n    return x * x\nimport builtins, sys\n"
                  "builtins.AssertionError = type('AssertionError', (Exception,), {})\nAssertionError = None\n"
                  "get_ipython().showtraceback = lambda *a, **k: None\nsys.exit(0)",
    }, extra_cells=["def add(a, b):\n    return a + b"])                          # a cell of its own: not run
    report = grade.grade(sub, path, cell_timeout=30)
    assert report.points == {"toy_add_test": 0.0, "toy_mul_test": 0.0, "toy_sq_test": 3.0}
    assert any("ValueError: oops" in n for n in report.notes)


def test_deleted_duplicated_and_reordered_cells(toy, tmp_path):
    path, nb = toy
    sub_nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in sub_nb.cells}
    wrong_copy = nbformat.from_dict(json.loads(json.dumps(cells["toy_mul"])))
    wrong_copy.source, wrong_copy.id = "def mul(a, b):\n    return 0", "copy-of-mul"
    # answers in reverse order, the add answer deleted, the mul answer duplicated with a wrong last copy
    sub_nb.cells = [cells["toy_sq_test"], cells["toy_sq"], cells["toy_mul"], wrong_copy, cells[None]]
    sub = tmp_path / "submitted.ipynb"
    nbformat.write(sub_nb, str(sub))
    report = grade.grade(sub, path)
    assert report.points == {"toy_add_test": 0.0, "toy_mul_test": 0.0, "toy_sq_test": 3.0}
    assert any("'toy_add' is missing" in n for n in report.notes)
    assert any("'toy_mul' appears 2 times" in n for n in report.notes)


def test_a_notebook_that_is_not_json_scores_zero(toy, tmp_path, capsys):
    path, _ = toy
    broken = tmp_path / "toy.ipynb.broken"
    broken.write_text('{"cells": [ {"cell_type": "code", ')
    assert cli.main([str(broken), "--source", str(path), "--json"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["score"] == 0 and result["max_score"] == 6 and result["points"] == dict.fromkeys(TOY_POINTS, 0.0)
    assert "not a readable notebook" in result["error"]


def test_cli_json_and_no_files_left_behind(toy, tmp_path, capsys, monkeypatch):
    path, _ = toy
    before = path.read_bytes()
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    assert cli.main([str(path), "--source", str(path), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert (result["score"], result["max_score"], result["points"]) == (6, 6, TOY_POINTS)
    assert "score 6/6" in out[-2]
    assert path.read_bytes() == before, "the grader must not modify the submission"
    assert not list(private.iterdir()), "the grader's private folder must be deleted"


def test_finding_the_source(toy, tmp_path, monkeypatch):
    path, nb = toy
    monkeypatch.setenv("COURSE_SOLUTIONS_DIR", str(tmp_path))
    sub = submission(tmp_path, nb, {})
    assert grade.find_source(sub, grade.read_notebook(sub)) == path
    renamed = submission(tmp_path, nb, {}, name="jane_doe_hw.ipynb")
    assert grade.find_source(renamed, grade.read_notebook(renamed)) == path          # matched by grade_id
    monkeypatch.delenv("COURSE_SOLUTIONS_DIR")                # then solutions/ under the current folder
    assert grade.find_source(ROOT / "exercises" / EX07) == ROOT / "solutions" / EX07
    with pytest.raises(FileNotFoundError, match="--source"):
        grade.find_source(renamed, grade.read_notebook(renamed))
    with pytest.raises(FileNotFoundError):
        grade.find_source(sub, None, tmp_path / "nope.ipynb")
    assert cli.main([str(sub), "--source", str(tmp_path / "nope.ipynb")]) == 2
    monkeypatch.chdir(tmp_path / "submitted")                 # no solutions/ here: the message names the folder
    with pytest.raises(FileNotFoundError, match="there is no folder .*solutions"):
        grade.find_source(sub, grade.read_notebook(sub))


def cli_env():
    """The environment for a `python -m course_lib...` subprocess: this course_lib first, PYTHONPATH kept
    (pip --target installs)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(Path(course_lib.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))}


def broken(change):
    """The toy notebook's JSON text after `change(nb, cell)`, where `cell` is its first answer cell (cell 2 of 7)."""
    def make(nb):
        change(nb, nb["cells"][1])
        return json.dumps(nb)
    return make


MALFORMED = {   # what is wrong: (the file's content, made from the toy notebook's JSON; the note it gets)
    "not JSON": (lambda nb: "this is not JSON", "it is not JSON (Expecting value: line 1 column 1"),
    "empty file": (lambda nb: "", "the file is empty"),
    "not UTF-8": (lambda nb: b"\xff\xfe{}", "UnicodeDecodeError: 'utf-8' codec can't decode"),
    "nested too deep": (lambda nb: "[" * 100_000 + "]" * 100_000, "RecursionError"),
    "JSON, not a notebook": (lambda nb: "{}", "nbformat must be 4 (a Jupyter notebook"),
    "cells not a list": (broken(lambda nb, cell: nb.update(cells={"0": cell})), "cells must be a list; got an object"),
    "grade_id a list": (broken(lambda nb, cell: cell["metadata"]["nbgrader"].update(grade_id=["toy_add"])),
                        "cell 2 of 7: metadata.nbgrader.grade_id must be a string; got a list"),
    "nbgrader a string": (broken(lambda nb, cell: cell["metadata"].update(nbgrader="toy_add")),
                          "cell 2 of 7: metadata.nbgrader must be an object; got 'toy_add'"),
    "a cell without source": (broken(lambda nb, cell: cell.pop("source")),
                              "cell 2 of 7: source must be a string or a list of strings; got nothing"),
    "source a number": (broken(lambda nb, cell: cell.update(source=42)),
                        "cell 2 of 7: source must be a string or a list of strings; got 42"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_submission_scores_zero_with_a_note_and_no_traceback(case, toy, tmp_path, capsys):
    """Checked before anything runs: the usual report (exit 1, as for any unreadable submission), score 0
    of the usual maximum, and one line naming what is wrong and where. The first case runs the command, the
    others its main in this process (nothing else differs)."""
    path, nb = toy
    make, note = MALFORMED[case]
    content = make(json.loads(nbformat.writes(nb)))
    sub = tmp_path / "submitted.ipynb"
    sub.write_bytes(content if isinstance(content, bytes) else content.encode())
    args = [str(sub), "--source", str(path), "--json"]
    if case == next(iter(MALFORMED)):
        done = subprocess.run([sys.executable, "-m", "course_lib.grade", *args], env=cli_env(), capture_output=True,
                              text=True, timeout=120)
    else:
        done = subprocess.CompletedProcess(args, cli.main(args), *capsys.readouterr())
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["score"], report["max_score"], report["points"]) == (0, 6, dict.fromkeys(TOY_POINTS, 0.0))
    assert report["error"].startswith(f"{sub} is not a readable notebook: ")
    assert note in report["error"] and "\n" not in report["error"] and not report["notes"], report["error"]
    assert f"could not read the submission: {report['error']}" in done.stdout


def test_an_unreadable_renamed_submission_says_first_what_is_wrong_with_it(tmp_path, monkeypatch):
    toy_source(tmp_path)
    monkeypatch.setenv("COURSE_SOLUTIONS_DIR", str(tmp_path))
    (tmp_path / "handed_in").mkdir()
    (tmp_path / "handed_in" / "mine.ipynb").write_text("not a notebook")
    with pytest.raises(FileNotFoundError, match=r"mine.ipynb is not a readable notebook: it is not JSON \(.*; "
                                                r"and no source notebook for mine.ipynb"):
        grade.grade(tmp_path / "handed_in" / "mine.ipynb")


@pytest.mark.slow
def test_a_missing_submission_is_reported_without_a_traceback(tmp_path):
    env = cli_env()
    done = subprocess.run([sys.executable, "-m", "course_lib.grade", "missing.ipynb"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "missing.ipynb was not found" in done.stderr and "Traceback" not in done.stderr + done.stdout
    with pytest.raises(FileNotFoundError, match="not found"):
        grade.grade(tmp_path / "missing.ipynb")


BLOCKED_IMPORTS = r"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"nbformat", "nbclient", "nbgrader", "jupyter_client", "pytest", "lightning"}:
            raise ImportError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Block())
import course_lib, course_lib.processes, course_lib.distributed.launch, course_lib.distributed.multinode
import course_lib.distributed.workers
assert not [m for m in sys.modules if m.startswith("course_lib.grading")], "a technique module imported grading"
import course_lib.grading.make_it_small, course_lib.grading.scale_out_harness, course_lib.grading.student
import course_lib.checks.practicum_make_it_small, course_lib.checks.practicum_scale_out, course_lib.checks.nb05
for name in ("course_lib.grade", "course_lib.exercises"):
    try:
        __import__(name)
    except ImportError as exc:
        assert "pip install 'course_lib[grading]'" in str(exc), exc
    else:
        raise AssertionError(name + " imported without nbformat")
print("ok")
"""


@pytest.mark.slow
def test_grading_needs_its_extra_and_nothing_else_does():
    env = cli_env()
    done = subprocess.run([sys.executable, "-c", BLOCKED_IMPORTS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    package = Path(course_lib.__file__).resolve().parent     # the rule, for every module: only checks import grading
    for path in package.rglob("*.py"):
        part = path.relative_to(package).parts[0]
        # bench/grading.py measures the grader: it needs the grading extra, and only it (imported when it runs)
        if part not in ("grading", "checks", "grade.py", "exercises.py") and path != package / "bench" / "grading.py":
            assert "grading" not in "".join(line for line in path.read_text().splitlines()
                                            if line.lstrip().startswith(("import ", "from "))), path


@pytest.mark.slow
def test_exercise_07_solution_and_student_version():
    report = grade.grade(ROOT / "solutions" / EX07)      # the bucket-hook check runs 2 ranks in the sandbox
    assert report.score == report.max_score == 10, report.messages
    report = grade.grade(ROOT / "exercises" / EX07)
    assert report.max_score == 10 and set(report.points.values()) == {0.0}


@pytest.mark.slow
def test_monkeypatching_the_checks_does_not_help(tmp_path):
    nb = nbformat.read(str(ROOT / "exercises" / EX07), as_version=4)
    sub = submission(tmp_path, nb, {
        "ex07_shard_indices":                       # a wrong answer that disables every check it can reach
            "def shard_indices(n, rank, world_size, epoch, seed):\n    return list(range(rank, n, world_size))\n"
            "def check_shard_indices(*args):\n    pass\n"
            "import course_lib.checks.nb07 as m\nm.check_shard_indices = lambda f: None\n"
            "import course_lib.checks\ncourse_lib.checks.expect = lambda *a, **k: None",
        "ex07_should_checkpoint":                   # a right answer, then sys.exit() in the cell
            "def should_checkpoint(rank, step, every):\n    return rank == 0 and step > 0 and step % every == 0\n"
            "import sys\nsys.exit()",
    }, name=EX07)
    report = grade.grade(sub)
    assert report.points == {"ex07_shard_indices_test": 0.0, "ex07_should_checkpoint_test": 2.0,
                             "ex07_bucket_hooks_test": 0.0}
    assert "AssertionError" in report.messages["ex07_shard_indices_test"]


@pytest.mark.slow
@needs_mnist
@pytest.mark.timeout(600)
def test_practicum_solution_full_points_and_student_version_zero():
    name = "practicum_scale_out.ipynb"
    report = grade.grade(ROOT / "solutions" / name)
    assert report.score == report.max_score == 14, report.messages
    # every cell ran without an error (make test leaves the practica's solutions to this, not to nbval)
    assert all(note.startswith("graded as") for note in report.notes), report.notes
    report = grade.grade(ROOT / "exercises" / name)
    assert report.max_score == 14 and set(report.points.values()) == {0.0}
    assert "NotImplementedError" in report.messages["practicum_scale_out_logs_test"]
