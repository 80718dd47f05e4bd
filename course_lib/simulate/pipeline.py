"""A pipeline step on a virtual clock: record each stage's micro-batch once, replay GPipe or 1F1B on any profile.

`record_stages` runs ONE micro-batch's forward and backward through each stage (in one process, on
real or meta tensors) under the `Recorder`: the stage's ops with their FLOPs and bytes, the bytes of
the activation it sends on and of the gradient it sends back, the activations autograd keeps for
its backward, and its SGD step. `replay_pipeline` then plays a whole step on `pipeline_clock`'s loop
(`replay_actions`, shared with the interleaved and zero-bubble schedules): every stage is one
device with a compute stream and a send stream; each rank runs the per-stage order of
`distributed.schedules` (the order `pipeline.run_schedule` runs for real), an op starting when its
stage is free and its input has arrived; a message takes α + bytes·β over `profile.intra` if the
K stages fit in one node, else `profile.inter`, and a stage's sends go one after another.
The bubble is `pipeline_trace.idle_share` of the predicted timeline: lecture 09's measured definition.

    from course_lib.distributed import pipeline
    from course_lib.simulate.profiles import h100_node
    from course_lib.simulate.pipeline import gpt2_mlp_stack, record_stages, replay_pipeline
    with torch.device("meta"):                                  # shapes only: nothing is computed
        stages = pipeline.split_model(gpt2_mlp_stack(), 4)
        x = torch.empty(8, 1024, 768, dtype=torch.bfloat16)
    rec = record_stages(stages, x, lambda out: out.float().mean())
    p = replay_pipeline(rec, h100_node(), "1f1b", micro_batches=16)
    p.step_s, p.bubble, p.timeline.draw()          # rows "stage k · compute" and "stage k · comm"
    compare_measured()      # lecture 09's 2-stage gloo step measured vs replayed on this CPU (a launch)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.profiler import record_function

from .. import trace
from ..distributed import pipeline_trace, schedules
from ..distributed.schedules_zb import Action
from ..validate import boolean, one_of, positive_int
from .pipeline_clock import replay_actions
from .profiles import Profile, check_profile
from .record import Event, Recorder, _key


@dataclass
class StageRecord:
    """One stage, one micro-batch: its ops per phase and what it sends or keeps (bytes)."""

    forward: list[Event]
    backward: list[Event]
    optimizer: list[Event]
    send_bytes: float      # activation sent to the next stage (0 for the last)
    grad_bytes: float      # gradient of its input sent back to the previous stage (0 for the first)
    saved_bytes: float     # activations autograd keeps until this micro-batch's backward (parameters excluded)

    def flops(self, phase: str = "all") -> float:
        one_of("phase", phase, ("forward", "backward", "optimizer", "all"))
        events = self.forward + self.backward + self.optimizer if phase == "all" else getattr(self, phase)
        return sum(e.flops for e in events)


@dataclass
class RecordedPipeline:
    stages: list[StageRecord]
    label: str = ""


def gpt2_mlp_stack(blocks: int = 12, d_model: int = 768, dtype=torch.bfloat16) -> nn.Sequential:
    """`blocks` x (LayerNorm, Linear(d, 4d), GELU, Linear(4d, d)): the MLP half of GPT-2 small's blocks
    (Radford et al. 2019: 12 blocks, d_model 768); attention, residual adds and dropout left out.
    bf16 by default: what a GPU trains it in (mixed precision), so recorded bytes are bf16 bytes."""
    positive_int("blocks", blocks)
    positive_int("d_model", d_model)
    return nn.Sequential(*[nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                         nn.Linear(4 * d_model, d_model)) for _ in range(blocks)]).to(dtype)


def _nbytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


def _record_stage(stage: nn.Module, x: torch.Tensor, loss_fn, target, first: bool, last: bool):
    """(StageRecord, output) of one stage on input `x`; the output feeds the next stage."""
    x = x.detach() if first else x.detach().requires_grad_()     # as run_schedule: grads of a received input
    params = {_key(p) for p in stage.parameters()}
    saved: dict[int, float] = {}

    def pack(t):
        if _key(t) not in params:
            saved[_key(t)] = _nbytes(t)                             # one storage counted once
        return t

    rec = Recorder()
    with rec:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), record_function("forward"):
            out = stage(x)
            loss = (loss_fn(out) if target is None else loss_fn(out, target)) if last else out
    n_forward = len(rec.events)
    grad = None if last else torch.ones_like(out)                  # stands for the gradient received
    with rec:
        with record_function("backward"):
            loss.backward(grad)
        n_backward = len(rec.events)
        with record_function("optimizer"):
            torch.optim.SGD(stage.parameters(), lr=0.01).step()     # the course's pipeline optimizer
    for p in stage.parameters():
        p.grad = None
    ev = rec.events
    return StageRecord(ev[:n_forward], ev[n_forward:n_backward], ev[n_backward:],
                       0.0 if last else _nbytes(out), 0.0 if first else _nbytes(x), sum(saved.values())), out.detach()


def record_stages(stages, micro_batch_input: torch.Tensor, loss_fn, target=None, label: str = "") -> RecordedPipeline:
    """Record one micro-batch's forward, backward and SGD step through each stage, in one process.

    stages: nn.Modules, stage k's input is stage k-1's output (build them under `torch.device("meta")`
    to record a large model by shape). loss_fn(out) or, with `target`, loss_fn(out, target): the last
    stage's loss. The other stages' backward starts from a gradient shaped like their output.
    """
    stages = list(stages)
    if not stages or not all(isinstance(s, nn.Module) for s in stages):
        raise ValueError(f"stages must be a non-empty list of nn.Module; got {stages!r}")
    if not isinstance(micro_batch_input, torch.Tensor):
        raise ValueError(f"micro_batch_input must be a tensor; got {type(micro_batch_input).__name__}")
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable (out) or (out, target) -> scalar; got {loss_fn!r}")
    records, x = [], micro_batch_input
    for k, stage in enumerate(stages):
        record, x = _record_stage(stage, x, loss_fn, target, k == 0, k == len(stages) - 1)
        records.append(record)
    shape = "x".join(map(str, micro_batch_input.shape))
    return RecordedPipeline(records, label or f"{len(stages)} stages, micro-batch {shape} {micro_batch_input.dtype}")


@dataclass
class PipelinePrediction:
    step_s: float             # first op to the last optimizer op or message
    busy_s: list[float]       # per stage: forward + backward + optimizer time
    bubble: float             # idle share of the stages' forward/backward time (pipeline_trace.idle_share)
    formula: float            # (K-1)/(M+K-1), balanced stages and free messages
    peak_in_flight: list[int]  # per stage: micro-batches whose activations are held at once
    activation_bytes: list[float]   # per stage: peak_in_flight x the recorded saved bytes
    timeline: trace.Timeline = field(repr=False)

    def summary(self) -> dict:
        return {"step_ms": self.step_s * 1e3, "bubble": self.bubble, "formula": self.formula,
                "max_activation_GB": max(self.activation_bytes) / 1e9}


def replay_pipeline(recorded: RecordedPipeline, profile: Profile, schedule: str = "gpipe", micro_batches: int = 4,
                    optimizer: bool = True, stage_seconds: list | None = None) -> PipelinePrediction:
    """Replay one step of `schedule` ("gpipe" or "1f1b") over `micro_batches` micro-batches (module docstring).

    stage_seconds: per stage {"F", "B", "O"}: measured seconds of one micro-batch's forward and backward and
    of the optimizer step (`stage_times_worker`), used instead of the roofline times (calibration)."""
    if not isinstance(recorded, RecordedPipeline):
        raise ValueError(f"recorded must be a RecordedPipeline (from record_stages); got {type(recorded).__name__}")
    check_profile(profile)
    one_of("schedule", schedule, schedules.SCHEDULES)
    M = positive_int("micro_batches", micro_batches)
    boolean("optimizer", optimizer)
    st, K = recorded.stages, len(recorded.stages)
    link = profile.intra if K <= profile.gpus_per_node else profile.inter

    def seconds(events):
        return sum(profile.op_seconds(e.flops, e.bytes, e.view, e.name) for e in events)

    if stage_seconds is None:
        t = {(k, kind): seconds(getattr(s, phase)) for k, s in enumerate(st)
             for kind, phase in (("F", "forward"), ("B", "backward"), ("O", "optimizer"))}
    elif len(stage_seconds) != K or not all(isinstance(d, dict) and set(d) >= {"F", "B", "O"} for d in stage_seconds):
        raise ValueError(f"stage_seconds must be {K} dicts with keys 'F', 'B', 'O' (one per stage); "
                         f"got {stage_seconds!r}")
    else:
        t = {(k, kind): float(d[kind]) for k, d in enumerate(stage_seconds) for kind in ("F", "B", "O")}
    orders = schedules.order(schedule, K, M)

    def message_s(a: Action) -> float:
        return link.alpha + (st[a.stage].send_bytes if a.kind == "F" else st[a.stage].grad_bytes) * link.beta

    replay = replay_actions([[Action(kind, k, m) for kind, m in o] for k, o in enumerate(orders)],
                            lambda a: t[(a.stage, a.kind)], message_s)
    spans = [_span(f"{'forward' if r.action.kind == 'F' else 'backward'} mb{r.action.micro}", r.rank, "compute",
                   r.start, r.end) for r in replay.runs]
    spans += [_span(f"send {'activation' if s.action.kind == 'F' else 'gradient'} mb{s.action.micro} to stage {s.dest}",
                    s.rank, "comm", s.start, s.end) for s in replay.sends]
    free = [max(r.end for r in replay.runs if r.rank == k) for k in range(K)]
    send_free = [max([s.end for s in replay.sends if s.rank == k], default=0.0) for k in range(K)]
    if optimizer:                             # after the stage's last send is done, as run_schedule waits for it
        for k in range(K):
            start = max(free[k], send_free[k])
            free[k] = start + t[(k, "O")]
            spans.append(_span("optimizer", k, "compute", start, free[k]))
    rows = [f"stage {k} · {s}" for k in range(K) for s in ("compute", "comm")]
    label = f"predicted: {schedule}, K={K}, M={M} on {profile.name}; {recorded.label}"
    timeline = trace.Timeline(spans, label, 0, rows)
    peaks = [schedules.peak_in_flight(o) for o in orders]
    return PipelinePrediction(max(free + send_free),
                              [M * (t[(k, "F")] + t[(k, "B")]) + optimizer * t[(k, "O")] for k in range(K)],
                              pipeline_trace.idle_share(timeline, K, M), schedules.bubble_fraction(K, M), peaks,
                              [p * s.saved_bytes for p, s in zip(peaks, st)], timeline)


def _span(name: str, k: int, stream: str, start: float, end: float) -> trace.Span:
    return trace.Span(name, f"stage {k} · {stream}", start * 1e6, (end - start) * 1e6, trace.kind_of(name))


def _measured_step_s(timeline: trace.Timeline, K: int, M: int) -> float:
    """The fastest traced step (the least disturbed by other work, as the calibration's best-of runs):
    first forward on any rank to the last rank's optimizer end."""
    rows = [f"rank {r} · main" for r in range(K)]
    ops = [sorted((s for s in timeline.spans if s.row == row and s.kind in ("forward", "backward")),
                  key=lambda s: s.start_us) for row in rows]
    opt = [sorted((s for s in timeline.spans if s.row == row and s.name == "optimizer"), key=lambda s: s.start_us)
           for row in rows]
    steps = len(opt[0])
    return min(
        (max(o[i].start_us + o[i].dur_us for o in opt) - min(r[2 * M * i].start_us for r in ops)) / 1e6
        for i in range(steps))


def calibrate_worker(rank: int, world_size: int, sizes=(2**10, 2**16, 2**20, 2**22)) -> Profile:
    """Worker: `profiles.cpu_this_machine` measured on a launched rank while the other ranks measure too,
    as they compute side by side in a pipelined step (gloo all-reduce times from `costmodel.measure_allreduce`)."""
    from ..distributed import costmodel
    from .profiles import cpu_this_machine
    return cpu_this_machine(costmodel.measure_allreduce(rank, world_size, list(sizes), "torch", 3), threads=1)


def stage_times_worker(rank: int, world_size: int, width: int = 1024, blocks: int = 5, micro: int = 64,
                       repeats: int = 5, seed: int = 0) -> dict:
    """Worker: this rank's stage of `make_mlp(width, blocks)` timed alone, one micro-batch's forward, backward
    and SGD step (median of `repeats`), while every rank times its own at once (they share the cores)."""
    import statistics
    import time

    import torch.distributed as dist

    from ..distributed import pipeline
    positive_int("repeats", repeats)
    stages = pipeline.split_model(pipeline.make_mlp(width, blocks, seed=seed), world_size)
    shapes = pipeline.boundary_shapes(stages, torch.zeros(micro, 20))
    stage, last = stages[rank], rank == world_size - 1
    opt = torch.optim.SGD(stage.parameters(), lr=0.01)
    x = torch.randn(shapes[rank], requires_grad=rank > 0)     # boundary_shapes: the input shape of each stage
    y = torch.randint(0, 5, (micro,))
    times = {"F": [], "B": [], "O": []}
    for _ in range(repeats + 1):                  # the first is a warm-up
        dist.barrier()
        t0 = time.perf_counter()
        out = stage(x)
        loss = nn.functional.cross_entropy(out, y) if last else out
        t1 = time.perf_counter()
        loss.backward(None if last else torch.ones_like(out))
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        for key, dt in zip("FBO", (t1 - t0, t2 - t1, time.perf_counter() - t2)):
            times[key].append(dt)
    return {key: statistics.median(v[1:]) for key, v in times.items()}


def compare_measured(schedule: str = "gpipe", micro_batches: int = 4, steps: int = 3, batch: int = 256,
                     width: int = 1024, blocks: int = 5, timeout: float = 180.0) -> dict:
    """Lecture 09's 2-stage step (`pipeline_trace.traced_steps`, gloo) measured, and replayed on this CPU.

    One launch traces the steps, then calibrates `cpu_this_machine` on the same ranks (`calibrate_worker`;
    the slower rank's profile prices the messages) and times each stage's forward, backward and optimizer
    alone, all ranks at once (`stage_times_worker`: these replace the roofline times). Returns measured_s and predicted_s (fastest step: first forward
    to the last optimizer end), error = predicted / measured - 1, the measured and predicted bubbles,
    per stage the op order of one step measured and predicted, the profile's source, the Timelines.
    """
    from ..distributed import pipeline
    from ..distributed.launch import launch
    one_of("schedule", schedule, schedules.SCHEDULES)
    M, K = positive_int("micro_batches", micro_batches), 2
    if batch % M:
        raise ValueError(f"batch={batch} must be divisible by micro_batches={M}")
    outs = launch(pipeline.several, K, (pipeline_trace.traced_steps, (schedule, M, steps, batch, width, blocks)),
                  (calibrate_worker, ()), (stage_times_worker, (width, blocks, batch // M)), timeout=timeout)
    measured = trace.merge([o[0] for o in outs])
    profile = min((o[1] for o in outs), key=lambda p: p.peak_flops)
    stages = pipeline.split_model(pipeline.make_mlp(width, blocks, seed=0), K)
    micro = batch // M
    recorded = record_stages(stages, torch.zeros(micro, 20), nn.functional.cross_entropy,
                             torch.zeros(micro, dtype=torch.long), f"make_mlp({width}, {blocks}), micro-batch {micro}")
    predicted = replay_pipeline(recorded, profile, schedule, M, stage_seconds=[o[2] for o in outs])
    measured_s = _measured_step_s(measured, K, M)
    return {"measured_s": measured_s, "predicted_s": predicted.step_s, "error": predicted.step_s / measured_s - 1,
            "measured_bubble": pipeline_trace.idle_share(measured, K, M), "predicted_bubble": predicted.bubble,
            "measured_order": [pipeline_trace.phase_order(measured, f"rank {k} · main")[:2 * M] for k in range(K)],
            "predicted_order": [pipeline_trace.phase_order(predicted.timeline, f"stage {k} · compute")
                                for k in range(K)],
            "profile": profile.source, "measured": measured, "predicted": predicted.timeline}
