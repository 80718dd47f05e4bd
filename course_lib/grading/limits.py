"""Resource limits for the processes that run one submission's code (the sandbox, and what it starts).

    limits = Limits(memory_mb=4096, cpu_seconds=1800, processes=4096)
    jail.wrap(argv, work, limits=limits)          # the jail sets them before it runs the command
    Popen(argv, preexec_fn=limits.apply)          # where there is no jail

Each is a kernel resource limit (setrlimit), soft and hard alike, so the student's code cannot raise it:
- memory_mb: per process, RLIMIT_DATA (heap and private memory: what `bytearray(n)` or `torch.empty(n)`
  take). An allocation past it fails with MemoryError in that process; the machine keeps its memory.
  A sandbox forked from the zygote (course_lib.grading.zygote) starts with what importing torch took,
  about 0.8 GB, already counted, as a sandbox that imports torch itself would after its import.
- cpu_seconds: per process, RLIMIT_CPU; past it the kernel kills the process (SIGXCPU). The grader's
  wall-clock deadlines (per cell and per notebook) bound the rest.
- processes: RLIMIT_NPROC, processes and threads of the user the code runs as; a guard against a
  fork bomb. In a jail that keeps the grader's uid it counts the jail's own tasks only; where the
  jail runs the code as nobody, every submission graded at once shares nobody's count, so it is a
  machine-wide cap (the default leaves room for --jobs 16 scale-out practica on a 64-core machine).
"""
from __future__ import annotations

import resource
from dataclasses import dataclass

_NAMES = {"memory_mb": "DATA", "cpu_seconds": "CPU", "processes": "NPROC"}


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 4096
    cpu_seconds: int = 1800
    processes: int = 4096

    def __post_init__(self):
        for name in _NAMES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")

    def rlimits(self) -> dict[str, int]:
        """resource.RLIMIT_<NAME> -> the value to set (what the jail's --rlimit takes)."""
        return {"DATA": self.memory_mb << 20, "CPU": self.cpu_seconds, "NPROC": self.processes}

    def apply(self) -> None:
        """Set the limits on this process (a preexec_fn); never above a hard limit it already has."""
        for name, value in self.rlimits().items():
            which = getattr(resource, f"RLIMIT_{name}")
            hard = resource.getrlimit(which)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))

    def describe(self) -> str:
        return (f"{self.memory_mb} MB memory and {self.cpu_seconds} CPU-s per process, "
                f"{self.processes} processes")
