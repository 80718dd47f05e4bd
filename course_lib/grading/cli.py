"""The command line: `python -m course_lib.grade SUBMISSION.ipynb | SUBMISSIONS_DIR [options]`.

One notebook: course_lib.grading.grade (its docstring says what runs where). A folder: a class,
course_lib.grading.classroom. Exit status: 0 graded; 1 graded 0 because the submission is not a
readable notebook (a class: some submission was not graded normally); 2 nothing to grade or no source.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from . import classroom
from .grade import __doc__ as GRADE_DOC
from .grade import format_report, grade, write_report
from .gradebook import atomic_write, gradescope_results
from .limits import Limits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m course_lib.grade", description=GRADE_DOC.split("\n\n")[0])
    p.add_argument("submission", help="the student's .ipynb, or a folder of submissions (a class)")
    p.add_argument("--source", default=None, help="the instructor's notebook (default: see COURSE_SOLUTIONS_DIR)")
    p.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    p.add_argument("--report", default=None, help="also write that JSON object to this file (atomically, once "
                                                   "every process of the submission is dead)")
    p.add_argument("--gradescope", default=None, help="also write Gradescope's results.json to this file")
    p.add_argument("--student", default=None, help="the student's id, for practica with per-student variants "
                                                   "(default: $COURSE_STUDENT_ID, else the defaults)")
    p.add_argument("--cell-timeout", type=float, default=120.0, help="seconds per cell")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole notebook")
    defaults = Limits()
    p.add_argument("--memory-mb", type=int, default=defaults.memory_mb, help="memory per student process (MB)")
    p.add_argument("--cpu-seconds", type=int, default=defaults.cpu_seconds, help="CPU time per student process")
    p.add_argument("--processes", type=int, default=defaults.processes, help="processes and threads (fork guard)")
    p.add_argument("--out", default=None, help="a class: the results folder (default: SUBMISSIONS_DIR-graded)")
    p.add_argument("--jobs", type=int, default=None, help="a class: submissions graded at once (default: one per "
                                                           "2 cores)")
    p.add_argument("--force", action="store_true", help="a class: regrade every submission, not only new or "
                                                        "changed ones")
    args = p.parse_args(argv)
    if not args.cell_timeout > 0 or not args.timeout > 0:
        p.error("--cell-timeout and --timeout must be > 0")
    try:
        limits = Limits(args.memory_mb, args.cpu_seconds, args.processes)
    except ValueError as exc:
        p.error(str(exc).replace("memory_mb", "--memory-mb").replace("cpu_seconds", "--cpu-seconds")
                .replace("processes", "--processes"))
    if Path(args.submission).is_dir():
        return _grade_class(args, limits)
    try:
        report = grade(args.submission, args.source, args.cell_timeout, args.timeout, limits, student=args.student)
    except (FileNotFoundError, ValueError) as exc:   # no submission, no source, or an unreadable source
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.report:
        write_report(report, args.report)
    if args.gradescope:
        atomic_write(Path(args.gradescope), json.dumps(gradescope_results(
            {"report": asdict(report), "seconds": report.seconds}), indent=1) + "\n")
    print(format_report(report))
    if args.json:
        print(json.dumps(asdict(report)))
    return 1 if report.error else 0


def _grade_class(args, limits: Limits) -> int:
    if args.jobs is not None and args.jobs < 1:
        print(f"error: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    out = Path(args.out or f"{Path(args.submission).resolve()}-graded")
    try:
        records = classroom.grade_class(args.submission, out, args.jobs, args.source, args.cell_timeout,
                                        args.timeout, limits, args.force)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print((out / "summary.txt").read_text().rstrip())
    print(f"gradebook: {out / 'gradebook.csv'}; feedback: {out}/<student>/feedback.md; histogram: {out / 'totals.png'}")
    return 0 if all(r["status"] in ("graded", "unreadable") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
