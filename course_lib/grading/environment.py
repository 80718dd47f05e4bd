"""The environment a student's code starts with: an allow-list of the grader's, never all of it.

    from course_lib.grading.environment import sealed
    subprocess.Popen(argv, env=sealed({"PYTHONPATH": ...}))

A grader runs in a TA's shell or a CI job, whose environment holds secrets: an API token, cloud
credentials, COURSE_SOLUTIONS_DIR (where the private tests are). Whatever a student's process can read
it can print, raise in an error message or return, and those reach the report and the feedback. So
every process that runs student code (the grading sandbox, make_it_small's measuring children, the
scale-out practicum's torchrun and its ranks) starts from these names only, each kept for a reason:

- PATH: finding programs (`ps` for the process supervisor, compilers for torch.compile);
- LANG, LC_ALL, LC_CTYPE, TZ: text encoding and local time as on the grader's machine;
- TMPDIR: where temporary files go (inside the jail /tmp is private anyway);
- OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS: the grader's share of the cores;
- CUDA_VISIBLE_DEVICES, LD_LIBRARY_PATH: which GPU, and CUDA's libraries where a cluster puts them aside;
- COURSE_DATA_DIR, COURSE_DOWNLOAD, COURSE_QUICK: the course's data, offline mode and quick mode;
- COURSE_STUDENT_ID: the student's own id, from which their practicum variant is drawn.
Each caller adds what it sets itself (PYTHONPATH with this course_lib first, HOME, a cache folder).
"""
from __future__ import annotations

import os

ALLOWED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
           "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
           "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
           "COURSE_DATA_DIR", "COURSE_DOWNLOAD", "COURSE_QUICK", "COURSE_STUDENT_ID")


def sealed(extra: dict | None = None) -> dict:
    """The allowed names that this process has, then `extra` (which wins)."""
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict of variables or None; got {type(extra).__name__}")
    return {**{name: os.environ[name] for name in ALLOWED if name in os.environ}, **(extra or {})}
