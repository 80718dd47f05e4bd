"""The learner's own progress record: one small JSON file, written on this machine only, never read by a grader.

Where: `$COURSE_PROGRESS_DIR/progress.json`, else `$XDG_DATA_HOME/course_lib/progress.json`, else
`~/.local/share/course_lib/progress.json`. On Colab that is /root/.local/share/course_lib (gone when the runtime
is recycled; point COURSE_PROGRESS_DIR at a mounted Drive folder to keep it); on Binder it goes with the session.
`COURSE_PROGRESS=off` (or 0, false, no) records nothing; nor does nbgrader's autograde (NBGRADER_EXECUTION=autograde:
a TA's machine running the students' notebooks, whose checks are not the TA's progress).

What: per check call, the test's grade_id, the notebook, passed or not, the attempt number, the UTC time and the
first 16 hex digits of the sha256 of the answer cell's source (never the source); per exercise notebook opened,
its name and the time (for the time-per-exercise medians). The practica are never recorded: they are graded.

    {"format": 1, "attempts": [{"test": ..., "notebook": ..., "passed": false, "attempt": 1, "time": ...,
                                "answer_sha256": "3f2a..."}], "opened": [{"notebook": ..., "time": ...}]}

Two kernels checking at once lose nothing: every write holds an exclusive lock (fcntl.flock on a sibling .lock
file), re-reads, appends and replaces the file atomically (temporary file, fsync, os.replace). Nothing here
raises into a learner's check: an unwritable folder, a full disk or no home folder (HOME empty) prints one note
per process and records nothing; a corrupt or hand-edited file is renamed aside (progress.json.corrupt-<UTC
stamp>), named in one note, and a fresh record starts.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import tempfile
from pathlib import Path

FORMAT = 1
OFF = {"off", "0", "false", "no"}
_NOTES: set = set()     # notes already printed in this process


def path() -> Path:
    """The progress file this process reads and writes."""
    if os.environ.get("COURSE_PROGRESS_DIR"):
        return Path(os.environ["COURSE_PROGRESS_DIR"]) / "progress.json"
    home = os.path.expanduser("~") if os.environ.get("HOME", "unset") else ""    # HOME="": no home
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return Path(base) / "course_lib" / "progress.json"


def enabled() -> bool:
    return (os.environ.get("COURSE_PROGRESS", "").strip().lower() not in OFF
            and os.environ.get("NBGRADER_EXECUTION") != "autograde")


def _note(text: str, kind: str | None = None) -> None:
    """Print `text` once per process (once per `kind` when given: one "not recorded" note, whatever the cause)."""
    if (kind or text) not in _NOTES:
        _NOTES.add(kind or text)
        print(f"note: {text}")


def _now(now=None) -> str:
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def valid(data) -> bool:
    """Whether `data` is a record this module wrote (format, lists, every entry's keys and types)."""
    attempt_keys = {"test": str, "notebook": str, "passed": bool, "attempt": int, "time": str}
    return (isinstance(data, dict) and data.get("format") == FORMAT
            and isinstance(data.get("attempts"), list) and isinstance(data.get("opened"), list)
            and all(isinstance(a, dict) and all(isinstance(a.get(k), t) for k, t in attempt_keys.items())
                    and isinstance(a.get("answer_sha256"), (str, type(None))) for a in data["attempts"])
            and all(isinstance(o, dict) and isinstance(o.get("notebook"), str) and isinstance(o.get("time"), str)
                    for o in data["opened"]))


def _empty() -> dict:
    return {"format": FORMAT, "attempts": [], "opened": []}


def load(file: Path | None = None) -> dict:
    """The record (empty when there is none); a file that is not a valid record is set aside, never raised."""
    file = file or path()
    try:
        return _read(file)
    except OSError as exc:
        _note(f"progress not read: {exc.strerror or exc} ({file})", kind="unread")
        return _empty()


def _has_home(file: Path) -> None:
    """OSError when there is no home folder to keep the record in (HOME="": not the notebooks' folder, not /)."""
    if not file.is_absolute():
        raise OSError(f"no home folder (HOME={os.environ.get('HOME')!r}; set COURSE_PROGRESS_DIR)")


def _read(file: Path) -> dict:
    """load() that raises OSError when the file is there but cannot be read (a writer must not replace it), or
    when there is no home folder to look in."""
    _has_home(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _empty()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if valid(data):
        return data
    if not enabled():       # off writes nothing, not even a rename
        _note(f"{file} is not a valid progress record; left as it is (recording is off)")
        return _empty()
    aside = file.with_name(f"{file.name}.corrupt-{_now().replace(':', '')}")
    while aside.exists():       # set aside twice in one second: keep both
        aside = aside.with_name(aside.name + "+")
    try:
        os.replace(file, aside)
        _note(f"{file} was not a progress record this course wrote (edited by hand, or cut short): "
              f"set aside as {aside.name}; a new record starts")
    except OSError as exc:
        _note(f"{file} is not a valid progress record and could not be set aside ({exc}); ignoring it")
    return _empty()


@contextlib.contextmanager
def _locked(file: Path):
    import fcntl
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file.with_name(file.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write(file: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".progress-", dir=file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _update(change) -> dict | None:
    """Apply change(record) -> entry under the lock and write; None (one note) when off or not writable."""
    if not enabled():
        return None
    file = path()
    try:
        _has_home(file)                 # before making any folder
        with _locked(file):
            data = _read(file)
            entry = change(data)
            _write(file, data)
            return entry
    except (OSError, ImportError) as exc:     # ImportError: no fcntl (Windows) - say so rather than race
        _note(f"progress not recorded: {getattr(exc, 'strerror', None) or exc} ({file})", kind="unrecorded")
        return None


def _exercise(grade_id: str) -> tuple[dict, dict] | None:
    """The catalog's (notebook, exercise) of an answer's or a test's grade_id; None for an id it does not hold
    (or no catalog at all: never an error here)."""
    from . import catalog
    try:
        return catalog.exercise(grade_id)
    except (KeyError, OSError, ValueError):
        return None


def record(test_id: str, passed: bool, answer_source: str | None = None, notebook: str | None = None,
           now=None) -> dict | None:
    """Append one check call's outcome; the attempt number counts this test's earlier calls; `notebook` defaults
    to the catalog's (an answer's grade_id is recorded as its test's). None when not recorded (off, a practicum,
    an unwritable folder)."""
    if not enabled():
        return None
    known = _exercise(test_id)
    if known is not None:
        if known[0]["practicum"]:
            return None
        test_id, notebook = known[1]["test"], notebook or known[0]["notebook"]
    notebook = notebook or ""
    digest = hashlib.sha256(answer_source.encode()).hexdigest()[:16] if answer_source is not None else None

    def change(data):
        entry = {"test": test_id, "notebook": notebook, "passed": bool(passed),
                 "attempt": 1 + sum(a["test"] == test_id for a in data["attempts"]), "time": _now(now),
                 "answer_sha256": digest}
        data["attempts"].append(entry)
        return entry
    return _update(change)


def record_open(notebook: str, now=None) -> dict | None:
    """Note that an exercise notebook was opened (its first cell ran)."""
    def change(data):
        entry = {"notebook": notebook, "time": _now(now)}
        data["opened"].append(entry)
        return entry
    return _update(change)


def failures_since_pass(test_id: str, data: dict | None = None) -> int:
    """Failed calls of `test_id` after its last pass (all of them if it never passed)."""
    count = 0
    for a in (data or load())["attempts"]:
        if a["test"] == test_id:
            count = 0 if a["passed"] else count + 1
    return count


def has_passed(test_id: str, data: dict | None = None) -> bool:
    return any(a["test"] == test_id and a["passed"] for a in (data or load())["attempts"])


def reset(notebook: str | None = None, test_id: str | None = None) -> int:
    """Forget one exercise (`test_id`: its test's or its answer's grade_id), one notebook's attempts and openings,
    or, with neither, everything; how many entries went (0 when recording is off or the file is not writable)."""
    if notebook is not None and test_id is not None:
        raise ValueError("reset: give notebook or test_id, not both")
    tests = {test_id, f"{test_id}_test"} if test_id is not None else set()

    def change(data):
        before = len(data["attempts"]) + len(data["opened"])
        if notebook is None and test_id is None:
            data["attempts"], data["opened"] = [], []
        else:
            data["attempts"] = [a for a in data["attempts"] if a["notebook"] != notebook and a["test"] not in tests]
            data["opened"] = [o for o in data["opened"] if o["notebook"] != notebook]
        return before - len(data["attempts"]) - len(data["opened"])
    return _update(change) or 0
