"""The learner's working copy (course_lib.learn.workcopy): `work create` never overwrites, `work update` brings a
changed exercise in beside the learner's answers and own cells, and what it cannot do it says.

Each test runs on a course folder of its own: the real exercises/ copied into a temporary folder, changed there
as a new course release would change them.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

from course_lib.learn import workcopy
from nbtools import ROOT

NAME = "00_start_here_exercises"
ANSWER = "def count_parameters(model):\n    return sum(p.numel() for p in model.parameters())"


@pytest.fixture
def course(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    monkeypatch.chdir(tmp_path)           # the defaults, exercises/ and work/, as make lab runs it
    return tmp_path


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def save(path, nb):
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def text(cell):
    return "".join(cell["source"])


def by_grade_id(nb, grade_id):
    return next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)


def index_of(nb, cell_id):
    return next(i for i, c in enumerate(nb["cells"]) if c["id"] == cell_id)


def test_create_copies_every_exercise_and_never_overwrites(course, capsys):
    assert workcopy.main(["create"]) == 0
    names = sorted(p.name for p in (course / "exercises").glob("*.ipynb"))
    assert sorted(p.name for p in (course / "work").glob("*.ipynb")) == names   # work/NAME: ../notebooks links hold
    assert any(n.startswith("practicum_") for n in names)
    copy = course / "work" / f"{NAME}.ipynb"
    base = load(copy)["metadata"]["course_lib"]["base"]
    exercise = load(course / "exercises" / f"{NAME}.ipynb")
    assert [c["id"] for c in base["cells"]] == [c["id"] for c in exercise["cells"]]
    assert re.fullmatch(r'v?[\w.]+', base["release"]) and base["release"] in (course / "pyproject.toml").read_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", base["time"])
    assert load(copy)["cells"] == exercise["cells"]

    answered = load(copy)
    by_grade_id(answered, "ex00_count_parameters")["source"] = ANSWER
    save(copy, answered)
    mine = copy.read_bytes()
    (course / "work" / "01_cpu_mnist_exercises.ipynb").unlink()
    capsys.readouterr()
    assert workcopy.main(["create"]) == 0
    assert copy.read_bytes() == mine                                  # the learner's file untouched
    assert (course / "work" / "01_cpu_mnist_exercises.ipynb").exists()   # the missing one made again
    assert "01_cpu_mnist_exercises" in capsys.readouterr().out
    before = {p: p.read_bytes() for p in (course / "work").glob("*.ipynb")}
    assert workcopy.create() == []
    assert not workcopy._write(copy, {"cells": []}, overwrite=False)   # a copy that appeared meanwhile: kept too
    assert {p: p.read_bytes() for p in (course / "work").glob("*.ipynb")} == before
    assert not list((course / "work").glob(".*.tmp"))


def learner_answers_and_adds_a_cell(copy):
    """The learner answers exercise 1 (and runs it: an output), adds a cell of their own after it; returns its id."""
    nb = load(copy)
    answer = by_grade_id(nb, "ex00_count_parameters")
    answer.update(source=ANSWER, execution_count=3,
                  outputs=[{"output_type": "stream", "name": "stdout", "text": ["my run\n"]}])
    own = {"cell_type": "code", "id": "0wn0wn00", "metadata": {}, "execution_count": None, "outputs": [],
           "source": "count_parameters(torch.nn.Linear(10, 5))  # trying it"}
    nb["cells"].insert(index_of(nb, answer["id"]) + 1, own)
    save(copy, nb)
    return own["id"]


def new_release(exercise):
    """The course changes the exercise: the header's text, a new exercise (markdown, answer, test), a changed
    test cell, the last cell ("Where next") removed. Returns the new cells' ids."""
    nb = load(exercise)
    nb["cells"][0]["source"] = text(nb["cells"][0]).replace("# 00 · Start here", "# 00 · Start here (new)")
    by_grade_id(nb, "ex00_describe_batch_test")["source"] = "check_describe_batch(describe_batch)  # stricter"
    removed = nb["cells"].pop()
    new = [{"cell_type": "markdown", "id": "aaaa0001", "metadata": {}, "source": "## Exercise 3 — new"},
           {"cell_type": "code", "id": "aaaa0002", "execution_count": None, "outputs": [], "source":
            "def three():\n    raise NotImplementedError()",
            "metadata": {"nbgrader": {"grade": False, "grade_id": "ex00_three", "locked": False,
                                      "schema_version": 3, "solution": True, "task": False}}}]
    nb["cells"] += new
    save(exercise, nb)
    return [c["id"] for c in new], removed["id"]


def test_update_brings_new_cells_in_beside_the_answers(course, capsys):
    workcopy.create()
    copy, exercise = course / "work" / f"{NAME}.ipynb", course / "exercises" / f"{NAME}.ipynb"
    own = learner_answers_and_adds_a_cell(copy)
    before = copy.read_bytes()
    assert [s for n, s, _ in workcopy.status() if n == NAME] == ["up to date"]
    new_ids, removed_id = new_release(exercise)
    state = {n: (s, detail) for n, s, detail in workcopy.status()}[NAME]
    assert state[0] == "changed" and "2 new, 1 removed, 2 changed" in state[1] and "work update" in state[1], state

    assert workcopy.main(["update"]) == 0
    out = capsys.readouterr().out
    nb, upstream = load(copy), load(exercise)
    answer = by_grade_id(nb, "ex00_count_parameters")
    assert text(answer) == ANSWER and answer["outputs"][0]["text"] == ["my run\n"]      # the answer, its output
    assert nb["cells"][index_of(nb, answer["id"]) + 1]["id"] == own                     # the own cell after it
    assert [c["id"] for c in nb["cells"] if c["id"] != own] == [c["id"] for c in upstream["cells"]]
    assert all(text(nb["cells"][index_of(nb, i)]) == text(upstream["cells"][index_of(upstream, i)])
               for i in [c["id"] for c in upstream["cells"]] if i != answer["id"])      # every other cell is new
    assert set(new_ids) <= {c["id"] for c in nb["cells"]} and removed_id not in {c["id"] for c in nb["cells"]}
    backups = list((course / "work" / ".backup").glob(f"{NAME}.*.ipynb"))
    assert len(backups) == 1 and backups[0].read_bytes() == before
    assert [s for n, s, _ in workcopy.status() if n == NAME] == ["up to date"]
    assert "new      markdown cell '## Exercise 3 — new'" in out and "ex00_three" in out
    assert "removed  markdown cell '## Where next'" in out
    assert "changed  code cell ex00_describe_batch_test" in out
    assert "your answers: 1, cells you added: 1" in out
    assert str(backups[0].relative_to(course)) in out

    capsys.readouterr()                       # nothing changed since: nothing written, no second backup
    assert workcopy.main(["update", f"work/{NAME}.ipynb"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert len(list((course / "work" / ".backup").iterdir())) == 1


def test_answer_whose_exercise_vanished_is_kept_and_said(course, capsys):
    workcopy.create()
    copy, exercise = course / "work" / f"{NAME}.ipynb", course / "exercises" / f"{NAME}.ipynb"
    nb = load(copy)
    by_grade_id(nb, "ex00_describe_batch")["source"] = "def describe_batch(x):\n    return {}  # mine"
    save(copy, nb)
    upstream = load(exercise)
    upstream["cells"] = [c for c in upstream["cells"]
                         if c["metadata"].get("nbgrader", {}).get("grade_id") not in ("ex00_describe_batch",
                                                                                     "ex00_describe_batch_test")]
    save(exercise, upstream)
    assert workcopy.update() == 0
    nb = load(copy)
    kept = by_grade_id(nb, "ex00_describe_batch")
    assert text(kept).endswith("# mine")
    with pytest.raises(StopIteration):
        by_grade_id(nb, "ex00_describe_batch_test")                    # the untouched test cell went
    out = capsys.readouterr().out
    assert "code cell ex00_describe_batch: removed from the exercise, kept since you edited it" in out


def test_edits_on_both_sides(course, capsys):
    """A cell changed by the learner and by the course: a locked test cell takes the new version; any other cell
    gets the new version with the learner's right after it; the learner's edit of a cell the course left alone
    stays."""
    workcopy.create()
    copy, exercise = course / "work" / f"{NAME}.ipynb", course / "exercises" / f"{NAME}.ipynb"
    nb = load(copy)
    test = by_grade_id(nb, "ex00_count_parameters_test")
    test["source"] = "pass  # skipped the check"
    imports = next(c for c in nb["cells"] if "from course_lib.checks.nb00 import" in text(c))
    imports["source"] = text(imports) + "\nimport numpy as np  # mine"
    nb["cells"][0]["source"] = "# My notes on exercise 00"
    save(copy, nb)
    upstream = load(exercise)
    by_grade_id(upstream, "ex00_count_parameters_test")["source"] = "check_count_parameters(count_parameters)\n"
    upstream["cells"][0]["source"] = "# 00 · Start here, second edition"
    save(exercise, upstream)

    assert workcopy.update() == 0
    nb = load(copy)
    assert text(by_grade_id(nb, "ex00_count_parameters_test")) == "check_count_parameters(count_parameters)\n"
    assert text(next(c for c in nb["cells"] if c["id"] == imports["id"])).endswith("import numpy as np  # mine")
    assert [text(c) for c in nb["cells"][:2]] == ["# 00 · Start here, second edition", "# My notes on exercise 00"]
    assert len({c["id"] for c in nb["cells"]}) == len(nb["cells"])
    out = capsys.readouterr().out
    assert "the new test replaces your edit" in out and "then yours right after it" in out


def test_a_copy_made_by_hand_is_refused(course, capsys):
    (course / "work").mkdir()
    copy = course / "work" / f"{NAME}.ipynb"
    shutil.copy(course / "exercises" / f"{NAME}.ipynb", copy)
    before = copy.read_bytes()
    exercise = course / "exercises" / f"{NAME}.ipynb"
    save(exercise, dict(load(exercise), cells=load(exercise)["cells"][:-1]))
    assert [(s, "copied by hand" in d) for n, s, d in workcopy.status() if n == NAME] == [("no base", True)]
    assert workcopy.main(["update", NAME]) == 1
    out = capsys.readouterr().err
    assert "copied by hand" in out and "python -m course_lib work create" in out and f"{NAME}.mine.ipynb" in out
    assert copy.read_bytes() == before and not (course / "work" / ".backup").exists()


def test_bad_names_and_missing_copies(course, capsys):
    workcopy.create()
    assert workcopy.main(["update", "99_nothing"]) == 1
    assert "NOTEBOOK must be one of" in capsys.readouterr().err
    (course / "work" / f"{NAME}.ipynb").unlink()
    assert workcopy.main(["update", NAME]) == 1
    assert "missing" in capsys.readouterr().out
    assert workcopy.main(["create", "--from", str(course / "nothing")]) == 1
    assert "no exercise notebooks" in capsys.readouterr().err


def test_an_unwritable_work_folder_is_a_clear_error(course, capsys, monkeypatch):
    (course / "work").write_text("not a folder")
    assert workcopy.main(["create"]) == 1
    assert "is a file, not a folder" in capsys.readouterr().err

    (course / "work").unlink()
    (course / "work").mkdir()
    (course / "work").chmod(0o555)
    try:
        if os.access(course / "work", os.W_OK):        # root writes anyway: a folder that refuses, as a mount does
            def refuse(*args, **kwargs):
                raise PermissionError(13, "Permission denied")
            monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
        assert workcopy.main(["create"]) == 1
    finally:
        (course / "work").chmod(0o755)
    err = capsys.readouterr().err
    assert "cannot write your working copy in work (Permission denied)" in err and "chmod u+w work" in err


def test_a_copy_runs_from_work(course):
    """The kernel's folder is work/: the course's imports and the progress cell work from there."""
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    workcopy.create()
    nb = nbformat.read(str(course / "work" / f"{NAME}.ipynb"), as_version=4)
    first_answer = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution"))
    nb.cells = nb.cells[:first_answer] + [nbformat.v4.new_code_cell("import os\nprint(os.getcwd())")]
    nbclient.NotebookClient(nb, timeout=120, resources={"metadata": {"path": str(course / "work")}}).execute()
    assert nb.cells[-1].outputs[0]["text"].strip() == str(course / "work")


def test_make_lab_creates_the_copy_before_jupyter_and_git_ignores_it():
    recipe = subprocess.run(["make", "-n", "-B", "lab", "HEADLESS=1"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    create = next(i for i, line in enumerate(recipe) if "-m course_lib work create" in line)
    lab = next(i for i, line in enumerate(recipe) if "jupyter lab" in line)
    assert create < lab and "--notebook-dir=." in recipe[lab] and "--no-browser" in recipe[lab]
    ignored = subprocess.run(["git", "check-ignore", "-q", "work/00_start_here_exercises.ipynb"], cwd=ROOT)
    assert ignored.returncode == 0
