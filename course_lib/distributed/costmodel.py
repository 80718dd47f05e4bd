"""The α–β cost model of all-reduce: predict, measure, fit.

Sending one message of n bytes costs  α + n·β  (α: latency in s, β: s per byte = 1 / bandwidth).
Counting the messages on the critical path of each algorithm (p ranks, n bytes per rank):

    naive (reduce to rank 0, broadcast back)  T = 2(p−1)·α + 2(p−1)·n·β
    tree  (binomial reduce + broadcast)       T = 2⌈log2 p⌉·α + 2⌈log2 p⌉·n·β
    ring  (reduce-scatter + all-gather)       T = 2(p−1)·α + 2(p−1)/p · n·β

The ring pays the most latency but its bandwidth term stays below 2·n·β for any p: that is why
large gradients use it. All three are `a(p)·α + b(p)·n·β`, linear in (α, β), so both can be fitted
to measured times by least squares (`fit_alpha_beta`).

    from course_lib.distributed.costmodel import measure, fit_alpha_beta
    m = measure([2**10, 2**20, 2**24], impls=("torch", "ring"), world_size=2)
    alpha, beta = fit_alpha_beta(m["sizes"], m["times"]["ring"], "ring", 2)

These formulas price one link type. A cluster has two (NVLink inside a node, network cards between nodes) and
NCCL spreads a collective over all of a node's cards: `network` builds that model, and the "what if?" questions
about real clusters, on `allreduce_time`.
"""
from __future__ import annotations

import importlib
import math
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from ..env import rank_device
from ..validate import one_of, positive_int

ALGORITHMS = ("naive", "tree", "ring")


def _coefficients(algorithm: str, world_size: int) -> tuple[float, float]:
    """(a, b) with T = a·α + b·n·β for `algorithm` on `world_size` ranks."""
    one_of("algorithm", algorithm, ALGORITHMS)
    p = positive_int("world_size", world_size)
    if algorithm == "naive":
        return 2.0 * (p - 1), 2.0 * (p - 1)
    if algorithm == "tree":
        steps = 2.0 * math.ceil(math.log2(p))
        return steps, steps
    return 2.0 * (p - 1), 2.0 * (p - 1) / p


def naive_time(n_bytes, world_size: int, alpha: float, beta: float):
    """Through rank 0: T = 2(p−1)·α + 2(p−1)·n·β (rank 0 receives p−1 messages, then sends p−1)."""
    return allreduce_time("naive", n_bytes, world_size, alpha, beta)


def tree_time(n_bytes, world_size: int, alpha: float, beta: float):
    """Binomial tree: T = 2⌈log2 p⌉·(α + n·β) (log p rounds of reduce, log p of broadcast)."""
    return allreduce_time("tree", n_bytes, world_size, alpha, beta)


def ring_time(n_bytes, world_size: int, alpha: float, beta: float):
    """Ring: T = 2(p−1)·α + 2(p−1)/p · n·β (2(p−1) steps, each moving a chunk of n/p bytes)."""
    return allreduce_time("ring", n_bytes, world_size, alpha, beta)


def allreduce_time(algorithm: str, n_bytes, world_size: int, alpha: float, beta: float):
    """Predicted seconds for one all-reduce of `n_bytes` (number or array) per rank."""
    a, b = _coefficients(algorithm, world_size)
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0; got alpha={alpha!r}, beta={beta!r}")
    n = np.asarray(n_bytes, dtype=float)
    if (n < 0).any():
        raise ValueError(f"n_bytes must be >= 0; got {n_bytes!r}")
    t = a * alpha + b * n * beta
    return float(t) if t.ndim == 0 else t


def allreduce_terms(algorithm: str, n_bytes, world_size: int, alpha: float, beta: float) -> tuple:
    """(latency term a·α, bandwidth term b·n·β) of `allreduce_time`, to see which one dominates."""
    a, _ = _coefficients(algorithm, world_size)
    total = allreduce_time(algorithm, n_bytes, world_size, alpha, beta)
    return a * alpha, total - a * alpha


def fit_alpha_beta(sizes, times, algorithm: str, world_size: int) -> tuple[float, float]:
    """Least-squares (α, β) of `algorithm`'s model to measured `times` (s) at `sizes` (bytes).

    The error is RELATIVE ((T_model − T)/T): times span four orders of magnitude from 1 KB to
    64 MB, and plain least squares would fit the largest sizes only. α, β are kept >= 0.
    """
    sizes, times = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    if sizes.ndim != 1 or sizes.shape != times.shape or len(sizes) < 2:
        raise ValueError(f"sizes and times must be 1-D of the same length >= 2; got {sizes.shape}, {times.shape}")
    if (sizes < 0).any() or not (times > 0).all():
        raise ValueError("sizes must be >= 0 and times > 0")
    a, b = _coefficients(algorithm, world_size)
    if a == 0:
        raise ValueError(f"world_size must be >= 2 to fit a model (1 rank communicates nothing); got {world_size}")
    x = np.stack([np.full_like(sizes, a), b * sizes], axis=1) / times[:, None]
    coef, *_ = np.linalg.lstsq(x, np.ones_like(times), rcond=None)
    if (coef < 0).any():  # refit with the negative parameter pinned at 0
        keep = int(np.argmax(coef))
        only, *_ = np.linalg.lstsq(x[:, keep:keep + 1], np.ones_like(times), rcond=None)
        coef = np.zeros(2)
        coef[keep] = max(float(only[0]), 0.0)
    return float(coef[0]), float(coef[1])


def relative_errors(sizes, times, algorithm: str, world_size: int, alpha: float, beta: float) -> np.ndarray:
    """|T_model − T| / T for each measured size."""
    times = np.asarray(times, dtype=float)
    return np.abs(allreduce_time(algorithm, np.asarray(sizes, float), world_size, alpha, beta) - times) / times


_BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}


def algbw(size_bytes, time_s):
    """nccl-tests' algorithm bandwidth in GB/s (1e9 B/s): size / time."""
    if not np.all(np.asarray(time_s) > 0):
        raise ValueError(f"time_s must be > 0; got {time_s!r}")
    return np.asarray(size_bytes, dtype=float) / np.asarray(time_s, dtype=float) / 1e9


def busbw(size_bytes, time_s, world_size: int, collective: str = "all_reduce"):
    """nccl-tests' bus bandwidth in GB/s: algbw × 2(n−1)/n for all-reduce, comparable to the link's peak.

    Why: an all-reduce moves 2(n−1)/n × size through each rank's link, so busbw is what the wire saw.
    """
    one_of("collective", collective, tuple(_BUS_FACTORS))
    return algbw(size_bytes, time_s) * _BUS_FACTORS[collective](positive_int("world_size", world_size))


# ---------------------------------------------------------------------------------------------
# Measuring: a worker for `launch`, and `measure` which runs it.

def _resolve(impl_name: str):
    """'torch' -> dist.all_reduce (gloo on CPU, nccl on GPU); 'ring', 'tree', 'naive' -> the
    from-scratch `collectives.all_reduce_<name>`; 'module:function' -> any importable fn(tensor)
    that sums over ranks in place."""
    if impl_name == "torch":
        return dist.all_reduce
    if impl_name in ALGORITHMS:
        impl_name = f"course_lib.distributed.collectives:all_reduce_{impl_name}"
    module, sep, name = impl_name.partition(":")
    if not sep:
        raise ValueError(f"impl_name must be 'torch', one of {ALGORITHMS} or 'module:function'; got {impl_name!r}")
    return getattr(importlib.import_module(module), name)


def measure_allreduce(rank: int, world_size: int, sizes_bytes, impl_name="torch", repeats: int = 5) -> dict:
    """Worker: time each implementation on float32 tensors of each size (launch it with `launch`).

    impl_name: one name or a list (see `_resolve`); implementations alternate at each size so a
    noisy neighbour hurts both alike. Per size: a checked warm-up call (the sum must be right), then
    `repeats` timed calls (4x as many below 1 MB: they are cheap and noisier), each after a barrier;
    the median per rank, then the max over ranks (an all-reduce is done when its slowest rank is).
    Returns {"sizes", "times": {impl: [seconds per size]}, "backend"}.
    """
    names = [impl_name] if isinstance(impl_name, str) else list(impl_name)
    impls = {name: _resolve(name) for name in names}
    positive_int("repeats", repeats)
    device = rank_device()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    medians = {name: [] for name in names}
    for fn in impls.values():  # first calls set up connections and buffers: keep them out of the timings
        for _ in range(3):
            fn(torch.zeros(256, device=device))
    for size in sizes_bytes:
        numel = max(int(size) // 4, 1)
        for name, fn in impls.items():
            t = torch.full((numel,), float(rank + 1), device=device)
            out = fn(t)
            out = t if out is None or not isinstance(out, torch.Tensor) else out
            if not torch.all(out == world_size * (world_size + 1) / 2):
                raise RuntimeError(f"{name} gave a wrong sum for {size} bytes")
            t.zero_()
            times = []
            for _ in range(repeats * (4 if size < 2**20 else 1)):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                fn(t)
                sync()
                times.append(time.perf_counter() - t0)
            medians[name].append(statistics.median(times))
    slowest = torch.tensor([medians[n] for n in names], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"sizes": [int(s) for s in sizes_bytes], "backend": dist.get_backend(),
            "times": {n: slowest[i].tolist() for i, n in enumerate(names)}}


def measure(sizes_bytes, impls=("torch", "ring"), world_size: int = 2, repeats: int = 5, timeout: float = 300) -> dict:
    """Launch `measure_allreduce` on `world_size` local ranks (one thread each); return rank 0's result."""
    from .launch import launch

    sizes = [positive_int("sizes_bytes[i]", s) for s in sizes_bytes]
    names = [impls] if isinstance(impls, str) else list(impls)
    for name in names:  # fail here, at once, rather than in every worker
        _resolve(name)
    positive_int("repeats", repeats)
    result = launch(measure_allreduce, world_size, sizes, names, repeats, timeout=timeout)[0]
    result["world_size"] = world_size
    return result


def plot_measured_vs_predicted(sizes, measured: dict, fits: dict, world_size: int, algorithm: str = "ring", ax=None):
    """Log-log: measured times (dots) per implementation and the fitted α–β line of each.

    measured: name -> times (s); fits: name -> (alpha, beta) for `algorithm` on `world_size` ranks.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        ax = plt.subplots(figsize=(6, 4))[1]
    sizes = np.asarray(sizes, dtype=float)
    grid = np.geomspace(sizes.min(), sizes.max(), 100)
    for name, times in measured.items():
        dots = ax.loglog(sizes, times, "o", label=f"{name} measured")[0]
        if name in fits:
            a, b = fits[name]
            bandwidth = 1 / b / 1e9 if b else math.inf
            ax.loglog(grid, allreduce_time(algorithm, grid, world_size, a, b), "-", color=dots.get_color(),
                      label=f"{name}: α–β {algorithm} fit, α={a * 1e6:.0f} µs, 1/β={bandwidth:.2f} GB/s")
    ax.set(xlabel="bytes per rank", ylabel="seconds per all-reduce",
           title=f"all-reduce on {world_size} ranks: measured vs α–β model")
    ax.legend(fontsize=8)
    return ax
