"""`python -m course_lib.train` with its defaults against the seed's loop, on the same data.

    python -m course_lib.bench cpu-mnist          # course_lib's default training vs the seed's loop
    python -m course_lib.bench cpu-mnist --quick  # 1,000 training images (what the tests run)

course_lib's side: batch 64, Adam, TensorLoader. The seed's: batch 4, SGD, DataLoader with 2
workers, 2 epochs. The result is the ratio of training images/s, beside the run's MFU: against the
theoretical peak (`mfu`), against the best matmul this machine measurably does (`mfu_achievable`), and
against Net's own ceiling here (`of_layer_bound`): its four layers' forward + backward timed alone at the
run's batch and layout (`roofline.layer_bound`), the FLOP/s of a step in which nothing else took time.
"""
from __future__ import annotations

import torch

from .. import train
from ..data import data_label, train_split_size
from ..roofline import layer_bound
from ..tutorial import seed_train
from .result import BenchResult


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """Train with both loops; ratio of images/s, and both test accuracies."""
    subset = 1000 if quick else None
    argv = ["--no-progress"] + (["--data-dir", str(data_dir)] if data_dir else [])
    argv += ["--train-subset", str(subset), "--epochs", "2"] if quick else []
    seed_epochs = 1 if quick else 2

    print(f"== seed loop: batch 4, SGD lr 0.001, DataLoader(num_workers=2), {seed_epochs} epoch(s)")
    seed = seed_train(data_dir, epochs=seed_epochs, train_subset=subset, log_every=500)
    print("== course_lib: python -m course_lib.train " + " ".join(argv))
    ours = train.run(train.build_parser().parse_args(argv))

    layers, bound = layer_bound(batch=ours["batch_size"], memory_format=ours["memory_format"],
                                device=ours["device"], repeats=5 if quick else 20)
    n_split = train_split_size(data_dir)
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
    achieved = ours["achieved_flops"]
    summary = {
        "benchmark": "cpu-mnist",
        "speedup": round(ours["images_per_second"] / base_rate, 2),
        "achieved_flops": achieved, "mfu": ours["mfu"], "peak_source": ours["peak_source"],
        "mfu_achievable": ours["mfu_achievable"], "achievable_flops": ours["achievable_flops"],
        "layer_bound_flops": round(bound, 1), "of_layer_bound": round(achieved / bound, 4),
        "layer_bound_of_achievable": round(bound / ours["achievable_flops"], 4),
        "layers": {p.name.split()[0]: round(p.flops_per_second, 1) for p in layers},
        "test_accuracy": ours["test_accuracy"],
        "baseline_test_accuracy": round(seed.val_accuracy[-1], 6),
        "train_seconds": ours["train_seconds"],
        "baseline_train_seconds": round(seed.train_seconds, 3),
        "images_per_second": ours["images_per_second"],
        "baseline_images_per_second": round(base_rate, 1),
        "epochs": ours["epochs_run"], "baseline_epochs": seed_epochs,
        "data": data_label(n_used, n_split, data_dir),
        "device": ours["device"], "torch_threads": torch.get_num_threads(), "quick": quick,
    }
    print(f"course_lib.train: {achieved / 1e9:.1f} GFLOP/s = MFU {ours['mfu']:.3f} of the theoretical peak "
          f"({ours['peak_source']}), {ours['mfu_achievable']:.3f} of the best measured matmul "
          f"({ours['achievable_flops'] / 1e9:.0f} GFLOP/s)")
    print(f"Net's layers alone at batch {ours['batch_size']} ({ours['memory_format']}): "
          + ", ".join(f"{p.name.split()[0].split('.')[1]} {p.flops_per_second / 1e9:.1f}" for p in layers)
          + f" GFLOP/s; together {bound / 1e9:.1f} GFLOP/s = {bound / ours['achievable_flops']:.2f} of the matmul: "
          f"the ceiling of this model here. The run reaches {achieved / bound:.2f} of it.")
    return BenchResult(f"cpu-mnist on {summary['data']}", rows, summary)
