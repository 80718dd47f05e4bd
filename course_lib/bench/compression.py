"""Deep Compression, int8 inference and structured pruning, each against fp32 in the same run.

    python -m course_lib.bench compression --json    # LeNet-5 trains on the CPU: several minutes
    python -m course_lib.bench compression --quick   # 1,000 training / 2,000 test images, few epochs

Summary keys: lenet300_ratio / lenet5_ratio (dense fp32 weights / Deep-Compressed weights, counted
as the paper's Tables 2-3 count: biases left out on both sides; fillers, codebooks, Huffman tables
and counts in), lenet300_file_ratio / lenet5_file_ratio (whole model, 32-bit biases on both
sides), lenet300_drop_pp / lenet5_drop_pp (baseline minus decoded-model test accuracy, points;
negative when better), int8_api, int8_speedup, int8_size_ratio (torch.save bytes), int8_drop_pp,
structured_speedup (prune_structured(model, 0.5), then 2 epochs of retraining), baseline
accuracies, data, quick. Latency: median of interleaved forward passes at batch 256
(`measure.compare_latency`) with torch.set_num_threads(1) while timing, so that another process
on a shared machine does not make one model's threads wait for a core; training uses the default.
"""
from __future__ import annotations

import itertools

from ..compression import int8, measure, pipeline
from ..compression.structured import prune_structured
from ..data import TensorLoader, data_label, mnist_loaders, train_split_size
from ..env import seed_everything, torch_threads
from ..loop import evaluate
from ..models import build_model
from .result import BenchResult, format_table

SCHEDULES = {  # (full, quick): baseline epochs and deep_compress's rounds/epochs
    "lenet300": ({"epochs": 15, "prune_rounds": 4, "prune_epochs": 3, "share_epochs": 2},
                 {"epochs": 8, "prune_rounds": 2, "prune_epochs": 2, "share_epochs": 1}),
    "lenet5": ({"epochs": 12, "prune_rounds": 4, "prune_epochs": 3, "share_epochs": 2},
               {"epochs": 3, "prune_rounds": 2, "prune_epochs": 1, "share_epochs": 1}),
}
QUICK_TRAIN, QUICK_TEST = 1000, 2000


def _compress(name: str, train_loader, test_loader, quick: bool):
    schedule = dict(SCHEDULES[name][quick])
    seed_everything(0)
    model = build_model(name)
    pipeline.train(model, train_loader, schedule.pop("epochs"))
    print(f"== {name}: baseline trained; Deep Compression with the paper's per-layer settings")
    result = pipeline.deep_compress(model, train_loader, test_loader, **pipeline.paper_config(name), **schedule,
                                    log=lambda line: print("  " + line))
    return model, result


def run(data_dir=None, quick: bool = False) -> BenchResult:
    train_loader, test_loader = mnist_loaders(64, data_dir, QUICK_TRAIN if quick else None)
    if quick:
        test_loader = TensorLoader(*(t[:QUICK_TEST] for t in test_loader.tensors), batch_size=1000, shuffle=False)
    data = data_label(train_loader.dataset_size, train_split_size(data_dir), data_dir)
    dense, results = {}, {}
    for name in ("lenet300", "lenet5"):
        dense[name], results[name] = _compress(name, train_loader, test_loader, quick)
    print(f"\nDeep Compression, paper vs ours ({data}; test set of {test_loader.dataset_size:,} images)")
    print(format_table(pipeline.paper_rows(results)))
    for name, result in results.items():
        print(f"\n{pipeline.PAPER[name]['layers_source']}, paper / ours")
        print(format_table(pipeline.layer_rows(name, result)))

    fp32 = dense["lenet300"].eval()
    calibration = [x for x, _ in itertools.islice(train_loader, 4)]
    quantized, api = int8.int8_model(fp32, calibration)
    seed_everything(0)
    structured = prune_structured(fp32, 0.5)
    pipeline.train(structured, train_loader, 2)
    models = {"fp32": fp32, "int8": quantized, "structured": structured.eval()}
    with torch_threads(1):
        latency = measure.compare_latency(models, batch_size=256, repeats=20 if quick else 50)
    acc = {key: evaluate(m, test_loader, device="cpu")[1] for key, m in models.items()}
    size = {key: measure.serialized_bytes(m) for key, m in models.items()}

    rows = []
    for name, r in results.items():
        title = pipeline.PAPER[name]["title"]
        rows += [{"model": title, "variant": "dense fp32", "test acc %": round(100 * r.baseline_accuracy, 2),
                  "KB": round(r.total["dense"] / 8000, 1), "ratio": "-", "file ratio": "-", "ms (b256)": "-",
                  "speedup": "-"},
                 {"model": title, "variant": "Deep Compression", "test acc %": round(100 * r.compressed_accuracy, 2),
                  "KB": round(r.total["pqh"] / 8000, 1), "ratio": round(r.ratio, 1),
                  "file ratio": round(r.file_ratio, 1),
                  "ms (b256)": "-", "speedup": "-"}]
    for key, label in (("fp32", "fp32 (torch.save)"), ("int8", f"int8 ({api})"), ("structured", "structured 50%")):
        rows.append({"model": "LeNet-300-100", "variant": label, "test acc %": round(100 * acc[key], 2),
                     "KB": round(size[key] / 1000, 1), "ratio": round(size["fp32"] / size[key], 2), "file ratio": "-",
                     "ms (b256)": round(1e3 * latency[key], 3), "speedup": round(latency["fp32"] / latency[key], 2)})
    r300, r5 = results["lenet300"], results["lenet5"]
    summary = {
        "benchmark": "compression",
        "lenet300_ratio": round(r300.ratio, 2), "lenet300_file_ratio": round(r300.file_ratio, 2),
        "lenet300_drop_pp": round(100 * (r300.baseline_accuracy - r300.compressed_accuracy), 2),
        "lenet300_baseline_accuracy": r300.baseline_accuracy, "lenet300_compressed_accuracy": r300.compressed_accuracy,
        "lenet5_ratio": round(r5.ratio, 2), "lenet5_file_ratio": round(r5.file_ratio, 2),
        "lenet5_drop_pp": round(100 * (r5.baseline_accuracy - r5.compressed_accuracy), 2),
        "lenet5_baseline_accuracy": r5.baseline_accuracy, "lenet5_compressed_accuracy": r5.compressed_accuracy,
        "int8_api": api, "int8_speedup": round(latency["fp32"] / latency["int8"], 2),
        "int8_size_ratio": round(size["fp32"] / size["int8"], 2),
        "int8_drop_pp": round(100 * (acc["fp32"] - acc["int8"]), 2),
        "structured_speedup": round(latency["fp32"] / latency["structured"], 2),
        "structured_accuracy": acc["structured"], "fp32_latency_ms": round(1e3 * latency["fp32"], 3),
        "timing_threads": 1, "data": data, "test_images": test_loader.dataset_size, "quick": quick,
    }
    title = (f"compression on {data}, test accuracy on {test_loader.dataset_size:,} images; latency at batch 256, "
             "one thread, median of interleaved runs")
    return BenchResult(title, rows, summary)
