import ast
import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
import types

import pytest
import torch

from conftest import fake_mnist, needs_mnist
from course_lib import bench
from course_lib.bench import gpu_fast
from course_lib.data import MNIST_TRAIN_CLASS_COUNTS, data_label


def test_unknown_benchmark_names_the_available_ones(capsys):
    with pytest.raises(ValueError, match="available: allreduce, compression, cpu-mnist, ddp, gpu-fast, grading, lectures, loader, pipeline, precision, sharding"):
        bench.run_benchmark("nope")
    assert bench.main(["nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err


def test_data_label_names_the_set_by_its_digit_counts_not_its_size(tmp_path):
    mnist = torch.repeat_interleave(torch.arange(10), torch.tensor(MNIST_TRAIN_CLASS_COUNTS))
    sets = {"real": mnist, "5k": torch.arange(5000) % 10, "60k": torch.arange(60000) % 10,
            "odd": torch.arange(60000) % 7}
    roots = {name: fake_mnist(tmp_path / name, labels) for name, labels in sets.items()}
    assert data_label(60000, 60000, roots["real"]) == "60,000 training images (full MNIST)"
    assert data_label(5000, 5000, roots["5k"]) == "5,000 training images (offline 5k stand-in)"
    shifted = data_label(60000, 60000, roots["60k"])
    assert "full MNIST" not in shifted and "not accuracy" in shifted      # same size as MNIST, not MNIST
    assert data_label(1000, 60000, roots["odd"]) == ("1,000 of the 60,000 training images "
                                                     "(an MNIST-format set, not MNIST (its digit counts differ))")
    assert data_label(1000, 5000, roots["5k"]) == "1,000 of the 5,000 training images (offline 5k stand-in)"


def test_format_table():
    table = bench.format_table([{"a": 1, "bb": "x"}, {"a": 12345, "bb": "yy"}])
    assert table.splitlines()[0].split() == ["a", "bb"] and "12,345" in table


def test_one_registry_line_adds_a_benchmark(monkeypatch):
    toy = types.ModuleType("toy_bench")
    toy.run = lambda data_dir=None, quick=False: bench.BenchResult("toy", [{"x": 1}], {"speedup": 2.0, "quick": quick})
    monkeypatch.setitem(sys.modules, "toy_bench", toy)
    monkeypatch.setitem(bench.BENCHMARKS, "toy", bench.Benchmark("toy_bench", "a toy"))
    assert bench.run_benchmark("toy", quick=True).summary == {"speedup": 2.0, "quick": True}


@pytest.mark.parametrize("name", sorted(bench.BENCHMARKS))
def test_every_registered_benchmark_imports_and_has_run(name):
    entry = bench.BENCHMARKS[name]
    assert entry.description and "\n" not in entry.description
    module = entry.load()
    assert module.__name__ == f"course_lib.bench.{name.replace('-', '_')}"
    params = inspect.signature(module.run).parameters
    assert [(p.name, p.default) for p in params.values()] == [("data_dir", None), ("quick", False)]


def _package_imports(module) -> list[str]:
    """The modules inside course_lib.bench that `module`'s source imports (relative or absolute)."""
    names = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names += [node.module] if node.module else [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 2:     # from .. import bench, from ..bench import x
            if (node.module or "").split(".")[0] == "bench" or any(a.name == "bench" for a in node.names):
                names.append("<the registry>")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            full = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names += [n for n in full if n == "course_lib.bench" or n.startswith("course_lib.bench.")]
    return names


def test_no_import_cycle_benchmarks_import_only_result(monkeypatch):
    # result.py loads on its own, outside the package: it imports nothing from course_lib.bench.
    spec = importlib.util.spec_from_file_location("standalone_result", bench.result.__file__)
    standalone = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "standalone_result", standalone)
    spec.loader.exec_module(standalone)
    assert standalone.format_table([{"a": 1}]).split() == ["a", "-", "1"]
    assert _package_imports(bench.result) == []
    for name, entry in bench.BENCHMARKS.items():
        assert set(_package_imports(entry.load())) <= {"result"}, name


@needs_mnist
def test_loader_benchmark_quick(capsys):
    assert bench.main(["loader", "--quick", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"speedup", "speedup_vs_workers2", "steps_per_second", "baseline_steps_per_second", "data"} <= set(summary)
    assert summary["speedup"] > 0 and summary["speedup_vs_workers2"] > 0   # the size of a speedup is the benchmark's to show
    assert summary["data"].startswith("2,000 of the ")


@pytest.mark.slow     # three launches of 2 gloo ranks
def test_transformer_benchmark_counts_each_parallelisms_bytes_as_its_formula(capsys):
    assert bench.main(["transformer", "--quick", "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ranks"] == [2] and summary["rows"] == 10
    assert summary["min_ratio"] == summary["max_ratio"] == 1.0 and summary["max_diff_vs_one_process"] < 1e-5
    for parallelism in ("TP", "SP", "CP", "EP"):
        assert f" {parallelism} " in out


@pytest.mark.slow
@needs_mnist
def test_cpu_mnist_benchmark_quick_as_a_subprocess():
    out = subprocess.run([sys.executable, "-m", "course_lib.bench", "cpu-mnist", "--quick", "--json"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert "course_lib.train" in out and "seed loop" in out  # the table
    summary = json.loads(out.strip().splitlines()[-1])
    assert {"speedup", "test_accuracy", "baseline_test_accuracy", "train_seconds", "baseline_train_seconds",
            "images_per_second", "baseline_images_per_second", "data"} <= set(summary)
    assert summary["speedup"] > 0      # a ratio of two measured rates; how large it is, the benchmark shows
    assert 0.5 < summary["test_accuracy"] <= 1 and 0 <= summary["baseline_test_accuracy"] <= 1
    assert summary["train_seconds"] > 0 and summary["baseline_train_seconds"] > 0
    assert summary["data"].startswith("1,000 of the ")
    # MFU beside the speedup: three ceilings, each a ratio of the same achieved FLOP/s
    assert summary["mfu"] > 0 and summary["mfu_achievable"] > 0 and summary["of_layer_bound"] > 0
    assert summary["of_layer_bound"] == pytest.approx(summary["achieved_flops"] / summary["layer_bound_flops"], rel=1e-3)
    assert set(summary["layers"]) == {"Net.conv1", "Net.conv2", "Net.fc1", "Net.fc2"}
    assert "MFU" in out and "the ceiling of this model here" in out


def _notebook(path, *sources):
    import nbformat

    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), str(path))


@needs_mnist
def test_lectures_clock_times_each_notebook_in_its_own_folder_and_reports_failures(tmp_path):
    from course_lib.bench import lectures

    _notebook(tmp_path / "00_fine.ipynb", "import os, pathlib", "print(os.environ['COURSE_QUICK'], pathlib.Path.cwd())")
    _notebook(tmp_path / "01_broken.ipynb", "raise ValueError('boom')")
    _notebook(tmp_path / "not_a_lecture.ipynb", "raise SystemExit")
    result = lectures.time_lectures(tmp_path, quick=True)
    summary = result.summary
    assert set(summary["seconds"]) == {"00_fine", "01_broken"} and summary["mode"] == "quick"
    assert summary["max_seconds"] == max(summary["seconds"].values()) > 0
    assert list(summary["failed"]) == ["01_broken"] and "boom" in summary["failed"]["01_broken"]
    assert summary["data_train_images"] > 0 and "training images" in summary["data"]
    assert [r["status"] for r in result.rows] == ["ok", "failed"]


def test_lectures_clock_without_notebooks_says_where_it_looked(tmp_path):
    from course_lib.bench import lectures

    with pytest.raises(ValueError, match="no lecture notebooks"):
        lectures.time_lectures(tmp_path)


@pytest.mark.slow
@needs_mnist
def test_gpu_fast_benchmark_quick_on_any_device(capsys):
    """On a CPU the recipe runs without its two compile rows (compile, CUDA graphs); each row is one epoch on
    1,000 images."""
    assert bench.main(["gpu-fast", "--quick", "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["benchmark"] == "gpu-fast" and summary["epochs"] == 1 and summary["quick"] is True
    assert summary["data"].startswith("1,000 of the ")
    assert summary["speedup"] > 0 and 0.1 < summary["recipe_test_accuracy"] <= 1
    expected_rows = ["defaults", "batch 512", "+ bf16", "+ bf16, NCHW"]
    compiled = ["+ compile", "+ CUDA graphs"]
    expected_rows += compiled if torch.cuda.is_available() else []
    assert summary["fastest_row"] in expected_rows and set(summary["seconds_to_target"]) == set(expected_rows)
    assert summary["recipe"] == gpu_fast.recipe_command(summary["fastest_row"]) and summary["target"] == 0.985
    for row in expected_rows:
        assert f"== {row}:" in out
    if not torch.cuda.is_available():
        assert all(f"== {row}: skipped" in out for row in compiled)


def test_the_recipe_command_of_each_row_has_its_flags_and_no_trailing_space():
    assert gpu_fast.recipe_command("defaults") == "python -m course_lib.train"     # the fastest on a busy CPU
    assert gpu_fast.recipe_command("batch 512") == "python -m course_lib.train " + " ".join(gpu_fast.RECIPE[:4])
    assert list(gpu_fast.ROWS)[-1] == "+ CUDA graphs"                                 # the last lever
    assert gpu_fast.recipe_command("+ CUDA graphs").endswith("--compile --compile-mode reduce-overhead")
    assert gpu_fast.recipe_command("+ CUDA graphs").startswith(gpu_fast.recipe_command("+ compile"))


def test_seconds_to_target_counts_training_time_up_to_the_first_epoch_that_reached_it():
    from course_lib.bench.gpu_fast import seconds_to
    out = {"epoch_seconds": [2.0, 1.0, 1.0], "epoch_test_accuracy": [0.95, 0.991, 0.99]}
    assert seconds_to(0.99, out) == 3.0 and seconds_to(0.999, out) is None


def test_grading_benchmark_builds_a_class_of_full_untouched_and_partly_right(tmp_path):
    from course_lib.bench import grading
    subs = grading.make_class(tmp_path, 4)
    nbs = [json.loads(p.read_text()) for p in sorted(subs.glob("*.ipynb"))]
    answers = lambda nb: [c["source"] for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution")]
    full, untouched, partly, full_again = map(answers, nbs)
    assert full == full_again and full != untouched
    assert partly[0] == untouched[0] and partly[1:] == full[1:], "partly right: the first answer reverted to its stub"
