"""The learner's working copy: the exercise notebooks copied into `work/` (git ignores it), where answers are
typed, so that `git pull` never conflicts with them and `make test` keeps checking the untouched exercises/.

    python -m course_lib work create     # copy every exercise notebook not in work/ yet (make lab runs this)
    python -m course_lib work status     # per notebook: up to date / changed in exercises/ since the copy / missing
    python -m course_lib work update     # bring the changed exercises' new cells in beside your answers

work/NAME.ipynb sits at the same depth as exercises/NAME.ipynb, so its `../notebooks/...` links still resolve.
Each copy remembers what it was copied from, in its metadata `course_lib.base`: the course release, the time,
and per cell its key (nbgrader grade_id, else the cell id) and a hash of its source. From that, `update` tells
the learner's edits from the course's changes: an answer cell keeps the learner's source; a cell the learner
added stays after the cell it followed; a cell the learner left alone takes the new version; a cell removed
upstream goes unless the learner edited it (then it stays, and `update` says so); a changed locked test cell
takes the new version. Where a cell changed on both sides the new version comes in and the learner's stays
right after it. The learner's file is first saved as work/.backup/NAME.<UTC stamp>.ipynb; writes are atomic.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

UPDATE = "python -m course_lib work update"
CREATE = "python -m course_lib work create"


class WorkCopyError(ValueError):
    """What the learner must do something about (printed as one error line by `main`)."""


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _key(cell) -> str:
    """How a cell is recognised across versions: its nbgrader grade_id (kept through copy-and-paste), else its id."""
    grade_id = _nbgrader(cell).get("grade_id")
    return f"grade_id:{grade_id}" if grade_id else f"id:{cell.get('id')}"


def _describe(cell) -> str:
    grade_id = _nbgrader(cell).get("grade_id")
    line = next((s.strip() for s in _source(cell).splitlines() if s.strip()), "(empty)")
    line = line if len(line) <= 50 else line[:49] + "…"
    return f"{cell['cell_type']} cell {grade_id or repr(line)}"


def _stamp(now=None) -> str:
    return (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")


def release(course_root: Path) -> str:
    """The course release: pyproject.toml's [tool.course_lib] release, else the installed package's version."""
    pyproject = Path(course_root) / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    found = re.search(r'^\[tool\.course_lib\][^\[]*?^release\s*=\s*"([^"]+)"', text, re.M | re.S)
    if found:
        return found.group(1)
    from importlib.metadata import PackageNotFoundError, version
    with contextlib.suppress(PackageNotFoundError):
        return version("course_lib")
    return "unknown"


def base_of(nb: dict, course_release: str, now=None) -> dict:
    """What a copy remembers of the exercise it came from (stored as metadata.course_lib.base)."""
    for number, cell in enumerate(nb["cells"]):
        if not cell.get("id"):
            raise WorkCopyError(f"cell {number} of the exercise has no id (nbformat 4.5 cell ids): regenerate "
                                "exercises/ with python -m course_lib.exercises")
    cells = [{"key": _key(c), "id": c["id"], "sha256": _digest(_source(c))} for c in nb["cells"]]
    time = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"release": course_release, "time": time, "cells": cells}


def _read(path: Path) -> dict:
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
            raise ValueError("no cells")
        return nb
    except (ValueError, OSError) as exc:
        raise WorkCopyError(f"{path} is not a notebook this can read ({exc})") from None


def _write(path: Path, nb: dict, overwrite: bool) -> bool:
    """Write `nb` to `path` atomically (temporary file, fsync, rename). overwrite=False never replaces a file
    that exists, even one that appeared meanwhile (a hard link fails on it); returns whether it wrote."""
    umask = os.umask(0o022)
    os.umask(umask)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".ipynb.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(nb, f, indent=1, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if overwrite:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError:                    # a file system without hard links
            if path.exists():
                return False
            os.replace(tmp, path)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _exercises(source_dir: Path) -> list[Path]:
    found = sorted(Path(source_dir).glob("*.ipynb"))
    if not found:
        raise WorkCopyError(f"no exercise notebooks in {source_dir}: run this in the course's folder (where the "
                            "Makefile is), or say where they are with --from")
    return found


def _writable_folder(work_dir: Path) -> None:
    if work_dir.exists() and not work_dir.is_dir():
        raise WorkCopyError(f"{work_dir} is a file, not a folder: move it aside; your working copy goes there")
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=work_dir):
            pass
    except OSError as exc:
        raise WorkCopyError(f"cannot write your working copy in {work_dir} ({exc.strerror or exc}): make the "
                            f"folder yours and writable (chmod u+w {work_dir}), it is where your answers go") from None


def create(source_dir: Path = Path("exercises"), work_dir: Path = Path("work"), now=None) -> list[Path]:
    """Copy each exercise notebook that work_dir lacks; never touches one that exists. Returns the new copies."""
    source_dir, work_dir = Path(source_dir), Path(work_dir)
    sources = _exercises(source_dir)
    _writable_folder(work_dir)
    course_release = release(source_dir.resolve().parent)
    created = []
    for source in sources:
        target = work_dir / source.name
        if target.exists():
            continue
        nb = _read(source)
        nb.setdefault("metadata", {})["course_lib"] = {"base": base_of(nb, course_release, now)}
        try:
            wrote = _write(target, nb, overwrite=False)
        except OSError as exc:
            raise WorkCopyError(f"cannot write {target} ({exc.strerror or exc}): is the disk full, or the "
                                "folder not yours?") from None
        if wrote:
            created.append(target)
    return created


def changes(base: dict, upstream: dict) -> dict:
    """Cells of the exercise since the copy: {"new", "changed", "removed"} -> keys."""
    then = {c["key"]: c["sha256"] for c in base["cells"]}
    now = {_key(c): _digest(_source(c)) for c in upstream["cells"]}
    return {"new": [k for k in now if k not in then], "removed": [k for k in then if k not in now],
            "changed": [k for k in now if k in then and now[k] != then[k]]}


def _base(nb: dict, path: Path) -> dict:
    base = nb.get("metadata", {}).get("course_lib", {}).get("base")
    if not (isinstance(base, dict) and isinstance(base.get("cells"), list)
            and all(isinstance(c, dict) and isinstance(c.get("key"), str) and isinstance(c.get("sha256"), str)
                    for c in base["cells"])):
        raise WorkCopyError(
            f"{path} does not say which exercise version it was copied from (no course_lib base in its metadata: "
            f"copied by hand?), so update cannot tell your edits from the course's. Rename it (e.g. to "
            f"{path.stem}.mine.ipynb), run `{CREATE}` for a fresh copy and move your answers across")
    return base


def status(source_dir: Path = Path("exercises"), work_dir: Path = Path("work")) -> list[tuple[str, str, str]]:
    """(notebook, state, what to do) per exercise notebook; state: up to date, changed, missing or no base."""
    rows = []
    for source in _exercises(Path(source_dir)):
        copy = Path(work_dir) / source.name
        if not copy.exists():
            rows.append((source.stem, "missing", f"`{CREATE}` makes it"))
            continue
        try:
            diff = changes(_base(_read(copy), copy), _read(source))
        except WorkCopyError:
            rows.append((source.stem, "no base", "no course_lib metadata (copied by hand?): update cannot merge it"))
            continue
        counts = ", ".join(f"{len(v)} {k}" for k, v in diff.items() if v)
        rows.append((source.stem, "changed", f"in {source_dir} since your copy ({counts} cells): "
                     f"`{UPDATE} {source.stem}`") if counts else (source.stem, "up to date", ""))
    return rows


def _fresh(cell) -> dict:
    """A copy of an upstream cell (code: no outputs yet)."""
    return json.loads(json.dumps(cell))


def _beside(learner: dict, upstream: dict) -> dict:
    """The learner's cell (source, outputs) with the course's nbgrader metadata (points, locks) of `upstream`."""
    cell = _fresh(learner)
    if "nbgrader" in upstream.get("metadata", {}):
        cell.setdefault("metadata", {})["nbgrader"] = upstream["metadata"]["nbgrader"]
    return cell


def merge(learner: dict, upstream: dict, base: dict) -> tuple[dict, list[tuple[str, str]]]:
    """The learner's notebook with the exercise's new version brought in; and what happened, as (kind, text) with
    kind one of new / changed / removed / kept / both. Follows the exercise's cell order; see the module doc."""
    then = {c["key"]: c["sha256"] for c in base["cells"]}
    upstream_keys = {_key(c) for c in upstream["cells"]}
    events: list[tuple[str, str]] = []
    mine, attached, anchor, own = {}, {}, None, 0   # mine: key -> learner's cell; attached: anchor key -> cells
    for cell in learner["cells"]:
        key = _key(cell)
        if key in then and key not in mine:
            mine[key] = cell
            edited = _digest(_source(cell)) != then[key]
            if key in upstream_keys:
                anchor = key
            elif edited:
                attached.setdefault(anchor, []).append(_fresh(cell))
                events.append(("kept", f"{_describe(cell)}: removed from the exercise, kept since you edited it"))
            else:
                events.append(("removed", _describe(cell)))
        else:
            attached.setdefault(anchor, []).append(_fresh(cell))
            own += 1

    cells = list(attached.get(None, []))
    for new in upstream["cells"]:
        key = _key(new)
        old, changed = mine.get(key), key in then and _digest(_source(new)) != then[key]
        edited = old is not None and _digest(_source(old)) != then[key]
        if key not in then:
            cells.append(_fresh(new))
            events.append(("new", _describe(new)))
        elif old is None:                                    # the learner deleted it
            if changed:
                cells.append(_fresh(new))
                events.append(("changed", f"{_describe(new)} (you had deleted it: it is back)"))
        elif not edited:
            cells.append(_fresh(new) if changed else dict(_fresh(old), metadata=_fresh(new).get("metadata", {})))
            if changed:
                events.append(("changed", _describe(new)))
        elif not changed or _nbgrader(new).get("solution"):
            cells.append(_beside(old, new))
            if changed:
                events.append(("kept", f"your answer {_describe(new)}: kept; the exercise changed its starting "
                                       "code, see exercises/ for the new version"))
        elif _nbgrader(new).get("grade"):
            cells.append(_fresh(new))
            events.append(("changed", f"{_describe(new)}: the new test replaces your edit (it is in the backup)"))
        else:
            yours = _fresh(old)
            yours.get("metadata", {}).pop("nbgrader", None)      # one grade_id per notebook, or nbgrader refuses it
            cells += [_fresh(new), yours]
            events.append(("both", f"{_describe(new)}: changed in the exercise and by you: the new version, then "
                                   "yours right after it"))
        cells += attached.get(key, [])
    official, seen = {c["id"]: _key(c) for c in upstream["cells"]}, set()
    for cell in cells:      # ids stay unique, and an exercise cell's id is its own: a learner's cell gets a new one
        while cell.get("id") in seen or official.get(cell.get("id"), _key(cell)) != _key(cell):
            cell["id"] = uuid.uuid4().hex[:8]
        seen.add(cell["id"])
    answers = sum(1 for k, c in mine.items() if _nbgrader(c).get("solution") and _digest(_source(c)) != then[k])
    events.append(("kept", f"your answers: {answers}, cells you added: {own}"))
    merged = dict(learner, cells=cells, nbformat=upstream.get("nbformat", 4),
                  nbformat_minor=max(learner.get("nbformat_minor", 5), upstream.get("nbformat_minor", 5)))
    return merged, events


def update(source_dir: Path = Path("exercises"), work_dir: Path = Path("work"), names=(), now=None,
           out=None) -> int:
    """Merge the named (default: every) changed exercise into its working copy; prints what changed per notebook.
    Returns 0, or 1 when a copy was refused (missing, unreadable, or without base metadata)."""
    source_dir, work_dir, out = Path(source_dir), Path(work_dir), out or sys.stdout
    sources = {p.stem: p for p in _exercises(source_dir)}
    wanted = [Path(n).name.removesuffix(".ipynb") for n in names] or list(sources)
    unknown = [n for n in wanted if n not in sources]
    if unknown:
        raise WorkCopyError(f"NOTEBOOK must be one of the exercise notebooks {sorted(sources)}; got {unknown}")
    course_release, refused, updated, current = release(source_dir.resolve().parent), 0, 0, []
    for name in wanted:
        copy = work_dir / f"{name}.ipynb"
        if not copy.exists():
            print(f"{copy}: missing: `{CREATE}` makes it", file=out)
            refused += 1
            continue
        upstream = _read(sources[name])
        try:
            learner = _read(copy)
            base = _base(learner, copy)
        except WorkCopyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            refused += 1
            continue
        if not any(changes(base, upstream).values()):
            current.append(name)
            continue
        merged, events = merge(learner, upstream, base)
        merged.setdefault("metadata", {})["course_lib"] = {"base": base_of(upstream, course_release, now)}
        backup = work_dir / ".backup" / f"{name}.{_stamp(now)}.ipynb"
        try:
            backup.parent.mkdir(exist_ok=True)
            for n in range(2, 100):
                if not backup.exists():
                    break
                backup = backup.with_name(f"{name}.{_stamp(now)}-{n}.ipynb")
            shutil.copy2(copy, backup)
            _write(copy, merged, overwrite=True)
        except OSError as exc:
            raise WorkCopyError(f"cannot write {copy} or its backup ({exc.strerror or exc}): nothing was "
                                "changed in it") from None
        updated += 1
        print(f"{copy}: updated from {sources[name]} (your previous file: {backup})", file=out)
        for kind, text in events:
            print(f"  {kind:8} {text}", file=out)
    if current:
        print(f"up to date: {', '.join(current) if names else f'{len(current)} notebooks'}", file=out)
    if updated:
        print("Open in JupyterLab? Then File > Reload Notebook from Disk before you save it: saving the open tab "
              "would write the old version back.", file=out)
    return 1 if refused else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib work", description=__doc__.split("\n\n")[0])
    folders = argparse.ArgumentParser(add_help=False)
    folders.add_argument("--from", dest="source", type=Path, default=Path("exercises"),
                         help="the exercise notebooks (default: exercises)")
    folders.add_argument("--to", dest="work", type=Path, default=Path("work"),
                         help="your working copy (default: work)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("create", parents=[folders], help="copy every exercise notebook not in work/ yet")
    commands.add_parser("status", parents=[folders], help="which exercises changed since your copy")
    merge_cmd = commands.add_parser("update", parents=[folders], help="bring changed exercises' new cells in")
    merge_cmd.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="e.g. 00_start_here_exercises "
                           "(default: every one that changed)")
    args = parser.parse_args(argv)
    try:
        if args.command == "create":
            created = create(args.source, args.work)
            stale = [n for n, state, _ in status(args.source, args.work) if state == "changed"]
            names = ", ".join(p.stem for p in created) if len(created) <= 3 else f"{len(created)} notebooks"
            print(f"{args.work}/: your working copy of the exercises, where your answers go (git ignores it)"
                  + (f"; copied from {args.source}/: {names}" if created else ""))
            if stale:
                print(f"{args.work}/: changed in {args.source}/ since you copied them: {', '.join(stale)} "
                      f"(`{UPDATE}` brings the changes in beside your answers)")
            return 0
        if args.command == "status":
            for name, state, detail in status(args.source, args.work):
                print(f"{name:42} {state:10} {detail}".rstrip())
            return 0
        return update(args.source, args.work, args.notebooks)
    except WorkCopyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
