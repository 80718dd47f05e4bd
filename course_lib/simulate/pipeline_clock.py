"""The pipeline's virtual clock: each rank's list of F/B/I/W actions replayed with given op and message times.

`replay_actions(orders, op_seconds, message_seconds)` plays one step of any schedule written as
`distributed.schedules_zb` actions (GPipe and 1F1B too): each rank is one device with a compute
stream and a send stream; it runs its actions in its order, each as soon as the rank is free and
its input is there:

    F(s, m)     needs F(s-1, m)'s activation;    I(s, m) or B(s, m) needs F(s, m) and the gradient of
    I(s+1, m) or B(s+1, m) (the last stage: its own F only);   W(s, m) needs I(s, m).

An output for a stage on another rank is a message: it waits for the rank's earlier sends, takes
`message_seconds(action)` and arrives when done; on the same rank (the turn of a V) it is free.
`simulate.pipeline.replay_pipeline` runs GPipe and 1F1B on recorded stages with this loop.

    from course_lib.distributed import schedules_zb as zb
    from course_lib.simulate import pipeline_clock as clock
    r = clock.replay_actions(zb.order("interleaved", 4, 8), clock.unit_times(v=2))
    r.step, r.bubble, clock.plot_replay(r, "interleaved 1F1B")
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..distributed.schedules_zb import KINDS, Action
from ..validate import number_in_range, positive_int

COLORS = {"F": "tab:blue", "B": "tab:green", "I": "tab:olive", "W": "tab:purple"}
LABELS = {"F": "forward", "B": "backward", "I": "backward, input grad", "W": "backward, weight grad"}


class Run(NamedTuple):
    """Rank `rank` computes `action` from `start` to `end` (seconds, or any time unit)."""

    rank: int
    action: Action
    start: float
    end: float


class Send(NamedTuple):
    """Rank `rank` sends the output of `action` to rank `dest`, on its send stream from `start` to `end`."""

    rank: int
    action: Action
    dest: int
    start: float
    end: float


@dataclass
class Replay:
    """One replayed step: what each rank computed and sent, and when."""

    runs: list[Run]           # compute, in the order the loop placed them
    sends: list[Send]
    ranks: int

    @property
    def step(self) -> float:
        """First action's start to the last action's end (sends after it excluded)."""
        return max(r.end for r in self.runs) - min(r.start for r in self.runs)

    def busy(self) -> list[float]:
        """Per rank: time spent computing."""
        out = [0.0] * self.ranks
        for r in self.runs:
            out[r.rank] += r.end - r.start
        return out

    @property
    def bubble(self) -> float:
        """Idle share of the ranks during the step: 1 - busy / (ranks x step)."""
        return 1 - sum(self.busy()) / (self.ranks * self.step)

    @property
    def bubble_over_ideal(self) -> float:
        """Bubble time / ideal time: step / (the busiest rank's compute) - 1."""
        return self.step / max(self.busy()) - 1


def unit_times(v: int = 1, t_f: float = 1.0, t_i: float = 1.0, t_w: float = 1.0):
    """op_seconds for balanced stages: a whole stage's F, I and W take t_f, t_i and t_w (B = I + W), a chunk
    of a rank holding v chunks 1/v of that, so every schedule does the same work per rank."""
    positive_int("v", v)
    for name, t in (("t_f", t_f), ("t_i", t_i), ("t_w", t_w)):
        number_in_range(name, t, 0, lo_open=True)
    table = {"F": t_f / v, "I": t_i / v, "W": t_w / v, "B": (t_i + t_w) / v}
    return lambda action: table[action.kind]


def replay_actions(orders: list, op_seconds, message_seconds=None) -> Replay:
    """Replay per-rank `orders` (lists of Action); op_seconds(action) and message_seconds(action): the time an
    action takes and the time its output takes to reach another rank (None: free). ValueError on a deadlock."""
    if not orders or not all(isinstance(a, Action) and a.kind in KINDS for seq in orders for a in seq):
        raise ValueError(f"orders must be a non-empty list of per-rank lists of Action; got {orders!r:.200}")
    message_seconds = message_seconds or (lambda action: 0.0)
    rank_of = {a.stage: r for r, seq in enumerate(orders) for a in seq}
    S, K = len(rank_of), len(orders)
    ready: dict[tuple, float] = {}           # ("in", kind, stage, micro): its input is there; ("done", ...)
    free, send_free, pos = [0.0] * K, [0.0] * K, [0] * K
    runs, sends = [], []
    while any(p < len(seq) for p, seq in zip(pos, orders)):
        moved = False
        for r, seq in enumerate(orders):
            while pos[r] < len(seq):
                a = seq[pos[r]]
                needs = _needs(a, S)
                if any(n not in ready for n in needs):
                    break
                start = max([free[r]] + [ready[n] for n in needs])
                free[r] = start + op_seconds(a)
                runs.append(Run(r, a, start, free[r]))
                ready[("done", a.kind, a.stage, a.micro)] = free[r]
                dest = a.stage + 1 if a.kind == "F" else a.stage - 1 if a.kind in "BI" else None
                if dest is not None and 0 <= dest < S:
                    arrive = free[r]
                    if rank_of[dest] != r:
                        begin = max(free[r], send_free[r])
                        send_free[r] = arrive = begin + message_seconds(a)
                        sends.append(Send(r, a, rank_of[dest], begin, arrive))
                    ready[("in", "F" if a.kind == "F" else "B", dest, a.micro)] = arrive
                pos[r] += 1
                moved = True
        if not moved:
            stuck = {r: seq[p] for r, (p, seq) in enumerate(zip(pos, orders)) if p < len(seq)}
            raise ValueError(f"the orders deadlock: each rank waits for an input that never comes ({stuck})")
    return Replay(runs, sends, K)


def _needs(a: Action, S: int) -> list[tuple]:
    """Keys of `ready` that action `a` waits for (the module docstring's dependencies)."""
    if a.kind == "F":
        return [("in", "F", a.stage, a.micro)] if a.stage > 0 else []
    if a.kind == "W":
        return [("done", "I", a.stage, a.micro)]
    grad = [("in", "B", a.stage, a.micro)] if a.stage < S - 1 else []
    return [("done", "F", a.stage, a.micro)] + grad


def check_replay(replay: Replay, tol: float = 1e-12) -> None:
    """ValueError unless every action starts after its inputs are done (and, across ranks, arrived) and
    no rank runs two actions at once."""
    rank_of = {r.action.stage: r.rank for r in replay.runs}
    S = len(rank_of)
    end = {(r.action.kind, r.action.stage, r.action.micro): r.end for r in replay.runs}
    arrival = {(s.action.kind, s.action.stage, s.action.micro): s.end for s in replay.sends}
    for r in replay.runs:
        a = r.action
        ups = {"F": [("F", a.stage - 1)] if a.stage > 0 else [], "W": [("I", a.stage)],
               "I": [("F", a.stage)] + ([("I", a.stage + 1), ("B", a.stage + 1)] if a.stage < S - 1 else [])}
        ups["B"] = ups["I"]
        for kind, s in ups[a.kind]:
            key = (kind, s, a.micro)
            if key in end and r.start + tol < arrival.get(key, end[key]):
                raise ValueError(f"{a} starts at {r.start:g} before its input {Action(*key)} is there")
            if kind == "F" and key not in end:
                raise ValueError(f"{a} runs but {Action(*key)} never does")
    for k in range(replay.ranks):
        mine = sorted((r for r in replay.runs if r.rank == k), key=lambda r: r.start)
        for x, y in zip(mine, mine[1:]):
            if y.start + tol < x.end:
                raise ValueError(f"rank {k} runs {x.action} and {y.action} at once")


def plot_replay(replay: Replay, title: str = "", ax=None, unit: str = "time"):
    """One row per rank, one box per action (colour: kind; hatched: the rank's later chunks), micro-batch
    inside; gaps are the bubble. The style of `schedules.plot_schedule`, with real durations."""
    import matplotlib.pyplot as plt

    chunks = {}
    for r in replay.runs:
        chunks.setdefault(r.rank, set()).add(r.action.stage)
    t0 = min(r.start for r in replay.runs)
    ax = ax or plt.subplots(figsize=(max(6, 0.3 * replay.step), 0.5 * replay.ranks + 1))[1]
    groups: dict[tuple, list] = {}              # one collection per (rank, kind, later chunk): fast to draw
    for r in replay.runs:
        later = sorted(chunks[r.rank]).index(r.action.stage) > 0
        groups.setdefault((r.rank, r.action.kind, later), []).append((r.start - t0, r.end - r.start))
        ax.text((r.start + r.end) / 2 - t0, r.rank, str(r.action.micro), ha="center", va="center", color="white",
                fontsize=7)
    for (rank, kind, later), spans in groups.items():
        ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=COLORS[kind], edgecolor="black", linewidth=0.5,
                       hatch="///" if later else None)
    ax.set(xlim=(0, replay.step), yticks=range(replay.ranks), yticklabels=[f"rank {k}" for k in range(replay.ranks)],
           xlabel=unit, title=f"{title}  (bubble {replay.bubble:.0%})".strip())
    ax.invert_yaxis()
    kinds = [k for k in KINDS if any(r.action.kind == k for r in replay.runs)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    labels = [LABELS[k] for k in kinds]
    if any(len(c) > 1 for c in chunks.values()):
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="///"))
        labels.append("a rank's later chunk")
    ax.legend(handles=handles, labels=labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return ax
