"""Show a measured figure against the range a quiet machine gives, and never fail a lecture on it.

    from course_lib.expect import in_range
    in_range("speedup over the seed loop", speedup, 5, 20, unit="x", bench="cpu-mnist")

Timings, throughputs, speedups, fitted errors and scaling efficiencies depend on what else the
machine is doing; a lecture prints them with the range a quiet machine gives and, outside it, a
note that says why and how to measure properly (a benchmark on a quiet machine). Lectures assert
only on what is deterministic (equality with PyTorch's own, counts, shapes, seeded accuracies).
"""
from __future__ import annotations

import math

from .validate import is_number


def in_range(what: str, value, lo=None, hi=None, *, unit: str = "", bench: str | None = None,
             digits: int = 3, out=print) -> bool:
    """Print `what` = `value` and whether it lies in [lo, hi] (either end may be None); return that.

    Outside the range the line says the machine was probably busy and, with `bench`, names the
    benchmark that measures it side by side (`python -m course_lib.bench NAME`). Never raises on a
    value: only on a call that makes no sense (no bound, or lo > hi).
    """
    if lo is None and hi is None:
        raise ValueError("in_range needs lo, hi or both")
    for name, bound in (("lo", lo), ("hi", hi)):
        if bound is not None and not is_number(bound):
            raise ValueError(f"{name} must be a number or None; got {bound!r}")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"lo must be <= hi; got {lo!r} > {hi!r}")
    fmt = lambda v: f"{v:.{digits}g}{unit}"
    expected = (f"{fmt(lo)}–{fmt(hi)}" if lo is not None and hi is not None
                else f">= {fmt(lo)}" if lo is not None else f"<= {fmt(hi)}")
    ok = is_number(value) and not math.isnan(value) and (lo is None or value >= lo) and (hi is None or value <= hi)
    shown = fmt(value) if is_number(value) else repr(value)
    if ok:
        out(f"\u2714 {what}: {shown} (a quiet machine gives {expected})")
    else:
        how = f"; `python -m course_lib.bench {bench}` on a quiet machine measures it side by side" if bench else ""
        out(f"note: {what} is {shown}, outside the {expected} a quiet machine gives. Timings move when other "
            f"programs share the cores (a busy laptop, a shared CI machine){how}.")
    return ok
