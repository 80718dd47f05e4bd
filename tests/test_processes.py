"""course_lib.processes, the one process supervisor: sessions, descendants, whole trees killed, deadlines.

Plain Python processes only (no torch): fast. The torchrun runs in test_multinode.py use the same
marker fixture to prove that nothing they start outlives them.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from course_lib.processes import (CommandResult, alive, descendants, kill_tree, run_commands, start,
                                  wait_gone)

SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]


def processes_with_marker(marker: str) -> list[int]:
    """Live processes whose environment holds COURSE_TEST_MARKER=marker (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"COURSE_TEST_MARKER={marker}".encode() in environ.split(b"\0") and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture
def marker():
    """An environment marker for every process a test starts; afterwards none may be alive."""
    value = uuid.uuid4().hex
    yield value
    if Path("/proc/self/environ").exists():
        assert processes_with_marker(value) == [], "processes started by the test outlived it (orphans)"


# like torchrun: the worker is in a session of its own, out of reach of killpg(parent)
HANGS_WITH_A_DETACHED_CHILD = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(300)
""")


def first_line(proc) -> str:
    return proc.stdout.readline().strip()


def test_start_runs_in_a_session_of_its_own_with_one_thread(marker):
    proc = start([sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'], os.environ['X'])"],
                 env={"X": "y", "COURSE_TEST_MARKER": marker}, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert out.split() == ["1", "y"]
    proc = start(SLEEP, env={"COURSE_TEST_MARKER": marker})
    try:
        assert os.getsid(proc.pid) == proc.pid != os.getsid(0)
    finally:
        assert kill_tree(proc.pid) == {proc.pid}
        proc.wait()


def test_descendants_and_kill_tree_reach_a_detached_grandchild(marker):
    proc = start([sys.executable, "-c", HANGS_WITH_A_DETACHED_CHILD], env={"COURSE_TEST_MARKER": marker},
                 stdout=subprocess.PIPE, text=True)
    grandchild = int(first_line(proc))
    assert descendants(proc.pid) == {grandchild} and alive(grandchild)
    assert kill_tree(proc.pid, root=False) == {grandchild}       # a kernel's children, not the kernel
    assert not alive(grandchild) and alive(proc.pid)
    assert proc.pid in kill_tree(proc.pid)
    proc.wait(timeout=10)
    assert not alive(proc.pid) and wait_gone([proc.pid], 0.1)


def test_wait_gone_gives_up_at_its_timeout(marker):
    proc = start(SLEEP, env={"COURSE_TEST_MARKER": marker})
    try:
        t0 = time.monotonic()
        assert not wait_gone([proc.pid], 0.3) and time.monotonic() - t0 < 5
    finally:
        kill_tree(proc.pid)
        proc.wait()


@pytest.mark.parametrize("bad", [0, -1, True, "1", None])
def test_a_bad_pid_is_refused(bad):
    for fn in (kill_tree, descendants, alive):
        with pytest.raises(ValueError, match="pid"):
            fn(bad)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="this process"):
        kill_tree(os.getpid())
    for argv in ("sleep 1", [], [sys.executable, 3], None):
        with pytest.raises(TypeError, match="argv"):
            start(argv)
    with pytest.raises(TypeError, match="env"):
        start(SLEEP, env=["X=1"])
    with pytest.raises(ValueError, match="timeout"):
        run_commands([["true"]], timeout=0)
    with pytest.raises(ValueError, match="grace"):
        run_commands([["true"]], grace=-1)
    with pytest.raises(TypeError, match="env"):
        run_commands([["true"], ["true"]], env=[{}])
    with pytest.raises(TypeError, match="argv"):         # checked before anything starts
        run_commands([["true"], "true"])


@pytest.mark.timeout(60)
def test_run_commands_returns_codes_and_outputs(marker):
    commands = [[sys.executable, "-c", "print('hi')"], [sys.executable, "-c", "import os; print(os.getcwd())"]]
    results = run_commands(commands, env={"COURSE_TEST_MARKER": marker}, cwd="/", timeout=60)
    assert all(isinstance(r, CommandResult) for r in results)
    assert [(r.returncode, r.stdout.strip(), r.timed_out) for r in results] == [(0, "hi", False), (0, "/", False)]


@pytest.mark.timeout(60)
def test_a_timeout_kills_the_whole_tree_including_detached_workers(marker):
    cmd = [sys.executable, "-c", HANGS_WITH_A_DETACHED_CHILD]
    (code, out, _, timed_out, pids), = run_commands([cmd], timeout=3, env={"COURSE_TEST_MARKER": marker}, grace=1)
    assert timed_out and code != 0 and out.strip().isdigit()
    assert len(pids) >= 2 and not any(alive(p) for p in pids)


@pytest.mark.timeout(60)
def test_a_failing_node_stops_the_others_after_the_grace_period(marker):
    fail = [sys.executable, "-c", "import sys; print('node failed', file=sys.stderr); sys.exit(3)"]
    (c0, _, e0, t0, _), (c1, _, _, t1, pids) = run_commands([fail, SLEEP], timeout=60, grace=1,
                                                           env={"COURSE_TEST_MARKER": marker})
    assert c0 == 3 and "node failed" in e0 and not t0 and not t1
    assert c1 == -signal.SIGTERM and not any(alive(p) for p in pids)


def test_start_from_a_given_base_environment_instead_of_this_processes(monkeypatch):
    monkeypatch.setenv("COURSE_TEST_NOT_PASSED", "1")
    proc = start([sys.executable, "-c", "import os; print(sorted(k for k in os.environ if k.startswith('COURSE_TEST')),"
                  " os.environ['OMP_NUM_THREADS'], os.environ['EXTRA'])"],
                 env={"EXTRA": "x"}, base={"PATH": os.environ["PATH"], "COURSE_TEST_BASE": "1"},
                 stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert out.split() == ["['COURSE_TEST_BASE']", "1", "x"]
    with pytest.raises(TypeError, match="base"):
        start([sys.executable, "-c", "pass"], base=["PATH"])
    with pytest.raises(TypeError, match="base"):
        run_commands([[sys.executable, "-c", "pass"]], base="PATH=/bin")
