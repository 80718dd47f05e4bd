"""Worker for tests/test_checks_nb16.py: the Horovod exercise's case worker on several answers in ONE launch.

A top-level module of tests/ (on sys.path through conftest.py), so spawned workers import it by name.
"""
from __future__ import annotations


def horovod_cases_many(rank: int, world_size: int, answers: list) -> list:
    """[(name, horovod_cases' result or "ExceptionType: message")] for each (source, name) in `answers`."""
    from course_lib.checks.nb16 import horovod_cases

    out = []
    for source, name in answers:
        try:
            out.append((name, horovod_cases(rank, world_size, source, name)))
        except Exception as exc:   # noqa: BLE001 - the stub's NotImplementedError comes back as a name
            out.append((name, f"{type(exc).__name__}: {exc}"))
    return out
