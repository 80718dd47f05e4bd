"""Checks for the exercises of lecture 02 (hardware and numbers).

References are PyTorch's own: torch.fake_quantize_per_tensor_affine (the quantize ->
dequantize round trip that quantization-aware training uses; torch.quantize_per_tensor is
deprecated) and torch.finfo.
"""
from __future__ import annotations

import torch

from . import expect, expect_close, passed, torch_quantized


def _codes(quantize_int8, x, scale, zero_point, case: str) -> torch.Tensor:
    q = quantize_int8(x, scale, zero_point)
    expect(isinstance(q, torch.Tensor), f"{case}: quantize_int8 must return a tensor; got {type(q).__name__}")
    expect(q.shape == x.shape, f"{case}: expected shape {tuple(x.shape)}, got {tuple(q.shape)}")
    expect(q.dtype == torch.int8, f"{case}: expected dtype torch.int8, got {q.dtype}. Convert at the end with .to(torch.int8).")
    return q


def check_quantize_int8(quantize_int8, dequantize_int8) -> None:
    """quantize_int8(x, scale, zero_point) -> int8 codes; dequantize_int8(q, scale, zero_point) -> float32."""
    gen = torch.Generator().manual_seed(2)
    cases = [
        ("values in range, zero_point=0", torch.randn(200, generator=gen) * 1.5, 0.05, 0,
         "q = round(x / scale) + zero_point; round to the NEAREST integer (torch.round), not towards zero "
         "(int() / .to(torch.int8) truncate 1.6 to 1)."),
        ("zero_point=-20", torch.randn(200, generator=gen) * 1.5, 0.05, -20,
         "the zero point is ADDED after rounding: q = round(x / scale) + zero_point, so x = 0 maps to "
         "q = zero_point."),
        ("values beyond the int8 range", torch.tensor([10.0, -10.0, 100.0, -7.0, 6.4, 6.3]), 0.05, 3,
         "codes must saturate at -128 and 127: clamp BEFORE converting to int8 (converting 200 to int8 "
         "wraps around to -56)."),
        ("exact ties (x / scale = k + 0.5)", torch.tensor([0.25, 0.75, 1.25, -0.25, -0.75, 2.25]), 0.5, 0,
         "ties round to the EVEN integer (torch.round does this; floor(v + 0.5) and Python's int(v + 0.5) "
         "do not): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0."),
        ("exact ties with an odd zero_point", torch.tensor([0.25, 0.75, 1.25, -0.25, -0.75, 2.25]), 0.5, 3,
         "round x / scale FIRST, then add the zero point: round(x / scale + zero_point) rounds a tie to another "
         "even number when zero_point is odd (round(0.5) + 3 = 3, but round(0.5 + 3) = 4)."),
    ]
    for case, x, scale, zp, hint in cases:
        q = _codes(quantize_int8, x, scale, zp, case)
        ref_q, ref_x = torch_quantized(x, scale, zp, -128, 127)
        ref_q = ref_q.to(torch.int8)
        if not torch.equal(q, ref_q):
            i = int((q != ref_q).nonzero()[0])
            raise AssertionError(f"quantize_int8, {case} (scale={scale}, zero_point={zp}): x={x[i].item():.4g} "
                                 f"should give {ref_q[i].item()}, got {q[i].item()}. Hint: {hint}")
        back = dequantize_int8(ref_q, scale, zp)
        expect(isinstance(back, torch.Tensor) and back.is_floating_point(),
               f"dequantize_int8, {case}: must return a float tensor; got {getattr(back, 'dtype', type(back))}. "
               "Convert q to float BEFORE subtracting the zero point (int8 arithmetic overflows).")
        expect_close(back, ref_x, f"dequantize_int8, {case} (scale={scale}, zero_point={zp})", atol=1e-6,
                     hint="x = (q - zero_point) * scale: SUBTRACT the zero point (the inverse of quantize), "
                          "then multiply by the scale.")
    passed("quantize_int8 / dequantize_int8")


FINFO_CASES = (("FP32", 8, 23, torch.float32), ("FP16", 5, 10, torch.float16), ("BF16", 8, 7, torch.bfloat16))
# Formats torch has no dtype for (an answer must compute from the bits, not look up torch.finfo). (4, 3) is the
# IEEE-style E4M3 with inf, max 240; torch.float8_e4m3fn gives up inf/NaN codes for range and reaches 448.
MADE_UP_CASES = (("E3M4", 3, 4), ("E6M9", 6, 9), ("E2M1", 2, 1), ("E7M2", 7, 2),
                 ("E4M3 (IEEE-style, with inf)", 4, 3))


def _enumerated_limits(e_bits: int, m_bits: int) -> tuple[float, float, float]:
    """(eps, max, smallest normal) by decoding every positive bit pattern of the format (no closed formula)."""
    bias, values = 2 ** (e_bits - 1) - 1, []
    for code in range(1, 2**e_bits - 1):              # 0: zero/subnormals, all ones: inf/NaN
        for fraction in range(2**m_bits):
            values.append(2.0 ** (code - bias) * (1 + fraction / 2**m_bits))
    return min(v for v in values if v > 1.0) - 1.0, max(values), min(values)


def _limits_of(float_limits, e_bits: int, m_bits: int, name: str) -> tuple[float, float, float]:
    try:
        result = float_limits(e_bits, m_bits)
    except NotImplementedError:
        raise
    except Exception as exc:   # a lookup table of known formats fails on the others
        raise AssertionError(f"float_limits({e_bits}, {m_bits}) ({name}) raised {type(exc).__name__}: {exc}. "
                             "Compute the limits from the bit counts: any e and m must work, not only the formats "
                             "torch has a dtype for.") from None
    expect(isinstance(result, tuple) and len(result) == 3,
           f"float_limits({e_bits}, {m_bits}) must return a tuple (eps, max_value, smallest_normal); got {result!r}")
    try:
        return tuple(float(v) for v in result)
    except (TypeError, ValueError):
        raise AssertionError(f"float_limits({e_bits}, {m_bits}) returned {result!r}: expected three numbers") from None


def check_float_limits(float_limits) -> None:
    """float_limits(exponent_bits, mantissa_bits) -> (eps, max_value, smallest_normal) of an IEEE-style format."""
    cases = [(name, e, m, torch.finfo(dtype)) for name, e, m, dtype in FINFO_CASES]
    cases += [(name, e, m, None) for name, e, m in MADE_UP_CASES]
    for name, e_bits, m_bits, fi in cases:
        eps, max_value, smallest_normal = _limits_of(float_limits, e_bits, m_bits, name)
        want = (fi.eps, fi.max, fi.smallest_normal) if fi else _enumerated_limits(e_bits, m_bits)
        want_eps, want_max, want_normal = want
        fmt = f"{name} ({e_bits} exponent, {m_bits} mantissa bits)"
        lookup = "" if fi else (" (torch has no such format: compute from the bits; a table of torch.finfo's "
                                "formats cannot know it.)")
        if (e_bits, m_bits) == (4, 3) and max_value == torch.finfo(torch.float8_e4m3fn).max:
            raise AssertionError(f"{fmt}: max should be {want_max}, got {max_value}: that is torch.float8_e4m3fn, "
                                 "which drops inf and keeps only one NaN code to reach 448. This exercise's formats "
                                 "are IEEE-style: the all-ones exponent code is reserved for inf/NaN.")
        expect(eps == want_eps, f"{fmt}: eps should be {want_eps}, got {eps}. "
                                "Hint: eps is the gap between 1.0 and the next number, one unit in the LAST of the "
                                "m stored mantissa bits: 2**-m (the leading 1 is implicit, not stored)." + lookup)
        subnormal = "" if smallest_normal != want_normal * want_eps else (
            " That is the smallest SUBnormal number (exponent code 0, mantissa 0...01); the smallest normal has an "
            "implicit leading 1.")
        expect(smallest_normal == want_normal,
               f"{fmt}: smallest normal should be {want_normal}, got {smallest_normal}.{subnormal} Hint: the bias is "
               "2**(e-1) - 1 and exponent code 0 is reserved for zero/subnormals, so the smallest normal is "
               "2**(1 - bias)." + lookup)
        expect(max_value == want_max,
               f"{fmt}: max should be {want_max}, got {max_value}. Hint: the all-ones exponent code is reserved for "
               "inf/NaN, so the largest exponent is (2**e - 2) - bias, and the largest mantissa 1.11...1 is "
               "2 - 2**-m (check the bias is 2**(e-1) - 1)." + lookup)
    passed("float_limits")


def _explain_feed(name, got, t, idx, M, expected_pos, axis):
    """A hint for the first wrong edge value: which entry of M the answer used instead."""
    where = (M == got).nonzero().tolist() if got != 0 else []
    want = f"M[{expected_pos[0]}, {expected_pos[1]}]" if expected_pos else "0 (no data enters there yet / any more)"
    said = f"{name}[{idx}] at cycle t={t} should be {want.replace('M', 'A' if axis == 'row' else 'B')}"
    if not where:
        line = "row i of A" if axis == "row" else "column j of B"
        return (f"{said}; got {got:g}. Hint: {line} starts entering at cycle t = {idx} exactly and its last element "
                f"enters at cycle {idx} + k - 1 (off by one?); outside that window the edge gets 0.")
    r, c = where[0]
    used = f"{'A' if axis == 'row' else 'B'}[{r}, {c}]"
    line, pos = (r, c) if axis == "row" else (c, r)        # (which row of A / column of B, position along it)
    if line != idx:
        hint = ("row i of A enters row i of the array: a_left[i] = A[i, ...]" if axis == "row" else
                "b flows DOWN the array, so column j of B feeds column j: b_top[j] = B[..., j], not a row of B")
    elif pos == t:
        hint = f"no skew: {'row i of A' if axis == 'row' else 'column j of B'} must enter {idx} cycles late (t - {idx})"
    elif abs(pos - (t - idx)) == 1:
        hint = f"off by one: the element entering at cycle t is number t - {idx}, not t - {idx} {'+' if pos > t - idx else '-'} 1"
    else:
        hint = f"the element entering at cycle t is number t - {idx} of the line"
    return f"{said}; got {used}. Hint: {hint}."


def check_systolic_feed(systolic_feed) -> None:
    """systolic_feed(A, B, t) -> (a_left (n,), b_top (m,)): what enters an output-stationary array at cycle t."""
    from .. import systolic

    A = torch.arange(1.0, 13.0).reshape(3, 4)       # distinct values: a wrong entry says which one was used
    B = torch.arange(13.0, 33.0).reshape(4, 5)
    n, k = A.shape
    m = B.shape[1]
    for t in range(k + n + m - 2):
        got = systolic_feed(A, B, t)
        expect(isinstance(got, tuple) and len(got) == 2, f"systolic_feed must return a tuple (a_left, b_top); got {type(got).__name__}")
        a_left, b_top = got
        for name, v, size in (("a_left", a_left, n), ("b_top", b_top, m)):
            expect(isinstance(v, torch.Tensor) and tuple(v.shape) == (size,),
                   f"{name} must be a tensor of shape ({size},) for A {tuple(A.shape)}, B {tuple(B.shape)}; "
                   f"got {getattr(v, 'shape', type(v).__name__)}")
        ref_a, ref_b = systolic.feed(A, B, t)
        for i in range(n):
            if a_left[i].item() != ref_a[i].item():
                raise AssertionError(_explain_feed("a_left", a_left[i].item(), t, i, A,
                                                   (i, t - i) if 0 <= t - i < k else None, "row"))
        for j in range(m):
            if b_top[j].item() != ref_b[j].item():
                raise AssertionError(_explain_feed("b_top", b_top[j].item(), t, j, B,
                                                   (t - j, j) if 0 <= t - j < k else None, "column"))
    gen = torch.Generator().manual_seed(3)
    A2, B2 = torch.randint(-4, 5, (4, 3), generator=gen).float(), torch.randint(-4, 5, (3, 6), generator=gen).float()
    expect(torch.equal(systolic.matmul(A2, B2, feed=systolic_feed).C, A2 @ B2),
           "the array fed by systolic_feed does not compute A @ B for a (4, 3) @ (3, 6) product")
    passed("systolic_feed")
