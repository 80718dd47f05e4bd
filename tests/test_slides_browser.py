"""A lecture opens as slides in JupyterLab with no further setup, checked in a real browser.

jupyterlab-rise (in requirements.txt) serves a slide-only view of a notebook at /rise/<path>: the
same RISE slideshow as its toolbar button (Alt+R) in JupyterLab, built by reveal.js from the cells'
slideshow metadata (docs/slides.py). This test starts `jupyter lab` as `make lab` does, opens lecture
07 there in headless Chromium and counts the slides reveal.js built. It leaves screenshots of the
title slide and of the setup (code) subslide in the temporary directory (slides_07*.png).
"""
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
LECTURE = "notebooks/07_ddp.ipynb"
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(tempfile.gettempdir())
JUPYTER = Path(sys.executable).parent / "jupyter"
# COURSE_REQUIRE_BROWSER (set by .ci/run): a missing browser fails the test instead of skipping it
pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists())
                                and not os.environ.get("COURSE_REQUIRE_BROWSER"),
                                reason=f"needs {CHROMIUM} and {CHROMEDRIVER} (apt install chromium chromium-driver)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on a free port (root URL, token); it and its kernels are killed afterwards."""
    pytest.importorskip("jupyterlab_rise")
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen([str(JUPYTER), "lab", "--no-browser", f"--port={port}", f"--ServerApp.token={token}",
                               "--ServerApp.ip=127.0.0.1", "--allow-root"],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)   # its own process group: kernels die with it
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=1)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, \
                    (tmp_path / "lab.log").read_text()[-3000:]
                time.sleep(0.2)
        yield url, token
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,800", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


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
