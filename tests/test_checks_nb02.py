"""The lecture-02 checks pass the reference solutions and fail stubs and plausible wrong answers."""
import math

import pytest
import torch

from course_lib import systolic
from course_lib.checks.nb02 import check_float_limits, check_quantize_int8, check_systolic_feed
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "02_hardware_and_numbers_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_quantize_int8(NS["quantize_int8"], NS["dequantize_int8"])
    check_float_limits(NS["float_limits"])
    check_systolic_feed(NS["systolic_feed"])


def test_stubs_fail():
    with pytest.raises(NotImplementedError):
        check_quantize_int8(stub, stub)
    with pytest.raises(NotImplementedError):
        check_quantize_int8(NS["quantize_int8"], stub)
    with pytest.raises(NotImplementedError):
        check_float_limits(stub)
    with pytest.raises(AssertionError, match="a_left"):   # the exercise's stub returns the zero edges
        check_systolic_feed(lambda A, B, t: (torch.zeros(A.shape[0]), torch.zeros(B.shape[1])))


@pytest.mark.parametrize("wrong, hint", [
    (lambda x, s, z: (torch.trunc(x / s) + z).clamp(-128, 127).to(torch.int8), "NEAREST"),     # truncation
    (lambda x, s, z: (torch.round(x / s) + z).to(torch.int8), "saturate"),                      # no clamping
    (lambda x, s, z: (torch.round(x / s) - z).clamp(-128, 127).to(torch.int8), "ADDED"),        # zero point sign
    (lambda x, s, z: torch.floor(x / s + 0.5 + z).clamp(-128, 127).to(torch.int8), "EVEN"),    # ties up
    (lambda x, s, z: (torch.round(x / s) + z).clamp(-128, 127), "torch.int8"),                  # float codes
    (lambda x, s, z: torch.round(x / s + z).clamp(-128, 127).to(torch.int8), "FIRST"),      # z added before rounding
    (lambda x, s, z: (torch.round(x / s) + z).clamp(-127, 127).to(torch.int8), "saturate"),   # symmetric range
    (lambda x, s, z: (torch.round(x / s) + z).to(torch.int8).clamp(-128, 127), "saturate"),   # clamps after wrapping
])
def test_quantize_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_quantize_int8(wrong, NS["dequantize_int8"])


@pytest.mark.parametrize("wrong, hint", [
    (lambda q, s, z: (q.float() + z) * s, "SUBTRACT"),            # wrong sign of the zero point
    (lambda q, s, z: q.float() * s, "SUBTRACT"),                  # zero point forgotten
    (lambda q, s, z: (q - z) * s, "dequantize_int8, values beyond"),  # int8 arithmetic wraps around
    (lambda q, s, z: (q - z).to(torch.int16), "float tensor"),        # returns integers
])
def test_dequantize_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_quantize_int8(NS["quantize_int8"], wrong)


def _limits(bias_fn, eps_fn, top_code_fn, fraction_fn):
    def float_limits(e, m):
        bias, eps = bias_fn(e), eps_fn(m)
        return eps, fraction_fn(eps) * 2.0 ** (top_code_fn(e) - bias), 2.0 ** (1 - bias)
    return float_limits


RIGHT = dict(bias_fn=lambda e: 2 ** (e - 1) - 1, eps_fn=lambda m: 2.0**-m, top_code_fn=lambda e: 2**e - 2,
             fraction_fn=lambda eps: 2 - eps)


@pytest.mark.parametrize("change, hint", [
    (dict(bias_fn=lambda e: 2 ** (e - 1)), "smallest normal"),          # bias off by one
    (dict(eps_fn=lambda m: 2.0 ** -(m + 1)), "eps"),                    # counts the implicit bit
    (dict(eps_fn=lambda m: 2.0 ** -(m - 1)), "eps"),
    (dict(top_code_fn=lambda e: 2**e - 1), "reserved for inf"),         # uses the inf/NaN exponent
    (dict(fraction_fn=lambda eps: 1.0), "max"),                         # forgets the mantissa
])
def test_float_limits_wrong_answers(change, hint):
    with pytest.raises(AssertionError, match=hint):
        check_float_limits(_limits(**{**RIGHT, **change}))


KNOWN = {(8, 23): torch.float32, (5, 10): torch.float16, (8, 7): torch.bfloat16, (11, 52): torch.float64,
         (5, 2): torch.float8_e5m2, (4, 3): torch.float8_e4m3fn}


def finfo_table(e, m):
    fi = torch.finfo(KNOWN[(e, m)])        # KeyError for any other format
    return fi.eps, fi.max, fi.smallest_normal


def finfo_table_with_a_guess(e, m):
    if (e, m) in KNOWN:
        return finfo_table(e, m)
    return 2.0**-m, 2.0 ** (2 ** (e - 1)), 2.0 ** (2 - 2 ** (e - 1))


def e4m3_without_inf(e, m):
    bias = 2 ** (e - 1) - 1
    if (e, m) == (4, 3):
        return 2.0**-m, 448.0, 2.0 ** (1 - bias)
    return _limits(**RIGHT)(e, m)


def smallest_subnormal(e, m):
    eps, top, _ = _limits(**RIGHT)(e, m)
    return eps, top, 2.0 ** (2 - 2 ** (e - 1) - m)


@pytest.mark.parametrize("wrong, hint", [
    (finfo_table, "Compute the limits from the bit counts"),
    (finfo_table_with_a_guess, "torch has no such format"),
    (e4m3_without_inf, "float8_e4m3fn"),
    (smallest_subnormal, "SUBnormal"),
    (lambda e, m: (2.0**-m, None, 1.0), "three numbers"),
])
def test_float_limits_formats_torch_does_not_have(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_float_limits(wrong)


@pytest.mark.parametrize("right", [
    lambda e, m: (math.ldexp(1, -m), math.ldexp(2 - 2.0**-m, 2**e - 2 - (2 ** (e - 1) - 1)),
                  math.ldexp(1, 2 - 2 ** (e - 1))),
    lambda e, m: (2.0**-m, 2.0 ** (2 ** (e - 1)) - 2.0 ** (2 ** (e - 1) - 1 - m), 2.0 ** (2 - 2 ** (e - 1))),
    lambda e, m: tuple(torch.tensor([2.0**-m, (2 - 2.0**-m) * 2.0 ** (2 ** (e - 1) - 1), 2.0 ** (2 - 2 ** (e - 1))],
                                    dtype=torch.float64)),
])
def test_float_limits_other_right_answers(right):
    check_float_limits(right)


def test_float_limits_right_formula_helper_passes():
    check_float_limits(_limits(**RIGHT))
    with pytest.raises(AssertionError, match="tuple"):
        check_float_limits(lambda e, m: [2.0**-m, math.inf, 0.0])


def _feed(a_pos, b_pos, b_from_row=False):
    """A feed with the element numbers a_pos(t, i) / b_pos(t, j); b_from_row reads row j of B instead of column j."""
    def feed(A, B, t):
        (n, k), m = A.shape, B.shape[1]
        a_left, b_top = torch.zeros(n), torch.zeros(m)
        for i in range(n):
            if 0 <= a_pos(t, i) < k:
                a_left[i] = A[i, a_pos(t, i)]
        for j in range(m):
            p = b_pos(t, j)
            if 0 <= p < k and (not b_from_row or (j < k and p < m)):
                b_top[j] = B[j, p] if b_from_row else B[p, j]
        return a_left, b_top
    return feed


SKEW = lambda t, i: t - i


def test_systolic_feed_helper_right_answer_passes():
    check_systolic_feed(_feed(SKEW, SKEW))


@pytest.mark.parametrize("wrong, hint", [
    (_feed(lambda t, i: t, SKEW), "no skew: row i of A"),
    (_feed(SKEW, lambda t, j: t), "no skew: column j of B"),
    (_feed(lambda t, i: t - i - 1, SKEW), "off by one"),
    (_feed(lambda t, i: t - i + 1, SKEW), "off by one"),
    (_feed(SKEW, lambda t, j: t - j + 1), "off by one"),
    (_feed(SKEW, lambda t, j: t - j - 1), "off by one"),
    (_feed(SKEW, SKEW, b_from_row=True), "flows DOWN"),        # B fed along the wrong direction
    (lambda A, B, t: systolic.feed(A, B, t)[::-1], "shape"),    # edges swapped
    (lambda A, B, t: list(systolic.feed(A, B, t)), "tuple"),
])
def test_systolic_feed_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_systolic_feed(wrong)


def test_quantize_other_right_answers():
    check_quantize_int8(lambda x, s, z: (x / s).round().add(z).clamp(-128, 127).to(torch.int8),
                        lambda q, s, z: q.float().sub(z).mul(s))
    check_quantize_int8(lambda x, s, z: torch.clamp(torch.round(x * (1 / s)) + z, min=-128, max=127).char(),
                        lambda q, s, z: (q.to(torch.int32) - z).float() * s)
