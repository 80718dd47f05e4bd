"""The lectures' RISE slide metadata (docs/slides.py), kept in sync with the lectures.

After editing a lecture, run `python docs/slides.py` to recompute its slides.
"""
import importlib.util
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("slides", REPO / "docs" / "slides.py")
slides = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slides)

LECTURES = slides.lecture_paths(REPO)
NOTEBOOKS = {p.name: nbformat.read(str(p), as_version=4) for p in LECTURES}
# The bound on one (sub)slide. The rules keep a (sub)slide of several cells within
# slides.MAX_LINES (30) source lines, about one screen; only a single cell can be longer
# (metadata cannot split a cell), and the longest lecture cell has 49 lines. 50 lines is
# two screens of scrolling: beyond it a slide is no longer something to present, so the
# cell should be split in the lecture. Five cells: text and up to four short code cells.
MAX_SLIDE_LINES = 50
MAX_SLIDE_CELLS = 5


def slide_type(cell):
    return cell.metadata.get("slideshow", {}).get("slide_type")


def groups(nb):
    """The (sub)slides of a notebook as lists of the cells they show (skipped cells left out)."""
    found = []
    for cell in nb.cells:
        kind = slide_type(cell)
        if kind in ("slide", "subslide") or not found:
            found.append([])
        if kind != "skip":
            found[-1].append(cell)
    return found


def test_there_are_lectures():
    assert len(LECTURES) >= 17


def test_metadata_is_what_the_rules_compute(capsys):
    assert slides.main(["--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_cell_has_a_slide_type(name):
    kinds = {slide_type(cell) for cell in NOTEBOOKS[name].cells}
    assert kinds <= {"slide", "subslide", "fragment", "-", "skip", "notes"}, kinds


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_title_slide_is_the_first_cell(name):
    first = NOTEBOOKS[name].cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {name[:2]} ")
    assert slide_type(first) == "slide"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_section_starts_a_slide(name):
    for cell in NOTEBOOKS[name].cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("## "):
            assert slide_type(cell) == "slide", cell.source.splitlines()[0]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_install_cell_is_skipped(name):
    tagged = [c for c in NOTEBOOKS[name].cells if slides.INSTALL_TAG in c.metadata.get("tags", [])]
    assert all(slide_type(c) == "skip" for c in tagged)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_slide_is_absurdly_long(name):
    for cells in groups(NOTEBOOKS[name]):
        lines = sum(len(c.source.splitlines()) for c in cells)
        where = f"the (sub)slide starting {cells[0].source.splitlines()[0][:60]!r}"
        assert len(cells) <= MAX_SLIDE_CELLS, f"{where} has {len(cells)} cells"
        assert lines <= MAX_SLIDE_LINES, f"{where} has {lines} source lines"


def test_rules_on_a_toy_notebook():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    install = code("%pip install course_lib")
    install.metadata["tags"] = [slides.INSTALL_TAG]
    nb = nbformat.v4.new_notebook(cells=[
        md("# 99 · Toy"), install, code("import torch"), md("## 1. A section"), code("x = 1"),
        md("A new idea"), md("more text"), code("y = 2"), code("z = 3"), md("### A subsection"),
        code("\n".join(["a = 1"] * 29)), code("b = 2"),
    ])
    assert slides.slide_types(nb.cells) == [
        "slide", "skip", "subslide", "slide", "-",
        "subslide", "-", "-", "-", "subslide",
        "-", "subslide",   # 1 + 29 + 1 lines would pass MAX_LINES
    ]
    assert slides.apply(nb) and not slides.apply(nb)   # idempotent
    assert install.metadata["tags"] == [slides.INSTALL_TAG]
