"""Checks for solutions/14_deep_compression_exercises.ipynb: Huffman code lengths, relative indices.

Neither check compares with a copy of the solution. Code lengths are judged by two properties every
optimal prefix code has, and only optimal codes have: the Kraft sum is exactly 1 (a full tree), and
the total length equals Huffman's cost computed independently (the sum of all merged weights, no
lengths involved), so any optimal tie-break passes. Relative indices are decoded back to positions
with torch.cumsum, and the filler count is compared with the minimum, sum(zeros // 2**bits).
"""
from __future__ import annotations

import heapq
import numbers
import random
from fractions import Fraction

import torch

from . import expect, passed


def optimal_cost(frequencies: dict) -> int:
    """Total bits of an optimal prefix code: the sum of all merged weights (no code lengths involved)."""
    heap = list(frequencies.values())
    heapq.heapify(heap)
    cost = 0
    while len(heap) > 1:
        merged = heapq.heappop(heap) + heapq.heappop(heap)
        cost += merged
        heapq.heappush(heap, merged)
    return cost


def _length_cases():
    rng = random.Random(14)
    fib = [1, 1]
    while len(fib) < 12:
        fib.append(fib[-1] + fib[-2])
    return [
        {"a": 1, "b": 1},
        {"a": 8, "b": 4, "c": 2, "d": 1, "e": 1},
        {"a": 35, "b": 17, "c": 17, "d": 16, "e": 15},    # Shannon-Fano's top-down split is not optimal here
        {0: 5, 1: 5, 2: 5, 3: 5, 4: 5},                   # uniform, not a power of two
        {0: 1000, 1: 3, 2: 2, 3: 1, 4: 1, 5: 1},          # highly skewed
        dict(enumerate(fib)),                             # the deepest possible tree
        {0: 1, 1: 1, 2: 2, 3: 2},                         # two different optimal codes: both pass
        {s: rng.randint(1, 60) ** 2 for s in range(40)},
    ]


def _whole(n) -> bool:
    """A whole number of bits: an int (numpy's too) or an integral float such as 2.0; never a bool."""
    return (isinstance(n, numbers.Integral) and not isinstance(n, bool)) or (isinstance(n, float) and n.is_integer())


def check_huffman_code_lengths(huffman_code_lengths) -> None:
    """`huffman_code_lengths(frequencies)` -> {symbol: length}, an optimal prefix code's lengths."""
    for frequencies in _length_cases():
        what = f"huffman_code_lengths({frequencies if len(frequencies) <= 6 else f'<{len(frequencies)} symbols>'})"
        lengths = huffman_code_lengths(dict(frequencies))
        expect(isinstance(lengths, dict) and set(lengths) == set(frequencies),
               f"{what} must return a dict with one length per symbol, keys {sorted(frequencies)}; got {lengths!r}")
        expect(all(_whole(n) and n >= 1 for n in lengths.values()),
               f"{what} returned {lengths}: with two or more symbols every codeword needs at least 1 bit, "
               "and lengths are whole numbers of bits")
        lengths = {s: int(n) for s, n in lengths.items()}
        kraft = sum(Fraction(1, 2**n) for n in lengths.values())
        expect(kraft <= 1, f"{what} returned {lengths}: the sum of 2**-length is {kraft} > 1, so no prefix code has "
                           "these lengths (some codewords would have to be prefixes of others). Rounding "
                           "-log2(p) does not give a valid code in general.")
        expect(kraft == 1, f"{what} returned {lengths}: the sum of 2**-length is {kraft} < 1, so some codeword "
                           "could be shorter. An optimal code is a full binary tree. Fixed-length codes, and "
                           "depths counted from 1 at the root (one bit too many everywhere), fall short.")
        total = sum(frequencies[s] * lengths[s] for s in frequencies)
        best = optimal_cost(frequencies)
        expect(total == best,
               f"{what} returned {lengths}: encoding costs {total} bits in all, but an optimal code needs {best}. "
               "Huffman's rule: repeatedly merge the two *least* frequent nodes (a heap); every symbol under a "
               "merged node gets one bit longer. Splitting top-down (Shannon-Fano) is not always optimal.")
    lengths = huffman_code_lengths({"x": 7})
    expect(isinstance(lengths, dict) and set(lengths) == {"x"} and _whole(lengths["x"]) and lengths["x"] == 0,
           f"huffman_code_lengths({{'x': 7}}) returned {lengths!r}; expected {{'x': 0}}: a single symbol carries no "
           "information, and a decoder that knows how many symbols to produce needs no bits at all")
    passed("huffman_code_lengths")


def _index_cases():
    g = torch.Generator().manual_seed(14)
    random_positions = (torch.rand(2000, generator=g) < 0.08).nonzero().flatten().tolist()
    return [
        ([1, 4, 15], 3),                 # the paper's Figure 2: a run of 10 zeros needs one filler
        ([0, 7, 15], 3),                 # 6 zeros, then 7: no filler; the first gap counts from 0
        ([8], 3),                        # 8 zeros: exactly one too many
        ([5, 300], 4),                   # 294 zeros: many fillers in a row
        ([0, 1, 2, 10], 1),              # 1-bit gaps
        ([], 5),
        (random_positions, 5),
        (random_positions, 2),
    ]


def check_relative_indices(relative_indices) -> None:
    """`relative_indices(positions, bits)` -> (gaps, fillers): Deep Compression's relative index stream."""
    for positions, bits in _index_cases():
        shown = positions if len(positions) <= 6 else f"<{len(positions)} positions>"
        what = f"relative_indices({shown}, bits={bits})"
        out = relative_indices(list(positions), bits)
        expect(isinstance(out, tuple) and len(out) == 2,
               f"{what} must return a tuple (gaps, fillers); got {type(out).__name__}")
        gaps, fillers = out
        try:
            gaps = [int(v) for v in gaps]
        except (TypeError, ValueError):
            raise AssertionError(f"{what}: gaps must be a list of ints; got {gaps!r}") from None
        expect(isinstance(fillers, int) and not isinstance(fillers, bool) and fillers >= 0,
               f"{what}: fillers must be the number (an int >= 0) of filler entries inserted; got {fillers!r}")
        largest = 2**bits - 1
        expect(all(0 <= v <= largest for v in gaps),
               f"{what} returned gaps {gaps if len(gaps) <= 12 else '...'}: a {bits}-bit gap holds 0..{largest}. "
               f"A run of more than {largest} zeros needs a filler entry (gap {largest}, value 0) first.")
        expect(len(gaps) == len(positions) + fillers,
               f"{what}: {len(gaps)} gaps for {len(positions)} non-zeros and {fillers} fillers; every filler is "
               "an entry of its own in the stream, so count each one you insert")
        decoded = (torch.tensor(gaps, dtype=torch.int64) + 1).cumsum(0) - 1      # position of every entry
        stored = set(decoded.tolist())
        missing = [p for p in positions if p not in stored]
        expect(not missing,
               f"{what}: decoding the gaps (position = previous + gap + 1, starting from -1) misses positions "
               f"{missing[:5]}. A gap is the number of zeros *between* two entries (pos - prev - 1), and the first "
               "counts the zeros before it from position 0.")
        zeros = torch.diff(torch.tensor(positions, dtype=torch.int64), prepend=torch.tensor([-1])) - 1
        needed = int((zeros // 2**bits).sum())
        expect(fillers == needed,
               f"{what}: {fillers} fillers, but {needed} are needed: a run of z zeros needs z // 2**{bits} fillers, "
               f"each of which skips {largest} zeros and stands on the next")
    passed("relative_indices")
