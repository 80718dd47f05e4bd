"""Benchmark: our from-scratch ring all-reduce against torch's `dist.all_reduce` (gloo on CPU).

    python -m course_lib.bench allreduce --json     # 2 ranks, 1 KB .. 64 MB
    python -m course_lib.bench allreduce --quick    # 1 KB .. 4 MB, fewer repeats (tests)

Both run in the same launch, alternating at each size, so a busy machine slows both alike. The
α–β ring model is fitted to each one's times separately; `model_max_error` is the fit's worst
relative error on OUR ring for sizes >= 64 KB (below that, timer and scheduler noise dominate).
"""
from __future__ import annotations

import statistics

import numpy as np

from ..distributed import costmodel
from .result import BenchResult

WORLD_SIZE = 2
SIZES = [2**10 * 4**k for k in range(9)]                       # 1 KB, 4 KB, ..., 64 MB
QUICK_SIZES = [2**10, 2**14, 2**16, 2**18, 2**20, 2**22, 2**24]  # 1 KB .. 16 MB: a wide enough range to fit β
LARGE, FIT_CHECKED = 2**20, 2**16                              # ratio over >= 1 MB; error over >= 64 KB


def human_bytes(n: int) -> str:
    """1024 -> '1 KB', 2**20 -> '1 MB' (binary units, as nccl-tests' sizes are)."""
    for unit, scale in (("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def analyse(measured: dict, algorithm: str = "ring") -> dict:
    """Fit α, β per implementation; return {"fits": {impl: (α, β)}, "errors": {impl: [rel. error]}}."""
    sizes, p = measured["sizes"], measured["world_size"]
    fits, errors = {}, {}
    for name, times in measured["times"].items():
        fits[name] = costmodel.fit_alpha_beta(sizes, times, algorithm, p)
        errors[name] = costmodel.relative_errors(sizes, times, algorithm, p, *fits[name]).tolist()
    return {"fits": fits, "errors": errors}


def allreduce_bench(data_dir=None, quick: bool = False):
    """Measure both all-reduces and fit the α–β model to each (data_dir is unused: no MNIST here)."""
    sizes = QUICK_SIZES if quick else SIZES
    m = costmodel.measure(sizes, impls=("torch", "ring"), world_size=WORLD_SIZE, repeats=3 if quick else 9)
    fit = analyse(m)
    torch_t, ring_t = np.array(m["times"]["torch"]), np.array(m["times"]["ring"])
    big, checked = np.array(sizes) >= LARGE, np.array(sizes) >= FIT_CHECKED
    rows = [{"size": human_bytes(s), f"{m['backend']} ms": round(tt * 1e3, 3), "ring ms": round(rt * 1e3, 3),
             f"{m['backend']}/ring": round(tt / rt, 2),
             "ring algbw GB/s": round(float(costmodel.algbw(s, rt)), 3),
             "ring busbw GB/s": round(float(costmodel.busbw(s, rt, WORLD_SIZE)), 3),
             "ring model ms": round(float(costmodel.ring_time(s, WORLD_SIZE, *fit["fits"]["ring"])) * 1e3, 3),
             "ring model err": round(fit["errors"]["ring"][i], 3)}
            for i, (s, tt, rt) in enumerate(zip(sizes, torch_t, ring_t))]
    ratio = round(statistics.median((torch_t / ring_t)[big].tolist()), 3)
    (a_ring, b_ring), (a_torch, b_torch) = fit["fits"]["ring"], fit["fits"]["torch"]
    summary = {
        "benchmark": "allreduce",
        "ratio_1mb_plus": ratio,
        "speedup": ratio,  # what `python -m course_lib.bench` prints: < 1 means gloo is faster
        "model_max_error": round(float(np.max(np.array(fit["errors"]["ring"])[checked])), 3),
        "model_max_error_torch": round(float(np.max(np.array(fit["errors"]["torch"])[checked])), 3),
        "alpha_us": round(a_ring * 1e6, 2), "bandwidth_GBps": round(1 / b_ring / 1e9, 3) if b_ring else None,
        "alpha_us_torch": round(a_torch * 1e6, 2),
        "bandwidth_GBps_torch": round(1 / b_torch / 1e9, 3) if b_torch else None,
        "backend": m["backend"], "world_size": WORLD_SIZE, "quick": quick,
        "table": [{"bytes": s, "torch_s": tt, "ring_s": rt} for s, tt, rt in
                  zip(sizes, torch_t.tolist(), ring_t.tolist())],
    }
    title = (f"all-reduce on {WORLD_SIZE} ranks ({m['backend']}): our ring vs dist.all_reduce, "
             f"median of repeats, slowest rank; ring model α={summary['alpha_us']} µs, "
             f"1/β={summary['bandwidth_GBps']} GB/s")
    return BenchResult(title, rows, summary)


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """The registry's entry point: `allreduce_bench`."""
    return allreduce_bench(data_dir, quick)
