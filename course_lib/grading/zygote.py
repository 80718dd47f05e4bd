"""Python processes forked from a template that has imported torch: seconds less per sandbox.

    proc = zygote.popen([sys.executable, "-c", code, *args], work, hide, limits, env, cwd, stdin=PIPE, ...)
    proc = zygote.popen([sys.executable, "-c", code, *args], None, (), None, env, cwd, ...)   # not jailed

A sandbox is a new Python that imports torch (about 3 CPU-s) and, at its first optimizer step,
torch._dynamo (2 more). Every grading starts several, so each grader process keeps one template
process, the zygote (zygote_server.py: what it holds, and how its children become a fresh jailed
`python -c`), started with the allow-listed environment only (grading.environment); it imports
torch, torch._dynamo and IPython's shell and nothing of the course, then forks a child per request
(which reads the request itself: no child inherits an earlier one, another student's, from the zygote).
A request whose locale or PYTHON* variables differ from the zygote's is exec'd instead: those act
only when an interpreter starts.

`start(env)` gives a caller a zygote of its own, started with the environment it is given (the test suite
forks its notebook kernels, not jailed, from one started with the suite's: tests/fork_kernels.py).

`popen` returns a Popen-like handle (pid, stdin, stdout, poll, wait, returncode) whose exit code the
zygote reports; kill it with processes.kill_tree as any other. Where the zygote cannot run (no jail
for a jailed request, not Linux, a command that is not `python -c`, a zygote that failed to start) it
falls back to exec'ing `jail.wrap(argv)` (or argv itself, not jailed). The zygote ends when its grader
does (its socket closes, or it is orphaned) or after IDLE_S without a child (a learner's kernel keeps
no idle 0.7 GB process; the next request starts a new one); its children die with it (parent-death
signal), and their jails with them.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading

from . import jail, zygote_server
from .zygote_server import receive, send

_READY_S, _SPAWN_S = 120.0, 30.0
IDLE_S = 120.0
_PER_CHILD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "COURSE_STUDENT_ID")   # not the zygote's
_BECOME = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")   # what a child sets from its request


class _Record:
    def __init__(self):
        self.code: int | None = None


class Process:
    """A process the zygote forked, used as a subprocess.Popen is (pid, stdin, stdout, stderr, poll, wait)."""

    def __init__(self, zygote: _Zygote, pid: int, record: _Record, args: list, stdin, stdout, stderr):
        self._zygote, self._record, self.pid, self.args = zygote, record, pid, args
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr

    @property
    def returncode(self) -> int | None:
        return self._record.code

    def poll(self) -> int | None:
        return self._record.code

    def wait(self, timeout: float | None = None) -> int:
        with self._zygote.changed:
            if not self._zygote.changed.wait_for(lambda: self._record.code is not None, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self._record.code

    def send_signal(self, sig: int) -> None:
        if self._record.code is None:   # not yet reaped by the zygote: the pid is still this process's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Zygote:
    def __init__(self, env: dict, idle_s: float | None = None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        idle_s = IDLE_S if idle_s is None else idle_s
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(zygote_server.__file__), str(theirs.fileno()), str(idle_s)],
                                     pass_fds=[theirs.fileno()], env=env, cwd="/", stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.sock, self.owner, self.lock, self.env = ours, os.getpid(), threading.Lock(), env
        self.changed = threading.Condition()
        self.records: dict[int, _Record] = {}
        self.replies: list = []
        self.alive = True
        try:
            self.sock.settimeout(_READY_S)
            first, _ = receive(self.sock)
            self.sock.settimeout(None)
            if not first or not first.get("ready"):
                raise OSError((first or {}).get("unusable", "the zygote ended before it was ready"))
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message, _ = receive(self.sock)
            except OSError:
                message = None
            with self.changed:
                if message is None:   # the zygote is gone, and its children with it (parent-death signal)
                    self.alive = False
                    for record in self.records.values():
                        record.code = -signal.SIGKILL if record.code is None else record.code
                elif "exit" in message:
                    record = self.records.pop(message["exit"], None)
                    if record is not None:
                        record.code = message["code"]
                else:   # a reply to a spawn: its pid is registered before any exit of it can be read
                    if "pid" in message:
                        self.records[message["pid"]] = message["record"] = _Record()
                    self.replies.append(message)
                self.changed.notify_all()
                if message is None:
                    return

    def spawn(self, request: dict, fds: list[int]) -> tuple[int, _Record]:
        with self.lock:
            with self.changed:
                if not self.alive:
                    raise OSError("the zygote is gone")
            send(self.sock, request, fds)
            with self.changed:
                if not self.changed.wait_for(lambda: self.replies or not self.alive, _SPAWN_S) or not self.replies:
                    raise OSError("the zygote did not answer")
                reply = self.replies.pop(0)
                return reply["pid"], reply["record"]

    @property
    def usable(self) -> bool:
        """Running, and this process's: a forked copy of its owner cannot share the socket's replies."""
        return self.alive and self.owner == os.getpid()

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()


_zygote: _Zygote | None = None
_failed: str | None = None
_lock = threading.Lock()


def _get() -> _Zygote | None:
    """This process's zygote (started at the first call; again after one died or after a fork); None if it cannot run."""
    global _zygote, _failed
    from .environment import sealed
    with _lock:
        if _zygote is not None and not _zygote.usable:
            if _zygote.owner == os.getpid():
                _zygote.close()
            _zygote = None
        if _zygote is None and _failed is None:
            try:
                # numpy's OpenBLAS starts a thread pool when loaded unless told to run on one thread (then in the
                # children too: their BLAS work, rare next to torch's, runs on one core)
                env = {k: v for k, v in sealed().items() if k not in _PER_CHILD}
                env.update(PYTHONDONTWRITEBYTECODE="1", OPENBLAS_NUM_THREADS="1")
                if os.environ.get("PYTHONPATH"):   # torch may be installed there (pip --target); the children
                    env["PYTHONPATH"] = os.environ["PYTHONPATH"]   # get theirs from their own request
                _zygote = _Zygote(env)
                atexit.register(_zygote.close)
            except OSError as exc:
                _failed = str(exc)
        return _zygote


def start(env: dict, idle_s: float | None = None) -> _Zygote:
    """A zygote of the caller's own, started with `env` exactly, for popen(..., zygote=it): for processes whose
    whole environment must act at start-up as in a fresh Python (the test suite's notebook kernels: torch reads
    its variables when imported), where the grading zygote starts with the allow-listed ones. It ends with this
    process, or after `idle_s` (default IDLE_S) without a child. OSError where it cannot run."""
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise TypeError(f"env must be a dict of variable names to str values; got {type(env).__name__}")
    if idle_s is not None and not (isinstance(idle_s, (int, float)) and not isinstance(idle_s, bool) and idle_s > 0):
        raise ValueError(f"idle_s must be a number of seconds > 0, or None for IDLE_S; got {idle_s!r}")
    zygote = _Zygote(env, idle_s)
    atexit.register(zygote.close)
    return zygote


def _starts_as(env: dict, zygote_env: dict) -> bool:
    """Whether a Python started with `env` starts as the zygote did, but for what a child sets (_BECOME): the
    locale (UTF-8 mode, stream encodings) and PYTHON* variables (warnings, hash seed, ...) act only at start-up."""
    names = {name for name in (*env, *zygote_env)
             if name in ("LANG", "LC_ALL", "LC_CTYPE") or name.startswith("PYTHON") and name not in _BECOME}
    return all(env.get(name) == zygote_env.get(name) for name in names)


def _descriptor(spec, number: int, keep: list, send: list, close: list) -> None:
    """The child's descriptor `number` (0, 1, 2) as Popen takes it: PIPE, DEVNULL, None (this process's own),
    a descriptor or a file; appends this side's stream (or None) to `keep`, the descriptor to `send`."""
    if spec == subprocess.PIPE:
        read, write = os.pipe()
        ours, theirs = (write, read) if number == 0 else (read, write)
        keep.append(os.fdopen(ours, "wb" if number == 0 else "rb"))
        send.append(theirs)
        close.append(theirs)
        return
    keep.append(None)
    if spec == subprocess.DEVNULL:
        send.append(os.open(os.devnull, os.O_RDONLY if number == 0 else os.O_WRONLY))
        close.append(send[-1])
    elif spec is None or isinstance(spec, int) and spec >= 0:
        send.append(number if spec is None else spec)
    elif hasattr(spec, "fileno"):
        send.append(spec.fileno())
    else:
        raise OSError(f"the zygote cannot pass {spec!r} as descriptor {number}")


def popen(argv: list, work, hide, limits, env: dict, cwd, stdin=None, stdout=None, stderr=None, user: bool = True,
          zygote: _Zygote | None = None):
    """`argv` jailed in `work` (jail.wrap's arguments: as nobody if `user` and possible; work=None: not jailed,
    `env` exactly, as processes.start runs a command), forked from the zygote where argv is `python -c` with
    this Python, else exec'd; a Process or subprocess.Popen, in a session of its own either way.
    stdin, stdout, stderr: as Popen takes them (STDOUT only where it is exec'd). zygote: one from start() (exec'd
    once it has ended); by default this process's own, started with the allow-listed environment."""
    argv = [str(a) for a in argv]
    jailed = work is not None
    user = jailed and user and os.geteuid() == 0 and jail.can_drop_user()
    if argv[:2] == [sys.executable, "-c"] and len(argv) >= 3 and (jail.available() is None if jailed
                                                                   else jail._libc is not None):
        zygote = _get() if zygote is None else zygote
        if zygote is not None and zygote.usable and _starts_as(env, zygote.env):
            keep, send, close = [], [], []
            try:
                for number, spec in enumerate((stdin, stdout, stderr)):
                    _descriptor(spec, number, keep, send, close)
                request = {"argv": argv, "work": os.path.abspath(work) if jailed else None,
                           "hide": [os.path.abspath(p) for p in hide],
                           "user": user, "rlimits": [f"{k}={v}" for k, v in (limits.rlimits().items() if limits else ())],
                           "env": env, "cwd": os.path.abspath(cwd)}
                pid, record = zygote.spawn(request, send)
                return Process(zygote, pid, record, argv, *keep)
            except OSError:
                for stream in keep:
                    if stream is not None:
                        stream.close()
            finally:
                for fd in close:
                    os.close(fd)
    return subprocess.Popen(jail.wrap(argv, work=work, hide=hide, user=user, limits=limits) if jailed else argv,
                            env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True)
