"""The checks of exercise notebook 09 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.checks.nb09 import (check_bubble_fraction, check_gpipe_schedule, check_peak_in_flight,
                                    check_row_parallel_linear)
from course_lib.distributed import schedules
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "09_model_and_pipeline_parallel_exercises.ipynb")
CHECKS = {"bubble_fraction": check_bubble_fraction, "gpipe_schedule": check_gpipe_schedule,
          "peak_in_flight": check_peak_in_flight, "row_parallel_linear": check_row_parallel_linear}


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    for name, check in CHECKS.items():
        check(NS[name])


def test_library_versions_pass_too():
    check_bubble_fraction(schedules.bubble_fraction)
    check_gpipe_schedule(schedules.gpipe_schedule)
    check_peak_in_flight(schedules.peak_in_flight)


def test_stubs_fail():
    for check in CHECKS.values():
        with pytest.raises(NotImplementedError):
            check(stub)


@pytest.mark.parametrize("wrong, message", [
    (lambda K, M: (K - 1) / (M + K), "not M \\+ K"),                 # off by one
    (lambda K, M: (K - 1) / M, "BUSY"),                              # idle over busy, not over the whole step
    (lambda K, M: (K - 1) // (M + K - 1), "integer division"),
    (lambda K, M: K / (M + K - 1), "waits K - 1 slots, not K"),      # forgot that a stage never waits for itself
    (lambda K, M: (K - 1) / (2 * (M + K - 1)), "idle slots over ALL"),  # counted one phase's idle over both
    (lambda K, M: str((K - 1) / (M + K - 1)), "must return a number"),
])
def test_wrong_bubble_fraction_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_bubble_fraction(wrong)


def test_other_bubble_fractions_pass():
    from fractions import Fraction
    check_bubble_fraction(lambda K, M: Fraction(K - 1, M + K - 1))     # exact, and a number
    check_bubble_fraction(lambda K, M: 1 - M / (M + K - 1))


@settings(max_examples=20)
@given(st.integers(1, 6), st.integers(1, 12))
def test_bubble_fraction_is_the_idle_share_of_the_simulated_schedule(K, M):
    ops = schedules.gpipe_schedule(K, M)
    idle = 1 - len(ops) / (K * schedules.makespan(ops))
    assert abs(NS["bubble_fraction"](K, M) - idle) < 1e-12
    assert NS["bubble_fraction"](K, M) == schedules.bubble_fraction(K, M)


def backward_in_forward_stage_order(K, M):
    return [(k, k + m, "F", m) for k in range(K) for m in range(M)] + \
           [(k, (M + K - 1) + k + m, "B", m) for k in range(K) for m in range(M)]


def backward_one_step_early(K, M):         # off by one: the last stage's first B collides with its last F
    return [(k, k + m, "F", m) for k in range(K) for m in range(M)] + \
           [(k, (M + K - 2) + (K - 1 - k) + m, "B", m) for k in range(K) for m in range(M)]


def backward_one_step_late(K, M):          # valid dependencies, one wasted step
    return [(k, k + m, "F", m) for k in range(K) for m in range(M)] + \
           [(k, (M + K) + (K - 1 - k) + m, "B", m) for k in range(K) for m in range(M)]


def forward_without_waiting(K, M):          # every stage starts at once: no input yet
    return [(k, m, "F", m) for k in range(K) for m in range(M)] + \
           [(k, M + (K - 1 - k) + m, "B", m) for k in range(K) for m in range(M)]


def f_and_b_of_a_micro_batch_together(K, M):  # B(k, m) in the same slot as F(k, m) on the last stage
    return [(k, k + m, "F", m) for k in range(K) for m in range(M)] + \
           [(k, (K - 1 + m) + 2 * (K - 1 - k), "B", m) for k in range(K) for m in range(M)]


def one_f_one_b_instead(K, M):              # a valid schedule, but not GPipe (no flush order)
    return [tuple(op) for op in schedules.one_f_one_b_schedule(K, M)]


def missing_last_micro_batch(K, M):
    return [op for op in NS["gpipe_schedule"](K, M) if op[3] != M - 1 or M == 1]


def times_from_one(K, M):
    return [(k, t + 1, kind, m) for k, t, kind, m in NS["gpipe_schedule"](K, M)]


def no_pipelining(K, M):                      # one micro-batch through all stages at a time: valid, but long
    ops = [(k, m * K + k, "F", m) for k in range(K) for m in range(M)]
    return ops + [(k, M * K + m * K + (K - 1 - k), "B", m) for k in range(K) for m in range(M)]


def kinds_as_words(K, M):
    return [(k, t, {"F": "forward", "B": "backward"}[kind], m) for k, t, kind, m in NS["gpipe_schedule"](K, M)]


@pytest.mark.parametrize("wrong, message", [
    (backward_in_forward_stage_order, "REVERSE stage order"), (backward_one_step_early, "one thing at a time"),
    (backward_one_step_late, "B of micro-batch 0 on stage 0 runs at time 2.*wasted step"),
    (forward_without_waiting, "input activation is not there"), (f_and_b_of_a_micro_batch_together, "at the same time"),
    (one_f_one_b_instead, "backward before its last forward"), (missing_last_micro_batch, "missing"),
    (times_from_one, "first op should run at time 0"), (no_pipelining, "wasted step"),
    (kinds_as_words, "kind must be 'F' or 'B'")])
def test_wrong_gpipe_schedule_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_gpipe_schedule(wrong)


def test_other_valid_gpipe_schedules_pass():
    def backwards_in_reverse(K, M):           # the last micro-batch's backward first: same length, same rules
        return [(k, k + m, "F", m) for k in range(K) for m in range(M)] + \
               [(k, (M + K - 1) + (K - 1 - k) + (M - 1 - m), "B", m) for k in range(K) for m in range(M)]

    def micro_batches_relabelled(K, M):        # the micro-batches in another order (any order is allowed)
        relabel = [(3 * m + 1) % M for m in range(M)] if M % 3 else list(reversed(range(M)))
        return [(k, t, kind, relabel[m]) for k, t, kind, m in NS["gpipe_schedule"](K, M)]

    def as_op_tuples(K, M):
        return [schedules.Op(*op) for op in NS["gpipe_schedule"](K, M)]
    for answer in (backwards_in_reverse, micro_batches_relabelled, as_op_tuples):
        check_gpipe_schedule(answer)


@settings(max_examples=30)
@given(st.integers(1, 8), st.integers(1, 12))
def test_gpipe_solution_is_the_timed_gpipe_order(K, M):
    assert sorted(NS["gpipe_schedule"](K, M)) == sorted(tuple(op) for op in schedules.gpipe_schedule(K, M))


def count_forwards(order):
    return sum(kind == "F" for kind, _ in order)


def off_by_one_peak(order):
    live = peak = 0
    for kind, _ in order:
        live += 1 if kind == "F" else -1
        if kind == "B":                      # measured only after a backward has freed its activations
            peak = max(peak, live)
    return peak


def forwards_before_first_backward(order):    # right for GPipe and 1F1B, not for orders that run ahead later
    return next(i for i, (kind, _) in enumerate(order) if kind == "B")


def longest_forward_run(order):               # right for GPipe and 1F1B: no forward after a backward raises it there
    run = best = 0
    for kind, _ in order:
        run = run + 1 if kind == "F" else 0
        best = max(best, run)
    return best


def highest_micro_in_flight(order):            # assumes micro-batches start and finish in order 0, 1, 2, ...
    peak, done = 0, -1
    for kind, m in order:
        if kind == "F":
            peak = max(peak, m - done)
        else:
            done = m
    return peak


def pops_the_order(order):                    # right number, but empties the caller's list
    live = peak = 0
    while order:
        kind, _ = order.pop(0)
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("wrong, message", [
    (count_forwards, "number of forwards: a backward frees"), (off_by_one_peak, "count \\+1 per F"),
    (lambda order: len(order) // 2, "number of forwards: a backward frees"),
    (forwards_before_first_backward, "forwards before the first backward"),
    (longest_forward_run, "longest run of consecutive forwards"), (highest_micro_in_flight, "should be"),
    (pops_the_order, "changed the list")])
def test_wrong_peak_in_flight_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_peak_in_flight(wrong)


def test_other_peak_in_flight_answers_pass():
    def with_a_set(order):
        live, peak = set(), 0
        for kind, m in order:
            (live.add if kind == "F" else live.remove)(m)
            peak = max(peak, len(live))
        return peak

    def with_cumsum(order):
        return int(torch.tensor([1 if kind == "F" else -1 for kind, _ in order]).cumsum(0).max())
    check_peak_in_flight(with_a_set)
    check_peak_in_flight(with_cumsum)


@st.composite
def stage_orders(draw):
    """Any order of M micro-batches' F and B in which each F comes before its own B."""
    micro = draw(st.permutations([m for m in range(draw(st.integers(1, 10))) for _ in range(2)]))
    seen, order = set(), []
    for m in micro:
        order.append(("B" if m in seen else "F", m))
        seen.add(m)
    return order


@settings(max_examples=50)
@given(stage_orders())
def test_peak_in_flight_solution_counts_the_live_activations(order):
    live, most = set(), 0
    for kind, m in order:
        (live.add if kind == "F" else live.remove)(m)
        most = max(most, len(live))
    assert NS["peak_in_flight"](order) == schedules.peak_in_flight(order) == most


def _chunks(d, world):
    n = d // world
    return [slice(r * n, (r + 1) * n) for r in range(world)]


def bias_on_every_rank(x, w, b, world):
    partials = [x[:, s] @ w[:, s].T + b for s in _chunks(x.shape[-1], world)]
    return partials, sum(partials)


def split_output_features(x, w, b, world):      # column-parallel, not row-parallel
    partials = [x @ w[s].T for s in _chunks(w.shape[0], world)]
    return partials, torch.cat(partials, dim=-1) + b


def interleaved_features(x, w, b, world):       # right sum, but not the contiguous chunk a rank owns
    partials = [x[:, r::world] @ w[:, r::world].T for r in range(world)]
    return partials, sum(partials) + b


def no_all_reduce(x, w, b, world):               # each rank's y is only its own partial
    partials = [x[:, s] @ w[:, s].T for s in _chunks(x.shape[-1], world)]
    return partials, partials[0] + b


def whole_product_per_rank(x, w, b, world):
    return [x @ w.T / world for _ in range(world)], x @ w.T + b


def mean_of_partials(x, w, b, world):            # all-reduce with AVG
    partials = [x[:, s] @ w[:, s].T for s in _chunks(x.shape[-1], world)]
    return partials, torch.stack(partials).mean(0) + b


def bias_in_partials_summed(x, w, b, world):      # each rank adds the bias to its partial before the all-reduce
    partials = [x[:, s] @ w[:, s].T for s in _chunks(x.shape[-1], world)]
    return partials, sum(p + b for p in partials)



def masks_x_in_place(x, w, b, world):           # zeroes the features a rank does not own IN the caller's x
    partials = []
    for s in _chunks(x.shape[-1], world):
        xr = x
        keep = xr[:, s].clone()
        xr.zero_()
        xr[:, s] = keep
        partials.append(xr @ w.T)
    return partials, sum(partials) + b


def float32_always(x, w, b, world):               # right values, but float64 inputs come back as float32
    partials = [x[:, s].float() @ w[:, s].float().T for s in _chunks(x.shape[-1], world)]
    return partials, sum(partials) + b.float()


def bias_split_in_place(x, w, b, world):         # each rank adds b / N: right y, but the caller's bias is divided
    b /= world
    partials = [x[:, s] @ w[:, s].T for s in _chunks(x.shape[-1], world)]
    return partials, sum(p + b for p in partials)


def one_partial_bias_then_rest(x, w, b, world):   # only rank 0's partial carries the bias
    partials = [x[:, s] @ w[:, s].T for s in _chunks(x.shape[-1], world)]
    partials[0] = partials[0] + b
    return partials, sum(partials)


@pytest.mark.parametrize("wrong, message", [
    (bias_on_every_rank, "bias was added on every rank"), (bias_in_partials_summed, "bias was added on every rank"),
    (mean_of_partials, "SUM"), (split_output_features, "OUTPUT features"), (interleaved_features, "does not own"),
    (no_all_reduce, "rank 0's partial plus the bias"), (whole_product_per_rank, "does not own"),
    (masks_x_in_place, "changed x in place"), (float32_always, "keep their dtype"),
    (bias_split_in_place, "changed bias in place"), (one_partial_bias_then_rest, "sum of the partials")])
def test_wrong_row_parallel_linear_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_row_parallel_linear(wrong)


def test_equivalent_row_parallel_linear_passes():
    def with_chunk_and_einsum(x, w, b, world):   # torch.chunk views and einsum: the same partials
        partials = [torch.einsum("bi,oi->bo", xs, ws) for xs, ws in zip(x.chunk(world, -1), w.chunk(world, -1))]
        return partials, torch.stack(partials).sum(0) + b
    check_row_parallel_linear(with_chunk_and_einsum)

    def with_f_linear(x, w, b, world):             # F.linear on the owned slices; the bias on the sum
        partials = [F.linear(xs, ws) for xs, ws in zip(x.tensor_split(world, -1), w.tensor_split(world, -1))]
        return torch.stack(partials), F.linear(x, w, b)
    check_row_parallel_linear(with_f_linear)


@settings(max_examples=25)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(1, 6), st.integers(1, 6),
       st.sampled_from([torch.float32, torch.float64]))
def test_row_parallel_solution_matches_f_linear(batch, per_rank, d_out, world, dtype):
    g = torch.Generator().manual_seed(batch + 7 * world)
    x, w, b = (torch.randn(shape, generator=g, dtype=dtype) for shape in
               ((batch, per_rank * world), (d_out, per_rank * world), (d_out,)))
    partials, y = NS["row_parallel_linear"](x, w, b, world)
    assert len(partials) == world and all(p.shape == (batch, d_out) and p.dtype == dtype for p in partials)
    assert y.dtype == dtype and torch.allclose(y, F.linear(x, w, b), atol=1e-5)
