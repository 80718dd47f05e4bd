"""Run code cells in a fresh, private Jupyter kernel, whatever the code in them does (for grading.grade).

    results = run_cells(["x = 1", "while True: pass", "print(x)"], cell_timeout=5)
    [r.status for r in results]        # -> ["ok", "timeout", "ok"]

Each cell has a deadline (`cell_timeout`, and whatever is left of `total_timeout`). A cell that
runs past it, or kills the kernel (`os._exit`, a crash in native code), is marked "timeout" or
"died"; the kernel and everything it started are killed (course_lib.processes.kill_tree: also
what a cell started in a session of its own), and a new kernel runs the cells again
from the top without that cell, so the cells after it still run. A cell that raises is "error"
(the kernel carries on, as in Jupyter). Cells left when the total deadline passes are "not run".

The kernel is this Python's ipykernel (a kernelspec written for the occasion, not whatever
"python3" means on this machine), started in a private temporary folder (0700) that is its working
directory, IPYTHONDIR and connection-file folder, with IPython history in memory only; the folder
is deleted afterwards, so nothing the cells contained is left on disk.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..processes import kill_tree
from ..validate import positive_number

try:
    import nbformat
    if importlib.util.find_spec("nbclient") is None:   # imported when cells run
        raise ImportError("No module named 'nbclient'")
except ImportError as exc:
    raise ImportError(f"grading needs nbformat and nbclient ({exc}): pip install 'course_lib[grading]'") from exc

KERNEL_NAME = "course-grade"


@dataclass
class CellRun:
    """How one cell ended: status is "ok", "error", "timeout", "died" or "not run"."""

    status: str
    outputs: list = field(default_factory=list)
    error: str = ""            # "ExceptionName: message" when status is "error"
    seconds: float = 0.0

    @property
    def stdout(self) -> str:
        return "".join(o.get("text", "") for o in self.outputs
                       if o.get("output_type") == "stream" and o.get("name") == "stdout")


def _kernelspec(folder: Path) -> Path:
    spec = folder / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "course grader", "language": "python"}))
    return spec.parent


def _attempt(sources, skip: dict, deadline: float, cell_timeout: float, folder: Path):
    """One kernel, cells in order; returns (results, None) or (partial results, (index, "timeout"/"died"))."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    replies: dict[int, dict] = {}
    km = AsyncKernelManager(kernel_name=KERNEL_NAME, connection_file=str(folder / "runtime" / "kernel.json"),
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder / "kernels")]))
    client = NotebookClient(nb, km=km, allow_errors=True, interrupt_on_timeout=False, record_timing=False,
                            shutdown_kernel="immediate", iopub_timeout=10,
                            on_cell_executed=lambda cell, cell_index, execute_reply:
                                replies.__setitem__(cell_index, execute_reply["content"]))
    env = {**os.environ, "IPYTHONDIR": str(folder / "ipython"), "JUPYTER_RUNTIME_DIR": str(folder / "runtime")}
    results: list[CellRun | None] = [None] * len(sources)
    with client.setup_kernel(cwd=str(folder / "work"), env=env, cleanup_kc=True):   # cleanup_kc: shut it down
        pid = getattr(getattr(km, "provisioner", None), "pid", None)
        try:
            for i, cell in enumerate(nb.cells):
                left = deadline - time.monotonic()
                if i in skip or left < 1:
                    results[i] = CellRun(skip.get(i, "not run"))
                    continue
                client.timeout = max(1, int(min(cell_timeout, left)))
                start = time.monotonic()
                try:
                    client.execute_cell(cell, i)
                except CellTimeoutError:
                    return results, (i, "timeout")
                except DeadKernelError:
                    return results, (i, "died")
                reply = replies.get(i, {"status": "error", "ename": "NoReply", "evalue": "the kernel did not answer"})
                error = f"{reply.get('ename', '')}: {reply.get('evalue', '')}" if reply["status"] != "ok" else ""
                results[i] = CellRun("ok" if reply["status"] == "ok" else "error", list(cell.outputs), error,
                                     time.monotonic() - start)
            return results, None
        finally:
            if pid:   # before the kernel goes (its manager shuts it down): its orphans could not be found afterwards
                kill_tree(pid, root=False)


def run_cells(sources: list[str], cell_timeout: float = 120.0, total_timeout: float = 900.0) -> list[CellRun]:
    """Execute `sources` in order in a fresh kernel; one CellRun per source (see the module docstring)."""
    positive_number("cell_timeout", cell_timeout, finite=False, hint=" (seconds)")
    positive_number("total_timeout", total_timeout, finite=False, hint=" (seconds)")
    deadline = time.monotonic() + total_timeout
    skip: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="course-grade-") as tmp:
        folder = Path(tmp)
        for sub in ("work", "ipython", "runtime"):
            (folder / sub).mkdir()
        _kernelspec(folder)
        while True:
            results, failure = _attempt(sources, skip, deadline, cell_timeout, folder)
            if failure is None:
                return results
            index, reason = failure
            skip[index] = reason      # run again without the cell that hung or killed the kernel
            if time.monotonic() >= deadline:
                return [r or CellRun(skip.get(i, "not run")) for i, r in enumerate(results)]
