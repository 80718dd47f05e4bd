"""Where am I: the progress record as a table, one notebook's part of it, a picture, and the time per exercise.

    python -m course_lib progress                      # every exercise: passed / tried / not started, and what next
    python -m course_lib progress --reset ex00_count_parameters    # or a notebook, or all
    python -m course_lib progress --medians a.json b.json         # minutes per exercise over shared records

An exercise notebook's first cell calls `show("NN_..._exercises")`; lecture 00 calls `plot()`. The practica are
listed but not tracked (graded: the grader's report is their record).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

from . import catalog, record

PASSED, TRIED, NOT_STARTED = "passed", "tried", "not started"


def status(data: dict, test: str) -> tuple[str, int]:
    """(passed / tried / not started, number of check calls) of one exercise."""
    calls = [a for a in data["attempts"] if a["test"] == test]
    return (PASSED if any(a["passed"] for a in calls) else TRIED if calls else NOT_STARTED), len(calls)


def next_exercise(data: dict, course: dict) -> tuple[dict, dict] | None:
    """The first exercise, in the course's order, not passed yet (the practica aside)."""
    for nb in course["notebooks"]:
        for ex in nb["exercises"]:
            if not nb["practicum"] and status(data, ex["test"])[0] != PASSED:
                return nb, ex
    return None


def notebook_lines(nb: dict, data: dict) -> list[str]:
    if nb["practicum"]:
        return [f"{nb['notebook']}: graded practicum, not tracked here"]
    lines = [f"{nb['notebook']}  (about {nb['minutes']} minutes)"]
    for ex in nb["exercises"]:
        state, calls = status(data, ex["test"])
        mark = {PASSED: "✔", TRIED: "…", NOT_STARTED: " "}[state]
        lines.append(f"  {mark} {ex['title']:<46} {state:<11} {calls} check{'s' if calls != 1 else ''}")
    return lines


def table(data: dict | None = None, course: dict | None = None) -> str:
    data, course = data or record.load(), course or catalog.load()
    lines = [line for nb in course["notebooks"] for line in notebook_lines(nb, data)]
    tracked = [ex for nb in course["notebooks"] if not nb["practicum"] for ex in nb["exercises"]]
    done = sum(status(data, ex["test"])[0] == PASSED for ex in tracked)
    lines.append(f"{done} of {len(tracked)} exercises passed")
    following = next_exercise(data, course)
    lines.append(f"Next: {following[0]['notebook']} · {following[1]['title']}" if following else "Next: the practica")
    return "\n".join(lines)


def notebook_summary(notebook: str, data: dict | None = None) -> str:
    data = data or record.load()
    nb = next((n for n in catalog.load()["notebooks"] if n["notebook"] == notebook), None)
    if nb is None:
        raise KeyError(f"no exercise notebook is called {notebook!r}")
    return "\n".join(notebook_lines(nb, data))


def show(notebook: str) -> None:
    """An exercise notebook's first cell: note that it was opened and print its part of the record."""
    if not record.enabled():
        print("progress recording is off (COURSE_PROGRESS)")
        return
    record.record_open(notebook)
    print(f"Your progress (kept on this machine only: {record.path()}):")
    print(notebook_summary(notebook))


def plot(ax=None, data: dict | None = None, course: dict | None = None):
    """Lecture 00: a grid of exercise notebooks (rows) by exercises (columns), coloured by status."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    data, course = data or record.load(), course or catalog.load()
    notebooks = [nb for nb in course["notebooks"] if not nb["practicum"]]
    width = max(len(nb["exercises"]) for nb in notebooks)
    code = {NOT_STARTED: 0, TRIED: 1, PASSED: 2}
    grid = [[code[status(data, ex["test"])[0]] for ex in nb["exercises"]] + [-1] * (width - len(nb["exercises"]))
            for nb in notebooks]
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.32 * len(notebooks) + 1.2))
    colours = ListedColormap(["white", "#e8e8e8", "#f5c26b", "#4caf50"])
    ax.imshow([[v + 1 for v in row] for row in grid], cmap=colours, vmin=0, vmax=3, aspect="auto")
    ax.set_yticks(range(len(notebooks)), [nb["notebook"].removesuffix("_exercises") for nb in notebooks], fontsize=8)
    ax.set_xticks(range(width), [f"ex {i + 1}" for i in range(width)], fontsize=8)
    ax.legend(handles=[Patch(color=c, label=s) for c, s in zip(("#e8e8e8", "#f5c26b", "#4caf50"),
                                                                (NOT_STARTED, TRIED, PASSED))],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title("Your exercises (this machine's progress record)", fontsize=10)
    return ax


def _minutes(t0: str, t1: str) -> float:
    parse = lambda t: datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ")   # noqa: E731
    return (parse(t1) - parse(t0)).total_seconds() / 60


def medians(records: list[dict], course: dict | None = None) -> dict:
    """Median minutes per exercise (test grade_id) over learners' records: from the learner's previous milestone
    (the notebook opened, or the previous exercise's first pass, whichever came later) to the first pass.
    Learners who never passed an exercise, or left no milestone before it, do not count for it."""
    course = course or catalog.load()
    times: dict = {}
    for data in records:
        for nb in course["notebooks"]:
            opened = sorted(o["time"] for o in data["opened"] if o["notebook"] == nb["notebook"])
            previous = None
            for ex in nb["exercises"]:
                passes = sorted(a["time"] for a in data["attempts"] if a["test"] == ex["test"] and a["passed"])
                if not passes:
                    previous = None
                    continue
                starts = [t for t in opened if t <= passes[0]] + ([previous] if previous else [])
                if starts:
                    times.setdefault(ex["test"], []).append(_minutes(max(starts), passes[0]))
                previous = passes[0]
    return {test: statistics.median(values) for test, values in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib progress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reset", metavar="EXERCISE|NOTEBOOK|all",
                        help="forget one exercise (its grade_id), one notebook's exercises, or all")
    parser.add_argument("--medians", nargs="+", metavar="FILE", help="progress files learners chose to share")
    args = parser.parse_args(argv)
    if args.medians:
        records = []
        for name in args.medians:
            try:
                records.append(json.loads(open(name, encoding="utf-8").read()))
            except (OSError, ValueError) as exc:
                print(f"error: {name}: {exc}", file=sys.stderr)
                return 2
        found = medians(records)
        for nb in catalog.load()["notebooks"]:
            for ex in nb["exercises"]:
                if ex["test"] in found:
                    print(f"{nb['notebook']:<44} {ex['title']:<46} median {found[ex['test']]:5.1f} min "
                          f"(the header: {nb['minutes']} min for the notebook)")
        print(f"over {len(records)} shared record{'s' if len(records) != 1 else ''}")
        return 0
    if args.reset:
        target = None if args.reset == "all" else args.reset
        if target is not None:
            try:
                catalog.exercise(target)
            except KeyError:
                if target not in {nb["notebook"] for nb in catalog.load()["notebooks"]}:
                    print(f"error: --reset {target!r}: not an exercise's grade_id, a notebook's name or 'all'",
                          file=sys.stderr)
                    return 2
        removed = record.reset(target)
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {record.path()}")
        return 0
    print(f"Progress record: {record.path()}" + ("" if record.enabled() else " (recording is off: COURSE_PROGRESS)"))
    print(table())
    return 0
