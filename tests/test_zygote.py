"""course_lib.grading.zygote: a jailed `python -c` forked from a torch-loaded template behaves as a fresh one.

What the jail guarantees is tested for both ways of starting (test_jail.py, parametrized by `how`). Here:
what an exec would have reset and a fork must reset by hand (descriptors, capabilities, environment,
sys.path, thread count, random seeds, exit handling), the zygote's own environment, and that the
zygote and its children end with the grader.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from course_lib.grading import jail, zygote
from course_lib.grading.environment import ALLOWED
from test_jail import sleepers

REPO = Path(__file__).resolve().parents[1]
LOCALE = {name: os.environ[name] for name in ("LANG", "LC_ALL", "LC_CTYPE") if name in os.environ}  # the zygote's
ENV = {**LOCALE, "PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
       "COURSE_ZYGOTE_PROBE": "given"}

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the zygote needs Linux (prctl)")
needs_jail = pytest.mark.skipif(jail.available() is not None, reason=f"no jail here: {jail.available()}")


def forked(code: str, work: Path, env=None, args=()) -> subprocess.CompletedProcess:
    with open(work.parent / "out", "w+") as out, open(work.parent / "err", "w+") as err:
        proc = zygote.popen([sys.executable, "-c", textwrap.dedent(code), *args], work, [], None, env or ENV, work,
                            subprocess.DEVNULL, out, err)
        assert isinstance(proc, zygote.Process), f"not forked from the zygote: {zygote._failed}"
        returncode = proc.wait(timeout=60)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, returncode, out.read(), err.read())


@needs_jail
def test_a_forked_child_is_a_fresh_python_c(tmp_path):
    os.environ["COURSE_ZYGOTE_SECRET"] = "grader's"   # in the grader: never in the child
    try:
        run = forked("""
            import sys
            course = sorted(name for name in sys.modules if name.split(".")[0] in ("course_lib", "jail", "zygote"))
            import json, os, torch
            status = dict(line.split(":", 1) for line in open("/proc/self/status"))
            print(json.dumps({"argv": sys.argv, "path": sys.path[:2], "env": dict(os.environ), "cwd": os.getcwd(),
                              "fds": sorted(set(os.listdir("/proc/self/fd")) - {"3"}), "threads": torch.get_num_threads(),
                              "caps": [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
                              "no_new_privs": status["NoNewPrivs"].strip(), "main": __name__,
                              "bytecode": sys.dont_write_bytecode, "course": course}))
        """, tmp_path, args=["first", "second"])
    finally:
        del os.environ["COURSE_ZYGOTE_SECRET"]
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["argv"] == ["-c", "first", "second"] and seen["path"] == ["", str(REPO)] and seen["main"] == "__main__"
    assert "COURSE_ZYGOTE_SECRET" not in seen["env"] and seen["cwd"] == str(tmp_path)
    assert seen["env"].items() >= {**ENV, "HOME": str(tmp_path)}.items()   # and LC_CTYPE where Python coerces it
    assert seen["fds"] == ["0", "1", "2"], "a descriptor of the zygote (its socket!) reached the child"
    assert seen["caps"] == ["0000000000000000"] * 5 and seen["no_new_privs"] == "1"
    assert seen["threads"] == 1 and seen["bytecode"] is False
    assert seen["course"] == [], "the zygote loaded the course (its tests and solutions must never be in its memory)"


PROBE = """
import json, os, resource, signal, site, sys, tempfile
import torch
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
umask = os.umask(0); os.umask(umask)
print(json.dumps({
    "argv": sys.argv, "path": sys.path, "env": dict(os.environ), "cwd": os.getcwd(), "main": __name__,
    "tempdir": tempfile.gettempdir(), "user_site": site.getusersitepackages(), "threads": torch.get_num_threads(),
    "bytecode": sys.dont_write_bytecode, "flags": list(sys.flags), "umask": umask,
    "handlers": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ,
                                                    signal.SIGCHLD, signal.SIGHUP)],
    "blocked": sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []))),
    "limits": [resource.getrlimit(getattr(resource, "RLIMIT_" + n)) for n in ("DATA", "CPU", "NPROC", "NOFILE")],
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups(), os.getsid(0) == os.getpgid(0)],
    "fds": sorted(set(os.listdir("/proc/self/fd")) - {"3"}), "pids": sorted(os.listdir("/proc"))[:0],
    "status": {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
                                              "Seccomp")},
}, sort_keys=True))
"""


@needs_jail
@pytest.mark.parametrize("threads", ["1", "64", None])
def test_a_forked_child_sees_what_an_execd_one_sees(tmp_path, threads):
    """The same probe jailed both ways, with the same request: everything it can see of its start is equal."""
    from course_lib.grading.limits import Limits
    limits = Limits(memory_mb=3000, cpu_seconds=600, processes=500)
    env = {**{k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}, "PYTHONDONTWRITEBYTECODE": "1",
           **({"OMP_NUM_THREADS": threads} if threads else {})}
    execd = subprocess.run(jail.wrap([sys.executable, "-c", PROBE, "x"], work=tmp_path, user=False, limits=limits),
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert execd.returncode == 0, execd.stderr
    with open(tmp_path.parent / "out", "w+") as out:
        proc = zygote.popen([sys.executable, "-c", PROBE, "x"], tmp_path, [], limits, env, tmp_path, subprocess.DEVNULL,
                            out, None, user=False)
        assert isinstance(proc, zygote.Process) and proc.wait(timeout=60) == 0
        out.seek(0)
        forked = json.loads(out.read())
    for key, value in json.loads(execd.stdout).items():
        assert forked[key] == value, f"{key}: forked {forked[key]!r}, exec'd {value!r}"


@needs_jail
def test_not_jailed_a_forked_child_sees_what_processes_start_gives(tmp_path):
    """work=None (a learner's own make-it-small check): the probe forked sees what it sees exec'd, unjailed."""
    env = {**ENV, "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    argv = [sys.executable, "-c", PROBE, "x"]
    execd = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                           start_new_session=True)
    assert execd.returncode == 0, execd.stderr
    with open(tmp_path.parent / "out", "w+") as out:
        proc = zygote.popen(argv, None, (), None, env, tmp_path, subprocess.DEVNULL, out, None)
        assert isinstance(proc, zygote.Process), zygote._failed
        assert proc.wait(timeout=60) == 0
        out.seek(0)
        forked = json.loads(out.read())
    for key, value in json.loads(execd.stdout).items():
        assert forked[key] == value, f"{key}: forked {forked[key]!r}, exec'd {value!r}"
    # a locale or PYTHON* variable other than the zygote's acts at start-up, which a fork cannot redo: exec'd
    for other in ({**env, "LANG": "C" if LOCALE.get("LANG") != "C" else "C.UTF-8"}, {**env, "PYTHONHASHSEED": "7"}):
        proc = zygote.popen([sys.executable, "-c", "import sys; print(sys.flags.utf8_mode, hash('a'))"], None, (),
                            None, other, tmp_path, subprocess.DEVNULL, subprocess.PIPE)
        assert isinstance(proc, subprocess.Popen) and proc.communicate(timeout=60)[0] and proc.returncode == 0
    # what is not `python -c` runs as it is: not jailed, in a session of its own
    proc = zygote.popen(["sh", "-c", "echo $HOME; ps -o sid= -p $$; echo $$"], None, (), None, env, tmp_path,
                        subprocess.DEVNULL, subprocess.PIPE)
    home, sid, pid = proc.communicate(timeout=60)[0].decode().split()
    assert isinstance(proc, subprocess.Popen) and home == str(tmp_path) and sid == pid


# Reads the writable private memory this process inherited; prints how many times PREFIX is followed by the
# 32 characters whose sha256 is argv[1] (this process never holds those characters itself).
SCAN = """
import hashlib, re, sys
prefix, wanted, found = b"ZYGOTE-MARK-", sys.argv[1], 0
held = [("ZYGOTE-MARK-" + secret).encode() for secret in sys.argv[2:]]   # the control: a marker held here
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        span, perms, *rest = line.split()
        if perms.startswith("rw") and (len(rest) < 4 or rest[3] in ("[heap]", "[stack]")):
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue
            for m in re.finditer(re.escape(prefix), data):
                found += hashlib.sha256(data[m.end():m.end() + 32]).hexdigest() == wanted
print(found)
"""


def test_no_child_inherits_an_earlier_request(tmp_path):
    """The zygote forks before a request is read: another student's environment, paths and code never reach the
    memory the next child inherits (a child reads its own request after the fork)."""
    import hashlib
    import uuid
    secret = uuid.uuid4().hex                                     # 32 characters
    marker = "ZYGOTE-MARK-" + secret
    first = zygote.popen([sys.executable, "-c", f"# {marker}", marker], None, (), None,
                         {**ENV, "COURSE_ZYGOTE_PROBE": marker}, tmp_path, subprocess.DEVNULL, subprocess.DEVNULL)
    assert isinstance(first, zygote.Process), zygote._failed
    assert first.wait(timeout=60) == 0
    digest = hashlib.sha256(secret.encode()).hexdigest()
    found = []
    for held in ([secret], []):          # first the control: the scan finds a marker its process holds
        with open(tmp_path / "out", "w+") as out:
            scan = zygote.popen([sys.executable, "-c", SCAN, digest, *held], None, (), None, ENV, tmp_path,
                                subprocess.DEVNULL, out)
            assert isinstance(scan, zygote.Process), zygote._failed
            assert scan.wait(timeout=120) == 0
            out.seek(0)
            found.append(int(out.read()))
    assert found[0] >= 1, "the scan does not find a marker its own process holds"
    assert found[1] == 0, f"a child found an earlier request's marker {found[1]} times in the memory it inherited"


def test_a_zygote_of_ones_own_forks_in_its_environment_and_is_execd_once_it_ended(tmp_path):
    own = zygote.start({**ENV, "COURSE_ZYGOTE_PROBE": "own"}, idle_s=1.0)
    code = "import os, sys; print(os.getppid(), os.environ['COURSE_ZYGOTE_PROBE']); print('err', file=sys.stderr)"
    env = {**ENV, "COURSE_ZYGOTE_PROBE": "own"}
    child = zygote.popen([sys.executable, "-c", code], None, (), None, env, tmp_path, subprocess.DEVNULL,
                         subprocess.PIPE, subprocess.PIPE, zygote=own)
    assert isinstance(child, zygote.Process)
    assert child.stdout.read().split() == [str(own.proc.pid).encode(), b"own"] and child.stderr.read() == b"err\n"
    assert child.wait(timeout=60) == 0
    assert own.proc.wait(timeout=30) == 0, "the zygote outlived its idle_s without a child"
    deadline = time.monotonic() + 10   # this process's reader thread sees the socket close
    while own.usable and time.monotonic() < deadline:
        time.sleep(0.05)
    again = zygote.popen([sys.executable, "-c", code], None, (), None, env, tmp_path, subprocess.DEVNULL,
                         subprocess.PIPE, subprocess.DEVNULL, zygote=own)
    assert isinstance(again, subprocess.Popen) and again.stdout.read().split()[1] == b"own"
    assert again.wait(timeout=60) == 0


@pytest.mark.parametrize("env, idle_s, error, match", [
    ("PATH=/bin", None, TypeError, "env must be a dict"),
    ({"OMP_NUM_THREADS": 1}, None, TypeError, "env must be a dict .* str values"),
    (ENV, 0, ValueError, "idle_s must be a number of seconds > 0"),
    (ENV, True, ValueError, "idle_s must be"),
    (ENV, "60", ValueError, "idle_s must be"),
])
def test_start_refuses_bad_input_by_name(env, idle_s, error, match):
    with pytest.raises(error, match=match):
        zygote.start(env, idle_s)


def test_messages_carry_descriptors_and_a_truncated_or_empty_one_reads_as_the_end(tmp_path):
    from course_lib.grading.zygote_server import receive, send
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs, open(tmp_path / "f", "w+") as f:
        send(ours, {"pid": 7}, [f.fileno()])
        message, fds = receive(theirs)
        assert message == {"pid": 7} and len(fds) == 1 and os.fstat(fds[0]).st_ino == os.fstat(f.fileno()).st_ino
        os.close(fds[0])
        before = len(os.listdir("/proc/self/fd"))
        send(ours, {"pid": 8}, [f.fileno()] * 5)   # room for three (four, aligned): the control data is truncated
        assert receive(theirs) == (None, []) and len(os.listdir("/proc/self/fd")) == before   # those received closed
        ours.shutdown(socket.SHUT_RDWR)
        assert receive(theirs) == (None, [])                      # the other side is gone


def test_an_idle_zygote_ends_and_the_next_request_starts_another(tmp_path, monkeypatch):
    monkeypatch.setattr(zygote, "IDLE_S", 1.0)
    monkeypatch.setattr(zygote, "_zygote", None)   # this test's own, with the short idle time
    first = zygote.popen([sys.executable, "-c", "import time; time.sleep(3)"], None, (), None, ENV, tmp_path,
                         subprocess.DEVNULL, subprocess.DEVNULL)
    assert isinstance(first, zygote.Process) and first.wait(timeout=60) == 0
    template = zygote._zygote.proc
    assert template.wait(timeout=30) == 0, "the zygote outlived IDLE_S without a child"   # not while its child ran
    deadline = time.monotonic() + 10   # the grader's reader thread sees the socket close
    while zygote._zygote.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not zygote._zygote.alive
    second = zygote.popen([sys.executable, "-c", "print('again')"], None, (), None, ENV, tmp_path,
                          subprocess.DEVNULL, subprocess.PIPE)
    assert isinstance(second, zygote.Process) and zygote._zygote.proc is not template
    assert second.stdout.read() == b"again\n" and second.wait(timeout=60) == 0
    zygote._zygote.close()


@needs_jail
def test_exit_codes_exceptions_atexit_and_unflushed_output(tmp_path):
    run = forked("""
        import atexit, sys
        atexit.register(lambda: print("at exit", end=""))
        print("unflushed", end=" ")
        sys.exit(5)
    """, tmp_path)
    assert (run.returncode, run.stdout) == (5, "unflushed at exit")
    run = forked("raise KeyError('no such key')", tmp_path)
    assert run.returncode == 1 and "KeyError: 'no such key'" in run.stderr and "Traceback" in run.stderr
    run = forked("import sys; sys.exit('a message')", tmp_path)
    assert (run.returncode, run.stderr.strip()) == (1, "a message")


@needs_jail
def test_two_children_draw_different_random_numbers_as_two_fresh_pythons_do(tmp_path):
    code = "import random, numpy, torch; print(random.random(), numpy.random.random(), torch.rand(1).item())"
    first, second = (forked(code, tmp_path).stdout.split() for _ in range(2))
    assert all(a != b for a, b in zip(first, second)) and len(first) == 3, (first, second)


@needs_jail
def test_the_zygote_holds_only_the_allowed_environment():
    assert zygote._get() is not None
    names = {entry.split(b"=", 1)[0].decode() for entry in
             Path(f"/proc/{zygote._zygote.proc.pid}/environ").read_bytes().split(b"\0") if entry}
    assert names <= set(ALLOWED) | {"PYTHONDONTWRITEBYTECODE", "OPENBLAS_NUM_THREADS", "PYTHONPATH"}, names
    assert "COURSE_STUDENT_ID" not in names and "OMP_NUM_THREADS" not in names


@needs_jail
def test_what_is_not_python_c_or_cannot_be_passed_is_execd(tmp_path):
    proc = zygote.popen(["true"], tmp_path, [], None, ENV, tmp_path, subprocess.DEVNULL, subprocess.DEVNULL)
    assert isinstance(proc, subprocess.Popen) and proc.wait(timeout=60) == 0
    # stderr=STDOUT has no descriptor to send: still jailed, by an exec
    proc = zygote.popen([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"], tmp_path,
                        [], None, ENV, tmp_path, subprocess.DEVNULL, subprocess.PIPE, subprocess.STDOUT)
    assert isinstance(proc, subprocess.Popen)
    assert sorted(proc.communicate(timeout=60)[0].split()) == [b"err", b"out"] and proc.returncode == 0


GRADER = """
import os, subprocess, sys, time
from pathlib import Path
from course_lib.grading import zygote
work, marker = Path(sys.argv[1]), os.environ.pop("SLEEP_MARKER")   # not in this process's command line
env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "LC_CTYPE")}
def sleeper(folder):
    folder.mkdir()
    proc = zygote.popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', %r])" % marker],
                        folder, [], None, env, folder, subprocess.DEVNULL, subprocess.DEVNULL)
    assert isinstance(proc, zygote.Process)
    return zygote._zygote.proc.pid
first = sleeper(work / "parent")
child = os.fork()
if child == 0:                        # a forked grader (as the class grader forks one per submission)
    print(first, sleeper(work / "child"), flush=True)
    time.sleep(1000)
os.waitpid(child, 0)
"""


@pytest.mark.slow
@needs_jail
def test_a_forked_grader_gets_its_own_zygote_and_everything_ends_with_the_graders(tmp_path):
    marker = f"1000.{os.getpid()}{time.monotonic_ns() % 10**9:09d}"
    grader = subprocess.Popen([sys.executable, "-c", GRADER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "SLEEP_MARKER": marker}, start_new_session=True)
    try:
        parents, childs = map(int, grader.stdout.readline().split())
        deadline = time.monotonic() + 30
        while len(sleepers(marker)) < 2 and time.monotonic() < deadline:   # each forked child starts its sleep
            time.sleep(0.1)
        assert parents != childs and len(sleepers(marker)) == 2
    finally:
        os.killpg(grader.pid, signal.SIGKILL)     # both graders die at once, as a killed job's do
        grader.wait()
    deadline = time.monotonic() + 30                # orphaned zygotes notice within a second or so
    while (sleepers(marker) or any(Path(f"/proc/{pid}").exists() for pid in (parents, childs))) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sleepers(marker) == [] and not any(Path(f"/proc/{pid}").exists() for pid in (parents, childs))
