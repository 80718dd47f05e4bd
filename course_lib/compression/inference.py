"""Serving a model: throughput against batch size, autograd modes, and the size-accuracy frontier.

    throughput({"LeNet-5": m}, [1, 16, 256])      # name -> {batch size: images/s}
    compare_modes(model)                           # seconds per forward: train / eval / no_grad / inference_mode
    saved_tensor_bytes(model, x)                   # what autograd keeps alive for a backward pass
    variant("LeNet-5 int8", "int8", q, acc, storage="file")   # one point of the frontier
    pareto_front([(size, accuracy), ...])          # indices of the points nothing beats
    plot_frontier(variants)

All timing goes through `measure.compare_latency` (median of interleaved repeats after warm-up):
read ratios, not milliseconds, on a shared machine.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..validate import is_int, number_in_range, one_of, positive_int
from .measure import INPUT_SHAPE, compare_latency, csr_model_bytes, model_size_bytes, serialized_bytes

BATCH_SIZES = tuple(2**i for i in range(11))    # 1, 2, 4, ..., 1024


def _check_batch_sizes(batch_sizes) -> list:
    sizes = list(batch_sizes) if isinstance(batch_sizes, (list, tuple, range)) else None
    if not sizes or not all(is_int(b) and b > 0 for b in sizes):
        raise ValueError(f"batch_sizes must be a non-empty list of positive ints (e.g. {list(BATCH_SIZES)}); "
                         f"got {batch_sizes!r}")
    return sizes


def throughput(models: dict, batch_sizes=BATCH_SIZES, images_per_point: int = 4096, min_repeats: int = 3,
               max_repeats: int = 50, warmup: int = 2, input_shape=INPUT_SHAPE) -> dict:
    """name -> {batch size: images/s} of each model's forward pass (eval, inference_mode).

    At each batch size the models are timed in turn (`compare_latency`), about `images_per_point`
    images per model (clamped to [min_repeats, max_repeats] calls), so every point costs about
    the same time whatever its batch size.
    """
    sizes = _check_batch_sizes(batch_sizes)
    for name, value in (("images_per_point", images_per_point), ("min_repeats", min_repeats),
                        ("max_repeats", max_repeats)):
        positive_int(name, value)
    if min_repeats > max_repeats:
        raise ValueError(f"min_repeats ({min_repeats}) must be <= max_repeats ({max_repeats})")
    table = {name: {} for name in models}
    for b in sizes:
        repeats = min(max(images_per_point // b, min_repeats), max_repeats)
        seconds = compare_latency(models, b, input_shape, repeats=repeats, warmup=warmup)
        for name, s in seconds.items():
            table[name][b] = b / s
    return table


def plot_throughput(table: dict, ax=None, title: str | None = None):
    """images/s against batch size, log-log, one line per model; returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for name, rates in table.items():
        ax.plot(list(rates), list(rates.values()), "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("images / s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return ax


# --- autograd modes ----------------------------------------------------------------------------

MODES = ("train", "eval", "no_grad", "inference_mode")


def _check_mode(mode) -> str:
    return one_of("mode", mode, MODES)


class AutogradMode(nn.Module):
    """Runs `model` under one fixed mode, whatever the caller set (measure's timer sets eval + inference_mode).

    "train": model.train(), autograd records (a training step's forward: dropout on, graph built);
    "eval": model.eval() but autograd still records (serving without no_grad: a common slip);
    "no_grad": eval under torch.no_grad(); "inference_mode": eval under torch.inference_mode().
    """

    def __init__(self, model: nn.Module, mode: str):
        super().__init__()
        self.model, self.mode = model, _check_mode(mode)
        self.train()

    def train(self, mode: bool = True):
        self.training = mode
        self.model.train(self.mode == "train")
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(self.mode == "inference_mode"), \
                torch.set_grad_enabled(self.mode in ("train", "eval")):
            return self.model(x)


def compare_modes(model: nn.Module, batch_size: int = 256, repeats: int = 30, warmup: int = 5,
                  modes=MODES) -> dict:
    """mode -> median seconds of one forward on a batch, the modes interleaved (`compare_latency`).

    "train" runs on a copy (its flag differs from the eval modes'); the model's own train/eval
    flag is restored afterwards.
    """
    modes = [_check_mode(m) for m in modes]
    was_training = model.training
    try:
        runners = {m: AutogradMode(copy.deepcopy(model) if m == "train" else model, m) for m in modes}
        return compare_latency(runners, batch_size, repeats=repeats, warmup=warmup)
    finally:
        model.train(was_training)


def saved_tensor_bytes(model: nn.Module, x: torch.Tensor, mode: str = "train") -> int:
    """Bytes of the tensors autograd saves for backward during one forward in `mode`, parameters
    excluded (they are stored anyway), each storage counted once: the memory a forward pass under
    grad keeps alive until backward, or until the output is dropped. 0 under no_grad/inference_mode."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    was_training = model.training
    try:
        runner = AutogradMode(model, mode)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            runner(x)
    finally:
        model.train(was_training)
    return sum(seen.values())


# --- the size-accuracy frontier ----------------------------------------------------------------

def shared_weight_bytes(model: nn.Module) -> int:
    """k-means weight sharing (`kmeans.share_weights`): indices + codebooks (`codebook_bits`) + the
    other parameters (biases) in fp32."""
    from .kmeans import codebook_bits

    rest = sum(p.nbytes for name, p in model.named_parameters() if not name.endswith("centroids"))
    return math.ceil(codebook_bits(model)["total"] / 8) + rest


STORAGE = {   # how a variant's bytes are counted: storage name -> (function of the model, description)
    "fp32": (model_size_bytes, "dense fp32"),
    "csr": (csr_model_bytes, "weights in CSR (fp32 values + int32 indices), the rest dense"),
    "file": (serialized_bytes, "torch.save file (incl. a few KB of format overhead)"),
    "shared": (shared_weight_bytes, "k-means indices + fp32 codebooks + fp32 biases"),
}


@dataclass(frozen=True)
class Variant:
    """One point of the frontier: `size_bytes` stored as `storage` says, `accuracy` in [0, 1]."""

    name: str
    family: str
    size_bytes: int
    accuracy: float
    storage: str

    @property
    def size_kb(self) -> float:
        return self.size_bytes / 1e3


def variant(name: str, family: str, model: nn.Module, accuracy: float, storage: str = "fp32") -> Variant:
    """A Variant whose size is measured from `model` by the `storage` rule (one of STORAGE)."""
    one_of("storage", storage, sorted(STORAGE))
    number_in_range("accuracy", accuracy, 0, 1, noun="fraction")
    size, _ = STORAGE[storage]
    return Variant(name, family, int(size(model)), float(accuracy), storage)


def pareto_front(points) -> list:
    """Indices of the (size, accuracy) points that no other point beats, smallest size first.

    Point j beats point i when it is no bigger and no less accurate, and better in one of the two.
    Sorted by size (then most accurate first), a point is on the front iff it is more accurate
    than every point before it. Exact duplicates: the first one listed stays.
    """
    pts = [tuple(p) for p in points]
    if any(len(p) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in p) for p in pts):
        raise ValueError("points must be (size, accuracy) pairs of finite numbers")
    order = sorted(range(len(pts)), key=lambda i: (pts[i][0], -pts[i][1], i))
    front, best = [], -math.inf
    for i in order:
        if pts[i][1] > best:
            front.append(i)
            best = pts[i][1]
    return front


def plot_frontier(variants, ax=None, title: str | None = None):
    """Test accuracy (%) against stored size (KB, log scale), one colour per family, the Pareto
    front drawn as a step line and each point named; returns the axes."""
    import matplotlib.pyplot as plt

    variants = list(variants)
    if not variants or not all(isinstance(v, Variant) for v in variants):
        raise ValueError("variants must be a non-empty list of Variant records (see `variant`)")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 5.5))
    families = list(dict.fromkeys(v.family for v in variants))
    for k, family in enumerate(families):
        members = [v for v in variants if v.family == family]
        ax.scatter([v.size_kb for v in members], [100 * v.accuracy for v in members], s=50, color=f"C{k}",
                   label=family, zorder=3)
    for rank, v in enumerate(sorted(variants, key=lambda v: v.size_bytes)):   # neighbours: above, then below
        ax.annotate(v.name, (v.size_kb, 100 * v.accuracy), textcoords="offset points", fontsize=8,
                    xytext=(5, 5 if rank % 2 == 0 else -12))
    front = [variants[i] for i in pareto_front([(v.size_kb, v.accuracy) for v in variants])]
    ax.step([v.size_kb for v in front], [100 * v.accuracy for v in front], where="post", color="k", alpha=0.4,
            lw=1.5, label="Pareto front", zorder=2)
    ax.set_xscale("log")
    ax.set_xlabel("stored size (KB, log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return ax
