"""A hang found, not guessed: one rank skips a collective, a timeout ends the job, the Flight Recorder says who.

The bug is the classic one: every rank loops over ITS OWN batches, and one rank has a batch fewer
(uneven data shards), so it never joins the last gradient all-reduce. The others wait in it until the
process group's timeout (`init_process_group(timeout=...)`, or `dist.set_timeout` later) raises; the
launcher's own deadline bounds the whole job in case even that fails.

The traceback names the rank that WAITED (it timed out), not the rank that never came. PyTorch's Flight
Recorder keeps the last collectives of every rank in a ring buffer (TORCH_FR_BUFFER_SIZE entries, for gloo
as for nccl); each rank dumps it to TORCH_FR_DUMP_TEMP_FILE + rank, and the analyser compares the ranks:

    python -m torch.distributed.flight_recorder.fr_trace TRACE_DIR --prefix rank_    # or: torchfrtrace

    from course_lib.distributed.hang import run_uneven_job, read_dumps, analyse
    error = run_uneven_job("traces/hang")    # the WorkerError of the rank that timed out (rank 0)
    analyse("traces/hang")["missing_ranks"]  # -> {1}: the rank that never joined all-reduce #3

On nccl, the watchdog dumps by itself on a timeout (TORCH_NCCL_DUMP_ON_TIMEOUT=1). gloo has no watchdog,
so the ranks here dump on their way out; and torch 2.14's gloo dump lacks the group membership
("pg_config") that the analyser needs, so `dump_flight_recorder` adds it as nccl records it.
"""
from __future__ import annotations

import datetime
import os
import pickle
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from ..validate import int_in_range, positive_int, positive_number
from .launch import WorkerError, launch

PREFIX = "rank_"


def dump_flight_recorder() -> Path:
    """Write this rank's Flight Recorder buffer to $TORCH_FR_DUMP_TEMP_FILE<rank> (a pickle, as nccl does)."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix:
        raise RuntimeError("set TORCH_FR_DUMP_TEMP_FILE (the dump files' path prefix) before starting the ranks")
    # no C++ stack traces: symbolising them takes seconds, and the Python traceback says where we were
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False))
    world = dist.group.WORLD
    dump["pg_config"] = {world.group_name: {"name": world.group_name, "desc": "default_pg",
                                            "ranks": str(list(range(dist.get_world_size())))}}
    path = Path(f"{prefix}{dist.get_rank()}")
    path.write_bytes(pickle.dumps(dump))
    return path


def uneven_steps(rank: int, world_size: int, short_rank: int, steps: int, timeout_s: float) -> int:
    """Worker: `steps` gradient all-reduces, but rank `short_rank` has one batch fewer and skips the last.

    It then goes on (say, to evaluation) for longer than the timeout, so the others time out waiting for
    it rather than see it disconnect. Every rank dumps its Flight Recorder on the way out."""
    dist.set_timeout(datetime.timedelta(seconds=timeout_s))   # short: seconds, not the default 30 minutes
    grad = torch.ones(4)
    try:
        for _ in range(steps - (rank == short_rank)):        # this rank's own batches
            dist.all_reduce(grad)                             # the gradient all-reduce of each step
    finally:
        dump_flight_recorder()
    if rank == short_rank:
        time.sleep(4 * timeout_s)     # busy elsewhere; the launcher kills it once the others have failed
    return steps


@contextmanager
def _environ(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_uneven_job(trace_dir, world_size: int = 2, short_rank: int = 1, steps: int = 3, timeout_s: float = 3.0,
                   launch_timeout: float = 60.0) -> Exception:
    """Run `uneven_steps` with the Flight Recorder on; return the error that ended the job (it must end in one).

    The dumps land in trace_dir/rank_<r>. timeout_s: the process group's timeout; launch_timeout: the
    launcher's deadline for the whole job, the backstop if a collective never times out."""
    positive_int("world_size", world_size)
    int_in_range("short_rank", short_rank, 0, world_size - 1, hint=f" (world_size={world_size})")
    positive_int("steps", steps)
    positive_number("timeout_s", timeout_s, hint=" (seconds)")
    positive_number("launch_timeout", launch_timeout, hint=" (seconds)")
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 (one rank has nobody to wait for); got {world_size}")
    trace_dir = Path(trace_dir)
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_dir.glob(f"{PREFIX}*"):
        old.unlink()
    env = {"TORCH_FR_BUFFER_SIZE": "1000", "TORCH_FR_DUMP_TEMP_FILE": str(trace_dir / PREFIX)}
    with _environ(env):   # the spawned ranks inherit it
        try:
            launch(uneven_steps, world_size, short_rank, steps, timeout_s, timeout=launch_timeout)
        except (WorkerError, TimeoutError) as error:
            return error
    raise RuntimeError("the job finished although one rank skipped a collective")


def read_dumps(trace_dir) -> dict:
    """{rank: {"enqueued", "completed", "last"}}: per rank the collectives it entered, those that finished
    (sequence numbers, default group) and the name of its last one, from the dumps in `trace_dir`."""
    table = {}
    for path in sorted(Path(trace_dir).glob(f"{PREFIX}*")):
        dump = pickle.loads(path.read_bytes())
        status = dump["pg_status"][next(iter(dump["pg_config"]))]     # the default group's counters
        entries = [e for e in dump["entries"] if not e["is_p2p"]]
        table[int(path.name[len(PREFIX):])] = {"enqueued": status["last_enqueued_collective"],
                                               "completed": status["last_completed_collective"],
                                               "last": entries[-1]["profiling_name"] if entries else None}
    if not table:
        raise FileNotFoundError(f"no Flight Recorder dumps {PREFIX}<rank> in {trace_dir}")
    return dict(sorted(table.items()))


def analyse(trace_dir, timeout: float = 120.0) -> dict:
    """Run PyTorch's analyser (`python -m torch.distributed.flight_recorder.fr_trace`) on the dumps.

    Returns {"report": its printed text, "missing_ranks": the ranks that never joined a collective the
    others entered, "collective_seq_id": which one}."""
    trace_dir = Path(trace_dir)
    db_path = trace_dir / "fr_db.pkl"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(trace_dir),
                           "--prefix", PREFIX, "-o", str(db_path)], capture_output=True, text=True,
                          timeout=timeout)
    report = "\n".join(line for line in (done.stdout + done.stderr).splitlines() if "tabulate" not in line)
    if done.returncode != 0:
        raise RuntimeError(f"fr_trace failed (exit code {done.returncode}):\n{report}")
    _, db = pickle.loads(db_path.read_bytes())
    bad = [c for c in db.collectives if c.missing_ranks]
    return {"report": report, "missing_ranks": set(bad[0].missing_ranks) if bad else set(),
            "collective_seq_id": bad[0].collective_seq_id if bad else None}
