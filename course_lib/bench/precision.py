"""bf16 autocast training of `Net` against fp32, side by side: accuracy, speed and activation memory.

    python -m course_lib.bench precision --json   # keys fp32_test_accuracy, bf16_test_accuracy,
                                                  # accuracy_gap_pp, bf16_speedup, data
    python -m course_lib.bench precision --quick  # 1,000 training images, 2 epochs (what the tests run)

Every run is `python -m course_lib.train` with its defaults (Net, 15 epochs, batch 64, Adam with a
one-cycle lr of 5e-3, seed 0) on the same data; only --precision differs. accuracy_gap_pp is
fp32 minus bf16 test accuracy in percentage points (target <= 0.5). bf16_speedup is the ratio of
training images/s, whatever it is here: a CPU without AVX512-BF16 or AMX (cpu_capability below
"AVX512_BF16"/"AMX") has no bf16 arithmetic, so every bf16 op converts to fp32 and back and bf16
is *slower* than fp32; on a GPU with tensor cores it is faster. On CUDA the fp16 + GradScaler run
is added, with peak GPU memory. Saved activation bytes (batch 64) are counted on any device.
"""
from __future__ import annotations

import torch

from .. import train
from ..data import data_label, load_tensors, train_split_size
from ..env import get_device
from ..models import Net
from ..precision import saved_tensor_bytes
from .result import BenchResult


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """Train Net in fp32 and bf16 (and fp16 on CUDA) with the train CLI; returns rows and the summary."""
    device = get_device("auto")
    argv = ["--no-progress"] + (["--data-dir", str(data_dir)] if data_dir else [])
    argv += ["--train-subset", "1000", "--epochs", "2"] if quick else []
    x, _ = load_tensors("test", data_dir, 64)
    runs, rows = {}, []
    for precision in ("32", "bf16") + (("16",) if device.type == "cuda" else ()):
        print(f"== python -m course_lib.train --precision {precision} " + " ".join(argv))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        out = runs[precision] = train.run(train.build_parser().parse_args(argv + ["--precision", precision]))
        peak = round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None
        saved = saved_tensor_bytes(Net().to(device), x, precision)
        rows.append({"precision": precision, "epochs": out["epochs_run"], "train s": out["train_seconds"],
                     "images/s": round(out["images_per_second"]), "test acc": out["test_accuracy"],
                     "saved activations KB (batch 64)": round(saved / 1024, 1),
                     **({"peak GPU MB": peak} if peak is not None else {})})
    fp32, bf16 = runs["32"], runs["bf16"]
    summary = {
        "benchmark": "precision",
        "fp32_test_accuracy": fp32["test_accuracy"],
        "bf16_test_accuracy": bf16["test_accuracy"],
        "accuracy_gap_pp": round(100 * (fp32["test_accuracy"] - bf16["test_accuracy"]), 2),
        "bf16_speedup": round(bf16["images_per_second"] / fp32["images_per_second"], 3),
        "fp32_images_per_second": fp32["images_per_second"],
        "bf16_images_per_second": bf16["images_per_second"],
        "bf16_saved_activation_ratio": round(rows[1]["saved activations KB (batch 64)"]
                                             / rows[0]["saved activations KB (batch 64)"], 3),
        "epochs": fp32["epochs_run"], "seed": fp32["seed"],
        "data": data_label(fp32["train_samples"], train_split_size(data_dir), data_dir),
        "device": fp32["device"], "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(), "quick": quick,
    }
    if "16" in runs:
        summary["fp16_test_accuracy"] = runs["16"]["test_accuracy"]
        summary["fp16_speedup"] = round(runs["16"]["images_per_second"] / fp32["images_per_second"], 3)
        summary["peak_gpu_mb"] = {row["precision"]: row["peak GPU MB"] for row in rows}
    title = (f"precision on {summary['data']}, {summary['device']} ({summary['cpu_capability']}), "
             f"test accuracy on {fp32['test_samples']:,} images")
    return BenchResult(title, rows, summary)
