"""Checks for solutions/06_data_parallel_exercises.ipynb: DataParallel's scatter and gradient reduction.

`scatter` is compared with torch.chunk (what nn.parallel.scatter uses to size the chunks);
`reduce_gradients` is compared with autograd's gradient of one device with the whole batch.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from . import answer_source, calls_method, expect, expect_close, passed


def check_scatter(scatter) -> None:
    """scatter(batch, k) splits dim 0 into torch.chunk's pieces, in order, without changing the rest."""
    expect(not calls_method(answer_source(scatter), "chunk"), "scatter calls chunk: the exercise asks you to "
           "size the pieces yourself, with slicing (torch.chunk is what the check compares with)")
    for n, k in ((10, 4), (10, 3), (8, 2), (5, 4), (7, 1), (2, 5)):
        batch = torch.arange(n * 3 * 2, dtype=torch.float32).reshape(n, 3, 2)
        expected = torch.chunk(batch, k, dim=0)
        got = scatter(batch, k)
        expect(isinstance(got, (list, tuple)) and all(isinstance(c, torch.Tensor) for c in got),
               f"return a list of tensors; got {type(got).__name__}")
        got_shapes = [tuple(c.shape) for c in got]
        want_shapes = [tuple(c.shape) for c in expected]
        if any(s[1:] != (3, 2) for s in got_shapes):
            raise AssertionError(f"batch of shape {tuple(batch.shape)}, k={k}: chunk shapes {got_shapes} — only "
                                 "dim 0 (the samples) may be split; the other dims of every sample must stay whole.")
        rows = sum(s[0] for s in got_shapes)
        expect(rows == n, f"N={n}, k={k}: the chunks hold {rows} rows in total instead of {n}. Every sample must "
               "go to some device; dropping the remainder silently trains on less data.")
        expect(got_shapes == want_shapes,
               f"N={n}, k={k}: chunk sizes {[s[0] for s in got_shapes]}, but DataParallel uses torch.chunk's "
               f"{[s[0] for s in want_shapes]}: chunks of ceil(N/k) rows, the last one smaller "
               "(which can mean fewer than k chunks).")
        for i, (g, e) in enumerate(zip(got, expected)):
            expect_close(g, e, f"N={n}, k={k}: chunk {i}", atol=0,
                         hint="chunk i must hold consecutive rows, in order, so gather can concatenate them back.")
    passed("scatter")


def _replicas_after_backward(model, x, y, k):
    """k replicas of `model` after forward on torch.chunk pieces, gather, mean loss and backward."""
    replicas = [copy.deepcopy(model) for _ in range(k)]
    outputs = [r(c) for r, c in zip(replicas, torch.chunk(x, k))]
    F.cross_entropy(torch.cat(outputs), y).backward()
    return replicas[:len(outputs)]


def check_reduce_gradients(reduce_gradients) -> None:
    """reduce_gradients(replicas, master) writes the sum of the replicas' grads into master's grads."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    x, y = torch.randn(11, 5), torch.randint(0, 3, (11,))
    full = copy.deepcopy(model)
    F.cross_entropy(full(x), y).backward()
    for k in (3, 2, 1):
        replicas = _replicas_after_backward(model, x, y, k)
        before = [p.grad.clone() for r in replicas for p in r.parameters()]
        master = copy.deepcopy(model)
        for p in master.parameters():
            p.grad = torch.full_like(p, 0.5)  # left over from an earlier step
        result = reduce_gradients(replicas, master)
        expect(result is None or result is master, "reduce_gradients should fill master's .grad (return nothing)")
        grads = [p.grad for p in master.parameters()]
        expect(all(g is not None for g in grads), f"k={k}: master parameters have no .grad after reduce_gradients")
        first = next(iter(master.parameters()))
        ref = next(iter(full.parameters())).grad
        if k > 1 and torch.allclose(first.grad, ref / k, atol=1e-6):
            raise AssertionError(f"k={k}: master gradient is the MEAN of the replicas'. DataParallel SUMS them: the loss "
                                 "is the mean over the whole gathered batch, so each replica's gradient already carries "
                                 "its 1/N share; averaging divides by k a second time.")
        if torch.allclose(first.grad, ref + 0.5, atol=1e-6):
            raise AssertionError(f"k={k}: the old master gradient (0.5 everywhere) was kept and added to. Replace the "
                                 "master's .grad with the sum instead of accumulating into it.")
        after = [p.grad for r in replicas for p in r.parameters()]
        expect(all(torch.equal(a, b) for a, b in zip(before, after)),
               "a replica's gradient was modified: build the sum in a new tensor (master.grad = a + b creates one; "
               "master.grad = replica.grad; master.grad += ... changes that replica's gradient too).")
        if k > 1 and torch.allclose(first.grad, next(iter(replicas[0].parameters())).grad, atol=1e-7):
            raise AssertionError(f"k={k}: the master gradient equals replica 0's alone. Every replica saw different "
                                 "samples: add all k replicas' gradients.")
        for i, (got, want) in enumerate(zip(master.parameters(), full.parameters())):
            expect_close(got.grad, want.grad, f"k={k}: gradient of master parameter {i}", atol=1e-6,
                         hint="the sum of the replicas' gradients must equal one device's gradient on the whole batch.")
    passed("reduce_gradients")
