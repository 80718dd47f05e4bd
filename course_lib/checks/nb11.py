"""Checks for solutions/11_mixed_precision_exercises.ipynb: unscaling, dynamic loss scaling, fp16's range,
the MX block scale.

Compared against torch's own kernels: the unscale + inf check that GradScaler runs
(torch._amp_foreach_non_finite_check_and_unscale_), torch.amp.GradScaler itself on CPU, and
the fp16 cast (`.to(torch.float16)`); the MX exponent against course_lib.mx, which tests/test_mx.py
checks against torchao's MX reference and an independent per-block one.
"""
from __future__ import annotations

import math

import torch

from ..precision import grad_scaler_schedule
from . import expect, expect_close, passed


def _unscale_cases():
    g = torch.Generator().manual_seed(11)
    finite = [torch.randn(4, 3, generator=g) * 1024, torch.randn(5, generator=g) * 1024]
    with_inf = [finite[0].clone(), finite[1].clone()]
    with_inf[1][2] = math.inf
    with_nan = [finite[0].clone(), finite[1].clone()]
    with_nan[0][1, 1] = math.nan
    only_first = [torch.full((2,), -math.inf), torch.ones(3)]
    return [(finite, 1024.0), (finite, 3.0), (with_inf, 1024.0), (with_nan, 256.0), (only_first, 8.0)]


def check_unscale_and_check(unscale_and_check) -> None:
    """`unscale_and_check(grads, scale) -> (unscaled grads, found_inf)` equals GradScaler's kernel."""
    for grads, scale in _unscale_cases():
        expected = [t.clone() for t in grads]
        found = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(expected, found, torch.full((1,), 1.0 / scale))
        out, found_inf = unscale_and_check([t.clone() for t in grads], scale)
        expect(isinstance(found_inf, bool), f"found_inf must be a bool; got {type(found_inf).__name__}")
        expect(found_inf == bool(found.item()),
               f"scale={scale}: found_inf is {found_inf} but the gradients "
               f"{'do' if found.item() else 'do not'} contain inf or nan. Hint: torch.isfinite is False for "
               "both inf and nan, and every tensor must be checked, not only the first or the last.")
        expect(len(out) == len(grads), f"expected {len(grads)} unscaled tensors, got {len(out)}")
        if found_inf:
            continue                                   # the step is skipped: the values do not matter
        for i, (a, e) in enumerate(zip(out, expected)):
            a, g = torch.as_tensor(a).double(), grads[i].double()
            if torch.allclose(a, g):
                raise AssertionError(f"scale={scale}: gradient {i} is still scaled. Divide by the scale before "
                                     "the optimizer step, or the step is `scale` times too large.")
            if torch.allclose(a, g * scale, rtol=1e-6):
                raise AssertionError(f"scale={scale}: gradient {i} was multiplied by the scale; unscaling DIVIDES "
                                     "by it (the loss was multiplied before backward).")
            if torch.allclose(a, g / scale**2, rtol=1e-6):
                raise AssertionError(f"scale={scale}: gradient {i} was divided by the scale twice (unscaled twice, "
                                     "e.g. in place and again in the return value): divide exactly once.")
            expect_close(a, e, f"scale={scale}: unscaled gradient {i}", atol=0, rtol=1e-6,
                         hint="Hint: unscaled = grad / scale (GradScaler multiplies by 1/scale).")
    passed("unscale_and_check")


SCHEDULE_CASES = [
    ([False] * 7, dict(init_scale=2.0**16, growth_interval=3)),
    ([False, False, True, False, False, False, False], dict(init_scale=2.0**16, growth_interval=3)),
    ([True, True, False, True, False, False, False, False, False], dict(init_scale=1024.0, growth_interval=2)),
    ([False, True, False, False, True, False, False, False],
     dict(init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)),
    ([False] * 4, dict(init_scale=1.0, growth_interval=1)),
]


def check_scale_schedule(scale_schedule) -> None:
    """`scale_schedule(found_infs, init_scale, growth_factor, backoff_factor, growth_interval)
    -> (scales, skipped)` equals torch.amp.GradScaler on the same overflow pattern."""
    for flags, kw in SCHEDULE_CASES:
        full = {"growth_factor": 2.0, "backoff_factor": 0.5, **kw}
        want_scales, want_skipped = grad_scaler_schedule(flags, **full)
        got = scale_schedule(list(flags), full["init_scale"], full["growth_factor"], full["backoff_factor"],
                             full["growth_interval"])
        expect(isinstance(got, tuple) and len(got) == 2, "return a tuple (scales, skipped)")
        scales, skipped = [float(s) for s in got[0]], [bool(s) for s in got[1]]
        expect(len(scales) == len(skipped) == len(flags), f"expected {len(flags)} scales and skip flags, "
               f"got {len(scales)} and {len(skipped)}: one per step")
        where = f"found_infs={[int(f) for f in flags]}, {kw}"
        expect(skipped == want_skipped, f"{where}: skipped {[int(s) for s in skipped]}, GradScaler skips "
               f"{[int(s) for s in want_skipped]}. A step whose gradients hold inf/nan must be skipped "
               "(the weights would become inf); every other step is taken.")
        expect(scales[0] == want_scales[0], f"{where}: the first step must use init_scale, got {scales[0]}. "
               "Hint: record the scale a step *uses*, then update it.")
        if scales != want_scales:
            first = next(i for i, (a, b) in enumerate(zip(scales, want_scales)) if a != b)
            good, since_inf = 0, False          # good steps in a row before step `first`, by GradScaler's rule
            for inf in flags[:first]:
                good = 0 if inf else (0 if good + 1 == full["growth_interval"] else good + 1)
                since_inf = bool(inf) or (since_inf and good > 0)
            prev = want_scales[first - 1] if first else full["init_scale"]
            if flags[first - 1] if first else False:
                why = (f"step {first - 1} overflowed: the scale must become {prev} x backoff_factor = "
                       f"{prev * full['backoff_factor']} and the count of good steps restart from 0.")
            elif scales[first] > want_scales[first]:
                why = (f"the scale grew too early: {good + 1} good step(s) in a row (counting since the last inf "
                       f"or growth){' - an inf step must reset the count' if since_inf else ''}; GradScaler grows "
                       f"after growth_interval={full['growth_interval']}.")
            else:
                why = (f"the scale should have grown after growth_interval={full['growth_interval']} good steps in "
                       "a row (count from 0 after each inf and each growth, grow when the count reaches the "
                       "interval).")
            raise AssertionError(f"{where}: scales {scales}, GradScaler uses {want_scales}; first difference at "
                                 f"step {first}: {why}")
    passed("scale_schedule")


def _format_cases():
    tiny = 2.0**-24                                  # fp16's smallest subnormal
    values = torch.tensor([0.0, 0.3 * tiny, 0.5 * tiny, 0.51 * tiny, 0.9 * tiny, tiny, 1e-6, 2.0**-14, 0.25,
                           -0.4 * tiny, 60000.0, 65504.0, 65510.0, 65519.0, 65520.0, 70000.0, -1e6])
    g = torch.Generator().manual_seed(7)
    grads = [values, torch.randn(200, generator=g) * 10.0 ** torch.empty(200).uniform_(-10, 2, generator=g)]
    return [(grads, 1.0), (grads, 2.0**10), (grads, 2.0**-4), ([values * 2.0**-20], 2.0**20)]


def check_fp16_flush_and_overflow(fp16_flush_and_overflow) -> None:
    """`fp16_flush_and_overflow(grads, scale) -> (flushed, overflowed)` agrees with the fp16 cast."""
    for grads, scale in _format_cases():
        flushed = sum(int(((g != 0) & ((g * scale).to(torch.float16) == 0)).sum()) for g in grads)
        overflowed = sum(int((torch.isfinite(g) & torch.isinf((g * scale).to(torch.float16))).sum()) for g in grads)
        got = fp16_flush_and_overflow([g.clone() for g in grads], scale)
        expect(isinstance(got, tuple) and len(got) == 2, "return a tuple (flushed, overflowed) of ints")
        got_flushed, got_over = int(got[0]), int(got[1])
        expect(got_flushed == flushed,
               f"scale={scale}: counted {got_flushed} values that flush to zero, the fp16 cast flushes {flushed}. "
               "Hints: multiply by the scale first; zeros that were already zero do not count; fp16 keeps "
               "subnormals down to 2^-24, and rounds to nearest: |x| <= 2^-25 becomes 0, just above rounds up.")
        expect(got_over == overflowed,
               f"scale={scale}: counted {got_over} values that overflow, the fp16 cast makes {overflowed} inf. "
               "Hint: fp16's largest number is 65504, but a value rounds to it up to 65520 (half a step of 32 "
               "above); from 65520 on it becomes inf.")
    passed("fp16_flush_and_overflow")


def _mx_cases():
    g = torch.Generator().manual_seed(19)
    spread = 10.0 ** torch.empty(8, 3, 1).uniform_(-3, 3, generator=g)     # each block its own magnitude
    rows = (torch.randn(8, 3, 32, generator=g) * spread).reshape(8, 96)
    rows[2, 32:64] = 0                                                      # an all-zero block
    square = torch.randn(64, 64, generator=g) * 10.0 ** torch.arange(-2, 2).repeat_interleave(16).float()
    return [(square, 8), (rows, 8), (rows, 2), (rows[:, :64] * 1e-3, 2)]


def check_mx_scale_exponent(mx_scale_exponent) -> None:
    """`mx_scale_exponent(x, emax) -> [..., K/32]` equals the OCP MX v1.0 shared exponent
    floor(log2(amax of each block of 32 along the last dim)) - emax (course_lib.mx, tested against torchao)."""
    from ..mx import mx_quantize
    for x, emax in _mx_cases():
        elem = "fp8_e4m3" if emax == 8 else "fp4_e2m1"
        want = mx_quantize(x, elem)[0]
        where = f"x of shape {tuple(x.shape)}, emax={emax}"
        got = torch.as_tensor(mx_scale_exponent(x.clone(), emax)).double()
        if got.shape != want.shape:
            hint = (" Blocks run along the LAST (reduction) dimension: x.reshape(*x.shape[:-1], K // 32, 32)."
                    if got.numel() != 1 else " One value per block, not one for the whole tensor.")
            raise AssertionError(f"{where}: expected exponents of shape {tuple(want.shape)} (one per block of 32 "
                                 f"along the last dim), got {tuple(got.shape)}.{hint}")
        want = want.double()
        if torch.equal(got, want):
            continue
        if not torch.equal(got, got.round()):
            raise AssertionError(f"{where}: the exponents are not integers, so the scale 2^e is not a power of "
                                 "two. E8M0 stores only an exponent: take floor(log2(amax)) - emax, not log2 of "
                                 "amax / 448 (a scale like amax / 448 is per-tensor FP8's, not MX's).")
        amax = x.abs().reshape(*x.shape[:-1], -1, 32).amax(-1).double()
        nonzero = amax > 0
        if x.shape[0] == x.shape[1] and torch.equal(got, mx_quantize(x.T.contiguous(), elem)[0].double()):
            raise AssertionError(f"{where}: these are the exponents of blocks down the columns (dim 0). "
                                 "MX blocks run along the last dimension, the one a matmul reduces over.")
        if (got[nonzero] == got[nonzero].flatten()[0]).all() and (want[nonzero] != want[nonzero].flatten()[0]).any():
            raise AssertionError(f"{where}: every block got the same exponent: that is one scale for the whole "
                                 "tensor. MX computes amax per block of 32.")
        if torch.equal(got[nonzero], want[nonzero] + emax):
            raise AssertionError(f"{where}: off by exactly emax={emax} everywhere: subtract the element format's "
                                 "emax (8 for E4M3, 2 for E2M1) so the block's amax lands in the element's top binade.")
        if emax != 8 and torch.equal(got[nonzero], want[nonzero] + emax - 8):
            raise AssertionError(f"{where}: use the `emax` argument ({emax} here), not E4M3's 8.")
        if not torch.equal(got[nonzero], want[nonzero]):
            up = got[nonzero] - want[nonzero]
            if ((up == 0) | (up == 1)).all():
                raise AssertionError(f"{where}: some exponents are 1 too large: use floor(log2(amax)), not ceil or "
                                     "round. With floor the block's amax divided by 2^e lies in [2^emax, 2^(emax+1)): "
                                     "the element format's top binade (values above its max saturate).")
            raise AssertionError(f"{where}: exponents differ from floor(log2(amax)) - emax, e.g. got "
                                 f"{got[nonzero][up != 0][:3].tolist()} where MX has "
                                 f"{want[nonzero][up != 0][:3].tolist()}.")
        raise AssertionError(f"{where}: an all-zero block must get -127 (the smallest E8M0 exponent; log2(0) is "
                             f"-inf), got {got[~nonzero][:3].tolist()}.")
    passed("mx_scale_exponent")
