"""Checks for solutions/09_model_and_pipeline_parallel_exercises.ipynb: bubble, GPipe schedule, 1F1B memory, row-parallel Linear.

A schedule is checked against the pipeline's dependencies (activations flow down the stages,
gradients flow back up), one op per stage per time step, GPipe's flush, and the step count
2(M+K-1) that the bubble formula implies; the bubble against (K-1)/(M+K-1); peak activations
against hand-made and seeded random stage orders (not only GPipe's and 1F1B's); the row-parallel Linear
against torch's F.linear and against what a rank can see (only its own slice of the features).
"""
from __future__ import annotations

import numbers
import random

import torch
import torch.nn.functional as F

from . import expect, expect_close, passed

SHAPES = [(1, 1), (1, 5), (2, 1), (2, 4), (3, 2), (4, 6), (4, 1), (5, 8)]


# Formulas learners write instead of (K-1)/(M+K-1), each with what it gets wrong.
BUBBLE_MISTAKES = [
    (lambda K, M: (K - 1) // (M + K - 1), "that is integer division (//): use true division (/)"),
    (lambda K, M: (K - 1) / M, "that divides the idle slots by the BUSY ones (M per stage): divide by all the "
     "slots of the step, M + K - 1 per stage"),
    (lambda K, M: (K - 1) / (M + K), "the step lasts M + K - 1 slots, not M + K: the last micro-batch enters the "
     "last stage K - 1 slots after the first"),
    (lambda K, M: K / (M + K - 1), "each stage waits K - 1 slots, not K (a stage never waits for itself)"),
]


def check_bubble_fraction(bubble_fraction) -> None:
    """`bubble_fraction(K, M)`: idle fraction of a GPipe step, (K-1)/(M+K-1)."""
    answers = []
    for K, M in SHAPES + [(8, 32), (16, 3), (3, 1)]:
        got = bubble_fraction(K, M)
        expect(isinstance(got, numbers.Real) and not isinstance(got, bool),
               f"bubble_fraction({K}, {M}) must return a number; got {type(got).__name__}")
        answers.append((K, M, got))
    for K, M, got in answers:
        slots, busy = K * 2 * (M + K - 1), K * 2 * M        # K stages x 2(M+K-1) steps; 2M busy per stage
        want = 1 - busy / slots
        if abs(got - want) > 1e-9:      # name the formula that gives the answer's value on EVERY case
            mistake = next((why for formula, why in BUBBLE_MISTAKES
                            if all(abs(formula(k, m) - value) < 1e-9 for k, m, value in answers)),
                           "A GPipe step lasts M+K-1 forward slots (the last micro-batch enters stage K-1 after "
                           "K-1 slots) and as many backward slots; each stage works in M of each: the bubble is "
                           "the idle slots over ALL slots of the step.")
            raise AssertionError(f"bubble_fraction({K}, {M}) = {got}, expected {want:.6g}: {mistake}")
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


def _first_late_op(ops, when) -> str:
    """The first op (in time) that runs later than its inputs and its stage allow: where a step is wasted."""
    for s, t, kind, m in sorted(ops, key=lambda op: op[1]):
        needs = [("F", s - 1, m)] if kind == "F" else [("F", s, m), ("B", s + 1, m)]
        ready = [when[d] + 1 for d in needs if d in when]
        free = [u + 1 for k, u, _, _ in ops if k == s and u < t]
        earliest = max(ready + [max(free, default=0)])
        if t > earliest:
            return (f"{kind} of micro-batch {m} on stage {s} runs at time {t}, but its inputs are there and the stage "
                    f"is free from time {earliest}: a wasted step.")
    return ""


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
               f"(M+K-1 to fill and drain the forwards, as many for the backwards). {_first_late_op(ops, when)}")
        busy = len(ops) / (K * end)
        expect_close(1 - busy, (K - 1) / (M + K - 1), f"K={K}, M={M}: idle fraction of your schedule")
    passed("gpipe_schedule")


# Hand-made orders (per stage) with the number of activations the stage must keep at most: GPipe and 1F1B, then
# orders where those two's shortcuts fail (the peak after a backward, backwards out of order, forwards out of order).
ORDERS = [
    ([("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)], 3),           # GPipe, M=3
    ([("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)], 1),           # 1F1B, last stage
    ([("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)], 2),  # 1F1B, K-k = 2
    ([("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1), ("B", 2), ("B", 3), ("B", 4)], 4),
    ([("F", 0), ("B", 0)], 1),
    ([("F", 0), ("B", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 2)], 2),           # the peak comes after a backward
    ([("F", 0), ("F", 1), ("B", 0), ("F", 2), ("F", 3), ("B", 1), ("B", 2), ("B", 3)], 3),  # 1F1B running ahead
    ([("F", 0), ("F", 1), ("F", 2), ("B", 2), ("B", 1), ("B", 0)], 3),           # backwards in reverse
    ([("F", 1), ("F", 0), ("B", 0), ("F", 2), ("B", 2), ("B", 1)], 2),           # forwards out of order
]


def _random_orders(count: int = 40, seed: int = 9) -> list:
    """Seeded stage orders of 1-7 micro-batches, any interleaving in which each F comes before its own B."""
    rng, orders = random.Random(seed), []
    for _ in range(count):
        todo, live, order = list(range(rng.randint(1, 7))), [], []
        rng.shuffle(todo)
        while todo or live:
            if todo and (not live or rng.random() < 0.55):
                live.append(todo.pop())
                order.append(("F", live[-1]))
            else:
                order.append(("B", live.pop(rng.randrange(len(live)))))
        orders.append(order)
    return orders


def _held(order) -> list:
    """How many micro-batches' activations the stage holds after each op (forwarded, not yet backwarded)."""
    live, counts = set(), []
    for kind, m in order:
        (live.add if kind == "F" else live.discard)(m)
        counts.append(len(live))
    return counts


def _longest_forward_run(order) -> int:
    runs = "".join(kind for kind, _ in order).split("B")
    return max(len(run) for run in runs)


# What learners count instead of the peak (the last two give it on GPipe and 1F1B orders, not on others).
PEAK_SHORTCUTS = [
    (lambda order: sum(kind == "F" for kind, _ in order),
     "the number of forwards: a backward frees its micro-batch's activations, so count -1 per B"),
    (lambda order: next(i for i, (kind, _) in enumerate(order) if kind == "B"),
     "the number of forwards before the first backward: forwards after it can raise the count again"),
    (_longest_forward_run, "the longest run of consecutive forwards: after a backward the stage still holds the "
     "earlier micro-batches, so keep one running count over the whole order"),
]


def _peak_mistake(answers: list) -> str:
    """What the answer counted, where one shortcut gives the answer's value on EVERY order (the orders separate
    them); `answers` holds (order, the answer's value)."""
    return next((why for shortcut, why in PEAK_SHORTCUTS if all(shortcut(order) == got for order, got in answers)),
                "A forward stores its micro-batch's activations until that micro-batch's backward frees them: "
                "count +1 per F, -1 per B, and keep the maximum.")


def check_peak_in_flight(peak_in_flight) -> None:
    """`peak_in_flight(stage_order)`: most micro-batches forwarded but not yet backwarded at any moment, on any
    order in which each micro-batch's F comes before its B."""
    cases, answers = ORDERS + [(order, max(_held(order))) for order in _random_orders()], []
    for order, _ in cases:
        given = list(order)
        answers.append((order, peak_in_flight(given)))
        expect(given == order, f"peak_in_flight({order}) changed the list it was given (now {given}): only read "
               "it, the caller still needs its order")
    for (order, want), (_, got) in zip(cases, answers):
        expect(got == want, f"peak_in_flight({order}) should be {want}; got {got}: {_peak_mistake(answers)}")
    passed("peak_in_flight")


ROW_PARALLEL_CASES = [  # (batch, in, out, world_size, dtype): in divisible by world_size, as the text says
    (3, 8, 6, 2, torch.float32), (4, 12, 4, 4, torch.float32), (2, 6, 6, 3, torch.float32),
    (5, 4, 2, 1, torch.float32), (1, 10, 3, 5, torch.float64), (2, 4, 1, 4, torch.float32)]


def _row_parallel_mistakes(x, w, b, world, partials) -> list:
    """(y a mistake would give, what the mistake is), for the y-checks below."""
    product = F.linear(x, w)
    return [(product + world * b, f"the bias was added on every rank ({world} times): add it ONCE, after the "
             "all-reduce (or on one rank only)"),
            (product / world + b, "the partials were averaged: the all-reduce must SUM them (each holds a share of "
             "the dot products, not an estimate of the whole)"),
            (product + b / world, "the bias was divided by world_size: add it once, whole")] + [
            (p + b, f"y is rank {r}'s partial plus the bias: the all-reduce adds ALL {world} partials")
            for r, p in enumerate(partials) if torch.is_tensor(p) and p.shape == product.shape]


def _check_partial_shapes(partials, batch, d_out, world, dtype) -> None:
    for r, p in enumerate(partials):
        expect(torch.is_tensor(p), f"world_size={world}: partial {r} is a {type(p).__name__}, not a tensor")
        expect(tuple(p.shape) != (batch, d_out // world) or world == 1,
               f"world_size={world}: partial {r} has shape {tuple(p.shape)} = [batch, out/N]: that splits the "
               "OUTPUT features (column-parallel). Row-parallel splits the INPUT features: every rank's partial is "
               f"a whole [batch, out] = {(batch, d_out)}, a share of every dot product.")
        expect(tuple(p.shape) == (batch, d_out), f"world_size={world}: partial {r} has shape {tuple(p.shape)}; "
               f"each partial is [batch, out] = {(batch, d_out)}")
        expect(p.dtype == dtype, f"world_size={world}: partial {r} is {p.dtype}, x and weight {dtype}: keep "
               "their dtype")


def check_row_parallel_linear(row_parallel_linear) -> None:
    """`row_parallel_linear(x, weight, bias, world_size) -> (partials, y)`, rank r owning input features chunk r."""
    g = torch.Generator().manual_seed(0)
    for batch, d_in, d_out, world, dtype in ROW_PARALLEL_CASES:
        x, w, b = (torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
                   for shape in ((batch, d_in), (d_out, d_in), (d_out,)))
        given = (x.clone(), w.clone(), b.clone())
        partials, y = row_parallel_linear(*given, world)
        for name, before, after in zip(("x", "weight", "bias"), (x, w, b), given):
            expect(torch.equal(before, after), f"world_size={world}: row_parallel_linear changed {name} in place; "
                   "only read its inputs (slice them, and compute into new tensors)")
        expect(len(partials) == world, f"world_size={world}: expected {world} partial sums (one per rank); "
               f"got {len(partials)}")
        _check_partial_shapes(partials, batch, d_out, world, dtype)
        y = torch.as_tensor(y)
        for wrong, what in _row_parallel_mistakes(x, w, b, world, partials):
            expect(world == 1 or y.shape != wrong.shape or not torch.allclose(y, wrong, atol=1e-5),
                   f"world_size={world}: {what}.")
        expect(y.dtype == dtype, f"world_size={world}: y is {y.dtype}, x and weight {dtype}: keep their dtype")
        expect_close(y, F.linear(x, w, b), f"world_size={world}: y vs F.linear(x, weight, bias)", atol=1e-5,
                     hint="y = the sum of the N partials (what the all-reduce computes) + the bias, added once.")
        expect_close(sum(partials), F.linear(x, w), f"world_size={world}: sum of the partials vs x @ weight.T",
                     atol=1e-5, hint="Rank r's partial is its share of x @ weight.T from input-feature chunk r, "
                                     "without the bias.")
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
