"""Start, watch and kill process trees: the one process supervisor of course_lib.

    from course_lib.processes import run_commands
    (code, out, err, timed_out, pids), = run_commands([[sys.executable, "-c", "print(1)"]], timeout=10)

Whatever a command starts (torchrun and its workers, a grading kernel's children, a measuring
process) must not outlive it. The parts:
- `start(argv, env=...)`: Popen in a session (and process group) of its own, with os.environ +
  OMP_NUM_THREADS=1 + `env`, so that its whole group can be signalled at once;
- `descendants(pid)`, `alive(pid)`: the processes below a pid, found through their parent pids
  (`ps`: workers may sit in sessions of their own, out of reach of killpg), and whether a pid still
  runs (a zombie does not);
- `kill_tree(pid)`: SIGKILL a process, its group and everything below it; wait until they are gone;
- `run_commands(commands, timeout=...)`: every argv at once, one deadline for all, `grace` seconds
  for the others once one fails, then every tree stopped (SIGTERM, `grace`, SIGKILL).
POSIX only (Linux, macOS).
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from typing import NamedTuple

from .validate import number_in_range, positive_int, positive_number


class CommandResult(NamedTuple):
    """One command of `run_commands`: exit code (negative: killed by that signal), its output, and the
    pids of the command and of every descendant seen while it ran."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    pids: list


def process_table() -> dict[int, int]:
    """{pid: parent pid} of every process (POSIX `ps`, Linux and macOS)."""
    out = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True, text=True,
                         check=False).stdout
    table = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            table[int(parts[0])] = int(parts[1])
    return table


def descendants(pid: int) -> set[int]:
    """Every process below `pid`: children, their children, ... (even in sessions of their own)."""
    positive_int("pid", pid)
    table, found, todo = process_table(), set(), [pid]
    while todo:
        parent = todo.pop()
        for child, ppid in table.items():
            if ppid == parent and child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    positive_int("pid", pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:  # no /proc (macOS): kill(pid, 0) is the answer
        return True


def signal_groups(pids, sig) -> None:
    """Send `sig` to the process group each pid leads (its own children go too), else to the pid alone.

    Gone processes are skipped; this process and its own group are never signalled.
    """
    mine = {os.getpid(), os.getpgrp()}
    for pid in pids:
        if pid <= 1 or pid in mine:
            continue
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def wait_gone(pids, timeout: float = 5.0) -> bool:
    """Wait up to `timeout` seconds until none of `pids` is alive; True if they are all gone."""
    end = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def kill_tree(pid: int, root: bool = True, wait: float = 5.0) -> set[int]:
    """SIGKILL every process below `pid`, and `pid` itself with its group unless root=False (a kernel that
    its manager shuts down); wait up to `wait` seconds until they are gone. Returns the pids signalled."""
    positive_int("pid", pid)
    if pid == os.getpid():
        raise ValueError(f"pid {pid} is this process: kill_tree would kill the caller")
    tree = descendants(pid)    # first: once a parent is killed, its orphans cannot be traced to it
    if root:
        tree.add(pid)
    signal_groups(sorted(tree), signal.SIGKILL)
    wait_gone(tree, wait)
    return tree


def _check_argv(argv) -> None:
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, (str, os.PathLike)) for a in argv):
        raise TypeError(f"a command must be a non-empty list of strings (an argv); got {argv!r}")


def start(argv, env: dict | None = None, cwd=None, base: dict | None = None, **popen_kwargs) -> subprocess.Popen:
    """Popen(argv) in a session of its own, with `base` (default os.environ) + OMP_NUM_THREADS=1 + `env` (one
    thread: several processes share few cores). popen_kwargs (stdin, stdout, stderr, text) go to Popen."""
    _check_argv(argv)
    for name, value in (("env", env), ("base", base)):
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"{name} must be a dict of variables or None; got {type(value).__name__}")
    environment = os.environ if base is None else base
    return subprocess.Popen(list(argv), cwd=cwd, env={**environment, "OMP_NUM_THREADS": "1", **(env or {})},
                            start_new_session=True, **popen_kwargs)


def _watch(procs, seen: dict, deadline: float, grace: float) -> bool:
    """Wait until every command ended, one failed `grace` seconds ago, or the deadline; True at the deadline."""
    failed_at, next_scan = None, 0.0
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if now > deadline:
            return True
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now
        if failed_at is not None and now > failed_at + grace:
            return False
        if now > next_scan:  # remember the workers: they may outlive a killed torchrun
            for p in procs:
                if p.poll() is None:
                    seen[p.pid] |= descendants(p.pid)
            next_scan = now + 0.5
        time.sleep(0.05)
    return False


def _stop(procs, seen: dict, grace: float) -> None:
    """SIGTERM every command still running (torchrun stops its workers), then SIGKILL every tree left."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        seen[p.pid] |= descendants(p.pid)
    signal_groups([p.pid for p in live], signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(p.poll() is None for p in live):
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            seen[p.pid] |= descendants(p.pid)
        signal_groups([p.pid, *sorted(pid for pid in seen[p.pid] if alive(pid))], signal.SIGKILL)
        p.wait(timeout=10)
    wait_gone([pid for pids in seen.values() for pid in pids])  # SIGKILL is delivered asynchronously


def run_commands(commands, timeout: float = 120.0, env: dict | list | None = None, cwd=None,
                 grace: float = 5.0, base: dict | None = None) -> list[CommandResult]:
    """Run each argv at once, each in its own session; on a failure or the deadline kill every tree.

    env: extra variables for every command, or a list with one dict per command (added to
    `base`, default os.environ, and OMP_NUM_THREADS=1).
    Returns one CommandResult (returncode, stdout, stderr, timed_out, pids seen) per command. When one
    command fails the others get `grace` seconds to notice (torchrun agents do) before they
    are killed: a node whose peer died would otherwise wait out the rendezvous timeout.
    """
    positive_number("timeout", timeout, finite=False, hint=" (seconds)")
    number_in_range("grace", grace, 0, hint=" (seconds)")
    commands = list(commands)
    envs = env if isinstance(env, list) else [env] * len(commands)
    if len(envs) != len(commands) or not all(e is None or isinstance(e, dict) for e in envs):
        raise TypeError(f"env must be a dict, None, or a list of {len(commands)} dicts (one per command)")
    for cmd in commands:    # all of them before any starts
        _check_argv(cmd)
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in commands]
    procs, seen, timed_out = [], {}, False
    try:
        deadline = time.monotonic() + timeout
        for cmd, extra, (out, err) in zip(commands, envs, files):
            procs.append(start(cmd, env=extra, cwd=cwd, base=base, stdout=out, stderr=err, text=True))
            seen[procs[-1].pid] = set()
        timed_out = _watch(procs, seen, deadline, grace)
    finally:
        _stop(procs, seen, grace)
    results = []
    for p, (out, err) in zip(procs, files):
        out.seek(0)
        err.seek(0)
        results.append(CommandResult(p.returncode, out.read(), err.read(), timed_out, sorted({p.pid} | seen[p.pid])))
        out.close()
        err.close()
    return results
