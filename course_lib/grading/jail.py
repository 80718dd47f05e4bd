"""Run a command jailed with Linux namespaces: how the grader starts students' (untrusted) code.

    argv = jail.wrap([sys.executable, "answer.py"], work=folder, hide=[solutions])
    subprocess.run(argv, ...)          # its exit code is the command's (128 + N: killed by signal N)

Inside, the whole file system is read-only except the work folder (bound back read-write, also
the cwd and HOME) and a fresh /tmp, /var/tmp and /dev/shm; each `hide` path is covered by an empty
folder or an empty file. The command runs in a PID namespace of its own: /proc shows only its own
processes, and when it ends, or the jail's outer process is killed, everything it started dies.
A root grader runs it as nobody (uid 65534) when nobody can run the jailed Python (can_drop_user);
otherwise it keeps the grader's uid, without capabilities, in a user namespace of its own, so the
mounts are locked: it cannot unmount or remount anything. Root without capabilities still owns
root's files, so device nodes that give their owner more than everyone (disks, /dev/kmsg) are
covered with /dev/null, and /proc/sys, /proc/sysrq-trigger, /proc/irq, /proc/bus are read-only.
It has a network namespace of its own with only the loopback interface (up): processes inside
talk to each other over 127.0.0.1 (gloo, torchrun), nothing outside is reachable, not even DNS.
`limits` (course_lib.grading.limits) cap each process's memory, CPU time and the number of
processes; wall-clock time is the caller's job.

wrap() starts this file in isolated mode (python -I -S jail.py), not `python -m
course_lib.grading.jail`: that would import course_lib and so torch, seconds per start. enter() jails
the process that calls it, without an exec: the grading zygote's children (zygote_server.py) use it, so the
capabilities a user namespace grants are cleared here (capset), not left to an exec.
"""
from __future__ import annotations

import argparse
import ctypes
import errno
import functools
import os
import re
import select
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

NOBODY = 65534
TMPFS = "size=512m,mode=1777"
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, _CAP_VERSION_3 = 47, 4, 0x20080522
# A bind remount must restate these flags as they are: in a user namespace they are locked (EPERM)
_KEPT = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):   # capset takes two of these (capabilities 0-31 and 32-63)
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def wrap(command: list[str], work: str | os.PathLike, hide=(), user: bool = True, limits=None) -> list[str]:
    """The argv that runs `command` jailed in `work` (an existing folder); as nobody if `user` and possible;
    `limits`: a course_lib.grading.limits.Limits (None: no resource limits)."""
    return _argv(command, work, hide, user and os.geteuid() == 0 and can_drop_user(), limits)


@functools.cache
def available() -> str | None:
    """None if the jail works here, else a one-line reason (the jailed `python -c pass` failed)."""
    if _libc is None:
        return f"not Linux ({sys.platform})"
    return _try([sys.executable, "-c", "pass"], user=False, timeout=30)


@functools.cache
def can_drop_user() -> bool:
    """Root grader only: whether nobody can import course_lib and torch jailed (not if they sit under /root)."""
    if os.geteuid() != 0 or available() is not None:
        return False
    return _try([sys.executable, "-c", "import course_lib, torch"], user=True, timeout=120) is None


def describe() -> str:
    """One line for the grading report: how wrap(..., user=True) jails, or "none: <reason>"."""
    if (reason := available()) is not None:
        return f"none: {reason}"
    who = "as nobody" if can_drop_user() else f"as {'root' if os.geteuid() == 0 else 'its uid'} without capabilities"
    tmp = "read-only /tmp" if any(n.startswith("/tmp/") for n in _needed([sys.executable])) else "private /tmp"
    return f"namespaces, read-only file system, {tmp}, own PID namespace, loopback-only network, runs {who}"


def _argv(command, work, hide, user: bool, limits=None) -> list[str]:
    hidden = [arg for path in hide for arg in ("--hide", os.path.abspath(path))]
    limited = [arg for name, value in (limits.rlimits().items() if limits else ()) for arg in ("--rlimit", f"{name}={value}")]
    return [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--work", os.path.abspath(work),
            *hidden, *limited, *(["--user"] if user else []), "--", *map(str, command)]


def _try(command: list[str], user: bool, timeout: float) -> str | None:
    """Run `command` jailed in a scratch folder: None if it exits 0, else the last line it wrote to stderr."""
    course = str(Path(__file__).resolve().parents[2])   # the folder holding course_lib, for the jailed import
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [course, os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as work:
        try:
            run = subprocess.run(_argv(command, work, (), user), env=env, capture_output=True, text=True,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"jailed {command[-1]!r} took over {timeout:g} s"
    lines = run.stderr.strip().splitlines()
    return None if run.returncode == 0 else lines[-1] if lines else f"exit code {run.returncode}"


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), what)


def _mount(target: str, flags: int, source: str | None = None, fstype: str | None = None,
           data: str | None = None) -> None:
    source, fstype, data = (None if s is None else os.fsencode(s) for s in (source, fstype, data))
    _check(_libc.mount(source, os.fsencode(target), fstype, ctypes.c_ulong(flags), data), f"mount {target}")


def _remount(path: str, kept: int, readonly: bool) -> None:
    # MS_BIND: change this mount only, never its file system (the host's /, /dev, ...)
    _mount(path, MS_REMOUNT | MS_BIND | kept | (MS_RDONLY if readonly else 0))


def _mount_points() -> dict[str, int]:
    """Each mount point in /proc/self/mountinfo -> the flags to keep (of the last, i.e. top, mount there)."""
    points = {}
    with open("/proc/self/mountinfo") as file:
        for line in file:
            fields = line.split()
            options = set(fields[5].split(","))
            flags = sum(flag for name, flag in _KEPT.items() if name in options)
            flags |= 0 if options & {"noatime", "relatime"} else MS_STRICTATIME   # the atime mode is locked too
            points[re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])] = flags   # " " is \040
    return points


def _enter_user_namespace(uid: int, gid: int, flags: int) -> None:
    """unshare a user namespace (with `flags`) in which the current ids are uid and gid."""
    outside_uid, outside_gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(CLONE_NEWUSER | flags), "unshare user namespace")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {outside_uid} 1"),
                       ("gid_map", f"{gid} {outside_gid} 1")):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text)


def _needed(command: list[str]) -> list[str]:
    """What the command must still see: the course, its Python and PYTHONPATH, the data (real paths)."""
    paths = [Path(__file__).resolve().parents[2], Path(command[0]).absolute().parent.parent,
             Path(os.path.realpath(command[0])).parent.parent, Path(sys.base_prefix),
             *map(Path, filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))),
             *map(Path, filter(None, [os.environ.get("COURSE_DATA_DIR")]))]
    return [os.path.realpath(p) for p in paths]


def _build_file_system(work: str, hide: list[str], needed: list[str]) -> None:
    _mount("/", MS_REC | MS_PRIVATE)   # nothing mounted from here on shows outside
    # O_PATH now: after unshare (a bind needs a source in this namespace), before /tmp is covered
    work_fd = os.open(work, os.O_PATH | os.O_DIRECTORY)
    for path, kept in _mount_points().items():
        if path != "/proc" and not path.startswith("/proc/"):   # a fresh proc goes there below
            try:
                _remount(path, kept, readonly=True)
            except OSError as exc:   # an odd mount (EPERM in a container, say) stays as it is; "/" may not
                if path == "/" or exc.errno not in (errno.EPERM, errno.EACCES, errno.EINVAL):
                    raise
    for path in ("/tmp", "/var/tmp", "/dev/shm"):   # one that holds the course or Python stays read-only
        if os.path.isdir(path) and not any(n.startswith(os.path.join(path, "")) for n in needed):
            _mount(path, MS_NOSUID | MS_NODEV, "tmpfs", "tmpfs", TMPFS)
    for folder, _, names in os.walk("/dev"):
        for path in (os.path.join(folder, name) for name in names):
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) and (mode >> 6) & ~mode & 0o7:
                _mount(path, MS_BIND, "/dev/null")   # the owner may do more than anyone: a disk, /dev/kmsg
    umask = os.umask(0o022)
    os.makedirs(work, exist_ok=True)   # a work folder under /tmp needs its path on the new tmpfs
    os.umask(umask)
    _mount(work, MS_BIND, f"/proc/self/fd/{work_fd}")
    os.close(work_fd)
    _remount(work, _mount_points()[work], readonly=False)   # the bind came read-only from its source
    for path in hide:
        if os.path.isdir(path):
            _mount(path, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "tmpfs", "tmpfs", "size=4k,mode=755")
        elif os.path.exists(path):
            _mount(path, MS_BIND, "/dev/null")
    # Mounted from inside the new PID namespace, so it shows only the jail's processes
    _mount("/proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "proc", "proc")
    for path in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"):
        if os.path.exists(path):   # as root, even without capabilities, these files are writable
            _mount(path, MS_BIND, path)
            _remount(path, _mount_points()[path], readonly=True)


def _loopback_up() -> None:
    """Bring `lo` up in the new network namespace (it starts down): 127.0.0.1 works, nothing else exists."""
    import fcntl
    import socket
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack("16sh22x", fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack("16sh22x", b"lo", 0)))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", flags | IFF_UP))


def _set_rlimits(rlimits: list[str]) -> None:
    """NAME=VALUE pairs (resource.RLIMIT_<NAME>), soft and hard alike: the command cannot raise them."""
    import resource
    for item in rlimits:
        name, value = item.split("=")
        which = getattr(resource, f"RLIMIT_{name}")
        hard = resource.getrlimit(which)[1]   # never above what this process may set
        value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(which, (value, value))


def _drop_privileges(work: str, uid: int, gid: int, nobody: bool) -> None:
    os.chdir(work)
    if nobody:
        for folder, folders, files in os.walk(work):
            for path in [folder, *(os.path.join(folder, name) for name in folders + files)]:
                os.lchown(path, NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    else:
        # A user namespace (and mount namespace) below ours locks every mount (MNT_LOCKED): no
        # unmounting or remounting. The grader's own ids map to themselves; in case that is root,
        # an empty capability bounding set keeps exec from granting capabilities.
        _enter_user_namespace(uid, gid, CLONE_NEWNS)
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
                _check(-1, "drop capabilities")
    # Without an exec (the zygote's children) nothing else would clear the capabilities a new user namespace
    # gives its creator: none effective, permitted, inheritable or ambient
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "drop capabilities")
    if _libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0) != 0 and \
            ctypes.get_errno() != errno.EINVAL:   # EINVAL: a kernel older than ambient capabilities
        _check(-1, "clear ambient capabilities")
    # setuid programs (su, mount) and file capabilities grant nothing from here on
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0), "no new privileges")


def _die_with_parent(alive: int) -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0), "parent-death signal")
    if select.select([alive], [], [], 0)[0]:   # EOF: the parent died before the signal was set
        os._exit(1)


def _forward_signals(pid: int) -> None:
    for sig in _FORWARDED:
        signal.signal(sig, lambda sig, _: os.kill(pid, sig))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _fail(exc: OSError) -> None:
    sys.stderr.write(f"jail: {exc.filename or 'set-up'}: {exc.strerror}\n")
    sys.stderr.flush()
    os._exit(125)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m course_lib.grading.jail", description=__doc__.split("\n")[0])
    parser.add_argument("--work", required=True, help="the command's private folder (exists)")
    parser.add_argument("--hide", action="append", default=[], help="a folder or file to show empty")
    parser.add_argument("--user", action="store_true", help="a root grader: run the command as nobody")
    parser.add_argument("--rlimit", action="append", default=[], help="NAME=VALUE: resource.RLIMIT_NAME for the command")
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if not command:
        parser.error("no command after --")

    def run(env: dict) -> None:
        try:
            os.execvpe(command[0], command, env)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"jail: cannot run {command[0]}: {getattr(exc, 'strerror', None) or exc}\n")
            sys.stderr.flush()
            os._exit(127)
    enter(args.work, args.hide, args.user, args.rlimit, _needed(command), run)


def enter(work: str, hide: list[str], user: bool, rlimits: list[str], needed: list[str], run) -> None:
    """Jail this process (single-threaded; it stays outside, as the jail's outer process) and call
    `run(env)` in the jailed command process, which must exec or exit; never returns. `user`: a root
    grader runs the command as nobody; `rlimits`: NAME=VALUE pairs; `needed`: what stays readable
    (_needed). `python jail.py` runs an exec; the zygote (zygote_server.py) runs Python code it has loaded."""
    uid, gid = os.geteuid(), os.getegid()
    # PID 1 of a namespace ignores signals it has no handler for: blocked, they wait for the handlers
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
    try:
        if uid == 0:
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET), "unshare mount, PID and network namespaces")
        else:   # unprivileged user namespaces: be root there, over our own namespaces
            _enter_user_namespace(0, 0, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET)
        alive, parent_alive = os.pipe()   # the child sees EOF once this process is gone
        child = os.fork()
    except OSError as exc:
        _fail(exc)
    if child:   # outside the namespace: pass signals on, end as the child ends
        _forward_signals(child)
        os._exit(_exit_code(os.waitpid(child, 0)[1]))
    os.close(parent_alive)
    try:   # PID 1 of the new namespace
        _die_with_parent(alive)
        _loopback_up()
        _build_file_system(work, hide, needed)
        _drop_privileges(work, uid, gid, nobody=user and uid == 0)
        _die_with_parent(alive)   # changing credentials cleared the parent-death signal
    except OSError as exc:
        _fail(exc)
    env = {**os.environ, "HOME": work}
    command_pid = os.fork()
    if command_pid == 0:
        os.close(alive)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):   # Python ignores these; exec would keep that
            signal.signal(sig, signal.SIG_DFL)
        try:
            _set_rlimits(rlimits)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"jail: cannot set the limits: {getattr(exc, 'strerror', None) or exc}\n")
            sys.stderr.flush()
            os._exit(127)
        run(env)
        os._exit(127)
    # Stay a reaper of orphans; when the command ends, so does PID 1, and the kernel kills the rest
    _forward_signals(command_pid)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == command_pid:
            os._exit(_exit_code(status))


if __name__ == "__main__":
    main()
