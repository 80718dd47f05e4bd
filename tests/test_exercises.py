"""exercises/ is generated from solutions/, leaks nothing, and every check fails on the stubs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import course_lib
from course_lib.grading import exercises
from nbtools import ROOT, is_grade_cell

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.fixture
def in_the_course_root(monkeypatch):
    """solutions/ and exercises/ default to folders under the current one, as when run from the course's root."""
    monkeypatch.chdir(ROOT)


def test_exercises_are_in_sync_with_solutions(in_the_course_root):
    problems = exercises.sync(check=True)
    assert not problems, f"run `python -m course_lib.exercises`: {problems}"


def test_exercises_contain_no_solutions_or_hidden_tests():
    for path in (ROOT / "exercises").glob("*.ipynb"):
        text = path.read_text()
        for marker in exercises.LEAK_MARKERS:
            assert marker not in text, f"{path.name} leaks {marker!r}"


def test_check_mode_detects_an_edit_and_a_stale_file(tmp_path):
    src, dst = tmp_path / "solutions", tmp_path / "exercises"
    shutil.copytree(ROOT / "solutions", src)
    assert exercises.sync(src, dst, check=True)  # nothing generated yet
    assert exercises.sync(src, dst) and not exercises.sync(src, dst, check=True)
    first = sorted(dst.glob("*.ipynb"))[0]
    first.write_text(first.read_text().replace("NotImplementedError", "pass  # edited by hand"))
    (dst / "orphan.ipynb").write_text("{}")
    problems = exercises.sync(src, dst, check=True)
    assert any("out of date" in p for p in problems) and any("orphan" in p for p in problems)
    exercises.sync(src, dst)
    assert not exercises.sync(src, dst, check=True) and not (dst / "orphan.ipynb").exists()


def test_cli_check_exit_status(tmp_path, in_the_course_root, capsys):
    assert exercises.main(["--check"]) == 0
    assert exercises.main(["--check", "--exercises", str(tmp_path)]) == 1   # an empty exercises/ folder
    assert not list(tmp_path.iterdir()), "--check must not write"
    assert exercises.main(["--solutions", str(tmp_path / "nope"), "--exercises", str(tmp_path)]) == 2
    assert "there is no folder" in capsys.readouterr().err and not list(tmp_path.iterdir())


@pytest.mark.slow
def _private_copy(folder, edit=None):
    """solutions/practicum_make_it_small.ipynb with this term's own hidden tests, and `edit(cells)` applied."""
    nb = nbformat.read(str(ROOT / "solutions" / "practicum_make_it_small.ipynb"), as_version=4)
    for cell in nb.cells:
        cell.source = cell.source.replace("seed=20261122", "seed=20270301")   # the hidden re-measurement
    if edit:
        edit(nb.cells)
    folder.mkdir(exist_ok=True)
    nbformat.write(nb, str(folder / "practicum_make_it_small.ipynb"))
    return folder


def _cell(cells, grade_id):
    return next(c for c in cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def test_a_private_source_must_make_exactly_the_public_exercise(tmp_path, capsys):
    public = ROOT / "exercises"
    assert exercises.private_differences(_private_copy(tmp_path / "same"), public) == []
    assert exercises.main(["--private", str(tmp_path / "same"), "--exercises", str(public)]) == 0
    assert "makes exactly the public" in capsys.readouterr().out
    visible = _private_copy(tmp_path / "visible", lambda cells: setattr(
        _cell(cells, "pr_small_floor_test"), "source", "check_floor(result, 0.5)\n" + _cell(cells, "pr_small_floor_test").source))
    problem, = exercises.private_differences(visible, public)
    assert problem.startswith("practicum_make_it_small.ipynb: cell ") and \
        "the visible check 'pr_small_floor_test', differs from the public exercise's" in problem, problem
    points = _private_copy(tmp_path / "points", lambda cells: _cell(cells, "pr_small_50kb_test").metadata
                           ["nbgrader"].update(points=5))
    problem, = exercises.private_differences(points, public)
    assert "'pr_small_50kb_test': its nbgrader metadata (points, lock)" in problem, problem
    fewer = _private_copy(tmp_path / "fewer", lambda cells: cells.remove(_cell(cells, "pr_small_100kb_test")))
    problem, = exercises.private_differences(fewer, public)
    assert "the grade_ids differ" in problem and "'pr_small_100kb_test'" in problem, problem
    assert exercises.main(["--private", str(fewer), "--exercises", str(public)]) == 1
    assert "does not match: practicum_make_it_small.ipynb: the grade_ids differ" in capsys.readouterr().out
    (tmp_path / "none").mkdir()
    assert exercises.main(["--private", str(tmp_path / "none")]) == 2


def test_run_from_another_folder_names_the_missing_folder(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [      # keep pip --target installs
        str(Path(course_lib.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "course_lib.exercises", "--check"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "there is no folder solutions" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.iterdir())


def test_a_marker_outside_a_solution_cell_is_refused():
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.cells.append(nbformat.v4.new_code_cell("x = 1\n### BEGIN SOLUTION\ny = 2\n### END SOLUTION"))
    with pytest.raises(Exception):
        exercises.student_version(nb)


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_notebook_structure(path):
    nb = nbformat.read(str(path), as_version=4)
    meta = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    graded = [m for m in meta if m.get("grade")]
    solutions = [m for m in meta if m.get("solution")]
    assert len(graded) >= 2 and len(solutions) >= 2, f"{path.name}: needs at least two exercises"
    assert all(m.get("points", 0) > 0 and m.get("locked") for m in graded), "test cells need points and a lock"
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            assert "### BEGIN SOLUTION" in cell.source, f"{path.name}: solution cell without markers"


def test_grade_ids_are_unique_across_the_course():
    ids = [c.metadata["nbgrader"]["grade_id"] for p in SOLUTIONS
           for c in nbformat.read(str(p), as_version=4).cells if "nbgrader" in c.metadata]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.fixture(scope="module")
def kernel():
    """One kernel for every untouched exercise (each starts from `%reset -f` in its own folder): a kernel's start,
    torch's import and the launch forkserver's cost once instead of 19 times."""
    from jupyter_client.manager import start_new_kernel
    km, kc = start_new_kernel(startup_timeout=120)
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=True)


NOT_THE_STUB = {"NameError", "ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError",
                "FileNotFoundError"}


FRESH_DOC = "Automatically created module for IPython interactive environment"


def run_in(kernel, path: Path, folder: Path):
    """The notebook at `path`, executed top to bottom in the shared kernel from a fresh namespace in `folder`
    (errors are kept as outputs); its cells, without the reset cell."""
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(   # %reset also drops what a fresh kernel's __main__ has
        f"%reset -f\n__doc__ = {FRESH_DOC!r}\n__package__ = __loader__ = __spec__ = None\n"
        f"import os\nos.chdir({str(folder)!r})"))
    km, kc = kernel
    client = NotebookClient(nb, km=km, timeout=600, allow_errors=True)
    client.kc = kc
    client.execute()
    nb.cells.pop(0)
    return nb.cells


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in SOLUTIONS if not p.name.startswith("practicum_")], ids=lambda p: p.stem)
def test_every_cell_of_the_solution_runs(path, tmp_path, kernel):
    """What nbval would check (make test leaves solutions/ to this test): every cell, hidden tests included, runs
    without an error. The practica are graded whole instead (tests/test_grade.py, test_checks_practicum_*)."""
    for i, cell in enumerate(run_in(kernel, path, tmp_path)):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: cell {i} failed: {errors[0]['ename']}: {errors[0]['evalue']}"


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_check_fails_on_the_untouched_exercise(path, tmp_path, kernel):
    """Run the generated student notebook as a student would before writing anything: every cell above the
    first answer runs, and every check fails because of the stubs, not because something is missing."""
    cells = run_in(kernel, ROOT / "exercises" / path.name, tmp_path)
    first_answer = next(i for i, c in enumerate(cells) if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    for i, cell in enumerate(cells):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if i < first_answer and cell.cell_type == "code":
            assert not errors, f"{path.name}: setup cell {i} failed: {errors[0]['ename']}: {errors[0]['evalue']}"
        if is_grade_cell(cell):
            assert errors, (f"{path.name}: check {cell.metadata['nbgrader']['grade_id']} passed on the "
                            f"untouched stub:\n{json.dumps(cell.get('outputs', []))[:500]}")
            assert errors[0]["ename"] not in NOT_THE_STUB, (
                f"{path.name}: check {cell.metadata['nbgrader']['grade_id']} failed for another reason than the "
                f"stub: {errors[0]['ename']}: {errors[0]['evalue']}")
