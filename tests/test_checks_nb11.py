"""The checks of exercise notebook 11 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch

from course_lib.checks.nb11 import check_fp16_flush_and_overflow, check_scale_schedule, check_unscale_and_check
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "11_mixed_precision_exercises.ipynb")
TINY, MAX = 2.0**-24, 65504.0


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_unscale_and_check(NS["unscale_and_check"])
    check_scale_schedule(NS["scale_schedule"])
    check_fp16_flush_and_overflow(NS["fp16_flush_and_overflow"])


def test_stubs_fail():
    for check in (check_unscale_and_check, check_scale_schedule, check_fp16_flush_and_overflow):
        with pytest.raises(NotImplementedError):
            check(stub)


def any_nonfinite(ts, test=lambda t: ~torch.isfinite(t)):
    return any(bool(test(t).any()) for t in ts)


@pytest.mark.parametrize("wrong", [
    lambda grads, s: (grads, any_nonfinite(grads)),                                   # not unscaled
    lambda grads, s: ([g * s for g in grads], any_nonfinite(grads)),                  # scaled twice
    lambda grads, s: ([g / s for g in grads], any_nonfinite(grads, torch.isinf)),     # misses nan
    lambda grads, s: ([g / s for g in grads], any_nonfinite(grads[:1])),              # first tensor only
    lambda grads, s: ([g / s for g in grads], any_nonfinite(grads[-1:])),             # last tensor only
    lambda grads, s: ([g / s for g in grads], torch.tensor(any_nonfinite(grads))),    # a tensor, not a bool
    lambda grads, s: ([g / s for g in grads], not any_nonfinite(grads)),              # inverted
])
def test_wrong_unscale_and_check_fails(wrong):
    with pytest.raises(AssertionError):
        check_unscale_and_check(wrong)


def schedule(found_infs, init_scale, growth_factor, backoff_factor, growth_interval, *, skip=True,
             reset_on_inf=True, grow_every_step=False, interval_offset=0, record_after=False, count_infs=False):
    """scale_schedule with one mistake switched on."""
    scale, good, scales, skipped = float(init_scale), 0, [], []
    for inf in found_infs:
        if not record_after:
            scales.append(scale)
        skipped.append(bool(inf) and skip)
        if inf:
            scale *= backoff_factor
            good = 0 if reset_on_inf else good + count_infs
        else:
            good += 1
            if grow_every_step or good == growth_interval + interval_offset:
                scale, good = scale * growth_factor, 0
        if record_after:
            scales.append(scale)
    return scales, skipped


@pytest.mark.parametrize("mistake", [dict(skip=False), dict(reset_on_inf=False), dict(grow_every_step=True),
                                     dict(interval_offset=1), dict(interval_offset=-1), dict(record_after=True),
                                     dict(reset_on_inf=False, count_infs=True)])
def test_wrong_scale_schedule_fails(mistake):
    assert check_scale_schedule(lambda *a: schedule(*a)) is None          # the harness itself is right
    with pytest.raises(AssertionError):
        check_scale_schedule(lambda *a: schedule(*a, **mistake))


def counts(grads, scale, flush_below=TINY / 2, inclusive=True, overflow_from=65520.0, use_scale=True,
           count_zeros=False):
    """fp16_flush_and_overflow with one mistake switched on."""
    flushed = overflowed = 0
    for g in grads:
        x = (g * (scale if use_scale else 1.0)).abs()
        small = (x <= flush_below) if inclusive else (x < flush_below)
        flushed += int((small & ((x > 0) | count_zeros)).sum())
        overflowed += int((torch.isfinite(g) & (x >= overflow_from)).sum())
    return flushed, overflowed


@pytest.mark.parametrize("mistake", [
    dict(flush_below=TINY, inclusive=False),            # no rounding: everything below 2^-24 lost
    dict(flush_below=2.0**-14, inclusive=False),        # subnormals counted as lost (smallest normal)
    dict(inclusive=False),                              # the tie at 2^-25 rounds to even: 0
    dict(use_scale=False),                              # forgot the scale
    dict(count_zeros=True),                             # zeros were never gradients that flushed
    dict(overflow_from=MAX + 1e-3),                     # 65504 < x < 65520 rounds down, not to inf
    dict(overflow_from=65536.0),                        # 65520 is already inf
])
def test_wrong_fp16_flush_and_overflow_fails(mistake):
    assert check_fp16_flush_and_overflow(counts) is None
    with pytest.raises(AssertionError):
        check_fp16_flush_and_overflow(lambda g, s: counts(g, s, **mistake))
