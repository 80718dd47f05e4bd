"""The checks of exercise notebook 05 pass the reference solutions and fail stubs and wrong answers.

Each ring check starts 2-4 processes per world size (seconds each): wrong answers are chosen so that
the check rejects them on its first world size (3 ranks).
"""

import pytest

import nbtools
from course_lib.checks.nb05 import check_bytes_sent_per_rank, check_ring_all_reduce
from nbtools import ROOT, notebook_namespace

NB = ROOT / "solutions" / "05_collectives_exercises.ipynb"
NS = notebook_namespace(NB)


def solution_module(tmp_path):
    return nbtools.solution_module(NB, tmp_path)


def stub(tensor):
    raise NotImplementedError()


def naive_through_rank_0(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()  # noqa: F821 - provided by the worker's namespace
    if rank == 0:
        buf = torch.empty_like(tensor)  # noqa: F821
        for r in range(1, n):
            dist.recv(buf, r)  # noqa: F821
            tensor += buf
        for r in range(1, n):
            dist.send(tensor, r)  # noqa: F821
    else:
        dist.send(tensor, 0)  # noqa: F821
        dist.recv(tensor, 0)  # noqa: F821
    return tensor


def calls_all_reduce(tensor):
    dist.all_reduce(tensor)  # noqa: F821
    return tensor


def ring_ignoring_remainder(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()  # noqa: F821
    size = tensor.numel() // n  # the last numel % n elements are never reduced
    chunks = [tensor[i * size:(i + 1) * size] for i in range(n)]
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        buf = torch.empty_like(chunks[0])  # noqa: F821
        req = dist.isend(chunks[(rank - s) % n], right)  # noqa: F821
        dist.recv(buf, left)  # noqa: F821
        req.wait()
        chunks[(rank - s - 1) % n] += buf
    for s in range(n - 1):
        req = dist.isend(chunks[(rank + 1 - s) % n], right)  # noqa: F821
        dist.recv(chunks[(rank - s) % n], left)  # noqa: F821
        req.wait()
    return tensor


def whole_tensor_round_the_ring(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()  # noqa: F821
    total, buf = tensor.clone(), tensor.clone()
    for _ in range(n - 1):  # pass whole tensors along: right answer, N x the ring's traffic
        req = dist.isend(buf.clone(), (rank + 1) % n)  # noqa: F821
        dist.recv(buf, (rank - 1) % n)  # noqa: F821
        req.wait()
        total += buf
    tensor.copy_(total)
    return tensor


@pytest.mark.timeout(240)
def test_reference_ring_passes(tmp_path):
    check_ring_all_reduce(solution_module(tmp_path).ring_all_reduce)


@pytest.mark.timeout(120)
def test_ring_stub_fails():
    with pytest.raises(NotImplementedError):
        check_ring_all_reduce(stub)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("wrong, message", [(naive_through_rank_0, "neighbour"), (calls_all_reduce, "dist.all_reduce"),
                                            (ring_ignoring_remainder, "divisible"),
                                            (whole_tensor_round_the_ring, "chunks")])
def test_wrong_rings_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_ring_all_reduce(wrong)


def test_bytes_reference_passes_and_wrong_answers_fail():
    check_bytes_sent_per_rank(NS["bytes_sent_per_rank"])
    with pytest.raises(NotImplementedError):
        check_bytes_sent_per_rank(lambda *a: (_ for _ in ()).throw(NotImplementedError()))

    def formula(algorithm, numel, n, es=4):  # 2(N-1)/N x size: not exact when N does not divide numel
        return [int(2 * (n - 1) / n * numel * es)] * n if algorithm == "ring" else NS["bytes_sent_per_rank"](
            algorithm, numel, n, es)

    def naive_forgets_broadcast(algorithm, numel, n, es=4):
        if algorithm == "naive":
            return [0] + [numel * es] * (n - 1)
        return NS["bytes_sent_per_rank"](algorithm, numel, n, es)

    for wrong in (formula, naive_forgets_broadcast):
        with pytest.raises(AssertionError):
            check_bytes_sent_per_rank(wrong)
