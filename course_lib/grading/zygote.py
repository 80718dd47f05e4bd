"""Python processes forked from a template that has imported torch: seconds less per sandbox.

    proc = zygote.popen([sys.executable, "-c", code, *args], work, hide, limits, env, cwd, stdin=PIPE, ...)
    proc = zygote.popen([sys.executable, "-c", code, *args], None, (), None, env, cwd, ...)   # not jailed

A sandbox is a new Python that imports torch (about 3 CPU-s) and, at its first optimizer step,
torch._dynamo (2 more). Every grading starts several, so the grader keeps one template process, the
zygote: `python zygote.py FD`, started with the allow-listed environment only (grading.environment),
which imports torch, torch._dynamo and IPython's shell and nothing of the course (no test, no
solution, no grader state is ever in its memory), then forks a child per request. The child (single-
threaded, as a fork is) closes every descriptor but the three it was sent, takes the request's
environment, enters the jail itself (jail.enter: namespaces, read-only file system, nobody or no
capabilities, limits; or not, for `work=None`: a learner's own check, run as processes.start would) and
runs the code as `python -c` would: a fresh __main__, sys.argv, sys.path
from PYTHONPATH, torch's thread count from OMP_NUM_THREADS, new random seeds (Python's, numpy's,
torch's), atexit handlers its own.

`popen` returns a Popen-like handle (pid, stdin, stdout, poll, wait, returncode) whose exit code the
zygote reports; kill it with processes.kill_tree as any other. Where the zygote cannot run (no jail
for a jailed request, not Linux, a command that is not `python -c`, a zygote that failed to start) it
falls back to exec'ing `jail.wrap(argv)` (or argv itself, not jailed). The zygote ends when its grader
does (its socket closes, or it is orphaned) or after IDLE_S without a child (a learner's kernel keeps
no idle 0.7 GB process; the next request starts a new one); its children die with it (parent-death
signal), and their jails with them.
"""
from __future__ import annotations

import array
import atexit
import builtins
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import types

if __package__:
    from . import jail
else:   # run as a script: the jail sits beside this file, and course_lib is never imported
    import jail

_MAX_MESSAGE = 1 << 20
_READY_S, _SPAWN_S = 120.0, 30.0
IDLE_S = 120.0
_PRELOAD = ("torch", "torch._dynamo", "IPython.core.interactiveshell")
_PER_CHILD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "COURSE_STUDENT_ID")   # not the zygote's
_BECOME = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")   # what a child sets from its request


def _send(sock, message: dict, fds=()) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([json.dumps(message).encode()], ancillary)


def _receive(sock) -> tuple[dict | None, list[int]]:
    """(message, descriptors) from a SOCK_SEQPACKET socket; (None, []) at EOF."""
    data, ancillary, flags, _ = sock.recvmsg(_MAX_MESSAGE, socket.CMSG_SPACE(3 * array.array("i").itemsize))
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if not data or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), list(fds)


# ---- the zygote (run as `python zygote.py FD IDLE_S`) ----

def _serve(fd: int, idle_s: float) -> None:
    sock = socket.socket(fileno=fd)
    import importlib
    for name in _PRELOAD:
        importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:   # a fork copies one thread: locks the others hold would never be released in the child
        _send(sock, {"unusable": f"the zygote runs {threads} threads after its imports; it must run one to fork"})
        return
    import gc
    import torch
    base = {"path": [p for p in sys.path[1:] if p not in _pythonpath(os.environ)],
            "threads": torch.get_num_threads(), "zygote": os.getpid()}
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)   # only to wake select through the wakeup descriptor
    gc.freeze()          # what the children inherit is never collected there: fewer copied pages
    parent, children, idle_since = os.getppid(), set(), time.monotonic()
    _send(sock, {"ready": True})
    while os.getppid() == parent:   # orphaned: the grader is gone
        ready = select.select([sock, wake_read], [], [], 1.0)[0]
        if wake_read in ready:
            os.read(wake_read, 4096)
        children -= _reap(sock)
        if children:
            idle_since = time.monotonic()
        elif sock not in ready and time.monotonic() - idle_since > idle_s:
            return   # a request sent now finds the socket closed: the grader then execs it
        if sock in ready:
            request, fds = _receive(sock)
            if request is None:
                return
            pid = os.fork()
            if pid == 0:
                try:
                    _child(request, fds, sock, base)
                except BaseException as exc:  # noqa: BLE001 - said on the sandbox's stderr, as the jail says its own
                    os.write(2, f"zygote: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
                finally:
                    os._exit(125)
            for received in fds:
                os.close(received)
            children.add(pid)
            _send(sock, {"pid": pid})


def _reap(sock) -> set[int]:
    """Report every child that ended; their pids."""
    ended = set()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.add(pid)
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _pythonpath(env) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _child(request: dict, fds: list[int], sock, base: dict) -> None:
    """In the forked child: become the jailed `python -c` the request asked for."""
    os.setsid()
    jail._libc.prctl(jail.PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != base["zygote"]:   # the zygote died before the signal was set
        os._exit(1)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.close(sock.detach())   # above all the zygote's socket: whoever holds it can ask for processes
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 3))   # every other descriptor the zygote had
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    if request["work"] is None:   # not jailed: a learner's own check, as processes.start would run it
        _become(argv, request["env"], base)
    jail.enter(request["work"], request["hide"], request["user"], request["rlimits"], jail._needed(argv),
               lambda env: _become(argv, env, base))


def _become(argv: list[str], env: dict, base: dict) -> None:
    """Run `python -c CODE ARGS` here, as a fresh interpreter would; exits with its code."""
    ctype = env.get("LC_CTYPE") or env.get("LANG") or "C"
    if not env.get("LC_ALL") and ctype in ("C", "POSIX") and env.get("PYTHONCOERCECLOCALE") != "0":
        env = {**env, "LC_CTYPE": "C.UTF-8"}   # Python's start-up coerces the C locale so (PEP 538)
    os.environ.clear()
    os.environ.update(env)
    import locale
    try:
        locale.setlocale(locale.LC_CTYPE, "")
    except locale.Error:   # not installed here: a fresh Python would keep the C locale too
        pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):   # what Python's start-up sets
        signal.signal(sig, signal.SIG_IGN)
    sys.argv = ["-c", *argv[3:]]
    sys.path[:] = ["", *_pythonpath(env), *base["path"]]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    # what the zygote's imports worked out from its own environment and file system, found again in the jail:
    # the temporary folder (the jail's /tmp may be read-only) and the user's site-packages (HOME is the work folder)
    import site
    import tempfile
    tempfile.tempdir, site.USER_BASE, site.USER_SITE = None, None, None
    if env.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)
    import torch
    threads = env.get("OMP_NUM_THREADS", "")
    # a fresh torch takes OMP_NUM_THREADS up to its default (the cores it found), else that default
    torch.set_num_threads(min(int(threads), base["threads"]) if threads.isdigit() and int(threads) > 0 else base["threads"])
    torch.seed()                        # a fresh torch seeds its generator at random; a fork would share it
    if "numpy.random" in sys.modules:   # Python's random reseeds itself after a fork; numpy's does not
        sys.modules["numpy.random"].seed()
    for name in ("jail", "zygote"):
        sys.modules.pop(name, None)
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __loader__=None, __spec__=None, __annotations__={})
    sys.modules["__main__"] = main
    atexit._clear()
    try:
        exec(compile(argv[2], "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as exc:
        code = exc.code if exc.code is None or isinstance(exc.code, int) else 1
        if not (exc.code is None or isinstance(exc.code, int)):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - printed as an uncaught exception is
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()   # what interpreter exit does: wait for the code's non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the code may have closed or replaced them
            pass
    os._exit(code or 0)


# ---- the grader's side ----

class _Record:
    def __init__(self):
        self.code: int | None = None


class Process:
    """A jailed process the zygote forked, used as a subprocess.Popen is (pid, stdin, stdout, poll, wait)."""

    def __init__(self, zygote: _Zygote, pid: int, record: _Record, args: list, stdin, stdout):
        self._zygote, self._record, self.pid, self.args = zygote, record, pid, args
        self.stdin, self.stdout = stdin, stdout

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
    def __init__(self, env: dict):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(theirs.fileno()), str(IDLE_S)],
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
            first, _ = _receive(self.sock)
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
                message, _ = _receive(self.sock)
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
            _send(self.sock, request, fds)
            with self.changed:
                if not self.changed.wait_for(lambda: self.replies or not self.alive, _SPAWN_S) or not self.replies:
                    raise OSError("the zygote did not answer")
                reply = self.replies.pop(0)
                return reply["pid"], reply["record"]

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
        if _zygote is not None and (_zygote.owner != os.getpid() or not _zygote.alive):
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


def popen(argv: list, work, hide, limits, env: dict, cwd, stdin=None, stdout=None, stderr=None, user: bool = True):
    """`argv` jailed in `work` (jail.wrap's arguments: as nobody if `user` and possible; work=None: not jailed,
    `env` exactly, as processes.start runs a command), forked from the zygote where argv is `python -c` with
    this Python, else exec'd; a Process or subprocess.Popen, in a session of its own either way.
    stdin, stdout, stderr: as Popen takes them (STDOUT only where it is exec'd)."""
    argv = [str(a) for a in argv]
    jailed = work is not None
    user = jailed and user and os.geteuid() == 0 and jail.can_drop_user()
    if argv[:2] == [sys.executable, "-c"] and len(argv) >= 3 and (jail.available() is None if jailed
                                                                   else jail._libc is not None):
        zygote = _get()
        if zygote is not None and _starts_as(env, zygote.env):
            keep, send, close = [], [], []
            try:
                for number, spec in enumerate((stdin, stdout, stderr)):
                    _descriptor(spec, number, keep, send, close)
                request = {"argv": argv, "work": jailed and os.path.abspath(work) or None,
                           "hide": [os.path.abspath(p) for p in hide],
                           "user": user, "rlimits": [f"{k}={v}" for k, v in (limits.rlimits().items() if limits else ())],
                           "env": env, "cwd": os.path.abspath(cwd)}
                pid, record = zygote.spawn(request, send)
                return Process(zygote, pid, record, argv, keep[0], keep[1])
            except OSError:
                for stream in keep:
                    if stream is not None:
                        stream.close()
            finally:
                for fd in close:
                    os.close(fd)
    return subprocess.Popen(jail.wrap(argv, work=work, hide=hide, user=user, limits=limits) if jailed else argv,
                            env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True)


if __name__ == "__main__":
    _serve(int(sys.argv[1]), float(sys.argv[2]))
