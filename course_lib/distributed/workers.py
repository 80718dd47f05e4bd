"""Small worker functions for `launch` demos (notebook 07, launch's docstring): `fn(rank, world_size, *args)`.

Workers that only tests use live in tests/launch_workers.py.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


def rank_info(rank: int, world_size: int) -> dict:
    """What a worker sees: its rank, the world size, the backend, the env torchrun would set."""
    return {"rank": rank, "world_size": world_size, "backend": dist.get_backend(),
            "env_rank": int(os.environ["RANK"]), "pid": os.getpid()}


def all_reduce_sum(rank: int, world_size: int, n: int = 4) -> list:
    """Each rank contributes [rank+1]*n; everyone gets the sum 1+2+...+world_size."""
    from ..env import rank_device

    t = torch.full((n,), float(rank + 1), device=rank_device())   # nccl reduces GPU tensors only
    dist.all_reduce(t)
    return t.tolist()
