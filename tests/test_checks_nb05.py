"""The checks of exercise notebook 05 pass the reference solutions and fail stubs and wrong answers.

The ring answers run in one launch per world size (tests/many_answers.py): the reference and the other correct
answers on 1-4 ranks, the wrong ones on 3 ranks, where each is rejected.
"""
import inspect
import textwrap

import pytest
import torch  # noqa: F401 - the answers below run with torch and dist in their namespace
import torch.distributed as dist  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.checks.nb05 import WORLD_SIZES, check_bytes_sent_per_rank, check_ring_all_reduce, judge_ring
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

MIRRORED = ring(**{"right, left = (rank + 1) % n, (rank - 1) % n": "right, left = (rank - 1) % n, (rank + 1) % n",
                    "(rank - s) % n], chunks[(rank - s - 1) % n]": "(rank + s) % n], chunks[(rank + s + 1) % n]",
                    "chunks[(rank + 1 - s) % n], right": "chunks[(rank - 1 + s) % n], right",
                    "dist.recv(chunks[(rank - s) % n], left)": "dist.recv(chunks[(rank + s) % n], left)"})

ALL_GATHER_ADDS = ring(**{"        dist.recv(chunks[(rank - s) % n], left)\n        req.wait()\n":
                          "        mine = chunks[(rank - s) % n]\n        buf = torch.empty_like(mine)\n"
                          "        dist.recv(buf, left)\n        req.wait()\n        mine += buf\n"})

# name: (source, the message the check must give)
WRONG = {
    "naive": (source_of(naive_through_rank_0), "neighbour 1 \\(this is the naive all-reduce"),
    "all_reduce": (source_of(calls_all_reduce), "dist.all_reduce"),
    "remainder": (source_of(ring_ignoring_remainder), "N does not divide the size\\) hold this rank's own values"),
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
    "two_ranks_only": (ring(**{"for s in range(n - 1):": "for s in range(1):"}),
                       "chunk\\(s\\) \\[2\\] .* hold the sum of only ranks \\[0, 2\\]"),
    "mean": (ring(**{"    tensor.copy_(work)\n": "    tensor.copy_(work / n if work.is_floating_point() else work)\n"}),
             "MEAN"),
    "rebinds": (ring(**{"work = tensor.contiguous()": "work = tensor.clone()",
                        "    tensor.copy_(work)\n": "    tensor.data = work\n"}), "rebound to new memory"),
    "all_gather_adds": (ALL_GATHER_ADDS, "count more than once.*copy the complete chunks"),
    "sum_not_kept": (ring(**{"recv += buf": "recv = recv + buf"}), "hold rank 2's values only"),
    "returns_chunks": (ring(**{"    return tensor": "    return list(chunks)"}), "returned list; return the tensor"),
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
        answers = dict(correct, **({"stub": source_of(stub), "mirrored": MIRRORED,
                                    **{k: src for k, (src, _) in WRONG.items()}} if n == 3 else {}))
        runs = launch(cases_many, n, ring_cases, [(src, function_name(src)) for src in answers.values()],
                      timeout=240)
        for i, key in enumerate(answers):
            per_rank = [rank_runs[i] for rank_runs in runs]
            if key == "stub":     # run_on_ranks turns this into NotImplementedError("... is still the stub")
                assert all(r.startswith("NotImplementedError") for r in per_rank), per_rank
            elif key in correct or key == "mirrored":
                judge_or_raise(judge_ring, n, per_rank)
            else:
                with pytest.raises(AssertionError, match=WRONG[key][1]):
                    judge_or_raise(judge_ring, n, per_rank)


def test_ring_answers_built_on_course_lib_collectives_fail_before_any_launch():
    def course_ring(tensor):
        from course_lib.distributed.collectives import all_reduce_ring
        return all_reduce_ring(tensor)

    def course_module(tensor):
        from course_lib.distributed import collectives as C
        return C.all_reduce(tensor, algorithm="ring")
    for answer, name in ((course_ring, "collectives"), (course_module, "collectives")):
        with pytest.raises(AssertionError, match=f"uses course_lib's {name}: the course's collectives do the whole"):
            check_ring_all_reduce(answer)


@settings(max_examples=20)
@given(st.integers(1, 4), st.integers(1, 40), st.data())
def test_diagnosis_names_what_wrong_elements_hold(n, numel, data):
    """Elements made of a known sum of the ranks' inputs are described as that sum."""
    from course_lib.checks.nb05 import _diagnosis, _input
    rank = data.draw(st.integers(0, n - 1))
    inputs = [_input(r, numel, torch.float64) for r in range(n)]
    key = data.draw(st.tuples(*[st.integers(0, 3)] * n).filter(lambda k: k != (1,) * n))
    values = sum(c * i for c, i in zip(key, inputs))
    message = _diagnosis(values, inputs, rank, 1e-10, torch.ones(numel, dtype=torch.bool))
    ranks = [r for r, c in enumerate(key) if c]
    assert ("own values" if key == tuple(int(r == rank) for r in range(n)) else
            "count more than once" if max(key) > 1 else "never written" if not ranks else
            f"rank {ranks[0]}'s values only" if len(ranks) == 1 else f"only ranks {ranks}") in message


def test_bytes_reference_passes_and_wrong_answers_fail():
    check_bytes_sent_per_rank(NS["bytes_sent_per_rank"])
    with pytest.raises(NotImplementedError):
        check_bytes_sent_per_rank(lambda *a: (_ for _ in ()).throw(NotImplementedError()))


def _ring_or(naive_answer):
    """An answer: the reference's ring, and `naive_answer` for the naive algorithm."""
    def answer(algorithm, numel, n, es=4):
        if algorithm == "naive":
            return naive_answer(numel, n, es)
        return NS["bytes_sent_per_rank"](algorithm, numel, n, es)
    return answer


def _naive_or(ring_answer):
    def answer(algorithm, numel, n, es=4):
        if algorithm == "ring":
            return ring_answer(numel, n, es)
        return NS["bytes_sent_per_rank"](algorithm, numel, n, es)
    return answer


def _split(numel, n):
    return [len(c) for c in torch.tensor_split(torch.empty(numel), n)]


@pytest.mark.parametrize("wrong, message", [
    (_naive_or(lambda numel, n, es: [int(2 * (n - 1) / n * numel * es)] * n), "only the average"),
    (_naive_or(lambda numel, n, es: [2 * (n - 1) / n * numel * es] * n), "is a float; bytes are exact integers"),
    (_naive_or(lambda numel, n, es: [2 * (n - 1) * -(-numel // n) * es] * n), "ceil\\(size/N\\)"),
    (_naive_or(lambda numel, n, es: [2 * (n - 1) * (numel // n) * es] * n), "floor\\(size/N\\)"),
    (_naive_or(lambda numel, n, es: NS["bytes_sent_per_rank"]("ring", numel, n, 4)), "element_size is ignored"),
    (_naive_or(lambda numel, n, es: (lambda sent: sent[-1:] + sent[:-1])(
        NS["bytes_sent_per_rank"]("ring", numel, n, es))), "RECEIVES"),
    (_naive_or(lambda numel, n, es: [(numel - _split(numel, n)[(r + 1) % n]) * es if n > 1 else 0
                                     for r in range(n)]), "only the reduce-scatter"),
    (_naive_or(lambda numel, n, es: [2 * (numel - _split(numel, n)[r]) * es if n > 1 else 0 for r in range(n)]),
     "rank\\(s\\) \\[.*\\] differ.*count which chunks a rank sends"),
    (_ring_or(lambda numel, n, es: [0] + [numel * es] * (n - 1)), "rank 0 sends nothing"),
    (_ring_or(lambda numel, n, es: [n * numel * es] + [numel * es] * (n - 1)), "to all N ranks"),
    (_ring_or(lambda numel, n, es: [(n - 1) * numel * 4] + [numel * 4] * (n - 1)), "element_size is ignored"),
    (_ring_or(lambda numel, n, es: [(n - 1) * numel * es] * n), "sends the sum back to each of the N-1"),
    (lambda algorithm, numel, n, es=2: NS["bytes_sent_per_rank"](algorithm, numel, n, es),
     "element_size left at its default"),
    (lambda algorithm, numel, n, es=4: tuple(NS["bytes_sent_per_rank"](algorithm, numel, n, es))[:-1] or [0],
     "return a list with one int per rank"),
])
def test_wrong_bytes_answers_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_bytes_sent_per_rank(wrong)


def test_other_bytes_answers_pass():
    def closed_form(algorithm, numel, world_size, element_size=4):   # all chunks but two, per rank
        if algorithm == "naive":
            return [(world_size - 1) * numel * element_size] + [numel * element_size] * (world_size - 1)
        sizes = _split(numel, world_size)
        return [(2 * numel - sizes[(r + 1) % world_size] - sizes[(r + 2) % world_size]) * element_size
                for r in range(world_size)]

    def as_tuple_of_numpy_ints(algorithm, numel, world_size, element_size=4):
        import numpy as np
        return tuple(np.int64(b) for b in NS["bytes_sent_per_rank"](algorithm, numel, world_size, element_size))
    check_bytes_sent_per_rank(closed_form)
    check_bytes_sent_per_rank(as_tuple_of_numpy_ints)


@settings(max_examples=60)
@given(st.integers(0, 5000), st.integers(1, 9), st.sampled_from([1, 2, 4, 8]))
def test_bytes_solution_adds_up_the_ring_schedule(numel, n, es):
    """Every rank sends all chunks but two ((r+1) % N in the reduce-scatter, (r+2) % N in the all-gather); in all,
    2(N-1) x the tensor; naive: rank 0 sends N-1 copies, the others one each."""
    sizes = _split(numel, n)
    ring = NS["bytes_sent_per_rank"]("ring", numel, n, es)
    assert ring == [(2 * numel - sizes[(r + 1) % n] - sizes[(r + 2) % n]) * es for r in range(n)]
    assert sum(ring) == 2 * (n - 1) * numel * es and all(type(b) is int for b in ring)
    naive = NS["bytes_sent_per_rank"]("naive", numel, n, es)
    assert naive == [(n - 1) * numel * es] + [numel * es] * (n - 1)
