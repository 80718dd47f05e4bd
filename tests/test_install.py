"""course_lib installed like a real package: a wheel, not the clone, imported from another folder."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import needs_mnist
from course_lib.data import data_root
from nbtools import ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel built from a copy of the package's files, installed with pip --no-deps --target."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "course_lib", src / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    wheel, = (tmp / "dist").glob("course_lib-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp / "site"), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return tmp / "site", elsewhere


def run_installed(installed, *args, timeout=300):
    site, elsewhere = installed
    env = {**os.environ, "PYTHONPATH": str(site), "COURSE_DATA_DIR": str(data_root()), "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_the_wheel_is_what_python_imports_and_holds_no_notebooks_or_graded_solutions(installed, tmp_path,
                                                                                     monkeypatch):
    site, _ = installed
    out = run_installed(installed, "-c", "import course_lib; print(course_lib.__file__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(site)), out.stdout
    assert not list(site.rglob("*.ipynb"))
    shipped = {p.name for p in (ROOT / "course_lib" / "recorded").glob("*.json")}
    assert shipped and shipped == {p.name for p in (site / "course_lib" / "recorded").glob("*.json")}, \
        "the GPU recordings lectures 04 and 11 show are package data"
    # the learner's help works from the package alone (Colab, the site): the catalog (the exercises' solutions,
    # never a practicum's: tests/test_learn_record.py) and the hints
    learn = ROOT / "course_lib" / "learn"
    for pattern in ("catalog.json", "hints/*.json"):
        assert {p.name for p in learn.glob(pattern)} == {p.name for p in (site / "course_lib" / "learn").glob(pattern)}
    assert (site / "course_lib" / "learn" / "catalog.json").read_bytes() == (learn / "catalog.json").read_bytes()
    monkeypatch.setenv("COURSE_PROGRESS_DIR", str(tmp_path))       # an empty record
    out = run_installed(installed, "-m", "course_lib", "progress")
    assert out.returncode == 0 and out.stdout.splitlines()[-1].startswith("Next: 00_start_here_exercises · "), \
        out.stdout + out.stderr


@pytest.mark.slow
@needs_mnist
def test_the_installed_package_runs_doctor_and_trains_from_another_folder(installed):
    doctor = run_installed(installed, "-m", "course_lib", "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "COURSE_DATA_DIR" in doctor.stdout
    out = run_installed(installed, "-m", "course_lib.train", "--train-subset", "512", "--epochs", "1",
                        "--no-progress", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["train_samples"] == 512 and summary["epochs_run"] == 1
