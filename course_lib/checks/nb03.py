"""Checks for the exercises of lecture 03 (data loading).

Both checks test properties a data pipeline must have, not one particular implementation:
workers together read every index exactly once; a tensor batcher yields each sample once per
epoch, shuffled, with inputs and labels still paired, reproducibly from its generator.
"""
from __future__ import annotations

import math

import torch

from . import expect, passed

SHARD_CASES = ((10, 2), (10, 3), (7, 4), (3, 5), (1, 1), (12, 4), (0, 3))


def _as_index_list(value, what: str) -> list[int]:
    try:
        items = list(value)
    except TypeError:
        raise AssertionError(f"{what} returned {type(value).__name__}; expected a list of int indices") from None
    for i in items:
        expect(isinstance(i, int) or (isinstance(i, torch.Tensor) and i.numel() == 1 and not i.is_floating_point()),
               f"{what} returned an element {i!r}; expected int indices")
    return [int(i) for i in items]


def check_shard_for_worker(shard_for_worker) -> None:
    """`shard_for_worker(num_items, num_workers, worker_id)` -> list of the indices that worker reads."""
    for n, workers in SHARD_CASES:
        parts = [_as_index_list(shard_for_worker(n, workers, w), f"shard_for_worker({n}, {workers}, {w})")
                 for w in range(workers)]
        everything = [i for part in parts for i in part]
        call = f"with num_items={n}, num_workers={workers}"
        expect(all(0 <= i < n for i in everything),
               f"{call} some index is outside range({n}): {parts}. Indices go from 0 to num_items - 1.")
        seen = set(everything)
        expect(len(everything) == len(seen),
               f"{call} some indices are read by more than one worker (or twice by one): {parts}. "
               "If every worker reads everything, or contiguous blocks overlap, an epoch sees those samples "
               "several times. Give each index to exactly one worker.")
        expect(seen == set(range(n)),
               f"{call} indices {sorted(set(range(n)) - seen)} are read by no worker: {parts}. "
               f"Did you drop the remainder ({n} % {workers} = {n % workers})? Every sample must be read once.")
        sizes = [len(p) for p in parts]
        expect(max(sizes) - min(sizes) <= 1,
               f"{call} workers get {sizes} indices: unbalanced. Each should get {n // workers} or "
               f"{math.ceil(n / workers)}, so no worker waits for a slower one (round-robin does this).")
    for n, workers, w in ((10, 2, 2), (10, 2, -1), (5, 0, 0)):
        try:
            result = shard_for_worker(n, workers, w)
        except ValueError:
            continue
        raise AssertionError(f"shard_for_worker({n}, {workers}, {w}) returned {result!r}; it should raise "
                             "ValueError: worker_id must be in [0, num_workers) and num_workers >= 1.")
    passed("shard_for_worker")


def _collect(batches, n: int, batch_size: int, what: str):
    try:
        items = list(batches)
    except TypeError:
        raise AssertionError(f"{what} returned {type(batches).__name__}; expected an iterable of (x, y) batches") from None
    for b in items:
        expect(isinstance(b, (tuple, list)) and len(b) == 2 and all(isinstance(t, torch.Tensor) for t in b),
               f"{what}: each batch must be a pair of tensors (x_batch, y_batch); got {type(b).__name__}")
    sizes = [len(yb) for _, yb in items]
    expected = [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])
    expect(not (n % batch_size and sum(sizes) == n - n % batch_size),
           f"{what}: {sum(sizes)} samples in batches of {sizes}; the last partial batch of {n % batch_size} "
           "samples is missing. Keep it: every sample is seen once per epoch (drop_last=False).")
    expect(sizes == expected, f"{what}: batch sizes {sizes}; expected {expected} (full batches, then the remainder).")
    return items


def check_batches(batches) -> None:
    """`batches(x, y, batch_size, generator)` -> iterable of shuffled (x_batch, y_batch) covering every sample."""
    n, batch_size = 50, 8
    ids = torch.arange(n)
    x = torch.stack([ids.float(), -ids.float(), ids.float() / 2], 1)   # row i identifies sample i
    y = ids * 10                                                       # label of sample i is 10 * i
    what = f"batches(x [{n},3], y [{n}], batch_size={batch_size}, generator)"
    items = _collect(batches(x, y, batch_size, torch.Generator().manual_seed(0)), n, batch_size, what)
    for xb, yb in items:
        expect(xb.shape[1:] == x.shape[1:] and yb.shape[1:] == y.shape[1:],
               f"{what}: x batches must keep the sample shape {tuple(x.shape[1:])}; got {tuple(xb.shape)}")
        expect(all(any(torch.equal(row, r) for r in x) for row in xb),
               f"{what}: an x batch holds rows that are not rows of x. Index x with a tensor of indices.")
    order = torch.cat([xb[:, 0] for xb, _ in items]).long()
    labels = torch.cat([yb for _, yb in items])
    expect(sorted(order.tolist()) == list(range(n)),
           f"{what}: some samples come twice and others never. Use one permutation of range(n) per epoch.")
    expect(torch.equal(labels, order * 10),
           f"{what}: labels no longer match their images. Shuffle x and y with the SAME permutation "
           "(index both with one `perm`), not one permutation each.")
    expect(not torch.equal(order, ids),
           f"{what}: the samples come in their stored order. Shuffle with torch.randperm(n, generator=generator).")
    again = torch.cat([yb for _, yb in batches(x, y, batch_size, torch.Generator().manual_seed(0))])
    with torch.random.fork_rng(devices=[]):  # another global RNG state, restored afterwards
        torch.manual_seed(12345)
        other_global = torch.cat([yb for _, yb in batches(x, y, batch_size, torch.Generator().manual_seed(0))])
    expect(torch.equal(again, labels) and torch.equal(other_global, labels),
           f"{what}: two generators seeded alike gave different orders. Draw the permutation from the "
           "`generator` argument (torch.randperm(n, generator=generator)), not the global RNG.")
    differs = torch.cat([yb for _, yb in batches(x, y, batch_size, torch.Generator().manual_seed(1))])
    expect(not torch.equal(differs, labels), f"{what}: generators with different seeds gave the same order.")
    groups = [sorted((yb // 10).tolist()) for _, yb in items]
    blocks = [list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)]
    expect(sorted(groups) != blocks,
           f"{what}: every batch holds one block of consecutive samples ({groups[0]}, ...), only reordered: "
           "the same samples always meet in the same batch, so the model never sees other mixes. Shuffle the "
           "indices of the WHOLE dataset (one torch.randperm(n)), then cut the permutation into batches.")
    # The next epoch: the same generator object, moved on (the grading sandbox receives a copy of it, so the
    # check advances it here rather than relying on the learner's call to do so).
    generator = torch.Generator().manual_seed(3)
    first = torch.cat([yb for _, yb in batches(x, y, batch_size, generator)])
    torch.randperm(n, generator=generator)
    second = torch.cat([yb for _, yb in batches(x, y, batch_size, generator)])
    expect(not torch.equal(first, second),
           f"{what}: two epochs with the same generator object (its state moved on in between) gave the same "
           "order. Each call is one epoch and must draw a fresh permutation from the generator as it is now, not "
           "reseed it or build a new one from its seed (like forgetting DistributedSampler.set_epoch(epoch): "
           "every epoch in the same order).")
    small = _collect(batches(x[:5], y[:5], 8, torch.Generator().manual_seed(0)), 5, 8, "batches with 5 samples, batch_size=8")
    expect(sorted(small[0][1].tolist()) == y[:5].tolist(), "batches with 5 samples, batch_size=8: wrong samples")
    passed("batches")
