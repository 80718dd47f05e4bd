"""Checks for the exercises of lecture 03 (data loading).

Both checks test properties a data pipeline must have, not one particular implementation:
workers together read every index exactly once; a tensor batcher yields each sample once per
epoch, shuffled, with inputs and labels still paired, reproducibly from its generator. Messages
say what the answer's output shows (which indices, which batches), not a guess at its code.
"""
from __future__ import annotations

import math

import torch

from . import answer_source, call_answer, calls_function, expect, passed

SHARD_CASES = ((10, 2), (10, 3), (7, 4), (3, 5), (1, 1), (12, 4), (0, 3), (100, 7))
# (num_items, num_workers, worker_id) that must raise ValueError, and why they are bad
BAD_SHARD_ARGUMENTS = (((10, 2, 2), "worker_id = num_workers is outside [0, num_workers)"),
                       ((10, 2, -1), "a negative worker_id is outside [0, num_workers)"),
                       ((5, 0, 0), "num_workers = 0: there must be at least one worker"),
                       ((5, -2, 0), "a negative num_workers: there must be at least one worker"))


def _as_index_list(value, what: str) -> list[int]:
    """The answer's indices: a list, tuple or range of Python ints, as the text says."""
    if isinstance(value, torch.Tensor):
        raise AssertionError(f"{what} returned a tensor; return a list of Python ints (tensor.tolist()).")
    expect(isinstance(value, (list, tuple, range)),
           f"{what} returned {type(value).__name__}; return a list of int indices (or a range)"
           + (": a set has no order." if isinstance(value, (set, frozenset)) else "."))
    for i in value:
        expect(type(i) is int, f"{what} returned an element {i!r} of type {type(i).__name__}; expected Python ints "
               "(.tolist() turns tensor or numpy values into them).")
    return list(value)


def _shard_error(n: int, workers: int, parts: list) -> str:
    """What is wrong with the workers' parts, from the parts themselves; "" if nothing."""
    call = f"with num_items={n}, num_workers={workers}"
    everything = [i for part in parts for i in part]
    outside = sorted({i for i in everything if not 0 <= i < n})
    if outside:
        return f"{call} indices {outside} are outside range({n}): {parts}. Indices go from 0 to num_items - 1."
    if len(everything) != len(set(everything)):
        if n > 1 and all(sorted(p) == list(range(n)) for p in parts):
            return (f"{call} every worker reads every index: {parts}. An epoch would see each sample {workers} "
                    "times; give each index to exactly one worker.")
        twice = sorted({i for i in everything if everything.count(i) > 1})
        readers = {i: [w for w, p in enumerate(parts) if i in p] for i in twice[:3]}
        who = ", ".join(f"{i} by workers {w}" for i, w in readers.items())
        return (f"{call} indices {twice} are read more than once ({who}): {parts}. Give each index to exactly one "
                "worker.")
    missing = sorted(set(range(n)) - set(everything))
    if missing:
        tail = n % workers
        why = (f" They are the last {tail} (the remainder {n} % {workers}): every sample must be read once."
               if tail and missing == list(range(n - tail, n)) else " Every sample must be read once.")
        return f"{call} indices {missing} are read by no worker: {parts}.{why}"
    sizes = [len(p) for p in parts]
    if max(sizes) - min(sizes) > 1:
        return (f"{call} workers get {sizes} indices: unbalanced. Each should get {n // workers} or "
                f"{math.ceil(n / workers)}, so no worker waits for a slower one (round-robin does this).")
    return ""


def _refuses(shard_for_worker, args, why: str) -> None:
    what = f"shard_for_worker{args}"
    try:
        result = shard_for_worker(*args)
    except ValueError:
        return
    except NotImplementedError:
        raise
    except Exception as exc:
        said = getattr(exc, "message", str(exc))   # in the grading sandbox a StudentError: its own message only
        raise AssertionError(f"{what} raised {type(exc).__name__}{f' ({said})' if said else ''}; it should raise "
                             f"ValueError: {why}.") from None
    raise AssertionError(f"{what} returned {result!r}; it should raise ValueError: {why}.")


def check_shard_for_worker(shard_for_worker) -> None:
    """`shard_for_worker(num_items, num_workers, worker_id)` -> list of the indices that worker reads."""
    for n, workers in SHARD_CASES:
        parts = [_as_index_list(shard_for_worker(n, workers, w), f"shard_for_worker({n}, {workers}, {w})")
                 for w in range(workers)]
        error = _shard_error(n, workers, parts)
        expect(not error, error)
    for args, why in BAD_SHARD_ARGUMENTS:
        _refuses(shard_for_worker, args, why)
    passed("shard_for_worker")


# Library code that batches and shuffles in one call: the exercise is to write that part.
BATCHING_CALLS = ("DataLoader", "TensorLoader", "BatchSampler", "RandomSampler", "SubsetRandomSampler")


def _collect(make, n: int, batch_size: int, what: str):
    """The batches of one call `make()`, as a list; the answer's own errors become messages that say where."""
    batches = call_answer(make, what=what)
    try:
        iterator = iter(batches)        # once: a generator in the grading sandbox is read out by iter()
    except TypeError:
        raise AssertionError(f"{what} returned {type(batches).__name__}; expected an iterable of (x, y) "
                             "batches") from None
    try:
        items = list(iterator)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"{what} raised {type(exc).__name__} while yielding batches: {exc}") from None
    for b in items:
        expect(isinstance(b, (tuple, list)) and len(b) == 2 and all(isinstance(t, torch.Tensor) for t in b),
               f"{what}: each batch must be a pair of tensors (x_batch, y_batch); got {type(b).__name__}")
        expect(b[0].dim() >= 1 and b[1].dim() == 1,
               f"{what}: batches have shapes [B, ...] and [B], a batch of one sample too; got x_batch "
               f"{tuple(b[0].shape)} and y_batch {tuple(b[1].shape)}: keep the batch dimension.")
    sizes = [len(yb) for _, yb in items]
    expected = [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])
    expect(not (n % batch_size and sum(sizes) == n - n % batch_size),
           f"{what}: {sum(sizes)} samples in batches of {sizes}; the last partial batch of {n % batch_size} "
           "samples is missing. Keep it: every sample is seen once per epoch (drop_last=False).")
    expect(sizes == expected, f"{what}: batch sizes {sizes}; expected {expected} (full batches, then the remainder).")
    return items


def _dataset(n: int, sample_shape: tuple):
    """x whose sample i is filled with i (any sample shape), y with label 10 * i: a batch says which samples."""
    ids = torch.arange(n)
    x = ids.float().reshape(n, *[1] * len(sample_shape)).expand(n, *sample_shape).contiguous()
    return x, ids * 10


def _epoch(batches, x, y, batch_size, generator, what):
    """One call's (sample ids from x, from y) in the order they came, checked for shape and for changing x, y."""
    given = x.clone(), y.clone()
    items = _collect(lambda: batches(x, y, batch_size, generator), len(x), batch_size, what)
    expect(torch.equal(x, given[0]) and torch.equal(y, given[1]),
           f"{what}: x or y changed during the epoch: shuffle the indices, not the caller's data (x[idx] makes a "
           "new tensor; x[:] = x[perm] or an in-place shuffle overwrites the dataset).")
    for xb, yb in items:
        expect(xb.shape[1:] == x.shape[1:] and yb.shape[1:] == y.shape[1:],
               f"{what}: x batches must keep the sample shape {tuple(x.shape[1:])}; got {tuple(xb.shape)}")
        flat = xb.reshape(len(xb), -1)
        expect(bool((flat == flat[:, :1]).all()) and all(0 <= v < len(x) and v == int(v) for v in flat[:, 0].tolist()),
               f"{what}: an x batch holds rows that are not rows of x. Index x with a tensor of indices.")
    return (torch.cat([xb.reshape(len(xb), -1)[:, 0] for xb, _ in items]).long(),
            torch.cat([yb for _, yb in items]) // 10)


def _pairing_error(from_x, from_y, n: int, what: str) -> str:
    if torch.equal(from_x, from_y):
        return ""
    stored = torch.arange(n)
    if torch.equal(from_x, stored):
        return f"{what}: labels no longer match their images: y was shuffled but x comes in its stored order. " \
               "Index both with the same permutation."
    if torch.equal(from_y, stored):
        return f"{what}: labels no longer match their images: x was shuffled but y comes in its stored order. " \
               "Index both with the same permutation."
    return f"{what}: labels no longer match their images: x and y were shuffled differently. Shuffle x and y with " \
           "the SAME permutation (index both with one `perm`), not one permutation each."


def check_batches(batches) -> None:
    """`batches(x, y, batch_size, generator)` -> iterable of shuffled (x_batch, y_batch) covering every sample."""
    for name in BATCHING_CALLS:
        expect(not calls_function(answer_source(batches), name),
               f"batches uses {name}, which batches and shuffles for you: the exercise is to write that part (one "
               "torch.randperm from the generator, then slices of it).")
    n, batch_size = 50, 8
    ids = torch.arange(n)
    x, y = _dataset(n, (3,))
    what = f"batches(x [{n},3], y [{n}], batch_size={batch_size}, generator)"
    order, labels = _epoch(batches, x, y, batch_size, torch.Generator().manual_seed(0), what)
    expect(sorted(order.tolist()) == list(range(n)),
           f"{what}: some samples come twice and others never. Use one permutation of range(n) per epoch.")
    error = _pairing_error(order, labels, n, what)
    expect(not error, error)
    expect(not torch.equal(order, ids),
           f"{what}: the samples come in their stored order. Shuffle with torch.randperm(n, generator=generator).")
    again = _epoch(batches, x, y, batch_size, torch.Generator().manual_seed(0), what)[1]
    with torch.random.fork_rng(devices=[]):  # another global RNG state, restored afterwards
        torch.manual_seed(12345)
        other_global = _epoch(batches, x, y, batch_size, torch.Generator().manual_seed(0), what)[1]
    expect(torch.equal(again, labels) and torch.equal(other_global, labels),
           f"{what}: two generators seeded alike gave different orders. Draw the permutation from the "
           "`generator` argument (torch.randperm(n, generator=generator)), not the global RNG.")
    differs = _epoch(batches, x, y, batch_size, torch.Generator().manual_seed(1), what)[1]
    expect(not torch.equal(differs, labels), f"{what}: generators with different seeds gave the same order.")
    groups = [sorted(labels[s:s + batch_size].tolist()) for s in range(0, n, batch_size)]
    blocks = [list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)]
    expect(sorted(groups) != blocks,
           f"{what}: every batch holds one block of consecutive samples ({groups[0]}, ...), only reordered: "
           "the same samples always meet in the same batch, so the model never sees other mixes. Shuffle the "
           "indices of the WHOLE dataset (one torch.randperm(n)), then cut the permutation into batches.")
    # The next epoch: the same generator object, moved on (the grading sandbox receives a copy of it, so the
    # check advances it here rather than relying on the learner's call to do so).
    generator = torch.Generator().manual_seed(3)
    first = _epoch(batches, x, y, batch_size, generator, what)[1]
    torch.randperm(n, generator=generator)
    second = _epoch(batches, x, y, batch_size, generator, what)[1]
    expect(not torch.equal(first, second),
           f"{what}: two epochs with the same generator object (its state moved on in between) gave the same "
           "order. Each call is one epoch and must draw a fresh permutation from the generator as it is now, not "
           "reseed it or build a new one from its seed (like forgetting DistributedSampler.set_epoch(epoch): "
           "every epoch in the same order).")
    # Other shapes the text allows: fewer samples than one batch, batches that divide n, batch_size 1, 1-D and
    # image-shaped samples.
    for count, size, sample_shape in ((5, 8, (3,)), (12, 4, (1, 2, 2)), (6, 1, ()), (7, 3, ())):
        xs, ys = _dataset(count, sample_shape)
        shape = "x [" + ", ".join(map(str, (count, *sample_shape))) + "]"
        case = f"batches({shape}, y [{count}], batch_size={size}, generator)"
        from_x, from_y = _epoch(batches, xs, ys, size, torch.Generator().manual_seed(0), case)
        expect(sorted(from_x.tolist()) == list(range(count)),
               f"{case}: some samples come twice and others never. Use one permutation of range(n) per epoch.")
        error = _pairing_error(from_x, from_y, count, case)
        expect(not error, error)
    passed("batches")
