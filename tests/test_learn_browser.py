"""A learner alone, in a real JupyterLab (headless Chromium): a wrong answer checked twice shows the second tier
of help; the right answer then passes, the progress table changes, and the comparison with the solution
appears and opens.

The notebook is exercise 00 as a learner would have typed into it: the exercise's own import and progress
cells, then a wrong answer, its check run twice, the right answer, its check, and the progress cell again
(run cell by cell with JupyterLab's own "Run" command; `--LabApp.expose_app_in_browser` lets the test call
it). The progress record lives in a temporary folder (COURSE_PROGRESS_DIR). Screenshots of the hint and
of the opened diff are left in the temporary directory (learn_hint.png, learn_reveal.png).
"""
import json
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.learn import catalog, hints
from conftest import KEPT_TMP
from jupyter_browser import chromium, jupyter_lab, needs_browser
from nbtools import ROOT

pytestmark = needs_browser
EXERCISE = ROOT / "exercises" / "00_start_here_exercises.ipynb"
TEST = "ex00_count_parameters_test"
WRONG = "def count_parameters(model):\n    return len(list(model.parameters()))   # tensors, not elements"
RIGHT = "def count_parameters(model):\n    return sum(p.numel() for p in model.parameters())"
SCREENSHOTS = KEPT_TMP   # kept after the run (tests/conftest.py)


def learner_notebook(path: Path) -> None:
    """Exercise 00's setup cells (install, imports, progress), then what a learner ran, in order."""
    nb = nbformat.read(str(EXERCISE), as_version=4)
    _, exercise = catalog.exercise(TEST)
    setup = [c for c in nb.cells[:4] if c.cell_type == "code"]
    assert any("show(" in c.source for c in setup), "exercise 00 lost its progress cell"
    check = exercise["test_source"]
    cells = [*setup, nbformat.v4.new_code_cell(WRONG), nbformat.v4.new_code_cell(check),
             nbformat.v4.new_code_cell(check), nbformat.v4.new_code_cell(RIGHT), nbformat.v4.new_code_cell(check),
             *[c for c in setup if "show(" in c.source]]
    nbformat.write(nbformat.v4.new_notebook(cells=cells, metadata=nb.metadata), str(path))


def outputs(browser) -> list:
    """The text of each code cell's output area, in order."""
    return browser.execute_script(
        "return [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map("
        "c => (c.querySelector('.jp-OutputArea') || {innerText: ''}).innerText)")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fail_twice_see_the_hint_pass_see_progress_and_the_solution(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    root = tmp_path / "course"
    root.mkdir()
    learner_notebook(root / "mine.ipynb")
    env = {"COURSE_PROGRESS_DIR": str(tmp_path / "progress"), "COURSE_PROGRESS": "on", "COURSE_REVEAL": "on"}
    with jupyter_lab(root, tmp_path, env, ["--LabApp.expose_app_in_browser=True"]) as (url, token), \
            chromium(tmp_path, "1280,2400") as browser:
        browser.get(f"{url}/lab/tree/mine.ipynb?token={token}")
        # The panel is found by its path and activated before each command: headless Chromium (150 on) never
        # gives the page focus, so JupyterLab's "current widget", which follows focus, stays empty.
        panel = ("const w = Array.from(window.jupyterapp ? jupyterapp.shell.widgets('main') : [])"
                 ".find(w => w.context && w.context.path === 'mine.ipynb');")
        ready = panel + ("return !!(w && w.sessionContext.session && w.sessionContext.session.kernel && "
                         "w.sessionContext.session.kernel.status === 'idle')")
        n = len(nbformat.read(str(root / "mine.ipynb"), as_version=4).cells)
        try:
            WebDriverWait(browser, 90).until(lambda d: d.execute_script(ready))
            for i in range(n):   # one cell at a time, as a learner does ("Run All" stops at the first error)
                browser.execute_script(panel + f"jupyterapp.shell.activateById(w.id); w.content.activeCellIndex = {i};"
                                       "return jupyterapp.commands.execute('notebook:run-cell')")
                WebDriverWait(browser, 120, poll_frequency=0.5).until(lambda d: d.execute_script(
                    panel + f"return w.content.widgets[{i}].model.executionCount !== null"))
        except Exception:
            browser.save_screenshot(str(SCREENSHOTS / "learn_timeout.png"))
            raise AssertionError(f"app: {browser.execute_script('return typeof window.jupyterapp')}, outputs: "
                                 f"{outputs(browser)}\n{(tmp_path / 'lab.log').read_text()[-2000:]}") from None
        time.sleep(1)
        got = outputs(browser)
        first_progress, wrong1, wrong2, passed, last_progress = got[-7], got[-5], got[-4], got[-2], got[-1]
        concept = hints.load()[TEST]["concept"]
        assert "AssertionError" in wrong1 and concept[:40] not in wrong1, wrong1     # tier 1: the check alone
        assert concept[:40] in wrong2, wrong2                                           # tier 2: the concept
        assert "all checks passed" in passed
        assert first_progress != last_progress and "passed" in last_progress, (first_progress, last_progress)
        browser.save_screenshot(str(SCREENSHOTS / "learn_hint.png"))

        reveal = browser.find_elements(By.CSS_SELECTOR, ".jp-CodeCell details.course-reveal")
        assert len(reveal) == 1, "the comparison is offered once: after the pass"
        table = reveal[0].find_element(By.CSS_SELECTOR, "table")
        assert not table.is_displayed()
        reveal[0].find_element(By.CSS_SELECTOR, "summary").click()
        WebDriverWait(browser, 10).until(lambda d: table.is_displayed())
        assert "p.numel()" in table.text and "your answer" in table.text
        browser.execute_script("arguments[0].scrollIntoView()", reveal[0])
        browser.save_screenshot(str(SCREENSHOTS / "learn_reveal.png"))
    record = json.loads((tmp_path / "progress" / "progress.json").read_text())
    assert [(a["test"], a["passed"], a["attempt"]) for a in record["attempts"]] == [
        (TEST, False, 1), (TEST, False, 2), (TEST, True, 3)]
