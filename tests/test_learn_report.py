"""Where am I (course_lib.learn.report): the table, one notebook's part, the picture, reset and the medians."""
import json
import shutil

import matplotlib
import nbformat
import pytest

from course_lib.__main__ import main
from course_lib.grading.catalog import estimate
from course_lib.learn import record, report
from nbtools import ROOT

matplotlib.use("Agg")


def exercise(test, title, minutes):
    return {"answer": test.removesuffix("_test"), "test": test, "points": 2, "title": title, "minutes": minutes,
            "checks": [], "test_source": "", "stub": "", "solution": ""}


# a course of two exercise notebooks and a practicum, written out by hand
COURSE = {"format": 1, "reveal": True, "notebooks": [
    {"notebook": "00_start_here_exercises", "lecture": "00_start_here", "title": "00", "practicum": False,
     "minutes": 15, "exercises": [exercise("ex00_count_parameters_test", "Exercise 1 — count parameters", 5),
                                  exercise("ex00_describe_batch_test", "Exercise 2 — describe a batch", 10)]},
    {"notebook": "01_cpu_mnist_exercises", "lecture": "01_cpu_mnist", "title": "01", "practicum": False,
     "minutes": 30, "exercises": [exercise("ex01_accuracy_test", "Exercise 1 — accuracy", 10),
                                  exercise("ex01_train_step_test", "Exercise 2 — one training step", 20)]},
    {"notebook": "practicum_scale_out", "lecture": None, "title": "p", "practicum": True, "minutes": 90,
     "exercises": [exercise("practicum_scale_out_launch_test", "Part 1", None)]}]}


def attempt(test, passed, n, time):
    notebook = "00_start_here_exercises" if test.startswith("ex00") else "01_cpu_mnist_exercises"
    return {"test": test, "notebook": notebook,
            "passed": passed, "attempt": n, "time": f"2026-11-28T{time}:00Z", "answer_sha256": None}


def learner_a() -> dict:
    """Opened 00 at 10:00; count_parameters fails at 10:04 and passes at 10:06 (6 min), describe_batch fails at
    10:10 and passes at 10:20 (14 min after the previous pass)."""
    return {"format": 1, "opened": [{"notebook": "00_start_here_exercises", "time": "2026-11-28T10:00:00Z"}],
            "attempts": [attempt("ex00_count_parameters_test", False, 1, "10:04"),
                         attempt("ex00_count_parameters_test", True, 2, "10:06"),
                         attempt("ex00_describe_batch_test", False, 1, "10:10"),
                         attempt("ex00_describe_batch_test", True, 2, "10:20")]}


def learner_b() -> dict:
    """Opened 00 at 09:00, count_parameters passes at 09:10 (10 min); opened 00 again at 12:00 (a later milestone
    than that pass), describe_batch passes at 12:03 (3 min); accuracy passes with 01 never opened (not timed)."""
    return {"format": 1, "opened": [{"notebook": "00_start_here_exercises", "time": "2026-11-28T09:00:00Z"},
                                    {"notebook": "00_start_here_exercises", "time": "2026-11-28T12:00:00Z"}],
            "attempts": [attempt("ex00_count_parameters_test", True, 1, "09:10"),
                         attempt("ex00_describe_batch_test", True, 1, "12:03"),
                         attempt("ex01_accuracy_test", True, 1, "12:30")]}


def tried() -> dict:
    """count_parameters failed then passed, describe_batch failed once, nothing else."""
    data = learner_a()
    data["attempts"] = data["attempts"][:3]
    return data


def test_the_table_on_a_prepared_record():
    assert report.table(tried(), COURSE).splitlines() == [
        "00_start_here_exercises  (about 15 minutes)",
        "  ✔ passed       2 checks   Exercise 1 — count parameters",
        "  … tried        1 check    Exercise 2 — describe a batch",
        "01_cpu_mnist_exercises  (about 30 minutes)",
        "    not started  0 checks   Exercise 1 — accuracy",
        "    not started  0 checks   Exercise 2 — one training step",
        "practicum_scale_out: graded practicum, not tracked here",
        "1 of 4 exercises passed",
        "Next: 00_start_here_exercises · Exercise 2 — describe a batch"]
    done = learner_a()
    assert report.table(done, COURSE).splitlines()[-1] == "Next: 01_cpu_mnist_exercises · Exercise 1 — accuracy"
    for ex in COURSE["notebooks"][1]["exercises"]:
        done["attempts"].append(attempt(ex["test"], True, 1, "11:00"))
    assert report.table(done, COURSE).splitlines()[-2:] == [
        "4 of 4 exercises passed", "Next: the practica (graded: your instructor's, or python -m course_lib.grade)"]


def test_the_table_of_the_course_and_one_notebooks_part(progress, capsys):
    assert report.table(tried()).splitlines()[-1] == "Next: 00_start_here_exercises · Exercise 2 — describe a batch"
    assert report.notebook_summary("01_cpu_mnist_exercises", tried(), COURSE).splitlines()[0] == \
        "01_cpu_mnist_exercises  (about 30 minutes)"
    with pytest.raises(KeyError, match="no exercise notebook is called 'nonsense'"):
        report.notebook_summary("nonsense")
    record.record("ex00_count_parameters_test", True)
    report.show("00_start_here_exercises")                 # an exercise notebook's first cell
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Your progress (kept on this machine only, {progress}):"
    assert out[1] == "00_start_here_exercises  (about 15 minutes)" and out[2].startswith("  ✔ passed       1 check ")
    assert [o["notebook"] for o in record.load()["opened"]] == ["00_start_here_exercises"]
    report.show("nonsense")                                # never raises: a notebook cell must run
    assert capsys.readouterr().out.startswith("note: no progress to show for nonsense")


def test_the_picture_colours_each_exercise_by_its_status():
    ax = report.plot(record=tried(), catalog=COURSE)
    # rows: the two exercise notebooks (not the practicum); 1 not started, 2 tried, 3 passed
    assert ax.images[0].get_array().tolist() == [[3, 2], [1, 1]]
    assert "this machine's progress record" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["not started", "tried", "passed"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["00_start_here", "01_cpu_mnist"]


def test_the_command_prints_the_table_and_resets(progress, capsys):
    progress.parent.mkdir(parents=True)
    progress.write_text(json.dumps(tried()))
    assert main(["progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Progress record: {progress}" and out[-1].startswith("Next: 00_start_here_exercises · ")
    assert main(["progress", "--reset", "ex00_count_parameters"]) == 0
    assert capsys.readouterr().out == f"removed 2 entries (ex00_count_parameters_test) from {progress}\n"
    assert [a["test"] for a in record.load()["attempts"]] == ["ex00_describe_batch_test"]
    assert main(["progress", "--reset", "00_start_here_exercises"]) == 0       # its check and its opening
    assert capsys.readouterr().out == f"removed 2 entries (00_start_here_exercises) from {progress}\n"
    record.record("ex01_accuracy_test", False)
    assert main(["progress", "--reset", "all"]) == 0 and record.load()["attempts"] == []
    assert capsys.readouterr().out == f"removed 1 entry (everything) from {progress}\n"
    assert main(["progress", "--reset", "nonsense"]) == 2 and "--reset 'nonsense'" in capsys.readouterr().err


def test_medians_from_the_previous_milestone_to_the_first_pass(tmp_path, capsys):
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for f, data in zip(files, (learner_a(), learner_b())):
        f.write_text(json.dumps(data))
    # count_parameters: 6 and 10 min; describe_batch: 14 and 3 min; accuracy: 01 never opened
    assert report.medians(files, COURSE) == {"ex00_count_parameters_test": 8.0, "ex00_describe_batch_test": 8.5}
    assert main(["progress", "--medians", *map(str, files)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "00_start_here_exercises · Exercise 1 — count parameters: median 8.0 min over 2 learners " \
           "(the header says 5)" in out
    assert out[-1] == "2 exercises timed over 2 shared records"
    (tmp_path / "bad.json").write_text('{"format": 1}')
    with pytest.raises(ValueError, match="bad.json: not a progress record"):
        report.medians([tmp_path / "bad.json"])
    assert main(["progress", "--medians", str(tmp_path / "bad.json")]) == 2


def test_apply_writes_the_medians_rounded_up_into_the_headers(tmp_path, capsys):
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for f, data in zip(files, (learner_a(), learner_b())):
        f.write_text(json.dumps(data))
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    name = "00_start_here_exercises.ipynb"
    shutil.copy(ROOT / "solutions" / name, solutions / name)
    assert main(["progress", "--medians", *map(str, files), "--apply", "--solutions", str(solutions)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("Now run python -m course_lib.exercises")
    before, after = (nbformat.read(str(d / name), 4) for d in (ROOT / "solutions", solutions))
    assert estimate(after.cells[0].source, name, 2) == (17, [8, 9])         # 8.0 -> 8, 8.5 -> 9
    assert "**Estimated time:** 17 minutes (exercise 1: 8, exercise 2: 9)." in after.cells[0].source
    assert after.cells[1:] == before.cells[1:]
    assert (solutions / name).read_text().endswith("}\n")
    assert main(["progress", "--medians", str(files[0]), "--apply", "--solutions", str(tmp_path / "none")]) == 2
