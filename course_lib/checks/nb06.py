"""Checks for solutions/06_data_parallel_exercises.ipynb: DataParallel's scatter and gradient reduction.

`scatter` is compared with torch.chunk (what nn.parallel.scatter uses to size the chunks);
`reduce_gradients` is compared with autograd's gradient of one device with the whole batch.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from . import answer_source, calls_method, expect, expect_close, passed


# (N, k, shape of one sample, dtype): remainders, k > N, one device, one sample; 1-D batches (a sample is a
# number), images; integer and boolean batches (labels, masks) as well as float.
SCATTER_CASES = [(10, 4, (3, 2), torch.float32), (10, 3, (3, 2), torch.float32), (8, 2, (), torch.int64),
                 (5, 4, (1, 2, 2), torch.float32), (7, 1, (3,), torch.float64), (2, 5, (3, 2), torch.float32),
                 (1, 3, (4,), torch.int64), (9, 4, (2,), torch.bool), (64, 6, (1, 2, 2), torch.float32)]


def _batch(n: int, sample: tuple, dtype) -> torch.Tensor:
    """A batch whose every element differs (a bool batch: a pattern), so that any reordering shows."""
    values = torch.arange(n * math.prod(sample)).reshape(n, *sample)
    return values % 3 == 0 if dtype == torch.bool else values.to(dtype)


def check_scatter(scatter) -> None:
    """scatter(batch, k) splits dim 0 into torch.chunk's pieces, in order, without changing the rest."""
    expect(not calls_method(answer_source(scatter), "chunk"), "scatter calls chunk: the exercise asks you to "
           "size the pieces yourself, with slicing (torch.chunk is what the check compares with)")
    for n, k, sample, dtype in SCATTER_CASES:
        batch = _batch(n, sample, dtype)
        where = f"N={n}, k={k}, batch of shape {tuple(batch.shape)} ({str(dtype)[6:]})"
        got = scatter(batch, k)
        expect(torch.equal(batch, _batch(n, sample, dtype)), f"{where}: scatter changed the batch it was given; only "
               "read it (slicing gives views, it changes nothing)")
        expect(isinstance(got, (list, tuple)) and all(isinstance(c, torch.Tensor) for c in got),
               f"return a list of tensors; got {type(got).__name__}")
        expected = torch.chunk(batch, k, dim=0)
        got_shapes = [tuple(c.shape) for c in got]
        want_shapes = [tuple(c.shape) for c in expected]
        if any(s[1:] != sample for s in got_shapes):
            raise AssertionError(f"{where}: chunk shapes {got_shapes}: only dim 0 (the samples) may be split; "
                                 "the other dims of every sample must stay whole.")
        rows = sum(s[0] for s in got_shapes)
        expect(rows == n, f"{where}: the chunks hold {rows} rows in total instead of {n}. " + (
            "Every sample must go to some device; dropping the remainder silently trains on less data."
            if rows < n else "Each sample must go to exactly one device: the chunks must not overlap."))
        expect(got_shapes == want_shapes,
               f"{where}: chunk sizes {[s[0] for s in got_shapes]}, but DataParallel uses torch.chunk's "
               f"{[s[0] for s in want_shapes]}: chunks of ceil(N/k) rows, the last one smaller "
               "(which can mean fewer than k chunks).")
        for i, (g, e) in enumerate(zip(got, expected)):
            expect(g.dtype == dtype, f"{where}: chunk {i} is {g.dtype}; the chunks keep the batch's dtype")
            expect_close(g, e, f"{where}: chunk {i}", atol=0,
                         hint="chunk i must hold consecutive rows, in order, so gather can concatenate them back.")
    passed("scatter")


def _replicas_after_backward(model, x, y, k):
    """k replicas of `model` after forward on torch.chunk pieces, gather, mean loss and backward."""
    replicas = [copy.deepcopy(model) for _ in range(k)]
    outputs = [r(c) for r, c in zip(replicas, torch.chunk(x, k))]
    F.cross_entropy(torch.cat(outputs), y).backward()
    return replicas[:len(outputs)]


def _reduce(reduce_gradients, replicas, master, where: str, first_step: bool) -> None:
    """Call the answer; an error on a .grad that is None says whose None it was."""
    try:
        result = reduce_gradients(replicas, master)
    except (TypeError, AttributeError) as exc:
        none_now = [p.grad is None for p in master.parameters()]
        if "NoneType" not in str(exc) or not (first_step or any(none_now)):
            raise
        why = ("before the first step the master's parameters have no gradient yet (.grad is None)" if first_step
               else "your code set the master's .grad to None (zero_grad() does by default) and then used it")
        raise AssertionError(f"{where}: {type(exc).__name__}: {exc}: {why}. Create the master's gradient "
                             "(p.grad = the sum) instead of writing into the old one.") from None
    expect(result is None or result is master, "reduce_gradients should fill master's .grad (return nothing)")


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def check_reduce_gradients(reduce_gradients) -> None:
    """reduce_gradients(replicas, master) writes the sum of the replicas' grads into master's grads, on a step after
    another (the old .grad must not leak) and on the first step (no .grad yet)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    x, y = torch.randn(11, 5), torch.randint(0, 3, (11,))
    full = copy.deepcopy(model)
    F.cross_entropy(full(x), y).backward()
    for k, first_step in ((3, False), (2, False), (1, False), (4, True), (1, True)):
        replicas = _replicas_after_backward(model, x, y, k)
        before = [p.grad.clone() for r in replicas for p in r.parameters()]
        master = copy.deepcopy(model)
        if not first_step:
            for p in master.parameters():
                p.grad = torch.full_like(p, 0.5)  # left over from an earlier step
        where = f"k={k}{', first step' if first_step else ''}"
        _reduce(reduce_gradients, replicas, master, where, first_step)
        grads = [p.grad for p in master.parameters()]
        expect(all(g is not None for g in grads), f"{where}: master parameters have no .grad after reduce_gradients")
        expect(all(torch.equal(a, b) for a, b in zip(master.parameters(), model.parameters())) and
               all(torch.equal(a, b) for r in replicas for a, b in zip(r.parameters(), model.parameters())),
               f"{where}: the weights changed: reduce_gradients only sets the master's .grad (the optimizer step "
               "comes after it)")
        first = next(iter(master.parameters()))
        ref = next(iter(full.parameters())).grad
        if len(replicas) > 1 and torch.allclose(first.grad, ref / len(replicas), atol=1e-6):
            raise AssertionError(f"{where}: master gradient is the MEAN of the replicas'. DataParallel SUMS them: the "
                                 "loss is the mean over the whole gathered batch, so each replica's gradient already "
                                 "carries its 1/N share; averaging divides by k a second time.")
        if torch.allclose(first.grad, ref + 0.5, atol=1e-6):
            raise AssertionError(f"{where}: the old master gradient (0.5 everywhere) was kept and added to. Replace "
                                 "the master's .grad with the sum instead of accumulating into it.")
        after = [p.grad for r in replicas for p in r.parameters()]
        expect(all(torch.equal(a, b) for a, b in zip(before, after)),
               "a replica's gradient was modified: build the sum in a new tensor (master.grad = a + b creates one; "
               "master.grad = replica.grad; master.grad += ... changes that replica's gradient too).")
        for i, (target, *copies) in enumerate(zip(master.parameters(), *(r.parameters() for r in replicas))):
            shared = next((j for j, p in enumerate(copies) if _shares_memory(target.grad, p.grad)), None)
            expect(shared is None, f"{where}: master parameter {i}'s .grad is replica {shared}'s gradient tensor "
                   "itself (shared memory): the next in-place change of one (zero_grad, +=) changes the other. "
                   "Create a new tensor for the sum.")
        for j, replica in enumerate(replicas):
            if len(replicas) > 1 and torch.allclose(first.grad, next(iter(replica.parameters())).grad, atol=1e-7):
                raise AssertionError(f"{where}: the master gradient equals replica {j}'s alone. Every replica saw "
                                     f"different samples: add all {len(replicas)} replicas' gradients.")
        for i, (got, want) in enumerate(zip(master.parameters(), full.parameters())):
            expect_close(got.grad, want.grad, f"{where}: gradient of master parameter {i}", atol=1e-6,
                         hint="the sum of the replicas' gradients must equal one device's gradient on the whole batch.")
    passed("reduce_gradients")
