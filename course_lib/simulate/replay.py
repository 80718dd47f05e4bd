"""Replay a recorded step on a virtual clock: what would it take on 8 or 512 GPUs?

Each device has a compute stream and a communication stream. Ops run one after another on the
compute stream, each taking its roofline time (`Profile.op_seconds`: max(FLOPs / peak, bytes /
bandwidth) with efficiency factors; a CPU adds its per-op host time). On a GPU the host issues the
kernels on its own clock, `Profile.issue_seconds` each, running ahead of the GPU: a kernel starts once it
is issued and the one before it has ended, so a step of kernels shorter than their host time is
host-bound (`Prediction.host_s`), unless the profile replays it as one CUDA graph (`cuda_graph=True`).
Collectives run one after another on the comm stream, each starting when its inputs are ready on EVERY rank (a collective is done
together), taking `collective_seconds`: `network.collective_seconds` on the profile's fabric
(`Profile.fabric`), the one network model of the course (lectures 05 and 08): NVLink inside a node,
every network card of the node between nodes, with `algorithm` one of network.ALGORITHMS ("auto":
the faster of NCCL's ring and tree, per collective) or network.ONE_CARD. Communication overlaps compute
except where an op waits for a collective (the optimizer for the all-reduced gradients).

Scaling by shape: `world` replays the recorded ranks as if the group had `world` ranks (each rank's
batch and gradient bytes unchanged); `bucket_mb` re-buckets the gradients as DDP would (parameters in
reverse order, `ddp.assign_buckets`), each bucket waiting for its last gradient. A sharded (FSDP)
recording's optimizer ops shrink with the shard (recorded world / world).

    from course_lib.simulate import record_ddp, replay, h100_node
    p = replay(record_ddp(2), h100_node(), world=64)
    p.step_s, p.mfu, p.exposed_comm_s; p.timeline.draw(); p.timeline.save_chrome("sim.json")
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .. import trace
from ..distributed import network
from ..distributed.ddp import assign_buckets
from ..validate import one_of, positive_int, positive_number
from .profiles import Profile, check_profile
from .record import Event, RankTrace, Recording

ALGORITHMS = network.ALGORITHMS + (network.ONE_CARD,)


def collective_seconds(kind: str, nbytes: float, world: int, profile: Profile, algorithm: str = "auto") -> float:
    """Seconds of one collective (network.KINDS) over `world` ranks of the whole tensor `nbytes` on `profile`'s
    network: `network.collective_seconds`, so the simulator and the lectures' formulas give the same number."""
    return network.collective_seconds(kind, nbytes, world, check_profile(profile).fabric, algorithm)


@dataclass
class Prediction:
    step_s: float            # the slowest rank's last event
    compute_s: float         # busy time of the slowest rank's compute stream
    comm_s: float            # busy time of the comm stream
    exposed_comm_s: float    # the slowest rank's compute stream idle, waiting for communication
    mfu: float               # counted FLOPs per rank / (step_s * peak)
    world: int
    collectives: int
    timeline: trace.Timeline
    host_s: float = 0.0      # the host's time to issue the slowest rank's kernels (a GPU; 0 on a CPU)

    @property
    def host_bound(self) -> bool:
        """The host, not the device, sets the pace: issuing the kernels takes longer than running them."""
        return self.host_s > self.compute_s

    def summary(self) -> dict:
        return {"world": self.world, "step_ms": self.step_s * 1e3, "compute_ms": self.compute_s * 1e3,
                "host_ms": self.host_s * 1e3, "comm_ms": self.comm_s * 1e3,
                "exposed_comm_ms": self.exposed_comm_s * 1e3, "mfu": self.mfu, "collectives": self.collectives}


def rebucket(rank: RankTrace, params: list, bucket_mb: float, world: int) -> RankTrace:
    """The same step with DDP buckets of `bucket_mb` MB: recorded collectives replaced by one all-reduce per
    bucket, placed after the bucket's last gradient; whatever waited for a recorded collective (or, without
    any, the first optimizer op) waits for all new ones. The recorded DDP's own copies stay as they were."""
    positive_number("bucket_mb", bucket_mb)
    shapes = [torch.empty(numel, dtype={1: torch.int8, 2: torch.half, 4: torch.float, 8: torch.double}[size],
                          device="meta") for _, numel, size in params]
    buckets = assign_buckets(shapes, bucket_mb)
    old = rank.events
    comm_old = {i for i, e in enumerate(old) if e.stream == "comm"}
    waiters = {i for i, e in enumerate(old) if e.stream == "compute" and set(e.after) & comm_old}
    if not waiters:
        first_opt = next((i for i, e in enumerate(old) if e.phase == "optimizer"), len(old) - 1)
        waiters = {first_opt}
    # each bucket launches after its own last gradient and after the buckets before it (index order)
    launch_after, last = [], -1
    for idx in buckets:
        last = max([last] + [rank.grad_ready[i] for i in idx])
        launch_after.append(last)
    events, new_index, comm_new = [], {}, []
    for i, e in enumerate(old):
        if i in comm_old:
            continue
        new_index[i] = len(events)
        events.append(replace(e, after=[]))
        for b, at in enumerate(launch_after):
            if at == i:
                comm_new.append(len(events))
                nbytes = sum(params[p][1] * params[p][2] for p in buckets[b])
                events.append(Event("all_reduce", e.phase, "comm", 0.0, float(nbytes), False, [len(events) - 1],
                                    world))
    for i in waiters:
        events[new_index[i]].after = list(comm_new)
    ready = [new_index.get(r, len(events) - 1) for r in rank.grad_ready]
    return RankTrace(events, ready)


def replay(recording: Recording, profile: Profile, world: int | None = None, bucket_mb: float | None = None,
           algorithm: str = "auto", label: str | None = None) -> Prediction:
    """Run `recording` on the virtual clock of `profile` (see the module docstring); a Prediction."""
    if not isinstance(recording, Recording):
        raise TypeError(f"recording must be a simulate.Recording; got {type(recording).__name__}")
    check_profile(profile)
    one_of("algorithm", algorithm, ALGORITHMS)
    world = recording.world_size if world is None else positive_int("world", world)
    ranks = recording.ranks
    if bucket_mb is not None or (world > 1 and not any(e.stream == "comm" for e in ranks[0].events)):
        ranks = [rebucket(r, recording.params, bucket_mb or 25.0, world) for r in ranks]
    times = [[_duration(e, profile, world, recording.world_size, algorithm, recording.sharded)
              for e in r.events]
             for r in ranks]
    issue = [[profile.issue_seconds(e.view) if e.stream == "compute" else 0.0 for e in r.events] for r in ranks]
    ends, waits = _schedule([r.events for r in ranks], times, issue)
    return _prediction(recording, profile, world, ranks, times, ends, waits, label, issue)


def _duration(e: Event, profile, world, recorded_world, algorithm, sharded) -> float:
    if e.stream == "compute":
        if sharded and e.phase == "optimizer":   # FSDP: each rank updates its 1/world shard
            share = recorded_world / world
            return profile.op_seconds(e.flops * share, e.bytes * share, e.view, e.name)
        return profile.op_seconds(e.flops, e.bytes, e.view, e.name)
    group = world if e.group_size == recorded_world else e.group_size   # the whole group scales with world
    return collective_seconds(e.name, e.bytes, group, profile, algorithm)


def _schedule(ranks: list[list[Event]], times, issue) -> tuple[list[list[float]], list[float]]:
    """End time of every event: streams in order, ops after their dependencies and after the host issued them
    (`issue`: per event, the host's seconds, one after another on each rank's host), collectives in lockstep;
    and per rank, how long its compute stream waited for a dependency (a collective) beyond stream and host."""
    n = len(ranks)
    host, waits = [0.0] * n, [0.0] * n
    ends = [[None] * len(evs) for evs in ranks]
    queues = [{s: [i for i, e in enumerate(evs) if e.stream == s] for s in ("compute", "comm")} for evs in ranks]
    free = [{"compute": 0.0, "comm": 0.0} for _ in ranks]
    counts = {len(q["comm"]) for q in queues}
    if len(counts) != 1:
        raise ValueError(f"ranks recorded different numbers of collectives {sorted(counts)}: they cannot match up")

    def ready(r, i):
        deps = [ends[r][d] for d in ranks[r][i].after]
        return None if None in deps else max(deps, default=0.0)

    while any(q["compute"] or q["comm"] for q in queues):
        moved = False
        for r in range(n):
            q = queues[r]["compute"]
            while q and (t := ready(r, q[0])) is not None:
                i = q.pop(0)
                host[r] += issue[r][i]                  # the host never waits for the device
                waits[r] += max(t - max(free[r]["compute"], host[r]), 0.0)
                ends[r][i] = max(t, free[r]["compute"], host[r]) + times[r][i]
                free[r]["compute"] = ends[r][i]
                moved = True
        heads = [(q["comm"][0], ready(r, q["comm"][0])) if q["comm"] else (None, None) for r, q in enumerate(queues)]
        if all(i is not None and t is not None for i, t in heads):
            start = max(max(t, free[r]["comm"]) for r, (_, t) in enumerate(heads))
            for r, (i, _) in enumerate(heads):
                queues[r]["comm"].pop(0)
                ends[r][i] = start + max(times[k][heads[k][0]] for k in range(n))
                free[r]["comm"] = ends[r][i]
            moved = True
        if not moved:
            raise RuntimeError("replay is stuck: an op waits for a collective that cannot start (bad dependencies)")
    return ends, waits


def _prediction(recording, profile, world, ranks, times, ends, waits, label, issue) -> Prediction:
    spans, rows, stats = [], [], []
    for r, (rt, ts, es) in enumerate(zip(ranks, times, ends)):
        name = f"rank {r}" + (f" of {world}" if world != len(ranks) else "")
        rows += [f"{name} · compute", f"{name} · comm"]
        for e, t, end in zip(rt.events, ts, es):
            if t > 0:
                kind = "comm" if e.stream == "comm" else (e.phase if e.phase in trace.KINDS else "other")
                spans.append(trace.Span(e.name, f"{name} · {e.stream}", (end - t) * 1e6, t * 1e6, kind))
        busy = {s: sum(t for e, t in zip(rt.events, ts) if e.stream == s) for s in ("compute", "comm")}
        last_compute = max((end for e, end in zip(rt.events, es) if e.stream == "compute"), default=0.0)
        tail = max(es, default=0.0) - last_compute          # a collective still running after the last op
        stats.append((max(es, default=0.0), busy["compute"], busy["comm"], sum(issue[r]), waits[r] + tail))
    step, compute, comm, host, exposed = max(stats)
    mfu = recording.flops_per_rank() / (step * profile.peak_flops) if step > 0 else 0.0
    text = label or f"predicted: {recording.label} on {world} x {profile.name}"
    return Prediction(step, compute, comm, exposed, mfu, world,
                      sum(e.stream == "comm" for e in ranks[0].events), trace.Timeline(spans, text, 0, rows), host)


def sweep(recording: Recording, profile: Profile, worlds=(1, 8, 64, 512), **kwargs) -> list[dict]:
    """`replay` at each world size; one summary row each (step ms, compute, comm, exposed, MFU)."""
    return [replay(recording, profile, world=w, **kwargs).summary() for w in worlds]
