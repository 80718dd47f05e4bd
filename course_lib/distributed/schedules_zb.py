"""Schedules that shrink the bubble: interleaved 1F1B (v model chunks per rank) and zero bubble (split backward).

`schedules` gives each of K ranks one stage and runs F and B per micro-batch. Here an **action** is
`Action(kind, stage, micro)`, where `stage` is a *virtual* stage (a model chunk; the model is cut
into S of them) and `kind` is one of

    "F"  forward;
    "B"  full backward (both gradients below, in one pass);
    "I"  backward for the input only, dL/d(input): what the previous stage waits for (the paper's "B");
    "W"  backward for the weights only, dL/dW: nothing waits for it until the optimizer step.

A schedule is, per rank, the list of actions it runs (the letters are torch.distributed.pipelining's).

- Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", section 2.2.2): the model is cut into S = K·v chunks and rank r holds
  chunks r, r+K, r+2K, ... A micro-batch crosses every rank v times, so the fill and drain are made of
  chunks v times smaller: bubble / ideal time = (K-1)/(v·M) instead of (K-1)/M, for about v times the
  messages (2M(Kv-1) instead of 2M(K-1)). M must be a multiple of K (Megatron's condition).
- ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR, section 2.1): 1F1B with each B
  split into I and W. Only I is on the critical path, so gradients travel back faster; rank r holds
  back its W's by r slots and runs them at the end, where it would otherwise wait. Every rank then
  keeps K micro-batches in flight (1F1B's peak, on rank 0), and with t_F = t_I = t_W the bubble is a
  third of 1F1B's: bubble / ideal = (K-1)(t_F + t_I - t_W) / (M(t_F + t_I + t_W)) = (K-1)/(3M).
- ZB-V (Qi et al., arXiv 2401.10241, section 6): two chunks per rank in a V: rank r holds
  chunk r and chunk 2K-1-r, so the forward runs down the ranks and back up, and rank 0 computes the
  loss. With t_F = t_I = t_W per chunk and M >= 2K-1 the only idle time left is the first
  micro-batch's way down: rank K-1 cannot start before K-1 chunk forwards, and a step that ends in one
  synchronous optimizer step cannot hide that with these chunks. bubble / ideal = (K-1)/(6M).

    from course_lib.distributed import schedules_zb as zb
    orders = zb.order("zb-v", K=4, M=8)          # orders[r] = [Action("F", 0, 0), ...]
    zb.check_order(orders, M=8)
    zb.bubble_over_ideal("zb-v", 4, 8)            # 0.0625; the replay: simulate.pipeline_clock
"""
from __future__ import annotations

from typing import NamedTuple

from ..validate import int_in_range, one_of, positive_int
from . import schedules

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
KINDS = ("F", "B", "I", "W")


class Action(NamedTuple):
    """One op a rank runs: `kind` ("F", "B", "I" or "W") of virtual stage `stage` on micro-batch `micro`."""

    kind: str
    stage: int
    micro: int


def chunks_per_rank(name: str, v: int = 2) -> int:
    """How many virtual stages each rank holds: v for "interleaved", 2 for "zb-v", else 1."""
    one_of("name", name, SCHEDULES)
    return v if name == "interleaved" else 2 if name == "zb-v" else 1


def stage_ranks(name: str, K: int, v: int = 2) -> list[int]:
    """The rank of each virtual stage: looped (stage s on rank s mod K), or a V for "zb-v"."""
    positive_int("K", K)
    S = K * chunks_per_rank(name, v)
    return [s if s < K else 2 * K - 1 - s for s in range(S)] if name == "zb-v" else [s % K for s in range(S)]


def order(name: str, K: int, M: int, v: int = 2) -> list[list[Action]]:
    """Per rank, the actions of schedule `name` (one of SCHEDULES) for K ranks and M micro-batches;
    v: chunks per rank of "interleaved" (ZB-V always has 2, the others 1)."""
    one_of("name", name, SCHEDULES)
    if name in ("gpipe", "1f1b"):
        return [[Action(kind, k, m) for kind, m in stage] for k, stage in enumerate(schedules.order(name, K, M))]
    return {"interleaved": lambda: interleaved_order(K, M, v), "zb-h1": lambda: zb_h1_order(K, M),
            "zb-v": lambda: zbv_order(K, M)}[name]()


def interleaved_order(K: int, M: int, v: int = 2) -> list[list[Action]]:
    """Megatron's interleaved 1F1B: rank r holds chunks r, r+K, ..., r+(v-1)K.

    A rank's k-th forward is micro-batch (k // Kv)·K + k % K of its local chunk (k // K) % v: K
    micro-batches through one chunk, then the same K through the next. Its k-th backward takes the
    chunks the other way round. Rank r warms up with 2(K-1-r) + (v-1)K forwards, then alternates
    one forward and one backward, then drains the remaining backwards.
    """
    positive_int("K", K)
    positive_int("M", M)
    int_in_range("v", v, 2, hint=" (v=1 is plain 1F1B)")
    if M % K:
        raise ValueError(f"M must be a multiple of K for interleaved 1F1B (Megatron's condition); got M={M}, K={K}")
    total = v * M

    def action(kind: str, k: int, r: int) -> Action:
        local = (k // K) % v if kind == "F" else v - 1 - (k // K) % v
        return Action(kind, local * K + r, (k // (K * v)) * K + k % K)

    orders = []
    for r in range(K):
        warm = min(2 * (K - 1 - r) + (v - 1) * K, total)
        seq = [action("F", k, r) for k in range(warm)]
        for k in range(total - warm):
            seq += [action("F", warm + k, r), action("B", k, r)]
        orders.append(seq + [action("B", k, r) for k in range(total - warm, total)])
    return orders


def zb_h1_order(K: int, M: int) -> list[list[Action]]:
    """ZB-H1: 1F1B (K-1-r warm-up forwards on rank r) with B split into I and W; rank r runs W(i - r) after I(i)."""
    positive_int("K", K)
    positive_int("M", M)
    orders = []
    for r in range(K):
        warm = min(K - 1 - r, M)
        seq, w = [Action("F", r, m) for m in range(warm)], 0
        for i in range(M):
            if warm + i < M:
                seq.append(Action("F", r, warm + i))
            seq.append(Action("I", r, i))
            if i >= r:                                   # W held back by r slots
                seq.append(Action("W", r, w))
                w += 1
        orders.append(seq + [Action("W", r, m) for m in range(w, M)])
    return orders


def zbv_order(K: int, M: int) -> list[list[Action]]:
    """ZB-V on rank r (chunks c0 = r, c1 = 2K-1-r), in phases:
    2(K-r)-1 forwards of c0; r times (F c1, F c0); K-r times (F c1, I c1, W c1); then, while forwards
    remain, (F c0, I c0, W c0, F c1, I c1, W c1); then r times (I c0, I c1), K-r times (I c0, W c0) and
    the W's still owed. Written for at least 2K-1 micro-batches; the actions of any beyond M are dropped.
    """
    positive_int("K", K)
    positive_int("M", M)
    n = max(M, 2 * K - 1)
    return [[a for a in _zbv_rank(K, r, n) if a.micro < M] for r in range(K)]


def _zbv_rank(K: int, r: int, n: int) -> list[Action]:
    c0, c1 = r, 2 * K - 1 - r
    count = {(kind, c): 0 for kind in "FIW" for c in (c0, c1)}     # next micro-batch per (kind, chunk)
    seq: list[Action] = []

    def run(*ops):
        for kind, c in ops:
            seq.append(Action(kind, c, count[kind, c]))
            count[kind, c] += 1

    run(*[("F", c0)] * (2 * (K - r) - 1))
    for _ in range(r):
        run(("F", c1), ("F", c0))
    for _ in range(K - r):
        run(("F", c1), ("I", c1), ("W", c1))
    while count["F", c1] < count["F", c0] or count["F", c0] < n:
        if count["F", c0] < n:
            run(("F", c0))
        run(("I", c0), ("W", c0), ("F", c1), ("I", c1), ("W", c1))
    for _ in range(r):
        run(("I", c0), ("I", c1))
    for _ in range(K - r):
        run(("I", c0), ("W", c0))
    run(*[("W", c1)] * (count["I", c1] - count["W", c1]), *[("W", c0)] * (count["I", c0] - count["W", c0]))
    return seq


def check_order(orders: list, M: int) -> None:
    """ValueError unless every virtual stage's actions sit on one rank and, per (stage, micro), it runs
    F once and then either B once or I then W once, in that order on its rank. (Whether the stages'
    dependencies across ranks can be met is the replay's check: `simulate.pipeline_clock.check_replay`.)"""
    positive_int("M", M)
    rank_of, seen = {}, {}
    for r, seq in enumerate(orders):
        for i, a in enumerate(seq):
            if not isinstance(a, Action) or a.kind not in KINDS:
                raise ValueError(f"rank {r} runs {a!r}: not an Action of kind {KINDS}")
            if rank_of.setdefault(a.stage, r) != r:
                raise ValueError(f"stage {a.stage} runs on ranks {rank_of[a.stage]} and {r}")
            if not 0 <= a.micro < M:
                raise ValueError(f"{a}: micro-batches must be 0..{M - 1}")
            if (a.kind, a.stage, a.micro) in seen:
                raise ValueError(f"{a} runs twice")
            seen[a.kind, a.stage, a.micro] = i
    S = len(rank_of)
    if sorted(rank_of) != list(range(S)):
        raise ValueError(f"virtual stages should be 0..{S - 1}; got {sorted(rank_of)}")
    for s in range(S):
        for m in range(M):
            at = {kind: seen.get((kind, s, m)) for kind in KINDS}
            split = at["I"] is not None or at["W"] is not None
            if at["F"] is None or (at["B"] is None) != split or (split and None in (at["I"], at["W"])):
                raise ValueError(f"stage {s}, micro-batch {m}: needs F and then B, or F, I and W; got "
                                 f"{[k for k in KINDS if at[k] is not None]}")
            first_back = at["I"] if split else at["B"]
            if not at["F"] < first_back <= (at["W"] if split else first_back):
                raise ValueError(f"stage {s}, micro-batch {m}: runs its actions out of order (F, then B or I, then W)")


def merge_backward(seq: list) -> list[Action]:
    """An I directly followed by the W of the same stage and micro-batch, written as one B."""
    out: list[Action] = []
    for a in seq:
        if a.kind == "W" and out and out[-1] == Action("I", a.stage, a.micro):
            out[-1] = Action("B", a.stage, a.micro)
        else:
            out.append(a)
    return out


def peak_in_flight(seq: list, v: int = 1) -> float:
    """Most activations a rank holds at once, in micro-batches through all of its layers: a (chunk,
    micro-batch) counts 1/v from its F until its B or W (W still needs the layer inputs)."""
    positive_int("v", v)
    live = peak = 0
    for a in seq:
        live += {"F": 1, "B": -1, "W": -1}.get(a.kind, 0)
        peak = max(peak, live)
    return peak / v


def messages(orders: list) -> int:
    """Point-to-point messages per step: an F whose next stage, or a B/I whose previous stage, is on another rank."""
    rank_of = {a.stage: r for r, seq in enumerate(orders) for a in seq}
    S = len(rank_of)
    return sum(1 for r, seq in enumerate(orders) for a in seq
               if (a.kind == "F" and a.stage < S - 1 and rank_of[a.stage + 1] != r)
               or (a.kind in "BI" and a.stage > 0 and rank_of[a.stage - 1] != r))


def bubble_over_ideal(name: str, K: int, M: int, v: int = 2) -> float:
    """Closed form of bubble time / ideal time M(t_F + t_B) for balanced stages and free messages.

    GPipe, 1F1B: (K-1)/M; interleaved: (K-1)/(vM), any t_F, t_B. ZB-H1: (K-1)/(3M) and ZB-V: (K-1)/(6M)
    with t_F = t_I = t_W (ZB-V for M >= 2K-1). The share of the step is r / (1 + r).
    """
    one_of("name", name, SCHEDULES)
    positive_int("K", K)
    positive_int("M", M)
    if name == "zb-v" and M < 2 * K - 1:
        raise ValueError(f"M must be >= 2K-1 = {2 * K - 1} for ZB-V's closed form; got M={M}")
    per = {"gpipe": M, "1f1b": M, "interleaved": v * M, "zb-h1": 3 * M, "zb-v": 6 * M}[name]
    return (K - 1) / per


def bubble_share(name: str, K: int, M: int, v: int = 2) -> float:
    """Idle share of the step from the closed form: r / (1 + r); (K-1)/(M+K-1) for GPipe and 1F1B."""
    r = bubble_over_ideal(name, K, M, v)
    return r / (1 + r)
