"""The learner's progress record (course_lib.learn.record) and the exercises' catalog it names (.catalog)."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import nbformat
import pytest

from course_lib.grading import catalog as catalog_build
from course_lib.grading.exercises import student_version
from course_lib.learn import catalog, record, report
from nbtools import ROOT

TEST = "ex00_count_parameters_test"


def test_a_check_call_is_recorded_with_a_hash_and_never_the_source(progress):
    answer = "def count_parameters(model):\n    return 0"
    first = record.record(TEST, False, answer)
    second = record.record("ex00_count_parameters", True, answer + "\n")      # the answer's grade_id: its test's
    data = json.loads(progress.read_text())
    assert data["attempts"] == [first, second] and [a["attempt"] for a in data["attempts"]] == [1, 2]
    assert {a["test"] for a in data["attempts"]} == {TEST}
    assert {a["notebook"] for a in data["attempts"]} == {"00_start_here_exercises"}    # from the catalog
    assert re.fullmatch(r"[0-9a-f]{16}", first["answer_sha256"]) and first["answer_sha256"] != second["answer_sha256"]
    assert "return 0" not in progress.read_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["time"])
    assert record.failures_since_pass(TEST) == 0 and record.has_passed(TEST)
    record.record(TEST, False)
    record.record(TEST, False)
    assert record.failures_since_pass(TEST) == 2 and record.has_passed(TEST)


def test_two_kernels_checking_at_once_lose_nothing(progress):
    # both start at the same instant (after their imports) and record 50 calls of the same exercise each
    code = textwrap.dedent("""
        import sys, time
        from course_lib.learn import record
        start = float(sys.argv[2])
        time.sleep(max(0.0, start - time.time()))
        for i in range(50):
            assert record.record("ex00_count_parameters_test", i % 3 == 0, f"{sys.argv[1]} {i}") is not None
    """)
    start = time.time() + 5
    procs = [subprocess.Popen([sys.executable, "-c", code, name, str(start)], env=dict(os.environ))
             for name in ("kernel A", "kernel B")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    attempts = json.loads(progress.read_text())["attempts"]
    assert len(attempts) == 100
    assert sorted(a["attempt"] for a in attempts) == list(range(1, 101))      # each call saw the one before
    assert len({a["answer_sha256"] for a in attempts}) == 100
    assert not list(progress.parent.glob(".progress-*"))           # no temporary file left


@pytest.mark.parametrize("where", ["a file in the way", "a read-only file system"])
def test_an_unwritable_folder_records_nothing_says_so_once_and_the_check_still_passes(tmp_path, where):
    blocker = tmp_path / "file"
    blocker.write_text("")
    folder = blocker / "sub" if where == "a file in the way" else "/proc/course_lib_progress"   # root ignores chmod
    code = textwrap.dedent("""
        from torch import nn
        from course_lib.checks.nb00 import check_count_parameters
        from course_lib.learn import record
        assert [record.record("ex00_count_parameters_test", False) for _ in range(3)] == [None] * 3
        check_count_parameters(lambda model: sum(p.numel() for p in model.parameters()))
        assert record.record("ex00_count_parameters_test", True) is None
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "COURSE_PROGRESS_DIR": str(folder)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0].startswith("note: progress not recorded: ") and str(folder) in notes[0]
    assert "✔ count_parameters: all checks passed" in out.stdout


@pytest.mark.parametrize("home", ["under a file", ""])
def test_a_missing_home_records_nothing_and_says_so(tmp_path, monkeypatch, capsys, home):
    for name in ("COURSE_PROGRESS_DIR", "XDG_DATA_HOME", "COURSE_PROGRESS"):
        monkeypatch.delenv(name, raising=False)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("HOME", str(blocker / "home") if home else "")
    monkeypatch.chdir(tmp_path)
    record._NOTES.clear()
    assert record.record(TEST, True) is None and record.record_open("00_start_here_exercises") is None
    notes = capsys.readouterr().out.splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: progress not recorded: ")
    assert not (tmp_path / ".local").exists()          # HOME="" is not the current folder (nor /)
    assert record.load() == {"format": 1, "attempts": [], "opened": []}


@pytest.mark.parametrize("text", ["{not json", '{"format": 1, "attempts": [{"test": 3}], "opened": []}',
                                  '{"format": 1, "opened": [], "attempts": [{"test": "ex00_count_parameters_test", '
                                  '"notebook": "00_start_here_exercises", "passed": "yes", "attempt": 1, '
                                  '"time": "2026-11-28T10:00:00Z", "answer_sha256": null}]}',
                                  '{"format": 2, "attempts": [], "opened": []}', "[]"])
def test_a_corrupt_or_hand_edited_file_is_set_aside_and_named(progress, capsys, text):
    progress.parent.mkdir(parents=True)
    progress.write_text(text)
    assert record.load() == {"format": 1, "attempts": [], "opened": []}
    aside = list(progress.parent.glob("progress.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == text and not progress.exists()
    assert aside[0].name in capsys.readouterr().out
    progress.write_text(text)                   # again within the same second: both kept
    assert record.record(TEST, True)["attempt"] == 1          # a fresh record starts
    assert len(list(progress.parent.glob("progress.json.corrupt-*"))) == 2


def test_off_writes_nothing(progress, monkeypatch, capsys):
    for value in ("off", "0", "False", "no"):
        monkeypatch.setenv("COURSE_PROGRESS", value)
        assert not record.enabled()
        assert record.record(TEST, True) is None and record.record_open("00_start_here_exercises") is None
        assert record.reset() == 0
        report.show("00_start_here_exercises")
        assert not progress.parent.exists() and "recording is off" in capsys.readouterr().out
    progress.parent.mkdir()
    progress.write_text("{not json")
    assert record.load()["attempts"] == [] and progress.read_text() == "{not json"   # not even set aside


def test_nbgrader_autograde_records_nothing_its_validate_does(progress, monkeypatch):
    """autograde runs the students' notebooks on the TA's machine: not the TA's progress. A learner validating
    their own notebook (nbgrader validate) is their own work."""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert not record.enabled() and record.record(TEST, True) is None and not progress.exists()
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert record.enabled() and record.record(TEST, True)["attempt"] == 1


def test_the_practica_are_never_recorded(progress):
    assert record.record("practicum_scale_out_launch_test", True) is None and not progress.exists()
    assert record.record("pr_small_floor_test", False) is None and not progress.exists()


def test_reset_one_exercise_one_notebook_or_all(progress):
    record.record_open("00_start_here_exercises")
    record.record_open("01_cpu_mnist_exercises")
    for test in (TEST, TEST, "ex00_describe_batch_test", "ex01_accuracy_test"):
        record.record(test, False)
    assert record.reset(test_id="ex00_count_parameters") == 2          # the answer's grade_id names it too
    assert [a["test"] for a in record.load()["attempts"]] == ["ex00_describe_batch_test", "ex01_accuracy_test"]
    assert record.reset(notebook="00_start_here_exercises") == 2       # its check and its opening
    data = record.load()
    assert [a["test"] for a in data["attempts"]] == ["ex01_accuracy_test"]
    assert data["opened"][0]["notebook"] == "01_cpu_mnist_exercises" and len(data["opened"]) == 1
    assert record.reset() == 2 and record.load() == {"format": 1, "attempts": [], "opened": []}
    with pytest.raises(ValueError, match="not both"):
        record.reset(notebook="00_start_here_exercises", test_id=TEST)


def test_the_catalog_follows_solutions_and_ships_no_practicum_solution():
    assert not catalog_build.sync(ROOT / "solutions", ROOT / "pyproject.toml", student_version, check=True), \
        "run python -m course_lib.exercises"
    assert catalog_build.build(ROOT / "solutions", ROOT / "pyproject.toml", student_version) == catalog.load()
    course = catalog.load()
    names = sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))
    assert [nb["notebook"] for nb in course["notebooks"]] == names
    # grade_ids are unique across the course (a practicum's several tests may follow one answer cell)
    ids = [(ex["answer"], ex["test"]) for nb in course["notebooks"] for ex in nb["exercises"] if not nb["practicum"]]
    assert len({i for pair in ids for i in pair}) == 2 * len(ids)
    tests = [ex["test"] for nb in course["notebooks"] for ex in nb["exercises"]]
    assert len(set(tests)) == len(tests)
    for nb in course["notebooks"]:
        assert nb["exercises"], nb["notebook"]
        student = nbformat.read(str(ROOT / "exercises" / f"{nb['notebook']}.ipynb"), 4)
        sources = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in student.cells}
        for ex in nb["exercises"]:
            assert ex["stub"] == sources[ex["answer"]] and "NotImplementedError" in ex["stub"]
            assert ex["test_source"] in sources[ex["test"]] and "HIDDEN" not in ex["test_source"]
            assert ex["checks"] and all(f"{name}(" in ex["test_source"] for name in ex["checks"])
            if nb["practicum"]:
                assert ex["solution"] is None and ex["minutes"] is None
            else:
                assert ex["solution"] and "NotImplementedError" not in ex["solution"] and "### " not in ex["solution"]
        if not nb["practicum"]:
            assert sum(ex["minutes"] for ex in nb["exercises"]) == nb["minutes"] and nb["lecture"]
    shipped = catalog.FILE.read_text()
    for name in ("practicum_scale_out", "practicum_make_it_small"):
        source = "\n".join(c.source for c in nbformat.read(str(ROOT / "solutions" / f"{name}.ipynb"), 4).cells)
        regions = re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S)
        lines = [s.strip() for r in regions for s in r.splitlines() if len(s.strip()) >= 40]  # not `model.eval()`
        assert lines and not [line for line in lines if line in shipped], f"{name}'s solution is in catalog.json"
    assert catalog.exercise("ex00_count_parameters") == catalog.exercise(TEST)
    with pytest.raises(KeyError, match="no exercise has the grade_id 'ex99'"):
        catalog.exercise("ex99")


def _header_of(path):
    return nbformat.read(str(path), 4).cells[0].source


@pytest.mark.parametrize("estimate, error", [
    ("**Estimated time:** 15 minutes.", "must give each of its 2 exercises its minutes"),
    ("**Estimated time:** 15 minutes (exercise 1: 5).", "must give each of its 2 exercises its minutes"),
    ("**Estimated time:** 15 minutes (exercise 1: 5, exercise 2: 5).", "add up to 10 minutes, not 15"),
    ("", "needs '\\*\\*Estimated time:\\*\\*"),
])
def test_a_header_without_the_time_per_exercise_is_an_error_naming_the_notebook(tmp_path, estimate, error):
    name = "00_start_here_exercises.ipynb"
    shutil.copy(ROOT / "solutions" / name, tmp_path / name)
    raw = json.loads((tmp_path / name).read_text())
    header = "".join(raw["cells"][0]["source"])
    raw["cells"][0]["source"] = re.sub(r"\*\*Estimated time:\*\*[^\n]*", estimate, header)
    (tmp_path / name).write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=f"{name}: .*{error}"):
        catalog_build.build(tmp_path, ROOT / "pyproject.toml", student_version)


def test_the_reveal_setting_is_read_from_pyproject(tmp_path):
    off = tmp_path / "pyproject.toml"
    off.write_text('[tool.course_lib]\nrelease = "v1"\nsolution_reveal = false\n\n'
                   '[tool.other]\nsolution_reveal = true\n')
    assert catalog_build._reveal_setting(off) is False
    off.write_text('[tool.course_lib]\nrelease = "v1"\n')
    assert catalog_build._reveal_setting(off) is True
    assert catalog.load()["reveal"] is catalog_build._reveal_setting(ROOT / "pyproject.toml")
