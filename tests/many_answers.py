"""Worker for the checks' tests: a check's case worker on several answers in ONE launch (launches take seconds).

A top-level module of tests/ (on sys.path through conftest.py), so spawned workers import it by name. Each
answer runs in a fresh default process group with a short timeout: a wrong answer that fails on one rank
leaves its peers waiting (they time out) and messages in flight that must not reach the next answer.
"""
from __future__ import annotations

import datetime


def cases_many(rank: int, world_size: int, worker, answers: list, timeout_s: float = 5.0) -> list:
    """[worker(rank, world_size, source, name), or "ExceptionType: message"] for each (source, name) in `answers`."""
    import torch.distributed as dist

    store, out = dist.distributed_c10d._get_default_store(), []
    for i, (source, name) in enumerate(answers):
        dist.destroy_process_group()
        dist.init_process_group("gloo", store=dist.PrefixStore(f"answer{i}", store), rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
        try:
            out.append(worker(rank, world_size, source, name))
        except Exception as exc:   # noqa: BLE001 - comes back as text, judged by the test
            out.append(f"{type(exc).__name__}: {exc}")
    return out


def judge_or_raise(judge, world_size: int, per_rank: list) -> None:
    """judge(world_size, results), or the AssertionError run_on_ranks gives when a rank raised (the first that is
    not a peer timing out or losing its connection)."""
    errors = [r for r in per_rank if isinstance(r, str)]
    if errors:
        cause = next((e for e in errors if "imeout" not in e and "onnection" not in e), errors[0])
        raise AssertionError(f"on {world_size} ranks, {cause}")
    judge(world_size, per_rank)


def function_name(source: str) -> str:
    """The name of the first function `source` defines."""
    return source.split("def ", 1)[1].split("(", 1)[0]
