"""Model and pipeline parallelism on K processes: a model cut into stages, send/recv between them.

Rank k holds stage k (a contiguous slice of an nn.Sequential). Forward: rank 0 runs its layers on
a micro-batch and `send`s the activation [micro, width] to rank 1, which `recv`s it, and so on;
the last rank computes the loss. Backward runs the other way: the last rank's backward yields
dL/d(its input), sent to rank K-2, which continues backward from it (`out.backward(grad)`), ...
Each rank then steps the optimizer on its own parameters: no all-reduce, no copy of the model.

The naive split (M = 1) leaves every rank idle while the others work. GPipe cuts the batch into M
micro-batches so stages overlap; 1F1B reorders the same work to keep fewer activations alive. Both
are just per-rank orders from `schedules`, run by `run_schedule`. The loss of micro-batch m is
divided by M, so the gradients accumulated over the M backwards equal the whole batch's.
Each op runs under `record_function("forward mb0")` etc. and each wait for a peer under "recv wait",
so a profiler trace (`pipeline_trace`) shows the schedule as it ran.

Here every rank builds the whole (small, seeded) model and keeps its own stage, so that the result
can be compared with one process training the whole model; a real system builds only its stage.

    from course_lib.distributed.launch import launch
    from course_lib.distributed import pipeline
    launch(pipeline.train, 2, "gpipe", 4)          # each rank's stage weights after a few SGD steps
    pipeline.train_single(...)                      # the same model in one process, to compare
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from ..env import rank_device
from ..models import max_diff
from ..validate import positive_int
from . import schedules


def make_mlp(width: int = 32, blocks: int = 4, in_features: int = 20, classes: int = 5, seed: int = 0) -> nn.Sequential:
    """A Sequential of `blocks` (Linear, Tanh) blocks and a Linear head, seeded: same weights on every rank."""
    positive_int("blocks", blocks)
    torch.manual_seed(seed)
    sizes = [in_features] + [width] * blocks
    layers = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(sizes, sizes[1:])]
    return nn.Sequential(*layers, nn.Linear(width, classes))


def split_model(model: nn.Sequential, K: int) -> list[nn.Sequential]:
    """Cut `model`'s children into K contiguous stages, sizes differing by at most one (earlier ones larger)."""
    positive_int("K", K)
    children = list(model.children())
    if K > len(children):
        raise ValueError(f"K={K} stages but the model has only {len(children)} children to split")
    bounds = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(len(children)), K)])
    return [nn.Sequential(*children[a:b]) for a, b in zip(bounds, bounds[1:])]


def boundary_shapes(stages: list, example: torch.Tensor) -> list[torch.Size]:
    """Input shape of every stage for a micro-batch like `example`: what a receiving rank allocates."""
    shapes, x = [], example
    with torch.no_grad():
        for stage in stages:
            shapes.append(x.shape)
            x = stage(x)
    return shapes + [x.shape]


def make_batch(step: int, batch: int, in_features: int = 20, classes: int = 5, seed: int = 0):
    """Random data for step `step`, the same on every rank and in the single-process reference."""
    g = torch.Generator().manual_seed(seed * 1000 + step)
    return torch.randn(batch, in_features, generator=g), torch.randint(0, classes, (batch,), generator=g)


def sync(device: torch.device) -> None:
    """Wait for `device` to finish queued work (GPU work is asynchronous), so a timestamp means something."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class StepResult:
    """One rank's pipelined step. loss: sum of loss/M over micro-batches (last rank; 0.0 elsewhere).
    events: (kind, micro, start_s, end_s) per op. peak_in_flight: most micro-batches whose activations
    (autograd graphs) this rank held at once."""

    loss: float = 0.0
    events: list = field(default_factory=list)
    peak_in_flight: int = 0


def _post_recv(stage_order: list, i: int, shapes: list, device: torch.device):
    """irecv the input of op i: an activation from rank-1 (F) or a gradient from rank+1 (B).

    Returns (work, buffer), or None when there is no op i or no such rank (rank 0's F, the last rank's B).
    """
    if i >= len(stage_order):
        return None
    rank, K = dist.get_rank(), dist.get_world_size()
    peer, shape = (rank - 1, shapes[rank]) if stage_order[i][0] == "F" else (rank + 1, shapes[rank + 1])
    if not 0 <= peer < K:
        return None
    buffer = torch.empty(shape, device=device)
    return dist.irecv(buffer, peer), buffer


def run_schedule(stage: nn.Module, stage_order: list, x_micro: list, y_micro: list, shapes: list, loss_fn,
                 clock0: float = 0.0) -> StepResult:
    """Run one pipelined forward+backward of `stage` on this rank; gradients accumulate in `stage`.

    stage_order: this rank's [("F", m) | ("B", m), ...] from `schedules.order`.
    x_micro: the M input micro-batches (used on rank 0); y_micro: targets (used on the last rank).
    shapes: `boundary_shapes` (activation shape entering each stage and leaving the last).
    Returns a StepResult; its events time the compute part of each op (waits for recv excluded).

    The receive for the next op is posted before this op computes, as production pipelines do:
    its data then travels while this rank is busy instead of after it asks (each transfer is
    a round of wake-ups on both ranks, milliseconds on a loaded CPU).
    """
    rank, K = dist.get_rank(), dist.get_world_size()
    device = next(stage.parameters()).device
    M = len(x_micro)
    inputs, outputs, pending, result = {}, {}, [], StepResult()
    recvs = {0: _post_recv(stage_order, 0, shapes, device)}
    for i, (kind, m) in enumerate(stage_order):
        # same-peer messages match in posting order, so op i's input arrives before op i+1's
        recvs[i + 1] = _post_recv(stage_order, i + 1, shapes, device)
        work, received = recvs.pop(i) or (None, None)
        if work is not None:
            with record_function("recv wait"):           # a trace's comm: time spent waiting for a peer
                work.wait()
        if kind == "F":
            x = x_micro[m] if rank == 0 else received.requires_grad_()
            sync(device)
            t0 = time.perf_counter()
            with record_function(f"forward mb{m}"):      # the name a trace shows (course_lib.trace)
                out = stage(x)
                if rank == K - 1:
                    out = loss_fn(out, y_micro[m]) / M   # mean over micro-batches = whole-batch mean
                    result.loss += out.item()
                sync(device)
            result.events.append(("F", m, t0 - clock0, time.perf_counter() - clock0))
            if rank < K - 1:
                sent = out.detach()                      # kept alive in `pending` until the send is done
                pending.append((dist.isend(sent, rank + 1), sent))
            inputs[m], outputs[m] = x, out
            result.peak_in_flight = max(result.peak_in_flight, len(outputs))
        else:
            sync(device)
            t0 = time.perf_counter()
            with record_function(f"backward mb{m}"):
                outputs.pop(m).backward(received)        # frees this micro-batch's activations
                sync(device)
            result.events.append(("B", m, t0 - clock0, time.perf_counter() - clock0))
            x = inputs.pop(m)
            if rank > 0:
                pending.append((dist.isend(x.grad, rank - 1), x.grad))
    for work, _ in pending:
        work.wait()
    return result


def _numpy(params) -> list:
    """Parameters as numpy arrays (a returned tensor would travel through shared memory that dies with the worker)."""
    return [p.detach().cpu().numpy().copy() for p in params]


def train(rank: int, world_size: int, schedule: str = "gpipe", micro_batches: int = 4, steps: int = 3,
          batch: int = 16, lr: float = 0.1, width: int = 32, blocks: int = 4, seed: int = 0) -> dict:
    """Worker: `steps` SGD steps of `make_mlp` split over world_size ranks, run with `schedule`.

    The batch [batch, 20] is cut into `micro_batches` equal chunks. Returns this rank's "weights"
    (numpy, in parameter order), "losses" per step (last rank; 0.0 elsewhere), "events" of the
    last step (for a timeline), "peak_in_flight" (most activations this rank held at once).
    """
    if batch % micro_batches:
        raise ValueError(f"batch={batch} must be divisible by micro_batches={micro_batches}")
    device = rank_device()
    stages = split_model(make_mlp(width, blocks, seed=seed), world_size)
    shapes = boundary_shapes(stages, torch.zeros(batch // micro_batches, 20))     # before .to(): still on the CPU
    stage = stages[rank].to(device)
    opt = torch.optim.SGD(stage.parameters(), lr=lr)
    stage_order = schedules.order(schedule, world_size, micro_batches)[rank]
    losses, peak = [], 0
    for step in range(steps):
        x, y = make_batch(step, batch, seed=seed)
        opt.zero_grad()
        dist.barrier()
        clock0 = time.perf_counter()
        result = run_schedule(stage, stage_order, list(x.to(device).chunk(micro_batches)),
                              list(y.to(device).chunk(micro_batches)), shapes, nn.functional.cross_entropy, clock0)
        opt.step()                                       # the synchronous flush: every micro-batch is done
        losses.append(result.loss)
        peak = max(peak, result.peak_in_flight)
    return {"weights": _numpy(stage.parameters()), "losses": losses, "events": result.events, "peak_in_flight": peak}


def train_single(steps: int = 3, batch: int = 16, lr: float = 0.1, width: int = 32, blocks: int = 4,
                 seed: int = 0) -> dict:
    """The reference: the same model, data and SGD steps in one process, on whole batches."""
    model = make_mlp(width, blocks, seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = make_batch(step, batch, seed=seed)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"weights": _numpy(model.parameters()), "losses": losses}


def max_weight_difference(results: list, reference: dict) -> float:
    """max |w - w_ref| over all parameters; `results` are the ranks' `train` outputs in rank order."""
    ours = [w for r in results for w in r["weights"]]
    if len(ours) != len(reference["weights"]):
        raise ValueError(f"{len(ours)} parameters from the ranks but {len(reference['weights'])} in the reference")
    return max_diff(ours, reference["weights"])


def _record_order(stage) -> list:
    """Log the ("F", m) / ("B", m) calls a torch PipelineStage executes, in order, into the returned list."""
    log: list = []
    forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

    def forward_one_chunk(m, *args, **kwargs):
        log.append(("F", m))
        return forward(m, *args, **kwargs)

    def backward_one_chunk(m, *args, **kwargs):
        log.append(("B", m))
        return backward(m, *args, **kwargs)

    stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk
    return log


def compare_with_torch_pipelining(rank: int, world_size: int, micro_batches: int = 4, batch: int = 16,
                                  width: int = 32, blocks: int = 4, seed: int = 0) -> dict:
    """Worker: one step of our GPipe and 1F1B vs torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B.

    Same stage weights and data. Per schedule: "<name>_order" (True if the order in which torch's stage
    ran its forwards and backwards on this rank is ours), "<name>_grad_diff" (max |grad difference|), and on the
    last rank "<name>_loss" (ours: whole-batch mean; torch's: mean of its per-micro-batch losses, whose
    gradients it divides by M, as our loss/M does) and "<name>_ours_loss"; 0.0 elsewhere.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    device = rank_device()
    stages = split_model(make_mlp(width, blocks, seed=seed), world_size)
    x, y = make_batch(0, batch, seed=seed)
    x, y = x.to(device), y.to(device)
    shapes = boundary_shapes(stages, torch.zeros(batch // micro_batches, 20))
    out = {}
    for name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        ours, theirs = copy.deepcopy(stages[rank]).to(device), copy.deepcopy(stages[rank]).to(device)
        stage_order = schedules.order(name, world_size, micro_batches)[rank]
        loss = run_schedule(ours, stage_order, list(x.chunk(micro_batches)), list(y.chunk(micro_batches)), shapes,
                            nn.functional.cross_entropy).loss
        stage = PipelineStage(theirs, rank, world_size, device)
        torch_order = _record_order(stage)
        sched = cls(stage, n_microbatches=micro_batches, loss_fn=nn.functional.cross_entropy)
        losses: list = []
        if rank == 0:
            sched.step(x)
        elif rank == world_size - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        out[f"{name}_order"] = torch_order == stage_order
        out[f"{name}_ours_loss"] = loss
        out[f"{name}_loss"] = torch.stack(losses).mean().item() if losses else 0.0
        out[f"{name}_grad_diff"] = max_diff([a.grad for a in ours.parameters()], [b.grad for b in theirs.parameters()])
    return out


def several(rank: int, world_size: int, *calls) -> list:
    """Worker: run several workers, given as (fn, args) pairs, in one launch (each launch costs seconds)."""
    return [fn(rank, world_size, *args) for fn, args in calls]
