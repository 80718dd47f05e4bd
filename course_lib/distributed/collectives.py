"""Collectives from scratch on point-to-point messages (dist.send / recv / isend / irecv only).

Call them inside a process group (e.g. a worker started by `launch`), with the same tensor shape on
every rank. Semantics follow torch.distributed where that makes sense:
- `broadcast`, `reduce`, `all_reduce_*` work IN PLACE on `tensor` (and return it);
- `reduce` changes only the `dst` rank's tensor (torch may also scribble on the others');
- `scatter` / `gather` / `all_gather` take torch's arguments (a list of N tensors on the root);
- `reduce_scatter(tensor)` RETURNS this rank's reduced chunk `tensor_split(tensor, N)[rank]`:
  sizes need not be divisible by N (torch's reduce_scatter_tensor requires it).

Three all-reduces, same result, different traffic (see `count_traffic`):
- naive: everyone sends to rank 0, rank 0 sends the sum back: rank 0 moves 2(N-1) x size;
- tree: binomial-tree reduce then broadcast: log2(N) rounds, the root still moves ~2 log2(N) x size;
- ring: reduce-scatter + all-gather in N chunks (see `ring.py`): every rank sends 2(N-1)/N x size.

    with count_traffic() as t:
        all_reduce_ring(x)
    t.bytes_sent  # {(src, dst): bytes} sent by this rank

The collectives, their traffic counting and their `launch` workers stay in one module (over 300 lines)
because notebook 05 uses them together, as one namespace (`from course_lib.distributed import collectives as C`).
"""
from __future__ import annotations

import contextlib
from collections import Counter

import torch
import torch.distributed as dist

from ..env import rank_device
from ..models import max_diff
from ..validate import int_in_range, one_of
from .ring import PHASES, ring_schedule

OPS = {"sum": torch.add, "product": torch.mul, "max": torch.maximum, "min": torch.minimum}
ALGORITHMS = ("naive", "tree", "ring")
P2P = ("send", "recv", "isend", "irecv")
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "batch_isend_irecv")


def _combine(op: str):
    return OPS[one_of("op", op, tuple(OPS))]


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor; got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous (the collectives work on a flat view of it)")
    return tensor.view(-1)


def _root(name: str, value: int) -> int:
    return int_in_range(name, value, 0, dist.get_world_size() - 1, hint=" (a rank)")


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Binomial tree: in round k, every rank that has the data sends it 2^k ranks further. log2(N) rounds."""
    _flat(tensor)
    n, rank, src = dist.get_world_size(), dist.get_rank(), _root("src", src)
    vr, mask = (rank - src) % n, 1  # rank relative to the root
    while mask < n:
        if vr < mask and vr + mask < n:
            dist.send(tensor, (vr + mask + src) % n)
        elif mask <= vr < 2 * mask:
            dist.recv(tensor, (vr - mask + src) % n)
        mask *= 2
    return tensor


def reduce(tensor: torch.Tensor, dst: int = 0, op: str = "sum") -> torch.Tensor:
    """Binomial tree towards `dst`: partial results meet pairwise; only dst's tensor changes."""
    combine, flat = _combine(op), _flat(tensor)
    n, rank, dst = dist.get_world_size(), dist.get_rank(), _root("dst", dst)
    vr, mask = (rank - dst) % n, 1
    acc = flat if rank == dst else flat.clone()
    buf = torch.empty_like(flat)
    while mask < n:
        if vr & mask:  # hand my partial result to my parent and stop
            dist.send(acc, (vr - mask + dst) % n)
            break
        if vr + mask < n:
            dist.recv(buf, (vr + mask + dst) % n)
            acc.copy_(combine(acc, buf))
        mask *= 2
    return tensor


def scatter(tensor: torch.Tensor, scatter_list: list | None = None, src: int = 0) -> torch.Tensor:
    """Rank src sends scatter_list[r] to each rank r (its own goes by copy) into `tensor`."""
    n, rank, src = dist.get_world_size(), dist.get_rank(), _root("src", src)
    if rank == src:
        if scatter_list is None or len(scatter_list) != n:
            raise ValueError(f"scatter_list must hold {n} tensors on the src rank")
        reqs = [dist.isend(scatter_list[r].contiguous(), r) for r in range(n) if r != src]
        tensor.copy_(scatter_list[src])
        for req in reqs:
            req.wait()
    else:
        dist.recv(tensor, src)
    return tensor


def gather(tensor: torch.Tensor, gather_list: list | None = None, dst: int = 0) -> list | None:
    """Every rank sends `tensor` to dst, which fills gather_list[r] with rank r's tensor."""
    n, rank, dst = dist.get_world_size(), dist.get_rank(), _root("dst", dst)
    if rank != dst:
        dist.send(tensor.contiguous(), dst)
        return None
    if gather_list is None or len(gather_list) != n:
        raise ValueError(f"gather_list must hold {n} tensors on the dst rank")
    reqs = [dist.irecv(gather_list[r], r) for r in range(n) if r != dst]
    gather_list[dst].copy_(tensor)
    for req in reqs:
        req.wait()
    return gather_list


def _ring_phase(chunks: list, phase: str, combine=None) -> None:
    """Run one phase of `ring_schedule` on this rank's chunks (send right, receive from the left)."""
    rank = dist.get_rank()
    # One receive buffer for the whole phase, combined in place: a fresh buffer and result per step
    # made our ring 3x slower than gloo's at 64 MB.
    buf = torch.empty(max(c.numel() for c in chunks), dtype=chunks[0].dtype, device=chunks[0].device)
    for transfers in ring_schedule(dist.get_world_size()):
        if transfers[0][3] != phase:
            continue
        send = next(t for t in transfers if t[0] == rank)
        recv = next(t for t in transfers if t[1] == rank)
        req = dist.isend(chunks[send[2]], send[1])  # isend first: everyone sends and receives at once
        target = chunks[recv[2]]
        if phase == PHASES[0]:
            incoming = buf[:target.numel()]
            dist.recv(incoming, recv[0])
            combine(target, incoming, out=target)
        else:
            dist.recv(target, recv[0])
        req.wait()


def reduce_scatter(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Ring reduce-scatter: returns (a copy of) the reduced `tensor_split(flat, N)[rank]`; N-1 steps."""
    combine, flat = _combine(op), _flat(tensor).clone()
    n, rank = dist.get_world_size(), dist.get_rank()
    chunks = list(torch.tensor_split(flat, n))
    _ring_phase(chunks, PHASES[0], combine)
    # After the phase, rank r holds the full chunk (r+1) % N; one hop to the left puts chunk r on rank r.
    mine = torch.empty_like(chunks[rank])
    if n > 1:
        req = dist.isend(chunks[(rank + 1) % n], (rank + 1) % n)
        dist.recv(mine, (rank - 1) % n)
        req.wait()
    else:
        mine.copy_(chunks[0])
    return mine


def all_gather(tensor_list: list, tensor: torch.Tensor) -> list:
    """Ring all-gather: N-1 steps, each rank passes on what it received last. Fills tensor_list in place."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if len(tensor_list) != n:
        raise ValueError(f"tensor_list must hold {n} tensors; got {len(tensor_list)}")
    tensor_list[rank].copy_(tensor)
    for s in range(n - 1):
        req = dist.isend(tensor_list[(rank - s) % n].contiguous(), (rank + 1) % n)
        dist.recv(tensor_list[(rank - s - 1) % n], (rank - 1) % n)
        req.wait()
    return tensor_list


def all_reduce_naive(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Everyone sends to rank 0, which combines and sends the result back: rank 0 is the hotspot."""
    combine, flat = _combine(op), _flat(tensor)
    n, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        buf = torch.empty_like(flat)
        for r in range(1, n):
            dist.recv(buf, r)
            flat.copy_(combine(flat, buf))
        reqs = [dist.isend(flat, r) for r in range(1, n)]
        for req in reqs:
            req.wait()
    else:
        dist.send(flat, 0)
        dist.recv(flat, 0)
    return tensor


def all_reduce_tree(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast: 2 log2(N) rounds."""
    reduce(tensor, 0, op)
    return broadcast(tensor, 0)


def all_reduce_ring(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce-scatter then all-gather around the ring (see ring.py); any size, in place."""
    combine, flat = _combine(op), _flat(tensor)
    chunks = list(torch.tensor_split(flat, dist.get_world_size()))  # views: the ring writes into tensor
    _ring_phase(chunks, PHASES[0], combine)
    _ring_phase(chunks, PHASES[1])
    return tensor


def all_reduce(tensor: torch.Tensor, op: str = "sum", algorithm: str = "ring") -> torch.Tensor:
    """All-reduce in place with one of ALGORITHMS."""
    one_of("algorithm", algorithm, ALGORITHMS)
    return {"naive": all_reduce_naive, "tree": all_reduce_tree, "ring": all_reduce_ring}[algorithm](tensor, op)


class Traffic:
    """What this rank did while counting: bytes/messages sent per (src, dst), and collectives called."""

    def __init__(self):
        self.bytes_sent, self.messages_sent = Counter(), Counter()
        self.bytes_received = Counter()
        self.collective_calls = Counter()

    def total_sent(self) -> int:
        return sum(self.bytes_sent.values())

    def __repr__(self):
        return f"Traffic(bytes_sent={dict(self.bytes_sent)}, collectives={dict(self.collective_calls)})"


@contextlib.contextmanager
def count_traffic():
    """Wrap dist.send/recv/isend/irecv (and note any built-in collective) while the block runs.

    Counts on the calling rank only; gather each rank's Traffic (return it from the worker) and
    combine with `traffic_matrix`. Works for code that calls `dist.send(...)` or
    `torch.distributed.send(...)` at run time (not for names bound earlier with `from ... import send`).
    """
    traffic, saved, rank = Traffic(), {}, dist.get_rank()

    def p2p(name, original):
        def wrapper(tensor, peer=None, *args, **kwargs):
            peer = kwargs.get("dst", kwargs.get("src", peer))
            nbytes = tensor.numel() * tensor.element_size()
            if name in ("send", "isend"):
                traffic.bytes_sent[(rank, peer)] += nbytes
                traffic.messages_sent[(rank, peer)] += 1
            else:
                traffic.bytes_received[(peer, rank)] += nbytes
            kwargs.pop("dst", None), kwargs.pop("src", None)
            return original(tensor, peer, *args, **kwargs)
        return wrapper

    def collective(name, original):
        def wrapper(*args, **kwargs):
            traffic.collective_calls[name] += 1
            return original(*args, **kwargs)
        return wrapper

    for name in P2P + COLLECTIVES:
        if hasattr(dist, name):
            saved[name] = getattr(dist, name)
            setattr(dist, name, (p2p if name in P2P else collective)(name, saved[name]))
    try:
        yield traffic
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def traffic_matrix(traffics: list) -> torch.Tensor:
    """[N, N] bytes: entry (src, dst) summed over the per-rank Traffic objects of one launch."""
    n = len(traffics)
    m = torch.zeros(n, n, dtype=torch.int64)
    for t in traffics:
        for (src, dst), nbytes in t.bytes_sent.items():
            m[src, dst] += nbytes
    return m


# Workers for `launch` (notebook demos and tests): fn(rank, world_size, ...).

def compare_with_torch(rank: int, world_size: int, sizes=(1, 5, 12, 1001)) -> dict:
    """Run every collective here and torch.distributed's own on the same data; return max |difference|."""
    dev, errors = rank_device(), Counter()

    def data(numel, seed):
        g = torch.Generator().manual_seed(1000 * seed + numel)
        return torch.randn(numel, generator=g).to(dev)

    def err(name, ours, theirs):
        errors[name] = max(errors[name], max_diff(ours, theirs))

    for numel in sizes:
        x = data(numel, rank)
        expected = x.clone()
        dist.all_reduce(expected)
        for alg in ALGORITHMS:
            err(f"all_reduce_{alg}", all_reduce(x.clone(), algorithm=alg), expected)
        err("reduce_scatter", reduce_scatter(x.clone()), torch.tensor_split(expected, world_size)[rank])
        root = numel % world_size
        mine = x.clone()
        reduce(mine, root)
        if rank == root:
            err("reduce", mine, expected)
        else:
            err("reduce(non-root unchanged)", mine, x)
        ours, theirs = x.clone(), x.clone()
        broadcast(ours, root), dist.broadcast(theirs, root)
        err("broadcast", ours, theirs)
        parts = [data(numel, 100 + r) for r in range(world_size)] if rank == root else None
        ours, theirs = torch.empty_like(x), torch.empty_like(x)
        scatter(ours, parts, root), dist.scatter(theirs, parts, root)
        err("scatter", ours, theirs)
        ours_l = [torch.empty_like(x) for _ in range(world_size)] if rank == root else None
        theirs_l = [torch.empty_like(x) for _ in range(world_size)] if rank == root else None
        gather(x, ours_l, root), dist.gather(x, theirs_l, root)
        if rank == root:
            err("gather", torch.stack(ours_l), torch.stack(theirs_l))
        ours_l, theirs_l = [torch.empty_like(x) for _ in range(world_size)], [torch.empty_like(x) for _ in range(world_size)]
        all_gather(ours_l, x), dist.all_gather(theirs_l, x)
        err("all_gather", torch.stack(ours_l), torch.stack(theirs_l))
    return dict(errors)


def traffic_of(rank: int, world_size: int, numel: int = 1 << 16) -> dict:
    """{algorithm: Traffic} of one float32 all-reduce of `numel` elements with each ALGORITHM."""
    out = {}
    for alg in ALGORITHMS:
        x = torch.ones(numel, device=rank_device())
        with count_traffic() as t:
            all_reduce(x, algorithm=alg)
        assert torch.all(x == world_size)
        out[alg] = t
    return out
