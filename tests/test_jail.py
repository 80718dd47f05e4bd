"""course_lib.grading.jail: what jailed code can and cannot do. Plain Python in the jail (no torch): fast.

Every test runs a small program in the jail twice: exec'd by `python jail.py` (jail.wrap) and forked from
the grader's zygote (zygote.popen), which enters the same jail without an exec. As root, the default
mode (root without capabilities, mounts locked) runs everywhere; nobody's mode runs with a Python that
nobody may execute.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from course_lib.grading import jail, zygote

REPO = Path(__file__).resolve().parents[1]
# PYTHON* variables of the shell (PYTHONWARNINGS, PYTHONHASHSEED, ...) act at start-up, so the zygote execs a request
# with others than its own: not passed, as a grader's sandbox passes none but those it sets
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
       "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

pytestmark = pytest.mark.skipif(jail.available() is not None, reason=f"no jail here: {jail.available()}")


@pytest.fixture(params=["exec", "zygote"])
def how(request):
    """How the jailed Python starts: exec'd by jail.py, or forked from the zygote (which needs this Python)."""
    return request.param


def launch(code: str, work: Path, how: str, hide=(), user=False, python=sys.executable, limits=None, **streams):
    """Start `code` with `python` jailed in `work`; user=True forces nobody's mode (root only)."""
    argv = [python, "-c", textwrap.dedent(code)]
    if how == "zygote":
        if user and not jail.can_drop_user():
            pytest.skip("nobody cannot run this Python: the zygote forks only this one")
        proc = zygote.popen(argv, work, hide, limits, ENV, work, user=user, **streams)
        assert isinstance(proc, zygote.Process), "the zygote did not fork it (it fell back to an exec)"
        return proc
    argv = jail.wrap(argv, work=work, hide=hide, user=False, limits=limits)
    if user:
        argv.insert(argv.index("--"), "--user")
    return subprocess.Popen(argv, env=ENV, **streams)


def jailed(code: str, work: Path, how: str = "exec", hide=(), user=False, python=sys.executable,
           limits=None) -> subprocess.CompletedProcess:
    """Run `code` jailed (see launch) to its end: its exit code and what it printed."""
    with open(work.parent / f"{work.name}.out", "w+") as out, open(work.parent / f"{work.name}.err", "w+") as err:
        proc = launch(code, work, how, hide, user, python, limits, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        code = proc.wait(timeout=60)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([], code, out.read(), err.read())


@pytest.fixture(scope="module")
def nobody_python(tmp_path_factory):
    """A Python that nobody can run jailed (the venv's may sit under /root); skip if none or not root."""
    if os.geteuid() != 0:
        pytest.skip("nobody's mode needs a root grader")
    for python in dict.fromkeys([sys.executable, shutil.which("python3"), "/usr/bin/python3"]):
        if python and jailed("pass", tmp_path_factory.mktemp("probe"), user=True, python=python).returncode == 0:
            return python
    pytest.skip("no Python that nobody may run")


def sleepers(marker: str) -> list[int]:
    """Live (not zombie) processes, anywhere on the host, whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def unique_sleep() -> str:
    return f"1000.{uuid.uuid4().int % 10**12:012d}"   # `sleep 1000.<digits>`: a marker no one else has


def test_exit_code_output_cwd_home_and_work_folder(tmp_path, how):
    run = jailed("""
        import os, sys
        print(os.getcwd(), os.environ["HOME"])
        open("result.txt", "w").write("kept")
        sys.exit(7)
    """, tmp_path, how)
    assert run.returncode == 7, run.stderr
    assert run.stdout.split() == [str(tmp_path), str(tmp_path)]
    assert (tmp_path / "result.txt").read_text() == "kept"


@pytest.mark.parametrize("target", ["course", "site-packages", "home"])
def test_cannot_write_outside_the_work_folder(tmp_path, target, how):
    folder = {"course": REPO / "course_lib", "site-packages": Path(sysconfig.get_paths()["purelib"]),
              "home": Path.home()}[target]
    probe = folder / f"jail_probe_{uuid.uuid4().hex}.pth"
    run = jailed(f"""
        import errno
        try:
            open({str(probe)!r}, "w")
        except OSError as exc:
            print(errno.errorcode[exc.errno])
    """, tmp_path, how)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() in ("EROFS", "EACCES")
    assert not probe.exists()


@pytest.mark.skipif(str(Path(__file__).resolve()).startswith("/tmp/"),
                    reason="the course lives under /tmp: the jail keeps /tmp read-only instead of private")
def test_tmp_is_private(tmp_path, how):
    outside = Path("/tmp") / f"jail_outside_{uuid.uuid4().hex}"
    inside = Path("/tmp") / f"jail_inside_{uuid.uuid4().hex}"
    outside.write_text("grader")
    try:
        run = jailed(f"""
            import os
            open({str(inside)!r}, "w").write("student")
            print(os.path.exists({str(outside)!r}))
        """, tmp_path, how)
        assert (run.returncode, run.stdout.strip()) == (0, "False"), run.stderr
        assert not inside.exists()
    finally:
        outside.unlink()


def test_hidden_folder_and_file_look_empty(tmp_path, how):
    folder, file = REPO / "solutions", REPO / "tests" / "conftest.py"   # what the grader would hide
    run = jailed(f"""
        import os
        print(os.listdir({str(folder)!r}), repr(open({str(file)!r}).read()))
    """, tmp_path, how, hide=[folder, file, REPO / "no such path"])
    assert (run.returncode, run.stdout.strip()) == (0, "[] ''"), run.stderr
    assert os.listdir(folder) and file.read_text()


def test_runs_as_nobody_when_it_can(tmp_path):
    if os.geteuid() != 0 or not jail.can_drop_user():
        pytest.skip("nobody cannot run this Python (or not root)")
    run = subprocess.run(jail.wrap([sys.executable, "-c", "import os; print(os.getuid())"], work=tmp_path),
                         env=ENV, capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout.strip()) == (0, "65534"), run.stderr


def test_nobody_mode(tmp_path, nobody_python, how):
    (tmp_path / "given.txt").write_text("from the grader")
    run = jailed("""
        import os
        print(os.getuid(), os.getgid(), os.getgroups())
        open("given.txt", "a").write(", answered")
    """, tmp_path, how, user=True, python=nobody_python)
    assert (run.returncode, run.stdout.strip()) == (0, "65534 65534 []"), run.stderr
    assert (tmp_path / "given.txt").read_text() == "from the grader, answered"


def test_processes_left_behind_die(tmp_path, how):
    marker = unique_sleep()
    run = jailed(f"""
        import subprocess
        subprocess.Popen(["sleep", {marker!r}], start_new_session=True)
    """, tmp_path, how)
    assert run.returncode == 0, run.stderr
    assert sleepers(marker) == []


def test_killing_the_jail_kills_everything_inside(tmp_path, how):
    marker = unique_sleep()
    code = f"import subprocess, time; subprocess.Popen(['sleep', {marker!r}]); print('ready', flush=True); time.sleep(1000)"
    outer = launch(code, tmp_path, how, stdout=subprocess.PIPE)
    assert outer.stdout.readline().strip() == b"ready"
    deadline = time.monotonic() + 10
    while not sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleepers(marker)
    outer.kill()
    outer.wait(timeout=30)
    outer.stdout.close()
    deadline = time.monotonic() + 30   # the parent-death signal reaches the jail asynchronously
    while sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleepers(marker) == []


def test_signals_reach_the_command(tmp_path, how):
    code = "import time; print('ready', flush=True); time.sleep(1000)"
    outer = launch(code, tmp_path, how, stdout=subprocess.PIPE)
    assert outer.stdout.readline().strip() == b"ready"
    outer.terminate()
    assert outer.wait(timeout=30) == 128 + 15
    outer.stdout.close()


def test_grader_processes_are_invisible(tmp_path, how):
    run = jailed("import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))", tmp_path, how)
    assert (run.returncode, run.stdout.strip()) == (0, "[1, 2]"), run.stderr   # the reaper and this Python


HIDDEN = REPO / "solutions"
UNDO = f"""
    import ctypes, errno
    libc = ctypes.CDLL(None, use_errno=True)
    def tried(result):
        return "ok" if result == 0 else errno.errorcode[ctypes.get_errno()]
    print(tried(libc.umount2(b"/tmp", 2)), tried(libc.umount2({str(HIDDEN).encode()!r}, 2)),
          tried(libc.mount(None, b"/", None, 32 | 4096, None)), tried(libc.mount(None, b"/", None, 32, None)))
    try:
        open("/jail_probe", "w")
    except OSError as exc:
        print(errno.errorcode[exc.errno])
"""   # unmount /tmp and the hidden folder, remount / read-write (bind, then whole), write to /


def test_locked_mode_cannot_undo_the_jail(tmp_path, how):
    run = jailed(UNDO, tmp_path, how, hide=[HIDDEN])
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["EPERM"] * 4 + ["EROFS"]


def test_nobody_mode_cannot_undo_the_jail(tmp_path, nobody_python, how):
    run = jailed(UNDO, tmp_path, how, hide=[HIDDEN], user=True, python=nobody_python)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["EPERM"] * 4 + ["EROFS"]


def test_a_missing_command_is_exit_127(tmp_path):
    argv = jail.wrap(["no-such-command-anywhere"], work=tmp_path, user=False)
    run = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=60)
    assert run.returncode == 127 and "jail: cannot run" in run.stderr


def test_describe():
    tmp = "read-only /tmp" if str(Path(__file__).resolve()).startswith("/tmp/") else "private /tmp"
    assert jail.describe().startswith(f"namespaces, read-only file system, {tmp}, own PID namespace, "
                                      "loopback-only network, runs as ")


def test_loopback_works_and_nothing_else_is_reachable(tmp_path, how):
    """gloo and torchrun inside the jail talk over 127.0.0.1; the outside world, DNS included, is gone."""
    run = jailed("""
        import socket
        server = socket.create_server(("127.0.0.1", 0))
        socket.create_connection(server.getsockname(), timeout=5).sendall(b"hi")
        print(server.accept()[0].recv(2).decode())
        for where in (("1.1.1.1", 53), ("10.0.0.1", 80)):
            try:
                socket.create_connection(where, timeout=3)
                print("reached", where)
            except OSError as exc:
                print(exc.errno)
        print(sorted(name for _, name in socket.if_nameindex()))
    """, tmp_path, how)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split("\n")
    assert lines[0] == "hi" and lines[1] == lines[2] == "101" and lines[3] == "['lo']", run.stdout


def test_resource_limits_hold_and_cannot_be_raised(tmp_path, how):
    from course_lib.grading.limits import Limits
    # a child of the zygote starts with the memory of its torch import (about 0.8 GB) counted
    megabytes = 256 if how == "exec" else 1536
    code = f"""
        import os, resource
        try:
            bytearray({megabytes + 256} << 20)
            print("allocated")
        except MemoryError:
            print("MemoryError")
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            print("raised")
        except (ValueError, OSError):
            print("kept")
        print(resource.getrlimit(resource.RLIMIT_CPU)[0], resource.getrlimit(resource.RLIMIT_NPROC)[0])
    """
    run = jailed(code, tmp_path, how, limits=Limits(memory_mb=megabytes, cpu_seconds=30, processes=64))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:3] == ["MemoryError", "kept", "30 64"], run.stdout
    with pytest.raises(ValueError, match="memory_mb must be a whole number >= 1"):
        Limits(memory_mb=0)
