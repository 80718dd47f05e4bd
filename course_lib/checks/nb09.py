"""Checks for solutions/09_model_and_pipeline_parallel_exercises.ipynb: bubble, GPipe schedule, 1F1B memory, row-parallel Linear.

A schedule is checked against the pipeline's dependencies (activations flow down the stages,
gradients flow back up), one op per stage per time step, GPipe's flush, and the step count
2(M+K-1) that the bubble formula implies; the bubble against (K-1)/(M+K-1); peak activations
against hand-made orders; the row-parallel Linear against torch's F.linear and against what a
rank can see (only its own slice of the features).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import expect, expect_close, passed

SHAPES = [(1, 1), (1, 5), (2, 1), (2, 4), (3, 2), (4, 6), (4, 1), (5, 8)]


def check_bubble_fraction(bubble_fraction) -> None:
    """`bubble_fraction(K, M)`: idle fraction of a GPipe step, (K-1)/(M+K-1)."""
    for K, M in SHAPES + [(8, 32), (16, 3)]:
        got = bubble_fraction(K, M)
        expect(isinstance(got, (float, int)) and not isinstance(got, bool),
               f"bubble_fraction({K}, {M}) must return a number; got {type(got).__name__}")
        slots, busy = K * 2 * (M + K - 1), K * 2 * M        # K stages x 2(M+K-1) steps; 2M busy per stage
        expect_close(got, 1 - busy / slots, f"bubble_fraction({K}, {M})",
                     hint="A GPipe step lasts M+K-1 forward slots (the last micro-batch enters stage K-1 after K-1 "
                          "slots) and as many backward slots; each stage works in M of each. Divide the idle "
                          "slots by ALL slots of the step (not by the busy ones); mind the -1, and use true "
                          "division.")
    expect(bubble_fraction(1, 7) == 0, "one stage has no bubble: nothing to wait for")
    passed("bubble_fraction")


def _as_ops(ops, K, M):
    try:
        ops = [tuple(op) for op in ops]
    except TypeError:
        raise AssertionError(f"gpipe_schedule({K}, {M}) must return a list of (stage, time, kind, micro) tuples")
    expect(all(len(op) == 4 for op in ops), f"gpipe_schedule({K}, {M}): every op must be (stage, time, kind, micro)")
    for s, t, kind, m in ops:
        expect(kind in ("F", "B"), f"kind must be 'F' or 'B'; got {kind!r}")
        expect(all(isinstance(v, int) and v >= 0 for v in (s, t, m)),
               f"stage, time and micro must be non-negative ints; got {(s, t, kind, m)}")
    return ops


def check_gpipe_schedule(gpipe_schedule) -> None:
    """`gpipe_schedule(K, M)` -> [(stage, time, kind, micro)]: a valid GPipe step of 2(M+K-1) time steps."""
    for K, M in SHAPES:
        ops = _as_ops(gpipe_schedule(K, M), K, M)
        when = {}
        for s, t, kind, m in ops:
            expect((kind, s, m) not in when, f"K={K}, M={M}: {kind} of micro-batch {m} runs twice on stage {s}")
            when[(kind, s, m)] = t
        expected = {(kind, s, m) for kind in "FB" for s in range(K) for m in range(M)}
        expect(set(when) == expected,
               f"K={K}, M={M}: every stage must run F and B of every micro-batch once; missing "
               f"{sorted(expected - set(when))[:4]}, unexpected {sorted(set(when) - expected)[:4]}")
        seen = {}
        for s, t, kind, m in ops:
            expect((s, t) not in seen, f"K={K}, M={M}: stage {s} runs {seen.get((s, t))} and {(kind, m)} at the same "
                   f"time {t}. A stage (one device) does one thing at a time: a backward cannot overlap a forward.")
            seen[(s, t)] = (kind, m)
        for s in range(K):
            for m in range(M):
                f, b = when[("F", s, m)], when[("B", s, m)]
                expect(s == 0 or f > when[("F", s - 1, m)],
                       f"K={K}, M={M}: F of micro-batch {m} on stage {s} at time {f} does not come after stage {s - 1}'s "
                       f"(time {when.get(('F', s - 1, m))}): its input activation is not there yet.")
                expect(b > f, f"K={K}, M={M}: stage {s} runs B of micro-batch {m} (time {b}) before its F (time {f}).")
                expect(s == K - 1 or b > when[("B", s + 1, m)],
                       f"K={K}, M={M}: B of micro-batch {m} on stage {s} at time {b} does not come after stage {s + 1}'s "
                       f"(time {when.get(('B', s + 1, m))}). Backward runs in REVERSE stage order: the gradient "
                       "starts at the loss on the last stage and flows back to stage 0.")
            last_f = max(when[("F", s, m)] for m in range(M))
            first_b = min(when[("B", s, m)] for m in range(M))
            expect(last_f < first_b, f"K={K}, M={M}: stage {s} starts a backward before its last forward. GPipe runs "
                   "all M forwards, then all M backwards (then the flush: one optimizer step).")
        start, end = min(t for _, t, _, _ in ops), max(t for _, t, _, _ in ops) + 1
        expect(start == 0, f"K={K}, M={M}: the first op should run at time 0; yours at {start}")
        expect(end == 2 * (M + K - 1),
               f"K={K}, M={M}: your schedule takes {end} time steps; GPipe needs exactly 2(M+K-1) = {2 * (M + K - 1)} "
               "(M+K-1 to fill and drain the forwards, as many for the backwards). Is an op later than its "
               "inputs allow (e.g. backward starting one step late), or too early?")
        busy = len(ops) / (K * end)
        expect_close(1 - busy, (K - 1) / (M + K - 1), f"K={K}, M={M}: idle fraction of your schedule")
    passed("gpipe_schedule")


# Hand-made orders (per stage) with the number of activations the stage must keep at most.
ORDERS = [
    ([("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)], 3),           # GPipe, M=3
    ([("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)], 1),           # 1F1B, last stage
    ([("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)], 2),  # 1F1B, K-k = 2
    ([("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1), ("B", 2), ("B", 3), ("B", 4)], 4),
    ([("F", 0), ("B", 0)], 1),
]


def check_peak_in_flight(peak_in_flight) -> None:
    """`peak_in_flight(stage_order)`: most micro-batches forwarded but not yet backwarded at any moment."""
    for order, want in ORDERS:
        got = peak_in_flight(list(order))
        expect(got == want, f"peak_in_flight({order}) should be {want}; got {got}. A forward stores its micro-batch's "
               "activations until that micro-batch's backward frees them: count +1 per F, -1 per B, and keep the "
               "maximum (not the total number of forwards).")
    passed("peak_in_flight")


def check_row_parallel_linear(row_parallel_linear) -> None:
    """`row_parallel_linear(x, weight, bias, world_size) -> (partials, y)`, rank r owning input features chunk r."""
    g = torch.Generator().manual_seed(0)
    for batch, d_in, d_out, world in [(3, 8, 6, 2), (4, 12, 4, 4), (2, 6, 6, 3), (5, 4, 2, 1)]:
        x, w, b = (torch.randn(batch, d_in, generator=g), torch.randn(d_out, d_in, generator=g),
                   torch.randn(d_out, generator=g))
        partials, y = row_parallel_linear(x.clone(), w.clone(), b.clone(), world)
        expect(len(partials) == world, f"world_size={world}: expected {world} partial sums (one per rank); "
               f"got {len(partials)}")
        y = torch.as_tensor(y)
        product = F.linear(x, w)
        for wrong, what in [(product + world * b, f"the bias was added on every rank ({world} times): add it ONCE, "
                             "after the all-reduce (or on one rank only)"),
                            (product / world + b, "the partials were averaged: the all-reduce must SUM them (each "
                             "holds a share of the dot products, not an estimate of the whole)"),
                            (product + b / world, "the bias was divided by world_size: add it once, whole")]:
            expect(world == 1 or y.shape != wrong.shape or not torch.allclose(y, wrong, atol=1e-5),
                   f"world_size={world}: {what}.")
        expect_close(y, F.linear(x, w, b), f"world_size={world}: y vs F.linear(x, weight, bias)", atol=1e-5,
                     hint="y = (sum of the partials, what all-reduce computes) + bias, with the bias added ONCE: "
                          "adding it on every rank counts it world_size times.")
        expect_close(sum(partials), F.linear(x, w), f"world_size={world}: sum of the partials vs x @ weight.T",
                     atol=1e-5, hint="Each partial is [batch, out]: rank r's share of x @ weight.T from input-feature chunk r, "
                          "without the bias. (Splitting the OUTPUT features instead is column-parallel.)")
        n = d_in // world
        for r in range(world):
            mine = slice(r * n, (r + 1) * n)
            x2, w2 = x.clone(), w.clone()
            outside = torch.ones(d_in, dtype=torch.bool)
            outside[mine] = False
            x2[:, outside] += 1.0
            w2[:, outside] -= 1.0
            again, _ = row_parallel_linear(x2, w2, b.clone(), world)
            expect_close(again[r], partials[r], f"world_size={world}: partial of rank {r} after changing features "
                         "rank r does not own", atol=1e-5,
                         hint=f"Rank r sees only input features [r*in/N, (r+1)*in/N) (here {mine.start}:{mine.stop}) "
                              "of x and the same COLUMNS of weight, a contiguous chunk as torch's RowwiseParallel "
                              "(Shard(1)) has; its partial may depend on nothing else.")
    passed("row_parallel_linear")
