"""The lock: what `make setup` installs is exactly what requirements.lock pins, and doctor says when it is not."""
import io
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from course_lib import versions
from nbtools import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import latest  # noqa: E402
import lock  # noqa: E402

HASH = "    --hash=sha256:" + "0" * 64


def write_lock(path: Path, *lines: str) -> Path:
    path.write_text("# a lock\n" + "\n".join(lines) + "\n")
    return path


def test_the_lock_satisfies_pyproject_and_binder_is_derived_from_it():
    assert lock.check() == []


def test_every_pin_has_hashes_and_uv_is_not_a_learners_dependency():
    text = (ROOT / "requirements.lock").read_text()
    pins = versions.locked(ROOT / "requirements.lock")
    assert {"torch", "torchvision", "torchao", "lightning", "nbgrader", "jupyterlab", "pytest-xdist"} <= {p.name for p in pins}
    assert "uv" not in {p.name for p in pins}, "uv is the maintainer's tool (make lock), not the learners'"
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line[:1].isalnum()]
    assert len(starts) == len(pins) and all(lines[i + 1].startswith("    --hash=sha256:") for i in starts)


def test_installed_versions_are_the_locks():
    """pip freeze equals the lock for every package the lock pins for this platform and Python."""
    path = Path(os.environ.get(versions.ENV_VAR) or ROOT / "requirements.lock")
    diff = versions.differences(path)
    assert diff == [], (f"installed versions differ from {path} (install with `make setup`, or "
                        f"pip install -r {path.name}): " + ", ".join(f"{d.name} {d.installed} != {d.locked}" for d in diff))


def test_the_lock_holds_for_every_platform_and_python_the_course_supports():
    """One universal lock: a pin for torch on Linux x86_64/aarch64 and macOS arm64, each Python 3.10-3.13."""
    pins = versions.locked(ROOT / "requirements.lock")
    for system, machine in (("Linux", "x86_64"), ("Linux", "aarch64"), ("Darwin", "arm64")):
        for python in ("3.10", "3.11", "3.12", "3.13"):
            env = {"sys_platform": "linux" if system == "Linux" else "darwin", "platform_system": system,
                   "platform_machine": machine, "python_version": python, "python_full_version": f"{python}.0",
                   "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix"}
            for name in ("torch", "torchvision", "numpy", "jupyterlab"):
                assert sum(p.name == name and versions.applies(p, env) for p in pins) == 1, (name, system, python)
            cuda = [p.name for p in pins if p.name.startswith("nvidia-") and versions.applies(p, env)]
            assert bool(cuda) == (system == "Linux"), (system, machine, cuda[:3])


def test_doctor_reports_a_version_that_differs_from_the_lock(tmp_path, monkeypatch):
    torch_version = metadata.version("torch")
    path = write_lock(tmp_path / "requirements.lock",
                      "torch==0.0.1 \\", HASH,
                      f"numpy=={metadata.version('numpy')} \\", HASH,
                      "not-a-package-anyone-has==1.0 \\", HASH,
                      "appnope==9.9 ; sys_platform == 'nonexistent' \\", HASH)
    monkeypatch.setenv(versions.ENV_VAR, str(path))
    from course_lib.env import doctor

    out = io.StringIO()
    assert doctor(out) in (0, 1)   # a version difference is a warning: the course may still run
    text = out.getvalue()
    assert "2 package(s) differ from requirements.lock" in text, text
    assert f"torch: locked 0.0.1, installed {torch_version}" in text
    assert "not-a-package-anyone-has: locked 1.0, installed none" in text
    assert "numpy:" not in text and "appnope" not in text, "equal versions and other platforms' pins are not listed"
    assert "pip install -r requirements.lock" in text


def test_doctor_cli_exits_0_when_only_versions_differ(tmp_path):
    path = write_lock(tmp_path / "requirements.lock", "torch==0.0.1")
    env = {**os.environ, versions.ENV_VAR: str(path)}
    proc = subprocess.run([sys.executable, "-m", "course_lib", "doctor"], env=env, capture_output=True, text=True,
                          timeout=120)
    if "MNIST: found" in proc.stdout:
        assert proc.returncode == 0, proc.stdout
    assert "torch: locked 0.0.1" in proc.stdout


def test_a_local_build_label_is_the_same_release():
    torch_version = metadata.version("torch").split("+")[0]
    pin = versions.Pin("torch", torch_version)
    assert versions.applies(pin)
    assert [d.name for d in versions.differences_from([pin])] == []


def test_bad_lock_files_are_named_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="missing.lock"):
        versions.locked(tmp_path / "missing.lock")
    with pytest.raises(ValueError, match="not a lock file"):
        versions.locked(write_lock(tmp_path / "x.lock", "torch>=2", "# nothing pinned"))
    out = io.StringIO()
    monkeypatch.setenv(versions.ENV_VAR, str(tmp_path / "missing.lock"))   # put back afterwards: make test sets it
    versions.report(out)
    assert "cannot compare" in out.getvalue() and "missing.lock" in out.getvalue()


def test_pins_with_markers_are_read():
    pins = versions.locked(ROOT / "requirements.lock")
    numpy = [p for p in pins if p.name == "numpy"]
    assert len(numpy) >= 2 and all("python_full_version" in p.marker for p in numpy)
    env311 = {"python_full_version": "3.11.7", "python_version": "3.11"}
    assert sum(versions.applies(p, env311) for p in numpy) == 1


def test_binder_gets_cpu_torch_and_no_cuda_libraries(tmp_path):
    path = write_lock(tmp_path / "requirements.lock",
                      "torch==2.14.1 \\", HASH,
                      "torchvision==0.29.1 \\", HASH,
                      "nvidia-cublas==13.1.1.3 ; sys_platform == 'linux' \\", HASH,
                      "triton==3.6.0 ; sys_platform == 'linux' \\", HASH,
                      "numpy==2.2.6 ; python_full_version < '3.11' \\", HASH)
    text = lock.binder_requirements(path)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [f"--extra-index-url {lock.CPU_INDEX}", "torch==2.14.1+cpu", "torchvision==0.29.1+cpu",
                     "numpy==2.2.6 ; python_full_version < '3.11'"]


def test_check_names_an_unpinned_or_out_of_range_requirement(tmp_path, monkeypatch):
    path = write_lock(tmp_path / "requirements.lock", "torch==2.0.0 \\", HASH)
    problems = lock.check(path)
    assert any("torch==2.0.0, outside pyproject.toml's 'torch>=2.6'" in p for p in problems), problems
    assert any(p.startswith("torchvision is in pyproject.toml but not pinned") for p in problems), problems


def test_moved_lists_packages_whose_pins_changed(tmp_path):
    old = write_lock(tmp_path / "old.lock", "torch==2.14.1", "numpy==2.2.6 ; python_full_version < '3.11'",
                     "numpy==2.4.6 ; python_full_version >= '3.11'", "tqdm==4.67.1")
    new = write_lock(tmp_path / "new.lock", "torch==2.15.0", "numpy==2.2.6 ; python_full_version < '3.11'",
                     "numpy==2.5.5 ; python_full_version >= '3.11'", "tqdm==4.67.1", "rich==14.0")
    assert lock.moved(old, new) == [("numpy", "2.2.6, 2.4.6", "2.2.6, 2.5.5"), ("rich", "-", "14.0"),
                                    ("torch", "2.14.1", "2.15.0")]


def test_latest_names_the_broken_tests_and_the_moved_packages_in_their_tracebacks(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text("""<?xml version="1.0"?><testsuites><testsuite>
      <testcase classname="tests.test_frameworks" name="test_lightning_weights"><failure message="AssertionError: weights differ">
        File ".venv-latest/lib/python3.11/site-packages/lightning/pytorch/trainer.py", line 10
        File ".venv-latest/lib/python3.11/site-packages/torch/nn/modules/module.py", line 3</failure></testcase>
      <testcase classname="tests.test_env" name="test_ok"/>
      <testcase classname="notebooks.13_quantization.ipynb" name="Cell 4"><error message="ImportError: torchao">
        File "/x/site-packages/numpy/core.py"</error></testcase>
    </testsuite></testsuites>""")
    failures = latest.broken(junit)
    assert [t for t, _ in failures] == ["tests.test_frameworks::test_lightning_weights", "notebooks.13_quantization.ipynb::Cell 4"]
    moved = [("lightning", "2.6.6", "2.7.0"), ("torch", "2.14.1", "2.15.0"), ("tqdm", "4.67.1", "4.68.0")]
    assert latest.suspects(failures[0][1], moved) == ["lightning", "torch"]
    assert latest.suspects(failures[1][1], moved) == []
    out = io.StringIO()
    latest.report(moved, failures, out)
    text = out.getvalue()
    assert "3 package(s) moved" in text and "torch" in text and "2 test(s) broke" in text
    assert "moved packages in its traceback: lightning, torch" in text
    assert "AssertionError: weights differ" in text


def test_the_readme_names_the_versions_the_lock_pins():
    readme = (ROOT / "README.md").read_text()
    line = " ".join(readme[readme.index("**Tested with**"):].split(" on Python")[0].split())
    named = re.findall(r"(torch|torchvision|torchao|Lightning|Keras|nbgrader|JupyterLab) (\d[\w.]*)", line)
    assert len(named) == 7, line
    pins = {(p.name, p.version) for p in versions.locked(ROOT / "requirements.lock")}
    for name, version in named:
        assert (versions.normalise(name), version) in pins, f"README says {name} {version}; the lock pins another"


def test_every_command_that_installs_a_lock_skips_pips_resolver():
    """pip's resolver in hash mode fails on a locked package that another asks for with an extra (here
    jsonschema[format-nongpl]) whenever a newer release exists (pypa/pip#9644): a lock installed with
    its resolver breaks in week 6. The lock is complete, so every install from it says --no-deps."""
    commands = []
    for name in ("Makefile", "README.md", "docs/INSTRUCTOR_GUIDE.md", ".ci/run", *map(str, (ROOT / ".github" /
                 "workflows").glob("*.yml"))):
        path = ROOT / name
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"pip (install|download)\b.*-r \S*(LOCK|\.lock)", line):
                commands.append((path.name, number, line.strip()))
    assert any(name == "Makefile" for name, _, _ in commands), commands      # make setup's install was found
    wrong = [c for c in commands if "--no-deps" not in c[2]]
    assert not wrong, f"installs from a lock without --no-deps: {wrong}"
