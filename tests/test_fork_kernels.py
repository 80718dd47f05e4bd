"""tests/fork_kernels.py: the suite's kernels are forked from a template started with their own environment, and
one is, to the code in its cells, the kernel `python -m ipykernel_launcher` would have been."""
import json
import os
import subprocess
import sys
import time

import pytest
from jupyter_client.manager import start_new_kernel
from jupyter_client.provisioning import local_provisioner

import fork_kernels
from course_lib.grading import zygote

pytestmark = pytest.mark.skipif(local_provisioner.launch_kernel is not fork_kernels.launch_kernel,
                                reason="COURSE_FORK_KERNELS=0: kernels are exec'd")

PROBE = r"""
import json, os, random, sys, threading, torch
print(json.dumps({"argv0": sys.argv[0], "path0": sys.path[:4], "cwd": os.getcwd(), "threads": torch.get_num_threads(),
                  "env": os.environ.get("COURSE_PROBE"), "ppid": os.getppid(), "pid": os.getpid(),
                  "sid": os.getsid(0) == os.getpid(), "seeds": [random.random(), torch.rand(1).item()],
                  "main_thread": threading.current_thread() is threading.main_thread(),
                  "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:3]}))
"""


def probe(kc) -> dict:
    out = []
    kc.execute_interactive(PROBE, timeout=60, output_hook=lambda m: out.append(m["content"].get("text", ""))
                           if m["msg_type"] == "stream" else None)
    return json.loads("".join(out))


def test_a_forked_kernel_is_what_python_m_ipykernel_launcher_gives(monkeypatch, tmp_path):
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))      # in the suite's environment
    km2, kc2 = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        if fork_kernels.failed:
            pytest.skip(f"no template here: {fork_kernels.failed}")
        assert isinstance(km.provisioner.process, zygote.Process), (
            "a kernel in the suite's environment was exec'd: did a test module change os.environ at import?")
        # its own process group when its pid is known: a kill of the group (nbval's shutdown) is the kernel's only
        assert km.provisioner.pgid == km.provisioner.pid and km2.provisioner.pgid == km2.provisioner.pid
        forked, again = probe(kc), probe(kc2)
    finally:
        km.shutdown_kernel(now=True)
        km2.shutdown_kernel(now=True)
    monkeypatch.setattr(local_provisioner, "launch_kernel", fork_kernels.launcher.launch_kernel)
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        assert not isinstance(km.provisioner.process, zygote.Process)
        fresh = probe(kc)
    finally:
        km.shutdown_kernel(now=True)
    for key in ("argv0", "path0", "cwd", "threads", "env", "sid", "main_thread", "fds"):
        assert forked[key] == fresh[key], key
    assert forked["argv0"].endswith("ipykernel_launcher.py") and forked["cwd"] == str(tmp_path)
    assert forked["ppid"] == again["ppid"] != os.getpid()            # both from one template
    assert forked["seeds"] != again["seeds"]                          # Python's and torch's generators reseeded


def test_a_kernel_in_another_environment_is_exec_d(monkeypatch, tmp_path):
    """A variable that torch or Python reads when it starts would not act in a fork of the template."""
    monkeypatch.setenv("COURSE_PROBE", "set by a test")
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        assert not isinstance(km.provisioner.process, zygote.Process)
        assert probe(kc)["env"] == "set by a test"
    finally:
        km.shutdown_kernel(now=True)


def test_interrupt_and_shutdown_reach_the_forked_kernel(tmp_path):
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    pid = km.provisioner.process.pid
    msg_id = kc.execute("import time; time.sleep(60)")
    time.sleep(1.0)
    start = time.monotonic()
    km.interrupt_kernel()     # SIGINT to its process group, as nbval does at a cell's timeout
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - start < 20
    km.shutdown_kernel(now=True)
    assert km.provisioner is None or not km.provisioner.has_process
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)       # reaped by its template, not left behind


def test_a_command_that_is_not_this_pythons_kernel_is_exec_d():
    proc = fork_kernels.launch_kernel([sys.executable, "-c", "pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert not isinstance(proc, zygote.Process) and proc.wait(timeout=60) == 0
    proc = fork_kernels.launch_kernel([sys.executable, "-m", "ipykernel_launcher", "--help"], independent=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert not isinstance(proc, zygote.Process) and proc.wait(timeout=60) == 0
