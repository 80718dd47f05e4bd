"""The published site, built for real and opened in a real browser (Debian's chromium through selenium).

A subset keeps CI short: the home page, lecture 03 and its exercises (3 plots, 13 s in quick mode where 07 takes
a minute; nbval runs every notebook anyway), executed in quick mode on the data CI
has, with their API pages. The checks are what a reader meets: the course map's links resolve, a lecture page
shows its plots as images and its code highlighted, the launch buttons carry the notebook's own path in the
repository, the download is the notebook, and the footer says which data the outputs were computed on.
"""
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs"))
import publish  # noqa: E402

REPO = publish.REPO
PAGES = ["notebooks/03_data_loading", "exercises/03_data_loading_exercises"]
LECTURE = "notebooks/03_data_loading"
TAUGHT = "course_lib.data"     # a module lecture 03 imports
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def test_every_notebook_installs_course_lib_first_and_only_when_missing():
    assert publish.sync(check=True) == 0, "run: python docs/publish.py"
    nb = json.loads((REPO / "notebooks/07_ddp.ipynb").read_text())
    source = "".join(nb["cells"][1]["source"])
    assert 'find_spec("course_lib") is None' in source and publish.repository_url() in source
    assert "2 CPU cores" in source   # 07 launches processes: it says what Colab gives


@pytest.mark.parametrize("importable", [True, False])
def test_the_install_cell_installs_only_where_course_lib_is_missing(monkeypatch, importable):
    import importlib.util
    import subprocess as sp

    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if importable else None)
    monkeypatch.setattr(sp, "run", lambda *a, **k: calls.append((a, k)))
    nb = json.loads((REPO / "notebooks/16_frameworks.ipynb").read_text())
    exec("".join(nb["cells"][1]["source"]), {})
    if importable:
        assert calls == []
    else:
        (args,), kwargs = calls[0]
        assert args[1:5] == ["-m", "pip", "install", "-q"] and kwargs == {"check": True}
        assert args[5] == f"course_lib[frameworks] @ git+{publish.repository_url()}@{publish.release()}"


def test_the_course_map_covers_every_lecture_and_links_what_was_built():
    rows = publish.course_map_rows()
    assert [r[0] for r in rows] == [p.name[:2] for p in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    table = publish.course_map_markdown({"notebooks/07_ddp", "docs/api/course_lib.distributed.ddp"})
    assert "[DDP](/notebooks/07_ddp.ipynb)" in table
    assert "{py:mod}`distributed.ddp <course_lib.distributed.ddp>`" in table
    assert "](/notebooks/05" not in table   # a page left out of the build is not linked


def test_a_lecture_links_the_modules_it_imports():
    modules = publish.imported_modules(REPO / "notebooks/07_ddp.ipynb")
    assert "course_lib.distributed.ddp" in modules and "course_lib.trace" in modules
    assert not any(m.startswith("course_lib.checks") for m in modules)
    assert set(modules) <= set(publish.api_modules())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, COURSE_SITE_PAGES=" ".join(PAGES), COURSE_QUICK="1")
    env.setdefault("COURSE_SITE_CACHE", str(out / "cache"))   # fresh, unless a developer points it at one
    build = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", "docs", ".", str(out / "html")],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-6000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out / "html"))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda *a: None   # a browser closing a connection early is not a failure
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        if os.environ.get("COURSE_REQUIRE_BROWSER"):
            pytest.fail("chromium and chromedriver are required here (COURSE_REQUIRE_BROWSER is set)")
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1800"):
        options.add_argument(flag)
    profile = Path(os.environ.get("TMPDIR", "/tmp")) / f"course-chromium-{os.getpid()}"
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.implicitly_wait(10)   # index.html forwards to the home page with a meta refresh
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def screenshot(driver, name: str) -> None:
    folder = os.environ.get("COURSE_SITE_SCREENSHOTS")
    if folder:
        driver.save_screenshot(str(Path(folder) / name))


@pytest.mark.slow
def test_home_page_course_map_links_resolve(browser, site):
    browser.get(f"{site}/index.html")   # forwards to the home page
    browser.find_element("css selector", "article table")
    assert browser.current_url.endswith("/docs/index.html")
    screenshot(browser, "home.png")
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "article table a")]
    assert any(h.endswith(f"{LECTURE}.html") for h in links)
    assert any(h.endswith(f"{PAGES[1]}.html") for h in links)
    assert any(f"/docs/api/{TAUGHT}.html" in h for h in links)
    hrefs = (a.get_attribute("href") for a in browser.find_elements("css selector", "a[href]"))
    internal = {h.split("#")[0] for h in hrefs if h and h.startswith(site)}
    broken = [h for h in sorted(internal) if status(h) != 200]
    assert not broken, f"links that do not resolve: {broken}"
    footer = "\n".join(f.text for f in browser.find_elements("css selector", "footer"))
    assert "Outputs computed on" in footer and "training images" in footer and "quick mode" in footer, footer


@pytest.mark.slow
def test_lecture_page_shows_plots_highlighted_code_and_its_modules(browser, site):
    browser.get(f"{site}/{LECTURE}.html")
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait
    try:   # all three in the page, but a busy machine's browser once listed two right after the load
        images = WebDriverWait(browser, 20).until(
            lambda b: len(found := b.find_elements("css selector", "div.cell_output img")) >= 3 and found)
    except TimeoutException:
        found = browser.find_elements("css selector", "div.cell_output img")
        pytest.fail(f"expected the lecture's plots as images, found {len(found)} after 20 s")
    assert all(browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
               for img in images), "an image did not load"
    keyword = browser.find_element("css selector", "div.cell_input div.highlight span.kn")   # `import`
    plain = browser.find_element("css selector", "div.cell_input div.highlight pre")
    assert keyword.value_of_css_property("color") != plain.value_of_css_property("color")
    taught = [a.get_attribute("href") for a in browser.find_elements("css selector", "div.admonition.note a")]
    assert any(h.endswith(f"/docs/api/{TAUGHT}.html#module-{TAUGHT}") for h in taught)
    assert all(status(h.split("#")[0]) == 200 for h in taught)
    browser.execute_script("window.scrollTo(0, 0)")
    screenshot(browser, "lecture.png")


@pytest.mark.slow
def test_launch_buttons_carry_the_notebooks_path(browser, site):
    browser.get(f"{site}/{LECTURE}.html")
    hrefs = [a.get_attribute("href") for a in browser.find_elements("css selector", "a") if a.get_attribute("href")]
    repo, path = publish.repository_url(), f"{LECTURE}.ipynb"
    owner_repo = repo.split("github.com/")[1]
    assert f"https://colab.research.google.com/github/{owner_repo}/blob/{publish.release()}/{path}" in hrefs
    binder = [h for h in hrefs if h.startswith(f"https://mybinder.org/v2/gh/{owner_repo}/{publish.release()}")]
    assert binder and all(path in h for h in binder), binder
    download = [h for h in hrefs if h.endswith(f"_sources/{path}")]
    assert download, "no download link to the .ipynb"
    with urllib.request.urlopen(download[0], timeout=10) as response:
        notebook = json.loads(response.read())
    assert notebook == json.loads((REPO / path).read_text())   # the notebook itself, as stored (no outputs)


@pytest.mark.slow
def test_exercise_page_runs_as_a_student_opens_it(browser, site):
    browser.get(f"{site}/{PAGES[1]}.html")
    text = browser.find_element("css selector", "article").text
    assert "NotImplementedError" in text   # the answer cells are not filled in
    assert "BEGIN HIDDEN TESTS" not in text and "### BEGIN SOLUTION" not in text
