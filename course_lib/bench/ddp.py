"""DDP benchmarks: scaling of torch DDP from 1 to 2 ranks, and bucketed overlap vs one flat all-reduce.

    python -m course_lib.bench ddp --json          # keys scaling_efficiency, overlap_speedup

Ratios measured side by side in one run, one thread per rank. scaling_efficiency = (images/s of
2 ranks, summed) / (2 x images/s of 1 rank) for `Net` at batch 128 per rank. overlap_speedup =
step time with FlatDDP / step time with BucketedDDP, on a wide MLP where the all-reduce of its
~10M gradients is a large part of the step.
"""
from __future__ import annotations

import torch
from torch import nn

from ..distributed.ddp_overlap import overlap_step_seconds, timed_steps
from ..distributed.launch import launch
from .result import BenchResult


def ddp_images_per_second(rank: int, world_size: int, batch: int = 64, steps: int = 20) -> float:
    """Worker: this rank's images/s training `Net` under torch DDP on random MNIST-shaped data."""
    from ..models import Net

    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return batch / timed_steps(step, steps)


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """Both measurements (data_dir is unused: random MNIST-shaped batches)."""
    # Batch 128 per rank and 60 steps: at batch 64 a step is ~9 ms on one core, and on a 2-core machine
    # the OS, gloo's threads and the launcher then swing the 2-rank figure by +-30% from run to run.
    steps, batch = (5, 64) if quick else (60, 128)
    one = launch(ddp_images_per_second, 1, batch, steps)[0]
    two = sum(launch(ddp_images_per_second, 2, batch, steps))
    flat = max(launch(overlap_step_seconds, 2, "flat", 1024, steps))
    bucketed = max(launch(overlap_step_seconds, 2, "bucketed", 1024, steps))
    rows = [{"run": "torch DDP, Net, 1 rank", "batch/rank": batch, "images/s": round(one)},
            {"run": "torch DDP, Net, 2 ranks", "batch/rank": batch, "images/s": round(two)},
            {"run": "FlatDDP, wide MLP, 2 ranks", "batch/rank": 32, "step ms": round(1000 * flat, 1)},
            {"run": "BucketedDDP, wide MLP, 2 ranks", "batch/rank": 32, "step ms": round(1000 * bucketed, 1)}]
    rows = [{k: r.get(k, "") for k in ("run", "batch/rank", "images/s", "step ms")} for r in rows]
    summary = {"benchmark": "ddp", "speedup": round(two / one, 2), "scaling_efficiency": round(two / (2 * one), 3),
               "overlap_speedup": round(flat / bucketed, 3), "images_per_second_1_rank": round(one, 1),
               "images_per_second_2_ranks": round(two, 1), "flat_step_ms": round(1000 * flat, 2),
               "bucketed_step_ms": round(1000 * bucketed, 2), "batch_per_rank": batch, "threads_per_rank": 1,
               "quick": quick}
    return BenchResult(f"DDP scaling (Net, batch {batch} per rank) and overlap (wide MLP), one thread per rank",
                       rows, summary)
