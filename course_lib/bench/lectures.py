"""The classroom clock: run every lecture notebook top to bottom in a fresh kernel and time it.

    python -m course_lib.bench lectures --data-dir ../shared/data-full --json   # normal mode, 60k images
    python -m course_lib.bench lectures --quick                                 # quick mode (COURSE_QUICK=1)

Run it from the course's folder (it reads `notebooks/NN_*.ipynb` under the current folder). Each
notebook runs in its own kernel started in notebooks/, as Jupyter and nbval start them, with
COURSE_DATA_DIR set to --data-dir (when given), COURSE_QUICK=1 only with --quick, and progress bars
off. A lecture must fit a class: <= 120 s each in normal mode with the full 60,000 training images
on a 2-core laptop CPU. The JSON has `seconds` (notebook -> seconds), `max_seconds`, `slowest`,
`failed` (notebook -> the first error), `data_train_images` and `data`.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

from .result import BenchResult

SLOT_SECONDS = 120        # a lecture's budget in normal mode, at full size, on a 2-core CPU
CELL_TIMEOUT = 900        # a cell that runs longer has hung: the notebook is reported as failed


@contextmanager
def _environment(**values):
    """Set (or, for None, remove) environment variables for the kernels started inside."""
    def apply(pairs):
        for key, value in pairs.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    saved = {k: os.environ.get(k) for k in values}
    apply(values)
    try:
        yield
    finally:
        apply(saved)


def time_notebook(path: Path, cell_timeout: float = CELL_TIMEOUT, save_to=None) -> tuple[float, str]:
    """(wall seconds from kernel start to the last cell, "" or the first error) for one notebook.

    save_to: also write the executed notebook (its outputs) there, failed or not.
    """
    try:
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
    except ImportError as exc:
        raise ImportError("bench lectures runs notebooks: pip install 'course_lib[grading]' "
                          "(nbformat, nbclient, ipykernel)") from exc
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    try:
        client.execute()
        error = ""
    except CellTimeoutError:
        error = f"a cell ran past {cell_timeout:g} s"
    except DeadKernelError as exc:
        error = f"the kernel died: {exc}"
    except CellExecutionError as exc:
        error = str(exc).strip().splitlines()[-1][:300]
    seconds = time.perf_counter() - start
    if save_to is not None:
        nbformat.write(nb, str(save_to))
    return seconds, error


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """Time every lecture in notebooks/ under the current folder."""
    return time_lectures(Path.cwd() / "notebooks", data_dir, quick)


def time_lectures(folder, data_dir=None, quick: bool = False) -> BenchResult:
    """Time every NN_*.ipynb in `folder`, each in a fresh kernel (see the module docstring)."""
    from ..data import data_label, load_tensors, train_split_size

    folder = Path(folder)
    lectures = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not lectures:
        raise ValueError(f"no lecture notebooks (NN_*.ipynb) in {folder}: run this from the course's folder")
    n_split = train_split_size(data_dir)
    load_tensors("test", data_dir, 1)   # fail now, with the data's own message, if the test split is missing
    data_env = str(Path(data_dir).expanduser().resolve()) if data_dir else os.environ.get("COURSE_DATA_DIR")
    rows, seconds, failed = [], {}, {}
    # COURSE_STATIC_PAGE: widgets show their starting output, as on the site; headless nbclient otherwise
    # sometimes waits a whole cell timeout after ipywidgets' interactive (its Output-widget mimic)
    with _environment(COURSE_DATA_DIR=data_env, COURSE_QUICK="1" if quick else None, TQDM_DISABLE="1",
                      COURSE_STATIC_PAGE="1"):
        for path in lectures:
            print(f"== {path.name}", flush=True)
            took, error = time_notebook(path)
            seconds[path.stem] = round(took, 1)
            if error:
                failed[path.stem] = error
            over = not quick and took > SLOT_SECONDS
            rows.append({"lecture": path.stem, "seconds": round(took, 1),
                         "status": "failed" if error else ("over the slot" if over else "ok")})
    slowest = max(seconds, key=seconds.get)
    summary = {"benchmark": "lectures", "mode": "quick" if quick else "normal", "seconds": seconds,
               "max_seconds": seconds[slowest], "slowest": slowest, "total_seconds": round(sum(seconds.values()), 1),
               "slot_seconds": SLOT_SECONDS, "failed": failed, "data_train_images": n_split,
               "data": data_label(n_split, n_split, data_dir), "cpu_count": os.cpu_count(),
               "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None}
    title = (f"lectures in {summary['mode']} mode on {summary['data']}: slowest {slowest} "
             f"{seconds[slowest]:.0f} s (slot {SLOT_SECONDS} s in normal mode)")
    return BenchResult(title, rows, summary)
