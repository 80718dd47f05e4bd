"""The ring all-reduce schedule: which chunk moves where at each of the 2(N-1) steps.

The tensor is cut into N chunks (torch.tensor_split: sizes differ by at most one element, so any
size works). Rank r only ever sends to (r+1) % N. In the reduce-scatter phase (steps 0..N-2) rank r
sends chunk (r - s) % N and the receiver ADDS it to its own copy; after N-1 steps rank r holds the
full sum of chunk (r+1) % N. In the all-gather phase (N-1 more steps) the finished chunks travel
round the ring and the receiver COPIES them. Each rank sends 2(N-1) chunks = 2(N-1)/N x the tensor,
whatever N is: that is why the ring is bandwidth-optimal.

`collectives.all_reduce_ring` executes exactly this schedule; `plot_ring_step` draws it, and
`ring_stepper` wraps the plot in a slider (logic here, so a notebook stays a one-liner and runs
headless).
"""
from __future__ import annotations

import torch

from ..validate import positive_int

PHASES = ("reduce-scatter", "all-gather")


def ring_schedule(world_size: int) -> list[list[tuple[int, int, int, str]]]:
    """One list per step (2(N-1) steps) of transfers (src, dst, chunk, phase); dst = (src+1) % N."""
    n = positive_int("world_size", world_size)
    steps = []
    for s in range(2 * (n - 1)):
        if s < n - 1:
            steps.append([(r, (r + 1) % n, (r - s) % n, PHASES[0]) for r in range(n)])
        else:
            g = s - (n - 1)
            steps.append([(r, (r + 1) % n, (r + 1 - g) % n, PHASES[1]) for r in range(n)])
    return steps


def ring_state(schedule: list, world_size: int, step: int) -> torch.Tensor:
    """[N ranks, N chunks] ints: how many ranks' data each rank's copy of each chunk holds before `step`.

    Starts as all ones; the all-reduce is done when every entry is N.
    """
    n = positive_int("world_size", world_size)
    if not 0 <= step <= len(schedule):
        raise ValueError(f"step must be in 0..{len(schedule)}; got {step!r}")
    counts = torch.ones(n, n, dtype=torch.int64)
    for transfers in schedule[:step]:
        before = counts.clone()  # all sends of one step happen at once
        for src, dst, chunk, phase in transfers:
            if phase == PHASES[0]:
                counts[dst, chunk] += before[src, chunk]
            else:
                counts[dst, chunk] = before[src, chunk]
    return counts


def plot_ring_step(schedule: list, step: int, ax=None, world_size: int | None = None):
    """Draw the state before `step` (rows: ranks, columns: chunks, number = ranks summed in) and its sends."""
    import matplotlib.pyplot as plt

    n = world_size or (len(schedule) // 2 + 1)
    counts = ring_state(schedule, n, step)
    ax = ax or plt.subplots(figsize=(1.2 * n + 2, 1.0 * n + 1))[1]
    ax.imshow(counts.numpy(), cmap="Blues", vmin=0, vmax=n + 1)
    for r in range(n):
        for c in range(n):
            ax.text(c, r, int(counts[r, c]), ha="center", va="center", color="black")
    if step < len(schedule):
        for src, dst, chunk, phase in schedule[step]:
            ax.annotate("", xy=(chunk + 0.25, dst), xytext=(chunk + 0.25, src),
                        arrowprops=dict(arrowstyle="->", color="red" if phase == PHASES[0] else "green",
                                        connectionstyle="arc3,rad=0.4"))
        title = f"step {step + 1}/{len(schedule)}: {schedule[step][0][3]}"
    else:
        title = "done: every rank holds the full sum"
    ax.set(title=title, xlabel="chunk", ylabel="rank", xticks=range(n), yticks=range(n))
    return ax


def ring_stepper(world_size: int = 4):
    """An ipywidgets slider over the 2(N-1) steps of `ring_schedule(world_size)` (its first step on a static page)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    from ..show import interactive

    schedule = ring_schedule(world_size)

    def show(step=0):
        plot_ring_step(schedule, step, world_size=world_size)
        plt.show()

    return interactive(show, step=widgets.IntSlider(value=0, min=0, max=len(schedule),
                                                 description="step"))
