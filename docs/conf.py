"""Sphinx configuration of the course's site: `make site` (Sphinx + myst-nb + sphinx-book-theme).

The source folder is the repository's root, so a page's path is the notebook's path in the repository
(notebooks/07_ddp.ipynb -> notebooks/07_ddp.html) and the Colab/Binder/download buttons point at the real file.
Notebooks run once per content: jupyter-cache keys outputs by the code cells, in a cache folder of its own per
data set, mode and course_lib version, so the footer's "outputs computed on" is true of every page and no page
shows outputs of older library code.

COURSE_SITE_PAGES="notebooks/07_ddp notebooks/00_start_here" builds only those pages (the browser test's subset);
the course map then links only what was built.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import sys
from pathlib import Path

from docutils import nodes
from sphinx import addnodes
from sphinx.errors import ExtensionError
from sphinx.util.logging import get_node_location, is_suppressed_warning

sys.path.insert(0, str(Path(__file__).parent))
import publish  # noqa: E402  (docs/ is not a package)

REPO = publish.REPO
os.environ.setdefault("TQDM_DISABLE", "1")        # progress bars are noise on a static page
os.environ["COURSE_STATIC_PAGE"] = "1"             # widgets show their output for the starting values (show.interactive)
os.environ.setdefault("COURSE_DATA_DIR", str(REPO / "data"))

project = "Scaling Deep Learning"
author = "the Scaling Deep Learning authors"
copyright = f"{datetime.date.today().year}, {author}"

extensions = ["myst_nb", "sphinx.ext.autodoc"]
root_doc = "docs/index"
default_role = "literal"                           # `x` in a docstring is code, as in the notebooks' Markdown
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}
autodoc_inherit_docstrings = False                 # Lightning's and torch's own docstrings are theirs to render
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
suppress_warnings = ["mystnb.unknown_mime_type"]

# --- which pages -------------------------------------------------------------------------------------------
ALL_PAGES = ([f"notebooks/{p.stem}" for p in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
             + [f"exercises/{p.stem}" for p in sorted((REPO / "exercises").glob("*.ipynb"))])
_subset = os.environ.get("COURSE_SITE_PAGES", "").split()
PAGES = _subset or ALL_PAGES
unknown = sorted(set(PAGES) - set(ALL_PAGES))
if unknown:
    raise ValueError(f"COURSE_SITE_PAGES names pages that do not exist: {unknown}; allowed: {ALL_PAGES}")
MODULES = sorted({m for page in PAGES if page.startswith("notebooks/")
                  for m in publish.imported_modules(REPO / f"{page}.ipynb")}
                 | (set() if _subset else set(publish.api_modules())))
if _subset:
    suppress_warnings.append("toc.empty_glob")     # a partial build may leave out a whole toctree glob
include_patterns = ["docs/index.md", "docs/INSTRUCTOR_GUIDE.md", "docs/api/*.md"] + [f"{p}.ipynb" for p in PAGES]
exclude_patterns = [".venv", "_build", "data", "solutions", "tests", "course_lib", "**/.ipynb_checkpoints"]

# --- notebook execution (myst-nb + jupyter-cache) ------------------------------------------------------------
QUICK = os.environ.get("COURSE_QUICK", "").strip().lower() not in ("", "0", "false", "no", "off")
DATA = publish.data_description(QUICK)
nb_execution_mode = "cache"
# one cache per data set, mode and library version: a page never shows outputs of other data or older code
CACHE_ROOT = Path(os.environ.get("COURSE_SITE_CACHE", REPO / "_build" / "jupyter_cache"))
nb_execution_cache_path = str(CACHE_ROOT / f"{DATA['key']}-lib-{publish.library_hash()}")
nb_execution_timeout = 900                         # a cell; the lectures' longest runs ~1 min
nb_execution_raise_on_error = True                 # a notebook that fails to run fails the build
nb_execution_show_tb = True
nb_merge_streams = True

# --- theme and launch buttons ----------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = project
html_extra_path = ["_extra"]                       # /index.html forwards to the home page
html_theme_options = {
    "repository_url": publish.repository_url(),
    "repository_branch": publish.release(),
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com",
                       "binderhub_url": "https://mybinder.org",
                       "notebook_interface": "jupyterlab"},
    "extra_footer": f"<p>Outputs computed on {DATA['text']}.</p>",
    "show_toc_level": 2,
}


def write_generated(app) -> None:
    """The API pages and the home page's course map, written only when their text changes (mtimes drive
    Sphinx's incremental rebuild)."""
    api = REPO / "docs" / "api"
    api.mkdir(exist_ok=True)
    pages = {"index.md": publish.api_index(MODULES)}
    pages.update({f"{m}.md": publish.api_page(m) for m in MODULES})
    for stale in set(p.name for p in api.glob("*.md")) - set(pages):
        (api / stale).unlink()
    built = set(PAGES) | {f"docs/api/{m}" for m in MODULES}
    generated = REPO / "docs" / "_generated"
    generated.mkdir(exist_ok=True)
    pages_at = {api / name: text for name, text in pages.items()}
    pages_at[generated / "course_map.md"] = publish.course_map_markdown(built)
    pages_at[generated / "data.md"] = f"The outputs on these pages were computed on {DATA['text']}.\n"
    for path, text in pages_at.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def exercise_cells_may_raise(app, docname, source) -> None:
    """An exercise page runs the notebook as a student opens it: the answer cells raise NotImplementedError, and
    so do the check cells and any cell that uses an answer. Every code cell from the first answer cell on is
    tagged `raises-exception` (it may fail); the setup cells above it must run, or the build fails."""
    if not docname.startswith("exercises/"):
        return
    nb = json.loads(source[0])
    answered = False
    for cell in nb["cells"]:
        answered = answered or bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))
        if answered and cell["cell_type"] == "code":
            tags = cell["metadata"].setdefault("tags", [])
            if "raises-exception" not in tags:
                tags.append("raises-exception")
    source[0] = json.dumps(nb)


def plain_docstring(app, what, name, obj, options, lines) -> None:
    """The docstrings are written to be read in the source: |x| is an absolute value, not a reST substitution."""
    lines[:] = [line.replace("|", "\\|") for line in lines]


def link_taught_modules(app, doctree) -> None:
    """Under a lecture's title: links to the API pages of the course_lib modules it imports."""
    docname = app.env.docname
    if not docname.startswith("notebooks/"):
        return
    modules = publish.imported_modules(REPO / f"{docname}.ipynb")
    section = next(iter(doctree.findall(nodes.section)), None)
    if not modules or section is None:
        return
    para = nodes.paragraph("", "The library code taught here: ")
    for i, module in enumerate(modules):
        ref = addnodes.pending_xref("", refdomain="py", reftype="mod", reftarget=module, refexplicit=False,
                                    refwarn=True)
        ref += nodes.literal(module, module)
        para += [nodes.Text(", ")] if i else []
        para += ref
    section.insert(1, nodes.note("", para))


class _Problems(logging.Handler):
    """Warnings that must fail the build: broken links, missing pages, failed notebooks. Docstring markup
    warnings (autodoc) are reported but do not fail it."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.found: list[str] = []

    def emit(self, record):
        if is_suppressed_warning(getattr(record, "type", None), getattr(record, "subtype", None), suppress_warnings):
            return
        where = getattr(record, "location", None)
        if isinstance(where, nodes.Node):
            where = get_node_location(where)
        if "docstring of" not in str(where):
            self.found.append(f"{where}: {record.getMessage()}" if where else record.getMessage())


PROBLEMS = _Problems()


def fail_on_problems(app, exception) -> None:
    if exception is None and PROBLEMS.found:
        raise ExtensionError(f"{len(PROBLEMS.found)} problem(s) in the site:\n" + "\n".join(PROBLEMS.found))


def setup(app):
    logging.getLogger("sphinx").addHandler(PROBLEMS)
    app.connect("builder-inited", write_generated)
    app.connect("source-read", exercise_cells_may_raise)
    app.connect("doctree-read", link_taught_modules)
    app.connect("autodoc-process-docstring", plain_docstring)
    app.connect("build-finished", fail_on_problems)
    print(f"site: {len(PAGES)} notebook pages, {len(MODULES)} API pages; outputs computed on {DATA['text']}; "
          f"Python {platform.python_version()}")
