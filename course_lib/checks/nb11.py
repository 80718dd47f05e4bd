"""Checks for solutions/11_mixed_precision_exercises.ipynb: unscaling, dynamic loss scaling, fp16's range,
the MX block scale.

Compared against torch's own kernels: the unscale + inf check that GradScaler runs
(torch._amp_foreach_non_finite_check_and_unscale_), torch.amp.GradScaler itself on CPU, and
the fp16 cast (`.to(torch.float16)`); the MX exponent against course_lib.mx, which tests/test_mx.py
checks against torchao's MX reference and an independent per-block one. Each exercise's inputs include
the edges its text allows (inf/nan and finite values whose sum overflows, fp16's rounding thresholds, amaxes
just below a power of two, tiny blocks); the answers must not call the library they are compared with.
"""
from __future__ import annotations

import math

import torch

from ..precision import grad_scaler_schedule
from . import answer_source, code_tokens, expect, expect_close, library_call, passed


def _fp16_cast(source: str) -> str:
    """How the code turns a tensor into fp16, or "": `.half(`, or torch.float16 / torch.half anywhere but inside
    float_format(...) or torch.finfo(...), which only read the format's numbers."""
    tokens, calls = code_tokens(source), []
    for i, t in enumerate(tokens):
        if t == "(":
            calls.append(tokens[i - 1] if i else "")
        elif t == ")" and calls:
            calls.pop()
        elif t in ("float16", "half") and i and tokens[i - 1] == ".":
            if tokens[i + 1:i + 2] == ["("]:
                return ".half()"
            if not calls or calls[-1] not in ("float_format", "finfo"):
                return f"torch.{t}" + (f" in {calls[-1]}(...)" if calls and calls[-1] else "")
    return ""


def _unscale_probes():
    """(key, what the gradients hold, grads, scale): each probe separates one way of testing for overflow."""
    g = torch.Generator().manual_seed(11)
    finite = [torch.randn(4, 3, generator=g) * 1024, torch.randn(5, generator=g) * 1024, torch.tensor(-3.0)]

    def with_value(i, index, value):
        out = [t.clone() for t in finite]
        out[i][index] = value
        return out

    return [
        ("finite", "only finite values", finite, 1024.0),
        ("finite", "only finite values", finite, 3.0),
        ("inf", "an inf in the middle tensor", with_value(1, 2, math.inf), 1024.0),
        ("inf first", "an inf in the first tensor", with_value(0, (0, 0), math.inf), 16.0),
        ("nan first", "a nan in the first tensor", with_value(0, (1, 1), math.nan), 256.0),
        ("-inf first", "a -inf (and nothing else non-finite) in the first tensor", with_value(0, (0, 2), -math.inf),
         8.0),
        ("nan last", "a nan (and nothing else non-finite) in the last tensor, a 0-d one", with_value(2, (), math.nan),
         2.0),
        ("inf last", "an inf (and nothing else non-finite) in the last tensor, a 0-d one", with_value(2, (), math.inf),
         2.0),
        ("inf-inf", "+inf and -inf in one tensor (their sum is nan)",
         [torch.ones(2), torch.tensor([math.inf, -math.inf, 1.0])], 4.0),
        ("sum overflows", "only finite values, whose sum overflows float32 to inf",
         [torch.ones(3), torch.tensor([3e38, 3e38, -1.0])], 2.0),
        ("sum finite", "only finite values (their sum stays finite)",
         [torch.ones(3), torch.tensor([1.5e38, 1.5e38, -1.0])], 2.0),
    ]


def _found_inf_why(found: dict) -> str:
    """What the answer's flags on all the probes show about how it tests (found: probe key -> its found_inf)."""
    where = {"first": found["inf first"], "middle": found["inf"], "last": found["inf last"]}
    if any(where.values()) and not all(where.values()):
        seen, missed = ([k for k, v in where.items() if v == flag] for flag in (True, False))
        return (f"it finds an inf in the {' and '.join(seen)} tensor but not in the {' and '.join(missed)}: every "
                "tensor of the list must be checked")
    if found["inf"] and not found["inf-inf"]:
        return ("it finds a lone inf but not +inf next to -inf: testing the sum with isinf misses them (inf - inf is "
                "nan). Test every element: torch.isfinite(g).all()")
    if found["sum overflows"] and not found["sum finite"]:
        return ("it reports an overflow exactly when the finite values' SUM overflows: every value here is finite. "
                "Test every element (torch.isfinite(g).all()), not a sum or a norm")
    if found["sum overflows"] or found["sum finite"]:
        return ("it reports an overflow for gradients whose values are all finite (up to 3e38): test every element "
                "for inf and nan (torch.isfinite(g).all()); a sum, a norm or a square of such values overflows")
    if found["inf"] and not (found["nan first"] and found["nan last"]):
        return "it finds inf but not nan: torch.isinf is False for nan; torch.isfinite is False for both"
    if found["inf"] and not found["-inf first"]:
        return "it finds +inf but not -inf: compare the magnitude, or use torch.isfinite (False for both signs and nan)"
    return "torch.isfinite is False for inf, -inf and nan; check every element of every tensor"


UNSCALE_LIBRARY = ("_amp_foreach_non_finite_check_and_unscale_", "GradScaler", "unscale_")


def check_unscale_and_check(unscale_and_check) -> None:
    """`unscale_and_check(grads, scale) -> (unscaled grads, found_inf)` equals GradScaler's kernel."""
    used = library_call(unscale_and_check, UNSCALE_LIBRARY)
    expect(not used, f"unscale_and_check uses {used}: that is GradScaler's own unscaling, the whole exercise. "
           "Divide and test with ordinary tensor operations (torch.isfinite); the check compares with GradScaler.")
    found_infs, wrong = {}, None
    for key, what, grads, scale in _unscale_probes():
        expected = [t.clone() for t in grads]
        found = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(expected, found, torch.full((1,), 1.0 / scale))
        want = bool(found.item())
        out, found_inf = unscale_and_check([t.clone() for t in grads], scale)
        expect(isinstance(found_inf, bool), f"found_inf must be a bool; got {type(found_inf).__name__}")
        expect(len(out) == len(grads), f"expected {len(grads)} unscaled tensors, got {len(out)}")
        found_infs[key] = found_inf
        if found_inf != want:
            wrong = wrong or (what, found_inf)
        if want:
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
    if wrong:
        what, flag = wrong
        raise AssertionError(f"found_inf is {flag} for gradients holding {what}; GradScaler says {not flag}: "
                             f"{_found_inf_why(found_infs)}.")
    passed("unscale_and_check")


SCHEDULE_CASES = [
    ([False] * 7, dict(init_scale=2.0**16, growth_interval=3)),
    ([False, False, True, False, False, False, False], dict(init_scale=2.0**16, growth_interval=3)),
    ([True, True, False, True, False, False, False, False, False], dict(init_scale=1024.0, growth_interval=2)),
    ([False, True, False, False, True, False, False, False],
     dict(init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2)),
    ([False] * 4, dict(init_scale=1.0, growth_interval=1)),
    ([True] * 5, dict(init_scale=2.0**16, growth_interval=2)),
    ([], dict(init_scale=2.0**16, growth_interval=3)),
    ([True, False, True, False, False, True, False, False, False], dict(init_scale=3.0, growth_factor=3.0,
                                                                          backoff_factor=0.75, growth_interval=1)),
]
SCHEDULE_LIBRARY = ("GradScaler", "grad_scaler_schedule", "next_scale", "_amp_update_scale_", "LossScaler")


def check_scale_schedule(scale_schedule) -> None:
    """`scale_schedule(found_infs, init_scale, growth_factor, backoff_factor, growth_interval)
    -> (scales, skipped)` equals torch.amp.GradScaler on the same overflow pattern."""
    used = library_call(scale_schedule, SCHEDULE_LIBRARY, methods=("scale_schedule",))
    expect(not used, f"scale_schedule uses {used}: that runs GradScaler's own rule, the whole exercise. Write the "
           "loop yourself; the check compares with GradScaler.")
    for flags, kw in SCHEDULE_CASES:
        full = {"growth_factor": 2.0, "backoff_factor": 0.5, **kw}
        want_scales, want_skipped = grad_scaler_schedule(flags, **full)
        given = list(flags)
        got = scale_schedule(given, full["init_scale"], full["growth_factor"], full["backoff_factor"],
                             full["growth_interval"])
        expect(given == flags, f"scale_schedule changed the list of flags it was given ({[int(f) for f in flags]} "
               f"became {[int(f) for f in given]}): read it, do not pop or modify it.")
        expect(isinstance(got, tuple) and len(got) == 2, "return a tuple (scales, skipped)")
        scales, skipped = [float(s) for s in got[0]], [bool(s) for s in got[1]]
        expect(len(scales) == len(skipped) == len(flags), f"expected {len(flags)} scales and skip flags, "
               f"got {len(scales)} and {len(skipped)}: one per step")
        where = f"found_infs={[int(f) for f in flags]}, {kw}"
        expect(skipped == want_skipped, f"{where}: skipped {[int(s) for s in skipped]}, GradScaler skips "
               f"{[int(s) for s in want_skipped]}. A step whose gradients hold inf/nan must be skipped "
               "(the weights would become inf); every other step is taken.")
        expect(scales[:1] == want_scales[:1], f"{where}: the first step must use init_scale, got "
               f"{scales[0] if scales else None}. "
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


TINY = 2.0**-24                                      # fp16's smallest subnormal

# (what g * scale holds, grads, scale, the rule for them): one kind of value each, so a wrong count names its kind.
FORMAT_PROBES = [
    ("zeros (+0 and -0)", [torch.tensor([0.0, -0.0, 0.0])], 1.0,
     "a value that was already 0 was never a non-zero gradient: it does not count"),
    ("values with |x| <= 2^-25", [torch.tensor([0.5 * TINY, -0.5 * TINY, 0.3 * TINY])], 1.0,
     "rounding is to nearest (ties to even): |x| <= 2^-25, half the smallest subnormal 2^-24, becomes 0"),
    ("values just above 2^-25", [torch.tensor([0.51 * TINY, -0.9 * TINY, TINY])], 1.0,
     "just above 2^-25 a value rounds UP to 2^-24: only |x| <= 2^-25 becomes 0, not everything below 2^-24"),
    ("subnormals between 2^-24 and 2^-14", [torch.tensor([1e-6, -2.0**-15, 3 * TINY])], 1.0,
     "fp16 keeps subnormals down to 2^-24: the smallest NORMAL number 2^-14 is not the limit"),
    ("gradients below 2^-25 that the scale 2^10 lifts above it", [torch.tensor([2.0**-30, -2.0**-33])], 2.0**10,
     "the counts are about g * scale: multiply by the scale first"),
    ("gradients above 2^-25 that the scale 2^-10 brings below it", [torch.tensor([2.0**-20, -2.0**-16])], 2.0**-10,
     "the counts are about g * scale: multiply by the scale first"),
    ("values from 65504 to just below 65520", [torch.tensor([65504.0, 65505.0, -65519.0])], 1.0,
     "the step between fp16 numbers at 65504 is 32: below the midpoint 65520 a value rounds DOWN to 65504"),
    ("values from 65520 on", [torch.tensor([65520.0, -70000.0, 1e6])], 1.0,
     "from the midpoint 65520 on a value rounds to inf, 65520 itself included"),
    ("gradients below 65520 that the scale 2^10 lifts above it", [torch.tensor([64.0, -100.0])], 2.0**10,
     "the counts are about g * scale: multiply by the scale first"),
    ("finite gradients whose g * scale overflows float32 itself", [torch.tensor([1e36, -3e37])], 2.0**10,
     "g is finite and g * scale is inf (already in fp32, and so in fp16): it counts as overflowed"),
    ("inf, -inf and nan already in the fp32 gradients", [torch.tensor([math.inf, -math.inf, math.nan]),
                                                        torch.tensor([math.nan])], 1.0,
     "only FINITE gradients that become inf count, not what was inf or nan before the cast; nan never becomes 0"),
]


def _format_cases():
    values = torch.tensor([0.0, 0.3 * TINY, 0.5 * TINY, 0.51 * TINY, 0.9 * TINY, TINY, 1e-6, 2.0**-14, 0.25,
                           -0.4 * TINY, 60000.0, 65504.0, 65510.0, 65519.0, 65520.0, 70000.0, -1e6, math.inf,
                           -math.inf, math.nan, 1e36])
    g = torch.Generator().manual_seed(7)
    grads = [values, torch.randn(200, generator=g) * 10.0 ** torch.empty(200).uniform_(-10, 2, generator=g),
             torch.randn(3, 4, 5, generator=g) * 1e-6, torch.tensor(3e-9)]
    return [(grads, 1.0), (grads, 2.0**10), (grads, 2.0**-4), ([values * 2.0**-20], 2.0**20), (grads, 3.0)]


def _fp16_counts(grads, scale) -> tuple:
    """What the fp16 cast does: (non-zero values that become 0, finite values that become inf)."""
    flushed = sum(int(((g != 0) & ((g * scale).to(torch.float16) == 0)).sum()) for g in grads)
    overflowed = sum(int((torch.isfinite(g) & torch.isinf((g * scale).to(torch.float16))).sum()) for g in grads)
    return flushed, overflowed


def _counts(fp16_flush_and_overflow, grads, scale) -> tuple:
    """The answer's (flushed, overflowed) as ints; its gradients must come back unchanged."""
    given = [g.clone() for g in grads]
    got = fp16_flush_and_overflow(given, scale)
    expect(all(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True) for a, b in zip(given, grads)),
           "fp16_flush_and_overflow changed the gradients it was given (an in-place mul_, abs_, ... on them; "
           "g.float() and g.to(torch.float32) return the SAME tensor when g is already float32, not a copy): "
           "compute on new tensors, g * scale.")
    expect(isinstance(got, tuple) and len(got) == 2, "return a tuple (flushed, overflowed) of ints")
    return int(got[0]), int(got[1])


def check_fp16_flush_and_overflow(fp16_flush_and_overflow) -> None:
    """`fp16_flush_and_overflow(grads, scale) -> (flushed, overflowed)` agrees with the fp16 cast.

    The answer must not cast to fp16 itself (the text asks for the two thresholds); each probe holds one kind of
    value, so a wrong count says which kind was miscounted."""
    cast = _fp16_cast(answer_source(fp16_flush_and_overflow))
    expect(not cast, f"fp16_flush_and_overflow uses {cast}: that is the fp16 cast, which the check compares with. "
           "Work the counts out in fp32 from the two thresholds (2^-25 and 65520).")
    for what, grads, scale, rule in FORMAT_PROBES:
        want = _fp16_counts(grads, scale)
        got = _counts(fp16_flush_and_overflow, grads, scale)
        for i, kind in enumerate(("flushed", "overflowed")):
            expect(got[i] == want[i], f"{kind} is {got[i]} for {what} ({[g.tolist() for g in grads]}, "
                   f"scale={scale}); the fp16 cast gives {want[i]}: {rule}.")
    for grads, scale in _format_cases():
        want, got = _fp16_counts(grads, scale), _counts(fp16_flush_and_overflow, grads, scale)
        expect(got == want, f"scale={scale}: counted (flushed, overflowed) = {got}, the fp16 cast gives {want}, "
               "on a mix of the values above in tensors of several shapes (a 0-d one too).")
    passed("fp16_flush_and_overflow")


def _mx_edges() -> torch.Tensor:
    """One block per row, each with an amax at an edge: the largest float32 below a power of two (where float32
    log2 rounds up to the integer), the power itself, tiny amaxes whose exponent clamps to -127, the largest."""
    amax = torch.tensor([1024 * (1 - 2.0**-24), 1024.0, 2.0**-130, 1e-38, 3e38, 2.0**20 * (1 - 2.0**-24), 0.75, 6.0])
    g = torch.Generator().manual_seed(23)
    block = torch.rand(len(amax), 32, generator=g) * (torch.randint(0, 2, (len(amax), 32), generator=g) * 2 - 1)
    block[:, 7] = 1.0                                                          # amax itself, at one place
    return block * amax[:, None]


def _mx_cases():
    g = torch.Generator().manual_seed(19)
    spread = 10.0 ** torch.empty(8, 3, 1).uniform_(-3, 3, generator=g)     # each block its own magnitude
    rows = (torch.randn(8, 3, 32, generator=g) * spread).reshape(8, 96)
    rows[2, 32:64] = 0                                                      # an all-zero block
    square = torch.randn(64, 64, generator=g) * 10.0 ** torch.arange(-2, 2).repeat_interleave(16).float()
    below = torch.tensor([1020.0, 2.0**12 * (1 - 2.0**-8), 0.5, 3.0])       # just below powers of two in bfloat16
    in_bf16 = (torch.rand(4, 32, generator=g) * below[:, None]).index_fill(1, torch.tensor([3]), 1.0) * below[:, None]
    edges = _mx_edges()
    return [(square, 8), (rows, 8), (rows, 2), (rows[:, :64] * 1e-3, 2), (rows[0], 8), (rows.reshape(2, 4, 96), 2),
            (edges, 8), (edges, 2), (rows.bfloat16(), 2), (in_bf16.bfloat16(), 8), (rows[:4].half(), 8)]


MX_LIBRARY = ("mx_quantize", "to_mx", "MXTensor", "nvfp4_quantize")


def check_mx_scale_exponent(mx_scale_exponent) -> None:
    """`mx_scale_exponent(x, emax) -> [..., K/32]` equals the OCP MX v1.0 shared exponent
    floor(log2(amax of each block of 32 along the last dim)) - emax, clamped to E8M0's -127..127 (course_lib.mx,
    tested against torchao), for float32, bfloat16 and float16 inputs of any leading shape."""
    from ..mx import mx_quantize
    used = library_call(mx_scale_exponent, MX_LIBRARY)
    expect(not used, f"mx_scale_exponent uses {used}: that computes the MX scales, the whole exercise. Compute "
           "the exponent from each block's amax yourself; the check compares with course_lib.mx.")
    for x, emax in _mx_cases():
        elem = "fp8_e4m3" if emax == 8 else "fp4_e2m1"
        want = mx_quantize(x, elem)[0]
        where = f"x of shape {tuple(x.shape)} ({x.dtype}), emax={emax}"
        given = x.clone()
        got = torch.as_tensor(mx_scale_exponent(given, emax)).double()
        expect(torch.equal(given, x), f"{where}: mx_scale_exponent changed x (an in-place abs_, ...): compute the "
               "block maxima on a new tensor, x.abs().")
        if got.shape != want.shape:
            hint = (" Blocks run along the LAST (reduction) dimension: x.reshape(*x.shape[:-1], K // 32, 32)."
                    if got.numel() != 1 else " One value per block, not one for the whole tensor.")
            raise AssertionError(f"{where}: expected exponents of shape {tuple(want.shape)} (one per block of 32 "
                                 f"along the last dim), got {tuple(got.shape)}.{hint}")
        want = want.double()
        if not torch.equal(got, want):
            raise AssertionError(f"{where}: {_mx_mistake(x, emax, got, want, elem)}")
    passed("mx_scale_exponent")


def _mx_mistake(x, emax, got, want, elem) -> str:
    """What the exponents show, compared block by block with MX's."""
    from ..mx import mx_quantize
    if not torch.equal(got, got.round()):
        return ("the exponents are not integers, so the scale 2^e is not a power of two. E8M0 stores only an "
                "exponent: take floor(log2(amax)) - emax, not log2 of amax / 448 (a scale like amax / 448 is "
                "per-tensor FP8's, not MX's).")
    amax = x.abs().float().reshape(*x.shape[:-1], -1, 32).amax(-1).double()
    nonzero = amax > 0
    if not torch.equal(got[~nonzero], want[~nonzero]):
        return (f"an all-zero block must get -127 (the smallest E8M0 exponent; log2(0) is -inf), got "
                f"{got[~nonzero][:3].tolist()}.")
    out = nonzero & ((got < -127) | (got > 127))
    if out.any():
        return (f"a block with amax {amax[out][0].item():.3g} got exponent {got[out][0].item():.0f}: E8M0 holds "
                "-127..127 only, so clamp: blocks of tiny values get -127.")
    if x.dim() == 2 and x.shape[0] == x.shape[1] and torch.equal(got, mx_quantize(x.T.contiguous(), elem)[0].double()):
        return ("these are the exponents of blocks down the columns (dim 0). MX blocks run along the last "
                "dimension, the one a matmul reduces over.")
    g, w = got[nonzero], want[nonzero]
    if (g == g.flatten()[0]).all() and (w != w.flatten()[0]).any():
        return ("every block got the same exponent: that is one scale for the whole tensor. MX computes amax per "
                "block of 32.")
    if torch.equal(g, w + emax):
        return (f"off by exactly emax={emax} everywhere: subtract the element format's emax (8 for E4M3, 2 for E2M1) "
                "so the block's amax lands in the element's top binade.")
    if emax != 8 and torch.equal(g, w + emax - 8):
        return f"use the `emax` argument ({emax} here), not E4M3's 8."
    up, a = g - w, amax[nonzero]
    if ((up == 0) | (up == 1)).all():
        one, top = up == 1, torch.exp2(w + emax + 1)                # top: the power of two above amax
        if bool((top[one] / a[one] <= 1 + 2.0**-7).all()):
            return (f"exponents 1 too large exactly for the blocks whose amax is just below a power of two (e.g. amax "
                    f"= {a[one][0].item():.9g}: floor(log2) = {(w + emax)[one][0].item():.0f}): log2 in float32 (or "
                    "lower) precision rounds it up to the integer. Compute the exponent exactly: torch.frexp(amax), or "
                    "log2 in float64.")
        if torch.equal(one, a != torch.exp2(w + emax)):
            return ("exponents 1 too large for every block whose amax is not a power of two: that is ceil(log2(amax)); "
                    "use floor, so amax / 2^e lies in [2^emax, 2^(emax+1)), the element format's top binade.")
        if torch.equal(one, torch.log2(a) - torch.floor(torch.log2(a)) >= 0.5):
            return ("exponents 1 too large where log2(amax) has a fraction >= 0.5: that is round(log2(amax)); "
                    "use floor, so amax / 2^e lies in [2^emax, 2^(emax+1)), the element format's top binade.")
        return f"some exponents are 1 too large: e.g. amax {a[one][0].item():.9g} needs e = {w[one][0].item():.0f}."
    return (f"exponents differ from floor(log2(amax)) - emax, e.g. got {g[up != 0][:3].tolist()} where MX has "
            f"{w[up != 0][:3].tolist()}.")
