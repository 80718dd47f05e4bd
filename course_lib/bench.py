"""Benchmarks that measure a course technique against its baseline side by side, in one run.

    python -m course_lib.bench cpu-mnist          # course_lib's default training vs the seed's loop
    python -m course_lib.bench loader --json      # TensorLoader vs DataLoader; last line is JSON
    python -m course_lib.bench loader --quick     # fewer samples (what the tests run)

Ratios, never absolute times, are the result: both sides run on the same machine in the same
process, so a slow or busy laptop changes both. Add a benchmark by decorating a function
`fn(data_dir, quick) -> BenchResult` with `@register("name")`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field

import torch

BENCHMARKS: dict = {}
STAND_IN_TRAIN_SIZE, FULL_MNIST_TRAIN_SIZE = 5000, 60000


@dataclass
class BenchResult:
    """`rows`: one dict per measured variant (printed as a table); `summary`: the JSON object."""

    title: str
    rows: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def register(name: str):
    """Decorator: make `fn(data_dir, quick) -> BenchResult` runnable as `python -m course_lib.bench name`."""
    def add(fn):
        BENCHMARKS[name] = fn
        return fn
    return add


def data_label(n_used: int, n_split: int) -> str:
    """Say which training data a figure comes from: stand-in figures are lower than full MNIST's."""
    source = {STAND_IN_TRAIN_SIZE: "offline stand-in", FULL_MNIST_TRAIN_SIZE: "full MNIST"}.get(
        n_split, f"MNIST training split of {n_split:,}")
    if n_used < n_split:
        return f"{n_used:,} training images (subset of the {source})"
    return f"{n_used:,} training images ({source})"


def _train_split_size(data_dir) -> int:
    from .data import mnist_dataset

    return len(mnist_dataset("train", data_dir, transform=None))


@register("cpu-mnist")
def cpu_mnist(data_dir=None, quick: bool = False) -> BenchResult:
    """`python -m course_lib.train` with its defaults (batch 64, Adam, TensorLoader) vs `seed_train`
    (batch 4, SGD, DataLoader with 2 workers, 2 epochs), on the same data; ratio of images/s."""
    from . import train
    from .seed import seed_train

    subset = 1000 if quick else None
    argv = ["--no-progress"] + (["--data-dir", str(data_dir)] if data_dir else [])
    argv += ["--train-subset", str(subset), "--epochs", "2"] if quick else []
    seed_epochs = 1 if quick else 2

    print(f"== seed loop: batch 4, SGD lr 0.001, DataLoader(num_workers=2), {seed_epochs} epoch(s)")
    seed = seed_train(data_dir, epochs=seed_epochs, train_subset=subset, log_every=500)
    print("== course_lib: python -m course_lib.train " + " ".join(argv))
    ours = train.run(train.build_parser().parse_args(argv))

    n_split = _train_split_size(data_dir)
    n_used = ours["train_samples"]
    base_rate = seed.mean_images_per_second
    rows = [
        {"run": "seed loop", "batch": 4, "optimizer": "sgd", "epochs": seed_epochs,
         "train s": round(seed.train_seconds, 1), "images/s": round(base_rate),
         "test acc": round(seed.val_accuracy[-1], 4)},
        {"run": "course_lib.train", "batch": ours["batch_size"], "optimizer": ours["optimizer"],
         "epochs": ours["epochs_run"], "train s": ours["train_seconds"], "images/s": round(ours["images_per_second"]),
         "test acc": ours["test_accuracy"]},
    ]
    summary = {
        "benchmark": "cpu-mnist",
        "speedup": round(ours["images_per_second"] / base_rate, 2),
        "test_accuracy": ours["test_accuracy"],
        "baseline_test_accuracy": round(seed.val_accuracy[-1], 6),
        "train_seconds": ours["train_seconds"],
        "baseline_train_seconds": round(seed.train_seconds, 3),
        "images_per_second": ours["images_per_second"],
        "baseline_images_per_second": round(base_rate, 1),
        "epochs": ours["epochs_run"], "baseline_epochs": seed_epochs,
        "data": data_label(n_used, n_split),
        "device": ours["device"], "torch_threads": torch.get_num_threads(), "quick": quick,
    }
    return BenchResult(f"cpu-mnist on {summary['data']}", rows, summary)


def _steps_per_second(loader) -> tuple[int, float]:
    """Iterate one epoch of `loader` (no model); return (steps, seconds)."""
    t0 = time.perf_counter()
    steps = sum(1 for _ in loader)
    return steps, time.perf_counter() - t0


@register("loader")
def loader(data_dir=None, quick: bool = False) -> BenchResult:
    """One epoch of batches (64) from TensorLoader vs DataLoader over per-sample
    ToTensor/Normalize with 0 and 2 workers; ratio of steps/s."""
    from torch.utils.data import DataLoader, Subset

    from .data import TensorLoader, load_tensors, mnist_dataset

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
        "data": data_label(len(x), _train_split_size(data_dir)),
        "quick": quick,
    }
    return BenchResult(f"loader on {summary['data']} (TensorLoader's one-time load: {load_seconds:.2f} s, "
                       "not counted)", rows, summary)


@register("allreduce")
def allreduce(data_dir=None, quick: bool = False) -> BenchResult:
    """Our from-scratch ring all-reduce vs dist.all_reduce (gloo) on 2 ranks, 1 KB-64 MB, with alpha-beta fits."""
    from .distributed.bench_allreduce import allreduce_bench

    return allreduce_bench(data_dir, quick)


@register("ddp")
def ddp(data_dir=None, quick: bool = False) -> BenchResult:
    """torch DDP scaling 1 -> 2 ranks (Net, batch 128/rank) and BucketedDDP overlap vs FlatDDP (wide MLP)."""
    from .distributed.bench_ddp import run

    return run(quick)


@register("pipeline")
def pipeline(data_dir=None, quick: bool = False) -> BenchResult:
    """GPipe on K=2 CPU processes: measured efficiency against the bubble model M/(M+K-1)."""
    from .distributed.bench_pipeline import run

    return run(quick)


@register("sharding")
def sharding(data_dir=None, quick: bool = False) -> BenchResult:
    """Per-rank optimizer state under ZeRO-1 and per-rank parameter bytes under FSDP2, 2 ranks vs 1."""
    from .distributed.bench_sharding import run

    return run(quick)


@register("precision")
def precision(data_dir=None, quick: bool = False) -> BenchResult:
    """bf16 autocast training of Net against fp32 on the same data: accuracy and speed."""
    from .bench_precision import run

    return run(data_dir, quick)


@register("compression")
def compression(data_dir=None, quick: bool = False) -> BenchResult:
    """Deep Compression of LeNet-300-100 and LeNet-5, int8 inference and structured pruning against fp32."""
    from .compression.bench_compression import run

    return run(data_dir, quick)


def run_benchmark(name: str, data_dir=None, quick: bool = False) -> BenchResult:
    """Run the benchmark registered as `name` (one of BENCHMARKS)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; available: {', '.join(sorted(BENCHMARKS))}")
    return BENCHMARKS[name](data_dir=data_dir, quick=quick)


def format_table(rows: list) -> str:
    """Rows of dicts with the same keys -> an aligned plain-text table."""
    if not rows:
        return "(no rows)"
    keys = list(rows[0])
    cells = [[f"{r[k]:,}" if isinstance(r[k], int) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))
    return "\n".join([line(keys), line(["-" * w for w in widths])] + [line(c) for c in cells])


def main(argv=None) -> int:
    from .data import MNISTNotFoundError

    p = argparse.ArgumentParser(prog="python -m course_lib.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("name", help=f"which benchmark: {', '.join(sorted(BENCHMARKS))}")
    p.add_argument("--data-dir", default=None, help="MNIST root (default: $COURSE_DATA_DIR, else data/)")
    p.add_argument("--quick", action="store_true", help="fewer samples and epochs (for tests)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    args = p.parse_args(argv)
    try:
        result = run_benchmark(args.name, args.data_dir, args.quick)
    except (ValueError, MNISTNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"\n{result.title}\n{format_table(result.rows)}")
    if "speedup" in result.summary:
        extra = (f", {result.summary['speedup_vs_workers2']}x vs 2 workers"
                 if "speedup_vs_workers2" in result.summary else "")
        print(f"speedup: {result.summary['speedup']}x{extra}")
    if args.json:
        print(json.dumps(result.summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
