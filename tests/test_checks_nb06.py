"""The checks of exercise notebook 06 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


def wrong_dim(batch, k):  # slices the features, not the samples
    size = -(-batch.shape[1] // k)
    return [batch[:, i:i + size] for i in range(0, batch.shape[1], size)]


def even_sizes(batch, k):  # torch.tensor_split: 3, 3, 2, 2 instead of torch.chunk's 3, 3, 3, 1
    return list(torch.tensor_split(batch, k))


def strided(batch, k):  # round-robin rows: right sizes sometimes, wrong samples per device
    return [batch[i::k] for i in range(min(k, batch.shape[0]))]


def with_torch_chunk(batch, k):  # the right pieces, but with the built-in the exercise forbids
    return list(torch.chunk(batch, k))


def method_chunk(batch, k):
    return list(batch.chunk(k, dim=0))


def floor_size_plus_last(batch, k):  # floor(N/k) rows, the remainder glued onto the last chunk: 2, 2, 2, 4
    size = batch.shape[0] // k
    if size == 0:
        return [batch]
    return [batch[i * size:(i + 1) * size] for i in range(k - 1)] + [batch[(k - 1) * size:]]


def always_k_chunks(batch, k):  # ceil-sized, but k pieces even when the batch runs out (empty tails)
    size = -(-batch.shape[0] // k)
    return [batch[i * size:(i + 1) * size] for i in range(k)]


def two_dim_slicing(batch, k):  # batch[a:b, :]: right for [N, F] batches, fails on a 1-D batch (a sample is a number)
    size = -(-batch.shape[0] // k)
    return [batch[i:i + size, :] for i in range(0, batch.shape[0], size)]


def as_float(batch, k):  # slicing, then .float(): integer labels and boolean masks come back as float32
    size = -(-batch.shape[0] // k)
    return [batch[i:i + size].float() for i in range(0, batch.shape[0], size)]


def sorts_in_place(batch, k):  # "shuffles" the samples into the caller's batch before slicing
    batch.copy_(batch.flip(0))
    size = -(-batch.shape[0] // k)
    return [batch[i:i + size].flip(0) for i in range(0, batch.shape[0], size)][::-1]


def round_sizes(batch, k):  # round(N / k) instead of ceil: 10 / 4 = 2.5 rounds to 2 (half to even)
    size = max(1, round(batch.shape[0] / k))
    return [batch[i:i + size] for i in range(0, batch.shape[0], size)]


@pytest.mark.parametrize("wrong, hint", [
    (with_torch_chunk, "calls chunk"), (method_chunk, "calls chunk"), (floor_size_plus_last, "torch.chunk's"),
    (always_k_chunks, "torch.chunk's"),
    (drops_remainder, "remainder"), (wrong_dim, "only dim 0"), (even_sizes, "torch.chunk"), (strided, "torch.chunk|in order"),
    (as_float, "keep the batch's dtype"), (sorts_in_place, "changed the batch"), (round_sizes, "torch.chunk's"),
])
def test_scatter_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_scatter(wrong)


def test_scatter_equivalent_answers_pass():
    def with_split(batch, k):             # torch.split with the ceil size: the same pieces, sized by hand
        return list(torch.split(batch, -(-batch.shape[0] // k)))

    def narrow_loop(batch, k):
        size, out, start = -(-batch.shape[0] // k), [], 0
        while start < batch.shape[0]:
            out.append(batch.narrow(0, start, min(size, batch.shape[0] - start)))
            start += size
        return tuple(out)
    check_scatter(with_split)
    check_scatter(narrow_loop)

    def copies(batch, k):                   # copies of the slices, not views: the same pieces
        size = -(-len(batch) // k)
        return [batch[i:i + size].clone() for i in range(0, len(batch), size)]
    check_scatter(copies)


def test_two_dim_slicing_fails_on_a_1d_batch():
    with pytest.raises(IndexError, match="too many indices"):
        check_scatter(two_dim_slicing)


@settings(max_examples=60)
@given(st.integers(1, 40), st.integers(1, 12), st.sampled_from([(), (3,), (2, 1, 2)]),
       st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float16]))
def test_scatter_solution_is_torch_chunk(n, k, sample, dtype):
    batch = torch.arange(n * torch.Size(sample).numel()).reshape(n, *sample).to(dtype)
    got, want = NS["scatter"](batch, k), torch.chunk(batch, k)
    assert len(got) == len(want) and all(g.dtype == dtype and torch.equal(g, w) for g, w in zip(got, want))


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


def mean_loss_share(replicas, master):   # sum, then divide by the number of samples again
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        target.grad = sum(p.grad for p in copies) / 11


def last_replica_wins(replicas, master):  # overwrites instead of adding
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        for p in copies:
            target.grad = p.grad.clone()


def zero_then_add(replicas, master):  # reuses the master's tensor: there is none before the first step
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        target.grad.zero_()
        for p in copies:
            target.grad.add_(p.grad)


def zero_grad_then_accumulate(replicas, master):  # zero_grad() sets .grad to None, then += reads it
    master.zero_grad()
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        for p in copies:
            target.grad += p.grad


def aliases_when_one_replica(replicas, master):  # one replica: hands over its own tensor
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        target.grad = copies[0].grad if len(copies) == 1 else sum(p.grad for p in copies)


def steps_too(replicas, master):               # also takes an SGD step: that is the optimizer's job
    for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
        target.grad = sum(p.grad for p in copies)
        target.data -= 0.1 * target.grad


@pytest.mark.parametrize("wrong, hint", [
    (averages, "MEAN"), (mean_loss_share, "gradient of master parameter"), (last_replica_wins, "replica 2's alone"),
    (forgets_to_zero, "old master gradient"), (replica_zero_only, "replica 0's alone"),
    (aliases_replica_zero, "replica's gradient was modified"), (returns_instead, "return nothing"),
    (zero_then_add, "first step.*no gradient yet"), (zero_grad_then_accumulate, "set the master's .grad to None"),
    (aliases_when_one_replica, "k=1: master parameter 0's .grad is replica 0's gradient tensor itself"),
    (steps_too, "weights changed"),
])
def test_reduce_gradients_wrong_answers(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_reduce_gradients(wrong)


def test_reduce_gradients_equivalent_answers_pass():
    def zero_then_add(replicas, master):  # reuse the master's tensor where there is one: zero it, then add
        for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
            if target.grad is None:
                target.grad = torch.zeros_like(target)
            target.grad.zero_()
            for p in copies:
                target.grad.add_(p.grad)

    def stacked(replicas, master):
        for target, *copies in zip(master.parameters(), *(r.parameters() for r in replicas)):
            target.grad = torch.stack([p.grad for p in copies]).sum(0)
        return master
    check_reduce_gradients(zero_then_add)
    check_reduce_gradients(stacked)
