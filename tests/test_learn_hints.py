"""The hints that escalate (course_lib.learn.hints): every exercise test of solutions/ has its tiers, each points
at a heading that exists in its lecture, no hint holds a line of its solution or of the hidden tests, and the
tier grows with the failures. Read from the notebooks themselves (nbformat), not from the catalog."""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from course_lib.learn import hints

ROOT = Path(__file__).resolve().parents[1]
HINTS = ROOT / "course_lib" / "learn" / "hints"
MIN_LINE = 12   # shorter lines ("return x", "else:") are words a hint may well use


def _exercises() -> dict:
    """test grade_id -> (notebook stem, answer grade_id, answer source, test source), for every exercise
    notebook of solutions/ (not the graded practica)."""
    found = {}
    for path in sorted((ROOT / "solutions").glob("*_exercises.ipynb")):
        answer = None
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution"):
                answer = (meta["grade_id"], cell.source)
            elif meta.get("grade"):
                assert answer is not None, f"{path.name}: test {meta['grade_id']} has no answer cell before it"
                found[meta["grade_id"]] = (path.stem, answer[0], answer[1], cell.source)
    return found


EXERCISES = _exercises()


def _region(source: str, begin: str, end: str) -> list[str]:
    """The stripped lines between the markers (the whole rest of the cell when `end` never comes)."""
    lines, inside = [], False
    for line in source.splitlines():
        if line.strip().startswith(begin):
            inside = True
        elif line.strip().startswith(end):
            inside = False
        elif inside:
            lines.append(line.strip())
    return lines


def _code_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if len(line) >= MIN_LINE and not line.startswith("#")]


def _headings(notebook: Path) -> set:
    return {line.lstrip("#").strip() for cell in nbformat.read(notebook, as_version=4).cells
            if cell.cell_type == "markdown" for line in cell.source.splitlines() if re.match(r"#{1,6} ", line)}


def test_the_exercises_are_found():
    assert len(EXERCISES) >= 30 and all(test.endswith("_test") for test in EXERCISES)
    assert not any(stem.startswith("practicum") for stem, *_ in EXERCISES.values())


def test_each_file_holds_only_its_notebooks_exercises():
    for path in sorted(HINTS.glob("nb*.json")):
        number = path.stem[2:]
        for test_id in json.loads(path.read_text(encoding="utf-8")):
            assert test_id in EXERCISES, f"{path.name}: {test_id} is no exercise test grade_id of solutions/"
            assert EXERCISES[test_id][0].startswith(number + "_"), f"{path.name}: {test_id} is another lecture's"


@pytest.mark.parametrize("test_id", sorted(EXERCISES))
def test_every_exercise_has_its_tiers(test_id):
    stem, answer, _, _ = EXERCISES[test_id]
    assert test_id in hints.load(), f"no hint for {test_id} in {HINTS.name}/nb{stem[:2]}.json"
    hint = hints.load()[test_id]
    assert set(hint) == {"answer", "concept", "section"}
    assert hint["answer"] == answer, f"{test_id}: the answer cell before it is {answer}"
    assert 80 <= len(hint["concept"]) <= 900, f"{test_id}: the concept should be 2-5 sentences"
    section = hint["section"]
    lecture = ROOT / section["notebook"]
    assert section["notebook"] == f"notebooks/{stem.removesuffix('_exercises')}.ipynb", test_id
    assert section["heading"] in _headings(lecture), f"{test_id}: no heading {section['heading']!r} in {lecture.name}"


def test_one_file_per_exercise_notebook():
    """nbNN.json for every exercise notebook of solutions/, none for the graded practica."""
    wanted = {f"nb{stem[:2]}.json" for stem, *_ in EXERCISES.values()}
    assert wanted == {p.name for p in HINTS.glob("*.json")}


@pytest.mark.parametrize("test_id", sorted(EXERCISES))
def test_no_hint_holds_a_line_of_the_solution_or_of_the_hidden_tests(test_id):
    _, _, answer_source, test_source = EXERCISES[test_id]
    concept = hints.load()[test_id]["concept"]
    solution = _code_lines(_region(answer_source, "### BEGIN SOLUTION", "### END SOLUTION"))
    hidden = _code_lines(_region(test_source, "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"))
    assert solution, f"{test_id}: no solution line found (the check below would prove nothing)"
    for line in solution + hidden:
        assert line not in concept, f"{test_id}: the hint holds the line {line!r}"


def test_the_line_check_can_fail():
    solution = "def f(x):\n    ### BEGIN SOLUTION\n    return sum(p.numel() for p in x)\n    # a comment here ok\n"
    lines = _code_lines(_region(solution, "### BEGIN SOLUTION", "### END SOLUTION"))
    assert lines == ["return sum(p.numel() for p in x)"]
    assert any(line in "Use return sum(p.numel() for p in x) here." for line in lines)


def test_the_tiers_grow_with_the_failures(monkeypatch):
    monkeypatch.setenv("COURSE_REVEAL", "on")
    test_id = "ex00_count_parameters_test"
    hint = hints.load()[test_id]
    assert hints.tier(test_id, 0) is None and hints.tier(test_id, 1) is None     # the check's message alone
    two, three, five = hints.tier(test_id, 2), hints.tier(test_id, 3), hints.tier(test_id, 5)
    assert hints.REVEAL_AFTER == 3
    assert hint["concept"] in two.text and two.section is None and not two.solution
    assert "show_solution" not in two.text + two.markdown()
    heading = hint["section"]["heading"]
    assert heading not in two.text and heading in three.text and three.section == hint["section"]
    assert three.solution and five.solution and five.section == hint["section"]
    assert 'show_solution("ex00_count_parameters")' in three.text
    assert 'show_solution("ex00_count_parameters")`' in three.markdown()
    link = f'](../{hint["section"]["notebook"]}#{hints.anchor(heading)})'
    assert link in three.markdown() and link not in three.text
    monkeypatch.setenv("COURSE_REVEAL", "off")                                    # an instructor's switch
    off = hints.tier(test_id, 4)
    assert not off.solution and "show_solution" not in off.text and heading in off.text


def test_bad_ids_and_counts_are_refused():
    for failures in (0, 2):
        with pytest.raises(KeyError, match="ex99_nothing_test"):
            hints.tier("ex99_nothing_test", failures)
    for bad in (-1, 2.0, True, None):
        with pytest.raises(ValueError, match="failures"):
            hints.tier("ex00_count_parameters_test", bad)


def test_the_anchor_is_jupyterlabs():
    assert hints.anchor("1. Counting parameters") == "1.-Counting-parameters"
    assert hints.anchor("5 · `all_reduce` by hand") == "5-·-all_reduce-by-hand"
    assert hints.anchor("The **ring**: [NCCL](https://nvidia.com) `ring`") == "The-ring:-NCCL-ring"
    assert hints.anchor("snake_case_name stays") == "snake_case_name-stays"


def test_the_hints_are_package_data():
    """Shipped in the wheel (pyproject's package-data), read through importlib.resources."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'"course_lib\.learn" = \[[^\]]*"hints/\*\.json"', pyproject)
    assert len(hints.load()) == sum(len(json.loads(p.read_text(encoding="utf-8"))) for p in HINTS.glob("nb*.json"))
