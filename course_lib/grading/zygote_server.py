"""The zygote itself: `python zygote_server.py FD IDLE_S`, a template process that forks jailed `python -c`s.

Started by course_lib.grading.zygote (the grader's side, which says why) with the allow-listed
environment only, it imports torch, torch._dynamo and IPython's shell and nothing of the course (it
runs as a script beside jail.py: no test, no solution, no grader state is ever in its memory), says
it is ready on the socket FD, and forks a child per request (a JSON message with the child's three
descriptors attached), which reads that request itself: the zygote never holds one. The child
(single-threaded, as a fork is) closes every descriptor but those three, takes the request's
environment, enters the jail itself (jail.enter; not for a request with no work folder) and runs
the code as `python -c` would: a fresh __main__, sys.argv, sys.path from PYTHONPATH, the C locale
coerced, torch's thread count from OMP_NUM_THREADS, new random seeds (Python's, numpy's, torch's),
atexit handlers its own, its exit code. The zygote reports each
child's exit on the socket, and ends when the socket closes, when it is orphaned, or after IDLE_S
seconds without a child; its children die with it (parent-death signal).
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
import sys
import threading
import time
import types

if __package__:
    from . import jail
else:   # run as a script: the jail sits beside this file, and course_lib is never imported
    import jail

_MAX_MESSAGE = 1 << 20
_PRELOAD = ("torch", "torch._dynamo", "IPython.core.interactiveshell")


def send(sock, message: dict, fds=()) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([json.dumps(message).encode()], ancillary)


def receive(sock) -> tuple[dict | None, list[int]]:
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


def _serve(fd: int, idle_s: float) -> None:
    sock = socket.socket(fileno=fd)
    import importlib
    for name in _PRELOAD:
        importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:   # a fork copies one thread: locks the others hold would never be released in the child
        send(sock, {"unusable": f"the zygote runs {threads} threads after its imports; it must run one to fork"})
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
    send(sock, {"ready": True})
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
            pid, read = _fork_reader(sock, base)
            if read == b"end":
                return
            if read == b"read":
                children.add(pid)
                send(sock, {"pid": pid})


def _fork_reader(sock, base: dict) -> tuple[int, bytes]:
    """Fork, then let the child read the request: the zygote never holds one, so no child finds an earlier
    request (another student's id, paths, environment) in the memory it inherits. (pid, b"read") once the child
    has it; b"end" when the socket closed; b"" when the child died before it could say (the request, if unread,
    is read by the next fork)."""
    said_read, say_read = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(said_read)
        try:
            os.setsid()   # before it says it read: whoever gets the pid finds it in a session and group of its own
            request, fds = receive(sock)
            os.write(say_read, b"end" if request is None else b"read")
            os.close(say_read)
            if request is not None:
                _child(request, fds, sock, base)
        except BaseException as exc:  # noqa: BLE001 - said on the sandbox's stderr, as the jail says its own
            os.write(2, f"zygote: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
        finally:
            os._exit(125)
    os.close(say_read)
    try:
        return pid, os.read(said_read, 8)
    finally:
        os.close(said_read)


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
        send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _pythonpath(env) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def _child(request: dict, fds: list[int], sock, base: dict) -> None:
    """In the forked child (in a session of its own): become the jailed `python -c` the request asked for."""
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
    for name in ("jail", "zygote_server"):
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


if __name__ == "__main__":
    _serve(int(sys.argv[1]), float(sys.argv[2]))
