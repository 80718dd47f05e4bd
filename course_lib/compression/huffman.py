"""Huffman coding, the third stage of Deep Compression (Han et al. 2016, section 4), on real bits.

After pruning and weight sharing a layer is two streams of small integers (codebook indices and
relative positions) whose values are far from uniform. A Huffman code gives frequent values short
codewords: the average length L per symbol is optimal among prefix codes and H <= L < H + 1, where
H is the entropy of the symbol frequencies.

    lengths = code_lengths(Counter(symbols))   # {symbol: bits}: an optimal code's lengths
    codes = canonical_codes(lengths)           # {symbol: "0110"}: the lengths alone fix the code
    stream = encode(symbols)                   # HuffmanStream: bytes, nbits, count, lengths
    decode(stream) == list(symbols)

Canonical codes (as in DEFLATE) are assigned in order of (length, symbol), so a file needs to store
only the code length of each symbol; the decoder rebuilds the same codewords from them.
"""
from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from ..validate import int_in_range, number_in_range


def _check_frequencies(frequencies) -> dict:
    if not isinstance(frequencies, Mapping):
        raise TypeError("frequencies must be a mapping symbol -> count (e.g. a Counter); "
                        f"got {type(frequencies).__name__}")
    if not frequencies:
        raise ValueError("frequencies must hold at least one symbol: an empty input has no Huffman code")
    for symbol, count in frequencies.items():
        number_in_range(f"frequencies[{symbol!r}]", count, 0, lo_open=True, noun="count")
    return dict(frequencies)


def _ordered(symbols):
    """Symbols in sorted order when they compare (ints, strings), else as given: ties break the same way every run."""
    try:
        return sorted(symbols)
    except TypeError:
        return list(symbols)


def code_lengths(frequencies) -> dict:
    """{symbol: length in bits} of an optimal prefix code for these counts (Huffman's algorithm).

    Merge the two least frequent nodes until one is left; a symbol's length is its leaf's depth.
    One symbol alone gets length 0: it carries no information, and a decoder that knows how many
    symbols to produce needs no bits at all (Kraft sum 2**0 = 1, L = H = 0). Ties are broken by
    symbol order, so the result is deterministic; any tie-break gives the same expected length.
    """
    freq = _check_frequencies(frequencies)
    symbols = _ordered(freq)
    heap = [(freq[s], i) for i, s in enumerate(symbols)]
    heapq.heapify(heap)
    parent = [0] * (2 * len(symbols) - 1)
    node = len(symbols)
    while len(heap) > 1:
        (fa, a), (fb, b) = heapq.heappop(heap), heapq.heappop(heap)
        parent[a] = parent[b] = node
        heapq.heappush(heap, (fa + fb, node))
        node += 1
    depth = [0] * node            # parents are created after their children: fill from the root down
    for i in range(node - 2, -1, -1):
        depth[i] = depth[parent[i]] + 1
    return {s: depth[i] for i, s in enumerate(symbols)}


def kraft_sum(lengths: Mapping) -> Fraction:
    """Sum of 2**-length, exactly. <= 1 for every prefix code; == 1 for every optimal one (a full tree)."""
    return sum((Fraction(1, 2**n) for n in lengths.values()), Fraction(0))


def entropy(frequencies) -> float:
    """Shannon entropy H of the symbol frequencies, in bits per symbol: no code averages less."""
    freq = _check_frequencies(frequencies)
    total = sum(freq.values())
    return -sum(f / total * math.log2(f / total) for f in freq.values())


def expected_length(frequencies, lengths: Mapping) -> float:
    """Average codeword length L in bits per symbol: sum of p(s) * length(s)."""
    freq = _check_frequencies(frequencies)
    missing = set(freq) - set(lengths)
    if missing:
        raise ValueError(f"lengths has no entry for symbols {sorted(missing, key=repr)[:5]}")
    return sum(f * lengths[s] for s, f in freq.items()) / sum(freq.values())


def canonical_codes(lengths: Mapping) -> dict:
    """{symbol: codeword as a '0'/'1' string}: the canonical prefix code with these lengths.

    Symbols sorted by (length, symbol) get consecutive binary numbers, shifted left whenever the
    length grows, so shorter codewords come first and no codeword is a prefix of another.
    """
    if not lengths:
        raise ValueError("lengths must hold at least one symbol")
    if len(lengths) == 1 and next(iter(lengths.values())) == 0:
        return {next(iter(lengths)): ""}
    for symbol, n in lengths.items():
        int_in_range(f"lengths[{symbol!r}]", n, 1, hint=" when there are several symbols")
    if kraft_sum(lengths) > 1:
        raise ValueError(f"these lengths break the Kraft inequality (sum of 2**-length = {kraft_sum(lengths)} > 1): "
                         "no prefix code has them")
    codes, code, previous = {}, 0, 0
    for symbol in sorted(_ordered(lengths), key=lambda s: lengths[s]):   # stable: by length, then symbol order
        code <<= lengths[symbol] - previous
        previous = lengths[symbol]
        codes[symbol] = format(code, f"0{previous}b")
        code += 1
    return codes


@dataclass(frozen=True)
class HuffmanStream:
    """An encoded sequence: `data` holds `nbits` bits (the last byte zero-padded) for `count` symbols;
    `lengths` is the code table (what a file stores: one code length per symbol)."""

    data: bytes
    nbits: int
    count: int
    lengths: dict


def encode(symbols) -> HuffmanStream:
    """Huffman-code a non-empty sequence of hashable, comparable symbols (e.g. a list of ints)."""
    symbols = list(symbols)
    if not symbols:
        raise ValueError("symbols must not be empty: there is nothing to build a code from")
    lengths = code_lengths(Counter(symbols))
    codes = canonical_codes(lengths)
    bits = "".join([codes[s] for s in symbols])
    nbytes = (len(bits) + 7) // 8
    data = int(bits + "0" * (8 * nbytes - len(bits)), 2).to_bytes(nbytes, "big") if bits else b""
    return HuffmanStream(data, len(bits), len(symbols), lengths)


def decode(stream: HuffmanStream) -> list:
    """The symbols of `stream`, rebuilt from its bytes and code lengths alone (canonical decoding)."""
    if not isinstance(stream, HuffmanStream):
        raise TypeError(f"stream must be a HuffmanStream (from encode); got {type(stream).__name__}")
    codes = canonical_codes(stream.lengths)
    if len(codes) == 1 and not next(iter(codes.values())):
        if stream.nbits:
            raise ValueError("corrupt stream: a one-symbol code uses no bits, but the stream has some")
        return [next(iter(codes))] * stream.count
    table = {code: symbol for symbol, code in codes.items()}
    if len(stream.data) != (stream.nbits + 7) // 8:
        raise ValueError(f"corrupt stream: {len(stream.data)} bytes cannot hold exactly {stream.nbits} bits")
    bits = format(int.from_bytes(stream.data, "big"), f"0{8 * len(stream.data)}b")[:stream.nbits]
    out, start = [], 0
    for end in range(1, len(bits) + 1):
        symbol = table.get(bits[start:end])
        if symbol is not None:
            out.append(symbol)
            start = end
    if start != len(bits) or len(out) != stream.count:
        raise ValueError(f"corrupt stream: decoded {len(out)} of {stream.count} symbols, "
                         f"{len(bits) - start} bits left over")
    return out
