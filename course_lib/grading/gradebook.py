"""What a class's grading leaves for the TA: a gradebook, feedback per student, Gradescope results, a summary.

All of it is rebuilt from the per-submission records (`grade.json`, see classroom) every time, so a
resumed run writes the same files as an uninterrupted one and never counts a submission twice.
Feedback shows each test's points and the message its check gave, never the hidden tests' source.
"""
from __future__ import annotations

import csv
import io
import json
import os
import statistics
import tempfile
from pathlib import Path

from ..checkpoint import atomic_write_bytes

STATUSES = ("graded", "unreadable", "timeout", "grader error", "no source")


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a TA's rerun never reads half a file), readable as the
    umask allows (the temporary file is 0600)."""
    atomic_write_bytes(path, text.encode("utf-8"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def gradebook_csv(records: list[dict]) -> str:
    """One row per submission: student, notebook, points per grade_id, total, max, status, seconds."""
    grade_ids = list(dict.fromkeys(g for r in records for g in r["report"].get("max_points", {})))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student", "notebook", *grade_ids, "total", "max", "status", "seconds"])
    for r in sorted(records, key=lambda r: (r["student"], r["notebook"])):
        points = r["report"].get("points", {})
        writer.writerow([r["student"], r["notebook"], *(_num(points[g]) if g in points else "" for g in grade_ids),
                         _num(r["report"].get("score", 0.0)), _num(r["report"].get("max_score", 0.0)),
                         r["status"], f"{r['seconds']:.1f}"])
    return out.getvalue()


def _num(x: float) -> str:
    return f"{x:g}"


def feedback_markdown(student: str, records: list[dict]) -> str:
    """A student's feedback: per notebook, each test passed or not and why, and notes about the answers."""
    lines = [f"# Feedback for {student}", ""]
    for r in sorted(records, key=lambda r: r["notebook"]):
        rep = r["report"]
        lines += [f"## {r['notebook']}: {_num(rep.get('score', 0))} / {_num(rep.get('max_score', 0))} points", ""]
        if r["status"] != "graded":
            lines += [f"**Not graded normally ({r['status']}):** {rep.get('error') or r.get('why', '')}", ""]
        if rep.get("points"):
            lines += ["| test | points | result | what the check said |", "|---|---|---|---|"]
            for grade_id, got in rep["points"].items():
                message = " ".join(rep.get("messages", {}).get(grade_id, "").split())[:300].replace("|", "\\|")
                lines.append(f"| `{grade_id}` | {_num(got)} / {_num(rep['max_points'][grade_id])} | "
                             f"{rep['status'].get(grade_id, '')} | {message} |")
            lines.append("")
        lines += [f"- {note}" for note in rep.get("notes", [])]
        lines.append("")
    return "\n".join(lines)


def gradescope_results(record: dict) -> dict:
    """Gradescope's autograder results.json: score, execution_time, output, and one entry per test."""
    rep = record["report"]
    tests = [{"name": grade_id, "score": got, "max_score": rep["max_points"][grade_id],
              "status": "passed" if rep["status"].get(grade_id) == "passed" else "failed",
              "output": rep.get("messages", {}).get(grade_id, "") or rep["status"].get(grade_id, ""),
              "visibility": "visible"} for grade_id, got in rep.get("points", {}).items()]
    output = "\n".join(filter(None, [rep.get("error", ""), *rep.get("notes", [])]))
    return {"score": rep.get("score", 0.0), "execution_time": round(record["seconds"], 1), "output": output,
            "tests": tests}


def summary(records: list[dict], slowest: int = 3) -> str:
    """Mean, median and a text histogram of the totals; the slowest and the not normally graded submissions."""
    if not records:
        return "no submissions"
    totals = [r["report"].get("score", 0.0) for r in records]
    top = max((r["report"].get("max_score", 0.0) for r in records), default=0.0)
    lines = [f"{len(records)} submissions: mean {statistics.mean(totals):.2f}, median {statistics.median(totals):g}"
             f" of {top:g} points"]
    for low, high, count in histogram(totals, top):
        lines.append(f"  {low:6.1f}-{high:<6.1f} {'#' * count} {count}")
    by_time = sorted(records, key=lambda r: -r["seconds"])[:slowest]
    lines.append("slowest: " + ", ".join(f"{r['student']}/{r['notebook']} {r['seconds']:.0f} s" for r in by_time))
    odd = [r for r in records if r["status"] != "graded"]
    lines.append("not graded normally: " + (", ".join(f"{r['student']}/{r['notebook']} ({r['status']})" for r in odd)
                                            if odd else "none"))
    lines += [f"  {r['student']}/{r['notebook']}: {r['why']}" for r in odd if r.get("why")]   # for the instructor
    return "\n".join(lines)


def histogram(totals: list[float], top: float, bins: int = 5) -> list[tuple[float, float, int]]:
    """(low, high, count) for `bins` equal ranges of [0, top]; the last range includes top."""
    top = top or max(totals, default=1.0) or 1.0
    width = top / bins
    counts = [0] * bins
    for t in totals:
        counts[min(int(t / width), bins - 1) if t > 0 else 0] += 1
    return [(i * width, (i + 1) * width, c) for i, c in enumerate(counts)]


def plot_totals(records: list[dict], path: Path, title: str) -> None:
    """A histogram of the totals, saved beside the gradebook."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    totals = [r["report"].get("score", 0.0) for r in records]
    top = max((r["report"].get("max_score", 0.0) for r in records), default=0.0) or max(totals, default=1.0)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(totals, bins=[top * i / 10 for i in range(11)] if top else 10, color="tab:blue", edgecolor="white")
    ax.set(xlabel="total points", ylabel="submissions", title=title)
    fig.tight_layout()
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.stem}.", suffix=".png", delete=False) as f:
        fig.savefig(f.name, dpi=100)
    plt.close(fig)
    os.replace(f.name, path)


def write_all(out: Path, records: list[dict]) -> None:
    """gradebook.csv, totals.png, summary.txt, and per submission results.json, per student feedback.md."""
    atomic_write(out / "gradebook.csv", gradebook_csv(records))
    atomic_write(out / "summary.txt", summary(records) + "\n")
    if records:
        notebooks = sorted({r["notebook"] for r in records})
        plot_totals(records, out / "totals.png", f"{len(records)} submissions of {', '.join(notebooks)[:60]}")
    by_student: dict[str, list] = {}
    for r in records:
        by_student.setdefault(r["student"], []).append(r)
        atomic_write(out / r["folder"] / "results.json", json.dumps(gradescope_results(r), indent=1) + "\n")
    for student, rs in by_student.items():
        atomic_write(out / rs[0]["folder"].split("/")[0] / "feedback.md", feedback_markdown(student, rs))
