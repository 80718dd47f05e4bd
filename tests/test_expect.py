"""course_lib.expect.in_range: a figure shown against its quiet-machine range, never an exception."""
import math

import pytest

from course_lib.expect import in_range


def lines(*args, **kwargs):
    out = []
    return in_range(*args, out=out.append, **kwargs), out


def test_inside_the_range_is_a_tick_with_the_range():
    ok, out = lines("speedup", 12.1, 5, 20, unit="x")
    assert ok and out == ["\u2714 speedup: 12.1x (a quiet machine gives 5x–20x)"]


@pytest.mark.parametrize("value", [2.0, 25.0, math.nan, None, "fast"])
def test_outside_or_not_a_number_is_a_note_not_an_error(value):
    ok, out = lines("speedup", value, 5, 20, unit="x", bench="cpu-mnist")
    assert not ok and out[0].startswith("note: speedup is ")
    assert "python -m course_lib.bench cpu-mnist" in out[0]


def test_one_sided_ranges():
    assert lines("fit error", 0.2, hi=0.5)[0] and "<= 0.5" in lines("fit error", 0.2, hi=0.5)[1][0]
    assert not lines("rate", 1.0, lo=3)[0]


@pytest.mark.parametrize("kwargs,message", [({}, "needs lo, hi"), ({"lo": 3, "hi": 1}, "lo must be <= hi"),
                                            ({"lo": "1"}, "lo must be a number")])
def test_a_call_without_sense_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        in_range("x", 1.0, **kwargs)
