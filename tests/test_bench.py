import json
import subprocess
import sys

import pytest

from conftest import needs_mnist
from course_lib import bench


def test_unknown_benchmark_names_the_available_ones(capsys):
    with pytest.raises(ValueError, match="available: allreduce, compression, cpu-mnist, ddp, loader, pipeline, precision, sharding"):
        bench.run_benchmark("nope")
    assert bench.main(["nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err


def test_data_label_and_table():
    assert bench.data_label(5000, 5000) == "5,000 training images (offline stand-in)"
    assert bench.data_label(60000, 60000) == "60,000 training images (full MNIST)"
    assert "subset of the offline stand-in" in bench.data_label(1000, 5000)
    table = bench.format_table([{"a": 1, "bb": "x"}, {"a": 12345, "bb": "yy"}])
    assert table.splitlines()[0].split() == ["a", "bb"] and "12,345" in table


def test_register_adds_a_benchmark(monkeypatch):
    monkeypatch.setattr(bench, "BENCHMARKS", dict(bench.BENCHMARKS))
    bench.register("toy")(lambda data_dir, quick: bench.BenchResult("toy", [{"x": 1}], {"speedup": 2.0}))
    assert bench.run_benchmark("toy").summary == {"speedup": 2.0}


@needs_mnist
def test_loader_benchmark_quick(capsys):
    assert bench.main(["loader", "--quick", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"speedup", "speedup_vs_workers2", "steps_per_second", "baseline_steps_per_second", "data"} <= set(summary)
    assert summary["speedup"] > 1 and summary["speedup_vs_workers2"] > 1
    assert summary["data"].startswith("2,000 training images")


@needs_mnist
def test_cpu_mnist_benchmark_quick_as_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "course_lib.bench", "cpu-mnist", "--quick", "--json"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "course_lib.train" in out and "seed loop" in out  # the table
    summary = json.loads(out.strip().splitlines()[-1])
    assert {"speedup", "test_accuracy", "baseline_test_accuracy", "train_seconds", "baseline_train_seconds",
            "images_per_second", "baseline_images_per_second", "data"} <= set(summary)
    assert summary["speedup"] > 1
    assert 0.5 < summary["test_accuracy"] <= 1 and 0 <= summary["baseline_test_accuracy"] <= 1
    assert summary["train_seconds"] > 0 and summary["baseline_train_seconds"] > 0
    assert summary["data"].startswith("1,000 training images (subset of")
