"""Record a training step as a list of events: every aten op with its FLOPs and bytes, every collective.

A `TorchDispatchMode` sees each aten operator a step runs (forward, the backward that autograd runs
for it, the optimizer, the all-reduces that DDP's hooks start: c10d ops go through the dispatcher
too), on the CPU as on a GPU. For each op it keeps:

- FLOPs from `torch.utils.flop_counter`'s formulas (matmuls and convolutions; 0 for elementwise ops),
- bytes moved: the sizes of the input and output tensors (the least traffic the op can have),
- the phase, from the `record_function("forward" / "backward" / "optimizer")` block it runs in,
- dependencies found by data flow: an op that reads a tensor an all-reduce wrote waits for that
  all-reduce; an all-reduce waits for the op that wrote its bucket.

Per parameter it also notes after which op its gradient was ready, so `replay` can re-bucket.
The events are plain dataclasses: `Recording.save(path)` / `Recording.load(path)` (JSON).

    from course_lib.simulate.record import record_single, record_ddp
    rec = record_single()                   # Net, batch 64, the course's train_epoch step
    rec = record_ddp(world_size=2)          # BucketedDDP on 2 gloo ranks (launch)
"""
from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from ..trace import kind_of
from ..validate import positive_int, positive_number

PHASES = ("forward", "backward", "optimizer")
COLLECTIVES = {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "broadcast_": "broadcast",
               "allgather_": "all_gather", "_allgather_base_": "all_gather",
               "allgather_into_tensor_coalesced_": "all_gather", "reduce_scatter_": "reduce_scatter",
               "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter"}


@dataclass
class Event:
    """One op on the compute stream or one collective on the communication stream."""

    name: str                 # "aten.mm", "all_reduce"
    phase: str                # forward / backward / optimizer / other
    stream: str = "compute"   # "compute" or "comm"
    flops: float = 0.0
    bytes: float = 0.0        # compute: inputs + outputs; collective: the whole tensor (all-reduce buffer,
                              # all-gather output, reduce-scatter input)
    view: bool = False        # a view/metadata op (no kernel on a GPU)
    after: list[int] = field(default_factory=list)   # indices of events it must wait for
    group_size: int = 1       # ranks in a collective's group
    measured_s: float = 0.0   # the op's own time when recorded with time_ops (calibration); 0 otherwise


@dataclass
class RankTrace:
    events: list[Event]
    grad_ready: list[int]     # per parameter: index of the event after which its gradient is complete


@dataclass
class Recording:
    ranks: list[RankTrace]
    params: list[list]        # per parameter, in module order: [name, numel, bytes per element]
    world_size: int = 1
    batch_per_rank: int = 64
    label: str = ""
    measured_step_s: float | None = None     # the same step timed without the recorder (slowest rank)
    allreduce: dict | None = None            # gloo all-reduce times measured in the same launch (calibration)
    sharded: bool = False                    # FSDP: each rank updates 1/world of the parameters
    local: dict | None = None                # calibration: rank 0's step WITHOUT DDP, timed op by op while
                                             # every rank ran it at once ({"trace", "seconds"})

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path) -> Recording:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_dict(cls, data: dict) -> Recording:
        data = dict(data)
        data["ranks"] = [RankTrace([Event(**e) for e in r["events"]], list(r["grad_ready"])) for r in data["ranks"]]
        return cls(**data)

    def local_recording(self) -> Recording:
        """`local` as a one-process Recording, for `profiles.calibrate`: the same ops at the speed they had
        while all ranks shared the machine (cores, caches, memory bandwidth), without communication."""
        if not self.local:
            raise ValueError("this recording has no local step: record it with record_ddp(..., calibrate=True)")
        t = self.local["trace"]
        return Recording([RankTrace([Event(**e) for e in t["events"]], list(t["grad_ready"]))], self.params, 1,
                         self.batch_per_rank, f"{self.label}: one rank's step without DDP, all ranks at once",
                         self.local["seconds"])

    def flops_per_rank(self) -> float:
        return max(sum(e.flops for e in r.events) for r in self.ranks)


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata     # the storage itself: data_ptr is 0 for every meta tensor


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Recorder(TorchDispatchMode):
    """Collects `events` while active. `watch(params)` before wrapping a model in DDP notes gradient readiness.

    time_ops: also time each compute op (its `measured_s`), for calibrating a profile to this machine.
    """

    def __init__(self, time_ops: bool = False):
        super().__init__()
        self.time_ops = time_ops
        self.events: list[Event] = []
        self.grad_ready: dict[int, int] = {}
        self._stack: list[str] = []      # open record_function names
        self._writer: dict[int, int] = {}   # storage -> index of the last event that wrote it
        self._params: list[torch.Tensor] = []

    def watch(self, params) -> None:
        """Register gradient hooks (register BEFORE DDP's own, so they fire before its all-reduce)."""
        self._params = list(params)
        for i, p in enumerate(self._params):
            p.register_post_accumulate_grad_hook(lambda _p, i=i: self._grad_done(i))

    def _grad_done(self, i: int) -> None:
        if self.events:
            self.grad_ready[i] = len(self.events) - 1

    def _phase(self) -> str:
        for name in self._stack:                       # the outermost named phase wins
            if kind_of(name) in PHASES:
                return kind_of(name)
        return "backward" if torch._C._current_autograd_node() is not None else "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace, op = func.namespace, func._schema.name.split("::")[-1]
        if namespace == "profiler":                    # record_function enter/exit: phase markers
            out = func(*args, **kwargs)
            if op == "_record_function_enter_new":
                self._stack.append(args[0])
            elif self._stack:
                self._stack.pop()
            return out
        inputs = _tensors((args, kwargs))
        deps = sorted({self._writer[_key(t)] for t in inputs if _key(t) in self._writer})
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - t0 if self.time_ops else 0.0
        if namespace == "c10d":
            if op in COLLECTIVES:
                self._collective(COLLECTIVES[op], args, deps)
            return out
        written = _tensors(out) + [a for a, spec in zip(args, func._schema.arguments)
                                   if isinstance(a, torch.Tensor) and spec.alias_info is not None
                                   and spec.alias_info.is_write]
        is_view = func.is_view or op in ("detach", "_unsafe_view", "lift_fresh")
        flops = flop_registry[func._overloadpacket](*args, **kwargs, out_val=out) \
            if func._overloadpacket in flop_registry else 0
        comm = [d for d in deps if self.events[d].stream == "comm"]   # wait only for collectives: the
        self.events.append(Event(f"{namespace}.{op}", self._phase(), "compute", float(flops),  # stream orders
                                 0.0 if is_view else float(_nbytes(inputs) + _nbytes(_tensors(out))),
                                 is_view, comm, measured_s=seconds))                           # the rest
        for t in written:
            self._writer[_key(t)] = len(self.events) - 1
        return out

    def _collective(self, kind: str, args, deps) -> None:
        import torch.distributed as dist
        written = _tensors(args[0])                     # c10d ops take the output (or in-place buffer) first
        whole = _tensors(args[1]) if kind == "reduce_scatter" else written   # a reduce-scatter's input is whole
        group = next((a for a in args if hasattr(a, "size") and not isinstance(a, torch.Tensor)), None)
        size = group.size() if group is not None and callable(group.size) else dist.get_world_size()
        compute = [d for d in deps if self.events[d].stream == "compute"]
        before = [i for i, e in enumerate(self.events) if e.stream == "compute"]
        after = compute[-1:] or before[-1:]
        self.events.append(Event(kind, self._phase(), "comm", 0.0, float(_nbytes(whole)), False, after, size))
        for t in written:
            self._writer[_key(t)] = len(self.events) - 1


def record_step(step, params=(), steps: int = 3, watch=None, time_ops: int = 0) -> tuple[RankTrace, float]:
    """Time `steps` calls of `step()` (after one warm-up), then record one more; returns (trace, median s).

    watch: a Recorder already watching the parameters (created before DDP wrapped them); else one is
    made here and watches `params`. time_ops: record that many more steps timing each op, and keep each
    op's fastest time as its `measured_s` (the step must run the same ops every time).
    """
    positive_int("steps", steps)
    rec = watch or Recorder()
    if watch is None:
        rec.watch(params)
    step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    runs = []
    for timed in [False] + [True] * time_ops:
        rec.events, rec.grad_ready, rec._writer, rec.time_ops = [], {}, {}, timed
        with rec:
            step()
        runs.append(rec.events)
    if time_ops:
        if len({len(r) for r in runs}) != 1:
            raise RuntimeError("the step ran different ops from one call to the next: its ops cannot be timed")
        for i, e in enumerate(runs[0]):
            e.measured_s = min(r[i].measured_s for r in runs[1:])
    rec.events = runs[0]
    ready = [rec.grad_ready.get(i, len(rec.events) - 1) for i in range(len(rec._params))]
    return RankTrace(rec.events, ready), statistics.median(times)


def _batch(batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g)


def _train_step(model, batch, optimizer):
    """The course's step: `loop.train_epoch` over one batch (copy, forward, backward, optimizer, named)."""
    from ..loop import train_epoch
    return lambda: train_epoch(model, [batch], optimizer, torch.device("cpu"), F.cross_entropy, progress=False)


def _phased_step(model, x, y, optimizer, after_backward=None):
    """One step with its phases named for the recorder (forward, backward, optimizer); `after_backward` runs
    inside backward's phase (a gradient collective the model does not do itself)."""
    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.profiler.record_function("forward"):
            loss = F.cross_entropy(model(x), y)
        with torch.profiler.record_function("backward"):
            loss.backward()
            if after_backward is not None:
                after_backward()
        with torch.profiler.record_function("optimizer"):
            optimizer.step()
    return step


def _param_table(model) -> list[list]:
    return [[n, p.numel(), p.element_size()] for n, p in model.named_parameters() if p.requires_grad]


def record_single(model: str = "net", batch: int = 64, steps: int = 3, time_ops: int = 0) -> Recording:
    """One process, no communication: the course's training step of `model` (models.MODELS) on a random batch.

    time_ops: time every op over that many extra recorded steps (for `profiles.calibrate`)."""
    from ..loop import make_optimizer
    from ..models import build_model
    positive_int("batch", batch)
    torch.manual_seed(0)
    net = build_model(model)
    opt = make_optimizer("sgd", net.parameters(), lr=0.01)
    rank, seconds = record_step(_train_step(net, _batch(batch, 0), opt), list(net.parameters()), steps,
                                time_ops=time_ops)
    return Recording([rank], _param_table(net), 1, batch, f"{model}, batch {batch}, 1 process", seconds)


def ddp_worker(rank: int, world_size: int, model: str = "net", batch: int = 64, bucket_mb: float = 25.0,
               steps: int = 5, allreduce_sizes=()) -> dict:
    """Worker for `launch`: BucketedDDP around `model`, the course's step; (trace, seconds, gloo timings)."""
    import torch.distributed as dist

    from ..distributed.costmodel import measure_allreduce
    from ..distributed.ddp import BucketedDDP
    from ..loop import make_optimizer
    from ..models import build_model
    torch.manual_seed(0)
    net = build_model(model)
    local = None
    if allreduce_sizes:      # calibration: the same step without DDP, on every rank at once (sharing the cores),
        plain = copy.deepcopy(net)                      # ended by a barrier as the DDP step is: the wait for the
        plain_step = _train_step(plain, _batch(batch, rank), make_optimizer("sgd", plain.parameters(), lr=0.01))
        dist.barrier()                                  # slowest rank is in the time, not in the ops

        def plain_synced():
            plain_step()
            dist.barrier()
        trace, seconds = record_step(plain_synced, list(plain.parameters()), steps, time_ops=3)
        local = {"trace": asdict(trace), "seconds": seconds}
    rec = Recorder()
    rec.watch([p for p in net.parameters() if p.requires_grad])     # before DDP's hooks
    ddp = BucketedDDP(net, bucket_mb)
    opt = make_optimizer("sgd", ddp.parameters(), lr=0.01)
    step = _train_step(ddp, _batch(batch, rank), opt)

    def synced():
        step()
        dist.barrier()     # the slowest rank decides a step's time (as timed_steps measures)
    trace, _ = record_step(synced, steps=1, watch=rec)
    dist.barrier()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        synced()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)          # as record_step times the local step
    timings = measure_allreduce(rank, world_size, list(allreduce_sizes), "torch", 3) if allreduce_sizes else None
    return {"trace": asdict(trace), "seconds": seconds, "allreduce": timings, "params": _param_table(net),
            "local": local}


def record_ddp(world_size: int = 2, model: str = "net", batch: int = 64, bucket_mb: float = 25.0, steps: int = 5,
               calibrate: bool = False, timeout: float = 120.0) -> Recording:
    """Record the course's DDP step (BucketedDDP, gloo) on `world_size` local ranks: one RankTrace per rank.

    calibrate: also, in the same launch, time gloo all-reduces (1 KB .. 4 MB) for `profiles.cpu_this_machine`
    and each rank's step without DDP, op by op, all ranks at once (`Recording.local_recording()`, for
    `profiles.calibrate`).
    """
    from ..distributed.launch import launch
    positive_int("world_size", world_size)
    positive_number("bucket_mb", bucket_mb)
    sizes = [2**10, 2**14, 2**17, 2**20, 2**22] if calibrate else []
    outs = launch(ddp_worker, world_size, model, batch, bucket_mb, steps, sizes, timeout=timeout)
    ranks = [RankTrace([Event(**e) for e in o["trace"]["events"]], o["trace"]["grad_ready"]) for o in outs]
    return Recording(ranks, outs[0]["params"], world_size, batch,
                     f"{model}, batch {batch} per rank, BucketedDDP {bucket_mb:g} MB, {world_size} gloo ranks",
                     max(o["seconds"] for o in outs), outs[0]["allreduce"], local=outs[0]["local"])


def fsdp_worker(rank: int, world_size: int, width: int = 784, depth: int = 4, batch: int = 32, steps: int = 5) -> dict:
    """Worker for `launch`: lecture 10's FSDP2 model and step (Adam), timed, then recorded."""
    import torch.distributed as dist

    from ..distributed.sharding import shard_model
    from ..distributed.sharding_workers import _batches, shard_friendly_mlp
    torch.manual_seed(0)
    model = shard_model(shard_friendly_mlp(width, depth))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = _batches(rank, 1, batch, torch.device("cpu"))[0]

    phases = _phased_step(model, x, y, opt)

    def step():
        phases()
        dist.barrier()
    trace, seconds = record_step(step, [p for p in model.parameters()], steps)
    params = [[n, p.numel(), p.element_size()] for n, p in shard_friendly_mlp(width, depth).named_parameters()]
    return {"trace": asdict(trace), "seconds": seconds, "params": params}


def record_fsdp(world_size: int = 2, width: int = 784, depth: int = 4, batch: int = 32, steps: int = 5,
                timeout: float = 120.0) -> Recording:
    """Record lecture 10's FSDP2 step (`shard_model` of `shard_friendly_mlp`, Adam) on `world_size` gloo ranks:
    an all-gather per layer before its forward and its backward, a reduce-scatter per layer after it."""
    from ..distributed.launch import launch
    positive_int("world_size", world_size)
    outs = launch(fsdp_worker, world_size, width, depth, batch, steps, timeout=timeout)
    ranks = [RankTrace([Event(**e) for e in o["trace"]["events"]], o["trace"]["grad_ready"]) for o in outs]
    return Recording(ranks, outs[0]["params"], world_size, batch,
                     f"FSDP2 MLP 784-{width}x{depth}-10, batch {batch} per rank, Adam, {world_size} gloo ranks",
                     max(o["seconds"] for o in outs), sharded=True)
