"""The checks of exercise notebook 09 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch

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


@pytest.mark.parametrize("wrong", [
    lambda K, M: (K - 1) / (M + K),          # off by one
    lambda K, M: (K - 1) / M,                # idle over busy, not over the whole step
    lambda K, M: (K - 1) // (M + K - 1),     # integer division
    lambda K, M: K / (M + K - 1),            # forgot that one stage never waits for itself
])
def test_wrong_bubble_fraction_fails(wrong):
    with pytest.raises(AssertionError):
        check_bubble_fraction(wrong)


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


@pytest.mark.parametrize("wrong", [backward_in_forward_stage_order, backward_one_step_early, backward_one_step_late,
                                   forward_without_waiting, f_and_b_of_a_micro_batch_together, one_f_one_b_instead,
                                   missing_last_micro_batch, times_from_one])
def test_wrong_gpipe_schedule_fails(wrong):
    with pytest.raises(AssertionError):
        check_gpipe_schedule(wrong)


def count_forwards(order):
    return sum(kind == "F" for kind, _ in order)


def off_by_one_peak(order):
    live = peak = 0
    for kind, _ in order:
        live += 1 if kind == "F" else -1
        if kind == "B":                      # measured only after a backward has freed its activations
            peak = max(peak, live)
    return peak


def forwards_before_first_backward(order):
    return next(i for i, (kind, _) in enumerate(order) if kind == "B")


@pytest.mark.parametrize("wrong", [count_forwards, off_by_one_peak, lambda order: len(order) // 2])
def test_wrong_peak_in_flight_fails(wrong):
    with pytest.raises(AssertionError):
        check_peak_in_flight(wrong)


def test_forwards_before_first_backward_is_right_here():
    """Not a wrong answer for these orders (F and B of each micro-batch in order), so it must pass."""
    check_peak_in_flight(forwards_before_first_backward)


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



@pytest.mark.parametrize("wrong, message", [
    (bias_on_every_rank, "bias was added on every rank"), (bias_in_partials_summed, "bias was added on every rank"),
    (mean_of_partials, "SUM"), (split_output_features, "partials"), (interleaved_features, "does not own"),
    (no_all_reduce, "y vs F.linear"), (whole_product_per_rank, "does not own")])
def test_wrong_row_parallel_linear_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_row_parallel_linear(wrong)


def test_equivalent_row_parallel_linear_passes():
    def with_chunk_and_einsum(x, w, b, world):   # torch.chunk views and einsum: the same partials
        partials = [torch.einsum("bi,oi->bo", xs, ws) for xs, ws in zip(x.chunk(world, -1), w.chunk(world, -1))]
        return partials, torch.stack(partials).sum(0) + b
    check_row_parallel_linear(with_chunk_and_einsum)
