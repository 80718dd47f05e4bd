"""Worker functions for the launch tests: `fn(rank, world_size, *args)`.

A top-level module of tests/ (pytest puts tests/ on sys.path: conftest.py, no __init__.py); the
workers get the launcher's sys.path, so they import it by the same name.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def fail_on_rank(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """Rank `bad_rank` raises; the others wait in a collective it never joins (as in real bugs)."""
    if rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    dist.barrier()
    return rank


def report_pid_then_sleep(rank: int, world_size: int, pid_dir: str) -> None:
    """Write this worker's pid to pid_dir/rank, then hang (for orphan tests)."""
    _write_atomically(os.path.join(pid_dir, str(rank)), str(os.getpid()))
    while True:
        time.sleep(1)


def start_child_then_sleep(rank: int, world_size: int, pid_dir: str) -> None:
    """Start a process of its own (in its own session), write its pid to pid_dir/child{rank}, then hang."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    _write_atomically(os.path.join(pid_dir, f"child{rank}"), str(child.pid))
    while True:
        time.sleep(1)


def add_rank_in_place(rank: int, world_size: int, t: torch.Tensor) -> list:
    """Add this rank to `t` in place; each rank must see its own copy of `t`."""
    t += rank
    dist.barrier()
    return t.tolist()


def environment(rank: int, world_size: int, name: str) -> str | None:
    """The worker's value of the environment variable `name`."""
    return os.environ.get(name)


def loaded(rank: int, world_size: int, names: list) -> list:
    """Which of the modules `names` this worker had before it ran (forked from a server that preloaded them)."""
    return [name for name in names if name in sys.modules]


def ddp_batchnorm_gradients(rank: int, world_size: int, batch: int = 8, seed: int = 0) -> list:
    """torch's DDP (plain BatchNorm1d, not synced) on rank r's slice of one seeded global batch: its gradients."""
    from torch import nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 5))
    x, y = torch.randn(world_size * batch, 20), torch.randint(0, 5, (world_size * batch,))
    ddp = nn.parallel.DistributedDataParallel(model)
    nn.functional.cross_entropy(ddp(x.chunk(world_size)[rank]), y.chunk(world_size)[rank]).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]      # numpy: pickled by value, not shared memory


def _write_atomically(path: str, text: str) -> None:
    """The tests poll for these files: they must never see one created but not yet written."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
