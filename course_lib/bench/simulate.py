"""The virtual clock against the real one: predicted vs measured step time on this machine.

    python -m course_lib.bench simulate [--quick] [--json]

Calibrates `simulate.cpu_this_machine` once: roofs measured now (a matmul, a copy, a launch), gloo's
α–β fitted to all-reduces timed inside the 2-rank launch, and per-op factors from one single-process
step of Net timed op by op (`simulate.calibrate`). Then records the course's BucketedDDP step of Net
on 2 and 4 gloo ranks (each rank one thread; 4 ranks on 2 cores share them, which the calibration is
told) and replays each recording on that profile: the error of the prediction is the result. The
replay knows nothing of the DDP run but its ops and all-reduces, so the error is what the model
leaves out (gloo's threads competing with compute, the barrier, the OS). Aim: within 25% on a quiet
machine; on a busy one, both sides move and the error says little.
"""
from __future__ import annotations

from ..env import torch_threads
from ..simulate import calibrate, cpu_this_machine, record_ddp, record_single, replay
from ..simulate.profiles import cores
from .result import BenchResult


def run(data_dir=None, quick: bool = False) -> BenchResult:
    batch = 32 if quick else 64
    with torch_threads(1):
        single = record_single("net", batch=batch, steps=3 if quick else 10, time_ops=3)
    rows, summary = [], {"benchmark": "simulate", "quick": quick, "batch_per_rank": batch, "cores": cores()}
    profile = None
    for world in (2, 4):
        rec = record_ddp(world, batch=batch, steps=3 if quick else 10, calibrate=profile is None)
        profile = profile or cpu_this_machine(rec.allreduce)
        fitted = calibrate(profile, single, ranks_per_core=world / cores())
        pred = replay(rec, fitted)
        error = (pred.step_s - rec.measured_step_s) / rec.measured_step_s
        rows.append({"step": f"BucketedDDP, Net, {world} gloo ranks", "measured ms": round(rec.measured_step_s * 1e3, 2),
                     "predicted ms": round(pred.step_s * 1e3, 2), "error": f"{error:+.0%}",
                     "compute ms": round(pred.compute_s * 1e3, 2), "exposed comm ms": round(pred.exposed_comm_s * 1e3, 2),
                     "all-reduces": pred.collectives})
        summary[f"ddp{world}_measured_ms"] = rec.measured_step_s * 1e3
        summary[f"ddp{world}_predicted_ms"] = pred.step_s * 1e3
        summary[f"ddp{world}_error"] = error
    summary["profile"] = profile.source
    title = (f"replayed vs measured step, Net, batch {batch} per rank (random images: no data set), on this machine "
             f"({cores()} cores); profile: {profile.source}")
    return BenchResult(title, rows, summary)
