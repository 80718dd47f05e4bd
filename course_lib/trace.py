"""Where a step's time goes: record a few steps with `torch.profiler`, draw them as a timeline, export for Perfetto.

    timeline = record(step, steps=3, label="batch 64, 5k stand-in")   # step() runs one training step
    timeline.draw()                         # one row per thread (per rank and thread after merge)
    timeline.save_chrome("step.json")       # open in https://ui.perfetto.dev or chrome://tracing

Only the outermost event of each thread is kept (a `record_function("forward")` block, not the aten ops
inside it), plus every collective and host<->device copy at any depth: a timeline a class can read.
In a multi-process run each rank records its own `Timeline`, returns it, and `merge` lays them on one
clock (the profiler's wall-clock start), so an all-reduce on rank 1 lines up with rank 0's backward.
"""
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from .checkpoint import atomic_write_bytes
from .validate import positive_int


# What a span is, from its name: the first rule that matches wins. Colours are shared by every lecture.
KINDS = {
    "forward": ("forward", "#4C72B0"), "backward": ("backward", "#DD8452"), "optimizer": ("optimizer", "#55A868"),
    "data": ("data", "#8172B3"), "enumerate(DataLoader)": ("data", "#8172B3"), "comm": ("comm", "#C44E52"),
    "copy": ("copy", "#937860"), "cast": ("cast", "#DA8BC3"),
}
COMM_WORDS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "broadcast", "send", "recv",
              "barrier", "gloo:", "nccl:", "c10d::", "record_param_comms")
COPY_WORDS = ("Memcpy", "cudaMemcpy", "pin_memory", "aten::_to_copy", "aten::copy_")
DEEP_COPIES = ("Memcpy", "cudaMemcpy", "pin_memory")     # kept below the top level (aten::copy_ is everywhere)
OTHER = ("other", "#BBBBBB")
COLOURS = {kind: colour for kind, colour in KINDS.values()} | {OTHER[0]: OTHER[1]}    # kind -> colour


def kind_of(name: str) -> str:
    """forward / backward / optimizer / data / comm / copy / cast / other, from an event's name."""
    low = name.lower()
    if "copy_out" in low or "copy_in" in low:      # FSDP::all_gather_copy_out: a local copy around a collective
        return "copy"
    if any(w.lower() in low for w in COMM_WORDS):
        return "comm"
    for key, (kind, _) in KINDS.items():
        if low.startswith(key.lower()):
            return kind
    if "autocast" in low or low.startswith("cast"):
        return "cast"
    if any(w.lower() in low for w in COPY_WORDS):
        return "copy"
    return "other"


@dataclass
class Span:
    name: str
    row: str           # "main", "thread 3", or "rank 1 · main" after merge
    start_us: float    # microseconds since the timeline's start
    dur_us: float
    kind: str
    depth: int = 0     # 0: the thread's outermost event; 1: kept from inside one (drawn as a thin bar over it)


@dataclass
class Timeline:
    spans: list[Span]
    label: str = ""            # what was measured, on which data: printed in the title and the trace file
    start_ns: int = 0          # wall clock of the profiler's start, to line up ranks
    rows: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.rows:
            self.rows = sorted({s.row for s in self.spans}, key=_row_order)

    def total_ms(self, kind: str | None = None, name: str | None = None, row: str | None = None) -> float:
        """Summed duration (ms) of the spans of one kind / name / row (None: any)."""
        return sum(s.dur_us for s in self._select(kind, name, row)) / 1e3

    def overlap_ms(self, kind_a: str, kind_b: str) -> float:
        """Time (ms) during which some `kind_a` span and some `kind_b` span run at once, on any rows."""
        return _measure(_intersect(_union(self._select(kind_a)), _union(self._select(kind_b)))) / 1e3

    def names(self) -> set[str]:
        return {s.name for s in self.spans}

    def draw(self, ax=None, title: str | None = None):
        """A Gantt chart: one row per thread/rank, one colour per kind of work; returns the axes."""
        import matplotlib.pyplot as plt
        if ax is None:
            _, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * max(len(self.rows), 1)))
        colours = COLOURS
        for y, row in enumerate(self.rows):
            for kind, colour in colours.items():
                for depth, (top, height) in enumerate(((-0.38, 0.76), (0.02, 0.36))):
                    bars = [(s.start_us / 1e3, s.dur_us / 1e3) for s in self.spans
                            if s.row == row and s.kind == kind and min(s.depth, 1) == depth]
                    if bars:
                        ax.broken_barh(bars, (y + top, height), facecolors=colour, edgecolor="white", linewidth=0.3)
        ax.set_yticks(range(len(self.rows)), self.rows)
        ax.set_ylim(len(self.rows) - 0.5, -0.5)
        ax.set_xlabel("time (ms)")
        used = [k for k in colours if any(s.kind == k for s in self.spans)]
        ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in used], labels=used,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
        ax.set_title(title or self.label or "profiler timeline")
        return ax

    def save_chrome(self, path) -> Path:
        """Write a Chrome trace (JSON, microseconds): Perfetto and chrome://tracing open it. Atomic."""
        pids = {}
        events = []
        for s in self.spans:
            process, _, thread = s.row.rpartition(" · ")
            pid = pids.setdefault(process or "process", len(pids))
            events.append({"name": s.name, "cat": s.kind, "ph": "X", "ts": round(s.start_us, 3),
                           "dur": round(s.dur_us, 3), "pid": pid, "tid": thread})
        events += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
                   for name, pid in pids.items()]
        data = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"label": self.label}}
        path = Path(path)
        atomic_write_bytes(path, json.dumps(data).encode())
        return path

    def _select(self, kind=None, name=None, row=None):
        return [s for s in self.spans if (kind is None or s.kind == kind) and (name is None or s.name == name)
                and (row is None or s.row == row)]


def record(step, steps: int = 3, warmup: int = 1, label: str = "", keep=None) -> Timeline:
    """Run `step()` `warmup` times untraced (first-call costs), then `steps` times under the profiler.

    keep(name) -> bool: events to keep below the top level (default: collectives and device copies).
    """
    positive_int("steps", steps)
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0 (untraced steps before recording), got {warmup!r}")
    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities)
    with _quiet_stderr():
        prof.start()
    try:
        for _ in range(steps):
            step()
    finally:
        with _quiet_stderr():
            prof.stop()
    return from_profile(prof, label=label, keep=keep)


@contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 while the profiler starts and stops: its C++ side prints status lines there
    ("profiler_start", a failed GPU query on a CPU machine) that a kernel would show under the cell."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def from_profile(prof, label: str = "", keep=None) -> Timeline:
    """A Timeline from a finished `torch.profiler.profile`: outermost events per thread + kept inner ones."""
    keep = keep or (lambda name: kind_of(name) == "comm" or any(w in name for w in DEEP_COPIES))
    events = [e for e in prof.events() if e.time_range.end > e.time_range.start]
    threads = sorted({e.thread for e in events if e.device_type == torch.autograd.DeviceType.CPU})
    main = min(threads, key=lambda t: -sum(1 for e in events if e.thread == t)) if threads else None
    spans = []
    for e in events:
        on_cpu = e.device_type == torch.autograd.DeviceType.CPU
        if not ((on_cpu and e.cpu_parent is None) or keep(e.name) or not on_cpu):
            continue
        if on_cpu and e.cpu_parent is not None and keep(e.cpu_parent.name) and kind_of(e.name) == kind_of(
                e.cpu_parent.name):
            continue    # an all-reduce inside an all-reduce: draw the outer one
        row = ("main" if e.thread == main else f"thread {e.thread}") if on_cpu else f"gpu stream {e.thread}"
        spans.append(Span(e.name, row, e.time_range.start, e.time_range.end - e.time_range.start, kind_of(e.name),
                          depth=int(on_cpu and e.cpu_parent is not None)))
    start_ns = int(prof.profiler.kineto_results.trace_start_ns())
    return Timeline(spans, label=label, start_ns=start_ns)


def merge(timelines: list, names=None) -> Timeline:
    """Ranks' timelines on one clock: rows become "rank r · thread" (or "NAME · thread"), in the order given;
    time 0 is the earliest start."""
    if not timelines:
        raise ValueError("merge needs at least one Timeline (one per rank)")
    names = names or [f"rank {r}" for r in range(len(timelines))]
    t0 = min(t.start_ns for t in timelines)
    spans = [Span(s.name, f"{who} · {s.row}", s.start_us + (t.start_ns - t0) / 1e3, s.dur_us, s.kind, s.depth)
             for who, t in zip(names, timelines) for s in t.spans]
    labels = {t.label for t in timelines if t.label}
    rows = [f"{who} · {row}" for who, t in zip(names, timelines) for row in t.rows]
    return Timeline(spans, label=" / ".join(sorted(labels)), start_ns=t0, rows=rows)


def _row_order(row: str):
    """rank 0 before rank 1; within a rank the main thread first."""
    who, _, thread = row.rpartition(" · ")
    number = int(who.split()[-1]) if who.split() and who.split()[-1].isdigit() else -1
    return (number, thread != "main", thread)


def _union(spans) -> list[tuple[float, float]]:
    merged = []
    for start, end in sorted((s.start_us, s.start_us + s.dur_us) for s in spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(a, b) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _measure(intervals) -> float:
    return sum(end - start for start, end in intervals)
