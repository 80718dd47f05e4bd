"""Checks for the exercises of lecture 02 (hardware and numbers).

References are PyTorch's own: torch.fake_quantize_per_tensor_affine (the quantize ->
dequantize round trip that quantization-aware training uses; torch.quantize_per_tensor is
deprecated), torch.finfo, and course_lib.systolic.feed.

A wrong answer is named by what it did: each check runs the answer on every case first, then
looks for the one mistake that explains all of its results (a rule that matches one case by
chance would name the wrong mistake).
"""
from __future__ import annotations

import math

import torch

from . import answer_source, call_answer, calls_method, expect, expect_close, passed, torch_quantized

INF = math.inf

# The built-ins that do the quantization exercise in one call (the check compares with them).
QUANTIZE_BUILTINS = ("quantize_per_tensor", "quantize_per_channel", "fake_quantize_per_tensor_affine",
                     "fake_quantize_per_channel_affine", "int_repr", "dequantize")


def _refuse_calls(fn, names, why: str) -> None:
    source = answer_source(fn)
    for name in names:
        expect(not calls_method(source, name), f"{getattr(fn, '__name__', 'your answer')} calls {name}: {why}")


def _quantize_cases():
    """(what, x, scale, zero_point): every shape and edge the text allows, float32 as the text says."""
    gen = torch.Generator().manual_seed(2)
    ties = torch.tensor([0.25, 0.75, 1.25, -0.25, -0.75, 2.25, -1.25])
    return [
        ("values in range, zero_point=0", torch.randn(200, generator=gen) * 1.5, 0.05, 0),
        ("a [4, 5, 10] tensor, zero_point=-20", torch.randn(4, 5, 10, generator=gen) * 1.5, 0.05, -20),
        ("values beyond the int8 range", torch.tensor([10.0, -10.0, 100.0, -7.0, 6.4, 6.3, INF, -INF, 1e30, -1e30]),
         0.05, 3),
        ("exact ties (x / scale = k + 0.5)", ties, 0.5, 0),
        ("exact ties with an odd zero_point", ties.clone(), 0.5, 3),
        ("zeros and tiny values", torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-45, 0.01, -0.01, 0.0]), 0.05, -7),
        ("a 0-d tensor", torch.tensor(0.37), 0.1, 5),
        ("a transposed (non-contiguous) [5, 6] tensor", torch.randn(6, 5, generator=gen).t(), 0.02, 1),
        ("an empty [0, 3] tensor", torch.empty(0, 3), 0.1, 0),
    ]


def _in_range(codes: torch.Tensor) -> torch.Tensor:
    return codes.clamp(-128, 127).to(torch.int64)


# Mistakes that predict every code: (what the answer did, its codes from x, scale, zero_point).
QUANTIZE_MISTAKES = (
    ("rounds towards zero (torch.trunc, int(), or converting before rounding): round to the NEAREST integer "
     "with torch.round (1.6 -> 2, -1.6 -> -2)", lambda x, s, z: _in_range(torch.trunc(x / s) + z)),
    ("rounds down (floor): round to the NEAREST integer with torch.round (1.6 -> 2, -1.4 -> -1)",
     lambda x, s, z: _in_range(torch.floor(x / s) + z)),
    ("subtracts the zero point: it is ADDED after rounding, q = round(x / scale) + zero_point, so x = 0 maps to "
     "q = zero_point", lambda x, s, z: _in_range(torch.round(x / s) - z)),
    ("leaves out the zero point: it is ADDED after rounding, q = round(x / scale) + zero_point, so x = 0 maps to "
     "q = zero_point", lambda x, s, z: _in_range(torch.round(x / s))),
    ("multiplies by the scale: divide, q = round(x / scale) + zero_point",
     lambda x, s, z: _in_range(torch.round(x * s) + z)),
    ("adds the zero point before rounding: round x / scale FIRST, then add the zero point (with an odd zero "
     "point a tie goes elsewhere: round(0.5) + 3 = 3, but round(0.5 + 3) = 4)",
     lambda x, s, z: _in_range(torch.round(x / s + z))),
    ("clamps to [-127, 127]: codes saturate at -128 and 127, the whole int8 range",
     lambda x, s, z: torch.round(x / s).add(z).clamp(-127, 127).to(torch.int64)),
)


def _is_tie(x, s):
    v = x / s
    return (v - torch.floor(v)) == 0.5


def _unclamped_fits(x, s, z):
    v = torch.round(x / s) + z
    return (v >= -128) & (v <= 127)


# Mistakes seen only on some values: (what the answer did, where it still agrees with PyTorch).
QUANTIZE_MISSES = (
    ("rounds a tie away from the even integer: ties go to the EVEN integer (torch.round does this; floor(v + 0.5) "
     "and Python 2's round do not): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0", lambda x, s, z: ~_is_tie(x, s)),
    ("does not saturate: codes beyond the int8 range must saturate at -128 and 127; clamp BEFORE converting to "
     "an integer type (converting 200 or inf first wraps around or overflows)", _unclamped_fits),
)


def _quantize_mistake(runs) -> str:
    """What the answer did, if one known mistake explains its codes on every case; else the rule."""
    for what, codes in QUANTIZE_MISTAKES:
        if all(torch.equal(q.to(torch.int64), codes(x, s, z)) for _, x, s, z, q, _ in runs):
            return f"Your answer {what}."
    for what, agrees in QUANTIZE_MISSES:
        if all(torch.equal(q.to(torch.int64)[agrees(x, s, z)], ref[agrees(x, s, z)]) for _, x, s, z, q, ref in runs):
            return f"Your answer {what}."
    return "Hint: q = clamp(round(x / scale) + zero_point, -128, 127), ties rounded to the even integer."


def _quantized(quantize_int8, case, x, scale, zp) -> torch.Tensor:
    given = x.clone()
    q = call_answer(quantize_int8, x, scale, zp, what=f"quantize_int8 on {case}")
    expect(torch.equal(x, given), f"quantize_int8 changed its input x ({case}): compute the codes in a new tensor "
           "(x / scale makes one); x.div_(...) or x[...] = ... overwrite the caller's data.")
    expect(isinstance(q, torch.Tensor), f"{case}: quantize_int8 must return a tensor; got {type(q).__name__}")
    expect(q.shape == x.shape, f"{case}: expected shape {tuple(x.shape)}, got {tuple(q.shape)}")
    expect(q.dtype == torch.int8,
           f"{case}: expected dtype torch.int8, got {q.dtype}. Convert at the end with .to(torch.int8).")
    return q


# Dequantize mistakes that predict every value: (what the answer did, x from q, scale, zero_point).
DEQUANTIZE_MISTAKES = (
    ("adds the zero point: SUBTRACT it, x = (q - zero_point) * scale (the inverse of quantize)",
     lambda q, s, z: (q.float() + z) * s),
    ("leaves out the zero point: SUBTRACT it, x = (q - zero_point) * scale (the inverse of quantize)",
     lambda q, s, z: q.float() * s),
    ("divides by the scale: multiply, x = (q - zero_point) * scale", lambda q, s, z: (q.float() - z) / s),
)


def _dequantize_mistake(runs) -> str:
    for what, values in DEQUANTIZE_MISTAKES:
        if all(torch.allclose(back.double(), values(q, s, z).double(), atol=1e-6) for q, s, z, back, _ in runs):
            return f"Your answer {what}."
    # int8 arithmetic: right wherever q - zero_point fits in int8, wrapped around elsewhere
    fits = [((q.int() - z >= -128) & (q.int() - z <= 127), back, ref) for q, s, z, back, ref in runs]
    if all(torch.allclose(back[f].double(), ref[f].double(), atol=1e-6) for f, back, ref in fits):
        return ("Your answer computed q - zero_point in int8, which wraps around (-128 - 3 is 125 in int8): convert "
                "q to float32 BEFORE subtracting.")
    return "Hint: x = (q - zero_point) * scale, computed in float32."


def check_quantize_int8(quantize_int8, dequantize_int8) -> None:
    """quantize_int8(x, scale, zero_point) -> int8 codes; dequantize_int8(q, scale, zero_point) -> float32."""
    why = "the exercise asks for the arithmetic itself (round, add, clamp, convert); that built-in is what the " \
          "check compares with."
    _refuse_calls(quantize_int8, QUANTIZE_BUILTINS, why)
    _refuse_calls(dequantize_int8, QUANTIZE_BUILTINS, why)
    runs = []
    for case, x, scale, zp in _quantize_cases():
        ref_q, _ = torch_quantized(x, scale, zp, -128, 127)
        runs.append((case, x, scale, zp, _quantized(quantize_int8, case, x, scale, zp), ref_q))
    for case, x, scale, zp, q, ref_q in runs:
        wrong = (q.to(torch.int64) != ref_q).reshape(-1)
        if wrong.any():
            i = int(wrong.nonzero()[0])
            value, want, got = x.reshape(-1)[i].item(), ref_q.reshape(-1)[i].item(), q.reshape(-1)[i].item()
            raise AssertionError(f"quantize_int8, {case} (scale={scale}, zero_point={zp}): x={value:.4g} should give "
                                 f"{want}, got {got}. {_quantize_mistake(runs)}")
    backs = []
    for case, x, scale, zp, _, ref_q in runs:
        q, (_, ref_x) = ref_q.to(torch.int8), torch_quantized(x, scale, zp, -128, 127)
        given = q.clone()
        back = call_answer(dequantize_int8, q, scale, zp, what=f"dequantize_int8 on {case}")
        expect(torch.equal(q, given), f"dequantize_int8 changed its input q ({case}): compute x in a new tensor "
               "(q.to(torch.float32) makes one); q.sub_(...) overwrites the caller's codes.")
        expect(isinstance(back, torch.Tensor) and back.dtype == torch.float32,
               f"dequantize_int8, {case}: must return a float32 tensor; got {getattr(back, 'dtype', type(back))}. "
               "Convert q with q.to(torch.float32) and compute in float32.")
        expect(back.shape == q.shape,
               f"dequantize_int8, {case}: expected shape {tuple(q.shape)}, got {tuple(back.shape)}")
        backs.append((case, q, scale, zp, back, ref_x))
    for case, q, scale, zp, back, ref_x in backs:
        if not torch.allclose(back.double(), ref_x.double(), atol=1e-6):
            expect_close(back, ref_x, f"dequantize_int8, {case} (scale={scale}, zero_point={zp})", atol=1e-6,
                         hint=_dequantize_mistake([run[1:] for run in backs]))
    passed("quantize_int8 / dequantize_int8")


FINFO_CASES = (("FP32", 8, 23, torch.float32), ("FP16", 5, 10, torch.float16), ("BF16", 8, 7, torch.bfloat16),
               ("FP64", 11, 52, torch.float64))
# Formats torch has no dtype for (an answer must compute from the bits, not look up torch.finfo). (4, 3) is the
# IEEE-style E4M3 with inf, max 240; torch.float8_e4m3fn gives up inf/NaN codes for range and reaches 448. The
# text allows 2 <= e <= 11 and 0 <= m <= 52: the smallest exponent field and no mantissa bits are tried too.
MADE_UP_CASES = (("E3M4", 3, 4), ("E6M9", 6, 9), ("E2M1", 2, 1), ("E7M2", 7, 2),
                 ("E4M3 (IEEE-style, with inf)", 4, 3), ("E5M0", 5, 0), ("E2M0", 2, 0))


def _enumerated_limits(e_bits: int, m_bits: int) -> tuple[float, float, float]:
    """(eps, max, smallest normal) by decoding every positive bit pattern of the format (no closed formula)."""
    bias, values = 2 ** (e_bits - 1) - 1, []
    for code in range(1, 2**e_bits - 1):              # 0: zero/subnormals, all ones: inf/NaN
        for fraction in range(2**m_bits):
            values.append(2.0 ** (code - bias) * (1 + fraction / 2**m_bits))
    return min(v for v in values if v > 1.0) - 1.0, max(values), min(values)


def _limits_of(float_limits, e_bits: int, m_bits: int, name: str):
    """The answer's (eps, max, smallest normal) as floats, or the OverflowError it raised (judged after the
    formats it did compute: their values may name the mistake behind the overflow)."""
    try:
        result = float_limits(e_bits, m_bits)
    except NotImplementedError:
        raise
    except OverflowError as exc:
        return exc
    except LookupError as exc:   # a lookup table of known formats fails on the others
        raise AssertionError(f"float_limits({e_bits}, {m_bits}) ({name}) raised {type(exc).__name__}: {exc}. "
                             "Compute the limits from the bit counts: any e and m must work, not only the formats "
                             "torch has a dtype for.") from None
    except Exception as exc:
        raise AssertionError(f"float_limits({e_bits}, {m_bits}) ({name}) raised {type(exc).__name__}: {exc}") from None
    expect(isinstance(result, tuple) and len(result) == 3,
           f"float_limits({e_bits}, {m_bits}) must return a tuple (eps, max_value, smallest_normal); got {result!r}")
    try:
        return tuple(float(v) for v in result)
    except (TypeError, ValueError):
        raise AssertionError(f"float_limits({e_bits}, {m_bits}) returned {result!r}: expected three numbers") from None


def _bias(e: int) -> int:
    return 2 ** (e - 1) - 1


def _pow2(k: int) -> float:
    try:
        return 2.0**k
    except OverflowError:
        return INF


def _max_with_bias_too_big(e: int, m: int) -> float:
    return (2 - _pow2(-m)) * _pow2(2**e - 3 - _bias(e))


# Per limit (0 eps, 1 max, 2 smallest normal): (what the answer did, the value that mistake gives for (e, m)).
LIMIT_MISTAKES = {
    0: (("is 2**-(m+1), half the gap (the unit roundoff, or the implicit leading 1 counted as a stored bit): eps is "
         "one unit in the last of the m STORED mantissa bits, 2**-m", lambda e, m: _pow2(-m - 1)),
        ("is 2**-(m-1), twice the gap: eps is one unit in the last of the m stored mantissa bits, 2**-m",
         lambda e, m: _pow2(1 - m))),
    1: (("uses the all-ones exponent code, which is reserved for inf/NaN: the largest exponent is (2**e - 2) - bias",
         lambda e, m: (2 - _pow2(-m)) * _pow2(2**e - 1 - _bias(e))),
        ("leaves out the mantissa: the largest mantissa 1.11...1 is 2 - 2**-m, so max = (2 - 2**-m) * 2**max_exponent",
         lambda e, m: _pow2(2**e - 2 - _bias(e))),
        ("is 2**(bias + 1), the first power of two beyond the format: the largest finite number is "
         "(2 - 2**-m) * 2**((2**e - 2) - bias)", lambda e, m: _pow2(_bias(e) + 1)),
        ("uses a bias one too big: the bias is 2**(e-1) - 1", _max_with_bias_too_big)),
    2: (("is the smallest SUBnormal number (exponent code 0, mantissa 0...01); the smallest normal has an implicit "
         "leading 1: 2**(1 - bias)", lambda e, m: _pow2(1 - _bias(e) - m)),),
}
RULES = ("eps is the gap between 1.0 and the next number, one unit in the last of the m stored mantissa bits: 2**-m",
         "the all-ones exponent code is reserved for inf/NaN, so the largest exponent is (2**e - 2) - bias with bias "
         "2**(e-1) - 1, and the largest mantissa 1.11...1 is 2 - 2**-m",
         "exponent code 0 is reserved for zero/subnormals and the bias is 2**(e-1) - 1, so the smallest normal is "
         "2**(1 - bias)")
LIMIT_NAMES = ("eps", "max", "smallest normal")


def _limit_hint(which: int, results: dict, wants: dict, fi_names) -> str:
    """Why limit `which` is wrong, from the answer's values on every format."""
    got = {key: value[which] for key, value in results.items()}
    want = {key: value[which] for key, value in wants.items()}
    for what, value in LIMIT_MISTAKES[which]:
        if all(got[(e, m)] == value(e, m) for e, m in got):
            return f" Your {LIMIT_NAMES[which]} {what}."
    if which == 2 and all(got[(e, m)] == _pow2(-_bias(e)) for e, m in got):   # which of two mistakes: max tells
        if all(results[key][1] == wants[key][1] for key in results):
            return (" Your smallest normal uses exponent code 0, which is reserved for zero and subnormals: the "
                    "smallest normal has code 1, so it is 2**(1 - bias) (your max shows your bias is right).")
        if all(results[(e, m)][1] == _max_with_bias_too_big(e, m) for e, m in results):
            return (" Your smallest normal and max both use a bias one too big: the bias is 2**(e-1) - 1, so the "
                    "smallest normal is 2**(1 - bias).")
        return (" Your smallest normal is 2**-bias: with the bias 2**(e-1) - 1 and code 1 (code 0 is reserved for "
                "zero and subnormals) the smallest normal is 2**(1 - bias).")
    wrong = [k for k in got if got[k] != want[k]]
    if any(math.isinf(got[k]) or got[k] == 0 for k in wrong):
        return (" Your answer gave inf or 0 there: a value overflowed or underflowed the float type it was computed in "
                "(float32, the default of torch tensors, ends near 3.4e38 and 1.2e-38): compute in Python floats "
                "(float64), where FP64's limits fit.")
    if all(math.isclose(got[k], want[k], rel_tol=1e-9) for k in wrong):
        return (f" Your {LIMIT_NAMES[which]} is off by rounding: every limit is a power of two or a sum of them, which "
                "a float holds exactly, but exp/log/pow of a float are not exact (math.exp(-3 * math.log(2)) is "
                "0.12500000000000003): compute powers of two with 2.0 ** k or math.ldexp.")
    lookup = all(results[(e, m)] == wants[(e, m)] for e, m in fi_names)
    return (f" Hint: {RULES[which]}."
            + (" Your answer is right on every format torch has a dtype for, and wrong on this one: torch has no "
               "such format, so compute from the bits; a table of torch.finfo's formats cannot know it." if lookup
               else ""))


def check_float_limits(float_limits) -> None:
    """float_limits(exponent_bits, mantissa_bits) -> (eps, max_value, smallest_normal) of an IEEE-style format."""
    _refuse_calls(float_limits, ("finfo", "iinfo"), "compute the limits from the bit counts, do not look them up "
                  "(the check compares with torch.finfo, and tries formats torch has no dtype for).")
    cases = [(name, e, m, torch.finfo(dtype)) for name, e, m, dtype in FINFO_CASES]
    cases += [(name, e, m, None) for name, e, m in MADE_UP_CASES]
    results = {(e, m): _limits_of(float_limits, e, m, name) for name, e, m, _ in cases}
    overflows = {key: results.pop(key) for key in list(results) if isinstance(results[key], OverflowError)}
    wants = {(e, m): (fi.eps, fi.max, fi.smallest_normal) if fi else _enumerated_limits(e, m) for _, e, m, fi in cases}
    fi_names = [(e, m) for _, e, m, fi in cases if fi and (e, m) in results]
    for name, e_bits, m_bits, _ in cases:
        if (e_bits, m_bits) in overflows:
            continue
        got, want = results[(e_bits, m_bits)], wants[(e_bits, m_bits)]
        fmt = f"{name} ({e_bits} exponent, {m_bits} mantissa bits)"
        if (e_bits, m_bits) == (4, 3) and got[1] == torch.finfo(torch.float8_e4m3fn).max:
            raise AssertionError(f"{fmt}: max should be {want[1]}, got {got[1]}: that is torch.float8_e4m3fn, "
                                 "which drops inf and keeps only one NaN code to reach 448. This exercise's formats "
                                 "are IEEE-style: the all-ones exponent code is reserved for inf/NaN.")
        for which in (0, 2, 1):
            if got[which] != want[which]:
                raise AssertionError(f"{fmt}: {LIMIT_NAMES[which]} should be {want[which]!r}, got {got[which]!r}."
                                     f"{_limit_hint(which, results, wants, fi_names)}")
    for name, e_bits, m_bits, _ in cases:
        if (e_bits, m_bits) in overflows:
            raise AssertionError(f"float_limits({e_bits}, {m_bits}) ({name}) raised OverflowError: "
                                 f"{overflows[(e_bits, m_bits)]}. An intermediate value went beyond the largest float: "
                                 "keep every step finite, e.g. max as (2 - 2**-m) * 2.0**max_exponent, not "
                                 "2.0**(max_exponent + 1) - ....")
    passed("float_limits")


def _located(value, M: torch.Tensor, axis: str):
    """(line, position along it) of `value` in M (a row of A / a column of B); None if M holds no such value."""
    where = (M == value).nonzero().tolist()
    if not where:
        return None
    r, c = where[0]
    return (r, c) if axis == "row" else (c, r)


def _entry(M_name: str, axis: str, line: int, pos: int) -> str:
    return f"{M_name}[{line}, {pos}]" if axis == "row" else f"{M_name}[{pos}, {line}]"


def _explain_feed(name: str, seq: list, idx: int, M: torch.Tensor, axis: str) -> str:
    """Why edge `name`[idx] got the values `seq` (one per cycle): what the answer fed, over the whole run."""
    M_name, k = ("A", M.shape[1]) if axis == "row" else ("B", M.shape[0])
    line_name = f"row {idx} of A" if axis == "row" else f"column {idx} of B"
    window = range(idx, idx + k)

    def want(t):
        if t not in window:
            return 0
        return (M[idx, t - idx] if axis == "row" else M[t - idx, idx]).item()

    def shown(t):
        spot = _located(seq[t], M, axis)
        return f"{seq[t]:g}" if seq[t] == 0 or spot is None else _entry(M_name, axis, *spot)

    def said(t):
        return f"{name}[{idx}] at cycle t={t} should be {_entry(M_name, axis, idx, t - idx) if t in window else 0}; " \
               f"got {shown(t)}"

    first = next(t for t in range(len(seq)) if seq[t] != want(t))
    fed = {t: _located(v, M, axis) for t, v in enumerate(seq) if v != 0}
    foreign = [t for t, spot in fed.items() if spot is None]
    if foreign:
        t = foreign[0]
        if t in window and seq[t] == math.trunc(want(t)):
            return (f"{said(t)}: the value lost its fraction. Hint: make the edge tensors with {M_name}'s dtype "
                    f"(torch.zeros(n, dtype={M_name}.dtype)); an integer tensor truncates what is written into it.")
        return f"{said(t)}, which is no element of {M_name}. Hint: feed the elements of {M_name} themselves."
    other = [t for t, (line, _) in fed.items() if line != idx]
    if other:
        hint = ("row i of A enters row i of the array: a_left[i] = A[i, ...]" if axis == "row" else
                "b flows DOWN the array, so column j of B feeds column j: b_top[j] = B[..., j], not a row of B")
        return f"{said(other[0])}. Hint: {hint}."
    outside = [t for t in fed if t not in window]
    if all(seq[t] == want(t) for t in window):          # the window is right, the padding around it is not
        t = outside[0]
        pos = fed[t][1]
        how = (f" ({_minus(idx)} = {t - idx} is negative, and a negative index wraps around to the end of the line)"
               if pos == k + t - idx else f" (the index {_minus(idx)} = {t - idx} was clamped into the line)"
               if pos in (0, k - 1) else "")
        return (f"{said(t)}{how}. No zero padding: outside cycles {idx}..{idx + k - 1} the edge gets 0 "
                f"(only then is an element of {line_name} due); guard with 0 <= {_minus(idx)} < k.")
    lateness = {t - pos for t, (_, pos) in fed.items()}
    if len(lateness) == 1 and lateness != {idx}:
        late = lateness.pop()
        number = f"the element entering at cycle t is number {_minus(idx)}"
        if late == 0:
            hint = f"no skew: {'row i of A' if axis == 'row' else 'column j of B'} must enter {_cycles(idx)} late " \
                   f"(element {_minus(idx)} at cycle t)"
        elif abs(late - idx) == 1:
            hint = f"off by one: {line_name} starts entering at cycle {late} instead of {idx}: {number}, " \
                   f"not {_minus(late)}"
        else:
            hint = f"{line_name} starts entering at cycle {late} instead of {idx}: {number}"
        return f"{said(first)}. Hint: {hint}."
    missing = [t for t in window if seq[t] == 0 and want(t) != 0]
    if lateness == {idx} and missing:
        t = missing[0]
        return (f"{said(t)}: {_entry(M_name, axis, idx, t - idx)} never entered. Hint: {line_name} enters at cycles "
                f"{idx}..{idx + k - 1}, one element per cycle.")
    return f"{said(first)}. Hint: at cycle t, {line_name} feeds its element number {_minus(idx)} (0 outside the line)."


def _minus(idx: int) -> str:
    return "t" if idx == 0 else f"t - {idx}" if idx > 0 else f"t + {-idx}"


def _cycles(count: int) -> str:
    return f"{count} cycle" + ("" if count == 1 else "s")


def _feed_cases():
    """(A, B) with distinct non-zero values (a wrong entry says which one was used): every shape the text allows,
    lines longer and shorter than the array, one row/column/element, integer and float dtypes."""
    out = []
    for (n, k, m), dtype in (((3, 4, 5), torch.float32), ((5, 2, 3), torch.int64), ((2, 6, 1), torch.float64),
                             ((1, 1, 1), torch.int64), ((1, 3, 4), torch.float32)):
        fraction = 0.5 if dtype.is_floating_point else 0        # an integer edge tensor would truncate it
        A = torch.arange(1, n * k + 1, dtype=dtype).reshape(n, k) + fraction
        B = torch.arange(n * k + 1, n * k + k * m + 1, dtype=dtype).reshape(k, m) + fraction
        out.append((A, B))
    return out


def _run_feed(systolic_feed, A, B) -> tuple[list, list]:
    """The answer's edge values over a whole run, as Python numbers: ([a_left per cycle], [b_top per cycle])."""
    n, k = A.shape
    m = B.shape[1]
    given = A.clone(), B.clone()
    lefts, tops = [], []
    for t in range(k + n + m - 2):
        got = call_answer(systolic_feed, A, B, t, what=f"systolic_feed(A {tuple(A.shape)}, B {tuple(B.shape)}, t={t})")
        expect(isinstance(got, tuple) and len(got) == 2,
               f"systolic_feed must return a tuple (a_left, b_top); got {type(got).__name__}")
        for name, v, size in (("a_left", got[0], n), ("b_top", got[1], m)):
            expect(isinstance(v, torch.Tensor) and tuple(v.shape) == (size,),
                   f"{name} must be a tensor of shape ({size},) for A {tuple(A.shape)}, B {tuple(B.shape)}; "
                   f"got {getattr(v, 'shape', type(v).__name__)}")
        lefts.append(got[0].tolist())
        tops.append(got[1].tolist())
    expect(torch.equal(A, given[0]) and torch.equal(B, given[1]),
           "systolic_feed changed A or B: read the operands, never write into them (the caller's matrices).")
    return lefts, tops


def check_systolic_feed(systolic_feed) -> None:
    """systolic_feed(A, B, t) -> (a_left (n,), b_top (m,)): what enters an output-stationary array at cycle t."""
    from .. import systolic

    _refuse_calls(systolic_feed, ("feed",), "systolic.feed is the library's own answer (the check compares with "
                  "it); index A and B yourself.")
    for A, B in _feed_cases():
        lefts, tops = _run_feed(systolic_feed, A, B)
        for t in range(len(lefts)):
            ref_a, ref_b = systolic.feed(A, B, t)
            for name, got, ref, M, axis in (("a_left", lefts, ref_a, A, "row"), ("b_top", tops, ref_b, B, "column")):
                wrong = [i for i in range(len(ref)) if got[t][i] != ref[i].item()]
                if wrong:
                    shapes = f"A {tuple(A.shape)}, B {tuple(B.shape)}: "
                    seq = [row[wrong[0]] for row in got]
                    raise AssertionError(shapes + _explain_feed(name, seq, wrong[0], M, axis))
    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.int64):
        A2, B2 = (torch.randint(-4, 5, shape, generator=gen).to(dtype) for shape in ((4, 3), (3, 6)))
        expect(torch.equal(systolic.matmul(A2, B2, feed=systolic_feed).C, A2 @ B2),
               f"the array fed by systolic_feed does not compute A @ B for a (4, 3) @ (3, 6) {dtype} product")
    passed("systolic_feed")
