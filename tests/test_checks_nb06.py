"""The checks of exercise notebook 06 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch

from course_lib.checks.nb06 import check_reduce_gradients, check_scatter
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "06_data_parallel_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_scatter(NS["scatter"])
    check_reduce_gradients(NS["reduce_gradients"])


def test_stubs_fail():
    for check in (check_scatter, check_reduce_gradients):
        with pytest.raises(NotImplementedError):
            check(stub)


def drops_remainder(batch, k):
    size = batch.shape[0] // k
    return [batch[i * size:(i + 1) * size] for i in range(k)]


def wrong_dim(batch, k):
    return list(torch.chunk(batch, k, dim=1))


def even_sizes(batch, k):  # torch.tensor_split: 3, 3, 2, 2 instead of torch.chunk's 3, 3, 3, 1
    return list(torch.tensor_split(batch, k))


def strided(batch, k):  # round-robin rows: right sizes sometimes, wrong samples per device
    return [batch[i::k] for i in range(min(k, batch.shape[0]))]


@pytest.mark.parametrize("wrong, hint", [
    (drops_remainder, "remainder"), (wrong_dim, "only dim 0"), (even_sizes, "torch.chunk"), (strided, "torch.chunk|in order"),
])
def test_scatter_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_scatter(wrong)


def averages(replicas, master):
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        target.grad = sum(p.grad for p in copies) / len(copies)


def forgets_to_zero(replicas, master):
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        target.grad = target.grad + sum(p.grad for p in copies)


def replica_zero_only(replicas, master):
    for target, first in zip(master.parameters(), replicas[0].parameters()):
        target.grad = first.grad.clone()


def aliases_replica_zero(replicas, master):
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        target.grad = copies[0].grad
        for p in copies[1:]:
            target.grad += p.grad


def returns_instead(replicas, master):
    return [sum(p.grad for p in copies) for copies in zip(*(r.parameters() for r in replicas))]


@pytest.mark.parametrize("wrong, hint", [
    (averages, "MEAN"), (forgets_to_zero, "old master gradient"), (replica_zero_only, "replica 0's alone"),
    (aliases_replica_zero, "replica's gradient was modified"), (returns_instead, "return nothing"),
])
def test_reduce_gradients_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_reduce_gradients(wrong)
