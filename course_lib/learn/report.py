"""Where am I: the progress record as a table, one notebook's part of it, a picture, and the time per exercise.

    python -m course_lib progress                                 # every exercise, passed / tried / not started
    python -m course_lib progress --reset ex00_count_parameters   # or a notebook's name, or all
    python -m course_lib progress --medians a.json b.json         # minutes per exercise over shared records
    python -m course_lib progress --medians a.json b.json --apply # ... written into the solutions/ headers

An exercise notebook's first cell calls `show("NN_..._exercises")`; lecture 00 calls `plot()`. The practica are
listed but not tracked (graded: the grader's report is their record).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path

from . import catalog as _catalog
from . import record as _record

PASSED, TRIED, NOT_STARTED = "passed", "tried", "not started"
MARK = {PASSED: "✔", TRIED: "…", NOT_STARTED: " "}
COLOURS = {NOT_STARTED: "#e8e8e8", TRIED: "#f5c26b", PASSED: "#4caf50"}


def status(data: dict, test_id: str) -> tuple[str, int]:
    """(passed / tried / not started, number of check calls) of one exercise in the record `data`."""
    calls = [a for a in data["attempts"] if a["test"] == test_id]
    return (PASSED if any(a["passed"] for a in calls) else TRIED if calls else NOT_STARTED), len(calls)


def next_exercise(data: dict, course: dict) -> tuple[dict, dict] | None:
    """(notebook, exercise): the first exercise in the course's order not passed yet (the practica aside)."""
    for nb in course["notebooks"]:
        for ex in nb["exercises"]:
            if not nb["practicum"] and status(data, ex["test"])[0] != PASSED:
                return nb, ex
    return None


def _lines(nb: dict, data: dict) -> list[str]:
    if nb["practicum"]:
        return [f"{nb['notebook']}: graded practicum, not tracked here"]
    lines = [f"{nb['notebook']}  (about {nb['minutes']} minutes)"]
    for ex in nb["exercises"]:
        state, calls = status(data, ex["test"])
        checks = f"{calls} check{'s' * (calls != 1)}"
        lines.append(f"  {MARK[state]} {state:<11}  {checks:<9}  {ex['title']}")
    return lines


def table(record: dict | None = None, catalog: dict | None = None) -> str:
    """Every exercise notebook with its exercises (passed / tried / not started, check calls), the count passed
    and "Next: <notebook> · <exercise title>". `record`, `catalog`: this machine's and the package's by default."""
    data = _record.load() if record is None else record
    course = _catalog.load() if catalog is None else catalog
    lines = [line for nb in course["notebooks"] for line in _lines(nb, data)]
    tracked = [ex for nb in course["notebooks"] if not nb["practicum"] for ex in nb["exercises"]]
    done = sum(status(data, ex["test"])[0] == PASSED for ex in tracked)
    lines.append(f"{done} of {len(tracked)} exercises passed")
    following = next_exercise(data, course)
    lines.append(f"Next: {following[0]['notebook']} · {following[1]['title']}" if following else
                 "Next: the practica (graded: your instructor's, or python -m course_lib.grade)")
    return "\n".join(lines)


def notebook_summary(notebook: str, record: dict | None = None, catalog: dict | None = None) -> str:
    """The table's lines of one exercise notebook; KeyError naming it when the catalog has no such notebook."""
    data = _record.load() if record is None else record
    course = _catalog.load() if catalog is None else catalog
    nb = next((n for n in course["notebooks"] if n["notebook"] == notebook), None)
    if nb is None:
        raise KeyError(f"no exercise notebook is called {notebook!r} (see course_lib/learn/catalog.json)")
    return "\n".join(_lines(nb, data))


def show(notebook: str) -> None:
    """An exercise notebook's first cell: note that it was opened and print its part of the record. Never
    raises: the notebook must run wherever it is opened (the grader's sandbox turns recording off)."""
    if not _record.enabled():
        print("progress recording is off (COURSE_PROGRESS)")
        return
    try:
        summary = notebook_summary(notebook)
    except (KeyError, OSError, ValueError) as exc:
        print(f"note: no progress to show for {notebook} ({exc})")
        return
    _record.record_open(notebook)
    print(f"Your progress (kept on this machine only, {_record.path()}):")
    print(summary)


def plot(ax=None, record: dict | None = None, catalog: dict | None = None):
    """Lecture 00: exercise notebooks (rows) by their exercises (columns), coloured passed / tried / not started;
    returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    data = _record.load() if record is None else record
    course = _catalog.load() if catalog is None else catalog
    notebooks = [nb for nb in course["notebooks"] if not nb["practicum"]]
    width = max(len(nb["exercises"]) for nb in notebooks)
    code = {NOT_STARTED: 1, TRIED: 2, PASSED: 3}           # 0: no such exercise in this notebook (white)
    grid = [[code[status(data, ex["test"])[0]] for ex in nb["exercises"]] + [0] * (width - len(nb["exercises"]))
            for nb in notebooks]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.32 * len(notebooks) + 1.2))
    ax.imshow(grid, cmap=ListedColormap(["white", *COLOURS.values()]), vmin=0, vmax=3, aspect="auto")
    ax.set_yticks(range(len(notebooks)), [nb["notebook"].removesuffix("_exercises") for nb in notebooks], fontsize=8)
    ax.set_xticks(range(width), [f"ex {i + 1}" for i in range(width)], fontsize=8)
    ax.set_xticks([i - 0.5 for i in range(1, width)], minor=True)          # white lines between the cells
    ax.set_yticks([i - 0.5 for i in range(1, len(notebooks))], minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in COLOURS.items()],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title("Your exercises (this machine's progress record)", fontsize=10)
    return ax


def _minutes(t0: str, t1: str) -> float:
    parse = lambda t: datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ")   # noqa: E731
    return (parse(t1) - parse(t0)).total_seconds() / 60


def durations(records: list[dict], course: dict) -> dict:
    """{test grade_id: [minutes, one per learner]}: from the learner's previous milestone (the notebook opened,
    or the previous exercise's first pass, whichever came later before this pass) to the exercise's first pass.
    A learner who never passed it, or left no milestone before the pass, does not count for it."""
    times: dict = {}
    for data in records:
        for nb in course["notebooks"]:
            opened = [o["time"] for o in data["opened"] if o["notebook"] == nb["notebook"]]
            previous = None
            for ex in nb["exercises"]:
                passes = sorted(a["time"] for a in data["attempts"] if a["test"] == ex["test"] and a["passed"])
                first = passes[0] if passes else None
                starts = [t for t in [*opened, previous] if first and t and t <= first]
                if starts:
                    times.setdefault(ex["test"], []).append(_minutes(max(starts), first))
                previous = first
    return times


def _read_shared(file) -> dict:
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{file}: not readable as a progress record ({exc})") from None
    if not _record.valid(data):
        raise ValueError(f"{file}: not a progress record this course wrote")
    return data


def medians(files, catalog: dict | None = None) -> dict:
    """{test grade_id: median minutes} over the progress files learners chose to share (see durations());
    ValueError naming a file that is not a progress record."""
    course = _catalog.load() if catalog is None else catalog
    found = durations([_read_shared(f) for f in files], course)
    return {test: statistics.median(values) for test, values in found.items()}


def apply(found: dict, solutions_dir, catalog: dict | None = None) -> list[str]:
    """Rewrite each exercise notebook's header in `solutions_dir` with the medians `found` rounded up to whole
    minutes (an exercise without a median keeps its estimate); the names of the notebooks changed."""
    from .catalog import ESTIMATE, estimate_text
    course = _catalog.load() if catalog is None else catalog
    changed = []
    for nb in course["notebooks"]:
        if nb["practicum"] or not any(ex["test"] in found for ex in nb["exercises"]):
            continue
        parts = [max(1, math.ceil(found[ex["test"]])) if ex["test"] in found else ex["minutes"]
                 for ex in nb["exercises"]]
        file = Path(solutions_dir) / f"{nb['notebook']}.ipynb"
        notebook = json.loads(file.read_text(encoding="utf-8"))
        header = "".join(notebook["cells"][0]["source"])
        new = ESTIMATE.sub(lambda _: estimate_text(parts), header, count=1)
        if new != header:
            notebook["cells"][0]["source"] = new.splitlines(keepends=True)
            file.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            changed.append(nb["notebook"])
    return changed


def _medians_command(files: list[str], write: bool, solutions: Path) -> int:
    course = _catalog.load()
    try:
        found = durations([_read_shared(f) for f in files], course)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for nb in course["notebooks"]:
        for ex in nb["exercises"]:
            if ex["test"] in found:
                values = found[ex["test"]]
                print(f"{nb['notebook']} · {ex['title']}: median {statistics.median(values):.1f} min over "
                      f"{len(values)} learner{'s' * (len(values) != 1)} (the header says {ex['minutes']})")
    print(f"{len(found)} exercises timed over {len(files)} shared record{'s' * (len(files) != 1)}")
    if write:
        if not solutions.is_dir():
            print(f"error: --apply: no {solutions}/ here (run it from the course's repository root, or give "
                  "--solutions DIR)", file=sys.stderr)
            return 2
        medians_found = {test: statistics.median(values) for test, values in found.items()}
        changed = apply(medians_found, solutions, course)
        for name in changed:
            print(f"rewrote the estimate in {solutions / name}.ipynb")
        print("Now run python -m course_lib.exercises (exercises/ and catalog.json follow solutions/) and commit."
              if changed else "no header changed")
    return 0


def _reset_command(target: str) -> int:
    course = _catalog.load()
    if target == "all":
        what, removed = "everything", _record.reset()
    elif target in {nb["notebook"] for nb in course["notebooks"]}:
        what, removed = target, _record.reset(notebook=target)
    else:
        try:
            what = _catalog.exercise(target)[1]["test"]
        except KeyError:
            print(f"error: --reset {target!r}: give an exercise's grade_id, an exercise notebook's name or 'all'",
                  file=sys.stderr)
            return 2
        removed = _record.reset(test_id=what)
    if not _record.enabled():
        print("progress recording is off (COURSE_PROGRESS): nothing removed")
        return 0
    print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} ({what}) from {_record.path()}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib progress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reset", metavar="EXERCISE|NOTEBOOK|all",
                        help="forget one exercise (its grade_id), one notebook's checks and openings, or all")
    parser.add_argument("--medians", nargs="+", metavar="FILE", help="progress files learners chose to share")
    parser.add_argument("--apply", action="store_true",
                        help="with --medians: write the medians, rounded up, into the solutions/ headers")
    parser.add_argument("--solutions", type=Path, default=Path("solutions"),
                        help="with --apply: the exercise sources (default: ./solutions)")
    args = parser.parse_args(argv)
    if args.apply and not args.medians:
        parser.error("--apply needs --medians FILE...")
    if args.medians:
        return _medians_command(args.medians, args.apply, args.solutions)
    if args.reset:
        return _reset_command(args.reset)
    print(f"Progress record: {_record.path()}" + ("" if _record.enabled() else " (recording is off: COURSE_PROGRESS)"))
    print(table())
    return 0
