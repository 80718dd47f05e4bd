"""The same sources work with nbgrader itself: generate_assignment and autograde through nbgrader's own API.

Each test builds a throw-away nbgrader course (its own nbgrader config and gradebook sqlite database in
tmp_path; nothing from ~/.jupyter, no network): source/ holds the solution notebooks, release/ gets what
nbgrader generates for students, submitted/ what students hand in, and autograde scores it.
Autograded here: exercise 07 (its hidden tests launch ranks from nbgrader's kernel) and, in
test_checks_practicum_make_it_small.py, a practicum (solution and release). Scale-out under nbgrader is not graded
again here: it adds no path these two do not take (and nbgrader grades every student as the defaults variant;
the instructor guide sends the practica to the course's grader).
"""
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from traitlets.config import Config

from nbtools import ROOT

# found, not imported: nbgrader loads at the first course a test builds (seconds per worker at collection)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("nbgrader") is None, reason="nbgrader is not installed")

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.fixture(autouse=True)
def environment_bin_on_path(monkeypatch):
    """nbgrader runs `alembic` (its gradebook migrations) from PATH; `.venv/bin/python -m pytest` may not have
    the environment's bin/ there."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def course(tmp_path, assignment, notebooks):
    from nbgrader.apps import NbGraderAPI
    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    config.CourseDirectory.course_id = "course"
    config.CourseDirectory.db_url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    config.ExecutePreprocessor.timeout = 300
    config.Execute.timeout = 300
    (tmp_path / "source" / assignment).mkdir(parents=True)
    for path in notebooks:
        shutil.copy(path, tmp_path / "source" / assignment / path.name)
    api = NbGraderAPI(config=config)
    result = api.generate_assignment(assignment)
    assert result["success"], result.get("error", "") + result.get("log", "")
    return api


def autograde(api, tmp_path, assignment, student, notebooks: dict) -> dict:
    """Submit {name: notebook path} as `student`, autograde, return {grade_id: score} (and the totals)."""
    from nbgrader.api import Gradebook
    folder = tmp_path / "submitted" / student / assignment
    folder.mkdir(parents=True)
    for name, path in notebooks.items():
        shutil.copy(path, folder / name)
    result = api.autograde(assignment, student)
    assert result["success"], result.get("error", "") + result.get("log", "")
    with Gradebook(api.coursedir.db_url, "course") as gb:
        submission = gb.find_submission(assignment, student)
        scores = {g.name: g.score for nb in submission.notebooks for g in nb.grades}
        scores["total"], scores["max"] = submission.score, submission.max_score
    return scores


@pytest.mark.slow
def test_every_source_generates_the_exercise_we_ship(tmp_path):
    """nbgrader generate_assignment makes, cell for cell, the exercises/ copies course_lib.exercises writes."""
    course(tmp_path, "all", SOLUTIONS)
    for path in SOLUTIONS:
        released = nbformat.read(str(tmp_path / "release" / "all" / path.name), as_version=4)
        shipped = nbformat.read(str(ROOT / "exercises" / path.name), as_version=4)
        assert [c.source for c in released.cells] == [c.source for c in shipped.cells], path.name
        assert "BEGIN HIDDEN TESTS" not in nbformat.writes(released)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_autograde_exercise_07_solution_full_and_release_zero(tmp_path, monkeypatch):
    name = "07_ddp_exercises.ipynb"
    api = course(tmp_path, "ex07", [ROOT / "solutions" / name])
    monkeypatch.setenv("COURSE_PROGRESS_DIR", str(tmp_path / "ta_progress"))   # the TA's record, as the kernels see it
    monkeypatch.delenv("COURSE_PROGRESS", raising=False)
    solved = autograde(api, tmp_path, "ex07", "solver", {name: ROOT / "solutions" / name})
    assert not (tmp_path / "ta_progress").exists(), "autograding wrote the students' checks into the TA's progress"
    assert solved == {"ex07_shard_indices_test": 3, "ex07_should_checkpoint_test": 2, "ex07_bucket_hooks_test": 5,
                      "total": 10, "max": 10}
    untouched = autograde(api, tmp_path, "ex07", "idle", {name: tmp_path / "release" / "ex07" / name})
    assert untouched == {"ex07_shard_indices_test": 0, "ex07_should_checkpoint_test": 0, "ex07_bucket_hooks_test": 0,
                         "total": 0, "max": 10}
