"""Checks for solutions/14_deep_compression_exercises.ipynb: Huffman code lengths, relative indices.

Neither check compares with a copy of the solution. Code lengths are judged by two properties every
optimal prefix code has, and only optimal codes have: the Kraft sum is exactly 1 (a full tree), and
the total length equals Huffman's cost computed independently (the sum of all merged weights, no
lengths involved), so any optimal tie-break passes. Relative indices are decoded back to positions
with torch.cumsum, every entry that lands on no non-zero is a filler (it must take the largest gap),
and the filler count is compared with the minimum, sum(zeros // 2**bits). When a case fails, the
message says what the answer's output is (e.g. an optimal code with one bit added everywhere), found
by testing the output, not by guessing.
"""
from __future__ import annotations

import heapq
import math
import numbers
import random
from fractions import Fraction

import torch

from . import answer_source, calls_method, expect, passed


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
        {0: 3, 1: 3, 2: 3, 3: 3, 4: 3, 5: 3, 6: 3, 7: 3},  # uniform, a power of two: 3 bits each
        {0: 1000, 1: 3, 2: 2, 3: 1, 4: 1, 5: 1},          # highly skewed
        dict(enumerate(fib)),                             # the deepest possible tree
        {0: 1, 1: 1, 2: 2, 3: 2},                         # two different optimal codes: both pass
        {"a": 2, 1: 2, (0, 1): 1, None: 1, 2.5: 2},       # symbols that do not compare with each other
        {"x": 10**17, "y": 1, "z": 1},                    # counts beyond 2**53: exact only as ints
        {s: rng.randint(1, 60) ** 2 for s in range(40)},
    ]


def _whole(n) -> bool:
    """A whole number of bits: an int (numpy's too) or an integral float such as 2.0; never a bool."""
    return (isinstance(n, numbers.Integral) and not isinstance(n, bool)) or (isinstance(n, float) and n.is_integer())


def _kraft(lengths: dict) -> Fraction:
    return sum((Fraction(1, 2**n) for n in lengths.values()), Fraction(0))


def _is_optimal(frequencies: dict, lengths: dict) -> bool:
    return (all(n >= 0 for n in lengths.values()) and _kraft(lengths) == 1
            and sum(frequencies[s] * n for s, n in lengths.items()) == optimal_cost(frequencies))


def _length_mistake(frequencies: dict, lengths: dict) -> str:
    """What these (not optimal) lengths are, found by testing them; "" when none of these fits."""
    total = sum(frequencies.values())
    information = {s: -math.log2(f / total) for s, f in frequencies.items()}
    if _is_optimal(frequencies, {s: n - 1 for s, n in lengths.items()}):
        return ("Every length minus 1 gives an optimal code: each codeword is one bit too long (a leaf's depth "
                "counts the edges from the root, and the root itself is depth 0).")
    if _is_optimal(frequencies, {s: n + 1 for s, n in lengths.items()}):
        return "Every length plus 1 gives an optimal code: each codeword is one bit too short."
    if len(set(lengths.values())) == 1:
        return (f"Every symbol got {next(iter(lengths.values()))} bits: a fixed-length code, which ignores the "
                "counts; Huffman gives frequent symbols shorter codewords.")
    rounded = {s: round(i) for s, i in information.items()}
    shannon = {s: math.ceil(i) for s, i in information.items()}
    names = ["ceil(-log2(count / total)) (Shannon's code)"] * (lengths == shannon)
    names += ["round(-log2(count / total))"] * (lengths in (rounded, {s: max(1, n) for s, n in rounded.items()}))
    if names:
        return (f"These lengths are {' and also '.join(names)}: a symbol's information content, rounded, is not an "
                "optimal code's length in general (ceil gives a prefix code, but not the shortest; round may give "
                "none).")
    longer = [(a, b) for a in frequencies for b in frequencies
              if frequencies[a] > frequencies[b] and lengths[a] > lengths[b]]
    if longer:
        a, b = longer[0]
        return (f"Symbol {a!r} (count {frequencies[a]}) got a longer codeword ({lengths[a]} bits) than the rarer "
                f"{b!r} (count {frequencies[b]}, {lengths[b]} bits): swapping them saves bits. Huffman merges the "
                "two *least* frequent nodes first, so the rarest symbols end deepest.")
    return ""


def _call_lengths(huffman_code_lengths, frequencies: dict, what: str):
    """The answer on a copy of `frequencies`: a message for comparing symbols, and for changing the dict."""
    given = dict(frequencies)
    try:
        lengths = huffman_code_lengths(given)
    except TypeError as exc:
        if "not supported between instances" not in str(exc):
            raise
        raise AssertionError(f"{what} raised TypeError: {str(exc).removeprefix('TypeError: ')}. Your code compared "
                             "two symbols (or lists of them), which the symbols need not support: they can be any "
                             "dict keys. With heapq, put a unique number right after the count, (count, i, symbols), "
                             "so that equal counts never reach the symbols.") from None
    expect(given == frequencies and list(given) == list(frequencies),
           f"{what} changed the dict it was given (it now holds {given if len(given) <= 8 else '...'}): the caller "
           "still needs its counts. Build your own heap (and lengths dict) instead of changing the input.")
    return lengths


def judge_lengths(frequencies: dict, lengths, what: str) -> None:
    """AssertionError unless `lengths` are an optimal prefix code's for `frequencies` (two or more symbols)."""
    expect(isinstance(lengths, dict) and set(lengths) == set(frequencies),
           f"{what} must return a dict with one length per symbol, keys {list(frequencies)}; got {lengths!r}")
    codewords = [n for n in lengths.values() if isinstance(n, str) and n and set(n) <= {"0", "1"}]
    expect(not codewords, f"{what} returned {lengths}: those are codewords; return their lengths in bits "
                          "(len(codeword)), or better, count the depth without building codewords")
    expect(all(_whole(n) for n in lengths.values()),
           f"{what} returned {lengths}: a length is a whole number of bits (an int)")
    lengths = {s: int(n) for s, n in lengths.items()}
    expect(all(n >= 1 for n in lengths.values()),
           f"{what} returned {lengths}: with two or more symbols every codeword needs at least 1 bit")
    kraft, best = _kraft(lengths), optimal_cost(frequencies)
    total = sum(frequencies[s] * lengths[s] for s in frequencies)
    if kraft == 1 and total == best:
        return
    hint = _length_mistake(frequencies, lengths)
    expect(kraft <= 1, f"{what} returned {lengths}: the sum of 2**-length is {kraft} > 1, so no prefix code has "
                       f"these lengths (some codewords would have to be prefixes of others). {hint}".strip())
    expect(kraft == 1, f"{what} returned {lengths}: the sum of 2**-length is {kraft} < 1, so some codeword could "
                       f"be shorter: an optimal code is a full binary tree. {hint}".strip())
    raise AssertionError(f"{what} returned {lengths}: encoding costs {total} bits in all, but an optimal code needs "
                         f"{best}. " + (hint or "Huffman's rule: repeatedly merge the two *least* frequent nodes (a "
                                                "heap); every symbol under a merged node gets one bit longer. A "
                                                "top-down split (Shannon-Fano) is not always optimal."))


def check_huffman_code_lengths(huffman_code_lengths) -> None:
    """`huffman_code_lengths(frequencies)` -> {symbol: length}, an optimal prefix code's lengths."""
    expect(not calls_method(answer_source(huffman_code_lengths), "code_lengths"),
           "huffman_code_lengths calls the lecture's huffman.code_lengths, which does the whole exercise; the "
           "exercise is to write Huffman's algorithm yourself")
    for frequencies in _length_cases():
        what = f"huffman_code_lengths({frequencies if len(frequencies) <= 6 else f'<{len(frequencies)} symbols>'})"
        judge_lengths(frequencies, _call_lengths(huffman_code_lengths, frequencies, what), what)
    for single in ({"x": 7}, {3: 1}):
        what = f"huffman_code_lengths({single})"
        lengths = _call_lengths(huffman_code_lengths, single, what)
        symbol = next(iter(single))
        expect(isinstance(lengths, dict) and set(lengths) == {symbol} and _whole(lengths[symbol])
               and lengths[symbol] == 0,
               f"{what} returned {lengths!r}; expected {{{symbol!r}: 0}}: a single symbol carries no information, "
               "and a decoder that knows how many symbols to produce needs no bits at all")
    passed("huffman_code_lengths")


# --- relative indices ----------------------------------------------------------------------------

def _index_cases():
    g = torch.Generator().manual_seed(14)
    random_positions = (torch.rand(2000, generator=g) < 0.08).nonzero().flatten().tolist()
    return [
        ([1, 4, 15], 3),                 # the paper's Figure 2: a run of 10 zeros needs one filler
        ([0, 7, 15], 3),                 # 6 zeros, then 7 (the largest gap): no filler; the first gap counts from 0
        ([8], 3),                        # 8 zeros: exactly one too many
        ([15], 4), ([16], 4),            # 15 zeros fit a 4-bit gap, 16 do not
        ([31], 4), ([32], 4),            # 31 zeros: one filler and the largest gap; 32: two fillers and gap 0
        ([5, 300], 4),                   # 294 zeros: many fillers in a row
        ([0, 1, 2, 10], 1),              # 1-bit gaps
        ([2], 1),                        # 2 zeros in 1-bit gaps: filler, then gap 0
        ([3, 1000], 8),                  # 996 zeros, 8-bit gaps
        ([], 5),
        (random_positions, 5),
        (random_positions, 2),
    ]


def _encode(positions, bits, first_from_zero=False, distance=False, filler_off_position=False,
            fills_full_gap=False) -> tuple:
    """The stream that one known mistake (the flag set) makes: what a failed case is compared with."""
    largest = 2**bits - 1
    gaps, fillers, previous = [], 0, 0 if first_from_zero else -1
    for position in positions:
        zeros = position - previous - (0 if distance else 1)
        while zeros > largest or (fills_full_gap and zeros == largest):
            gaps.append(largest)
            fillers += 1
            zeros -= largest if filler_off_position else largest + 1
        gaps.append(zeros)
        previous = position
    return gaps, fillers


STREAM_MISTAKES = {
    "first_from_zero": "the first gap counts the zeros from position 1; it counts them from position 0 (the "
                       "previous position starts at -1, so a first non-zero at p has gap p)",
    "distance": "each gap is the distance pos - prev; it is the number of zeros between the two entries, "
                "pos - prev - 1",
    "filler_off_position": "after a filler the run goes on from the filler's own position; a filler stands on a "
                           "position of its own, so it uses up 2**bits positions (2**bits - 1 zeros and itself)",
    "fills_full_gap": "a run of exactly 2**bits - 1 zeros fits in one gap: insert a filler only when the run is "
                      "longer (>, not >=)",
}


def _whole_numbers(values) -> list | None:
    """`values` as a list of ints, or None unless every value is a whole number."""
    try:
        values = values.tolist() if isinstance(values, torch.Tensor) else list(values)
        return [int(v) for v in values] if all(not isinstance(v, bool) and int(v) == v for v in values) else None
    except (TypeError, ValueError):
        return None


def judge_stream(positions: list, bits: int, out, what: str) -> None:
    """AssertionError unless `out` is (gaps, fillers), Deep Compression's relative index stream of `positions`."""
    expect(isinstance(out, tuple) and len(out) == 2,
           f"{what} must return a tuple (gaps, fillers); got {type(out).__name__}")
    gaps, fillers = _whole_numbers(out[0]), out[1]
    expect(gaps is not None, f"{what}: gaps must be a list of whole numbers (ints); got {out[0]!r}")
    expect(isinstance(fillers, numbers.Integral) and not isinstance(fillers, bool) and fillers >= 0,
           f"{what}: fillers must be the number (an int >= 0) of filler entries inserted; got {fillers!r}")
    mistakes = [hint for flag, hint in STREAM_MISTAKES.items()
                if (gaps, fillers) == _encode(positions, bits, **{flag: True})]
    named = f" Your stream is what this mistake gives: {mistakes[0]}." if mistakes else ""
    largest = 2**bits - 1
    shown = gaps if len(gaps) <= 12 else "..."
    expect(all(v >= 0 for v in gaps), f"{what} returned gaps {shown}: a gap counts zeros, so it is never negative."
                                      + named)
    expect(all(v <= largest for v in gaps),
           f"{what} returned gaps {shown}: a {bits}-bit gap holds 0..{largest}. A run of more than {largest} zeros "
           f"needs a filler entry (gap {largest}, value 0) first." + named)
    expect(len(gaps) == len(positions) + fillers,
           f"{what}: {len(gaps)} gaps for {len(positions)} non-zeros and {fillers} fillers; every filler is an entry "
           "of its own in the stream, so count each one you insert." + named)
    decoded = ((torch.tensor(gaps, dtype=torch.int64) + 1).cumsum(0) - 1).tolist()     # position of every entry
    missing = [p for p in positions if p not in set(decoded)]
    expect(not missing,
           f"{what}: decoding your gaps (position = previous + gap + 1, starting from -1) puts entries at "
           f"{decoded[:8]}{'...' if len(decoded) > 8 else ''}, none at the non-zero positions {missing[:5]}." + named)
    zeros = torch.diff(torch.tensor(positions, dtype=torch.int64), prepend=torch.tensor([-1])) - 1
    needed = int((zeros // 2**bits).sum())
    expect(fillers == needed,
           f"{what}: {fillers} fillers, but {needed} are needed: a run of z zeros needs z // 2**{bits} fillers, each "
           f"of which skips {largest} zeros and stands on the next." + named)
    real = set(positions)
    for position, gap in zip(decoded, gaps):
        expect(position in real or gap == largest,
               f"{what}: the filler at position {position} has gap {gap}; a filler takes the largest gap, {largest}: "
               f"it goes in only where a gap would overflow, after {largest} zeros." + named)


def check_relative_indices(relative_indices) -> None:
    """`relative_indices(positions, bits)` -> (gaps, fillers): Deep Compression's relative index stream."""
    expect(not calls_method(answer_source(relative_indices), "relative_indices"),
           "relative_indices calls the lecture's storage.relative_indices, which does the whole exercise; the "
           "exercise is to write the encoding yourself")
    for positions, bits in _index_cases():
        shown = positions if len(positions) <= 6 else f"<{len(positions)} positions>"
        what = f"relative_indices({shown}, bits={bits})"
        given = list(positions)
        out = relative_indices(given, bits)
        expect(given == positions, f"{what} changed the list of positions it was given: the caller still needs it. "
                                   "Build a new list of gaps instead.")
        judge_stream(positions, bits, out, what)
    passed("relative_indices")
