"""Seeing DDP's overlap: a timeline of a few 2-rank steps, and a sweep over bucket sizes (notebook 07).

    from course_lib import trace
    from course_lib.distributed.launch import launch
    from course_lib.distributed.ddp_overlap import overlap_timeline, bucket_sweep
    timeline = trace.merge(launch(overlap_timeline, 2))       # rows "rank r · main", ...
    rows = launch(bucket_sweep, 2, [0.05, 1, 4, 100])[0]      # step ms and all-reduces per step

Bucketing is a trade-off: tiny buckets start communicating early (overlap) but pay a fixed cost per
all-reduce (latency, launch); one huge bucket pays it once but starts only when backward is over.
`overlap_step_seconds` is also the worker of `python -m course_lib.bench ddp` (flat vs bucketed).
"""
from __future__ import annotations

import contextlib
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from .. import trace
from ..validate import positive_int
from .ddp import BucketedDDP, FlatDDP

VARIANTS = ("flat", "bucketed", "torch")


def mlp(width: int = 512, depth: int = 6) -> nn.Sequential:
    """784 -> width (x depth layers) -> 10 with ReLU: many equal layers, so several buckets fill in turn."""
    positive_int("width", width)
    positive_int("depth", depth)
    dims = [784] + [width] * depth
    layers = [m for a, b in zip(dims, dims[1:]) for m in (nn.Linear(a, b), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def overlap_timeline(rank: int, world_size: int, variant: str = "bucketed", bucket_mb: float = 1.0,
                     width: int = 512, depth: int = 6, batch: int = 64, steps: int = 3) -> trace.Timeline:
    """Worker: record `steps` training steps of `mlp` under FlatDDP, BucketedDDP or torch DDP; return the Timeline.

    Phases are named forward / backward / optimizer ("all-reduce" for FlatDDP's call after backward).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}")
    torch.manual_seed(0)
    net = mlp(width, depth)
    model = {"flat": lambda: FlatDDP(net), "bucketed": lambda: BucketedDDP(net, bucket_mb),
             "torch": lambda: nn.parallel.DistributedDataParallel(net, bucket_cap_mb=bucket_mb)}[variant]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, 784, generator=g), torch.randint(0, 10, (batch,), generator=g)

    def step():
        opt.zero_grad()
        with record_function("forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with record_function("backward"):
            loss.backward()
        if variant == "flat":
            with record_function("all-reduce after backward"):
                model.sync_gradients()
        with record_function("optimizer"):
            opt.step()
        dist.barrier()     # ranks start each step together: the picture shows one step per band
    return trace.record(step, steps=steps, warmup=1, label=f"{variant} DDP, {world_size} ranks, bucket {bucket_mb} MB")


def timed_steps(step, steps: int) -> float:
    """Seconds per step, after two warm-up steps, measured between barriers (slowest rank counts)."""
    for _ in range(2):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    return (time.perf_counter() - t0) / steps


def overlap_step_seconds(rank: int, world_size: int, variant: str, width: int = 1024, steps: int = 10,
                         bucket_mb: float = 4.0) -> float:
    """Worker: seconds per step of a wide `mlp` (5 hidden layers) in FlatDDP ("flat") or BucketedDDP ("bucketed")."""
    if variant not in ("flat", "bucketed"):
        raise ValueError(f"variant must be 'flat' or 'bucketed'; got {variant!r}")
    torch.manual_seed(0)
    net = mlp(width, depth=5)
    model = FlatDDP(net) if variant == "flat" else BucketedDDP(net, bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 784), torch.randint(0, 10, (32,))

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        if variant == "flat":
            model.sync_gradients()
        opt.step()
    return timed_steps(step, steps)


@contextlib.contextmanager
def count_all_reduce():
    """Count dist.all_reduce calls and bytes on this rank while the block runs (hooks' own calls included)."""
    counts, lock, original = {"calls": 0, "bytes": 0}, threading.Lock(), dist.all_reduce

    def counting(tensor, *args, **kwargs):
        with lock:      # PowerSGD launches its second all-reduce from a future's callback thread
            counts["calls"] += 1
            counts["bytes"] += tensor.numel() * tensor.element_size()
        return original(tensor, *args, **kwargs)
    dist.all_reduce = counting
    try:
        yield counts
    finally:
        dist.all_reduce = original


def bucket_sweep(rank: int, world_size: int, bucket_mbs, width: int = 1024, steps: int = 8) -> list[dict]:
    """Worker: per bucket size, BucketedDDP's ms per step and all-reduces per step; FlatDDP as bucket_mb=None.

    The wide MLP of `overlap_step_seconds` (~5M parameters at width 1024, ~20 MB of gradients).
    """
    rows = []
    for mb in [None, *bucket_mbs]:
        with count_all_reduce() as counts:
            seconds = overlap_step_seconds(rank, world_size, "flat" if mb is None else "bucketed", width, steps,
                                           mb if mb is not None else 4.0)
        rows.append({"bucket_mb": mb, "step_ms": 1000 * seconds, "all_reduces": counts["calls"] / (steps + 2)})
    return rows


def overlap_summary(timeline: trace.Timeline) -> dict:
    """All-reduce time (ms, union over ranks and threads) and the part of it that ran while backward was still
    computing gradients, with its share. Barriers and broadcasts are left out.

    A backward span also holds the final wait for the last bucket (BucketedDDP waits at its end, as torch DDP
    does), so "computing" ends at the last all-reduce launched inside it (the last gradient's hook);
    a backward that launches none (FlatDDP) overlaps nothing.
    """
    def is_all_reduce(s):
        return s.kind == "comm" and ("all_reduce" in s.name or "allreduce" in s.name)
    reduces = [s for s in timeline.spans if is_all_reduce(s)]
    computing = []
    for b in (s for s in timeline.spans if s.kind == "backward"):
        end = b.start_us + b.dur_us
        launches = [s.start_us for s in reduces if s.row == b.row and b.start_us <= s.start_us < end]
        if launches:
            computing.append(trace.Span("backward computing", b.row, b.start_us, max(launches) - b.start_us,
                                        "backward"))
    sub = trace.Timeline(reduces + computing, label=timeline.label, start_ns=timeline.start_ns)
    comm = sub.overlap_ms("comm", "comm")           # a kind overlapping itself: the length of its union
    during = sub.overlap_ms("comm", "backward")
    return {"all_reduce_ms": comm, "during_backward_ms": during, "share": during / comm if comm else 0.0}
