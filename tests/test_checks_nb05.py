"""The checks of exercise notebook 05 pass the reference solutions and fail stubs and wrong answers.

The ring answers run in one launch per world size (tests/many_answers.py): the reference and the other correct
answers on 1-4 ranks, the wrong ones on 3 ranks, where each is rejected.
"""
import inspect
import textwrap

import pytest
import torch  # noqa: F401 - the answers below run with torch and dist in their namespace
import torch.distributed as dist  # noqa: F401

from course_lib.checks.nb05 import WORLD_SIZES, check_bytes_sent_per_rank, judge_ring
from nbtools import ROOT, notebook_namespace

NB = ROOT / "solutions" / "05_collectives_exercises.ipynb"
NS = notebook_namespace(NB)


def stub(tensor):
    raise NotImplementedError()


# --- wrong answers, as a learner writes them (torch and dist come from the worker's namespace) ----------------

def naive_through_rank_0(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        buf = torch.empty_like(tensor)
        for r in range(1, n):
            dist.recv(buf, r)
            tensor += buf
        for r in range(1, n):
            dist.send(tensor, r)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)
    return tensor


def calls_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor


def ring_ignoring_remainder(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    size = tensor.numel() // n  # the last numel % n elements are never reduced
    chunks = [tensor[i * size:(i + 1) * size] for i in range(n)]
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        buf = torch.empty_like(chunks[0])
        req = dist.isend(chunks[(rank - s) % n], right)
        dist.recv(buf, left)
        req.wait()
        chunks[(rank - s - 1) % n] += buf
    for s in range(n - 1):
        req = dist.isend(chunks[(rank + 1 - s) % n], right)
        dist.recv(chunks[(rank - s) % n], left)
        req.wait()
    return tensor


def whole_tensor_round_the_ring(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    total, buf = tensor.clone(), tensor.clone()
    for _ in range(n - 1):  # pass whole tensors along: right answer, N x the ring's traffic
        req = dist.isend(buf.clone(), (rank + 1) % n)
        dist.recv(buf, (rank - 1) % n)
        req.wait()
        total += buf
    tensor.copy_(total)
    return tensor


RING = '''
def ring_all_reduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    work = tensor.contiguous()
    chunks = SPLIT
    right, left = (rank + 1) % n, (rank - 1) % n
    for s in range(n - 1):
        send, recv = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
        buf = BUFFER
        req = dist.isend(send, right)
        dist.recv(buf, left)
        req.wait()
        recv += buf
    for s in range(n - 1):
        req = dist.isend(chunks[(rank + 1 - s) % n], right)
        dist.recv(chunks[(rank - s) % n], left)
        req.wait()
    tensor.copy_(work)
    return tensor
'''


def ring(**changes) -> str:
    source = RING.replace("SPLIT", "torch.tensor_split(work, n)").replace("BUFFER", "torch.empty_like(recv)")
    for old, new in changes.items():
        assert old in source, old
        source = source.replace(old, new)
    return source


def source_of(fn) -> str:
    return textwrap.dedent(inspect.getsource(fn))


PADDED = '''
def ring_all_reduce(tensor):
    # a different correct answer: pad to a multiple of N, equal chunks, copy the sum back
    rank, n = dist.get_rank(), dist.get_world_size()
    size = -(-tensor.numel() // n)
    work = torch.zeros(size * n, dtype=tensor.dtype)
    work[:tensor.numel()] = tensor
    chunks = list(work.view(n, size))
    for s in range(n - 1):
        buf = torch.zeros_like(chunks[0])
        reqs = [dist.isend(chunks[(rank - s) % n], (rank + 1) % n), dist.irecv(buf, (rank - 1) % n)]
        for r in reqs:
            r.wait()
        chunks[(rank - s - 1) % n].add_(buf)
    for s in range(n - 1):
        reqs = [dist.isend(chunks[(rank + 1 - s) % n], (rank + 1) % n), dist.irecv(chunks[(rank - s) % n], (rank - 1) % n)]
        for r in reqs:
            r.wait()
    tensor.copy_(work[:tensor.numel()])
    return tensor
'''

# name: (source, the message the check must give)
WRONG = {
    "naive": (source_of(naive_through_rank_0), "neighbour"),
    "all_reduce": (source_of(calls_all_reduce), "dist.all_reduce"),
    "remainder": (source_of(ring_ignoring_remainder), "divisible"),
    "whole": (source_of(whole_tensor_round_the_ring), "chunks"),
    "torch_chunk": (ring(**{"torch.tensor_split(work, n)": "torch.chunk(work, n)"}), "fewer than N chunks"),
    "float32_buffer": (ring(**{"torch.empty_like(recv)": "torch.empty(recv.numel())"}), "tensor's dtype"),
    "zeros_buffer": (ring(**{"torch.empty_like(recv)": "torch.zeros(len(recv))"}), "tensor's dtype"),
    "float32_detour": (ring(**{"work = tensor.contiguous()": "work = tensor.float()",
                               "tensor.copy_(work)": "tensor.copy_(work.to(tensor.dtype))"}), "tensor's dtype"),
    "contiguous_only": (ring(**{"work = tensor.contiguous()": "work = tensor",
                                "    tensor.copy_(work)\n": ""}), "strided view"),
    "new_tensor": (ring(**{"work = tensor.contiguous()": "work = tensor.clone()",
                           "    tensor.copy_(work)\n    return tensor": "    return work"}), "in place"),
    "two_ranks_only": (ring(**{"for s in range(n - 1):": "for s in range(1):"}), "differs"),
}


def _solution_source() -> str:
    import nbformat
    nb = nbformat.read(str(NB), as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and "def ring_all_reduce" in c.source)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ring_check_passes_correct_answers_and_rejects_wrong_ones():
    from course_lib.checks.nb05 import ring_cases
    from course_lib.distributed.launch import launch
    from many_answers import cases_many, function_name, judge_or_raise

    correct = {"solution": _solution_source(), "padded": PADDED}
    for n in WORLD_SIZES:
        answers = dict(correct, **({"stub": source_of(stub), **{k: src for k, (src, _) in WRONG.items()}}
                                   if n == 3 else {}))
        runs = launch(cases_many, n, ring_cases, [(src, function_name(src)) for src in answers.values()],
                      timeout=240)
        for i, key in enumerate(answers):
            per_rank = [rank_runs[i] for rank_runs in runs]
            if key == "stub":     # run_on_ranks turns this into NotImplementedError("... is still the stub")
                assert all(r.startswith("NotImplementedError") for r in per_rank), per_rank
            elif key in correct:
                judge_or_raise(judge_ring, n, per_rank)
            else:
                with pytest.raises(AssertionError, match=WRONG[key][1]):
                    judge_or_raise(judge_ring, n, per_rank)


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
