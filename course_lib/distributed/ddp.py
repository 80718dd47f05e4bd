"""Distributed data parallel from scratch, checked against torch's DistributedDataParallel.

Every rank holds a full copy of the model and trains on its own slice of each global batch;
after backward the gradients are averaged over ranks (all-reduce), so every copy takes the
same optimizer step. Three pieces, each small enough to read:

- `shard_indices` / `ShardedTensorLoader` (from `course_lib.rank_data`, which the training script
  uses too): which samples a rank sees in an epoch, exactly as `DistributedSampler` decides (a
  shuffled permutation per epoch, padded so every rank gets the same number of batches: a rank
  with one batch fewer would wait forever in an all-reduce).
- `FlatDDP`: after backward, flatten all gradients into one tensor, one all-reduce, divide by
  the world size, copy back. Simple, but the network idles while backward runs.
- `BucketedDDP`: per-parameter hooks drop each finished gradient into a bucket (about
  `bucket_mb` MB, parameters in reverse order, as backward produces them, as torch DDP does);
  a full bucket starts an asynchronous all-reduce at once, so communication overlaps the rest
  of backward. `no_sync()` skips the all-reduce for gradient accumulation.

Both wrappers broadcast rank 0's weights at construction (identical starting points).
What breaks the equivalence with one big batch: per-rank BatchNorm statistics (`split_batch_gradients`).
Seeing the overlap and the bucket-size trade-off: `ddp_overlap`; torch DDP's comm hooks and Join: `ddp_hooks`.
Worker functions for `launch` (e.g. `compare_with_torch_ddp`) live here so they pickle.

    from course_lib.distributed.launch import launch
    from course_lib.distributed.ddp import compare_with_torch_ddp
    launch(compare_with_torch_ddp, 2)     # max |our grad - torch DDP grad| per variant, per rank
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from ..env import rank_device
from ..models import max_diff
from ..rank_data import ShardedTensorLoader, shard_indices  # noqa: F401  (lecture 07: ddp.shard_indices)
from ..validate import positive_int, positive_number


# --- DDP from scratch --------------------------------------------------------------------------

def broadcast_parameters(module: nn.Module, src: int = 0) -> None:
    """Copy rank `src`'s parameters and buffers to every rank: all replicas start identical."""
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t, src)


class FlatDDP(nn.Module):
    """Wrap `module`; after `loss.backward()` call `sync_gradients()`: one all-reduce of all grads."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        broadcast_parameters(module)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def sync_gradients(self) -> None:
        params = [p for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])     # [total parameters]
        dist.all_reduce(flat)                                     # sum over ranks ...
        flat /= dist.get_world_size()                             # ... then the mean
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))


def assign_buckets(params, bucket_mb: float = 25.0) -> list[list[int]]:
    """Indices of `params` grouped into buckets of about `bucket_mb` MB, last parameter first.

    Backward produces the last layer's gradients first, so reverse order fills bucket 0 first.
    A bucket closes as soon as it reaches the size; a single larger tensor gets its own bucket.
    """
    positive_number("bucket_mb", bucket_mb)
    cap, buckets, current, size = bucket_mb * 2**20, [], [], 0
    params = list(params)
    for i in reversed(range(len(params))):
        current.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


class BucketedDDP(nn.Module):
    """Wrap `module`; gradients are averaged during backward, bucket by bucket, overlapping compute.

    After `loss.backward()` returns, every parameter's .grad holds the mean over ranks (an
    autograd callback waits for the last all-reduce). Buckets are launched in index order on
    every rank (collectives must match across ranks), each as soon as it and those before it are full.
    """

    def __init__(self, module: nn.Module, bucket_mb: float = 25.0):
        super().__init__()
        self.module = module
        broadcast_parameters(module)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = assign_buckets(self._params, bucket_mb)
        self._bucket_of = {id(self._params[i]): b for b, idx in enumerate(self.buckets) for i in idx}
        self._sync = True
        self._reset()
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside accumulates local gradients only (gradient accumulation)."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def _reset(self):
        self._ready = [0] * len(self.buckets)
        self._next, self._works, self._callback_queued = 0, [], False

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync:
            return
        if not self._callback_queued:     # first gradient of this backward: wait for all at its end
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._callback_queued = True
        self._ready[self._bucket_of[id(p)]] += 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next < len(self.buckets) and (force or self._ready[self._next] == len(self.buckets[self._next])):
            params = [self._params[i] for i in self.buckets[self._next]]
            for p in params:              # a parameter unused in this forward contributes zeros
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            self._works.append((params, flat, dist.all_reduce(flat, async_op=True)))
            self._next += 1

    def _finish(self) -> None:
        self._launch_ready(force=True)
        world = dist.get_world_size()
        for params, flat, work in self._works:
            work.wait()
            flat /= world
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p))
        self._reset()


# --- workers for `launch` (tests and notebook 07) -------------------------------------------------

def compare_with_torch_ddp(rank: int, world_size: int, batch: int = 8, bucket_mb: float = 0.001) -> dict:
    """Our FlatDDP and BucketedDDP against torch's DistributedDataParallel on one MLP.

    Each rank starts from different random weights (the wrappers must broadcast rank 0's) and
    its own batch. Returns max |difference| of: the weights after wrapping across ranks
    ("broadcast"), gradients vs torch DDP ("flat", "bucketed"), accumulated gradients with
    no_sync vs torch DDP's no_sync ("no_sync"), and torch DDP's gradients vs one process on
    all ranks' data concatenated ("one_big_batch"); plus the number of buckets.
    """
    import copy

    device = rank_device()
    torch.manual_seed(rank)
    base = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5)).to(device)
    flat, bucketed = FlatDDP(copy.deepcopy(base)), BucketedDDP(copy.deepcopy(base), bucket_mb)
    ref = nn.parallel.DistributedDataParallel(copy.deepcopy(base), device_ids=[device.index] if device.index is not None else None)
    g = torch.Generator().manual_seed(100 + rank)
    xs = [torch.randn(batch, 20, generator=g).to(device) for _ in range(2)]
    ys = [torch.randint(0, 5, (batch,), generator=g).to(device) for _ in range(2)]
    loss = nn.functional.cross_entropy

    w0 = torch.cat([p.detach().reshape(-1) for p in bucketed.parameters()])
    gathered = [torch.empty_like(w0) for _ in range(world_size)]
    dist.all_gather(gathered, w0)
    out = {"broadcast": max_diff(gathered, [gathered[0]] * world_size), "buckets": len(bucketed.buckets)}

    for model in (flat, bucketed, ref):
        loss(model(xs[0]), ys[0]).backward()
    flat.sync_gradients()
    grads = lambda m: [p.grad for p in m.parameters()]
    out["flat"], out["bucketed"] = max_diff(grads(flat), grads(ref)), max_diff(grads(bucketed), grads(ref))

    # One process, the whole global batch: the mean over ranks of per-rank means is the global mean.
    all_x = [torch.empty_like(xs[0]) for _ in range(world_size)]
    all_y = [torch.empty_like(ys[0]) for _ in range(world_size)]
    dist.all_gather(all_x, xs[0])
    dist.all_gather(all_y, ys[0])
    single = copy.deepcopy(ref.module)
    single.zero_grad()
    loss(single(torch.cat(all_x)), torch.cat(all_y)).backward()
    out["one_big_batch"] = max_diff(grads(single), grads(ref))

    for model in (bucketed, ref):           # accumulate two micro-batches, all-reduce once
        model.zero_grad()
        with model.no_sync():
            loss(model(xs[0]), ys[0]).backward()
        loss(model(xs[1]), ys[1]).backward()
    out["no_sync"] = max_diff(grads(bucketed), grads(ref))
    return out


def split_batch_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, world_size: int):
    """(gradients of one batch x, mean of the gradients of its `world_size` equal slices), in one process.

    The mean over slices is what DDP's all-reduce gives when rank r trains on slice r. Equal to the big
    batch's gradient for a model whose samples do not interact; not with BatchNorm in training mode,
    which normalises each slice by its own mean and variance (torch.nn.SyncBatchNorm all-reduces the
    statistics over the ranks, which gives back the big batch's). x: (world_size * B, ...), y: (world_size * B,).
    """
    positive_int("world_size", world_size)
    if len(x) % world_size or len(x) != len(y):
        raise ValueError(f"x and y must have the same length, a multiple of world_size={world_size}; "
                         f"got {len(x)} and {len(y)}")
    params = [p for p in model.parameters() if p.requires_grad]
    loss = nn.functional.cross_entropy
    big = torch.autograd.grad(loss(model(x), y), params)
    slices = [torch.autograd.grad(loss(model(xs), ys), params)
              for xs, ys in zip(x.chunk(world_size), y.chunk(world_size))]
    return list(big), [torch.stack(g).mean(0) for g in zip(*slices)]


def batchnorm_breaks_equivalence(world_size: int = 2, batch: int = 16, seed: int = 0) -> dict:
    """max |big-batch gradient - mean of per-rank gradients| for one MLP without and with BatchNorm1d."""
    positive_int("batch", batch)
    gaps = {}
    for name, norm in (("no BatchNorm", nn.Identity), ("BatchNorm1d", nn.BatchNorm1d)):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(20, 32), norm(32), nn.ReLU(), nn.Linear(32, 5))
        x, y = torch.randn(world_size * batch, 20), torch.randint(0, 5, (world_size * batch,))
        gaps[name] = max_diff(*split_batch_gradients(model, x, y, world_size))
    return gaps
