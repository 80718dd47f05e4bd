"""Workers for `launch` that measure sharded training against DDP (notebook 10, bench sharding).

    from course_lib.distributed.launch import launch
    from course_lib.distributed.sharding_workers import measure_fsdp, measure_zero
    launch(measure_zero, 2)    # per rank: optimizer-state bytes of Adam, ZeRO-1, ours; weight differences
    launch(measure_fsdp, 2)    # per rank: parameter/gradient/state bytes and losses, FSDP2 vs DDP
    trace.merge(launch(trace_fsdp, 2)).draw()   # a few FSDP2 steps: all-gathers, reduce-scatters
    launch(fsdp_knobs, 4, backend="gloo")       # FSDP2's knobs: each one's collectives, dtypes, bytes held

Both train `shard_friendly_mlp` on each rank's own random MNIST-shaped batches (the same batches
for every variant), so the variants must agree to rounding: sharding changes where the numbers
live, not what they are. `fsdp_knobs` logs each collective FSDP2 issues (a TorchDispatchMode sees
every c10d op, the mechanism of torch's CommDebugMode) under each setting of its knobs.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from torch.utils._python_dispatch import TorchDispatchMode

from .. import trace
from ..env import rank_device
from ..models import max_diff
from ..validate import positive_int
from .sharding import (ShardedOptimizer, gradient_bytes, optimizer_state_bytes, parameter_bytes,
                       shard_model)


def shard_friendly_mlp(width: int = 784, depth: int = 4) -> nn.Sequential:
    """784 -> width (x depth layers, ReLU) -> 10: [N,1,28,28] or [N,784] -> [N,10].

    With width 784 the `depth` weight matrices are all 784x784, so ZeroRedundancyOptimizer (which
    hands out WHOLE tensors, largest first, to the least-loaded rank) splits them evenly over 2 or 4
    ranks; only the 10x784 head and the biases cannot be balanced (about 0.1% off a half). Every
    first dimension is even, so FSDP2's dim-0 halves are exact.
    """
    positive_int("width", width)
    positive_int("depth", depth)
    layers = [nn.Flatten(), nn.Linear(784, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _batches(rank: int, steps: int, batch: int, device):
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(batch, 784, generator=g).to(device), torch.randint(0, 10, (batch,), generator=g).to(device))
            for _ in range(steps)]


def _train(model, optimizer, batches) -> list[float]:
    losses = []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def measure_zero(rank: int, world_size: int, steps: int = 3, width: int = 784, depth: int = 4, batch: int = 32,
                 lr: float = 1e-3) -> dict:
    """Worker: `steps` Adam steps three ways from the same weights, on this rank's own batches.

    "adam": DDP + Adam (every rank keeps the whole state); "zero1": DDP + ZeroRedundancyOptimizer(Adam);
    "manual": ShardedOptimizer(Adam), no DDP. Returns this rank's optimizer-state bytes of each
    ("state_bytes"), its parameter bytes, the losses, max |weight - DDP + Adam's weight| ("max_diff"),
    and the names of the parameters whose state ZeRO-1 gave this rank ("zero1_owns").
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer

    positive_int("steps", steps)
    device = rank_device()
    torch.manual_seed(0)
    base = shard_friendly_mlp(width, depth).to(device)
    ids = [device.index] if device.type == "cuda" else None
    adam_model, zero_model = (nn.parallel.DistributedDataParallel(copy.deepcopy(base), device_ids=ids) for _ in range(2))
    manual_model = copy.deepcopy(base)
    zero = ZeroRedundancyOptimizer(zero_model.parameters(), torch.optim.Adam, lr=lr)
    runs = {"adam": (adam_model, torch.optim.Adam(adam_model.parameters(), lr=lr)), "zero1": (zero_model, zero),
            "manual": (manual_model, ShardedOptimizer(manual_model.parameters(), torch.optim.Adam, lr=lr))}
    batches = _batches(rank, steps, batch, device)
    losses = {name: _train(model, opt, batches) for name, (model, opt) in runs.items()}
    names = {id(p): n for n, p in zero_model.module.named_parameters()}
    return {"state_bytes": {"adam": optimizer_state_bytes(runs["adam"][1]), "zero1": optimizer_state_bytes(zero.optim),
                            "manual": optimizer_state_bytes(runs["manual"][1].optimizer)},
            "param_bytes": parameter_bytes(base), "losses": losses,
            "max_diff": {name: max_diff(model, adam_model) for name, (model, _) in runs.items() if name != "adam"},
            "zero1_owns": [names[id(p)] for group in zero.optim.param_groups for p in group["params"]]}


def measure_fsdp(rank: int, world_size: int, steps: int = 5, width: int = 784, depth: int = 4, batch: int = 32,
                 lr: float = 1e-3, trace_steps: int = 0) -> dict:
    """Worker: the same model under DDP + Adam and under FSDP2 (`shard_model`) + Adam, same batches.

    Returns per-step losses of both ("losses"), this rank's bytes of parameters, gradients (after the
    last backward) and optimizer state under each ("param_bytes", "grad_bytes", "state_bytes"),
    max |FSDP weight - DDP weight| at the end, and {name: [global shape, this rank's shard shape]}.
    trace_steps > 0: then records that many more FSDP steps ("timeline", as `trace_fsdp`).
    """
    positive_int("steps", steps)
    device = rank_device()
    torch.manual_seed(0)
    base = shard_friendly_mlp(width, depth).to(device)
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(base),
                                              device_ids=[device.index] if device.type == "cuda" else None)
    fsdp = shard_model(copy.deepcopy(base))
    ddp_opt, fsdp_opt = torch.optim.Adam(ddp.parameters(), lr=lr), torch.optim.Adam(fsdp.parameters(), lr=lr)
    batches = _batches(rank, steps, batch, device)
    losses = {"ddp": _train(ddp, ddp_opt, batches), "fsdp": _train(fsdp, fsdp_opt, batches)}
    out = {"losses": losses, "max_diff": max_diff(fsdp, ddp.module),
           "shapes": {n: [list(p.shape), list(p.to_local().shape)] for n, p in fsdp.named_parameters()}}
    for key, count in (("param_bytes", parameter_bytes), ("grad_bytes", gradient_bytes)):
        out[key] = {"ddp": count(ddp.module), "fsdp": count(fsdp)}
    out["state_bytes"] = {"ddp": optimizer_state_bytes(ddp_opt), "fsdp": optimizer_state_bytes(fsdp_opt)}
    if trace_steps:
        out["timeline"] = _record_steps(fsdp, fsdp_opt, batches[0], positive_int("trace_steps", trace_steps),
                                        f"FSDP2 + Adam, {world_size} ranks, random batches of {batch}")
    return out


def measure_sharding(rank: int, world_size: int, steps: int = 3, width: int = 784, depth: int = 4) -> dict:
    """Worker: {"zero": measure_zero(...), "fsdp": measure_fsdp(...)}, one process start-up for both."""
    return {"zero": measure_zero(rank, world_size, steps, width, depth),
            "fsdp": measure_fsdp(rank, world_size, steps, width, depth)}


def trace_fsdp(rank: int, world_size: int, steps: int = 3, width: int = 784, depth: int = 4,
               batch: int = 32) -> trace.Timeline:
    """Worker: record `steps` FSDP2 + Adam steps (after one warm-up) and return this rank's Timeline."""
    positive_int("steps", steps)
    device = rank_device()
    torch.manual_seed(0)
    model = shard_model(shard_friendly_mlp(width, depth).to(device))
    return _record_steps(model, torch.optim.Adam(model.parameters(), lr=1e-3), _batches(rank, 1, batch, device)[0],
                         steps, f"FSDP2 + Adam, {world_size} ranks, random batches of {batch}")


def _record_steps(model, optimizer, batch, steps: int, label: str) -> trace.Timeline:
    """Phases "forward", "backward", "optimizer"; inside them the profiler keeps FSDP2's collectives:
    an all-gather per layer before its forward and again before its backward, a reduce-scatter per
    layer after its backward (gloo runs them on its own threads: extra rows)."""
    x, y = batch

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.profiler.record_function("forward"):
            loss = nn.functional.cross_entropy(model(x), y)
        with torch.profiler.record_function("backward"):
            loss.backward()
        with torch.profiler.record_function("optimizer"):
            optimizer.step()

    return trace.record(step, steps=steps, warmup=1, label=label)


class _CollectiveLog(TorchDispatchMode):
    """Logs, in order, every all-gather ("ag") and reduce-scatter ("rs") this rank issues: its token,
    the dtype it moves, the ranks in it (output / input elements) and the bytes it receives."""

    def __init__(self):
        super().__init__()
        self.events = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = {"c10d._allgather_base_.default": "ag", "c10d._reduce_scatter_base_.default": "rs"}.get(str(func))
        if kind:
            out, inp = args[0], args[1]
            small, big = (inp, out) if kind == "ag" else (out, inp)
            self.events.append({"token": kind, "dtype": str(inp.dtype)[6:], "ranks": big.numel() // small.numel(),
                                "received": (big.numel() - small.numel()) * big.element_size()})
        return func(*args, **(kwargs or {}))

    def mark(self, token: str) -> None:
        self.events.append({"token": token})


def fsdp_knobs(rank: int, world_size: int, width: int = 64, depth: int = 2, batch: int = 8) -> dict:
    """Worker (CPU, gloo): one forward + backward of `shard_model(shard_friendly_mlp(width, depth))` per
    setting of FSDP2's knobs, from the same weights and batch, every collective logged.

    Returns {setting: {
      "forward", "backward": the order of all-gathers ("ag"), reduce-scatters ("rs"), layer i's forward ("L<i>");
      "gather_dtype", "compute_dtype", "reduce_dtype", "shard_dtype" (the sharded parameters the optimizer updates);
      "backward_gather_ranks": ranks in each backward all-gather; "received": bytes received in all-gathers;
      "held_after_forward": this rank's parameter bytes between forward and backward; "full_bytes": the
      whole model's (fp32); "loss"; "grad_diff": max |gradient shard - the default setting's|}}.
    reshard_after_forward=2 needs world_size > 2 with 2 dividing it; it is left out otherwise.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    settings = {"default (True)": {}, "reshard_after_forward=False": {"reshard_after_forward": False},
                "reshard_after_forward=2": {"reshard_after_forward": 2},
                "bf16 params, fp32 reduce": {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                               reduce_dtype=torch.float32)},
                "prefetch=2": {"prefetch": 2}}
    if world_size <= 2 or world_size % 2:
        del settings["reshard_after_forward=2"]
    x, y = _batches(rank, 1, positive_int("batch", batch), torch.device("cpu"))[0]
    out, reference = {}, None
    for name, knobs in settings.items():
        torch.manual_seed(0)
        model = shard_model(shard_friendly_mlp(width, depth), **knobs)
        full_bytes = sum(p.numel() * 4 for p in model.parameters())
        log, dtypes = _CollectiveLog(), {}

        def starts(i):                              # registered after FSDP's hook: runs once the layer is whole
            def hook(layer, args):
                log.mark(f"L{i}")
                dtypes.setdefault("compute", layer.weight.dtype)
            return hook

        layers = [child for child in model.children() if any(True for _ in child.parameters())]
        for i, layer in enumerate(layers, 1):
            layer.register_forward_pre_hook(starts(i))
        with log:
            loss = nn.functional.cross_entropy(model(x).float(), y)
            held = parameter_bytes(model)
            log.mark("|")
            loss.backward()
        grads = [p.grad.to_local() for p in model.parameters()]
        reference = reference or grads
        tokens = [e["token"] for e in log.events]
        cut = tokens.index("|")
        comms = [e for e in log.events if "dtype" in e]
        out[name] = {"forward": " ".join(tokens[:cut]), "backward": " ".join(tokens[cut + 1:]),
                     "gather_dtype": next(e["dtype"] for e in comms if e["token"] == "ag"),
                     "reduce_dtype": next(e["dtype"] for e in comms if e["token"] == "rs"),
                     "compute_dtype": str(dtypes["compute"])[6:],
                     "shard_dtype": str(next(model.parameters()).dtype)[6:],
                     "backward_gather_ranks": [e["ranks"] for e in log.events[cut + 1:] if e["token"] == "ag"],
                     "received": sum(e["received"] for e in comms if e["token"] == "ag"),
                     "held_after_forward": held, "full_bytes": full_bytes, "loss": loss.item(),
                     "grad_diff": max((a - b).abs().max().item() for a, b in zip(grads, reference))}
    return out
