"""Help that grows with each failed check of an exercise: the check's own message, then the idea the answer needs,
then the lecture section that teaches it, then the offer to compare with the course's solution.

The hints are data beside the checks, one file per exercise notebook (`hints/nbNN.json`, shipped in the package, so
they work on Colab too), one entry per test grade_id:

    {"ex00_count_parameters_test": {"answer": "ex00_count_parameters",
                                    "concept": "2-5 sentences: the idea and the usual mistake, never solution code",
                                    "section": {"notebook": "notebooks/00_start_here.ipynb",
                                                "heading": "3. Lectures, exercises and solutions"}}}

`failures` counts the failed checks since the last pass (`record.failures_since_pass`):

    0-1  None: the check's message is the help (it already says what is wrong and hints why)
    2    the concept
    3+   the concept and a link to the lecture section; from REVEAL_AFTER on, also how to compare with the solution
         (`reveal.show_solution`), unless the exercise is graded or the instructor switched the reveal off

    from course_lib.learn import hints
    print(hints.tier("ex00_count_parameters_test", 3).text)
    display(Markdown(hints.tier("ex00_count_parameters_test", 3).markdown()))   # the section as a link
"""
from __future__ import annotations

import functools
import html
import json
import re
from dataclasses import dataclass
from importlib import resources

from ..validate import non_negative_int
from .reveal import REVEAL_AFTER, allowed

CONCEPT_AFTER = 2    # the first failure gets the check's message alone: most slips are fixed from it
SECTION_AFTER = 3


@dataclass(frozen=True)
class Tier:
    """What to show after `failures` failed checks of `test`: the concept, the lecture section (a dict with
    "notebook" and "heading", None before SECTION_AFTER failures) and whether the solution may be compared."""
    test: str
    answer: str
    failures: int
    concept: str
    section: dict | None = None
    solution: bool = False

    @property
    def text(self) -> str:
        """Plain text (a terminal, a log)."""
        lines = [f"Hint ({self.failures} failed checks since the last pass): {self.concept}"]
        if self.section:
            lines.append(f"The lecture teaches it: {self.section['notebook']}, section "
                         f"\"{self.section['heading']}\".")
        if self.solution:
            lines.append(f"Compare your answer with the course's solution: {self._call()}")
        return "\n".join(lines)

    def markdown(self) -> str:
        """Markdown for a notebook; the section is a link relative to the exercise notebook (exercises/ or work/)."""
        parts = [f"**Hint** ({self.failures} failed checks since the last pass): {self.concept}"]
        if self.section:
            notebook, heading = self.section["notebook"], self.section["heading"]
            label = re.sub(r"([\[\]])", r"\\\1", f"{notebook.rsplit('/', 1)[-1].removesuffix('.ipynb')} › {heading}")
            parts.append(f"**Where the lecture teaches it:** [{label}](../{notebook}#{anchor(heading)})")
        if self.solution:
            parts.append(f"**Compare with the course's solution:** `{self._call()}`")
        return "\n\n".join(parts)

    def _call(self) -> str:
        return f'from course_lib.learn.reveal import show_solution; show_solution("{self.answer}")'


def anchor(heading: str) -> str:
    """JupyterLab's id for a Markdown heading: the rendered heading's text with every space replaced by "-"
    (code spans lose their backticks, emphasis its stars, a link keeps its text; "·", "(" and ":" stay).

    >>> anchor("2. Sharding the data: `DistributedSampler` and `set_epoch`")
    '2.-Sharding-the-data:-DistributedSampler-and-set_epoch'
    """
    pieces = re.split(r"(`+)(.+?)\1", heading.strip())        # [text, ticks, code, text, ticks, code, ..., text]
    out = []
    for i, piece in enumerate(pieces):
        if i % 3 == 2:                                           # a code span: literal, one space trimmed each side
            out.append(piece[1:-1] if piece.startswith(" ") and piece.endswith(" ") and piece.strip() else piece)
        elif i % 3 == 0:
            piece = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", piece)               # [text](url) -> text
            piece = re.sub(r"<[^>]+>", "", piece)                                  # inline HTML tags
            piece = re.sub(r"(\*{1,3})(\S(?:.*?\S)?)\1", r"\2", piece)             # *em*, **strong**
            piece = re.sub(r"(?<!\w)(_{1,3})(\S(?:.*?\S)?)\1(?!\w)", r"\2", piece)  # _em_ (not snake_case)
            out.append(html.unescape(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", piece)))  # backslash escapes
    return "".join(out).replace(" ", "-")


def _merge(documents: dict) -> dict:
    """One {test grade_id: entry} from {file name: its entries}; a grade_id in two files is an error."""
    merged, origin = {}, {}
    for name, entries in sorted(documents.items()):
        for test_id, entry in entries.items():
            if test_id in merged:
                raise ValueError(f"hint for {test_id!r} is in both {origin[test_id]} and {name}: one file each")
            merged[test_id], origin[test_id] = entry, name
    return merged


@functools.lru_cache(maxsize=1)
def load() -> dict:
    """Every packaged hint file merged: {test grade_id: {"answer", "concept", "section"}} (read through
    importlib.resources, so it works from an installed wheel as from a clone)."""
    folder = resources.files(__package__).joinpath("hints")
    return _merge({item.name: json.loads(item.read_text(encoding="utf-8")) for item in folder.iterdir()
                   if item.name.endswith(".json")})


def tier(test_id: str, failures: int) -> Tier | None:
    """The help for `test_id` (a test grade_id) after `failures` failed checks since its last pass; None while
    the check's own message is enough. KeyError naming the id if it has no hints (the practica have none)."""
    failures = non_negative_int("failures", failures)
    hints = load()
    if test_id not in hints:
        raise KeyError(f"no hints for the grade_id {test_id!r} (see course_lib/learn/hints/; the graded practica "
                       "have none)")
    if failures < CONCEPT_AFTER:
        return None
    entry = hints[test_id]
    solution = False
    if failures >= REVEAL_AFTER:
        solution, _ = allowed(test_id, failures=failures, passed=False)
    return Tier(test=test_id, answer=entry["answer"], failures=failures, concept=entry["concept"],
                section=dict(entry["section"]) if failures >= SECTION_AFTER else None, solution=solution)
