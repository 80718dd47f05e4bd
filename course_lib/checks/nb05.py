"""Checks for exercise notebook 05 (collectives): a ring all-reduce from send/recv, and its traffic."""
from __future__ import annotations

import operator

import torch

from . import answer_source, calls_method, expect, passed, run_on_ranks
from ..distributed.collectives import count_traffic
from ..distributed.ring import ring_schedule
from ..env import rank_device
from ..grading.student import compile_source
from ..models import max_diff

WORLD_SIZES = (3, 4, 1, 2)  # 3 first: on 2 ranks a naive all-reduce sends the same bytes as a ring
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10, torch.int64: 0}   # bfloat16: relative, see _tolerance
LIBRARY = ("collectives", "all_reduce_ring", "all_reduce_naive", "all_reduce_tree")   # course_lib's own answers


def _cases(n: int) -> list:
    """(numel, dtype, contiguous) per case: sizes divisible by n, with remainders 1 and n-1, n+1 (torch.chunk
    makes fewer than n chunks of it), smaller than n, one element; other dtypes; a strided view."""
    f32 = torch.float32
    sizes = dict.fromkeys([5 * n, 5 * n + 1, 8 * n - 1, 1000 + n, n + 1] + ([n - 1] if n > 1 else []) + [1])
    return ([(s, f32, True) for s in sizes]
            + [(7 * n + 1, torch.float64, True), (3 * n + 2, torch.bfloat16, True), (2 * n + 1, torch.int64, True),
               (4 * n + 3, f32, False)])


def _memory(rank: int, numel: int, dtype=torch.float32, contiguous: bool = True) -> torch.Tensor:
    """The memory a case's tensor is a view of: one element more on each side (contiguous), or every other
    element (x[1::2]); what is outside the view must stay as it is, what is inside must end up the sum."""
    g = torch.Generator().manual_seed(17 * rank + numel)
    size = numel + 2 if contiguous else 2 * numel + 1
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, (size,), generator=g)
    return torch.randn(size, generator=g, dtype=torch.float64).to(dtype)


def _view(memory: torch.Tensor, numel: int, contiguous: bool) -> torch.Tensor:
    return memory[1:numel + 1] if contiguous else memory[1::2]


def _input(rank: int, numel: int, dtype=torch.float32, contiguous: bool = True) -> torch.Tensor:
    return _view(_memory(rank, numel, dtype, contiguous), numel, contiguous).clone()


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


def _as_numpy(t: torch.Tensor):
    """A numpy copy: a tensor would travel through shared memory that vanishes when the worker exits."""
    return t.detach().cpu().to(torch.float64 if t.is_floating_point() else t.dtype).numpy().copy()


def ring_cases(rank: int, world_size: int, source: str, name: str) -> list:
    """Worker: run the learner's all-reduce on each case; return what it did (the tensor object, the memory it
    was a view of, the returned value, traffic). The sums are checked by the caller, from the inputs it can make
    itself, not here beside the learner's code."""
    import torch.distributed as dist
    fn = compile_source(source, name)
    dev = rank_device()
    out = []
    for numel, dtype, contiguous in _cases(world_size):
        memory = _memory(rank, numel, dtype, contiguous).to(dev)
        x = _view(memory, numel, contiguous)
        saved = _guard(dtype)
        try:
            with count_traffic() as t:
                returned = fn(x)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - say which case, and what the answer did there
            hint = (" torch.chunk makes fewer than N chunks when N does not divide the size (5 elements on 4 "
                    "ranks: 3 chunks); torch.tensor_split(tensor, N) always makes N."
                    if isinstance(exc, IndexError) and calls_method(source, "chunk") else "")
            raise RuntimeError(f"{numel} elements of {str(dtype)[6:]}"
                               f"{'' if contiguous else ' (a strided view)'} on {world_size} ranks: "
                               f"{type(exc).__name__}: {exc}.{hint}") from None
        finally:
            for key, original in saved.items():
                setattr(dist, key, original)
        out.append({"numel": numel, "dtype": str(dtype), "contiguous": contiguous, "out_dtype": str(x.dtype),
                    "tensor": _as_numpy(x), "memory": _as_numpy(memory),
                    "returned": _as_numpy(returned) if isinstance(returned, torch.Tensor) else None,
                    "returned_type": type(returned).__name__,
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


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return a.shape == b.shape and max_diff(a.double(), b.double()) <= tol


def _coefficients(got: torch.Tensor, inputs: list, tol: float) -> list:
    """Per element of `got`: the coefficients (0 to 3 per rank) of the sum of the ranks' inputs it equals
    (the first such sum), or None where it is no such sum."""
    n = len(inputs)
    stacked = torch.stack([i.double() for i in inputs])                                      # [n, k]
    combos = torch.cartesian_prod(*[torch.arange(4, dtype=torch.float64)] * n).reshape(-1, n)  # [4^n, n]
    match = ((combos @ stacked) - got.double()).abs() <= max(tol, 1e-9)                     # [4^n, k]
    return [tuple(int(c) for c in combos[m.nonzero()[0, 0]]) if m.any() else None for m in match.T]


def _holds(key, rank: int, n: int) -> tuple:
    """(what elements with these coefficients hold, how the ring gets them right)."""
    if key is None:
        return ("values that are no sum of the ranks' inputs", "Is each received chunk added or copied where it "
                "belongs, and every buffer filled before it is read?")
    if key == tuple(int(r == rank) for r in range(n)):
        return ("this rank's own values (never reduced)", "Every chunk must travel the whole ring: N-1 "
                "reduce-scatter steps, then N-1 all-gather steps.")
    if max(key) > 1:
        return (f"a sum in which rank(s) {[r for r, c in enumerate(key) if c > 1]}'s values count more than once",
                "Each reduce-scatter step adds the received chunk once; the all-gather steps copy the complete "
                "chunks (into the chunk), they do not add.")
    if not any(key):
        return "0 (never written)", "Every element must receive its sum."
    ranks = [r for r, c in enumerate(key) if c]
    return (f"rank {ranks[0]}'s values only" if len(ranks) == 1 else f"the sum of only ranks {ranks}",
            "The N-1 reduce-scatter steps add every rank's values into one chunk per rank; the N-1 all-gather steps "
            "then pass each complete chunk on, into the tensor itself.")


def _place(elements: list, numel: int, n: int) -> str:
    """Where `elements` are: past the last multiple of N, or in which tensor_split chunks."""
    whole = numel - numel % n
    if numel % n and elements[0] >= whole:
        return f"element(s) {elements} (past {whole} = N x {numel // n}: N does not divide the size)"
    mine = set(elements)
    chunks = [c for c, idx in enumerate(torch.tensor_split(torch.arange(numel), n)) if mine & set(idx.tolist())]
    return f"{len(elements)} element(s) in chunk(s) {chunks} of torch.tensor_split(tensor, {n})"


def _diagnosis(values: torch.Tensor, inputs: list, rank: int, tol: float, wrong: torch.Tensor) -> str:
    """What the wrong elements hold and where, grouped by what they hold; then how the ring gets each right."""
    n, bad = len(inputs), wrong.nonzero().flatten().tolist()
    keys = _coefficients(values[wrong], [i[wrong] for i in inputs], tol)
    groups = {}
    for element, key in zip(bad, keys):
        groups.setdefault(key, []).append(element)
    found = [(_place(elements, len(values), n), *_holds(key, rank, n)) for key, elements in groups.items()]
    return ("; ".join(f"{place} hold {what}" for place, what, _ in found) + ". "
            + " ".join(dict.fromkeys(hint for _, _, hint in found)))


def judge_case(n: int, rank: int, case: dict) -> None:
    """AssertionError naming what is wrong in one case of `ring_cases` on `rank` of `n`."""
    dtypes = {str(d): d for d in (torch.float32, torch.float64, torch.bfloat16, torch.int64)}
    numel, dtype, contiguous = case["numel"], dtypes[case["dtype"]], case["contiguous"]
    where = (f"on {n} ranks, {numel} elements of {case['dtype'][6:]}"
             f"{'' if contiguous else ' (a strided view x[::2])'}, rank {rank}")
    used = sorted(case["collectives"])
    expect(not used, f"{where}: you called dist.{', dist.'.join(used)}; build the all-reduce from "
                     "dist.send/recv/isend/irecv only")
    expect(case["out_dtype"] == case["dtype"], f"{where}: the tensor became {case['out_dtype']}; keep "
           "the tensor's dtype")
    _judge_sum(n, rank, case, dtype, where)
    expect(case["returned"] is not None, f"{where}: ring_all_reduce returned {case['returned_type']}; return the "
           "tensor (as the exercise asks)")
    _judge_traffic(n, rank, case, dtype, where)


def _judge_sum(n: int, rank: int, case: dict, dtype, where: str) -> None:
    """The sum is in the tensor's memory, nothing around it changed; else what the answer did instead."""
    numel, contiguous = case["numel"], case["contiguous"]
    inputs = [_input(r, numel, dtype, contiguous) for r in range(n)]
    expected = sum(i.to(torch.float64 if dtype.is_floating_point else dtype) for i in inputs)
    tol = _tolerance(dtype, expected, n)
    got, memory = (torch.as_tensor(case[k]) for k in ("tensor", "memory"))
    returned = torch.as_tensor(case["returned"]) if case["returned"] is not None else None
    outside = torch.ones(len(memory), dtype=torch.bool)
    _view(outside, numel, contiguous).fill_(False)
    expect(torch.equal(memory[outside].double(), _memory(rank, numel, dtype, contiguous)[outside].double()),
           f"{where}: elements outside the tensor changed (it is a view of a larger tensor, as DDP's gradient "
           "buckets are): write only into the tensor's own elements")
    in_memory = _view(memory, numel, contiguous)
    if _close(in_memory, expected, tol):
        return
    error = max_diff(in_memory.double(), expected.double())
    unchanged = torch.equal(in_memory.double(), inputs[rank].double())
    expect(not _close(got, expected, tol),
           f"{where}: the tensor object holds the sum, but its memory does not: it was rebound to new memory "
           "(tensor.data = ..., tensor.set_(...)), and every other view of that memory still sees the old "
           "values. Write into the tensor (tensor.copy_(result), chunk += buf), as dist.all_reduce does.")
    expect(returned is None or not _close(returned, expected, tol),
           f"{where}: the returned value is right, but the tensor itself "
           + ("was not changed: work in place (write into the chunks, views of the tensor: chunk += buf, "
              "dist.recv(chunk, ...)), as dist.all_reduce does." if unchanged else
              f"differs from the sum by {error:.3g}: write the result into the tensor (in place)."))
    expect(not _close(in_memory * n, expected, tol),
           f"{where}: the tensor holds the MEAN over the ranks; all-reduce's default op is SUM (DDP divides "
           "by the world size itself, afterwards)")
    wrong = (in_memory.double() - expected.double()).abs() > tol
    raise AssertionError(f"{where}: the tensor differs from dist.all_reduce's sum by {error:.3g}: "
                         + _diagnosis(in_memory, inputs, rank, tol, wrong))


def _judge_traffic(n: int, rank: int, case: dict, dtype, where: str) -> None:
    """A ring: messages only to one neighbour, 2(N-1) chunks of about size/N."""
    numel, peers = case["numel"], {dst for (_, dst) in case["bytes_sent"]}
    through_0 = peers == ({0} if rank else set(range(1, n)))
    expect(peers <= {(rank + 1) % n} or peers <= {(rank - 1) % n},
           f"{where}: rank {rank} sent to ranks {sorted(peers)}; in a ring each rank sends only to its neighbour "
           f"{(rank + 1) % n}" + (" (this is the naive all-reduce, everything through rank 0)" if through_0 else ""))
    sent = sum(case["bytes_sent"].values())
    limit = 2 * (n - 1) * -(-numel // n) * torch.empty(0, dtype=dtype).element_size()
    expect(sent <= limit and (sent > 0 or n == 1 or numel < n),
           f"{where}: rank {rank} sent {sent} bytes; a ring sends 2(N-1) chunks of about size/N, at "
           f"most {limit} bytes here. Cut the tensor into N chunks and send one chunk per step.")


def check_ring_all_reduce(fn) -> None:
    """fn(tensor) sums a 1-D tensor over all ranks in place, as a ring, with send/recv only."""
    used = [name for name in LIBRARY if calls_method(answer_source(fn), name)]
    expect(not used, f"ring_all_reduce uses course_lib's {used[0] if used else ''}: the course's collectives do "
           "the whole exercise; build the ring from dist.send/recv/isend/irecv")
    for n in WORLD_SIZES:
        judge_ring(n, _run(fn, n))
    passed("check_ring_all_reduce")


def _expected_bytes(algorithm: str, numel: int, world_size: int, element_size: int) -> list:
    if algorithm == "naive":
        return [(world_size - 1) * numel * element_size] + [numel * element_size] * (world_size - 1)
    sizes = _sizes(numel, world_size)
    sent = [0] * world_size
    for transfers in ring_schedule(world_size):
        for src, _, chunk, _ in transfers:
            sent[src] += sizes[chunk] * element_size
    return sent


BYTES_CASES = [("naive", 10, 2, 4), ("naive", 1000, 4, 4), ("ring", 12, 3, 4), ("ring", 1000, 4, 4),
               ("ring", 1001, 4, 2), ("ring", 10, 3, 8), ("ring", 7, 1, 4), ("naive", 7, 1, 4), ("ring", 2, 4, 4),
               ("naive", 3, 5, 1), ("ring", 1, 3, 4), ("ring", 10**6 + 1, 7, 2), ("ring", 10, 2, 4),
               ("ring", 13, 5, None), ("naive", 6, 3, None)]   # None: the default element_size (4)


def _sizes(numel: int, n: int) -> list:
    return [c.numel() for c in torch.tensor_split(torch.empty(numel), n)]


# What learners count instead, per algorithm: (bytes per rank the mistake gives, what it is). Named only when it
# gives the answer's list on EVERY case of that algorithm (the cases separate them).
BYTES_MISTAKES = {
    "ring": [
        (lambda numel, n, es: [2 * (n - 1) * -(-numel // n) * es] * n, "every chunk counted as ceil(size/N) "
         "elements; tensor_split's chunks differ by one when N does not divide the size"),
        (lambda numel, n, es: [2 * (n - 1) * (numel // n) * es] * n, "every chunk counted as floor(size/N) "
         "elements; tensor_split's first size % N chunks hold one more"),
        (lambda numel, n, es: [int(2 * (n - 1) / n * numel * es)] * n, "2(N-1)/N x the tensor for every rank: "
         "only the average; count the chunks each rank sends"),
        (lambda numel, n, es: _expected_bytes("ring", numel, n, 4), "element_size is ignored (4 bytes each)"),
        (lambda numel, n, es: _expected_bytes("ring", numel, n, es)[-1:] + _expected_bytes("ring", numel, n, es)[:-1],
         "what each rank RECEIVES (from its left neighbour), not what it sends"),
        (lambda numel, n, es: [(numel - _sizes(numel, n)[(r + 1) % n]) * es if n > 1 else 0 for r in range(n)],
         "only the reduce-scatter; the all-gather sends N-1 chunks again"),
    ],
    "naive": [
        (lambda numel, n, es: [0] + [numel * es] * (n - 1), "rank 0 sends nothing: it sends the sum back to "
         "each of the N-1 others"),
        (lambda numel, n, es: [n * numel * es] + [numel * es] * (n - 1), "rank 0 sends the sum to all N ranks; "
         "it sends to the N-1 others (its own copy needs no message)"),
        (lambda numel, n, es: _expected_bytes("naive", numel, n, 4), "element_size is ignored (4 bytes each)"),
    ],
}


def _bytes_mistake(algorithm: str, answers: list) -> str:
    """The mistake that gives the answer's list on every case of `algorithm`; `answers`: (case, list)."""
    mine = [(numel, n, 4 if es is None else es, got) for (a, numel, n, es), got in answers if a == algorithm]
    return next((why for formula, why in BYTES_MISTAKES[algorithm]
                 if all(formula(numel, n, es) == list(got) for numel, n, es, got in mine)), "")


def check_bytes_sent_per_rank(fn) -> None:
    """fn(algorithm, numel, world_size, element_size=4) -> list of bytes each rank sends in one all-reduce."""
    answers = []
    for case in BYTES_CASES:
        algorithm, numel, n, es = case
        got = fn(algorithm, numel, n) if es is None else fn(algorithm, numel, n, es)
        where = f"{algorithm}, {numel} elements of {4 if es is None else es} bytes on {n} ranks"
        expect(isinstance(got, (list, tuple)) and len(got) == n,
               f"{where}: return a list with one int per rank; got {got!r}")
        for r, b in enumerate(got):
            try:
                operator.index(b)
            except TypeError:
                raise AssertionError(f"{where}: rank {r}'s count {b!r} is a {type(b).__name__}; bytes are exact "
                                     "integers: return ints") from None
        answers.append((case, [int(b) for b in got]))
    for (algorithm, numel, n, es), got in answers:
        expected = _expected_bytes(algorithm, numel, n, 4 if es is None else es)
        if got != expected:
            wrong = [r for r in range(n) if got[r] != expected[r]]
            mistake = _bytes_mistake(algorithm, answers)
            raise AssertionError(
                f"{algorithm}, {numel} elements of {4 if es is None else es} bytes on {n} ranks"
                f"{' (element_size left at its default)' if es is None else ''}: expected {expected}, got {got} "
                f"(rank(s) {wrong} differ). " + (f"Your counts are {mistake}." if mistake else
                                                 "Rank 0 receives from everyone and sends the sum back to each of "
                                                 "the N-1 others." if algorithm == "naive" else
                                                 "Each rank sends 2(N-1) chunks of tensor_split(tensor, N) (their "
                                                 "sizes differ by one when N does not divide the size): count "
                                                 "which chunks a rank sends, see ring_schedule."))
    passed("check_bytes_sent_per_rank")
