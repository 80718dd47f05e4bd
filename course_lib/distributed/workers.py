"""Small worker functions for `launch` demos and tests: `fn(rank, world_size, *args)`."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def rank_info(rank: int, world_size: int) -> dict:
    """What a worker sees: its rank, the world size, the backend, the env torchrun would set."""
    return {"rank": rank, "world_size": world_size, "backend": dist.get_backend(),
            "env_rank": int(os.environ["RANK"]), "pid": os.getpid()}


def all_reduce_sum(rank: int, world_size: int, n: int = 4) -> list:
    """Each rank contributes [rank+1]*n; everyone gets the sum 1+2+...+world_size."""
    t = torch.full((n,), float(rank + 1))
    dist.all_reduce(t)
    return t.tolist()


def fail_on_rank(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """Rank `bad_rank` raises; the others wait in a collective it never joins (as in real bugs)."""
    if rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    dist.barrier()
    return rank


def sleep_forever(rank: int, world_size: int) -> None:
    """Never returns: for timeout tests."""
    while True:
        time.sleep(1)


def report_pid_then_sleep(rank: int, world_size: int, pid_dir: str) -> None:
    """Write this worker's pid to pid_dir/rank, then hang (for orphan tests)."""
    with open(os.path.join(pid_dir, str(rank)), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)


def add_rank_in_place(rank: int, world_size: int, t: torch.Tensor) -> list:
    """Add this rank to `t` in place; each rank must see its own copy of `t`."""
    t += rank
    dist.barrier()
    return t.tolist()
