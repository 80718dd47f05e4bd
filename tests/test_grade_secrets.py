"""A secret in the grader's environment never reaches what a student gets back (course_lib.grading.environment).

A TA grades from a shell whose environment holds a token; the submission's answer cells collect every
environment they can read (their own, and every /proc/*/environ) and push it out through every channel a
student has: printed output, the message of an exception the grader reports, a wrong return value that a
check's assertion prints, a file in the working folder. Each entry point (one notebook with --report and
--gradescope, a whole class with its feedback and results.json, Gradescope's run_autograder) is graded with
the secret planted; the secret must appear in nothing it writes or prints, while the allowed names (PATH)
do (PATH): the channels were open, and what came through them was the allow-list.
"""
import json
import secrets
import shutil
import subprocess
import sys

import pytest
from nbtools import ROOT
from test_grade import cli_env, submission, toy_source

LEAK = '''import glob, os
WANTED = ("TOKEN", "SECRET", "KEY", "PASSWORD")     # what an attacker looks for; PATH shows the channel works
def _everything():
    found = [f"{k}={v}" for k, v in os.environ.items() if k == "PATH" or any(w in k for w in WANTED)]
    for path in glob.glob("/proc/*/environ"):
        try:
            with open(path, "rb") as f:
                found += [e for e in f.read().decode(errors="replace").split("\\0") if any(w in e for w in WANTED)]
        except OSError:
            pass
    return repr(sorted(found, key=lambda e: e.startswith("PATH=")))     # secrets first, then 'PATH=...'
LEAKED = _everything()
print(LEAKED)
open("leak.txt", "w").write(LEAKED)
'''
ANSWERS = {"toy_add": LEAK + "def add(a, b):\n    raise ValueError(LEAKED)\n",
           "toy_mul": LEAK + "def mul(a, b):\n    return LEAKED\n"}


@pytest.fixture
def secret(monkeypatch):
    value = "course-test-secret-" + secrets.token_hex(12)
    monkeypatch.setenv("COURSE_TEST_GRADER_TOKEN", value)
    return value


def everything_written(folder) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file()
                     and p.suffix in (".json", ".md", ".csv", ".txt", ".log"))


def assert_sealed(secret: str, seen: str, where: str):
    assert secret not in seen, f"the grader's secret reached {where}"
    assert "'PATH=" in seen, f"the leaking answer's output did not reach {where}: the test proves nothing there"


@pytest.mark.slow
def test_one_notebook_report_gradescope_json_and_output(secret, tmp_path):
    source, nb = toy_source(tmp_path)
    sub = submission(tmp_path, nb, ANSWERS)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "course_lib.grade", str(sub), "--source", str(source), "--json",
                           "--report", str(out / "report.json"), "--gradescope", str(out / "results.json")],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["points"]["toy_add_test"] == 0 and report["points"]["toy_sq_test"] == 3, report
    assert_sealed(secret, everything_written(out) + done.stdout + done.stderr, "the report, results.json or output")


@pytest.mark.slow
def test_a_class_feedback_and_gradebook(secret, tmp_path):
    source, nb = toy_source(tmp_path)
    (tmp_path / "class").mkdir()
    for student in ("ann", "ben"):
        shutil.move(submission(tmp_path, nb, ANSWERS, name=f"{student}.ipynb"), tmp_path / "class" / f"{student}.ipynb")
    done = subprocess.run([sys.executable, "-m", "course_lib.grade", str(tmp_path / "class"), "--source", str(source),
                           "--out", str(tmp_path / "graded"), "--jobs", "2"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_sealed(secret, everything_written(tmp_path / "graded") + done.stdout + done.stderr,
                  "a student's feedback, the gradebook or the output")


@pytest.mark.slow
def test_gradescope_run_autograder(secret, tmp_path):
    (tmp_path / "source" / "solutions").mkdir(parents=True)
    _, nb = toy_source(tmp_path / "source" / "solutions")
    (tmp_path / "submission").mkdir()
    shutil.move(submission(tmp_path, nb, ANSWERS), tmp_path / "submission")
    env = {**cli_env(), "AUTOGRADER_ROOT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "tools" / "gradescope" / "run_autograder")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_sealed(secret, everything_written(tmp_path / "results") + done.stdout + done.stderr,
                  "Gradescope's results.json or the autograder's output")


def test_the_allow_list_keeps_what_a_run_needs_and_nothing_else(secret, monkeypatch):
    from course_lib.grading.environment import ALLOWED, sealed
    monkeypatch.setenv("COURSE_SOLUTIONS_DIR", "/private/tests")
    monkeypatch.setenv("COURSE_QUICK", "1")
    env = sealed({"HOME": "/work"})
    assert env["COURSE_QUICK"] == "1" and env["HOME"] == "/work" and "PATH" in env
    assert "COURSE_TEST_GRADER_TOKEN" not in env and "COURSE_SOLUTIONS_DIR" not in env
    assert set(env) <= set(ALLOWED) | {"HOME"}
    with pytest.raises(TypeError, match="extra"):
        sealed(["HOME"])
