"""A JupyterLab server and a headless Chromium for the tests that use the course as a person does.

Debian's chromium and chromedriver drive the browser (a test cannot download one here). COURSE_REQUIRE_BROWSER
(set by .ci/run where it installed them) turns a missing browser into a failure instead of a skip.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from course_lib.distributed.launch import free_port

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
JUPYTER = Path(sys.executable).parent / "jupyter"
needs_browser = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists())
                                   and not os.environ.get("COURSE_REQUIRE_BROWSER"),
                                   reason=f"needs {CHROMIUM} and {CHROMEDRIVER} (apt install chromium chromium-driver)")


@contextlib.contextmanager
def jupyter_lab(root: Path, scratch: Path, env: dict | None = None, args=()):
    """`jupyter lab` serving `root` on a free port, as `make lab` starts it: yields (root URL, token). It and its
    kernels (its own process group) are killed afterwards; its log is in scratch/lab.log."""
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(scratch / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"), **(env or {}))
    log_path = scratch / "lab.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([str(JUPYTER), "lab", "--no-browser", f"--port={port}", f"--ServerApp.token={token}",
                                   "--ServerApp.ip=127.0.0.1", "--allow-root", *args],
                                  cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=1)
                    break
                except OSError:
                    assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                    time.sleep(0.2)
            yield url, token
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


@contextlib.contextmanager
def chromium(scratch: Path, size: str = "1280,800"):
    """A headless Chromium under selenium, its profile in `scratch`."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--window-size={size}", f"--user-data-dir={scratch / 'chromium'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
