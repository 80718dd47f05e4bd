"""The checks of exercise notebook 11 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch
from nbtools import ROOT, notebook_namespace

from course_lib.checks.nb11 import (
    check_fp16_flush_and_overflow,
    check_mx_scale_exponent,
    check_scale_schedule,
    check_unscale_and_check,
)

NS = notebook_namespace(ROOT / "solutions" / "11_mixed_precision_exercises.ipynb")
TINY, MAX = 2.0**-24, 65504.0


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_unscale_and_check(NS["unscale_and_check"])
    check_scale_schedule(NS["scale_schedule"])
    check_fp16_flush_and_overflow(NS["fp16_flush_and_overflow"])
    check_mx_scale_exponent(NS["mx_scale_exponent"])


def test_stubs_fail():
    for check in (check_unscale_and_check, check_scale_schedule, check_fp16_flush_and_overflow,
                  check_mx_scale_exponent):
        with pytest.raises(NotImplementedError):
            check(stub)


def any_nonfinite(ts, test=lambda t: ~torch.isfinite(t)):
    return any(bool(test(t).any()) for t in ts)


def unscale_twice(grads, scale):                  # divides in place, then again in the returned list
    for g in grads:
        g.div_(scale)
    return [g / scale for g in grads], any_nonfinite(grads)


@pytest.mark.parametrize("wrong, message", [
    (lambda grads, s: (grads, any_nonfinite(grads)), "still scaled"),                      # not unscaled
    (lambda grads, s: ([g * s for g in grads], any_nonfinite(grads)), "multiplied"),       # scaled again
    (unscale_twice, "twice"),
    (lambda grads, s: ([g / s for g in grads], any_nonfinite(grads, torch.isinf)), "nan"),  # misses nan
    (lambda grads, s: ([g / s for g in grads], any_nonfinite(grads[:1])), "every tensor"),  # first tensor only
    (lambda grads, s: ([g / s for g in grads], any_nonfinite(grads[-1:])), "every tensor"),  # last tensor only
    (lambda grads, s: ([g / s for g in grads], torch.tensor(any_nonfinite(grads))), "bool"),  # a tensor
    (lambda grads, s: ([g / s for g in grads], not any_nonfinite(grads)), "found_inf is"),  # inverted
    (lambda grads, s: ([g / s for g in grads], any(bool((g == float("inf")).any()) for g in grads)), "found_inf is"),
])
def test_wrong_unscale_and_check_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_unscale_and_check(wrong)


def test_equivalent_unscale_and_check_passes():
    def in_place_with_torch_kernel(grads, scale):    # GradScaler's own kernel, in place
        found = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.full((1,), 1.0 / scale))
        return grads, bool(found.item())
    check_unscale_and_check(in_place_with_torch_kernel)


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


@pytest.mark.parametrize("mistake, message", [
    (dict(skip=False), "must be skipped"), (dict(reset_on_inf=False), "must reset the count"),
    (dict(grow_every_step=True), "grew too early"), (dict(interval_offset=1), "should have grown"),
    (dict(interval_offset=-1), "grew too early"), (dict(record_after=True), "init_scale"),
    (dict(reset_on_inf=False, count_infs=True), "should have grown")])
def test_wrong_scale_schedule_fails(mistake, message):
    assert check_scale_schedule(lambda *a: schedule(*a)) is None          # the harness itself is right
    with pytest.raises(AssertionError, match=message):
        check_scale_schedule(lambda *a: schedule(*a, **mistake))


def test_equivalent_scale_schedule_passes():
    def with_grad_scaler(found_infs, init_scale, growth_factor, backoff_factor, growth_interval):
        from course_lib.precision import (
            grad_scaler_schedule,  # torch's GradScaler itself
        )
        return grad_scaler_schedule(found_infs, init_scale=init_scale, growth_factor=growth_factor,
                                    backoff_factor=backoff_factor, growth_interval=growth_interval)

    def counting_down(found_infs, init_scale, growth_factor, backoff_factor, growth_interval):
        scale, left, out = init_scale, growth_interval, ([], [])
        for inf in found_infs:
            out[0].append(scale), out[1].append(inf)
            scale, left = (scale * backoff_factor, growth_interval) if inf else (scale, left - 1)
            if left == 0:
                scale, left = scale * growth_factor, growth_interval
        return out
    check_scale_schedule(with_grad_scaler)
    check_scale_schedule(counting_down)


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


def blockwise(x, emax, *, log=torch.floor, offset=True, dim=-1, per_tensor=False, zero=-127.0):
    """mx_scale_exponent with one mistake switched on."""
    x = x.movedim(dim, -1)
    amax = x.abs().reshape(*x.shape[:-1], x.shape[-1] // 32, 32).amax(-1)
    if per_tensor:
        amax = torch.full_like(amax, float(x.abs().max()))
    e = log(torch.log2(amax)) - (emax if offset else 0)
    return torch.where(amax > 0, e, zero)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, emax: torch.log2(x.abs().reshape(*x.shape[:-1], -1, 32).amax(-1) / 448), "not a power of two"),
    (lambda x, emax: blockwise(x, emax, log=lambda t: t), "not a power of two"),          # no floor at all
    (lambda x, emax: blockwise(x, emax, dim=0), "down the columns"),                      # blocks along dim 0
    (lambda x, emax: blockwise(x.T.contiguous(), emax).T, "shape"),                       # ... returned transposed
    (lambda x, emax: blockwise(x, emax, log=torch.ceil), "not ceil or round"),
    (lambda x, emax: blockwise(x, emax, log=torch.round), "not ceil or round"),
    (lambda x, emax: blockwise(x, emax, offset=False), "subtract the element format's emax"),
    (lambda x, emax: blockwise(x, 8), "use the `emax` argument"),                        # E4M3's 8 hard-coded
    (lambda x, emax: blockwise(x, emax, per_tensor=True), "one scale for the whole tensor"),
    (lambda x, emax: torch.floor(torch.log2(x.abs().max())) - emax, "One value per block"),
    (lambda x, emax: blockwise(x, emax, zero=0.0), "all-zero block"),
])
def test_wrong_mx_scale_exponent_fails(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_mx_scale_exponent(wrong)


def test_equivalent_mx_scale_exponent_passes():
    def with_frexp(x, emax):                        # amax = m * 2^e, m in [0.5, 1): floor(log2(amax)) = e - 1
        _, e = torch.frexp(x.abs().unflatten(-1, (-1, 32)).amax(-1))
        out = (e - 1 - emax).clamp(min=-127)
        return torch.where(x.abs().unflatten(-1, (-1, 32)).amax(-1) == 0, -127, out).to(torch.int32)
    check_mx_scale_exponent(with_frexp)
