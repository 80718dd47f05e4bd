"""The training steps lectures 01, 03 and 04 put under the profiler: where one step's time goes.

    timeline = trace_seed_steps(mnist_dataset("train"), batch_size=4, images=128)   # lecture 01
    ms_per_image(timeline, 128)          # {"data": ..., "forward": ..., "backward": ..., "optimizer": ..., "other": ...}
    trace_loader_steps(DataLoader(ds, batch_size=64, num_workers=2), steps=6)    # lecture 03: loader stalls
    trace_copy_steps(x, y, get_device(), pinned=True)                              # lecture 04: host->device copies

Each function builds a step, records a few of them with `course_lib.trace.record` and returns the
Timeline; the lecture draws it and writes the Chrome file. The seed's step (01) names its phases
here; 03 and 04 run the course's own loop (`loop.train_epoch`, one batch per step), which names
"copy to device", "forward", "backward" and "optimizer", while a DataLoader names its fetches
"enumerate(DataLoader)#..." by itself.
"""
from __future__ import annotations

import itertools
import warnings

import torch
import torch.nn as nn
from torch.profiler import record_function
from torch.utils.data import DataLoader

from . import loop, trace
from .models import Net
from .tutorial import SeedNet
from .validate import non_negative_int, positive_int

PHASES = ("data", "forward", "backward", "optimizer")
KIND_ORDER = ("data", "copy", "forward", "backward", "optimizer", "other")   # how figures stack them


def forever(loader):
    """Batches from `loader` without end: a new pass (a new epoch) starts when one runs out."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yields no batch (is the dataset smaller than one batch with drop_last?)")


def seed_step(dataset, batch_size: int, lr: float = 0.001, momentum: float = 0.9, seed: int = 0):
    """One step of the seed's loop (SeedNet, CrossEntropyLoss, SGD), its phases named for the profiler.

    The batches come from a DataLoader with num_workers=0, so the per-sample transforms run in the
    traced thread and show up as the "data" phase (the seed's two workers would hide them in other
    processes). Returns step() -> the step's loss (a float).
    """
    positive_int("batch_size", batch_size)
    torch.manual_seed(seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(seed))
    batches = forever(loader)
    net = SeedNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)

    def step() -> float:
        with record_function("data"):
            inputs, labels = next(batches)
        with record_function("forward"):
            loss = criterion(net(inputs), labels)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad()      # the seed zeroes before its next backward: the same thing
        return loss.item()
    return step


def trace_seed_steps(dataset, batch_size: int, images: int = 128, warmup: int = 2, label: str = ""):
    """Record the seed's step on `images` training images (images // batch_size steps): a Timeline.

    The same number of images at every batch size, so timelines drawn on one time axis compare
    the cost of the same work. SeedNet's warning (log_softmax without dim) is silenced here.
    """
    positive_int("images", images)
    positive_int("batch_size", batch_size)
    if images % batch_size:
        raise ValueError(f"images must be a multiple of batch_size={batch_size}; got images={images}")
    step = seed_step(dataset, batch_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trace.record(step, steps=images // batch_size, warmup=warmup, label=label)


def trace_loader_steps(loader, device=None, steps: int = 6, warmup: int = 2, lr: float = 1e-3, label: str = ""):
    """Record `steps` steps of the course loop (`loop.train_epoch`, one batch each) fed by `loader`.

    A DataLoader names each fetch "enumerate(DataLoader)#..." (kind "data"): with num_workers=0 that
    span is the fetch itself, with workers it is the wait for a batch they have not finished. The
    warm-up steps start the workers, so the trace shows the steady state, not the start-up.
    """
    non_negative_int("warmup", warmup)
    device = torch.device(device) if device is not None else torch.device("cpu")
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    batches = forever(loader)

    def step():
        loop.train_epoch(model, itertools.islice(batches, 1), optimizer, device, progress=False)
    try:
        return trace.record(step, steps=steps, warmup=warmup, label=label)
    finally:
        batches.close()      # ends the loader's pass, which stops its worker processes


def trace_copy_steps(x, y, device, pinned: bool = False, batch_size: int = 256, steps: int = 4, warmup: int = 2,
                     label: str = ""):
    """Record `steps` steps of the course loop whose batches start in host memory and move to `device`.

    pinned: the batches sit in page-locked memory, so the loop's `.to(device, non_blocking=True)`
    only queues the copy (a GPU's copy engine does it while the CPU goes on); needs CUDA. From
    pageable memory the copy holds the CPU. On a CPU device the "copy to device" phase is a no-op.
    """
    device = torch.device(device)
    positive_int("batch_size", batch_size)
    if pinned and device.type != "cuda":
        raise ValueError(f"pinned=True needs a CUDA device (pinned memory is for DMA to a GPU); got device={device}")
    if len(x) != len(y) or len(x) < batch_size:
        raise ValueError(f"x and y must hold the same number of samples, at least batch_size={batch_size}; "
                         f"got {len(x)} and {len(y)}")
    host = [(x[i:i + batch_size].contiguous(), y[i:i + batch_size].contiguous())
            for i in range(0, len(x) - batch_size + 1, batch_size)]
    if pinned:
        host = [(a.pin_memory(), b.pin_memory()) for a, b in host]
    batches = itertools.cycle(host)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        loop.train_epoch(model, [next(batches)], optimizer, device, progress=False)
    return trace.record(step, steps=steps, warmup=warmup, label=label)


def main_row(timeline) -> str:
    """The row of the thread that ran the steps (the first; "… · main" after `side_by_side`)."""
    return next(r for r in timeline.rows if r.endswith("main"))


def ms_per_image(timeline, images: int, row: str | None = None) -> dict[str, float]:
    """Milliseconds per image of each kind of work on one row, keyed in KIND_ORDER (0.0 where absent).

    "other" is everything outside the named phases (`loss.item()`, Python between them).
    """
    positive_int("images", images)
    row = row or main_row(timeline)
    spans = [s for s in timeline.spans if s.row == row and s.depth == 0]
    kind = lambda s: s.kind if s.kind in KIND_ORDER else "other"
    return {k: sum(s.dur_us for s in spans if kind(s) == k) / 1e3 / images for k in KIND_ORDER}


def share(timeline, kind: str, row: str | None = None) -> float:
    """Fraction of one row's wall time (first span's start to last span's end) spent in spans of `kind`."""
    row = row or main_row(timeline)
    spans = [s for s in timeline.spans if s.row == row and s.depth == 0]
    if not spans:
        raise ValueError(f"row must be one of {timeline.rows}; got {row!r} (no spans there)")
    wall = max(s.start_us + s.dur_us for s in spans) - min(s.start_us for s in spans)
    return sum(s.dur_us for s in spans if s.kind == kind) / wall if wall > 0 else 0.0


def side_by_side(timelines: dict) -> trace.Timeline:
    """Timelines recorded one after the other, drawn as if they started together: rows "name · thread".

    {"workers=0": t0, "workers=2": t2} -> one Timeline, every input starting at time 0, rows in the
    dict's order: one figure and one Chrome file compare them on the same time axis.
    """
    if not timelines:
        raise ValueError("side_by_side needs at least one {name: Timeline}")
    zeroed = [trace.Timeline(t.spans, t.label, 0, t.rows) for t in timelines.values()]
    return trace.merge(zeroed, names=list(timelines))      # merge keeps the rows in the order given


def draw_ms_per_image(per_image: dict, ax=None, title: str = "time per image, by phase"):
    """Stacked horizontal bars, one per setting: {"batch 4": ms_per_image(...), ...}; returns the axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * len(per_image)))
    colours = trace.COLOURS
    names = list(per_image)
    left = [0.0] * len(names)
    for kind in (k for k in KIND_ORDER if any(per_image[n][k] > 0 for n in names)):
        widths = [per_image[n][kind] for n in names]
        ax.barh(names, widths, left=left, color=colours[kind], label=kind)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("ms per image")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    ax.set_title(title)
    return ax
