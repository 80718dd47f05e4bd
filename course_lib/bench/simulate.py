"""The virtual clock against the real one: predicted vs measured step time on this machine.

    python -m course_lib.bench simulate [--quick] [--json]

For 2 and 4 gloo ranks (one thread each; 4 ranks share the 2 cores), one launch records the course's
BucketedDDP step of Net and calibrates `simulate.cpu_this_machine` to it: roofs measured now (a matmul,
a copy, a launch), gloo's α–β fitted to all-reduces timed in that launch, and per-op factors from each
rank's step WITHOUT DDP timed op by op while all ranks ran it (`simulate.calibrate`: the compute is
priced at the speed it has when the ranks share the machine). The replay of the DDP recording on that
profile is then a prediction of what DDP adds: its all-reduces, their overlap, the waits. The
same for lecture 09's 2-stage GPipe step (`simulate.pipeline.compare_measured`: its profile is
measured on the launched ranks, roofline only). The
replay knows nothing of the DDP run but its ops and all-reduces, so the error is what the model
leaves out (gloo's threads competing with compute, the barrier, the OS). Aim: within 25% on a quiet
machine; on a busy one, both sides move and the error says little.

A GPU measurement shipped with the course is compared too: lecture 04's recorded training rate of Net
on an H200 (batch 64, data resident on the GPU), against Net's step replayed on `h200_node`. Net's step
is 62 tiny kernels: on a GPU its time is the host's (Python, autograd, the dispatcher, the launch: the
profiles' host_s per kernel), not the kernels'. That host cost is CALIBRATED on this same measurement
(`profiles.gpu_host_seconds`), so the eager row agrees by construction: it checks the replay's host
rule, not a prediction. Beside it, the same step under a CUDA graph (predicted: no per-kernel host cost),
and the launch alone as lecture 04 measured it on the same host (an unsynchronised matmul call): the part
of the host's work that is not Python and autograd.
"""
from __future__ import annotations

import re
from dataclasses import replace

from .. import recorded
from ..simulate import (
    calibrate,
    compare_measured,
    cpu_this_machine,
    get_profile,
    replay,
)
from ..simulate.profiles import cores
from ..simulate.record import record_ddp, record_single
from .result import BenchResult


def run(data_dir=None, quick: bool = False) -> BenchResult:
    batch = 32 if quick else 64
    rows, summary = [], {"benchmark": "simulate", "quick": quick, "batch_per_rank": batch, "cores": cores()}
    for world in (2, 4):
        rec = record_ddp(world, batch=batch, steps=3 if quick else 10, calibrate=True)
        profile = cpu_this_machine(rec.allreduce, world_size=world)
        pred = replay(rec, calibrate(profile, rec.local_recording()))
        error = (pred.step_s - rec.measured_step_s) / rec.measured_step_s
        rows.append({"step": f"BucketedDDP, Net, {world} gloo ranks", "measured ms": round(rec.measured_step_s * 1e3, 2),
                     "predicted ms": round(pred.step_s * 1e3, 2), "error": f"{error:+.0%}",
                     "compute ms": round(pred.compute_s * 1e3, 2), "exposed comm ms": round(pred.exposed_comm_s * 1e3, 2),
                     "all-reduces": pred.collectives})
        summary[f"ddp{world}_measured_ms"] = rec.measured_step_s * 1e3
        summary[f"ddp{world}_predicted_ms"] = pred.step_s * 1e3
        summary[f"ddp{world}_error"] = error
        summary[f"ddp{world}_local_ms"] = rec.local["seconds"] * 1e3
    summary["profile"] = profile.source
    pipe = compare_measured("gpipe", 4, steps=2 if quick else 5, batch=128 if quick else 256)
    rows.append({"step": "GPipe, 2 stages, 4 micro-batches (lecture 09's MLP)",
                 "measured ms": round(pipe["measured_s"] * 1e3, 2), "predicted ms": round(pipe["predicted_s"] * 1e3, 2),
                 "error": f"{pipe['error']:+.0%}", "compute ms": "-", "exposed comm ms": "-", "all-reduces": 0})
    summary.update(pipeline_measured_ms=pipe["measured_s"] * 1e3, pipeline_predicted_ms=pipe["predicted_s"] * 1e3,
                   pipeline_error=pipe["error"], pipeline_bubble_measured=pipe["measured_bubble"],
                   pipeline_bubble_predicted=pipe["predicted_bubble"])
    rows += _recorded_gpu(summary)
    if "gpu_host_us_per_kernel" in summary:
        launch = summary["gpu_launch_us"]
        title_gpu = (f"; the {summary['gpu_device']} step: {summary['gpu_host_us_per_kernel']:.0f} µs of host work per "
                     "kernel" + (f", of which the launch alone {launch:.0f} µs (lecture 04)" if launch else "")
                     + f", host-bound: {summary['gpu_host_bound']}")
    else:
        title_gpu = "; no recorded GPU result"
    title = (f"replayed vs measured step, Net, batch {batch} per rank (random images: no data set), on this machine "
             f"({cores()} cores); profile: {profile.source}{title_gpu}")
    return BenchResult(title, rows, summary)


def _recorded_gpu(summary: dict) -> list:
    """Lecture 04's recorded H200 rate of Net against Net's step replayed on h200_node, eager and as a CUDA
    graph; [] without it."""
    gpu = recorded.load("04_single_gpu")
    rate = (recorded.values("04_single_gpu", "rates") or {}).get("TensorLoader on device")
    if not (gpu and rate):
        return []
    measured = 64 / rate
    net = record_single("net", batch=64, steps=1)
    profile = get_profile("h200_node")
    eager, graph = replay(net, profile), replay(net, replace(profile, cuda_graph=True))
    error = (eager.step_s - measured) / measured
    launch = re.search(r"without synchronize: ([0-9.]+) ms per call", gpu["cells"].get("synchronize", ""))
    summary.update(gpu_measured_ms=measured * 1e3, gpu_predicted_ms=eager.step_s * 1e3, gpu_error=error,
                   gpu_device=gpu["meta"]["device"], gpu_host_us_per_kernel=profile.host_s * 1e6,
                   gpu_launch_us=float(launch.group(1)) * 1e3 if launch else None,
                   gpu_host_bound=eager.host_bound, gpu_cuda_graph_ms=graph.step_s * 1e3)
    device = f"1 {gpu['meta']['device']} (recorded {gpu['meta']['date']})"
    return [{"step": f"Net, batch 64, {device}, eager (host cost calibrated on it)", "measured ms": round(measured * 1e3, 3),
             "predicted ms": round(eager.step_s * 1e3, 3), "error": f"{error:+.0%}",
             "compute ms": round(eager.compute_s * 1e3, 3), "exposed comm ms": 0.0, "all-reduces": 0},
            {"step": f"Net, batch 64, {device}, as one CUDA graph (prediction only)", "measured ms": "-",
             "predicted ms": round(graph.step_s * 1e3, 3), "error": "-",
             "compute ms": round(graph.compute_s * 1e3, 3), "exposed comm ms": 0.0, "all-reduces": 0}]
