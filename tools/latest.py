"""The course's suite on the newest releases: which packages moved, and which tests broke.

A term runs on requirements.lock; the world moves on. This resolves pyproject.toml to the newest releases
(_build/latest/requirements.lock), installs them into .venv-latest, runs the same `make test` there, and
prints the packages that moved and each broken test with the moved packages its traceback passes through.

    make latest        # python tools/latest.py: report only (exit 1 when a test broke)
    make upgrade       # python tools/latest.py --adopt: the same, then the new lock replaces requirements.lock
                       # (and binder/requirements.txt) when the suite passed
"""
from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lock  # noqa: E402

OUT = lock.ROOT / "_build" / "latest"
VENV = lock.ROOT / ".venv-latest"


def broken(junit: Path) -> list[tuple[str, str]]:
    """(test id, failure text) for each failed or errored test case in a JUnit XML report."""
    found = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        for bad in (*case.findall("failure"), *case.findall("error")):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            found.append((test, (bad.get("message") or "") + "\n" + (bad.text or "")))
    return found


def suspects(text: str, moved: list[tuple[str, str, str]]) -> list[str]:
    """The moved packages whose installed files appear in a traceback (site-packages/<module>/...)."""
    seen = set(re.findall(r"site-packages[/\\]([A-Za-z0-9_]+)", text))
    return [name for name, _, _ in moved if name.replace("-", "_") in seen or name.split("-")[0] in seen]


def report_moved(moved, out=sys.stdout) -> None:
    print(f"\n{len(moved)} package(s) moved from requirements.lock:", file=out)
    for name, old, new in moved:
        print(f"  {name:32} {old:>16} -> {new}", file=out)


def report(moved, failures, out=sys.stdout) -> None:
    report_moved(moved, out)
    if not failures:
        print("\nThe suite passed on the newest releases.", file=out)
        return
    print(f"\n{len(failures)} test(s) broke on the newest releases:", file=out)
    for test, text in failures:
        names = suspects(text, moved)
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        print(f"  {test}\n      {first[:160]}\n      moved packages in its traceback: {', '.join(names) or 'none'}",
              file=out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/latest.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--adopt", action="store_true", help="when the suite passes, make the new lock the course's")
    parser.add_argument("--no-resolve", action="store_true", help=f"reuse {OUT.relative_to(lock.ROOT)}/requirements.lock")
    args = parser.parse_args(argv)
    new_lock, junit = OUT / "requirements.lock", OUT / "junit.xml"
    if not args.no_resolve:
        new_lock.unlink(missing_ok=True)
        lock.main(["--upgrade", "--out", str(new_lock)])
    moved = lock.moved(lock.LOCK, new_lock)
    junit.unlink(missing_ok=True)
    run = subprocess.run(["make", "test", f"VENV={VENV}", f"LOCK={new_lock}", f"PYTEST_ARGS=--junitxml={junit}"],
                         cwd=lock.ROOT)
    if not junit.is_file():
        print(f"\nThe newest releases did not install, or the suite did not start (make exited {run.returncode}).")
        report_moved(moved)
        return 1
    failures = broken(junit)
    text = io.StringIO()
    report(moved, failures, text)
    print(text.getvalue())
    if os.environ.get("GITHUB_STEP_SUMMARY"):   # the scheduled workflow's run page shows it
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as summary:
            summary.write("```\n" + text.getvalue() + "\n```\n")
    if run.returncode == 0 and not failures and args.adopt:
        shutil.copy(new_lock, lock.LOCK)
        lock.BINDER.write_text(lock.binder_requirements(lock.LOCK))
        print(f"Adopted: {lock.LOCK.name} and {lock.BINDER.relative_to(lock.ROOT)} now pin the newest releases; "
              "run `make test` once more and commit both.")
    return 0 if run.returncode == 0 and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
