"""The hook in a real IPython shell: check cells recorded, the tiers of help shown, the solution offered when
earned (course_lib.learn.hook, .reveal). The browser test (test_learn_browser.py) does the same in JupyterLab."""
import json

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from course_lib.learn import catalog, hints, hook, record, reveal

TEST = "ex00_count_parameters_test"
WRONG = "def count_parameters(model):\n    return len(list(model.parameters()))"
RIGHT = "def count_parameters(model):\n    return sum(p.numel() for p in model.parameters())"


@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS_DIR", str(tmp_path / "p"))
    monkeypatch.delenv("COURSE_PROGRESS", raising=False)
    monkeypatch.delenv("COURSE_REVEAL", raising=False)
    hook._KERNEL.clear()
    shell = InteractiveShell.instance()
    shell.events.callbacks["post_run_cell"].clear()
    shell._course_lib_learn_hook = False
    shell.run_cell("from torch import nn\nfrom course_lib.checks.nb00 import check_count_parameters")
    assert hook.install(shell) and hook.install(shell)        # (importing the checks installs it the first time)
    assert len(shell.events.callbacks["post_run_cell"]) == 1  # once, however often it is asked
    yield shell
    shell.events.callbacks["post_run_cell"].clear()
    shell._course_lib_learn_hook = False


def run(shell, source: str) -> str:
    """Run a cell; return what it displayed (text and HTML) and printed."""
    with capture_output() as out:
        shell.run_cell(source, store_history=True)      # as a Jupyter kernel runs a cell
    shown = [o.data.get("text/html") or o.data.get("text/markdown") or o.data.get("text/plain", "")
             for o in out.outputs]
    return out.stdout + "\n".join(shown)


def test_tiers_escalate_and_the_solution_opens_after_three_failures_and_after_a_pass(shell):
    check = catalog.exercise(TEST)[1]["test_source"]
    concept = hints.load()[TEST]["concept"]
    run(shell, WRONG)
    first, second, third = (run(shell, check) for _ in range(3))
    assert concept[:40] not in first and "course-reveal" not in first             # tier 1: the message alone
    assert concept[:40] in second and "course-reveal" not in second               # tier 2: the concept
    section = hints.load()[TEST]["section"]["heading"]
    assert concept[:40] in third and hints.anchor(section) in third               # tier 3: + the lecture section
    assert "course-reveal" in third                                               # 3 failures: may compare
    assert "show_solution" not in third            # offered once: the folded diff, not also a line to type
    run(shell, RIGHT)
    passed = run(shell, check)
    assert "all checks passed" in passed and "course-reveal" in passed and concept[:40] not in passed
    assert "p.numel()" in passed and "your answer" in passed                      # the diff, folded
    attempts = record.load()["attempts"]
    assert [(a["test"], a["passed"], a["attempt"]) for a in attempts] == [
        (TEST, False, 1), (TEST, False, 2), (TEST, False, 3), (TEST, True, 4)]
    assert len({a["answer_sha256"] for a in attempts}) == 2                       # wrong x3, then right


def test_other_cells_and_a_lecture_calling_a_check_are_not_attempts(shell):
    run(shell, "x = 1")
    run(shell, WRONG.replace("count_parameters", "count_wrong"))
    run(shell, "try:\n    check_count_parameters(count_wrong)\nexcept AssertionError:\n    pass")
    assert record.load()["attempts"] == []


def test_recording_off_still_escalates_within_the_session(shell, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS", "off")
    check = catalog.exercise(TEST)[1]["test_source"]
    run(shell, WRONG)
    run(shell, check)
    assert hints.load()[TEST]["concept"][:40] in run(shell, check)
    assert not record.path().exists()


def test_the_reveal_is_refused_for_the_practica_before_it_is_earned_and_when_switched_off(shell, monkeypatch,
                                                                                          capsys):
    ok, why = reveal.allowed("practicum_scale_out_launch_test", failures=10, passed=True)
    assert not ok and "graded practicum" in why
    ok, why = reveal.allowed(TEST, failures=2, passed=False)
    assert not ok and "1 more failed attempt" in why
    assert reveal.allowed(TEST, failures=3, passed=False) == (True, "")
    assert reveal.allowed("ex00_count_parameters", failures=0, passed=True) == (True, "")
    monkeypatch.setenv("COURSE_REVEAL", "off")
    ok, why = reveal.allowed(TEST, failures=5, passed=True)
    assert not ok and "switched the solutions off" in why
    reveal.show_solution(TEST)
    assert capsys.readouterr().out.startswith("not yet: your instructor switched")


def test_a_broken_hook_says_so_once_and_leaves_the_cell_alone(shell, monkeypatch):
    monkeypatch.setattr(catalog, "load", lambda: json.loads("{"))
    hook._NOTED.clear()
    out = run(shell, "check_count_parameters(count_parameters)")
    assert out.count("the course's progress hook failed") == 1
    assert "the course's progress hook failed" not in run(shell, "check_count_parameters(count_parameters)")
