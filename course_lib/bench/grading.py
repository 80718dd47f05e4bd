"""Grading benchmark: a class of exercise-07 submissions graded with --jobs 1 and --jobs 2, side by side.

    python -m course_lib.bench grading --json    # keys seconds_per_submission_jobs1/2, speedup, projected_200_min

The class: copies of the solution (full points), of the student version (zero) and of the solution with
one answer reverted to its stub (partly right), in the flat layout; graded from the course's root with
the instructor's sources in solutions/. Exercise 07 is the DDP exercise: its checks launch 2 gloo ranks,
as a scale-out practicum does, so it is the heavy case the `--jobs` default (one per 2 cores) is for.
The projection for 200 submissions uses the faster of the two; a machine with more cores runs more jobs.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from ..grading import classroom
from ..grading.remote import COURSE_ROOT
from .result import BenchResult

NOTEBOOK = "07_ddp_exercises.ipynb"


def make_class(folder: Path, size: int) -> Path:
    """`size` submissions of exercise 07 in `folder`/submissions: full, untouched and partly right in turn."""
    solution = json.loads((COURSE_ROOT / "solutions" / NOTEBOOK).read_text())
    student = json.loads((COURSE_ROOT / "exercises" / NOTEBOOK).read_text())
    stubs = {c["metadata"]["nbgrader"]["grade_id"]: c["source"] for c in student["cells"]
             if c["metadata"].get("nbgrader", {}).get("solution")}
    partly = json.loads(json.dumps(solution))
    first = next(c for c in partly["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    first["source"] = stubs[first["metadata"]["nbgrader"]["grade_id"]]
    subs = folder / "submissions"
    subs.mkdir(parents=True)
    for i in range(size):
        nb = (solution, student, partly)[i % 3]
        (subs / f"student{i:02d}.ipynb").write_text(json.dumps(nb))
    return subs


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """Grade the same class twice (data_dir is unused: the sandboxes read the course's data folder)."""
    size = 4 if quick else 8
    rows, seconds = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        subs = make_class(Path(tmp), size)
        for jobs in (1, 2):
            out = Path(tmp) / f"out{jobs}"
            start = time.perf_counter()
            records = classroom.grade_class(subs, out, jobs=jobs, source=COURSE_ROOT / "solutions" / NOTEBOOK,
                                            progress=False)
            seconds[jobs] = time.perf_counter() - start
            totals = sorted({r["report"]["score"] for r in records})
            rows.append({"jobs": jobs, "submissions": size, "seconds": round(seconds[jobs], 1),
                         "s / submission": round(seconds[jobs] / size, 1), "distinct totals": str(totals)})
            shutil.rmtree(out)
    per = min(seconds.values()) / size
    summary = {"submissions": size, "seconds_per_submission_jobs1": round(seconds[1] / size, 2),
               "seconds_per_submission_jobs2": round(seconds[2] / size, 2),
               "speedup": round(seconds[1] / seconds[2], 2), "projected_200_min": round(200 * per / 60, 1),
               "quick": quick}
    return BenchResult(f"Grading {size} submissions of {NOTEBOOK}, --jobs 1 vs 2 "
                       f"(projected for 200: {summary['projected_200_min']} min)", rows, summary)
