"""The lecture-14 checks pass the reference solutions, any optimal tie-break and other correct algorithms, and fail
stubs and plausible wrong answers with a message that names the mistake; property tests on drawn inputs."""
import heapq
import math

import pytest
import torch

from course_lib.checks import nb14
from course_lib.checks.nb14 import check_huffman_code_lengths, check_relative_indices
from course_lib.compression import huffman, storage
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "14_deep_compression_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_huffman_code_lengths(NS["huffman_code_lengths"])
    check_relative_indices(NS["relative_indices"])


@pytest.mark.parametrize("check", [check_huffman_code_lengths, check_relative_indices])
def test_stubs_fail(check):
    with pytest.raises(NotImplementedError):
        check(stub)


# --- huffman_code_lengths ------------------------------------------------------------------------

def test_other_optimal_codes_pass():
    check_huffman_code_lengths(huffman.code_lengths)                       # course_lib's tie-break

    def last_in_first_out_ties(frequencies):                             # breaks ties the other way
        heap = [(count, -i, [s]) for i, (s, count) in enumerate(frequencies.items())]
        heapq.heapify(heap)
        lengths, tie = dict.fromkeys(frequencies, 0), 0
        while len(heap) > 1:
            (ca, _, a), (cb, _, b) = heapq.heappop(heap), heapq.heappop(heap)
            for s in a + b:
                lengths[s] += 1
            tie -= 10**6
            heapq.heappush(heap, (ca + cb, tie, a + b))
        return lengths

    check_huffman_code_lengths(last_in_first_out_ties)


def fixed_length(frequencies):
    return {s: max(1, math.ceil(math.log2(len(frequencies)))) if len(frequencies) > 1 else 0 for s in frequencies}


def rounded_information(frequencies):
    total = sum(frequencies.values())
    return {s: max(1, round(-math.log2(f / total))) if len(frequencies) > 1 else 0 for s, f in frequencies.items()}


def shannon_fano(frequencies):
    lengths = dict.fromkeys(frequencies, 0)

    def split(symbols):
        if len(symbols) < 2:
            return
        total, running, best, cut = sum(frequencies[s] for s in symbols), 0, None, 1
        for i in range(1, len(symbols)):
            running += frequencies[symbols[i - 1]]
            if best is None or abs(total - 2 * running) < best:
                best, cut = abs(total - 2 * running), i
        for s in symbols:
            lengths[s] += 1
        split(symbols[:cut])
        split(symbols[cut:])

    split(sorted(frequencies, key=lambda s: -frequencies[s]))
    return lengths


def depth_from_one(frequencies):
    return {s: n + 1 for s, n in NS["huffman_code_lengths"](frequencies).items()}


def merges_the_largest(frequencies):
    heap = [(-count, i, [s]) for i, (s, count) in enumerate(frequencies.items())]
    heapq.heapify(heap)
    lengths, tie = dict.fromkeys(frequencies, 0), len(heap)
    while len(heap) > 1:
        (ca, _, a), (cb, _, b) = heapq.heappop(heap), heapq.heappop(heap)
        for s in a + b:
            lengths[s] += 1
        heapq.heappush(heap, (ca + cb, tie, a + b))
        tie += 1
    return lengths


def unary_by_rank(frequencies):
    ranked = sorted(frequencies, key=lambda s: -frequencies[s])
    if len(ranked) == 1:
        return {ranked[0]: 0}
    return {s: min(i + 1, len(ranked) - 1) for i, s in enumerate(ranked)}


def single_symbol_gets_one_bit(frequencies):
    return {s: 1 for s in frequencies} if len(frequencies) == 1 else NS["huffman_code_lengths"](frequencies)


def one_bit_short(frequencies):
    """Counts merges from the second one: every code one bit too short, so they cannot all be prefix-free."""
    return {s: max(0, n - 1) if len(frequencies) > 1 else 0 for s, n in NS["huffman_code_lengths"](frequencies).items()}


def deepest_one_short(frequencies):
    """Off by one at the bottom only: the two deepest codewords one bit shorter (they collide with a prefix)."""
    lengths = NS["huffman_code_lengths"](frequencies)
    if len(lengths) > 2:
        for s in sorted(lengths, key=lambda s: -lengths[s])[:2]:
            lengths[s] -= 1
    return lengths


def single_symbol_empty(frequencies):
    return {} if len(frequencies) == 1 else NS["huffman_code_lengths"](frequencies)


@pytest.mark.parametrize("wrong, message", [
    (fixed_length, "could be shorter"), (rounded_information, "2\\*\\*-length"), (shannon_fano, "optimal code needs"),
    (depth_from_one, "one bit too long"), (merges_the_largest, "longer codeword.*rarer.*least"),
    (unary_by_rank, "optimal code needs"),
    (single_symbol_gets_one_bit, "single symbol"), (one_bit_short, "at least 1 bit"),
    (deepest_one_short, "no prefix code"), (single_symbol_empty, "single symbol"),
])
def test_wrong_code_lengths_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_huffman_code_lengths(wrong)


def two_queues(frequencies):
    """Correct, without a heap: leaves sorted by count in one queue, merged nodes (already in order) in another."""
    from collections import deque
    leaves = deque(sorted(([c, [s]] for s, c in frequencies.items()), key=lambda node: node[0]))
    merged, lengths = deque(), dict.fromkeys(frequencies, 0)

    def pop():
        return merged.popleft() if not leaves or (merged and merged[0][0] < leaves[0][0]) else leaves.popleft()

    while len(leaves) + len(merged) > 1:
        a, b = pop(), pop()
        for s in a[1] + b[1]:
            lengths[s] += 1
        merged.append([a[0] + b[0], a[1] + b[1]])
    return lengths


def float_lengths(frequencies):
    return {s: float(n) for s, n in NS["huffman_code_lengths"](frequencies).items()}


@pytest.mark.parametrize("right", [two_queues, float_lengths])
def test_other_correct_answers_pass(right):
    check_huffman_code_lengths(right)


# --- relative_indices ----------------------------------------------------------------------------

def make(largest_of=lambda bits: 2**bits - 1, first=-1, gap=lambda p, prev: p - prev - 1, consume=lambda m: m + 1,
         count=True, fill=True, fill_at_largest=False):
    def relative_indices(positions, bits):
        largest = largest_of(bits)
        gaps, fillers, previous = [], 0, first
        for p in positions:
            zeros = gap(p, previous)
            while fill and (zeros > largest or (fill_at_largest and zeros == largest)):
                gaps.append(largest)
                fillers += 1
                zeros -= consume(largest)
            gaps.append(zeros)
            previous = p
        return gaps, fillers if count else 0
    return relative_indices


def via_storage(positions, bits):
    gaps, is_filler = storage.relative_indices(positions, bits)
    return gaps.tolist(), int(is_filler.sum())


def test_the_lectures_function_is_refused_but_its_stream_is_right():
    with pytest.raises(AssertionError, match="storage.relative_indices"):
        check_relative_indices(via_storage)
    for positions, bits in nb14._index_cases():
        nb14.judge_stream(positions, bits, via_storage(positions, bits), "course_lib")


@pytest.mark.parametrize("wrong, message", [
    (make(largest_of=lambda bits: 2**bits), "holds 0..7"),                 # accepts a gap of 2**bits (max + 1)
    (make(count=False), "count each one you insert"),                      # fillers inserted but not counted
    (make(fill=False), "needs a filler"),                                  # no fillers: gaps overflow
    (make(first=0), "counts the zeros from position 1"),                   # the first gap measured from 1
    (make(gap=lambda p, prev: p - prev), "distance pos - prev"),           # the difference of positions
    (make(consume=lambda m: m), "filler's own position"),                  # a filler that stands on no position
    (make(largest_of=lambda bits: 2**bits - 2), "takes the largest gap"),  # fillers one short of the largest gap
    (make(fill_at_largest=True), "fits in one gap"),                       # while zeros >= largest
], ids=["max+1", "uncounted", "no fillers", "first from 1", "distance", "filler off position", "short filler gap",
        ">="])
def test_wrong_relative_indices_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_relative_indices(wrong)


def test_a_non_tuple_answer_fails():
    with pytest.raises(AssertionError, match="tuple"):
        check_relative_indices(lambda positions, bits: [0] * len(positions))


def balanced_fillers(positions, bits):
    """Spreads a long run evenly over the fillers it needs: as many entries, but the fillers' gaps are not the
    largest (the decoder would still find the positions)."""
    largest, gaps, fillers, previous = 2**bits - 1, [], 0, -1
    for p in positions:
        zeros = p - previous - 1
        need = zeros // 2**bits
        for _ in range(need):
            step = (zeros - need) // (need + 1) if need else 0
            gaps.append(step)
            fillers += 1
            zeros -= step + 1
        gaps.append(zeros)
        previous = p
    return gaps, fillers


def sentinel_in_the_input(positions, bits):
    """Right stream, but puts a -1 sentinel at the front of the caller's list."""
    positions.insert(0, -1)
    gaps, fillers = [], 0
    for prev, p in zip(positions, positions[1:]):
        zeros = p - prev - 1
        while zeros > 2**bits - 1:
            gaps.append(2**bits - 1)
            fillers += 1
            zeros -= 2**bits
        gaps.append(zeros)
    return gaps, fillers


def filler_positions_not_count(positions, bits):
    gaps, fillers = NS["relative_indices"](positions, bits)
    return gaps, list(range(fillers))


def float_gaps(positions, bits):
    """Gaps as floats from a true division: 2.0 is a whole number of zeros, but a run split in halves is not."""
    gaps, fillers = NS["relative_indices"](positions, bits)
    return [g / 2 if g % 2 else float(g) for g in gaps], fillers


def test_too_many_fillers_are_counted_against_the_minimum():
    """Fillers one short of the largest gap (6 of 3 bits): 20 zeros take three of them instead of two."""
    with pytest.raises(AssertionError, match="3 fillers, but 2 are needed"):
        nb14.judge_stream([20], 3, ([6, 6, 6, 1], 3), "relative_indices([20], bits=3)")


@pytest.mark.parametrize("wrong, message", [
    (balanced_fillers, "takes the largest gap"), (sentinel_in_the_input, "changed the list"),
    (filler_positions_not_count, "fillers must be the number"), (float_gaps, "whole numbers"),
])
def test_more_wrong_relative_indices_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_relative_indices(wrong)


def vectorised_with_torch(positions, bits):
    """Correct, vectorised: each non-zero lands after its run's z // 2**bits fillers; tensors and a numpy count."""
    import numpy as np
    pos = torch.tensor(positions, dtype=torch.int64)
    zeros = torch.diff(pos, prepend=torch.tensor([-1])) - 1
    fill = zeros // 2**bits
    slot = (fill + 1).cumsum(0) - 1
    gaps = torch.full((int(slot[-1]) + 1 if len(pos) else 0,), 2**bits - 1)
    gaps[slot] = zeros - fill * 2**bits
    return gaps, np.int64(fill.sum())


def recursive(positions, bits, previous=-1):
    """Correct, recursive: one entry at a time, a filler being an entry at previous + 2**bits."""
    if not positions:
        return [], 0
    zeros = positions[0] - previous - 1
    if zeros > 2**bits - 1:
        gaps, fillers = recursive(positions, bits, previous + 2**bits)
        return [2**bits - 1] + gaps, fillers + 1
    gaps, fillers = recursive(positions[1:], bits, positions[0])
    return [zeros] + gaps, fillers


@pytest.mark.parametrize("right", [vectorised_with_torch, recursive])
def test_other_correct_relative_indices_pass(right):
    check_relative_indices(right)


# --- more wrong code lengths, each with the message that names it ------------------------------------------------

def count_symbol_heap(frequencies):
    """(count, symbol) entries and merged (count, tuple-of-symbols): equal counts compare a symbol with a tuple."""
    heap = [(c, s) for s, c in frequencies.items()]
    heapq.heapify(heap)
    lengths = dict.fromkeys(frequencies, 0)
    while len(heap) > 1:
        (ca, a), (cb, b) = heapq.heappop(heap), heapq.heappop(heap)
        a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
        for s in a + b:
            lengths[s] += 1
        heapq.heappush(heap, (ca + cb, a + b))
    return lengths


def sorted_symbols_first(frequencies):
    """Sorts the symbols to break ties the same way every run: symbols of different types do not sort."""
    return NS["huffman_code_lengths"]({s: frequencies[s] for s in sorted(frequencies)})


def merges_in_the_input(frequencies):
    """Uses the caller's dict as its work list: pops the two rarest keys and stores their merger in it."""
    groups = {s: [s] for s in frequencies}
    lengths = dict.fromkeys(frequencies, 0)
    n = len(frequencies)
    while len(frequencies) > 1:
        a, b = sorted(frequencies, key=lambda k: frequencies[k])[:2]
        merged = ("node", n)
        n += 1
        for s in groups[a] + groups[b]:
            lengths[s] += 1
        groups[merged] = groups.pop(a) + groups.pop(b)
        frequencies[merged] = frequencies.pop(a) + frequencies.pop(b)
    return lengths


def codewords(frequencies):
    """Builds the codewords and returns them instead of their lengths."""
    heap = [(c, i, {s: ""}) for i, (s, c) in enumerate(frequencies.items())]
    heapq.heapify(heap)
    tie = len(heap)
    while len(heap) > 1:
        (ca, _, a), (cb, _, b) = heapq.heappop(heap), heapq.heappop(heap)
        merged = {**{s: "0" + w for s, w in a.items()}, **{s: "1" + w for s, w in b.items()}}
        heapq.heappush(heap, (ca + cb, tie, merged))
        tie += 1
    return heap[0][2] if len(frequencies) > 1 else {s: 0 for s in frequencies}


def shannon_code(frequencies):
    total = sum(frequencies.values())
    return {s: math.ceil(-math.log2(f / total)) if len(frequencies) > 1 else 0 for s, f in frequencies.items()}


def lengths_reversed(frequencies):
    """Huffman's lengths, but handed out in the wrong order: the most frequent symbol gets the longest."""
    lengths = NS["huffman_code_lengths"](frequencies)
    by_count = sorted(frequencies, key=lambda s: frequencies[s])
    return dict(zip(by_count, sorted(lengths.values())))


def only_first_group_deeper(frequencies):
    heap = [(c, i, [s]) for i, (s, c) in enumerate(frequencies.items())]
    heapq.heapify(heap)
    lengths, tie = dict.fromkeys(frequencies, 0), len(heap)
    while len(heap) > 1:
        (ca, _, a), (cb, _, b) = heapq.heappop(heap), heapq.heappop(heap)
        for s in a:
            lengths[s] += 1
        heapq.heappush(heap, (ca + cb, tie, a + b))
        tie += 1
    return lengths


def calls_the_lecture(frequencies):
    return huffman.code_lengths(frequencies)


@pytest.mark.parametrize("wrong, message", [
    (count_symbol_heap, "compared two symbols"), (sorted_symbols_first, "compared two symbols"),
    (merges_in_the_input, "changed the dict"), (codewords, "codewords"), (shannon_code, "ceil\\(-log2"),
    (rounded_information, "round\\(-log2"), (fixed_length, "fixed-length"), (one_bit_short, "at least 1 bit"),
    (lengths_reversed, "longer codeword.*rarer"), (only_first_group_deeper, "at least 1 bit"),
    (calls_the_lecture, "huffman.code_lengths"), (lambda f: list(NS["huffman_code_lengths"](f).values()), "dict"),
    (lambda f: {str(s): n for s, n in NS["huffman_code_lengths"](f).items()}, "one length per symbol"),
], ids=["(count, symbol)", "sorted symbols", "mutates", "codewords", "shannon", "rounded", "fixed", "one short",
        "reversed", "one side deeper", "library", "a list", "str keys"])
def test_wrong_code_lengths_name_the_mistake(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_huffman_code_lengths(wrong)


def tree_of_nodes(frequencies):
    """Correct, with node objects and a counter as the tie-breaker, depths read back from the finished tree."""
    import itertools
    counter = itertools.count()
    heap = [(c, next(counter), s, None, None) for s, c in frequencies.items()]
    heapq.heapify(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, (a[0] + b[0], next(counter), None, a, b))
    lengths, stack = {}, [(heap[0], 0)]
    while stack:
        (count, _, symbol, left, right), depth = stack.pop()
        if left is None:
            lengths[symbol] = depth
        else:
            stack += [(left, depth + 1), (right, depth + 1)]
    return lengths


def probabilities(frequencies):
    """Correct: Huffman on probabilities (floats) instead of counts."""
    total = sum(frequencies.values())
    return NS["huffman_code_lengths"]({s: c / total for s, c in frequencies.items()})


@pytest.mark.parametrize("right", [tree_of_nodes, probabilities])
def test_more_correct_code_lengths_pass(right):
    check_huffman_code_lengths(right)


# --- property tests: the solutions agree with the lecture's functions on drawn inputs ---------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

COUNTS = st.one_of(st.integers(1, 4), st.integers(1, 10**6), st.sampled_from([2**k for k in range(40)]))
FREQUENCIES = st.dictionaries(st.one_of(st.integers(-50, 50), st.text(max_size=2)), COUNTS, min_size=1, max_size=24)


def cost(frequencies, lengths):
    return sum(frequencies[s] * n for s, n in lengths.items())


@settings(max_examples=150)
@given(FREQUENCIES)
def test_solution_code_lengths_are_as_short_as_the_lectures(frequencies):
    """Any symbols, ties and powers of two: the solution's code is optimal (the lecture's code costs as much)."""
    lengths = NS["huffman_code_lengths"](dict(frequencies))
    reference = huffman.code_lengths(frequencies)
    assert cost(frequencies, lengths) == cost(frequencies, reference)
    assert huffman.kraft_sum(lengths) == 1
    if len(frequencies) > 1:
        nb14.judge_lengths(frequencies, lengths, "drawn")


WRONG_LENGTHS = [depth_from_one, merges_the_largest, shannon_fano, unary_by_rank, rounded_information, shannon_code,
                 fixed_length, lengths_reversed, only_first_group_deeper, deepest_one_short]


@settings(max_examples=150)
@given(FREQUENCIES.filter(lambda f: len(f) > 1), st.sampled_from(WRONG_LENGTHS))
def test_judge_rejects_exactly_the_codes_that_are_not_optimal(frequencies, wrong):
    """Wrong algorithms are often right on some inputs: the judge fails them exactly where the code is worse than
    the lecture's (or not a prefix code at all)."""
    lengths = wrong(dict(frequencies))
    optimal = (huffman.kraft_sum(lengths) == 1 and all(n >= 1 for n in lengths.values())
               and cost(frequencies, lengths) == cost(frequencies, huffman.code_lengths(frequencies)))
    if optimal:
        nb14.judge_lengths(frequencies, lengths, "drawn")
    else:
        with pytest.raises(AssertionError):
            nb14.judge_lengths(frequencies, lengths, "drawn")


EDGES = st.sampled_from(sorted({2**k + d for k in range(1, 9) for d in (-1, 0, 1)}))   # runs around 2**bits
POSITIONS = st.builds(lambda runs: [sum(runs[:i + 1]) + i for i in range(len(runs))],
                      st.lists(st.one_of(st.integers(0, 3), st.integers(0, 300), EDGES), max_size=30))


@settings(max_examples=150)
@given(POSITIONS, st.integers(1, 8))
def test_solution_stream_equals_the_lectures(positions, bits):
    """Runs of zeros at and around every power of two: the solution's stream is storage.relative_indices'."""
    assert NS["relative_indices"](list(positions), bits) == via_storage(positions, bits)
    nb14.judge_stream(positions, bits, via_storage(positions, bits), "drawn")


WRONG_STREAMS = {"first from 1": make(first=0), "distance": make(gap=lambda p, prev: p - prev),
                 "filler off position": make(consume=lambda m: m), ">=": make(fill_at_largest=True),
                 "uncounted": make(count=False), "no fillers": make(fill=False), "balanced": balanced_fillers}


@settings(max_examples=200)
@given(POSITIONS, st.integers(1, 8), st.sampled_from(sorted(WRONG_STREAMS)))
def test_judge_rejects_every_stream_that_differs(positions, bits, name):
    wrong = WRONG_STREAMS[name](list(positions), bits)
    if wrong == via_storage(positions, bits):
        nb14.judge_stream(positions, bits, wrong, "drawn")
    else:
        with pytest.raises(AssertionError):
            nb14.judge_stream(positions, bits, wrong, "drawn")
