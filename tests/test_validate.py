import math
import re

import numpy as np
import pytest

from course_lib.validate import (boolean, int_in_range, is_int, is_number, non_negative_int, number_in_range, one_of,
                                 positive_int, positive_number)


def re_repr(value) -> str:
    return re.escape(repr(value))


def test_positive_int_accepts_and_returns():
    assert positive_int("n", 3) == 3
    assert positive_int("limit", None, allow_none=True) is None


@pytest.mark.parametrize("bad", [0, -1, 2.0, "3", True, None])
def test_positive_int_refuses_by_name(bad):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        positive_int("batch_size", bad)


def test_predicates_refuse_bool():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(3) and is_number(2.5) and is_number(np.float32(1)) and not is_number(False) and not is_number("1")


def test_non_negative_int():
    assert non_negative_int("warmup", 0) == 0 and non_negative_int("warmup", 7) == 7
    for bad in (-1, 1.0, True, None, "2"):
        with pytest.raises(ValueError, match=rf"warmup must be a non-negative int; got {bad!r}"):
            non_negative_int("warmup", bad)


def test_int_in_range_names_the_range_and_the_value():
    assert int_in_range("bits", 1, 1, 16) == 1 and int_in_range("bits", 16, 1, 16) == 16
    assert int_in_range("n", 10**9, 1) == 10**9
    assert int_in_range("axis", None, -2, 1, allow_none=True) is None
    for bad in (0, 17, 8.0, True, "8", None):
        with pytest.raises(ValueError, match=rf"bits must be an int in 1\.\.16 \(why\); got {bad!r}"):
            int_in_range("bits", bad, 1, 16, hint=" (why)")
    with pytest.raises(ValueError, match=r"lengths\['a'\] must be an int >= 1; got 0"):
        int_in_range("lengths['a']", 0, 1)
    with pytest.raises(ValueError, match=r"axis must be None or an int in -2\.\.1; got 2"):
        int_in_range("axis", 2, -2, 1, allow_none=True)


@pytest.mark.parametrize("value, lo, hi, kw, ok", [
    (0, 0, 1, {}, True), (1, 0, 1, {}, True), (0.5, 0, 1, {}, True), (np.float64(0.5), 0, 1, {}, True),
    (0, 0, 1, {"lo_open": True}, False), (1, 0, 1, {"hi_open": True}, False), (1.5, 0, 1, {}, False),
    (math.nan, 0, 1, {}, False), (True, 0, 1, {}, False), ("0.5", 0, 1, {}, False), (None, 0, 1, {}, False),
    (math.inf, 0, None, {}, False), (math.inf, 0, None, {"finite": False}, True), (-1e-9, 0, None, {}, False),
])
def test_number_in_range(value, lo, hi, kw, ok):
    if ok:
        assert number_in_range("x", value, lo, hi, **kw) is value
    else:
        with pytest.raises(ValueError, match=rf"^x must be a .*; got {re_repr(value)}$"):
            number_in_range("x", value, lo, hi, **kw)


def test_number_in_range_messages():
    with pytest.raises(ValueError, match=r"^amount must be a fraction in \[0, 1\) \(share\); got 1$"):
        number_in_range("amount", 1, 0, 1, hi_open=True, noun="fraction", hint=" (share)")
    with pytest.raises(ValueError, match=r"^percentile must be a number in \(50, 100\]; got 30$"):
        number_in_range("percentile", 30, 50, 100, lo_open=True)
    with pytest.raises(ValueError, match=r"^alpha must be a finite number >= 0 \(seconds\); got -1$"):
        number_in_range("alpha", -1, 0, hint=" (seconds)")


def test_positive_number():
    assert positive_number("T", 4) == 4 and positive_number("T", 0.5) == 0.5
    assert positive_number("n", math.inf, finite=False) == math.inf
    for bad in (0, -1.0, math.inf, math.nan, True, "4", None):
        with pytest.raises(ValueError, match=r"^T must be a finite number > 0; got "):
            positive_number("T", bad)
    with pytest.raises(ValueError, match=r"^n must be a number > 0 or inf; got 0$"):
        positive_number("n", 0, finite=False, hint=" or inf")


def test_one_of():
    assert one_of("mode", "eval", ("train", "eval")) == "eval"
    assert one_of("stage", 0, [0, 1, 2, 3]) == 0
    with pytest.raises(ValueError, match=r"^mode must be one of \('train', 'eval'\); got 'fast'$"):
        one_of("mode", "fast", ("train", "eval"))
    with pytest.raises(ValueError, match=r"^stage must be one of \[0, 1, 2, 3\] \(0 = DDP\); got True$"):
        one_of("stage", True, [0, 1, 2, 3], hint=" (0 = DDP)")   # True == 1, but it is not a stage
    with pytest.raises(ValueError, match=r"got \['a'\]"):
        one_of("key", ["a"], {"a": 1})                            # unhashable: refused, not a TypeError
    assert one_of("flag", True, (True, False)) is True


def test_boolean():
    assert boolean("signed", False) is False
    for bad in (0, 1, "yes", None):
        with pytest.raises(ValueError, match=rf"^signed must be True or False; got {re_repr(bad)}$"):
            boolean("signed", bad)


def test_float_tensor_names_the_argument_and_what_it_got():
    import torch

    from course_lib.validate import float_tensor
    x = torch.ones(2, dtype=torch.bfloat16)
    assert float_tensor("w", x) is x
    for bad, got in ((torch.ones(2, dtype=torch.int64), "torch.int64"), ([1.0], "list"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"w must be a floating-point torch.Tensor .*; got {got}"):
            float_tensor("w", bad)
