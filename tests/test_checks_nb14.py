"""The lecture-14 checks pass the reference solutions and any optimal tie-break, and fail stubs and
plausible wrong answers."""
import heapq
import math

import pytest

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
    (depth_from_one, "one bit too many"), (merges_the_largest, "least"), (unary_by_rank, "optimal code needs"),
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
         count=True, fill=True):
    def relative_indices(positions, bits):
        largest = largest_of(bits)
        gaps, fillers, previous = [], 0, first
        for p in positions:
            zeros = gap(p, previous)
            while fill and zeros > largest:
                gaps.append(largest)
                fillers += 1
                zeros -= consume(largest)
            gaps.append(zeros)
            previous = p
        return gaps, fillers if count else 0
    return relative_indices


def test_course_lib_passes():
    def via_storage(positions, bits):
        gaps, is_filler = storage.relative_indices(positions, bits)
        return gaps.tolist(), int(is_filler.sum())

    check_relative_indices(via_storage)


@pytest.mark.parametrize("wrong", [
    make(largest_of=lambda bits: 2**bits),                 # accepts a gap of 2**bits (max + 1)
    make(count=False),                                      # fillers inserted but not counted
    make(fill=False),                                       # no fillers: gaps overflow
    make(first=0),                                          # first gap measured from 1 instead of 0
    make(gap=lambda p, prev: p - prev),                     # gap = difference of positions, not zeros between
    make(consume=lambda m: m),                              # a filler that does not stand on a position
    make(largest_of=lambda bits: 2**bits - 2),              # too many fillers
])
def test_wrong_relative_indices_fail(wrong):
    with pytest.raises(AssertionError):
        check_relative_indices(wrong)


def test_a_non_tuple_answer_fails():
    with pytest.raises(AssertionError, match="tuple"):
        check_relative_indices(lambda positions, bits: [0] * len(positions))
