"""Checks for exercise notebook 05 (collectives): a ring all-reduce from send/recv, and its traffic."""
from __future__ import annotations

import torch


from . import expect, passed, run_on_ranks
from ..distributed.collectives import count_traffic
from ..distributed.ring import ring_schedule
from ..env import rank_device
from ..grading.student import compile_source
from ..models import max_diff

WORLD_SIZES = (3, 4, 1, 2)  # 3 first: on 2 ranks a naive all-reduce sends the same bytes as a ring
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10, torch.int64: 0}   # bfloat16: relative, see _tolerance


def _cases(n: int) -> list:
    """(numel, dtype, contiguous) per case: sizes divisible by n, with remainders 1 and n-1, n+1 (torch.chunk
    makes fewer than n chunks of it), smaller than n; other dtypes; a strided view."""
    f32 = torch.float32
    sizes = [5 * n, 5 * n + 1, 8 * n - 1, 1000 + n, n + 1] + ([n - 1] if n > 1 else [])
    return ([(s, f32, True) for s in sizes]
            + [(7 * n + 1, torch.float64, True), (3 * n + 2, torch.bfloat16, True), (2 * n + 1, torch.int64, True),
               (4 * n + 3, f32, False)])


def _input(rank: int, numel: int, dtype=torch.float32, contiguous: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(17 * rank + numel)
    if dtype == torch.int64:
        base = torch.randint(-1000, 1000, (2 * numel,), generator=g)
    else:
        base = torch.randn(2 * numel, generator=g, dtype=torch.float64).to(dtype)
    return base[::2] if not contiguous else base[:numel].clone()


def _guard(dtype):
    """Wrap dist.send/recv/isend/irecv: a buffer of another dtype than the tensor's would make gloo abort the
    process (message size mismatch) with no message; say what is wrong instead."""
    import torch.distributed as dist
    saved = {name: getattr(dist, name) for name in ("send", "recv", "isend", "irecv")}

    def wrap(name, original):
        def wrapper(tensor, *args, **kwargs):
            if tensor.dtype != dtype:
                raise TypeError(f"dist.{name} of a {tensor.dtype} tensor while all-reducing a {dtype} tensor: "
                                "every buffer must have the tensor's dtype (torch.empty_like(chunk), not "
                                "torch.empty(size), which is always float32)")
            if not tensor.is_contiguous():
                raise TypeError(f"dist.{name} needs contiguous memory, and the input tensor here is a strided view "
                                "(x[::2]): all-reduce a contiguous copy (tensor.contiguous()) and copy the result "
                                "back into the tensor (tensor.copy_(...)), as dist.all_reduce does")
            return original(tensor, *args, **kwargs)
        return wrapper
    for name, original in saved.items():
        setattr(dist, name, wrap(name, original))
    return saved


def ring_cases(rank: int, world_size: int, source: str, name: str) -> list:
    """Worker: run the learner's all-reduce on each case; return what it did (the tensor, traffic).
    The sums are checked by the caller, from the inputs it can make itself, not here beside the learner's code."""
    import torch.distributed as dist
    fn = compile_source(source, name)
    dev = rank_device()
    out = []
    for numel, dtype, contiguous in _cases(world_size):
        x = _input(rank, numel, dtype, contiguous).to(dev)
        saved = _guard(dtype)
        try:
            with count_traffic() as t:
                returned = fn(x)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - say which case, and what usually causes it
            hint = (" torch.chunk makes fewer than N chunks when N does not divide the size (5 elements on 4 "
                    "ranks: 3 chunks); torch.tensor_split(tensor, N) always makes N." if isinstance(exc, IndexError)
                    else "")
            raise RuntimeError(f"{numel} elements of {str(dtype)[6:]}"
                               f"{'' if contiguous else ' (a strided view)'} on {world_size} ranks: "
                               f"{type(exc).__name__}: {exc}.{hint}") from None
        finally:
            for key, original in saved.items():
                setattr(dist, key, original)
        # numpy copies: a tensor would travel through shared memory that vanishes when the worker exits
        as_numpy = (lambda t: t.detach().cpu().to(torch.float64 if t.is_floating_point() else t.dtype).numpy().copy())
        out.append({"numel": numel, "dtype": str(dtype), "contiguous": contiguous, "out_dtype": str(x.dtype),
                    "tensor": as_numpy(x),
                    "returned": as_numpy(returned) if isinstance(returned, torch.Tensor) else None,
                    "bytes_sent": dict(t.bytes_sent), "collectives": dict(t.collective_calls)})
        judge_case(world_size, rank, out[-1])   # now, before a later case hides the first mistake (the caller
    return out                                  # judges all cases again, outside the learner's process)


def _run(fn, world_size: int) -> list:
    return run_on_ranks(ring_cases, world_size, fn, "some rank waits for a message nobody sends (or all ranks "
                        "block in send at once: post isend before recv)")


def _tolerance(dtype, expected: torch.Tensor, n: int) -> float:
    if dtype == torch.bfloat16:       # every addition rounds to 8 significant bits
        return 2.0 ** -7 * n * max(1.0, expected.abs().max().item())
    return TOLERANCE[dtype]


def judge_ring(n: int, results: list) -> None:
    """AssertionError naming the first mistake in `ring_cases`' results on `n` ranks (one list per rank)."""
    for rank, cases in enumerate(results):
        for case in cases:
            judge_case(n, rank, case)


def judge_case(n: int, rank: int, case: dict) -> None:
    """AssertionError naming what is wrong in one case of `ring_cases` on `rank` of `n`."""
    dtypes = {str(d): d for d in (torch.float32, torch.float64, torch.bfloat16, torch.int64)}
    numel, dtype = case["numel"], dtypes[case["dtype"]]
    where = (f"on {n} ranks, {numel} elements of {case['dtype'][6:]}"
             f"{'' if case['contiguous'] else ' (a strided view x[::2])'}, rank {rank}")
    used = sorted(case["collectives"])
    expect(not used, f"{where}: you called dist.{', dist.'.join(used)}; build the all-reduce from "
                     "dist.send/recv/isend/irecv only")
    expect(case["out_dtype"] == case["dtype"], f"{where}: the tensor became {case['out_dtype']}; keep "
           "the tensor's dtype")
    inputs = [_input(r, numel, dtype, case["contiguous"]) for r in range(n)]
    expected = sum(i.to(torch.float64 if dtype.is_floating_point else dtype) for i in inputs)
    got, returned = (torch.as_tensor(case[k]) if case[k] is not None else None for k in ("tensor", "returned"))
    tol = _tolerance(dtype, expected, n)
    error = max_diff(got.double(), expected.double()) if got.shape == expected.shape else float("inf")
    returned_ok = isinstance(returned, torch.Tensor) and returned.shape == expected.shape and \
        max_diff(returned.double(), expected.double()) <= tol
    unchanged = got.shape == inputs[rank].shape and torch.equal(got.double(), inputs[rank].double())
    expect(error <= tol,
           f"{where}: the tensor differs from dist.all_reduce's sum by {error:.3g}. "
           + ("The returned value is right, but the tensor itself was not changed: work in place (write "
              "into the chunks, views of the tensor: chunk += buf, dist.recv(chunk, ...)), as "
              "dist.all_reduce does." if returned_ok and unchanged else
              "The returned value is right: write it into the tensor itself (in place)." if returned_ok else
              "Is every element covered when the size is not divisible by the world size? "
              "torch.tensor_split makes N chunks of any size." if numel % n else
              "Work in place (tensor.copy_ / +=) and check which chunk you send at each step."))
    expect(returned is not None, f"{where}: return the tensor (as the exercise asks), not None")
    peers = {dst for (_, dst) in case["bytes_sent"]}
    expect(peers <= {(rank + 1) % n} or peers <= {(rank - 1) % n},
           f"{where}: rank {rank} sent to ranks {sorted(peers)}; in a ring each rank sends only to "
           f"its neighbour {(rank + 1) % n} (a naive all-reduce sends everything through rank 0)")
    sent = sum(case["bytes_sent"].values())
    limit = 2 * (n - 1) * -(-numel // n) * torch.empty(0, dtype=dtype).element_size()
    expect(sent <= limit and (sent > 0 or n == 1 or numel < n),
           f"{where}: rank {rank} sent {sent} bytes; a ring sends 2(N-1) chunks of about size/N, at "
           f"most {limit} bytes here. Cut the tensor into N chunks and send one chunk per step.")


def check_ring_all_reduce(fn) -> None:
    """fn(tensor) sums a 1-D tensor over all ranks in place, as a ring, with send/recv only."""
    for n in WORLD_SIZES:
        judge_ring(n, _run(fn, n))
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
