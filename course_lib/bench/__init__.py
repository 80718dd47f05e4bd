"""Benchmarks that measure a course technique against its baseline side by side, in one run.

    python -m course_lib.bench cpu-mnist          # course_lib's default training vs the seed's loop
    python -m course_lib.bench loader --json      # TensorLoader vs DataLoader; last line is JSON
    python -m course_lib.bench loader --quick     # fewer samples (what the tests run)
    python -m course_lib.bench lectures --data-dir ../shared/data-full   # the classroom clock, per lecture

Ratios, never absolute times, are the result: both sides run on the same machine in the same
process, so a slow or busy laptop changes both.

Adding a benchmark takes one module and one line:
1. `course_lib/bench/<name>.py` with `run(data_dir=None, quick=False) -> BenchResult`, importing
   `BenchResult` (and `format_table`) from `.result`, never from `course_lib.bench` (this module
   imports the benchmarks, so that would be an import cycle);
2. a line `"<name>": Benchmark(".<name>", "one-line description"),` in BENCHMARKS below.
A benchmark's module is imported only when it runs, so listing them costs nothing.
"""
from __future__ import annotations

import importlib
from typing import NamedTuple

from .result import BenchResult, format_table

__all__ = ["BENCHMARKS", "BenchResult", "Benchmark", "format_table", "main", "run_benchmark"]


class Benchmark(NamedTuple):
    """Where a benchmark's `run` lives (a module, relative to this package or absolute) and what it measures."""

    module: str
    description: str

    def load(self):
        """The benchmark's module (imported now, on first use)."""
        return importlib.import_module(self.module, __name__)


BENCHMARKS: dict[str, Benchmark] = {
    "cpu-mnist": Benchmark(".cpu_mnist", "python -m course_lib.train's defaults vs the seed's batch-4 loop: images/s"),
    "loader": Benchmark(".loader", "TensorLoader vs DataLoader (0 and 2 workers) over one epoch: steps/s"),
    "allreduce": Benchmark(".allreduce", "our ring all-reduce vs dist.all_reduce (gloo) on 2 ranks, with α-β fits"),
    "ddp": Benchmark(".ddp", "torch DDP scaling 1 -> 2 ranks, and BucketedDDP overlap vs FlatDDP"),
    "pipeline": Benchmark(".pipeline", "GPipe on 2 CPU processes: measured efficiency vs the bubble model"),
    "sharding": Benchmark(".sharding", "per-rank optimizer state under ZeRO-1 and parameters under FSDP2, 2 ranks"),
    "precision": Benchmark(".precision", "bf16 autocast training of Net vs fp32: accuracy and speed"),
    "gpu-fast": Benchmark(".gpu_fast", "GPU recipe, one ingredient per row up to CUDA graphs: fastest, time to 98.5%"),
    "compression": Benchmark(".compression", "Deep Compression, int8 inference and structured pruning vs fp32"),
    "grading": Benchmark(".grading", "a class of exercise-07 submissions graded with --jobs 1 vs 2: s per submission"),
    "transformer": Benchmark(".transformer", "bytes per rank of TP, SP, CP and EP on 2 and 4 ranks vs their formulas"),
    "simulate": Benchmark(".simulate", "course_lib.simulate's replay vs the measured DDP step on 2 and 4 ranks: error"),
    "lectures": Benchmark(".lectures", "every lecture notebook top to bottom in a fresh kernel: seconds each (slot 120 s)"),
}


def run_benchmark(name: str, data_dir=None, quick: bool = False) -> BenchResult:
    """Run the benchmark registered as `name` (one of BENCHMARKS)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; available: {', '.join(sorted(BENCHMARKS))}")
    return BENCHMARKS[name].load().run(data_dir=data_dir, quick=quick)


def main(argv=None) -> int:
    """The command line (`python -m course_lib.bench`); see `course_lib.bench.__main__`."""
    from .__main__ import main as cli

    return cli(argv)
