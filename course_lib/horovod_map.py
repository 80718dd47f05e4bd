"""Horovod's four steps, mapped onto the course's DDP code and made runnable by a shim over torch.distributed.

Horovod (github.com/horovod/horovod, docs/pytorch.rst) turns a one-process PyTorch script into a
data-parallel one with four additions (`HOROVOD_STEPS`). Horovod itself needs MPI or its own
compiled ops and is not installed here; this module implements the same four calls in a few dozen
lines of torch.distributed, so the mapping can be run and checked against torch DDP:

    from course_lib.distributed.launch import launch
    from course_lib import horovod_map
    results = launch(horovod_map.train_worker, 2, x, y)    # per rank: {"horovod": ..., "ddp": ...}
    horovod_map.agree(results)                             # 0.0: the same weights on every rank, both ways

`course_lines()` finds, in course_lib's own source as it is now, the lines that do each step for
`python -m course_lib.train --strategy ddp`.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# --- the shim: horovod.torch's API over torch.distributed ----------------------------------------

def init() -> None:
    """hvd.init(): join the process group. torchrun's environment (MASTER_ADDR, RANK, WORLD_SIZE) says where."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="env://")


def rank() -> int:
    return dist.get_rank()


def size() -> int:
    return dist.get_world_size()


def local_rank() -> int:
    """This process's index on its machine (LOCAL_RANK from torchrun): the GPU it should pin."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def broadcast_parameters(params, root_rank: int) -> None:
    """Overwrite every rank's tensors with rank `root_rank`'s, in place.

    params: a state_dict (whose tensors share the parameters' storage) or named_parameters()."""
    items = params.items() if isinstance(params, dict) else params
    with torch.no_grad():
        for _, tensor in items:
            dist.broadcast(tensor, root_rank)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Every rank takes `root_rank`'s optimizer state (momenta, step counts, learning rates)."""
    state = [optimizer.state_dict()]
    dist.broadcast_object_list(state, src=root_rank)
    optimizer.load_state_dict(state[0])


class DistributedOptimizer:
    """hvd.DistributedOptimizer: `step()` first averages every gradient over the ranks, then steps `optimizer`.

    Horovod starts each all-reduce from a hook as soon as backward has produced that gradient (as DDP's
    buckets do) and waits in step(); this shim all-reduces in step(), after backward: the same numbers.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters=None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer; got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.params = ([p for _, p in named_parameters] if named_parameters is not None else
                       [p for group in optimizer.param_groups for p in group["params"]])

    def synchronize(self) -> None:
        for p in self.params:
            if p.grad is not None:
                dist.all_reduce(p.grad)        # the sum over ranks ...
                p.grad /= size()               # ... divided by the ranks: the mean, as DDP leaves it

    def step(self, closure=None):
        self.synchronize()
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name):               # param_groups, state, state_dict, ...: the wrapped optimizer's
        return getattr(self.optimizer, name)


# --- the same training, with the shim and with torch DDP --------------------------------------------

USES = ("horovod", "ddp")


def train_worker(rank_: int, world_size: int, x: torch.Tensor, y: torch.Tensor, uses=USES,
                 batch_size: int = 32, lr: float = 0.05, model: str = "lenet300") -> dict:
    """Worker for `launch`: for each of `uses`, SGD with momentum on this rank's shard of (x, y), one batch per
    step, with "horovod" (the shim's four steps) or "ddp" (torch's DistributedDataParallel).

    Each rank builds its model from its own seed: only the broadcast makes the replicas equal.
    Returns {use: {"weights": [numpy arrays], "losses": [this rank's loss per step]}}.
    """
    bad = [u for u in uses if u not in USES]
    if bad or not uses:
        raise ValueError(f"uses must be a non-empty sequence of {USES}; got {uses!r}")
    return {use: _train(use, rank_, world_size, x, y, batch_size, lr, model) for use in uses}


def _train(use, rank_, world_size, x, y, batch_size, lr, model) -> dict:
    from .models import build_model

    torch.manual_seed(100 + rank_)                     # different initial weights on every rank
    net = build_model(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    if use == "horovod":
        init()
        broadcast_parameters(net.state_dict(), root_rank=0)
        broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = DistributedOptimizer(optimizer, named_parameters=net.named_parameters())
        train_model = net
    else:
        train_model = nn.parallel.DistributedDataParallel(net)   # its constructor broadcasts rank 0's weights
    shard = torch.arange(rank_, len(x), world_size)    # DistributedSampler's split, without shuffling
    losses = []
    for start in range(0, len(shard) - batch_size + 1, batch_size):
        idx = shard[start:start + batch_size]
        optimizer.zero_grad()
        loss = F.cross_entropy(train_model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"weights": [p.detach().numpy().copy() for p in net.parameters()], "losses": losses}


# --- where the course does each step ---------------------------------------------------------------

HOROVOD_STEPS = [   # (step, Horovod's line as in its docs/pytorch.rst, [(course_lib file, text on the line)], shim)
    ("1 · join the job", "hvd.init()",
     [("strategy.py", "dist.init_process_group("), ("env.py", 'DistInfo(_env_int("RANK"')], "init"),
    ("2 · one device per process", "torch.cuda.set_device(hvd.local_rank())",
     [("strategy.py", "return torch.device(\"cuda\", info.local_rank)"), ("strategy.py", "torch.cuda.set_device(dev)")],
     "local_rank"),
    ("3 · average the gradients",
     "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())",
     [("strategy.py", "return nn.parallel.DistributedDataParallel(model"),
      ("distributed/ddp.py", "dist.all_reduce(flat)  "), ("distributed/ddp.py", "flat /= dist.get_world_size()")],
     "DistributedOptimizer"),
    ("4 · start from equal weights",
     "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\nhvd.broadcast_optimizer_state(optimizer, root_rank=0)",
     [("train.py", "seed_everything(args.seed, info.rank)"), ("distributed/ddp.py", "dist.broadcast(t, src)")],
     "broadcast_parameters"),
]


def course_lines() -> list[dict]:
    """HOROVOD_STEPS with each course_lib line found in the source: {"step", "horovod", "course": [(where, line)],
    "shim"}. Raises LookupError when a line moved away, so the lecture's table cannot go stale silently."""
    root = Path(__file__).parent
    rows = []
    for step, horovod, places, shim in HOROVOD_STEPS:
        found = []
        for file, text in places:
            lines = (root / file).read_text().splitlines()
            hits = [i for i, line in enumerate(lines, 1) if text in line]
            if not hits:
                raise LookupError(f"course_lib/{file} no longer has a line with {text!r} (HOROVOD_STEPS, step {step})")
            found.append((f"course_lib/{file}:{hits[0]}", " ".join(lines[hits[0] - 1].split())))
        rows.append({"step": step, "horovod": horovod, "course": found, "shim": shim})
    return rows


def agree(results: list[dict]) -> float:
    """Largest weight difference between any rank's result for any use and rank 0's first one (`train_worker`'s)."""
    runs = [run for per_rank in results for run in per_rank.values()]
    first = runs[0]["weights"]
    return max(float(np.abs(a - b).max()) for run in runs for a, b in zip(first, run["weights"]))
