"""Benchmark: GPipe on K = 2 processes, measured efficiency against the bubble model M/(M+K-1).

    python -m course_lib.bench pipeline --json      # M = 1, 2, 4, 8; key efficiency_vs_model
    python -m course_lib.bench pipeline --quick     # M = 1, 4 and fewer steps (what the tests run)

Each rank holds one stage: LAYERS = 8 x (Linear(1024, 1024), ReLU) on micro-batches of 64 rows, one
thread per rank. A stage's forward+backward of one micro-batch takes ~55 ms on one core, while
sending its activation (64 x 1024 fp32 = 256 KB) over gloo on localhost takes well under 1 ms
(`send_ms` below): the stages are compute-bound, as the bubble model assumes (and as real pipeline
stages are: a stage of transformer layers computes far more per byte of activation it sends).

Both stages do identical work: stage 0 also computes its input's gradient (as a middle stage
would), so the equal-stages assumption of the bubble model holds by construction.

How "measured efficiency" is defined (no figure here comes from the model):
- stage_k: median time of stage k's forward+backward on one micro-batch, measured while all K
  ranks compute their stage at the same time, as they do in a pipeline's steady state (so two
  ranks competing for caches and memory bandwidth is in it); T = sum_k stage_k. The same measured
  with the other ranks waiting in a barrier is reported as `stage_alone_ms`.
- ideal time of a step with M micro-batches = M * T / K (all K ranks busy all the time, no bubble);
- wall = the time between a barrier before and one after the pipelined step (slowest rank);
- measured efficiency = median over steps of ideal / wall, each step against stage times measured
  right before it (this machine's speed drifts by tens of percent within a minute);
  predicted efficiency = 1 - bubble = M / (M + K - 1).
So everything else that costs time in the real pipeline counts against it: the bubble,
communication, waits, and other load on the machine. `busy_fraction` = (sum over ranks of time
spent in forward/backward) / (K * wall) is reported too.

efficiency_vs_model = min over the measured M >= 4 of (measured / predicted); target >= 0.85.
busy_vs_model = the same with busy_fraction (1 - the measured bubble) in place of measured efficiency.

On a 2-core CPU the two stages take both cores, and gloo's I/O threads must preempt them to move
an activation: each transfer is a round of thread wake-ups on both ranks, milliseconds when the
cores are busy. `pipeline.run_schedule` therefore posts the receive for its next op before
computing the current one, so the data travels during compute; before it did, every backward on
stage 0 started 3-5 ms late and efficiency_vs_model was 0.80-0.91 (4 layers per stage). With
prefetching, six runs of this bench on a quiet 2-core machine: efficiency_vs_model 0.887-0.950,
busy_vs_model 0.92-0.97 (about 23 s each). On GPUs, or with more cores than stages, the CPU is free
for the I/O.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from ..distributed import schedules
from ..distributed.launch import launch
from ..distributed.pipeline import StepResult, run_schedule, sync
from ..env import rank_device
from .result import BenchResult

K = 2
LAYERS = 8
MS, QUICK_MS = (1, 2, 4, 8), (1, 4)


class _Sleep(torch.autograd.Function):
    """Stands in for compute: sleeps `ms` in forward and 2*ms in backward (as backward is ~2x forward)."""

    @staticmethod
    def forward(ctx, x, ms):
        ctx.ms = ms
        time.sleep(ms / 1e3)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.ms / 1e3)
        return grad, None


class SleepStage(nn.Module):
    """A tiny Linear plus a sleep: a stage whose duration does not depend on free cores (K > cores)."""

    def __init__(self, width: int, ms: float):
        super().__init__()
        self.linear, self.ms = nn.Linear(width, width), ms

    def forward(self, x):
        return _Sleep.apply(self.linear(x), self.ms)


def make_stage(work: str, width: int, layers: int, sleep_ms: float) -> nn.Module:
    """"matmul": layers x (Linear(width, width), ReLU); "sleep": SleepStage(width, sleep_ms)."""
    if work == "matmul":
        return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])
    if work == "sleep":
        return SleepStage(width, sleep_ms)
    raise ValueError(f"work must be 'matmul' or 'sleep'; got {work!r}")


def _loss(out, target):
    return out.square().mean()


def _stage_seconds(stage, x, rank: int, world_size: int, reps: int, together: bool, warmup: int = 2) -> float:
    """Median seconds of this stage's forward+backward on one micro-batch (input gradient included).

    together: all ranks compute at once (a barrier before each repetition); else one rank at a time
    while the others wait in a barrier.
    """
    times = []
    for r in range(1 if together else world_size):
        dist.barrier()
        if not together and r != rank:
            continue
        for i in range(reps + warmup):
            if together:
                dist.barrier()
            inp = x.clone().requires_grad_()
            sync(x.device)
            t0 = time.perf_counter()
            out = stage(inp)
            if rank == world_size - 1:
                _loss(out, None).backward()
            else:
                out.backward(torch.ones_like(out))
            sync(x.device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    dist.barrier()
    return statistics.median(times)


def _send_seconds(x, rank: int, reps: int = 10) -> float:
    """One-way time of sending `x` between ranks 0 and 1 (half a round trip, median)."""
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        elif rank == 1:
            dist.recv(x, 0)
            dist.send(x, 0)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)


def pipeline_timing(rank: int, world_size: int, Ms=MS, steps: int = 10, micro_batch: int = 64, width: int = 1024,
                    layers: int = LAYERS, work: str = "matmul", sleep_ms: float = 10.0,
                    schedule: str = "gpipe") -> dict:
    """Worker: this rank's stage times, send time, and per M the wall and busy seconds of pipelined steps.

    Returns {"stage_s", "alone_s", "send_s", "by_M": {M: {"wall_s", "busy_s", "events", "steps"}}}: the
    median step, its events, and every step's (wall_s, stage_s). Stage times are measured with all ranks
    computing at once right before each step (the machine's speed drifts); stage_s is their median,
    alone_s the same measured one rank at a time.
    """
    torch.manual_seed(rank)
    device = rank_device()
    stage = make_stage(work, width, layers, sleep_ms).to(device)
    x = torch.randn(micro_batch, width, device=device, requires_grad=True)   # stage 0: input gradient too
    reps = max(3, steps)
    out = {"alone_s": _stage_seconds(stage, x.detach(), rank, world_size, reps, together=False),
           "send_s": _send_seconds(x.detach().clone(), rank) if world_size > 1 else 0.0, "by_M": {}}
    shapes = [x.shape] * (world_size + 1)
    for M in Ms:
        stage_order = schedules.order(schedule, world_size, M)[rank]
        runs = []
        for step in range(steps + 1):                    # step 0 is a warm-up
            stage_s = _stage_seconds(stage, x.detach(), rank, world_size, reps=1, together=True, warmup=0)
            stage.zero_grad(set_to_none=False)      # keep the buffers: no 16 MB allocation inside the step
            dist.barrier()
            t0 = time.perf_counter()
            result: StepResult = run_schedule(stage, stage_order, [x] * M, [None] * M, shapes, _loss, t0)
            dist.barrier()
            if step:
                runs.append((time.perf_counter() - t0, sum(e - s for _, _, s, e in result.events), result.events,
                             stage_s))
        wall, busy, events, _ = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        out["by_M"][M] = {"wall_s": wall, "busy_s": busy, "events": events, "steps": [(r[0], r[3]) for r in runs]}
    out["stage_s"] = statistics.median(t for m in out["by_M"].values() for _, t in m["steps"])
    return out


def summarize(results: list, Ms) -> list[dict]:
    """Per M: predicted and measured efficiency (see the module docstring) from the ranks' results.

    Each step is compared with the stage times measured just before it (the slowest rank's wall,
    the sum of the ranks' stage times); "measured" is the median over steps.
    """
    world = len(results)
    rows = []
    for M in Ms:
        steps = [list(zip(*r["by_M"][M]["steps"])) for r in results]           # per rank: (walls, stage times)
        walls = [max(w) for w in zip(*(s[0] for s in steps))]
        ideals = [M * sum(t) / world for t in zip(*(s[1] for s in steps))]
        measured = statistics.median(i / w for i, w in zip(ideals, walls))
        wall = max(r["by_M"][M]["wall_s"] for r in results)
        predicted = 1 - schedules.bubble_fraction(world, M)
        rows.append({"M": M, "predicted": round(predicted, 3), "measured": round(measured, 3),
                     "measured/predicted": round(measured / predicted, 3),
                     "busy fraction": round(sum(r["by_M"][M]["busy_s"] for r in results) / (world * wall), 3),
                     "wall ms": round(1e3 * statistics.median(walls), 1),
                     "ideal ms": round(1e3 * statistics.median(ideals), 1)})
    return rows


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """GPipe on 2 ranks for several M (data_dir is unused: random activations)."""
    Ms, steps = (QUICK_MS, 3) if quick else (MS, 10)
    results = launch(pipeline_timing, K, Ms, steps, timeout=600)
    rows = summarize(results, Ms)
    stage = [r["stage_s"] for r in results]
    ratios = [r["measured/predicted"] for r in rows if r["M"] >= 4]
    busy = [r["busy fraction"] / r["predicted"] for r in rows if r["M"] >= 4]
    summary = {"benchmark": "pipeline", "efficiency_vs_model": min(ratios),
               "efficiency_vs_model_is": "min over M >= 4 of measured / predicted efficiency",
               "busy_vs_model": round(min(busy), 3),
               "rows": [{k: r[k] for k in ("M", "predicted", "measured", "busy fraction")} for r in rows],
               "stage_ms": [round(1e3 * s, 2) for s in stage],
               "stage_alone_ms": [round(1e3 * r["alone_s"], 2) for r in results],
               "stage_imbalance": round(max(stage) / (sum(stage) / len(stage)), 3),
               "send_ms": round(1e3 * max(r["send_s"] for r in results), 3),
               "K": K, "micro_batch": 64, "width": 1024, "layers_per_stage": LAYERS, "threads_per_rank": 1,
               "steps": steps, "quick": quick}
    return BenchResult(f"GPipe on K={K} ranks ({LAYERS} x Linear(1024) per stage, micro-batch 64, one thread per "
                       f"rank): measured efficiency = M x sum(stage times) / K / wall", rows, summary)
