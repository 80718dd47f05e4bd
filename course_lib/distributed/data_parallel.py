"""nn.DataParallel's single-process sequence, simulated over K CPU "devices"; why the master is a bottleneck.

One training step of `nn.DataParallel` on K GPUs, with device 0 as the master:

    scatter      split the batch [N, ...] along dim 0 into K chunks (torch.chunk sizes)  master -> devices
    replicate    copy the module to every device, EVERY step                              master -> devices
    parallel_apply  each replica runs forward on its chunk                                 (in parallel)
    gather       concatenate the K outputs [N_i, C] -> [N, C] on the master               devices -> master
    loss         on the master, over the whole gathered batch
    backward     dL/doutput is scattered back; each replica runs backward                 master -> devices
    reduce       replica gradients are SUMMED into the master's                           devices -> master
    step         the optimizer updates the master's parameters only

Here a "device" is a label: replicas are deep copies, a transfer is a copy (`clone`) whose bytes
are counted. The master sends K-1 copies of the model and receives K-1 copies of the gradients, so
its traffic grows with K while every other device's stays constant: the bottleneck that DDP (notebook
07) removes. The sum in `reduce` is what real DP does: replicas are made by `Broadcast`, whose backward
adds the replicas' gradients into the original parameters. A sum (not a mean) is right because the loss
is already the mean over the whole gathered batch.

Gradients equal those of one device with the whole batch, *if* the model behaves the same on chunks:
dropout draws different masks per replica (disable it, or compare in eval mode), and BatchNorm in
training mode normalises each chunk with that chunk's statistics (use eval mode, or DDP's SyncBatchNorm).
As in real DP, buffer updates made on device 0 (BatchNorm running stats) are kept; the others are lost.
"""
from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..models import max_diff
from ..validate import positive_int

MASTER = 0
PHASES = ("scatter", "replicate", "forward", "gather", "loss", "grad_scatter", "backward", "reduce", "step")


def scatter(batch: torch.Tensor, k: int) -> list[torch.Tensor]:
    """Split `batch` [N, ...] along dim 0 into at most k chunks, sizes as torch.chunk (and nn.parallel.scatter).

    torch.chunk makes chunks of ceil(N/k) rows, so it can return FEWER than k chunks (N=5, k=4 -> 2,2,1);
    nn.DataParallel then uses only that many devices. Chunks are views; `dp_step` copies them to devices.
    """
    positive_int("k", k)
    if not isinstance(batch, torch.Tensor) or batch.dim() == 0 or batch.shape[0] == 0:
        raise ValueError(f"batch must be a tensor with at least one row along dim 0; got {_describe(batch)}")
    return list(torch.chunk(batch, k, dim=0))


def replicate(module: nn.Module, k: int) -> list[nn.Module]:
    """k independent copies of `module` (parameters and buffers copied, gradients cleared).

    Real DP broadcasts the parameters from the master to every GPU on every forward: the weights
    changed at the last step, so the copies cannot be kept.
    """
    positive_int("k", k)
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module; got {type(module).__name__}")
    replicas = [copy.deepcopy(module) for _ in range(k)]
    for replica in replicas:
        for p in replica.parameters():
            p.grad = None
    return replicas


def _run(calls, threads: bool):
    """Run the zero-argument `calls`, one per device; return (results, [(start, end)] per call)."""
    results, spans, errors = [None] * len(calls), [None] * len(calls), []

    def work(i):
        start = time.perf_counter()
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # re-raised in the caller's thread, like torch's parallel_apply
            errors.append(exc)
        spans[i] = (start, time.perf_counter())

    if threads:
        workers = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    else:
        for i in range(len(calls)):
            work(i)
    if errors:
        raise errors[0]
    return results, spans


def parallel_apply(replicas, inputs, threads: bool = False) -> list:
    """`replicas[i](inputs[i])` for every i: [replica outputs].

    threads=True runs one Python thread per replica, as torch's parallel_apply does: on GPUs the
    threads only launch asynchronous kernels, so K devices compute at once. On a CPU the replicas
    share the same cores, so the default runs them one after the other: same results, cleaner timings.
    """
    if len(replicas) != len(inputs):
        raise ValueError(f"need one input per replica; got {len(replicas)} replicas and {len(inputs)} inputs")
    return _run([lambda r=r, x=x: r(x) for r, x in zip(replicas, inputs)], threads)[0]


def gather(outputs, dim: int = 0) -> torch.Tensor:
    """Concatenate the replicas' outputs [N_i, C] into [N, C] on the master (differentiable, like Gather)."""
    if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise ValueError("outputs must be a non-empty list of tensors")
    return torch.cat(list(outputs), dim=dim)


def reduce_gradients(replicas, master: nn.Module) -> None:
    """Write the SUM of the replicas' gradients into `master`'s .grad (replacing what was there).

    Like dist.reduce, the destination is overwritten, so a step never mixes in an old gradient.
    A parameter no replica has a gradient for gets .grad = None.
    """
    if not isinstance(master, nn.Module) or not replicas:
        raise ValueError("need a master nn.Module and a non-empty list of replicas")
    params = [list(m.parameters()) for m in (master, *replicas)]
    if len({len(ps) for ps in params}) != 1:
        raise ValueError(f"replicas must have the master's {len(params[0])} parameters; "
                         f"got {[len(ps) for ps in params[1:]]}")
    for target, *copies in zip(*params):
        grads = [p.grad for p in copies if p.grad is not None]
        target.grad = torch.stack(grads).sum(0) if grads else None


@dataclass
class Event:
    """One phase on one device; times in seconds from the start of the step."""

    phase: str
    device: int
    start: float
    end: float


@dataclass
class DPReport:
    """What one `dp_step` did: loss, per-phase events, and bytes sent/received per device."""

    k: int
    loss: float
    events: list[Event] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    received: list[int] = field(default_factory=list)

    def traffic(self, device: int) -> int:
        """Bytes that crossed `device`'s link (sent + received) in this step."""
        return self.sent[device] + self.received[device]

    def phase_times(self) -> dict[str, float]:
        """Measured wall time per phase (a parallel phase counts from its first start to its last end)."""
        out = {}
        for phase in PHASES:
            evs = [e for e in self.events if e.phase == phase]
            if evs:
                out[phase] = max(e.end for e in evs) - min(e.start for e in evs)
        return out


def dp_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, loss_fn=F.cross_entropy,
            optimizer: torch.optim.Optimizer | None = None, threads: bool = False) -> DPReport:
    """One DataParallel training step of `model` (the master) on x [N, ...], y [N] over k simulated devices.

    Leaves the summed gradients in model's .grad and, if `optimizer` is given, takes its step.
    """
    positive_int("k", k)
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"x and y must be tensors with the same, non-zero number of rows; got "
                         f"{_describe(x)} and {_describe(y)}")
    t0 = time.perf_counter()
    sent, received, events = [0] * k, [0] * k, []

    def send(tensor: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        if src == dst:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        sent[src] += nbytes
        received[dst] += nbytes
        return tensor.detach().clone().requires_grad_(tensor.requires_grad)

    def timed(phase, device, fn):
        start = time.perf_counter()
        result = fn()
        events.append(Event(phase, device, start - t0, time.perf_counter() - t0))
        return result

    def timed_parallel(phase, calls):
        results, spans = _run(calls, threads)
        events.extend(Event(phase, d, s - t0, e - t0) for d, (s, e) in enumerate(spans))
        return results

    chunks = timed("scatter", MASTER, lambda: [send(c, MASTER, d) for d, c in enumerate(scatter(x, k))])
    used = len(chunks)  # torch.chunk may give fewer than k chunks: those devices sit idle, as in nn.DataParallel

    def copy_model():
        replicas = replicate(model, used)
        for d in range(1, used):
            for t in list(model.parameters()) + list(model.buffers()):
                send(t.detach(), MASTER, d)
        return replicas
    replicas = timed("replicate", MASTER, copy_model)

    outputs = timed_parallel("forward", [lambda r=r, c=c: r(c) for r, c in zip(replicas, chunks)])
    for src, dst in zip(replicas[0].buffers(), model.buffers()):  # device 0's buffer updates persist (as in DP)
        dst.data.copy_(src.data)

    gathered = timed("gather", MASTER, lambda: torch.cat([send(o.detach(), d, MASTER) for d, o in enumerate(outputs)])
                     .requires_grad_())
    loss = timed("loss", MASTER, lambda: loss_fn(gathered, y))
    grad_out = timed("loss", MASTER, lambda: torch.autograd.grad(loss, gathered)[0])
    grad_chunks = timed("grad_scatter", MASTER,
                        lambda: [send(g, MASTER, d) for d, g in enumerate(grad_out.split([len(o) for o in outputs]))])
    timed_parallel("backward", [lambda o=o, g=g: o.backward(g) for o, g in zip(outputs, grad_chunks)])

    def reduce():
        for d in range(1, used):
            for p in replicas[d].parameters():
                if p.grad is not None:
                    send(p.grad, d, MASTER)
        reduce_gradients(replicas, model)
    timed("reduce", MASTER, reduce)
    if optimizer is not None:
        timed("step", MASTER, optimizer.step)
    return DPReport(k=k, loss=loss.item(), events=events, sent=sent, received=received)


def reference_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn=F.cross_entropy) -> list[torch.Tensor]:
    """Gradients of one device with the whole batch, computed on a copy (the model is not touched)."""
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    loss_fn(ref(x), y).backward()
    return [p.grad.clone() if p.grad is not None else None for p in ref.parameters()]


def max_grad_difference(model: nn.Module, grads: list[torch.Tensor]) -> float:
    """Largest |model.grad - grads| over all parameters (the course's equivalence measure)."""
    return max_diff([p.grad for p in model.parameters()], grads)


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

    ax = ax or plt.gca()
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

    ax = ax or plt.gca()
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


def torch_data_parallel_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int,
                              loss_fn=F.cross_entropy) -> list[torch.Tensor]:
    """Gradients from real nn.DataParallel over cuda:0..k-1 (needs k >= 2 GPUs), returned on the CPU."""
    positive_int("k", k)
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if k < 2 or available < k:
        raise ValueError(f"k must be between 2 and the number of CUDA GPUs ({available}); got {k}")
    dp = nn.DataParallel(copy.deepcopy(model).to("cuda:0"), device_ids=list(range(k)))
    dp.module.zero_grad(set_to_none=True)
    loss_fn(dp(x.to("cuda:0")), y.to("cuda:0")).backward()
    return [p.grad.cpu() for p in dp.module.parameters()]


def assert_matches_torch_dp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, atol: float = 1e-5) -> float:
    """Our dp_step (on CPU) and real nn.DataParallel (on k GPUs) give the same gradients; return the max gap."""
    theirs = torch_data_parallel_grads(model, x, y, k)
    ours = copy.deepcopy(model)
    dp_step(ours, x, y, k)
    gap = max_grad_difference(ours, theirs)
    assert gap < atol, f"our DataParallel gradients differ from nn.DataParallel's by {gap:.3g} (atol {atol})"
    return gap


COMPARISON = [
    {"": "processes", "DataParallel (DP)": "1 (one thread per GPU)", "DistributedDataParallel (DDP)": "1 per GPU",
     "model parallel (MP)": "1 (or 1 per stage)"},
    {"": "replicated", "DataParallel (DP)": "whole model, re-copied every step",
     "DistributedDataParallel (DDP)": "whole model, copied once at start", "model parallel (MP)": "nothing: layers are split"},
    {"": "split", "DataParallel (DP)": "the batch", "DistributedDataParallel (DDP)": "the batch (DistributedSampler)",
     "model parallel (MP)": "the model (layers or tensors)"},
    {"": "communicated per step", "DataParallel (DP)": "inputs, weights, outputs, output grads, weight grads",
     "DistributedDataParallel (DDP)": "gradients only (all-reduce, overlapped with backward)",
     "model parallel (MP)": "activations forward, their grads backward"},
    {"": "master bottleneck", "DataParallel (DP)": "yes: device 0 sends/receives K-1 copies",
     "DistributedDataParallel (DDP)": "no: ring all-reduce, 2(K-1)/K per rank", "model parallel (MP)": "no (but pipeline bubbles)"},
    {"": "Python GIL", "DataParallel (DP)": "shared by all devices", "DistributedDataParallel (DDP)": "one per process",
     "model parallel (MP)": "shared if one process"},
    {"": "multi-node", "DataParallel (DP)": "no", "DistributedDataParallel (DDP)": "yes",
     "model parallel (MP)": "yes (with RPC / pipelines)"},
    {"": "use when", "DataParallel (DP)": "never for new code (PyTorch recommends DDP)",
     "DistributedDataParallel (DDP)": "the model fits on one GPU", "model parallel (MP)": "the model does not fit on one GPU"},
]


def comparison_markdown() -> str:
    """COMPARISON as a markdown table (display it with IPython.display.Markdown)."""
    cols = list(COMPARISON[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row[c] for c in cols) + " |" for row in COMPARISON]
    return "\n".join(lines)


def _describe(value) -> str:
    return f"tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"{type(value).__name__}"
