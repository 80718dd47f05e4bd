"""A measured pipeline timeline: a few steps of `pipeline.run_schedule` on K ranks under the profiler.

`run_schedule` names every op with `record_function` ("forward mb0", "backward mb3", ...), so a
`course_lib.trace` timeline shows each rank's forwards and backwards, its sends/receives (comm) and
the optimizer step. Drawn under `schedules.plot_schedule`, it is the prediction next to what ran:
the white gaps of the measured rows are the bubble, plus whatever communication and noise add.

    from course_lib import trace
    from course_lib.distributed.launch import launch
    from course_lib.distributed import pipeline_trace
    timeline = trace.merge(launch(pipeline_trace.traced_steps, 2, "gpipe", 4))
    pipeline_trace.idle_share(timeline, K=2, M=4)      # measured; compare with (K-1)/(M+K-1)
"""
from __future__ import annotations

import re

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from .. import trace
from ..env import rank_device
from ..validate import positive_int
from . import schedules
from .pipeline import boundary_shapes, make_batch, make_mlp, run_schedule, split_model

_OP = re.compile(r"^(forward|backward) mb(\d+)$")


def traced_steps(rank: int, world_size: int, schedule: str = "gpipe", micro_batches: int = 4, steps: int = 3,
                 batch: int = 256, width: int = 1024, blocks: int = 5, seed: int = 0) -> trace.Timeline:
    """Worker: record `steps` SGD steps (after one untraced warm-up) of `make_mlp(width, blocks)` split over
    the ranks and run with `schedule`; returns this rank's Timeline (merge them with `trace.merge`).

    Wide layers (width 1024) make a micro-batch's compute last milliseconds, longer than a send; 5 blocks
    split into two stages of two wide Linears each, so the stages are balanced as the bubble formula assumes.
    """
    if batch % micro_batches:
        raise ValueError(f"batch={batch} must be divisible by micro_batches={micro_batches}")
    device = rank_device()
    stages = split_model(make_mlp(width, blocks, seed=seed), world_size)
    shapes = boundary_shapes(stages, torch.zeros(batch // micro_batches, 20))
    stage = stages[rank].to(device)
    opt = torch.optim.SGD(stage.parameters(), lr=0.01)
    stage_order = schedules.order(schedule, world_size, micro_batches)[rank]
    x, y = make_batch(0, batch, seed=seed)
    xs, ys = list(x.to(device).chunk(micro_batches)), list(y.to(device).chunk(micro_batches))

    def step():
        opt.zero_grad()
        with record_function("barrier"):
            dist.barrier()              # every step starts together, as after the previous flush
        run_schedule(stage, stage_order, xs, ys, shapes, nn.functional.cross_entropy)
        with record_function("optimizer"):
            opt.step()

    label = (f"{schedule}, K={world_size} gloo ranks, M={micro_batches}, MLP width {width}, batch {batch} "
             "of random data")
    recorded = trace.record(step, steps=steps, warmup=1, label=label)
    # gloo's own send/recv events span a message's whole life (until its wait), overlapping the ops: keep
    # the main thread's named phases and the short c10d calls that post a send or a receive
    spans = [s for s in recorded.spans if s.row == "main" and s.kind != "other" and not s.name.startswith("gloo:")]
    return trace.Timeline(spans, label=recorded.label, start_ns=recorded.start_ns)


def phase_order(timeline: trace.Timeline, row: str) -> list[tuple[str, int]]:
    """The ("F", m) / ("B", m) ops of one timeline row ("rank 1 · main"), in the order they started."""
    return [("F" if _OP.match(s.name)[1] == "forward" else "B", int(_OP.match(s.name)[2])) for s in _ops(timeline, row)]


def _ops(timeline: trace.Timeline, row: str) -> list:
    """The forward/backward spans of one row, by start time."""
    return sorted((s for s in timeline.spans if s.row == row and _OP.match(s.name)), key=lambda s: s.start_us)


def idle_share(timeline: trace.Timeline, K: int, M: int) -> float:
    """Measured bubble: 1 - (forward+backward time) / (K x step time), summed over the recorded steps.

    A step runs from the first op of any rank to the last op's end; each rank runs 2M ops per step.
    The gaps counted as idle are the schedule's bubble plus waits for sends and receives.
    """
    positive_int("K", K)
    positive_int("M", M)
    per_rank = [ops for ops in (_ops(timeline, row) for row in timeline.rows) if ops]
    if len(per_rank) != K:
        raise ValueError(f"K={K} but the timeline has forward/backward spans on {len(per_rank)} rows")
    steps = {len(spans) // (2 * M) for spans in per_rank}
    if len(steps) != 1 or any(len(spans) % (2 * M) for spans in per_rank):
        raise ValueError(f"every rank should run 2M={2 * M} ops per step; got {[len(s) for s in per_rank]} ops")
    wall = busy = 0.0
    for i in range(steps.pop()):
        ops = [s for spans in per_rank for s in spans[2 * M * i:2 * M * (i + 1)]]
        wall += max(s.start_us + s.dur_us for s in ops) - min(s.start_us for s in ops)
        busy += sum(s.dur_us for s in ops)
    return 1 - busy / (K * wall)


def label_micro_batches(ax, timeline: trace.Timeline, min_width: float = 0.012) -> None:
    """Write each forward/backward span's micro-batch number on it (as `schedules.plot_schedule` does),
    on the axes `timeline.draw` returned; spans narrower than `min_width` of the axis get no label."""
    left, right = ax.get_xlim()
    for s in timeline.spans:
        op = _OP.match(s.name)
        if op and s.dur_us / 1e3 >= min_width * (right - left):
            ax.text((s.start_us + s.dur_us / 2) / 1e3, timeline.rows.index(s.row), op[2], ha="center", va="center",
                    color="white", fontsize=7)
