"""Argument checks shared by course_lib: a bad value fails at once, naming the argument."""
from __future__ import annotations


def positive_int(name: str, value, allow_none: bool = False):
    """Return `value` if it is an int > 0 (or None when allowed); else ValueError naming `name`.

    bool is refused although it is an int subclass: `batch_size=True` is a bug, not 1.
    """
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}; got {value!r}")
    return value
