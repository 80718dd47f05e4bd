"""Checks for exercise notebook 05 (collectives): a ring all-reduce from send/recv, and its traffic."""
from __future__ import annotations

import torch


from . import expect, passed, run_on_ranks
from ..distributed.collectives import count_traffic
from ..distributed.ring import ring_schedule
from ..env import rank_device
from ..grading.student import compile_source
from ..models import max_diff

WORLD_SIZES = (3, 2, 4)  # 3 first: on 2 ranks a naive all-reduce sends the same bytes as a ring


def _sizes(n: int) -> tuple:
    return (5 * n, 5 * n + 1, 7 * n + n - 1, 1000 + n)  # divisible, and remainders 1 and n-1


def _input(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(17 * rank + numel))


def ring_cases(rank: int, world_size: int, source: str, name: str) -> list:
    """Worker: run the learner's all-reduce on each size; return what it did (the tensor, traffic).
    The sums are checked by the caller, from the inputs it can make itself, not here beside the learner's code."""
    fn = compile_source(source, name)
    dev = rank_device()
    out = []
    for numel in _sizes(world_size):
        x = _input(rank, numel).to(dev)
        with count_traffic() as t:
            returned = fn(x)
        # numpy copies: a tensor would travel through shared memory that vanishes when the worker exits
        out.append({"numel": numel, "tensor": x.detach().cpu().numpy().copy(),
                    "returned": returned.detach().cpu().numpy().copy() if isinstance(returned, torch.Tensor) else None,
                    "bytes_sent": dict(t.bytes_sent), "collectives": dict(t.collective_calls)})
    return out


def _run(fn, world_size: int) -> list:
    return run_on_ranks(ring_cases, world_size, fn, "some rank waits for a message nobody sends (or all ranks "
                        "block in send at once: post isend before recv)")


def check_ring_all_reduce(fn) -> None:
    """fn(tensor) sums a 1-D float tensor over all ranks in place, as a ring, with send/recv only."""
    for n in WORLD_SIZES:
        for rank, cases in enumerate(_run(fn, n)):
            for case in cases:
                numel, where = case["numel"], f"on {n} ranks, {case['numel']} elements, rank {rank}"
                expected = sum(_input(r, numel) for r in range(n))
                got, returned = (torch.as_tensor(case[k]) if case[k] is not None else None for k in ("tensor", "returned"))
                error = max_diff(got, expected) if isinstance(got, torch.Tensor) and got.shape == expected.shape \
                    else float("inf")
                returned_ok = isinstance(returned, torch.Tensor) and returned.shape == expected.shape and \
                    torch.allclose(returned, expected, atol=1e-5)
                used = sorted(case["collectives"])
                expect(not used, f"{where}: you called dist.{', dist.'.join(used)}; build the all-reduce from "
                                 "dist.send/recv/isend/irecv only")
                expect(error < 1e-4,
                       f"{where}: the tensor differs from dist.all_reduce's sum by {error:.3g}. "
                       + ("Is every element covered when the size is not divisible by the world size? "
                          "torch.tensor_split makes N chunks of any size." if numel % n else
                          "Work in place (tensor.copy_ / +=) and check which chunk you send at each step.")
                       + (" The returned value is right: write it into the tensor itself (in place)."
                          if returned_ok else ""))
                peers = {dst for (_, dst) in case["bytes_sent"]}
                expect(peers <= {(rank + 1) % n} or peers <= {(rank - 1) % n},
                       f"{where}: rank {rank} sent to ranks {sorted(peers)}; in a ring each rank sends only to "
                       f"its neighbour {(rank + 1) % n} (a naive all-reduce sends everything through rank 0)")
                sent, limit = sum(case["bytes_sent"].values()), 2 * (n - 1) * -(-numel // n) * 4
                expect(0 < sent <= limit,
                       f"{where}: rank {rank} sent {sent} bytes; a ring sends 2(N-1) chunks of about size/N, at "
                       f"most {limit} bytes here. Cut the tensor into N chunks and send one chunk per step.")
    passed("check_ring_all_reduce")


def _expected_bytes(algorithm: str, numel: int, world_size: int, element_size: int) -> list:
    if algorithm == "naive":
        return [(world_size - 1) * numel * element_size] + [numel * element_size] * (world_size - 1)
    sizes = [c.numel() for c in torch.tensor_split(torch.empty(numel), world_size)]
    sent = [0] * world_size
    for transfers in ring_schedule(world_size):
        for src, _, chunk, _ in transfers:
            sent[src] += sizes[chunk] * element_size
    return sent


def check_bytes_sent_per_rank(fn) -> None:
    """fn(algorithm, numel, world_size, element_size) -> list of bytes each rank sends in one all-reduce."""
    for algorithm, numel, n, es in [("naive", 10, 2, 4), ("naive", 1000, 4, 4), ("ring", 12, 3, 4),
                                    ("ring", 1000, 4, 4), ("ring", 1001, 4, 2), ("ring", 10, 3, 8),
                                    ("ring", 7, 1, 4), ("naive", 7, 1, 4)]:
        expected = _expected_bytes(algorithm, numel, n, es)
        got = fn(algorithm, numel, n, es)
        expect(isinstance(got, (list, tuple)) and len(got) == n,
               f"{algorithm}, {numel} elements, {n} ranks: return a list with one int per rank; got {got!r}")
        expect([int(b) for b in got] == expected and all(float(b).is_integer() for b in got),
               f"{algorithm}, {numel} elements of {es} bytes on {n} ranks: expected {expected}, got {list(got)}. "
               + ("Rank 0 receives from everyone and sends the sum back to each of the N-1 others."
                  if algorithm == "naive" else
                  "Each rank sends 2(N-1) chunks of tensor_split(tensor, N) (sizes differ by one when N does "
                  "not divide the size; count which chunks a rank sends, see ring_schedule)."))
    passed("check_bytes_sent_per_rank")
