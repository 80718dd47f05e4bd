"""What every benchmark returns, and how it is printed.

Benchmark modules import from here (never from `course_lib.bench` itself, the registry that
imports them), so the package has no import cycle.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchResult:
    """`rows`: one dict per measured variant (printed as a table); `summary`: the JSON object."""

    title: str
    rows: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def format_table(rows: list) -> str:
    """Rows of dicts with the same keys -> an aligned plain-text table."""
    if not rows:
        return "(no rows)"
    keys = list(rows[0])
    cells = [[f"{r[k]:,}" if isinstance(r[k], int) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))
    return "\n".join([line(keys), line(["-" * w for w in widths])] + [line(c) for c in cells])
