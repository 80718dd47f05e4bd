"""What one simulated DataParallel step costs: traffic against K, its timeline, DP vs DDP vs model parallel.

The step itself (scatter, replicate, parallel_apply, gather, reduce, `dp_step`) is in `data_parallel`;
this module runs it for several K and draws what it recorded (notebook 06, sections 4 and 6).
"""
from __future__ import annotations

import torch

from .data_parallel import MASTER, PHASES, DPReport, dp_step


def traffic_by_k(make_model, x: torch.Tensor, y: torch.Tensor, ks) -> list[dict]:
    """Run one dp_step per k on a fresh `make_model()`; bytes through the master and through device 1."""
    rows = []
    for k in ks:
        report = dp_step(make_model(), x, y, k)
        rows.append({"k": k, "master_bytes": report.traffic(MASTER),
                     "other_bytes": report.traffic(1) if report.k > 1 else 0})
    return rows


def plot_traffic(rows, ax=None):
    """Bytes per step through the master and through one other device, against k."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 3.5))[1]     # a figure of its own, never whatever is current
    ks = [r["k"] for r in rows]
    ax.plot(ks, [r["master_bytes"] / 1e6 for r in rows], "o-", label="master (device 0)")
    ax.plot(ks, [r["other_bytes"] / 1e6 for r in rows], "s--", label="device 1 (any non-master)")
    ax.set(xlabel="devices K", ylabel="MB sent + received per step", title="DataParallel traffic per device")
    ax.legend()
    return ax


def plot_dp_timeline(report: DPReport, ax=None, ideal: bool = True):
    """One lane per device, one bar per phase.

    ideal=True lays the measured durations out as K real devices would run them: the replicas'
    forward/backward side by side, every master-only phase on lane 0 while the others wait.
    ideal=False draws the measured start times (sequential on a CPU unless threads=True).
    """
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(8, 3))[1]
    colors = dict(zip(PHASES, plt.cm.tab10.colors))
    clock = 0.0
    for phase in PHASES:
        evs = [e for e in report.events if e.phase == phase]
        if not evs:
            continue
        first = {e.device: min(v.start for v in evs if v.device == e.device) for e in evs}
        starts = [clock + e.start - first[e.device] if ideal else e.start for e in evs]
        for n, (e, start) in enumerate(zip(evs, starts)):
            ax.barh(e.device, e.end - e.start, left=start, color=colors[phase],
                    label=phase if n == 0 else None, edgecolor="black", linewidth=0.3)
        clock = max(s + e.end - e.start for e, s in zip(evs, starts))
    ax.set(xlabel="seconds", ylabel="device", yticks=range(report.k),
           title=f"DataParallel step, K={report.k} ({'ideal parallel' if ideal else 'measured'} schedule)")
    ax.invert_yaxis()
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    return ax


COMPARISON = [
    {"": "processes", "DataParallel (DP)": "1 (one thread per GPU)", "DistributedDataParallel (DDP)": "1 per GPU",
     "sharded data parallel (FSDP / ZeRO, 10)": "1 per GPU", "model parallel (MP: tensor, pipeline; 09)": "1 per GPU or stage"},
    {"": "replicated", "DataParallel (DP)": "whole model, re-copied every step",
     "DistributedDataParallel (DDP)": "whole model, copied once at start",
     "sharded data parallel (FSDP / ZeRO, 10)": "nothing at rest: weights, grads, optimizer state sharded; a layer is gathered while it runs",
     "model parallel (MP: tensor, pipeline; 09)": "nothing: layers or tensors are split"},
    {"": "split", "DataParallel (DP)": "the batch", "DistributedDataParallel (DDP)": "the batch (DistributedSampler)",
     "sharded data parallel (FSDP / ZeRO, 10)": "the batch, and the model's state", "model parallel (MP: tensor, pipeline; 09)": "the model (layers or tensors)"},
    {"": "communicated per step", "DataParallel (DP)": "inputs, weights, outputs, output grads, weight grads",
     "DistributedDataParallel (DDP)": "gradients only (all-reduce, overlapped with backward)",
     "sharded data parallel (FSDP / ZeRO, 10)": "weights all-gathered per layer, gradients reduce-scattered: ~1.5x DDP's bytes",
     "model parallel (MP: tensor, pipeline; 09)": "activations forward, their grads backward"},
    {"": "master bottleneck", "DataParallel (DP)": "yes: device 0 sends/receives K-1 copies",
     "DistributedDataParallel (DDP)": "no: ring all-reduce, 2(K-1)/K per rank",
     "sharded data parallel (FSDP / ZeRO, 10)": "no", "model parallel (MP: tensor, pipeline; 09)": "no (but pipeline bubbles)"},
    {"": "Python GIL", "DataParallel (DP)": "shared by all devices", "DistributedDataParallel (DDP)": "one per process",
     "sharded data parallel (FSDP / ZeRO, 10)": "one per process", "model parallel (MP: tensor, pipeline; 09)": "one per process"},
    {"": "multi-node", "DataParallel (DP)": "no", "DistributedDataParallel (DDP)": "yes",
     "sharded data parallel (FSDP / ZeRO, 10)": "yes", "model parallel (MP: tensor, pipeline; 09)": "yes (pipelines across nodes, tensor parallel inside one)"},
    {"": "use when", "DataParallel (DP)": "never for new code (PyTorch recommends DDP)",
     "DistributedDataParallel (DDP)": "the model, its gradients and optimizer state fit on one GPU",
     "sharded data parallel (FSDP / ZeRO, 10)": "they do not fit: the first answer, with no change to the model's code",
     "model parallel (MP: tensor, pipeline; 09)": "after sharding: one layer's weights or activations exceed a GPU, or the per-layer gathers of FSDP cost more than the links give at the batch that fits (large clusters); usually combined with FSDP"},
]


def comparison_markdown() -> str:
    """COMPARISON as a markdown table (display it with IPython.display.Markdown)."""
    cols = list(COMPARISON[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row[c] for c in cols) + " |" for row in COMPARISON]
    return "\n".join(lines)
