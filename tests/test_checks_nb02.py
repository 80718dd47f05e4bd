"""The lecture-02 checks pass the reference solutions and fail stubs and plausible wrong answers."""
import math

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from course_lib import systolic
from course_lib.checks import torch_quantized
from course_lib.checks.nb02 import (_enumerated_limits, _explain_feed, check_float_limits, check_quantize_int8,
                                    check_systolic_feed)
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
    (lambda q, s, z: (q - z).to(torch.int16), "float32 tensor"),        # returns integers
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
    (finfo_table, "calls finfo: compute the limits from the bit counts"),
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
RIGHT_FEED = _feed(SKEW, SKEW)


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
    (lambda A, B, t: RIGHT_FEED(A, B, t)[::-1], "shape"),    # edges swapped
    (lambda A, B, t: list(RIGHT_FEED(A, B, t)), "tuple"),
])
def test_systolic_feed_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_systolic_feed(wrong)


def test_quantize_other_right_answers():
    check_quantize_int8(lambda x, s, z: (x / s).round().add(z).clamp(-128, 127).to(torch.int8),
                        lambda q, s, z: q.float().sub(z).mul(s))
    check_quantize_int8(lambda x, s, z: torch.clamp(torch.round(x * (1 / s)) + z, min=-128, max=127).char(),
                        lambda q, s, z: (q.to(torch.int32) - z).float() * s)


# --- every input the text allows, and messages that name what the answer did (issue 34) ----------------------

def _quantize(rounding=torch.round, zp_sign=1, lo=-128, inplace=False, via=None):
    """A quantize_int8 with one thing changed: the rounding, the zero point's sign, the range, x changed in place,
    or a conversion to `via` before clamping."""
    def quantize_int8(x, s, z):
        v = x.div_(s) if inplace else x / s
        q = rounding(v) + zp_sign * z
        if via is not None:
            q = q.to(via)
        return q.clamp(lo, 127).to(torch.int8)
    return quantize_int8


def half_away_from_zero(v):
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


def own_scale(x, s, z):
    s = x.abs().max() / 127                               # ignores the given scale
    return (torch.round(x / s) + z).clamp(-128, 127).to(torch.int8)


def flattens_with_view(x, s, z):
    q = torch.round(x.view(-1) / s) + z
    return q.clamp(-128, 127).to(torch.int8).view(x.shape)


def library_codes(x, s, z):
    return torch.quantize_per_tensor(x, s, z, torch.qint8).int_repr()


def library_round_trip(x, s, z):
    return (torch.fake_quantize_per_tensor_affine(x, s, z, -128, 127) / s + z).round().to(torch.int8)


@pytest.mark.parametrize("wrong, words", [
    (_quantize(torch.floor), "rounds down"),
    (_quantize(torch.trunc), "towards zero"),
    (_quantize(half_away_from_zero), "EVEN integer"),
    (_quantize(zp_sign=0), "leaves out the zero point"),
    (_quantize(zp_sign=-1), "subtracts the zero point"),
    (lambda x, s, z: (torch.round(x * s) + z).clamp(-128, 127).to(torch.int8), "multiplies by the scale"),
    (_quantize(via=torch.int32), "does not saturate"),                       # converts before clamping: inf wraps
    (_quantize(inplace=True), "changed its input x"),
    (own_scale, "raised RuntimeError"),                                      # x.max() of the empty tensor
    (flattens_with_view, "non-contiguous.*raised RuntimeError"),
    (lambda x, s, z: _quantize()(x, s, z).reshape(-1), "expected shape"),
    (lambda x, s, z: _quantize()(x, s, z).to(torch.uint8), "torch.int8"),
    (library_codes, "calls quantize_per_tensor"),
    (library_round_trip, "calls fake_quantize_per_tensor_affine"),
], ids=["floor", "trunc", "half-away", "no-zero-point", "minus-zero-point", "times-scale", "int32-first",
        "in-place", "own-scale", "view", "flat", "uint8", "quantize_per_tensor", "fake_quantize"])
def test_quantize_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_quantize_int8(wrong, NS["dequantize_int8"])


def dequantize_in_place(q, s, z):
    return q.sub_(z).float() * s


@pytest.mark.parametrize("wrong, words", [
    (lambda q, s, z: (q.float() - z) / s, "divides by the scale"),
    (lambda q, s, z: (q.float() + z) * s, "adds the zero point"),
    (lambda q, s, z: q.float() * s, "leaves out the zero point"),
    (lambda q, s, z: (q - z) * s, "computed q - zero_point in int8"),
    (lambda q, s, z: (q.double() - z) * s, "float32 tensor; got torch.float64"),
    (lambda q, s, z: ((q.float() - z) * s).reshape(-1), "expected shape"),
    (dequantize_in_place, "changed its input q"),
    (lambda q, s, z: torch.dequantize(q), "calls dequantize"),
])
def test_dequantize_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_quantize_int8(NS["quantize_int8"], wrong)


def test_quantize_more_right_answers():
    import numpy as np
    check_quantize_int8(lambda x, s, z: (x.double() / s).round().add(z).clamp(-128, 127).to(torch.int8),
                        lambda q, s, z: (q.double() - z).mul(s).float())
    check_quantize_int8(lambda x, s, z: torch.from_numpy(np.asarray(np.clip(np.round(x.numpy() / s) + z, -128, 127),
                                                                    dtype=np.int8)),
                        lambda q, s, z: torch.from_numpy(np.asarray((q.numpy().astype(np.float32) - z) * s,
                                                                    dtype=np.float32)))


def exp_log_eps(e, m):
    bias = 2 ** (e - 1) - 1
    eps = math.exp(-m * math.log(2))                      # not exact: 0.12500000000000003 for m = 3
    return eps, (2 - 2.0**-m) * 2.0 ** (2**e - 2 - bias), 2.0 ** (1 - bias)


def float32_tensors(e, m):
    two, bias = torch.tensor(2.0), 2 ** (e - 1) - 1
    return two**-m, (2 - two**-m) * two ** (2**e - 2 - bias), two ** (1 - bias)


def overflows_on_fp64(e, m):
    return 2.0**-m, 2.0 ** (2 ** (e - 1)) - 2.0 ** (2 ** (e - 1) - 1 - m), 2.0 ** (2 - 2 ** (e - 1))


def code_zero_normal(e, m):
    eps, top, _ = _limits(**RIGHT)(e, m)
    return eps, top, 2.0 ** -(2 ** (e - 1) - 1)


def first_power_beyond(e, m):
    eps, _, normal = _limits(**RIGHT)(e, m)
    return eps, 2.0 ** (2 ** (e - 1)), normal


@pytest.mark.parametrize("wrong, words", [
    (exp_log_eps, "off by rounding"),
    (float32_tensors, "float32"),
    (overflows_on_fp64, "OverflowError.*beyond the largest float"),
    (code_zero_normal, "uses exponent code 0.*your bias is right"),
    (_limits(**{**RIGHT, "bias_fn": lambda e: 2 ** (e - 1)}), "both use a bias one too big"),
    (first_power_beyond, "first power of two beyond"),
    (_limits(**{**RIGHT, "eps_fn": lambda m: 2.0 ** -(m + 1)}), "half the gap"),
    (_limits(**{**RIGHT, "fraction_fn": lambda eps: 1.0}), "leaves out the mantissa"),
    (_limits(**{**RIGHT, "top_code_fn": lambda e: 2**e - 1}), "all-ones exponent code"),
    (lambda e, m: (torch.finfo(torch.float32).eps, 0.0, 0.0), "calls finfo"),
])
def test_float_limits_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_float_limits(wrong)


def test_float_limits_checks_fp64_and_no_mantissa_bits():
    """FP64 (the text's largest format) and m = 0 are tried: a formula that breaks there is caught."""
    def breaks_without_mantissa(e, m):
        return _limits(**RIGHT)(e, m) if m else (0.5, 1.0, 1.0)
    with pytest.raises(AssertionError, match="E5M0"):
        check_float_limits(breaks_without_mantissa)


def _feed_with(index, guard=lambda p, k: 0 <= p < k, a_only=True):
    """The right feed except that row i of A reads A[i, index(t, i, k)] wherever guard(t - i, k) holds."""
    def feed(A, B, t):
        (n, k), m = A.shape, B.shape[1]
        a_left, b_top = RIGHT_FEED(A, B, t)
        for i in range(n):
            a_left[i] = A[i, index(t, i, k)] if guard(t - i, k) else 0
        return a_left, b_top
    return feed


def consumes_a(A, B, t):
    a_left, b_top = RIGHT_FEED(A, B, t)
    for i in range(A.shape[0]):
        if 0 <= t - i < A.shape[1]:
            A[i, t - i] = 0                                    # "used up": overwrites the caller's matrix
    return a_left, b_top


def integer_edges(A, B, t):
    a_left, b_top = RIGHT_FEED(A, B, t)
    return a_left.to(torch.int64), b_top


@pytest.mark.parametrize("wrong, words", [
    # forgets the zero padding: the window is right, the cycles around it are not
    (_feed_with(lambda t, i, k: min(max(t - i, 0), k - 1), lambda p, k: True), "clamped.*No zero padding"),
    (_feed_with(lambda t, i, k: t - i, lambda p, k: p < k), "wraps around.*No zero padding"),
    (_feed_with(lambda t, i, k: (t - i) % k, lambda p, k: True), "No zero padding"),
    (_feed_with(lambda t, i, k: t - i, lambda p, k: True), "raised IndexError"),
    # the skew itself
    (_feed_with(lambda t, i, k: k - 1 - (t - i)), "feeds its element number t "),    # the line fed backwards
    (_feed_with(lambda t, i, k: t - i, lambda p, k: 0 <= p < k - 1), "never entered"),
    (consumes_a, "changed A or B"),
    (integer_edges, "lost its fraction"),
    (lambda A, B, t: systolic.feed(A, B, t), "calls feed"),
])
def test_systolic_feed_wrong_answers_named(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_systolic_feed(wrong)


def skew_reversed(A, B, t):
    (n, k), m = A.shape, B.shape[1]
    a_left, b_top = RIGHT_FEED(A, B, t)
    for i in range(n):
        late = n - 1 - i
        a_left[i] = A[i, t - late] if 0 <= t - late < k else 0
    return a_left, b_top


def test_systolic_feed_names_the_lateness_the_answer_used():
    with pytest.raises(AssertionError, match="row 0 of A starts entering at cycle 2 instead of 0"):
        check_systolic_feed(skew_reversed)


def test_systolic_feed_no_skew_only_when_there_is_none():
    """An answer that feeds the right element at the right cycles is never told that the skew is missing."""
    for wrong in (_feed_with(lambda t, i, k: min(max(t - i, 0), k - 1), lambda p, k: True),
                  _feed_with(lambda t, i, k: (t - i) % k, lambda p, k: True)):
        with pytest.raises(AssertionError) as caught:
            check_systolic_feed(wrong)
        assert "skew" not in str(caught.value)


def test_systolic_feed_other_right_answers():
    import torch.nn.functional as F

    def padded(A, B, t):                    # pad both operands with zeros, then read one diagonal
        (n, k), m = A.shape, B.shape[1]
        Ap, Bp = F.pad(A, (n, n + m)), F.pad(B.T, (m, n + m))
        return (Ap[torch.arange(n), n + t - torch.arange(n)].clone(),
                Bp[torch.arange(m), m + t - torch.arange(m)].clone())
    check_systolic_feed(padded)


# --- property tests: the solutions agree with PyTorch on drawn inputs; messages name drawn mistakes -----------

SHAPES = st.lists(st.integers(0, 4), max_size=3).map(tuple)
POW2_SCALES = st.integers(-6, 3).map(lambda k: 2.0**k)     # x / s and PyTorch's x * (1 / s) are both exact


@settings(max_examples=80)
@given(shape=SHAPES, scale=POW2_SCALES, zp=st.integers(-128, 127), data=st.data())
def test_solution_quantizes_as_pytorch_does(shape, scale, zp, data):
    """Any shape; ties (k + 0.5) * scale, zeros, tiny, huge and infinite values; any zero point."""
    count = math.prod(shape)
    value = st.one_of(st.floats(width=32, allow_nan=False), st.integers(-300, 300).map(lambda k: (k + 0.5) * scale),
                      st.just(0.0), st.floats(-1e-30, 1e-30))
    x = torch.tensor(data.draw(st.lists(value, min_size=count, max_size=count)), dtype=torch.float32).reshape(shape)
    q = NS["quantize_int8"](x, scale, zp)
    ref_q, ref_x = torch_quantized(x, scale, zp, -128, 127)
    assert q.dtype == torch.int8 and torch.equal(q.long(), ref_q)
    back = NS["dequantize_int8"](q, scale, zp)
    assert back.dtype == torch.float32 and torch.allclose(back, ref_x, atol=1e-6)


@settings(max_examples=40)
@given(e=st.integers(2, 7), m=st.integers(0, 7))
def test_solution_float_limits_equal_every_bit_pattern_decoded(e, m):
    assert NS["float_limits"](e, m) == _enumerated_limits(e, m)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e5m2])
def test_solution_float_limits_equal_finfo(dtype):
    fi = torch.finfo(dtype)
    e, m = {torch.float64: (11, 52), torch.float32: (8, 23), torch.float16: (5, 10), torch.bfloat16: (8, 7),
            torch.float8_e5m2: (5, 2)}[dtype]
    assert NS["float_limits"](e, m) == (fi.eps, fi.max, fi.smallest_normal)


@settings(max_examples=60)
@given(n=st.integers(1, 5), k=st.integers(1, 5), m=st.integers(1, 5), integer=st.booleans())
def test_solution_feed_equals_the_library_and_multiplies(n, k, m, integer):
    dtype = torch.int64 if integer else torch.float32
    gen = torch.Generator().manual_seed(n * 100 + k * 10 + m)
    A, B = (torch.randint(-9, 10, shape, generator=gen).to(dtype) for shape in ((n, k), (k, m)))
    for t in range(k + n + m - 2):
        assert all(torch.equal(a, b) for a, b in zip(NS["systolic_feed"](A, B, t), systolic.feed(A, B, t)))
    assert torch.equal(systolic.matmul(A, B, feed=NS["systolic_feed"]).C, A @ B)


# (the element row i reads at cycle t, whether it reads one at cycle t, words the message must hold, must not)
FEED_MISTAKES = {
    "clamped": (lambda t, i, k: min(max(t - i, 0), k - 1), lambda t, i, k: True, "No zero padding", "skew"),
    "modulo": (lambda t, i, k: (t - i) % k, lambda t, i, k: True, "No zero padding", "skew"),
    "no skew": (lambda t, i, k: t, lambda t, i, k: 0 <= t < k, "no skew", "padding"),
    "one late": (lambda t, i, k: t - i - 1, lambda t, i, k: 0 <= t - i - 1 < k, "off by one", "skew"),
}


@settings(max_examples=50)
@given(n=st.integers(1, 5), k=st.integers(1, 5), kind=st.sampled_from(sorted(FEED_MISTAKES)), data=st.data())
def test_feed_messages_name_the_mistake_on_any_shape(n, k, kind, data):
    index, reads, words, never = FEED_MISTAKES[kind]
    i = data.draw(st.integers(0, n - 1))
    A = torch.arange(1.0, n * k + 1).reshape(n, k)
    cycles = range(k + n - 1 + 3)
    seq = [A[i, index(t, i, k)].item() if reads(t, i, k) else 0 for t in cycles]
    right = [A[i, t - i].item() if 0 <= t - i < k else 0 for t in cycles]
    assume(seq != right)
    message = _explain_feed("a_left", seq, i, A, "row")
    assert words in message and never not in message, message
