"""course_lib.grading.classroom: a folder of submissions graded in parallel into a gradebook, resumably.

The submissions are of the toy notebook of test_grade (no torch in its cells, so sandboxes start fast).
"""
import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbtools import ROOT
from test_grade import cli_env, submission, toy_source

from course_lib.grading import classroom, cli, grade, gradebook

STUB = "def {}(*args):\n    raise NotImplementedError"
CLASS = {   # student -> (answers, expected points of toy_add_test, toy_mul_test, toy_sq_test)
    "ada": ({}, (1, 2, 3)),
    "bob": ({"toy_add": STUB.format("add"), "toy_mul": STUB.format("mul"), "toy_sq": STUB.format("sq")}, (0, 0, 0)),
    "cy": ({"toy_mul": "def mul(a, b):\n    return a + b"}, (1, 0, 3)),
    "dee": ({"toy_add": "def add(a, b):\n    while True:\n        pass"}, (0, 2, 3)),
    "eve": ({"toy_mul": "def mul(a, b):\n    hog = bytearray(64 << 30)\n    return a * b"}, (1, 0, 3)),
    "fay": ({"toy_add": "import socket\ndef add(a, b):\n    socket.create_connection(('1.1.1.1', 80), timeout=3)\n"
                        "    return a + b"}, (0 if grade.jail.available() is None else None, 2, 3)),
    "gil": ({"toy_sq": "def sq(x):\n    return x ** 2 + 0.0"}, (1, 2, 3)),   # different, still right
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded once with --jobs 2: (source, submissions folder, results folder, exit code, stdout)."""
    root = tmp_path_factory.mktemp("class")
    source, nb = toy_source(root)
    (root / "submissions").mkdir()
    for student, (answers, _) in CLASS.items():
        shutil.move(submission(root, nb, answers, name=f"{student}.ipynb"), root / "submissions" / f"{student}.ipynb")
    (root / "submissions" / "hal.ipynb").write_text("{ this is not JSON")
    out = root / "results"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = cli.main([str(root / "submissions"), "--source", str(source), "--out", str(out), "--jobs", "2",
                           "--cell-timeout", "5", "--timeout", "120", "--memory-mb", "2048"])
    return source, root / "submissions", out, code, stdout.getvalue()


def rows(out):
    with open(out / "gradebook.csv", newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_the_gradebook_row_by_row(graded):
    _, _, out, code, stdout = graded
    assert code == 0, stdout
    book = rows(out)
    assert sorted(book) == sorted([*CLASS, "hal"])
    for student, (_, expected) in CLASS.items():
        row = book[student]
        got = tuple(float(row[g]) for g in ("toy_add_test", "toy_mul_test", "toy_sq_test"))
        assert all(e is None or g == e for g, e in zip(got, expected)), (student, got, expected)
        assert (row["status"], float(row["max"]), float(row["total"])) == ("graded", 6.0, sum(got)), row
    assert (book["hal"]["status"], book["hal"]["total"], book["hal"]["max"]) == ("unreadable", "0", "6")
    assert "8 submissions: mean" in stdout and "not graded normally: hal/toy.ipynb (unreadable)" in stdout
    assert (out / "totals.png").stat().st_size > 1000 and (out / "summary.txt").read_text().startswith("8 submissions")


def test_feedback_and_gradescope_results_say_why(graded):
    source, _, out, _, _ = graded
    dee = (out / "dee" / "feedback.md").read_text()
    assert "| `toy_add_test` | 0 / 1 | timeout | the student's code ran past the time limit |" in dee
    eve = json.loads((out / "eve" / "results.json").read_text())
    assert eve["score"] == 4.0 and [t["name"] for t in eve["tests"]] == ["toy_add_test", "toy_mul_test", "toy_sq_test"]
    assert eve["tests"][1] == {"name": "toy_mul_test", "score": 0.0, "max_score": 2.0, "status": "failed",
                               "output": "your code raised MemoryError", "visibility": "visible"}
    hidden = "assert mul(0, 5) == 0"   # a hidden test of the toy: never shown to the student
    assert hidden in source.read_text() and all(hidden not in p.read_text() for p in out.rglob("*.md"))


@pytest.mark.slow
def test_a_rerun_grades_only_what_changed(graded, capsys):
    source, subs, out, _, _ = graded
    stamps = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/grade.json")}
    before = (out / "gradebook.csv").read_text()
    records = classroom.grade_class(subs, out, jobs=2, source=source, cell_timeout=5, timeout=120,
                                    limits=classroom.Limits(memory_mb=2048), progress=False)
    assert len(records) == len(stamps) and (out / "gradebook.csv").read_text() == before
    assert stamps == {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/grade.json")}, "nothing regraded"
    bob = json.loads((subs / "bob.ipynb").read_text())   # bob fixes one answer: only bob is graded again
    for cell in bob["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == "toy_sq":
            cell["source"] = "def sq(x):\n    return x * x"
    (subs / "bob.ipynb").write_text(json.dumps(bob))
    classroom.grade_class(subs, out, jobs=2, source=source, cell_timeout=5, timeout=120,
                          limits=classroom.Limits(memory_mb=2048), progress=False)
    changed = {name for name, ns in stamps.items() if (out / name / "grade.json").stat().st_mtime_ns != ns}
    assert changed == {"bob"} and rows(out)["bob"]["total"] == "3" and len(rows(out)) == len(stamps)


@pytest.mark.slow
def test_a_grader_that_overruns_is_stopped_and_retried(tmp_path, monkeypatch):
    source, nb = toy_source(tmp_path)
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.move(submission(tmp_path, nb, {}, name="kim.ipynb"), subs / "kim.ipynb")
    monkeypatch.setattr(classroom, "SLACK_S", -119.0)   # stop it 1 s in
    records = classroom.grade_class(subs, tmp_path / "out", jobs=1, source=source, timeout=120, progress=False)
    assert records[0]["status"] == "timeout" and records[0]["report"]["score"] == 0
    assert records[0]["report"]["max_score"] == 6 and "stopped" in records[0]["why"]
    monkeypatch.setattr(classroom, "SLACK_S", 60.0)   # a timeout is not final: the rerun grades it
    records = classroom.grade_class(subs, tmp_path / "out", jobs=1, source=source, timeout=120, progress=False)
    assert (records[0]["status"], records[0]["report"]["score"]) == ("graded", 6.0)


def test_a_malformed_or_foreign_submission_is_explained_to_its_student(tmp_path, monkeypatch):
    """Without --source: a renamed file that is not JSON scores 0 of its classmates' assignment and its student
    reads why; a notebook of no assignment says so; the advice to pass --source is for the instructor only."""
    (tmp_path / "solutions").mkdir()
    source, nb = toy_source(tmp_path / "solutions")
    monkeypatch.setenv("COURSE_SOLUTIONS_DIR", str(tmp_path / "solutions"))
    subs = tmp_path / "submitted"
    for student in ("ann", "bo"):
        (subs / student / "ps1").mkdir(parents=True)
        shutil.move(submission(tmp_path, nb, {}, name="toy.ipynb"), subs / student / "ps1" / "toy.ipynb")
    (subs / "cy" / "ps1").mkdir(parents=True)
    (subs / "cy" / "ps1" / "toy (1).ipynb").write_text('{"cells": [\n  {"cell_type": "code",\n  oops}')
    (subs / "dee" / "ps1").mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]),
                   str(subs / "dee" / "ps1" / "mine.ipynb"))
    out = tmp_path / "out"
    records = {r["student"]: r for r in classroom.grade_class(subs, out, jobs=2, progress=False)}
    assert [records[s]["report"]["score"] for s in ("ann", "bo")] == [6.0, 6.0]
    cy, dee = records["cy"], records["dee"]
    assert (cy["status"], cy["notebook"], cy["report"]["score"], cy["report"]["max_score"]) == \
        ("unreadable", "toy.ipynb", 0.0, 6.0), cy
    feedback = (out / "cy" / "feedback.md").read_text()
    assert "is not a readable notebook: it is not JSON" in feedback and "line 3" in feedback, feedback
    assert (dee["status"], dee["notebook"], dee["report"]["score"], dee["report"]["max_score"]) == \
        ("no source", "toy.ipynb", 0.0, 6.0), dee
    feedback = (out / "dee" / "feedback.md").read_text()
    assert "mine.ipynb is not one of this course's assignments" in feedback, feedback
    assert not any("--source" in p.read_text() for p in out.rglob("*") if p.suffix in (".md", ".json")
                   and p.name != "grade.json")
    summary = (out / "summary.txt").read_text()
    assert "dee/toy.ipynb (no source)" in summary and "no source notebook for mine.ipynb" in summary \
        and "pass --source" in summary, summary


def test_an_unreadable_file_with_nothing_to_compare_is_0_of_0_and_says_why(tmp_path, monkeypatch):
    (tmp_path / "solutions").mkdir()
    monkeypatch.setenv("COURSE_SOLUTIONS_DIR", str(tmp_path / "solutions"))
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "kim.ipynb").write_text("")
    record, = classroom.grade_class(tmp_path / "subs", tmp_path / "out", progress=False)
    assert (record["status"], record["report"]["max_score"]) == ("unreadable", 0.0)
    assert "the file is empty" in (tmp_path / "out" / "kim" / "feedback.md").read_text()
    assert "no source notebook for kim.ipynb" in record["why"]


def test_layouts_flat_per_student_and_nbgrader(tmp_path):
    for rel in ["flat/ann.ipynb", "flat/.ipynb_checkpoints/ann-checkpoint.ipynb",
                "per/ann/07_ddp_exercises.ipynb", "per/bo/07_ddp_exercises.ipynb",
                "submitted/ann/ps3/07_ddp_exercises.ipynb", "submitted/ann/ps4/12_pruning_exercises.ipynb",
                "submitted/ann/ps4/deep/er/x.ipynb"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    found = lambda d: [(s.student, s.folder) for s in classroom.find_submissions(tmp_path / d)]
    assert found("flat") == [("ann", "ann")]
    assert found("per") == [("ann", "ann/07_ddp_exercises"), ("bo", "bo/07_ddp_exercises")]
    assert found("submitted") == [("ann", "ann/ps3/07_ddp_exercises"), ("ann", "ann/ps4/12_pruning_exercises")]


def test_bad_arguments_say_what_is_allowed(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .ipynb under"):
        classroom.grade_class(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(ValueError, match="jobs must be a whole number >= 1"):
        classroom.grade_class(tmp_path / "empty", tmp_path / "out", jobs=0)
    (tmp_path / "empty" / "a.ipynb").write_text("{}")
    with pytest.raises(ValueError, match="inside the submissions folder"):
        classroom.grade_class(tmp_path / "empty", tmp_path / "empty" / "out")
    assert cli.main([str(tmp_path / "empty"), "--jobs", "0"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([str(tmp_path / "empty"), "--memory-mb", "0"])
    assert "--memory-mb must be a whole number >= 1" in capsys.readouterr().err
    assert classroom.default_jobs() == max(1, len(os.sched_getaffinity(0)) // 2)


def test_histogram_and_summary_of_a_small_class():
    assert gradebook.histogram([0, 1, 5, 10, 10], 10) == [(0, 2, 2), (2, 4, 0), (4, 6, 1), (6, 8, 0), (8, 10, 2)]
    record = lambda s, t, st="graded": {"student": s, "notebook": "n.ipynb", "status": st, "seconds": t,
                                         "report": {"score": t, "max_score": 10.0}}
    text = gradebook.summary([record("a", 2.0), record("b", 8.0), record("c", 5.0, "timeout")])
    assert text.splitlines()[0] == "3 submissions: mean 5.00, median 5 of 10 points"
    assert "slowest: b/n.ipynb 8 s, c/n.ipynb 5 s, a/n.ipynb 2 s" in text and "c/n.ipynb (timeout)" in text


@pytest.mark.slow
def test_gradescope_run_autograder_grades_one_submission(tmp_path):
    """tools/gradescope/run_autograder as Gradescope runs it, in a stand-in for /autograder."""
    (tmp_path / "source" / "solutions").mkdir(parents=True)
    source, nb = toy_source(tmp_path / "source" / "solutions")
    (tmp_path / "submission").mkdir()
    shutil.move(submission(tmp_path, nb, {"toy_mul": "def mul(a, b):\n    return 0"}), tmp_path / "submission")
    env = {**cli_env(), "AUTOGRADER_ROOT": str(tmp_path), "PYTHON": sys.executable}
    script = ROOT / "tools" / "gradescope" / "run_autograder"
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["score"] == 4.0 and [t["score"] for t in results["tests"]] == [1.0, 0.0, 3.0], results
    for f in (tmp_path / "submission").iterdir():
        f.unlink()
    subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert results["score"] == 0 and "No .ipynb was submitted" in results["output"]
