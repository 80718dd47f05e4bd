"""The learner's progress record and its report (course_lib.learn.record, .report, .catalog)."""
import json
import os
import re
import subprocess
import sys

import nbformat
import pytest

from course_lib.grading import catalog as catalog_build
from course_lib.grading.exercises import student_version
from course_lib.learn import catalog, record, report
from nbtools import ROOT

TEST = "ex00_count_parameters_test"


@pytest.fixture
def progress(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS_DIR", str(tmp_path / "p"))
    monkeypatch.delenv("COURSE_PROGRESS", raising=False)
    record._NOTES.clear()
    return tmp_path / "p" / "progress.json"


def test_a_check_call_is_recorded_with_a_hash_and_never_the_source(progress):
    answer = "def count_parameters(model):\n    return 0"
    first = record.record(TEST, False, answer, "00_start_here_exercises")
    second = record.record(TEST, True, answer + "\n", "00_start_here_exercises")
    data = json.loads(progress.read_text())
    assert data["attempts"] == [first, second] and [a["attempt"] for a in data["attempts"]] == [1, 2]
    assert re.fullmatch(r"[0-9a-f]{16}", first["answer_sha256"]) and first["answer_sha256"] != second["answer_sha256"]
    assert "return 0" not in progress.read_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", first["time"])
    assert record.failures_since_pass(TEST) == 0 and record.has_passed(TEST)
    record.record(TEST, False)
    assert record.failures_since_pass(TEST) == 1


def test_two_kernels_checking_at_once_lose_nothing(progress):
    code = ("import sys; from course_lib.learn import record\n"
            "for i in range(50): record.record(sys.argv[1], i % 3 == 0, str(i), 'nb')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, test], env=dict(os.environ))
             for test in ("ex00_count_parameters_test", "ex00_describe_batch_test")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    attempts = json.loads(progress.read_text())["attempts"]
    assert len(attempts) == 100
    for test in ("ex00_count_parameters_test", "ex00_describe_batch_test"):
        assert [a["attempt"] for a in attempts if a["test"] == test] == list(range(1, 51))
    assert not list(progress.parent.glob(".progress-*"))           # no temporary file left


@pytest.mark.parametrize("where", ["a file in the way", "a read-only file system"])
def test_an_unwritable_folder_never_breaks_a_check(tmp_path, monkeypatch, capsys, where):
    blocker = tmp_path / "file"
    blocker.write_text("")
    folder = blocker / "sub" if where == "a file in the way" else "/proc/course_lib_progress"
    monkeypatch.setenv("COURSE_PROGRESS_DIR", str(folder))
    record._NOTES.clear()
    assert record.record(TEST, True) is None and record.record(TEST, False) is None
    notes = capsys.readouterr().out.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("note: progress not recorded") and str(folder) in notes[0]


def test_a_missing_home_records_nothing_and_says_so(tmp_path, monkeypatch, capsys):
    for name in ("COURSE_PROGRESS_DIR", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("HOME", str(blocker / "home"))
    record._NOTES.clear()
    assert record.path() == blocker / "home" / ".local" / "share" / "course_lib" / "progress.json"
    assert record.record(TEST, True) is None
    assert "progress not recorded" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["{not json", '{"format": 1, "attempts": [{"test": 3}], "opened": []}',
                                  '{"format": 2, "attempts": [], "opened": []}', "[]"])
def test_a_corrupt_or_hand_edited_file_is_set_aside_and_named(progress, capsys, text):
    progress.parent.mkdir(parents=True)
    progress.write_text(text)
    assert record.load() == {"format": 1, "attempts": [], "opened": []}
    aside = list(progress.parent.glob("progress.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == text and not progress.exists()
    assert aside[0].name in capsys.readouterr().out
    assert record.record(TEST, True)["attempt"] == 1          # a fresh record starts


def test_off_writes_nothing(progress, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_PROGRESS", "off")
    assert record.record(TEST, True) is None and record.record_open("00_start_here_exercises") is None
    report.show("00_start_here_exercises")
    assert not progress.parent.exists() and "recording is off" in capsys.readouterr().out


def test_the_practica_are_never_recorded(progress):
    assert record.record("practicum_scale_out_launch_test", True) is None and not progress.exists()


def prepared() -> dict:
    def attempt(test, passed, n, time):
        return {"test": test, "notebook": test[:4], "passed": passed, "attempt": n, "time": time, "answer_sha256": None}
    return {"format": 1, "opened": [{"notebook": "00_start_here_exercises", "time": "2026-11-28T10:00:00Z"}],
            "attempts": [attempt("ex00_count_parameters_test", False, 1, "2026-11-28T10:04:00Z"),
                         attempt("ex00_count_parameters_test", True, 2, "2026-11-28T10:06:00Z"),
                         attempt("ex00_describe_batch_test", False, 1, "2026-11-28T10:10:00Z")]}


def test_the_table_on_a_prepared_record():
    lines = report.table(prepared()).splitlines()
    assert lines[:3] == ["00_start_here_exercises  (about 15 minutes)",
                         "  ✔ Exercise 1 — count parameters                  passed      2 checks",
                         "  … Exercise 2 — describe a batch                  tried       1 check"]
    tracked = sum(len(nb["exercises"]) for nb in catalog.load()["notebooks"] if not nb["practicum"])
    assert lines[-2] == f"1 of {tracked} exercises passed"
    assert lines[-1] == "Next: 00_start_here_exercises · Exercise 2 — describe a batch"
    assert "practicum_scale_out: graded practicum, not tracked here" in lines


def test_the_command_prints_the_table_and_resets(progress, capsys):
    from course_lib.__main__ import main
    progress.parent.mkdir(parents=True)
    progress.write_text(json.dumps(prepared()))
    assert main(["progress"]) == 0 and "1 of" in capsys.readouterr().out
    assert main(["progress", "--reset", "ex00_count_parameters"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert [a["test"] for a in record.load()["attempts"]] == ["ex00_describe_batch_test"]
    assert main(["progress", "--reset", "nonsense"]) == 2 and "--reset 'nonsense'" in capsys.readouterr().err
    assert main(["progress", "--reset", "all"]) == 0 and record.load()["attempts"] == []


def test_medians_from_the_previous_milestone_to_the_first_pass(tmp_path, capsys):
    second = prepared()
    second["opened"] = [{"notebook": "00_start_here_exercises", "time": "2026-11-28T09:00:00Z"}]
    second["attempts"][1]["time"] = "2026-11-28T09:10:00Z"
    second["attempts"][2].update(passed=True, time="2026-11-28T09:13:00Z")
    got = report.medians([prepared(), second])
    # learner 1: opened 10:00, passed 10:06 (6 min); learner 2: 10 min, then describe_batch 3 min after that pass
    assert got == {"ex00_count_parameters_test": 8.0, "ex00_describe_batch_test": 3.0}
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for f, data in zip(files, (prepared(), second)):
        f.write_text(json.dumps(data))
    assert report.main(["--medians", *map(str, files)]) == 0
    assert "median   8.0 min" in capsys.readouterr().out


def test_the_catalog_follows_solutions_and_ships_no_practicum_solution(tmp_path):
    assert not catalog_build.sync(ROOT / "solutions", ROOT / "pyproject.toml", student_version, check=True), \
        "run python -m course_lib.exercises"
    course = catalog.load()
    shipped = catalog.FILE.read_text()
    for nb in course["notebooks"]:
        assert nb["exercises"], nb["notebook"]
        for ex in nb["exercises"]:
            assert (ex["solution"] is None) == nb["practicum"]
            assert "NotImplementedError" in ex["stub"] and "HIDDEN" not in ex["test_source"]
    for name in ("practicum_scale_out", "practicum_make_it_small"):
        source = "\n".join(c.source for c in nbformat.read(str(ROOT / "solutions" / f"{name}.ipynb"), 4).cells)
        for region in re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S):
            lines = [s.strip() for s in region.splitlines() if len(s.strip()) >= 40]   # not `optimizer.zero_grad()`
            assert not any(line in shipped for line in lines), f"{name}'s solution is in catalog.json"
    with pytest.raises(KeyError, match="no exercise has the grade_id 'ex99'"):
        catalog.exercise("ex99")


def test_the_reveal_setting_is_read_from_pyproject(tmp_path):
    off = tmp_path / "pyproject.toml"
    off.write_text('[tool.course_lib]\nrelease = "v1"\nsolution_reveal = false\n\n'
                   '[tool.other]\nsolution_reveal = true\n')
    assert catalog_build._reveal_setting(off) is False
    off.write_text('[tool.course_lib]\nrelease = "v1"\n')
    assert catalog_build._reveal_setting(off) is True
