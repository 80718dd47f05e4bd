"""Pipeline schedules as data: GPipe and 1F1B for K stages and M micro-batches, their bubble and memory.

A pipeline splits a model into K stages (stage k on rank k) and a batch into M micro-batches.
Each stage runs one forward F(m) and one backward B(m) per micro-batch. A schedule is

    order:  per stage, the list of ("F", m) / ("B", m) it executes, in that order (what a rank runs);
    ops:    the same laid out in time, one `Op(stage, time, kind, micro)` per unit-time slot,

with the dependencies F(k, m) after F(k-1, m) (activations flow down), B(k, m) after B(k+1, m)
(gradients flow back up) and B(k, m) after F(k, m). `timed` turns an order into ops by running
every stage as early as its dependencies allow, each op taking one time unit.

GPipe (Huang et al., 2019): all M forwards, then all M backwards, then a synchronous flush (the
optimizer step). K-1 slots at the start and K-1 at the end of each phase are idle on some stage:
the bubble fraction is (K-1)/(M+K-1) of the step, whatever the F/B durations, as long as stages
are balanced. 1F1B (PipeDream-flush, Narayanan et al., 2021): stage k runs K-1-k forwards, then
alternates one forward and one backward. Same bubble, but a stage holds at most K-k micro-batches'
activations instead of M: memory no longer grows with M, so M can grow and shrink the bubble.

    from course_lib.distributed import schedules
    ops = schedules.gpipe_schedule(4, 6)
    schedules.plot_schedule(ops, title="GPipe, K=4, M=6")
"""
from __future__ import annotations

from typing import NamedTuple

from ..validate import positive_int

SCHEDULES = ("gpipe", "1f1b")
COLORS = {"F": "tab:blue", "B": "tab:green"}


class Op(NamedTuple):
    """Stage `stage` runs the forward ("F") or backward ("B") of micro-batch `micro` at step `time`."""

    stage: int
    time: int
    kind: str
    micro: int


def bubble_fraction(K: int, M: int) -> float:
    """Idle fraction of a GPipe (or 1F1B) step with K balanced stages and M micro-batches."""
    positive_int("K", K)
    positive_int("M", M)
    return (K - 1) / (M + K - 1)


def gpipe_order(K: int, M: int) -> list[list[tuple[str, int]]]:
    """Per stage: F(0..M-1), then B(0..M-1) (the order torch's ScheduleGPipe uses)."""
    positive_int("K", K)
    positive_int("M", M)
    return [[("F", m) for m in range(M)] + [("B", m) for m in range(M)] for _ in range(K)]


def one_f_one_b_order(K: int, M: int) -> list[list[tuple[str, int]]]:
    """Per stage k: min(K-1-k, M) warm-up forwards, then F/B alternating, then the remaining backwards."""
    positive_int("K", K)
    positive_int("M", M)
    orders = []
    for k in range(K):
        warm = min(K - 1 - k, M)
        order = [("F", m) for m in range(warm)]
        for i in range(M - warm):
            order += [("F", warm + i), ("B", i)]
        orders.append(order + [("B", m) for m in range(M - warm, M)])
    return orders


def order(name: str, K: int, M: int) -> list[list[tuple[str, int]]]:
    """The per-stage order of schedule `name` ("gpipe" or "1f1b")."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {name!r}")
    return gpipe_order(K, M) if name == "gpipe" else one_f_one_b_order(K, M)


def timed(orders: list) -> list[Op]:
    """Lay per-stage orders out in unit time steps, each op as early as its dependencies allow.

    Raises ValueError if the orders deadlock (a stage waits for something that never comes).
    """
    K = len(orders)
    done: dict[tuple[str, int, int], int] = {}          # (kind, stage, micro) -> time step it ran
    pos, ops, t = [0] * K, [], 0
    while any(p < len(o) for p, o in zip(pos, orders)):
        ran = False
        for k in range(K):
            if pos[k] == len(orders[k]):
                continue
            kind, m = orders[k][pos[k]]
            needs = [("F", k - 1, m)] if kind == "F" and k > 0 else []
            if kind == "B":
                needs = [("F", k, m)] + ([("B", k + 1, m)] if k < K - 1 else [])
            if all(done.get(d, t) < t for d in needs):     # finished at an earlier step
                ops.append(Op(k, t, kind, m))
                done[(kind, k, m)] = t
                pos[k] += 1
                ran = True
        if not ran:                                      # nothing new can ever become ready
            raise ValueError("the per-stage orders deadlock: some op waits for one that never runs")
        t += 1
    return ops


def gpipe_schedule(K: int, M: int) -> list[Op]:
    """GPipe in time: F(k, m) at k + m; B(k, m) at (M+K-1) + (K-1-k) + m; 2(M+K-1) steps in all."""
    return timed(gpipe_order(K, M))


def one_f_one_b_schedule(K: int, M: int) -> list[Op]:
    """1F1B in time; also 2(M+K-1) steps, but at most K-k micro-batches in flight on stage k."""
    return timed(one_f_one_b_order(K, M))


def check_schedule(ops: list, K: int, M: int) -> None:
    """ValueError unless `ops` runs every F and B once per (stage, micro), one op per slot, in dependency order."""
    when: dict = {}
    slots = set()
    for op in ops:
        s, t, kind, m = op
        if (s, t) in slots:
            raise ValueError(f"stage {s} runs two ops at time {t}")
        slots.add((s, t))
        if (kind, s, m) in when:
            raise ValueError(f"{kind}({s}, {m}) runs twice")
        when[(kind, s, m)] = t
    missing = [(kind, s, m) for kind in "FB" for s in range(K) for m in range(M) if (kind, s, m) not in when]
    if missing or len(when) != 2 * K * M:
        raise ValueError(f"ops missing or out of range; e.g. {missing[:3]}")
    for s in range(K):
        for m in range(M):
            if s > 0 and when[("F", s, m)] <= when[("F", s - 1, m)]:
                raise ValueError(f"F({s}, {m}) runs before its input F({s - 1}, {m}) is ready")
            if when[("B", s, m)] <= when[("F", s, m)]:
                raise ValueError(f"B({s}, {m}) runs before F({s}, {m})")
            if s < K - 1 and when[("B", s, m)] <= when[("B", s + 1, m)]:
                raise ValueError(f"B({s}, {m}) runs before its gradient B({s + 1}, {m}) is ready")


def makespan(ops: list) -> int:
    """Number of time steps from the first op to the end of the last."""
    return max(op.time for op in ops) + 1 - min(op.time for op in ops)


def schedule_bubble(ops: list, K: int) -> float:
    """Idle fraction of the K x makespan slots: 1 - (ops run) / (K * makespan)."""
    return 1 - len(ops) / (K * makespan(ops))


def peak_in_flight(stage_order: list) -> int:
    """Most micro-batches whose forward ran and backward did not yet, i.e. activations a stage must keep."""
    live = peak = 0
    for kind, _ in stage_order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def predicted_peak_in_flight(name: str, K: int, M: int) -> list[int]:
    """Per stage: M for GPipe (every forward before any backward); min(K-k, M) for 1F1B."""
    order(name, K, M)                                   # validates the arguments
    return [M] * K if name == "gpipe" else [min(K - k, M) for k in range(K)]


def plot_schedule(ops: list, title: str = "", ax=None):
    """One row per stage, one box per op (F blue, B green), micro-batch number inside; gaps are the bubble."""
    import matplotlib.pyplot as plt

    K, T = max(op.stage for op in ops) + 1, makespan(ops)
    ax = ax or plt.subplots(figsize=(max(6, 0.45 * T), 0.5 * K + 1))[1]
    for op in ops:
        ax.barh(op.stage, 1, left=op.time, color=COLORS[op.kind], edgecolor="black", linewidth=0.5)
        ax.text(op.time + 0.5, op.stage, str(op.micro), ha="center", va="center", color="white", fontsize=8)
    ax.set(xlim=(0, T), yticks=range(K), yticklabels=[f"stage {k}" for k in range(K)], xlabel="time step",
           title=f"{title}  (bubble {schedule_bubble(ops, K):.0%})".strip())
    ax.invert_yaxis()
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()],
              labels=["forward", "backward"], loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return ax


def plot_timeline(events: list, title: str = "", ax=None):
    """Measured ops: events[rank] = [(kind, micro, start_s, end_s), ...]; white space is a rank waiting."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(8, 0.5 * len(events) + 1))[1]
    for rank, evs in enumerate(events):
        for kind, m, t0, t1 in evs:
            ax.barh(rank, 1e3 * (t1 - t0), left=1e3 * t0, color=COLORS[kind], edgecolor="black", linewidth=0.5)
            ax.text(1e3 * (t0 + t1) / 2, rank, str(m), ha="center", va="center", color="white", fontsize=8)
    ax.set(yticks=range(len(events)), yticklabels=[f"rank {r}" for r in range(len(events))], xlabel="ms",
           title=title)
    ax.invert_yaxis()
    return ax
