"""Generate the student exercise notebooks from their solution sources.

    python -m course_lib.exercises            # rewrite exercises/ from solutions/
    python -m course_lib.exercises --check    # exit 1 if exercises/ is out of date
    python -m course_lib.exercises --solutions private/solutions --exercises release
    python -m course_lib.exercises --private private/solutions   # before grading with private hidden tests

The folders default to solutions/ and exercises/ under the current folder: run it from the course's
root folder (as the Makefile and the tests do), or name them.

`solutions/` is the only hand-edited copy. nbgrader's own preprocessors make the student
version, exactly as `nbgrader generate_assignment` would: ClearSolutions replaces each
`### BEGIN SOLUTION`/`### END SOLUTION` region with a `raise NotImplementedError()` stub,
ClearHiddenTests drops `### BEGIN HIDDEN TESTS`/`### END HIDDEN TESTS` regions, ClearOutput
drops outputs. Cells must carry nbgrader metadata (solution/grade), so the same sources
autograde with nbgrader. Needs the grading extra (nbformat, nbgrader): pip install 'course_lib[grading]'.

`--private DIR`: a term graded with hidden tests its students cannot read keeps its sources in a private
folder (COURSE_SOLUTIONS_DIR when grading). Each of them must still make exactly the public exercise the
students work on (same cells, grade_ids, points and visible checks; only the hidden tests differ): this
says, cell by cell, where one does not, and exits 1.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

try:
    import nbformat
except ImportError as exc:
    raise ImportError(f"generating exercises needs nbformat and nbgrader ({exc}): "
                      "pip install 'course_lib[grading]'") from exc

SOURCE_DIR, TARGET_DIR = Path("solutions"), Path("exercises")   # relative: under the current folder
LEAK_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


def student_version(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The student's copy of a solution notebook: solutions stubbed, hidden tests and outputs gone."""
    try:
        from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions
    except ImportError as exc:
        raise ImportError(f"generating exercises needs nbgrader ({exc}): pip install 'course_lib[grading]'") from exc

    nb = copy.deepcopy(nb)
    resources: dict = {}
    for pre in (ClearSolutions(), ClearHiddenTests(), ClearOutput()):
        nb, resources = pre.preprocess(nb, resources)
    for cell in nb.cells:
        leaked = [m for m in LEAK_MARKERS if m in cell.source]
        if leaked:  # e.g. a marker in a cell without nbgrader metadata, or a typo in a marker
            raise ValueError(f"a cell still contains {leaked} after generation; check its markers "
                             f"and nbgrader metadata:\n{cell.source[:200]}")
    return nb


def render(source: Path) -> str:
    """The exact text of the exercise notebook generated from `source`."""
    nb = nbformat.read(str(source), as_version=4)
    return nbformat.writes(student_version(nb)) + "\n"


def sync(source_dir: Path = SOURCE_DIR, target_dir: Path = TARGET_DIR, check: bool = False) -> list[str]:
    """Bring `target_dir` in line with `source_dir`; return what differed.

    With check=True nothing is written. Exercise files without a source count as differences
    (and are deleted when not checking), so a renamed solution leaves no stale student copy.
    """
    source_dir, target_dir = Path(source_dir), Path(target_dir)
    if not source_dir.is_dir():
        raise FileNotFoundError(f"there is no folder {source_dir} (looked in {Path.cwd()}): run from the course's "
                                "root folder or pass --solutions DIR")
    sources = sorted(source_dir.glob("*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no solution notebooks in {source_dir}")
    problems = []
    for src in sources:
        dst = target_dir / src.name
        text = render(src)
        if not dst.is_file() or dst.read_text(encoding="utf-8") != text:
            problems.append(f"{dst.name}: {'missing' if not dst.is_file() else 'out of date'}")
            if not check:
                target_dir.mkdir(parents=True, exist_ok=True)
                dst.write_text(text, encoding="utf-8")
    wanted = {s.name for s in sources}
    for stale in sorted(target_dir.glob("*.ipynb")):
        if stale.name not in wanted:
            problems.append(f"{stale.name}: has no source in {source_dir.name}/")
            if not check:
                stale.unlink()
    return problems


def _describe(cell) -> str:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    kind = "visible check" if meta.get("grade") and not meta.get("solution") else \
        "answer stub" if meta.get("solution") else f"{cell.cell_type} cell"
    return f"{kind} {meta['grade_id']!r}" if meta.get("grade_id") else kind


def private_differences(private_dir: Path, public_dir: Path = TARGET_DIR) -> list[str]:
    """Where the student copies of the sources in `private_dir` differ from the exercises in `public_dir`."""
    sources = sorted(Path(private_dir).glob("*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no source notebooks in {private_dir}")
    problems = []
    for src in sources:
        public = Path(public_dir) / src.name
        if not public.is_file():
            problems.append(f"{src.name}: there is no public exercise {public}")
            continue
        mine = student_version(nbformat.read(str(src), as_version=4)).cells
        theirs = nbformat.read(str(public), as_version=4).cells
        private_ids, public_ids = ([c.metadata["nbgrader"]["grade_id"] for c in cells
                                    if c.metadata.get("nbgrader", {}).get("grade_id")] for cells in (mine, theirs))
        if private_ids != public_ids:
            problems.append(f"{src.name}: the grade_ids differ: private {private_ids}, public {public_ids}")
            continue
        for n, (a, b) in enumerate(zip(mine, theirs)):
            if (a.cell_type, a.source) != (b.cell_type, b.source):
                problems.append(f"{src.name}: cell {n}, the {_describe(b)}, differs from the public exercise's")
            elif a.metadata.get("nbgrader") != b.metadata.get("nbgrader"):
                problems.append(f"{src.name}: cell {n}, the {_describe(b)}: its nbgrader metadata (points, lock) "
                                "differs from the public exercise's")
        if len(mine) != len(theirs):
            problems.append(f"{src.name}: {len(mine)} cells, the public exercise has {len(theirs)}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.exercises", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if exercises/ is out of date")
    parser.add_argument("--solutions", type=Path, default=SOURCE_DIR, help="the sources (default: ./solutions)")
    parser.add_argument("--exercises", type=Path, default=TARGET_DIR, help="the student copies (default: ./exercises)")
    parser.add_argument("--private", type=Path, metavar="DIR",
                        help="check that the sources in DIR (private hidden tests) make exactly the public exercises")
    args = parser.parse_args(argv)
    if args.private:
        try:
            problems = private_differences(args.private, args.exercises)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for p in problems:
            print(f"does not match: {p}")
        if not problems:
            print(f"{args.private}/ makes exactly the public {args.exercises}/ "
                  f"({len(list(args.private.glob('*.ipynb')))} notebooks; their hidden tests are their own)")
        return 1 if problems else 0
    try:
        problems = sync(args.solutions, args.exercises, check=args.check)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.solutions == SOURCE_DIR:     # the course's own solutions: the package's catalog follows them
        from . import catalog
        try:
            stale = catalog.sync(args.solutions, Path("pyproject.toml"), student_version, check=args.check)
        except ValueError as exc:       # a header without its per-exercise minutes, a test cell with no answer
            print(f"error: catalog.json: {exc}", file=sys.stderr)
            return 2
        if stale:
            problems.append("catalog.json (course_lib/learn/): out of date")
    for p in problems:
        print(("out of sync: " if args.check else "regenerated: ") + p)
    if args.check and problems:
        print(f"Run `python -m course_lib.exercises` and commit {args.exercises}/ and course_lib/learn/catalog.json.",
              file=sys.stderr)
        return 1
    if not problems:
        print(f"{args.exercises}/ is up to date with {args.solutions}/ "
              f"({len(list(args.solutions.glob('*.ipynb')))} notebooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
