"""Who adds up the gradients: one master (a parameter server), S sharded servers, or nobody (all-reduce).

Parameter server (rank 0 is the server, and also computes like every other rank): the MASTER topology
    every rank: gradient on its shard -> send to rank 0 (push)
    rank 0:     average the N gradients, take the SGD step, send the new weights to everyone (pull)
Sharded parameter server (BytePS-style, Jiang et al., OSDI 2020): S servers, server s owns 1/S of the
parameters; every rank pushes chunk s of its gradient to server s and pulls chunk s of the weights back.
All-reduce data parallelism, no master: every rank all-reduces the gradient (ring) and takes the same step.

All three compute the same update, so they end at the same weights (up to float summation order).
The difference is where the bytes go: per step the single server receives and sends (N-1) x P values;
each of S sharded servers (N-1) x P / S; in the ring every rank sends only 2(N-1)/N x P, evenly.
(In exchange a server can apply updates asynchronously and tolerate slow or lost workers; the ring is
synchronous and needs every rank.)

    from course_lib.distributed.launch import launch
    from course_lib.distributed.paramserver import train_both
    results = launch(train_both, 4)   # per rank: final weights of both methods and their traffic
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ..validate import positive_int
from .collectives import all_reduce_ring, count_traffic

FEATURES, CLASSES = 20, 4


def make_data(n_samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic classification data: x [n, 20], y [n] in 0..3 (labels from a fixed random linear map)."""
    positive_int("n_samples", n_samples)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_samples, FEATURES, generator=g)
    y = (x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(1)
    return x, y


def make_model(seed: int = 0, hidden: int = 32) -> nn.Module:
    """A tiny MLP 20 -> hidden -> 4, the same initial weights for a given seed."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))


def _gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Flat gradient [P] of the mean cross-entropy on (x, y)."""
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return parameters_to_vector(p.grad for p in model.parameters())


def _shard(x, y, step: int, rank: int, world_size: int, batch: int):
    """Rank `rank`'s `batch` rows of global batch `step` (N x batch rows, cycling through the data)."""
    start = (step * world_size + rank) * batch % len(x)
    return x[start:start + batch], y[start:start + batch]


def train_reference(world_size: int, steps: int = 20, batch: int = 16, lr: float = 0.1, seed: int = 0):
    """One process, global batch N x batch: what both distributed versions must reproduce. -> [P]"""
    model, (x, y) = make_model(seed), make_data(512, seed)
    w = parameters_to_vector(model.parameters()).detach()
    for step in range(steps):
        g = torch.stack([_gradient(model, *_shard(x, y, step, r, world_size, batch)) for r in range(world_size)])
        w -= lr * g.mean(0)
        vector_to_parameters(w, model.parameters())
    return w


def _train(rank: int, world_size: int, sync, steps: int, batch: int, lr: float, seed: int) -> torch.Tensor:
    model, (x, y) = make_model(seed), make_data(512, seed)
    w = parameters_to_vector(model.parameters()).detach()
    for step in range(steps):
        sync(w, _gradient(model, *_shard(x, y, step, rank, world_size, batch)), lr)
        vector_to_parameters(w, model.parameters())
    return w


def param_server_step(w: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """Push the gradient to rank 0; rank 0 averages, updates w and sends it back; w updated in place."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        total, buf = grad.clone(), torch.empty_like(grad)
        for r in range(1, n):
            dist.recv(buf, r)
            total += buf
        w -= lr * total / n
        for req in [dist.isend(w, r) for r in range(1, n)]:
            req.wait()
    else:
        dist.send(grad, 0)
        dist.recv(w, 0)


def sharded_server_step(w: torch.Tensor, grad: torch.Tensor, lr: float, servers: int | None = None) -> None:
    """S = `servers` (default: every rank) servers, ranks 0..S-1; server s owns chunk s of w (tensor_split):
    each rank pushes gradient chunk s to server s, which averages it, updates its chunk and sends it back."""
    rank, n = dist.get_rank(), dist.get_world_size()
    s_count = n if servers is None else servers
    if not isinstance(s_count, int) or not 1 <= s_count <= n:
        raise ValueError(f"servers must be an int in 1..world_size={n} or None; got {servers!r}")
    grads, chunks = torch.tensor_split(grad, s_count), torch.tensor_split(w, s_count)   # views into w
    reqs = [dist.isend(grads[s].contiguous(), s) for s in range(s_count) if s != rank]    # push
    if rank < s_count:   # this rank is a server: sum its chunk from every rank, step, send it back
        total, buf = grads[rank].clone(), torch.empty_like(grads[rank])
        for r in (r for r in range(n) if r != rank):
            dist.recv(buf, r)
            total += buf
        chunks[rank].sub_(lr * total / n)
        reqs += [dist.isend(chunks[rank], r) for r in range(n) if r != rank]
    for s in (s for s in range(s_count) if s != rank):                                  # pull
        dist.recv(chunks[s], s)
    for req in reqs:
        req.wait()


def all_reduce_step(w: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """Ring all-reduce of the gradient; every rank takes the same averaged step itself."""
    all_reduce_ring(grad)
    w -= lr * grad / dist.get_world_size()


def train_both(rank: int, world_size: int, steps: int = 20, batch: int = 16, lr: float = 0.1, seed: int = 0,
               servers: int | None = None) -> dict:
    """Worker: train with one parameter server, with every rank a server for 1/N of the weights (sharded)
    (or `servers` of them) and with all-reduce; final weights (list of P floats) and Traffic of each. Lists, not tensors: a tensor returned from a worker travels through shared memory
    that can vanish when the worker exits."""
    out = {}
    sharded = functools.partial(sharded_server_step, servers=servers)
    for name, sync in (("param_server", param_server_step), ("sharded_server", sharded),
                       ("all_reduce", all_reduce_step)):
        with count_traffic() as traffic:
            out[name] = _train(rank, world_size, sync, steps, batch, lr, seed).tolist()
        out[name + "_traffic"] = traffic
    return out
