"""The course's fastest path to high test accuracy on one GPU, and what each ingredient adds.

    python -m course_lib.bench gpu-fast --data-dir DIR --json   # keys fastest_row, recipe, speedup,
                                                                # seconds_to_target, ...
    python -m course_lib.bench gpu-fast --quick                 # 1,000 images, 1 epoch (what the tests run)

Each row is `python -m course_lib.train` on the same data, seed and number of epochs; each adds
one ingredient to the row above it. The CLI's defaults already keep the whole data set on the
device (`TensorLoader(device=...)`: no copy per step) and run Net in channels_last:

    defaults        batch 64, lr 5e-3, fp32, channels_last
    batch 512       fewer, larger steps (lr 2e-2: a larger batch takes a larger step)
    + bf16          bfloat16 autocast: tensor cores, half the activation bytes
    + bf16, NCHW    the row above without channels_last, to show what channels_last buys
    + compile       torch.compile: fused Triton kernels, fewer launches  (CUDA only)
    + CUDA graphs   --compile-mode reduce-overhead: the compiled forward and backward recorded as CUDA
                    graphs, replayed with one launch each instead of one per kernel; the loss, zero_grad,
                    Adam and the schedule stay eager (`course_lib.train`'s docstring)  (CUDA only)

The training loop reads no loss with .item() per step (`loop.train_epoch`), so the host is never made
to wait for the GPU inside an epoch and can queue launches ahead; where a step is still host-bound
(`simulate.profiles.gpu_host_seconds`: the host work per kernel, calibrated on lecture 04's recorded
H200 step of Net at batch 64), the CUDA-graph row removes that cost for the compiled part. Not yet
measured on a GPU: no device was lent when the row was added.

"s to target" is the training time (compile included, evaluation excluded) until the test
accuracy first reached TARGET (98.5%), measured after each epoch; each compile
row starts with dynamo's in-memory cache emptied (`torch._dynamo.reset`), so it compiles for itself
(Inductor's on-disk cache, warm from an earlier run, can still shorten that). The recipe is the row
that got there first, or, where none did, the one that trained fastest: measured, not assumed (for a model as
small as Net a GPU is bound by kernel launches, so bf16's casts and compile's warm-up can cost more
than they save). "speedup" is the defaults' training time over the recipe's. Meant for a GPU; on
a CPU it skips both compile rows and says so (compiling would dwarf the training, and CUDA graphs
need CUDA).
"""
from __future__ import annotations

import torch

from .. import train
from ..data import data_label, train_split_size
from ..env import get_device
from .result import BenchResult

TARGET = 0.985
EPOCHS = 15
RECIPE = ["--batch-size", "512", "--lr", "0.02", "--precision", "bf16", "--memory-format", "channels_last",
          "--compile"]
ROWS = {
    "defaults": [],
    "batch 512": RECIPE[:4],
    "+ bf16": RECIPE[:8],
    "+ bf16, NCHW": RECIPE[:6] + ["--memory-format", "contiguous"],
    "+ compile": RECIPE,
    "+ CUDA graphs": RECIPE + ["--compile-mode", "reduce-overhead"],
}


def recipe_command(name: str) -> str:
    """The training command of row `name`, as a learner would type it (the defaults' has no flags)."""
    return " ".join(["python -m course_lib.train", *ROWS[name]])


def seconds_to(target: float, out: dict):
    """Training seconds until the first epoch whose test accuracy reached `target`, or None."""
    elapsed = 0.0
    for seconds, accuracy in zip(out["epoch_seconds"], out["epoch_test_accuracy"]):
        elapsed += seconds
        if accuracy >= target:
            return round(elapsed, 2)
    return None


def run(data_dir=None, quick: bool = False) -> BenchResult:
    device = get_device("auto")
    cuda = device.type == "cuda"
    argv = ["--no-progress", "--epochs", "1" if quick else str(EPOCHS)]
    argv += (["--data-dir", str(data_dir)] if data_dir else []) + (["--train-subset", "1000"] if quick else [])
    rows, runs, reached = [], {}, {}
    for name, flags in ROWS.items():
        if "--compile" in flags and not cuda:
            print(f"== {name}: skipped, torch.compile is timed here on CUDA only (on a CPU its compile "
                  "time would dwarf the training, and CUDA graphs need CUDA)")
            continue
        if "--compile" in flags:
            torch._dynamo.reset()      # this row compiles for itself, within its own recompile limit
        print(f"== {name}: python -m course_lib.train " + " ".join(argv + flags))
        out = runs[name] = train.run(train.build_parser().parse_args(argv + flags))
        reached[name] = seconds_to(TARGET, out)
        rows.append({"config": name, "epochs": out["epochs_run"], "train s": out["train_seconds"],
                     "images/s": round(out["images_per_second"]), "test acc": out["test_accuracy"],
                     f"s to {100 * TARGET:g}%": "not reached" if reached[name] is None else reached[name]})
    if any(t is not None for t in reached.values()):
        recipe_name = min((t, name) for name, t in reached.items() if t is not None)[1]
    else:
        recipe_name = min(runs, key=lambda name: runs[name]["train_seconds"])
    recipe, base = runs[recipe_name], runs["defaults"]
    split = train_split_size(data_dir)
    summary = {
        "benchmark": "gpu-fast", "device": recipe["device"], "target": TARGET,
        "fastest_row": recipe_name, "recipe": recipe_command(recipe_name),
        "recipe_test_accuracy": recipe["test_accuracy"], "recipe_train_seconds": recipe["train_seconds"],
        "recipe_images_per_second": recipe["images_per_second"],
        "recipe_epoch_test_accuracy": recipe["epoch_test_accuracy"],
        "seconds_to_target": reached, "defaults_train_seconds": base["train_seconds"],
        "defaults_test_accuracy": base["test_accuracy"],
        "speedup": round(base["train_seconds"] / recipe["train_seconds"], 2),
        "epochs": recipe["epochs_run"], "data": data_label(recipe["train_samples"], split, data_dir),
        "quick": quick,
    }
    if cuda:
        summary["gpu"] = torch.cuda.get_device_name(device)
    title = (f"GPU-fast recipe on {summary.get('gpu', device)}: each row adds one ingredient "
             f"({summary['epochs']} epochs, {summary['data']}); fastest: {recipe_name}")
    return BenchResult(title, rows, summary)
