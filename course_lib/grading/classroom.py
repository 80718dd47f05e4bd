"""Grade a whole class in one command: parallel, resumable, with a gradebook and feedback.

    python -m course_lib.grade SUBMISSIONS_DIR --out RESULTS_DIR [--jobs N] [--source NB] [--force]

SUBMISSIONS_DIR holds the class's notebooks: flat (`alice.ipynb`: the student is the file's name),
one folder per student (`alice/07_ddp_exercises.ipynb`), or nbgrader's `submitted/` layout
(`alice/ps3/07_ddp_exercises.ipynb`). Each submission is graded exactly as the single-notebook form
grades it (course_lib.grading.grade: the student's code in a jailed sandbox with resource limits,
the tests here), in a process of its own forked from this one (torch is imported once, not per
submission), at most N at a time; the default N is one per 2 cores, what a scale-out practicum
needs. RESULTS_DIR gets, per submission, its folder (the submission's path without `.ipynb`) with
`grade.json` (the record: content hash, status, seconds, the report), `results.json` (Gradescope's
format) and `grader.log`; per student `feedback.md`; and `gradebook.csv`, `summary.txt` and
`totals.png`. Rerun after an interruption: only submissions that are new, changed (a hash of the
submission, its source and the grading settings, per-student variants included) or not finished
are graded; `--force` regrades all. Each submission is graded as its student (the file's or folder's
name), so practica with per-student variants get that student's parameters.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..processes import kill_tree
from . import gradebook, variants
from .grade import Report, find_source, grade, is_test, read_notebook
from .limits import Limits

FINAL = ("graded", "unreadable", "no source")   # a rerun keeps these; "timeout" and "grader error" are retried
SLACK_S = 60.0                                  # past the notebook's own deadline, the grader's process is killed


def default_jobs() -> int:
    """One submission per 2 cores (a scale-out practicum runs 2 ranks), at least 1."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


@dataclass
class Submission:
    path: Path
    student: str
    folder: str          # where its results go, relative to RESULTS_DIR


def find_submissions(root) -> list[Submission]:
    """Every .ipynb under `root` at depth 1 to 3 (hidden folders and .ipynb_checkpoints skipped)."""
    root = Path(root)
    found = []
    for path in sorted(root.rglob("*.ipynb")):
        parts = path.relative_to(root).parts
        if any(p.startswith(".") for p in parts) or len(parts) > 3:
            continue
        folder = "/".join([*parts[:-1], path.stem])
        found.append(Submission(path, parts[0] if len(parts) > 1 else path.stem, folder))
    return found


def content_hash(submission: Path, source: Path | None, settings: dict) -> str:
    h = hashlib.sha256()
    for blob in (submission.read_bytes(), source.read_bytes() if source else b"",
                 json.dumps(settings, sort_keys=True).encode()):
        h.update(hashlib.sha256(blob).digest())
    return h.hexdigest()


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _record(sub: Submission, key: str, status: str, report: Report, notebook: str, why: str = "") -> dict:
    return {"hash": key, "student": sub.student, "notebook": notebook, "folder": sub.folder, "status": status,
            "seconds": report.seconds, "why": why, "report": asdict(report)}


def _ungraded(sub: Submission, source: Path | None, status: str, why: str, seconds: float) -> Report:
    """A report with every test at 0 points, for a submission the grader could not finish."""
    report = Report(str(sub.path), str(source or ""), error=why, seconds=round(seconds, 1))
    if source is not None:
        for cell in read_notebook(source).cells:
            if is_test(cell):
                meta = cell.metadata["nbgrader"]
                report.max_points[meta["grade_id"]] = float(meta.get("points", 0))
                report.points[meta["grade_id"]], report.status[meta["grade_id"]] = 0.0, status
        report.max_score = sum(report.max_points.values())
    return report


def _child(sub: Submission, source: Path, key: str, out: Path, cell_timeout: float, timeout: float,
           limits: Limits) -> None:
    """In the forked process: grade one submission, write its record atomically, exit."""
    log = os.open(out / sub.folder / "grader.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    report = grade(sub.path, source, cell_timeout, timeout, limits, student=sub.student)   # its variant
    status = "unreadable" if report.error else "graded"
    gradebook.atomic_write(out / sub.folder / "grade.json",
                           json.dumps(_record(sub, key, status, report, source.name)) + "\n")


def grade_class(root, out, jobs: int | None = None, source=None, cell_timeout: float = 120.0,
                timeout: float = 900.0, limits: Limits | None = None, force: bool = False,
                progress: bool = True) -> list[dict]:
    """Grade every submission under `root` into `out` (see the module docstring); returns the records."""
    root, out, limits = Path(root), Path(out), limits or Limits()
    jobs = default_jobs() if jobs is None else jobs
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, got {jobs!r}")
    if not root.is_dir():
        raise FileNotFoundError(f"the submissions folder {root} does not exist")
    subs = find_submissions(root)
    if not subs:
        raise FileNotFoundError(f"no .ipynb under {root} (flat, STUDENT/*.ipynb or STUDENT/ASSIGNMENT/*.ipynb)")
    if out.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"--out {out} is inside the submissions folder {root}: pick a folder beside it")
    settings = {"cell_timeout": float(cell_timeout), "timeout": float(timeout), "limits": asdict(limits),
                "variants": variants.VARIANTS}   # a changed variant table regrades the practica
    records, todo, sources, unmatched = {}, [], {}, []

    def queue(sub, src):
        key = content_hash(sub.path, src, settings)
        old = _load(out / sub.folder / "grade.json")
        if not force and old and old.get("hash") == key and old.get("status") in FINAL:
            records[sub.folder] = old
        else:
            todo.append((sub, src, key))

    for sub in subs:
        (out / sub.folder).mkdir(parents=True, exist_ok=True)
        try:
            nb, unreadable = read_notebook(sub.path), ""
        except ValueError as exc:
            nb, unreadable = None, str(exc)
        try:
            sources[sub.folder] = find_source(sub.path, nb, source)
            queue(sub, sources[sub.folder])
        except (FileNotFoundError, ValueError) as exc:
            unmatched.append((sub, unreadable, str(exc)))
    for sub, unreadable, no_source in unmatched:
        # Its assignment is the one its classmates handed in (in its ASSIGNMENT/ folder, or the whole class):
        # graded 0 of those points, the student's feedback says what is wrong with the file, and the advice to
        # the instructor (--source) goes to the summary only.
        src = _assignment_of(sub, sources)
        if unreadable and src:
            queue(sub, src)
            continue
        error = unreadable or (f"{sub.path.name} is not one of this course's assignments: neither its name nor its "
                               "cells' grade_ids match one (was it renamed, or made from another notebook?)")
        report = _ungraded(sub, src, "failed", error, 0.0)
        records[sub.folder] = _record(sub, content_hash(sub.path, src, settings),
                                      "unreadable" if unreadable else "no source", report,
                                      src.name if src else sub.path.name, no_source)
        gradebook.atomic_write(out / sub.folder / "grade.json", json.dumps(records[sub.folder]) + "\n")
    _run(todo, out, jobs, cell_timeout, timeout, limits, records, len(subs), progress)
    result = [records[s.folder] for s in subs if s.folder in records]
    gradebook.write_all(out, result)
    return result


def _assignment_of(sub: Submission, sources: dict) -> Path | None:
    """The one source that the other submissions of `sub`'s assignment matched, if they agree on one."""
    assignment = Path(sub.folder).parts[1:2] if len(Path(sub.folder).parts) == 3 else None   # STUDENT/ASSIGNMENT/nb
    peers = {src for folder, src in sources.items() if assignment is None or Path(folder).parts[1:2] == assignment}
    return peers.pop() if len(peers) == 1 else None


def _run(todo, out, jobs, cell_timeout, timeout, limits, records, total, progress) -> None:
    from tqdm import tqdm
    # fork: the children inherit torch and the jail's probes already loaded here; no thread runs here
    ctx, running = multiprocessing.get_context("fork"), {}
    tqdm.monitor_interval = 0   # no monitor thread in a process that forks
    bar = tqdm(total=total, initial=total - len(todo), unit="nb", desc="grading", disable=not progress or None,
               file=sys.stderr, dynamic_ncols=True)
    queue = list(todo)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                sub, src, key = queue.pop(0)
                proc = ctx.Process(target=_child, args=(sub, src, key, out, cell_timeout, timeout, limits),
                                   daemon=False)
                proc.start()
                running[proc.sentinel] = (proc, sub, src, key, time.monotonic())
            multiprocessing.connection.wait(list(running), timeout=1.0)
            for sentinel, (proc, sub, src, key, started) in list(running.items()):
                seconds = time.monotonic() - started
                if proc.is_alive() and seconds < timeout + SLACK_S:
                    continue
                if proc.is_alive():
                    kill_tree(proc.pid)
                proc.join()
                del running[sentinel]
                record = _load(out / sub.folder / "grade.json")
                if not record or record.get("hash") != key:
                    status = "timeout" if seconds >= timeout + SLACK_S else "grader error"
                    why = (f"grading took over {timeout + SLACK_S:.0f} s and was stopped" if status == "timeout" else
                           f"the grader's process ended with code {proc.exitcode} (see grader.log)")
                    record = _record(sub, key, status, _ungraded(sub, src, status, why, seconds), src.name, why)
                    gradebook.atomic_write(out / sub.folder / "grade.json", json.dumps(record) + "\n")
                records[sub.folder] = record
                bar.update(1)
    finally:
        for proc, *_ in running.values():   # interrupted: nothing of ours outlives this call
            kill_tree(proc.pid)
            proc.join()
        bar.close()
