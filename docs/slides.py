"""RISE slide metadata for the lecture notebooks (notebooks/NN_*.ipynb).

Instructors present a lecture as slides inside JupyterLab with jupyterlab-rise.
RISE reads ``cell.metadata["slideshow"]["slide_type"]`` from every cell; this
module computes that value from the cells themselves, so the slides follow the
lecture after every edit instead of being maintained by hand:

    python docs/slides.py           rewrite the notebooks whose metadata is out of date
    python docs/slides.py --check   exit 1 naming every such notebook (the tests run this)

The rules, in order (the first that applies wins):

1. a cell tagged ``install-course-lib`` (it installs course_lib on Colab) is
   "skip": it has nothing to show, and instructors run it before presenting;
2. the first cell, the lecture's ``# NN · title``, is a "slide";
3. a markdown cell that starts with ``## `` (a section) is a "slide";
4. a markdown cell that starts with ``### `` (a subsection) is a "subslide";
5. the first code cell after the title (skipped cells aside), the imports and
   setup, is a "subslide" of its own so that the title slide stays clean;
6. any other markdown cell that follows a code cell is a new idea inside the
   section: a "subslide";
7. any other cell that would take the current (sub)slide past MAX_LINES
   source lines starts a "subslide", so that a long explanation and a long
   code cell (and its plot or table) do not share one screen;
8. everything else (a code cell after the text that introduces it, a short
   markdown cell after a markdown cell) continues the (sub)slide: "-".

Only the "slideshow" key of each cell's metadata is written; sources, outputs,
tags and nbgrader metadata are kept as they are, and a notebook whose metadata
is already right is not touched (the rules are idempotent).
"""
import argparse
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
LECTURES = "notebooks/[0-9][0-9]_*.ipynb"
INSTALL_TAG = "install-course-lib"
# Rule 7's budget in source lines: about one screen at RISE's default scale.
MAX_LINES = 30


def lecture_paths(repo=REPO):
    """Every lecture notebook, in lecture order."""
    return sorted(Path(repo).glob(LECTURES))


def _lines(cell):
    return len(cell.source.splitlines())


def slide_types(cells):
    """The RISE slide_type of every cell, by the rules in the module docstring."""
    types = []
    previous = None        # the type ("markdown"/"code") of the last cell shown
    setup_pending = True   # rule 5: still waiting for the setup cell
    lines = 0              # source lines in the current (sub)slide
    for i, cell in enumerate(cells):
        text = cell.source.lstrip()
        is_md = cell.cell_type == "markdown"
        if INSTALL_TAG in cell.metadata.get("tags", []):
            types.append("skip")
            continue
        if i == 0 or (is_md and text.startswith("## ")):
            kind = "slide"
        elif is_md and text.startswith("### "):
            kind = "subslide"
        elif not is_md and setup_pending:
            kind = "subslide"
        elif is_md and previous == "code":
            kind = "subslide"
        elif lines + _lines(cell) > MAX_LINES:
            kind = "subslide"
        else:
            kind = "-"
        if i > 0:
            # rule 5 applies only while nothing but the title has been shown
            setup_pending = False
        lines = _lines(cell) + (lines if kind == "-" else 0)
        previous = cell.cell_type
        types.append(kind)
    return types


def apply(nb):
    """Set every cell's slideshow metadata; return True when anything changed."""
    changed = False
    for cell, kind in zip(nb.cells, slide_types(nb.cells)):
        if cell.metadata.get("slideshow") != {"slide_type": kind}:
            cell.metadata["slideshow"] = {"slide_type": kind}
            changed = True
    return changed


def out_of_date(paths):
    """The notebooks among paths whose slide metadata differs from the rules'."""
    return [p for p in paths if apply(nbformat.read(str(p), as_version=4))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a notebook's slide metadata is out of date")
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to process (default: every lecture)")
    args = parser.parse_args(argv)
    paths = args.notebooks or lecture_paths()
    if args.check:
        stale = out_of_date(paths)
        for path in stale:
            print(f"{path}: slide metadata is out of date; run python docs/slides.py")
        return 1 if stale else 0
    for path in paths:
        nb = nbformat.read(str(path), as_version=4)   # read just before writing
        if apply(nb):
            nbformat.write(nb, str(path))              # indent=1, as the notebooks are stored
            print(f"{path}: slide metadata updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
