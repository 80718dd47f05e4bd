"""torch DDP beyond the defaults: communication hooks that compress gradients, and Join for uneven inputs (notebook 07).

    from course_lib.distributed.launch import launch
    from course_lib.distributed.ddp_hooks import compare_comm_hooks, uneven_inputs_with_join
    launch(compare_comm_hooks, 2)[0]          # per hook: bytes all-reduced per step, loss, test accuracy
    launch(uneven_inputs_with_join, 2)        # ranks with 4 and 7 batches both finish

A communication hook (`ddp.register_comm_hook(state, hook)`) replaces DDP's all-reduce of each bucket:
`fp16_compress_hook` sends the bucket as float16 (half the bytes, rounding error on every step);
`powerSGD_hook` sends a rank-r approximation P Q^T of each gradient matrix (far fewer bytes; the error it
leaves is added back on the next step, "error feedback"). Bytes are counted on the tensors the hooks
actually hand to dist.all_reduce (`ddp_overlap.count_all_reduce`).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.algorithms import Join
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from ..data import load_tensors
from ..models import Net
from ..rank_data import ShardedTensorLoader
from ..validate import positive_int
from .ddp_overlap import count_all_reduce

HOOKS = ("fp32 all-reduce", "fp16 compression", "PowerSGD rank 1")


def register_hook(model: nn.parallel.DistributedDataParallel, hook: str) -> None:
    """Register one of HOOKS on a torch DDP model (fp32: torch's own allreduce_hook, so its bytes are counted too)."""
    if hook == "fp32 all-reduce":
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook == "fp16 compression":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "PowerSGD rank 1":
        # start_powerSGD_iter=2: compress from the 2nd step (torch's default waits 1,000 plain steps first).
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        raise ValueError(f"hook must be one of {HOOKS}; got {hook!r}")


def train_with_hook(rank: int, world_size: int, hook: str, steps: int, batch: int, train_images: int,
                    test_images: int = 2000, lr: float = 0.05) -> dict:
    """Train `Net` with torch DDP and `hook` for `steps` steps; bytes are counted after the first 2 (warm-up)."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net())
    register_hook(model, hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = load_tensors("train", None, train_images)
    loader = ShardedTensorLoader(x, y, batch_size=batch, rank=rank, world_size=world_size, seed=0, drop_last=True)
    losses, done = [], 0
    with contextlib.ExitStack() as counting:
        while done < steps:
            for xb, yb in loader:
                if done == 2:
                    counts = counting.enter_context(count_all_reduce())
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
                losses.append(loss.item())
                done += 1
                if done == steps:
                    break
    model.eval()
    xt, yt = load_tensors("test", None, test_images)
    with torch.no_grad():
        accuracy = (model.module(xt).argmax(1) == yt).float().mean().item()
    tail = losses[-max(1, steps // 10):]
    return {"hook": hook, "bytes_per_step": counts["bytes"] / (steps - 2),
            "all_reduces_per_step": counts["calls"] / (steps - 2), "final_loss": sum(tail) / len(tail),
            "test_accuracy": accuracy, "losses": losses}


def compare_comm_hooks(rank: int, world_size: int, hooks=HOOKS, steps: int = 200, batch: int = 64,
                       train_images: int = 5000) -> list[dict]:
    """Worker: `train_with_hook` for each hook, same seed and data; one dict per hook (this rank's counts)."""
    positive_int("steps", steps)
    if steps < 3:
        raise ValueError(f"steps must be >= 3 (2 warm-up steps, then counted ones); got {steps}")
    return [train_with_hook(rank, world_size, h, steps, batch, train_images) for h in hooks]


def uneven_inputs_with_join(rank: int, world_size: int, batches_rank0: int = 4, extra_per_rank: int = 3) -> dict:
    """Worker: rank r trains on batches_rank0 + r*extra_per_rank batches under `with Join([model])`.

    Without Join the rank that runs out would leave while the others wait in their next all-reduce
    forever. Join has the finished rank shadow those all-reduces (with zeros) until every rank is done,
    then copies the last rank's weights to all. Returns batches done and a weight checksum per rank.
    """
    positive_int("batches_rank0", batches_rank0)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    n_batches, done = batches_rank0 + rank * extra_per_rank, 0
    with Join([model]):
        for _ in range(n_batches):
            opt.zero_grad()
            x, y = torch.randn(32, 784, generator=g), torch.randint(0, 10, (32,), generator=g)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            done += 1
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    return {"rank": rank, "batches": done, "weight_checksum": checksum}
