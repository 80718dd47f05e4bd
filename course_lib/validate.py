"""Argument checks shared by course_lib: a bad value fails at once, naming the argument.

Each check returns the value unchanged, or raises ValueError whose message names the argument,
what is allowed and what was given:

    positive_int("batch_size", 0)          # batch_size must be a positive int; got 0
    int_in_range("bits", 17, 1, 16)        # bits must be an int in 1..16; got 17
    number_in_range("overlap", 2, 0, 1)    # overlap must be a number in [0, 1]; got 2
    one_of("mode", "fast", ("a", "b"))     # mode must be one of ('a', 'b'); got 'fast'

bool is refused wherever a number is expected, although it is an int subclass:
`batch_size=True` is a bug, not 1.
"""
from __future__ import annotations

import math
import numbers


def is_int(value) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number (int, float, numpy scalar) that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(name: str, value, allow_none: bool = False):
    """Return `value` if it is an int > 0 (or None when allowed); else ValueError naming `name`."""
    if value is None and allow_none:
        return value
    if not is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}; got {value!r}")
    return value


def non_negative_int(name: str, value):
    """Return `value` if it is an int >= 0; else ValueError naming `name`."""
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative int; got {value!r}")
    return value


def int_in_range(name: str, value, lo: int, hi: int | None = None, *, hint: str = "", allow_none: bool = False):
    """Return `value` if it is an int in lo..hi (both included; hi=None: no upper bound), or None
    when allowed; else ValueError naming `name`, the range, then `hint` (e.g. " for shape (3, 4)")."""
    if value is None and allow_none:
        return value
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ValueError(f"{name} must be {'None or ' if allow_none else ''}an int {bounds}{hint}; got {value!r}")
    return value


def number_in_range(name: str, value, lo: float, hi: float | None = None, *, lo_open: bool = False,
                    hi_open: bool = False, finite: bool = True, noun: str = "number", hint: str = ""):
    """Return `value` if it is a real number (not bool) in the interval from lo to hi; else
    ValueError naming `name`, the interval, then `hint`.

    lo_open / hi_open exclude the bound itself: [lo, hi], (lo, hi], [lo, hi), (lo, hi).
    hi=None: no upper bound; then `finite` refuses inf (NaN is always refused).
    noun: what the message calls the value ("fraction" reads better for a share in [0, 1]).
    """
    ok = is_number(value) and (value > lo if lo_open else value >= lo)
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    elif ok:
        ok = not finite or math.isfinite(value)
    if not ok:
        if hi is None:
            where = f"{'finite ' if finite else ''}{noun} {'>' if lo_open else '>='} {lo:g}"
        else:
            where = f"{noun} in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise ValueError(f"{name} must be a {where}{hint}; got {value!r}")
    return value


def positive_number(name: str, value, *, finite: bool = True, hint: str = ""):
    """Return `value` if it is a real number > 0 (and finite unless finite=False); else ValueError."""
    return number_in_range(name, value, 0, lo_open=True, finite=finite, hint=hint)


def one_of(name: str, value, allowed, *, hint: str = ""):
    """Return `value` if it is one of `allowed` (shown as given: pass a tuple or list to print);
    else ValueError naming `name`, `allowed`, then `hint`. True/False do not stand in for 1/0."""
    try:
        ok = value in allowed and (not isinstance(value, bool) or any(a is value for a in allowed))
    except (TypeError, ValueError, RuntimeError):   # unhashable for a dict/set; an array's ambiguous ==
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {allowed}{hint}; got {value!r}")
    return value


def float_tensor(name: str, value):
    """Return `value` if it is a floating-point torch.Tensor; else TypeError naming `name` and what it got."""
    import torch
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"{name} must be a floating-point torch.Tensor (float16/bfloat16/float32/float64); "
                        f"got {kind}")
    return value


def boolean(name: str, value) -> bool:
    """Return `value` if it is True or False (not 0/1, not a string); else ValueError naming `name`."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value
