"""One epoch of batches from TensorLoader against DataLoader, with no model in the loop.

    python -m course_lib.bench loader --json      # TensorLoader vs DataLoader; last line is JSON
    python -m course_lib.bench loader --quick     # 2,000 samples (what the tests run)

Batches of 64: TensorLoader over tensors loaded once (that load is reported, not counted) vs
DataLoader over per-sample ToTensor/Normalize with 0 and 2 workers; the result is the ratio of steps/s.
"""
from __future__ import annotations

import time

from torch.utils.data import DataLoader, Subset

from ..data import TensorLoader, data_label, load_tensors, mnist_dataset, train_split_size
from .result import BenchResult


def _steps_per_second(loader) -> tuple[int, float]:
    """Iterate one epoch of `loader` (no model); return (steps, seconds)."""
    t0 = time.perf_counter()
    steps = sum(1 for _ in loader)
    return steps, time.perf_counter() - t0


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """Time one epoch of each loader; ratios of steps/s against DataLoader with 0 and 2 workers."""
    batch_size, limit = 64, (2000 if quick else None)
    t0 = time.perf_counter()
    x, y = load_tensors("train", data_dir, limit)
    load_seconds = time.perf_counter() - t0
    dataset = mnist_dataset("train", data_dir)
    if limit is not None:
        dataset = Subset(dataset, range(min(limit, len(dataset))))

    variants = [("TensorLoader", 0, TensorLoader(x, y, batch_size=batch_size, shuffle=True))]
    variants += [("DataLoader", w, DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=w))
                 for w in (0, 2)]
    rows, rate = [], {}
    for name, workers, batches in variants:
        steps, seconds = _steps_per_second(batches)
        rate[(name, workers)] = steps / seconds
        rows.append({"loader": name, "workers": workers, "batch": batch_size, "steps": steps,
                     "seconds": round(seconds, 3), "steps/s": round(steps / seconds, 1),
                     "images/s": round(len(x) / seconds)})
    tensor_rate = rate[("TensorLoader", 0)]
    summary = {
        "benchmark": "loader",
        "speedup": round(tensor_rate / rate[("DataLoader", 0)], 2),
        "speedup_vs_workers2": round(tensor_rate / rate[("DataLoader", 2)], 2),
        "steps_per_second": round(tensor_rate, 1),
        "baseline_steps_per_second": round(rate[("DataLoader", 0)], 1),
        "workers2_steps_per_second": round(rate[("DataLoader", 2)], 1),
        "tensor_load_seconds": round(load_seconds, 3),
        "batch_size": batch_size,
        "data": data_label(len(x), train_split_size(data_dir), data_dir),
        "quick": quick,
    }
    return BenchResult(f"loader on {summary['data']} (TensorLoader's one-time load: {load_seconds:.2f} s, "
                       "not counted)", rows, summary)
