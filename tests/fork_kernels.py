"""The suite's notebook kernels forked from a template that imported torch: about 7 CPU-s less per kernel.

A kernel is a new Python that imports torch (4-5 CPU-s on a 2-core VM) and, at its first optimizer step,
torch._dynamo (2 more); the suite starts about 26 (nbval's lectures, tests/test_exercises.py, ...). Here
jupyter_client's launcher forks them from a zygote (course_lib.grading.zygote, not jailed) started with the
suite's environment as install() found it, and only kernels started with that same environment (but for what
jupyter_client sets per kernel) are forked: whatever acts when Python or torch starts (PYTHON*, the locale,
OMP_NUM_THREADS, TORCH* variables) acts as in a fresh kernel. The child becomes `python -m ipykernel_launcher ARGS`
(zygote_server.py: new random seeds, torch's thread count, signals, atexit, its own descriptors). One template
per worker, kept while it runs (about 0.6 GB). A kernel started in another environment (a test that set a
variable), or any other way (another Python, another command, `independent`), is exec'd as before, as is every
kernel when the template could not start. COURSE_FORK_KERNELS=0 turns it off.
"""
from __future__ import annotations

import os
import subprocess
import sys

from jupyter_client import launcher
from jupyter_client.provisioning import local_provisioner

from course_lib.grading import zygote

# what differs from kernel to kernel (jupyter_client's, and pytest's name of the test running): the kernel has
# them, the template does not
PER_KERNEL = ("JPY_PARENT_PID", "JPY_SESSION_NAME", "PYTEST_CURRENT_TEST")
# `python -m ipykernel_launcher`: the module as __main__, sys.argv[0] its file, sys.path[0] the working folder
LAUNCH = ("import os, runpy, sys; sys.path[0] = os.getcwd(); "
          "runpy.run_module('ipykernel_launcher', run_name='__main__', alter_sys=True)")
_base: dict | None = None       # the environment the template starts with
_template: zygote._Zygote | None = None
failed: str | None = None      # why the template could not start (e.g. OpenBLAS's threads: no OMP_NUM_THREADS)


def _steady(env) -> dict:
    return {k: v for k, v in env.items() if k not in PER_KERNEL}


def _template_for(env: dict):
    """The template, started at the first kernel; None for a kernel in another environment or without one."""
    global _template, failed
    if _base is None or failed or _steady(env) != _base:
        return None
    if _template is None or not _template.usable:
        try:   # kept for the worker's life (it ends with it): the suite starts a kernel every minute or two
            _template = zygote.start(_base, idle_s=24 * 3600)
        except OSError as exc:
            failed = str(exc)
            return None
    return _template


def launch_kernel(cmd, stdin=None, stdout=None, stderr=None, env=None, independent=False, cwd=None, **kw):
    """jupyter_client.launcher.launch_kernel, forking `python -m ipykernel_launcher` from a template."""
    if cmd[:3] != [sys.executable, "-m", "ipykernel_launcher"] or independent or kw or sys.platform != "linux":
        return launcher.launch_kernel(cmd, stdin, stdout, stderr, env, independent, cwd, **kw)
    env = dict(os.environ if env is None else env, JPY_PARENT_PID=str(os.getpid()))   # as launch_kernel sets
    template = _template_for(env)
    if template is None:
        return launcher.launch_kernel(cmd, stdin, stdout, stderr, env, independent, cwd)
    return zygote.popen([sys.executable, "-c", LAUNCH, *cmd[3:]], None, (), None, env, cwd or os.getcwd(),
                        subprocess.PIPE if stdin is None else stdin, stdout, stderr, zygote=template)


def install() -> None:
    """Fork the kernels of this process that start in the environment it has now."""
    global _base
    if os.environ.get("COURSE_FORK_KERNELS", "1") != "0":
        _base = _steady(os.environ)
        local_provisioner.launch_kernel = launch_kernel
