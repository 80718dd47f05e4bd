"""A lecture opens as slides in JupyterLab with no further setup, checked in a real browser.

jupyterlab-rise (in requirements.txt) serves a slide-only view of a notebook at /rise/<path>: the
same RISE slideshow as its toolbar button (Alt+R) in JupyterLab, built by reveal.js from the cells'
slideshow metadata (docs/slides.py). This test starts `jupyter lab` as `make lab` does, opens lecture
07 there in headless Chromium and counts the slides reveal.js built. It leaves screenshots of the
title slide and of the setup (code) subslide in the temporary directory (slides_07*.png).
"""
import time
from pathlib import Path

import nbformat
import pytest

from conftest import KEPT_TMP
from jupyter_browser import chromium, jupyter_lab, needs_browser

REPO = Path(__file__).resolve().parent.parent
LECTURE = "notebooks/07_ddp.ipynb"
SCREENSHOTS = KEPT_TMP   # kept after the run (tests/conftest.py)
pytestmark = needs_browser


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on a free port, started in the course's folder as `make lab` does (root URL, token)."""
    pytest.importorskip("jupyterlab_rise")
    with jupyter_lab(REPO, tmp_path) as server:
        yield server


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path) as driver:
        yield driver


@pytest.mark.slow
def test_lecture_opens_as_slides(lab, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, token = lab
    nb = nbformat.read(str(REPO / LECTURE), as_version=4)
    kinds = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb.cells]
    browser.get(f"{url}/rise/{LECTURE}?token={token}")
    # reveal.js marks its root "ready" once it has laid out every <section>
    top = ".reveal.ready .slides > section"
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, top))
    slides = browser.find_elements(By.CSS_SELECTOR, top)
    browser.save_screenshot(str(SCREENSHOTS / "slides_07.png"))

    assert len(slides) == kinds.count("slide")
    nested = browser.find_elements(By.CSS_SELECTOR, f"{top} > section")
    assert len(nested) == kinds.count("slide") + kinds.count("subslide")
    title = nb.cells[0].source.splitlines()[0].removeprefix("# ")
    present = browser.find_element(By.CSS_SELECTOR, ".reveal .slides section.present section.present")
    assert title in present.text

    # Space (the next slide or subslide; the arrows skip subslides): the setup cell's own subslide,
    # its code in an editor where Shift+Enter runs it
    ActionChains(browser).send_keys(Keys.SPACE).perform()
    WebDriverWait(browser, 10).until(lambda d: "import" in d.find_element(
        By.CSS_SELECTOR, ".reveal .slides section.present section.present").text)
    present = browser.find_element(By.CSS_SELECTOR, ".reveal .slides section.present section.present")
    assert present.find_elements(By.CSS_SELECTOR, ".jp-CodeCell .cm-editor")
    assert title not in present.text
    time.sleep(1)   # let the slide transition end before the screenshot
    browser.save_screenshot(str(SCREENSHOTS / "slides_07_code.png"))
