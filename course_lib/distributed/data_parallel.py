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

`dp_report` runs this step for several K and draws what it recorded: traffic, timeline, DP vs DDP.
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


class _StepLog:
    """The bookkeeping of one dp_step: the bytes every device sends and receives, and when each phase ran."""

    def __init__(self, k: int, threads: bool):
        self.sent, self.received, self.events = [0] * k, [0] * k, []
        self.threads, self.t0 = threads, time.perf_counter()

    def send(self, tensor: torch.Tensor, src: int, dst: int) -> torch.Tensor:
        """Move `tensor` from device src to dst: a copy whose bytes are counted (no copy when src == dst)."""
        if src == dst:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        self.sent[src] += nbytes
        self.received[dst] += nbytes
        return tensor.detach().clone().requires_grad_(tensor.requires_grad)

    def timed(self, phase: str, device: int, fn):
        """fn(), recorded as `phase` on `device`."""
        start = time.perf_counter()
        result = fn()
        self.events.append(Event(phase, device, start - self.t0, time.perf_counter() - self.t0))
        return result

    def parallel(self, phase: str, calls) -> list:
        """calls[d]() on device d, for every d at once (one thread each if threads=True), recorded as `phase`."""
        results, spans = _run(calls, self.threads)
        self.events.extend(Event(phase, d, s - self.t0, e - self.t0) for d, (s, e) in enumerate(spans))
        return results


def _send_replicas(log: _StepLog, model: nn.Module, used: int) -> list[nn.Module]:
    """`replicate`, counting the master's parameters and buffers as sent to each of the other devices."""
    replicas = replicate(model, used)
    for d in range(1, used):
        for t in list(model.parameters()) + list(model.buffers()):
            log.send(t.detach(), MASTER, d)
    return replicas


def _receive_and_reduce(log: _StepLog, replicas, model: nn.Module) -> None:
    """`reduce_gradients`, counting every other replica's gradients as received by the master."""
    for d in range(1, len(replicas)):
        for p in replicas[d].parameters():
            if p.grad is not None:
                log.send(p.grad, d, MASTER)
    reduce_gradients(replicas, model)


def dp_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, k: int, loss_fn=F.cross_entropy,
            optimizer: torch.optim.Optimizer | None = None, threads: bool = False) -> DPReport:
    """One DataParallel training step of `model` (the master) on x [N, ...], y [N] over k simulated devices.

    Leaves the summed gradients in model's .grad and, if `optimizer` is given, takes its step.
    """
    positive_int("k", k)
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"x and y must be tensors with the same, non-zero number of rows; got "
                         f"{_describe(x)} and {_describe(y)}")
    log = _StepLog(k, threads)
    chunks = log.timed("scatter", MASTER, lambda: [log.send(c, MASTER, d) for d, c in enumerate(scatter(x, k))])
    used = len(chunks)  # torch.chunk may give fewer than k chunks: those devices sit idle, as in nn.DataParallel
    replicas = log.timed("replicate", MASTER, lambda: _send_replicas(log, model, used))

    outputs = log.parallel("forward", [lambda r=r, c=c: r(c) for r, c in zip(replicas, chunks)])
    for src, dst in zip(replicas[0].buffers(), model.buffers()):  # device 0's buffer updates persist (as in DP)
        dst.data.copy_(src.data)

    gathered = log.timed("gather", MASTER, lambda: torch.cat([log.send(o.detach(), d, MASTER)
                                                              for d, o in enumerate(outputs)]).requires_grad_())
    loss = log.timed("loss", MASTER, lambda: loss_fn(gathered, y))
    grad_out = log.timed("loss", MASTER, lambda: torch.autograd.grad(loss, gathered)[0])
    sizes = [len(o) for o in outputs]
    grad_chunks = log.timed("grad_scatter", MASTER,
                            lambda: [log.send(g, MASTER, d) for d, g in enumerate(grad_out.split(sizes))])
    log.parallel("backward", [lambda o=o, g=g: o.backward(g) for o, g in zip(outputs, grad_chunks)])

    log.timed("reduce", MASTER, lambda: _receive_and_reduce(log, replicas, model))
    if optimizer is not None:
        log.timed("step", MASTER, optimizer.step)
    return DPReport(k=k, loss=loss.item(), events=log.events, sent=log.sent, received=log.received)


def reference_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn=F.cross_entropy) -> list[torch.Tensor]:
    """Gradients of one device with the whole batch, computed on a copy (the model is not touched)."""
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    loss_fn(ref(x), y).backward()
    return [p.grad.clone() if p.grad is not None else None for p in ref.parameters()]


def max_grad_difference(model: nn.Module, grads: list[torch.Tensor]) -> float:
    """Largest |model.grad - grads| over all parameters (the course's equivalence measure)."""
    return max_diff([p.grad for p in model.parameters()], grads)


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


def _describe(value) -> str:
    return f"tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"{type(value).__name__}"
