"""Run a function on N local processes that form a process group: torchrun for notebooks.

    from course_lib.distributed.launch import launch
    from course_lib.distributed.workers import all_reduce_sum
    launch(all_reduce_sum, world_size=4)        # -> [result of rank 0, ..., rank 3]

Each worker process is forked from a `forkserver` that imported torch once (spawn where there is no
forkserver: Windows), joins a process group (gloo on CPU, nccl when every rank gets its own GPU) and
calls `fn(rank, world_size, *args)` on its own copy of `args` and of the launcher's environment (as
separate torchrun processes would have); the return values come back in rank order. Why forkserver:
a spawned worker imports torch again, seconds of CPU per rank on a laptop, while a forked one starts in
milliseconds; unlike plain `fork`, the server never ran the notebook's threads or touched CUDA, so its
children are as safe as spawned ones (it is Python 3.14's default on Linux).

What makes it safe to use in front of a class:
- no port to choose: the launcher holds the rendezvous store itself, on a free port the OS picks;
- a worker's exception is re-raised here as WorkerError with that rank and its traceback, and the
  other ranks (perhaps stuck waiting in a collective for the dead one) are killed at once;
- a deadline (`timeout`) for the whole launch, after which every worker is killed;
- a Gloo mesh that fails to connect while the ranks join (a known flake on busy machines) starts the
  ranks once more, within the same deadline; any other failure is raised at once;
- no orphans: workers and whatever they started are killed on any exit from `launch`
  (course_lib.processes.kill_tree), and a worker whose launcher dies (kernel restart) exits by
  itself at once: it watches a pipe that only the launcher holds open.

`fn` must be importable by the child (defined in a module such as course_lib, not in a notebook
cell): a worker receives it pickled, that is by its module and name, and imports it.
"""
from __future__ import annotations

import copy
import datetime
import os
import queue
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..processes import kill_tree
from ..validate import positive_int, positive_number

BACKENDS = ("auto", "gloo", "nccl")


class WorkerError(RuntimeError):
    """A worker raised: `rank` is the failing rank, `remote_traceback` its traceback as text;
    `rendezvous` is True when it failed while joining the process group, before `fn` ran."""

    def __init__(self, rank: int, remote_traceback: str, rendezvous: bool = False):
        self.rank, self.remote_traceback, self.rendezvous = rank, remote_traceback, rendezvous
        super().__init__(f"rank {rank} failed; its traceback:\n{remote_traceback}")


# Gloo's TCP mesh sometimes fails to connect on a busy machine, before any collective ran (PyTorch's own
# Gloo tests are flaky the same way, pytorch/pytorch#53270): `launch` then starts the ranks once more.
GLOO_CONNECT_FAILED = "Gloo connectFullMesh failed"


def choose_backend(world_size: int, backend: str = "auto") -> str:
    """nccl when CUDA has a GPU for every rank, gloo otherwise (or as asked)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"
    if backend == "nccl" and not (torch.cuda.is_available() and torch.cuda.device_count() >= world_size):
        raise ValueError(f"backend='nccl' needs {world_size} CUDA GPUs; this machine has "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}. Use 'gloo' or 'auto'.")
    return backend


def _context():
    """forkserver where the platform has one (Linux, macOS), else spawn; the server preloads torch."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # This module, and so torch, imported once, by the server; and torch._dynamo, which torch imports on the
    # first optimizer or DDP a process builds (about as long as torch itself: seconds per rank on a laptop).
    ctx.set_forkserver_preload([__name__, "torch._dynamo"])
    return ctx


def _exit_with_launcher(alive) -> None:
    """Daemon thread in each worker: exit as soon as the launcher is gone (its end of `alive` closed).

    A forked worker's parent is the forkserver, not the launcher, so the parent's pid tells nothing."""
    try:
        alive.recv()      # nothing is ever sent: this returns (EOFError) when the launcher's end closes
    except (EOFError, OSError):
        pass
    os._exit(1)


def _worker(rank, world_size, backend, port, timeout_s, threads, alive, environ, fn, args, results):
    threading.Thread(target=_exit_with_launcher, args=(alive,), daemon=True).start()
    # A forked worker inherits the server's environment from when it started: take the launcher's, now.
    os.environ.clear()
    os.environ.update(environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    # torch.multiprocessing passes tensors through shared memory: without a private copy, ranks that
    # work in place (as all-reduce does) would all write into the same storage.
    args = copy.deepcopy(args)
    torch.set_num_threads(threads)
    joined = False
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)    # one machine: the local rank is the rank
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        joined = True
        results.put(("ok", rank, fn(rank, world_size, *args), time.time()))
    except BaseException:  # noqa: BLE001 - everything goes back to the launcher, with the rank
        # Timestamped: when one rank dies, its peers fail too ("connection closed"); the earliest is the cause.
        results.put(("error" if joined else "rendezvous", rank, traceback.format_exc(), time.time()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _root_cause(results, first, grace_s: float = 1.0) -> WorkerError:
    """Collect the errors that arrive within `grace_s` and blame the rank that failed first."""
    errors, end = [first], time.monotonic() + grace_s
    while time.monotonic() < end:
        try:
            status, rank, value, when = results.get(timeout=0.05)
        except queue.Empty:
            continue
        if status != "ok":
            errors.append((when, rank, value, status))
    _, rank, tb, status = min(errors)
    return WorkerError(rank, tb, rendezvous=status == "rendezvous")


def _collect(procs, results, deadline: float, timeout: float) -> dict:
    """{rank: result} once every worker reported; WorkerError/TimeoutError as soon as one cannot."""
    outputs: dict[int, object] = {}
    while len(outputs) < len(procs):
        try:
            status, rank, value, when = results.get(timeout=0.1)
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if r not in outputs and p.exitcode not in (None, 0)]
            if dead:
                time.sleep(0.5)  # its own error report may still be in flight
                if results.empty():
                    raise WorkerError(dead[0], f"the process exited with code {procs[dead[0]].exitcode} "
                                               "without a Python exception (killed, or crashed in native code)")
            if time.monotonic() > deadline:
                missing = [r for r in range(len(procs)) if r not in outputs]
                raise TimeoutError(f"launch timed out after {timeout:g} s; ranks {missing} had not finished "
                                   "(a rank waiting in a collective that another rank never joined?)")
            continue
        if status != "ok":
            raise _root_cause(results, (when, rank, value, status))
        outputs[rank] = value
    return outputs


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = 120.0,
           threads_per_rank: int = 1) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` processes; return their results by rank.

    timeout: seconds for the whole launch (WorkerError/TimeoutError after it; workers killed).
    threads_per_rank: torch threads per worker; 1 keeps N ranks from fighting over few cores.
    """
    positive_int("world_size", world_size)
    positive_int("threads_per_rank", threads_per_rank)
    positive_number("timeout", timeout, finite=False, hint=" (seconds)")
    if getattr(fn, "__module__", None) == "__main__" or "<locals>" in getattr(fn, "__qualname__", ""):
        raise ValueError(f"fn={getattr(fn, '__qualname__', fn)!r} is defined in a notebook or script: spawned "
                         "workers cannot import it. Put worker functions in a module (course_lib) and import them.")
    backend = choose_backend(world_size, backend)
    deadline = time.monotonic() + timeout
    try:
        return _launch_once(fn, world_size, args, backend, deadline, timeout, threads_per_rank)
    except WorkerError as exc:
        if not (exc.rendezvous and GLOO_CONNECT_FAILED in exc.remote_traceback and time.monotonic() < deadline):
            raise
        print(f"launch: rank {exc.rank} could not connect to its peers (Gloo), before any work; starting the "
              f"{world_size} ranks once more", file=sys.stderr)
    return _launch_once(fn, world_size, args, backend, deadline, timeout, threads_per_rank)


def _launch_once(fn, world_size, args, backend, deadline, timeout, threads_per_rank) -> list:
    ctx = _context()
    results = ctx.Queue()
    alive, launcher_alive = ctx.Pipe(duplex=False)   # workers read; closed by the launcher when it ends
    # The launcher holds the rendezvous store: a free port chosen by the OS, no race with other jobs.
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=max(deadline - time.monotonic(), 1.0)))
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(rank, world_size, backend, store.port, timeout, threads_per_rank, alive,
                               dict(os.environ), fn, args, results)) for rank in range(world_size)]
    try:
        for p in procs:
            p.start()
        outputs = _collect(procs, results, deadline, timeout)
        for p in procs:
            p.join(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        for p in procs:
            if p.is_alive():
                kill_tree(p.pid)   # with whatever it started
        for p in procs:
            if p.pid is not None:  # a start() that failed leaves nothing to join
                p.join(timeout=5)
        results.close()
        alive.close()
        launcher_alive.close()
    return [outputs[r] for r in range(world_size)]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for torchrun's --rdzv-endpoint)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
