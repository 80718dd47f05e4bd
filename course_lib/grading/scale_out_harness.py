"""Run a learner's DDP script under torchrun and read back what it did (for course_lib.checks.practicum_scale_out).

`run_ddp(script)` writes the script to a private temporary folder and starts it with torchrun: the
student's variant of 2 or 3 ranks and a seed (course_lib.grading.variants), gloo, one thread each, a free
port, a deadline, and every process killed afterwards (course_lib.processes.run_commands). An audit
module on the ranks' PYTHONPATH (a `sitecustomize`) records each `torch.save` with the rank that called it.
The result (`DDPRun`) holds each rank's stdout, the files the script wrote, the audit and the exit code;
the folder is deleted.
`single_process_reference(run)` runs the given script (course_lib.grading.scale_out) at the DDP
run's global batch; `run_probe(command)` runs a torchrun command on a probe script that reports
each rank's view of its group. The children import course_lib from the folder that holds the
imported package (a clone, an editable install or `pip install --target`), whatever their working
directory.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import course_lib

from ..distributed.launch import free_port
from ..env import pick
from ..processes import run_commands
from ..validate import positive_int
from .environment import sealed
from .remote import student_command
from .variants import student_id, variant

PACKAGE_ROOT = Path(course_lib.__file__).resolve().parent.parent   # the folder that holds course_lib/

# What the graders run: seed 3 (not the default 0) so that a sampler that ignores --seed shows;
# noise off so the run is deterministic (the noise is still drawn and logged as a fingerprint).
# A student's variant (course_lib.grading.variants) replaces the seed and WORLD_SIZE (2 or 3 ranks):
# the samples divide by both, so every rank trains on as many samples and no sampler pads.
SETTINGS = {"epochs": 2, "batch_size": 16, "lr": 0.05, "samples": pick(480, 240), "seed": 3, "noise": 0.0}
WORLD_SIZE = 2


def student_settings(student: str | None = None) -> tuple[int, dict]:
    """(world_size, settings) of `student`'s variant (default: variants.student_id(), as the grader sets it)."""
    chosen = variant(student_id() if student is None else student, "practicum_scale_out")
    return chosen["world_size"], {**SETTINGS, "seed": chosen["seed"]}

AUDIT = '''"""Grader's audit (sitecustomize): record every torch.save with the rank that called it.

Also in torchrun's agent and every rank: course_lib's exit without the last garbage collections over torch's
objects (course_lib.shutdown), ~1 CPU-s per process."""
import json, os
import course_lib  # noqa: F401 - its import registers course_lib.shutdown.freeze_at_exit with atexit
if os.environ.get("SCALE_OUT_AUDIT"):
    import torch
    _real_save = torch.save
    def _audited_save(obj, f, *args, **kwargs):
        path = os.path.abspath(os.fspath(f) if isinstance(f, (str, os.PathLike)) else str(getattr(f, "name", f)))
        record = {"rank": os.environ.get("RANK"), "path": path}
        with open(os.path.join(os.environ["SCALE_OUT_AUDIT"], "saves-%d.jsonl" % os.getpid()), "a") as log:
            log.write(json.dumps(record) + "\\n")
        return _real_save(obj, f, *args, **kwargs)
    torch.save = torch.serialization.save = _audited_save
'''

PROBE = '''import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
report = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": t.item(), "python": sys.executable,
          "torch": torch.__version__}
os.write(1, (json.dumps(report) + "\\n").encode())   # one write: ranks share the output file
dist.destroy_process_group()
'''


@dataclass
class DDPRun:
    """What one torchrun launch of a script did (everything read into memory; the folder is gone)."""

    returncode: int
    timed_out: bool
    seconds: float
    settings: dict
    world_size: int
    console: str = ""                                 # torchrun's own stdout + stderr
    stdout: dict = field(default_factory=dict)        # rank -> what that rank printed
    stderr: dict = field(default_factory=dict)
    files: list = field(default_factory=list)         # names the script left in --out
    logs: dict = field(default_factory=dict)          # *.jsonl file name -> list of records
    checkpoint: dict | None = None                    # checkpoint.pt, loaded with weights_only
    saves: list = field(default_factory=list)         # one {"rank", "path"} per torch.save call


def _env(**extra) -> dict:
    """Extra environment for a child: course_lib importable whatever the working directory."""
    paths = [*extra.pop("prepend", []), str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "TQDM_DISABLE": "1", **extra}


def _arguments(settings: dict, out: Path) -> list[str]:
    args = ["--out", str(out)]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


SHUTDOWN_RACE = "terminate called without an active exception"


def _torchrun(nproc: int, port: int, log_dir: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--redirects", "3",
            "--log-dir", str(log_dir)]


def _on_a_free_port(command, timeout: float, **kwargs) -> tuple:
    """run_commands([command(port)]) on a free port; once more on another if someone took it in between.

    Returns (returncode, stdout, stderr, timed_out, attempt).
    """
    for attempt in range(2):
        (code, out, err, timed_out, _), = run_commands([command(free_port(), attempt)], timeout=timeout,
                                                       base=sealed(), **kwargs)
        if code == 0 or "EADDRINUSE" not in out + err:
            break
    return code, out, err, timed_out, attempt


def _read_jsonl(path: Path) -> list:
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            records.append({"unparsable line": line})
    return records


def _launch(tmp: Path, here: Path, world_size: int, settings: dict, timeout: float) -> DDPRun:
    """One torchrun launch of tmp/train_ddp.py writing into the fresh folder `here`; read back as a DDPRun."""
    out, logs, audit = here / "out", here / "torchrun_logs", here / "audit"
    audit.mkdir(parents=True)
    env = _env(prepend=[str(tmp / "site")], SCALE_OUT_AUDIT=str(audit))
    start = time.perf_counter()
    code, stdout, stderr, timed_out, attempt = _on_a_free_port(
        lambda port, attempt: student_command(_torchrun(world_size, port, logs / str(attempt))
                                              + [str(tmp / "train_ddp.py"), *_arguments(settings, out)], tmp),
        timeout, env=env, cwd=tmp)
    run = DDPRun(code, timed_out, time.perf_counter() - start, settings, world_size, stdout + stderr)
    for stream in ("stdout", "stderr"):
        for path in (logs / str(attempt)).glob(f"*/attempt_*/*/{stream}.log"):
            getattr(run, stream)[int(path.parent.name)] = path.read_text()
    if out.is_dir():
        run.files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        run.logs = {p.name: _read_jsonl(p) for p in sorted(out.glob("*.jsonl"))}
        if (out / "checkpoint.pt").is_file():
            try:
                run.checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - reported by check_checkpoint
                run.checkpoint = {"unloadable": f"{type(exc).__name__}: {exc}"}
    for path in sorted(audit.glob("*.jsonl")):
        run.saves += _read_jsonl(path)
    return run


def run_ddp(script: str, world_size: int | None = None, timeout: float = 90.0, quiet: bool = False,
            **overrides) -> DDPRun:
    """Run `script` (the text of a .py file) under torchrun on `world_size` CPU ranks; return a DDPRun.

    world_size None: the student's variant (`student_settings`), whose seed the settings also take;
    overrides change those settings (e.g. epochs=1). Never raises for the script's own failures: they
    are in returncode/stderr, and the checks explain them.
    """
    if not isinstance(script, str):
        raise TypeError(f"script must be the text of a Python file (a str); got {type(script).__name__}")
    variant_world, settings = student_settings()
    world_size = variant_world if world_size is None else world_size
    positive_int("world_size", world_size)
    settings = {**settings, **overrides}
    tmp = Path(tempfile.mkdtemp(prefix="scale_out_"))
    try:
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(AUDIT)
        (tmp / "train_ddp.py").write_text(script)
        for launch in range(2):
            run = _launch(tmp, tmp / f"launch{launch}", world_size, settings, timeout)
            # PyTorch's gloo threads can abort a rank at interpreter exit even after destroy_process_group
            # (a known race in torch, not the student's fault): start that run once more from scratch.
            if run.returncode == 0 or not any(SHUTDOWN_RACE in text for text in run.stderr.values()):
                break
            if not quiet:
                print(f"(a rank hit PyTorch's gloo shutdown race, {SHUTDOWN_RACE!r}: running the script once more)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        print(f"torchrun, {world_size} ranks: exit code {run.returncode} after {run.seconds:.1f} s"
              + (" (killed at the deadline)" if run.timed_out else ""))
        for rank in sorted(run.stdout):
            print(f"--- rank {rank} printed:\n{run.stdout[rank].rstrip() or '(nothing)'}")
        if run.returncode != 0:
            rank = failed_rank(run)
            print(f"--- rank {rank}'s error output (last lines):\n{tail(run.stderr.get(rank, run.console))}")
    return run


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def failed_rank(run: DDPRun) -> int:
    with_traceback = [r for r, err in sorted(run.stderr.items()) if "Traceback" in err]
    return with_traceback[0] if with_traceback else 0


@functools.lru_cache(maxsize=4)
def _single_process(settings_items: tuple, global_batch: int, timeout: float) -> dict:
    settings = {**dict(settings_items), "batch_size": global_batch}
    with tempfile.TemporaryDirectory(prefix="scale_out_single_") as tmp:
        (code, out, err, timed_out, _), = run_commands(
            [[sys.executable, "-m", "course_lib.grading.scale_out", *_arguments(settings, Path(tmp) / "out")]],
            timeout=timeout, env=_env())
        if code != 0 or timed_out:
            raise RuntimeError(f"the given single-process script failed (exit code {code}):\n{tail(out + err)}")
        return {"checkpoint": torch.load(Path(tmp) / "out" / "checkpoint.pt", weights_only=True),
                "log": _read_jsonl(Path(tmp) / "out" / "log.jsonl")}


def single_process_reference(run, timeout: float = 90.0) -> dict:
    """The given script's checkpoint and log, run in one process at the DDP run's global batch size."""
    return _single_process(tuple(sorted(run.settings.items())), run.settings["batch_size"] * run.world_size, timeout)


def run_probe(command, timeout: float = 60.0) -> tuple:
    """Run command(probe_path, port) -> argv (a torchrun command) on PROBE, on a free port.

    Returns (returncode, stdout, stderr, timed_out, the last argv run).
    """
    tmp = Path(tempfile.mkdtemp(prefix="scale_out_probe_"))
    try:
        (tmp / "probe.py").write_text(PROBE)
        commands = []

        def argv(port, attempt):
            commands.append(command(str(tmp / "probe.py"), port))
            return student_command(commands[-1], tmp)

        code, out, err, timed_out, _ = _on_a_free_port(argv, timeout, env=_env(), cwd=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return code, out, err, timed_out, commands[-1]
