"""Huffman coding: optimal lengths (checked against an independent heapq cost), Kraft equality,
entropy bounds, canonical codes, and a bit-exact round trip on random and adversarial inputs."""
import math
import random
from collections import Counter

import pytest

from course_lib.checks.nb14 import optimal_cost
from course_lib.compression import huffman as H


def fibonacci(n):
    a, b, out = 1, 1, []
    for _ in range(n):
        out.append(a)
        a, b = b, a + b
    return out


CASES = {
    "two symbols": {0: 1, 1: 1},
    "two, skewed": {0: 10**6, 1: 1},
    "uniform power of two": dict.fromkeys(range(64), 5),
    "uniform, not a power of two": dict.fromkeys(range(37), 3),
    "dyadic": {0: 8, 1: 4, 2: 2, 3: 1, 4: 1},
    "fibonacci (deepest tree)": dict(enumerate(fibonacci(25))),
    "highly skewed": {0: 100000, **{i: 1 for i in range(1, 200)}},
    "strings": Counter("abracadabra alakazam"),
    "shannon-fano is not optimal here": {"a": 35, "b": 17, "c": 17, "d": 16, "e": 15},
    "random": Counter(random.Random(0).choices(range(300), weights=[random.Random(1).random() ** 4 for _ in range(300)],
                                               k=20000)),
}


@pytest.mark.parametrize("name", CASES)
def test_code_lengths_are_optimal_and_complete(name):
    freq = CASES[name]
    lengths = H.code_lengths(freq)
    assert set(lengths) == set(freq) and all(isinstance(n, int) and n >= 1 for n in lengths.values())
    assert H.kraft_sum(lengths) == 1                                    # a full binary tree
    assert sum(freq[s] * lengths[s] for s in freq) == optimal_cost(freq)  # optimal
    entropy, average = H.entropy(freq), H.expected_length(freq, lengths)
    assert entropy - 1e-9 <= average < entropy + 1


def test_dyadic_frequencies_reach_the_entropy_exactly():
    freq = CASES["dyadic"]
    assert H.code_lengths(freq) == {0: 1, 1: 2, 2: 3, 3: 4, 4: 4}
    assert math.isclose(H.expected_length(freq, H.code_lengths(freq)), H.entropy(freq))


def test_uniform_and_fibonacci_shapes():
    assert set(H.code_lengths(CASES["uniform power of two"]).values()) == {6}
    assert set(H.code_lengths(CASES["uniform, not a power of two"]).values()) == {5, 6}
    assert max(H.code_lengths(CASES["fibonacci (deepest tree)"]).values()) == 24   # n - 1: a chain


def test_one_symbol_needs_no_bits():
    assert H.code_lengths({7: 3}) == {7: 0}
    assert H.kraft_sum({7: 0}) == 1 and H.entropy({7: 3}) == 0
    stream = H.encode([7, 7, 7])
    assert stream.nbits == 0 and stream.data == b"" and H.decode(stream) == [7, 7, 7]


def test_ties_are_deterministic():
    freq = dict.fromkeys("edcba", 1)
    assert H.code_lengths(freq) == H.code_lengths(dict(reversed(list(freq.items()))))


@pytest.mark.parametrize("name", CASES)
def test_canonical_codes_are_prefix_free_and_ordered(name):
    lengths = H.code_lengths(CASES[name])
    codes = H.canonical_codes(lengths)
    assert all(len(codes[s]) == lengths[s] for s in lengths)
    words = sorted(codes.values())
    assert all(not b.startswith(a) for a, b in zip(words, words[1:]))   # sorted: a prefix would sit just before
    ordered = sorted(lengths, key=lambda s: (lengths[s], s))
    values = [int(codes[s], 2) << (max(lengths.values()) - lengths[s]) for s in ordered]
    assert values == sorted(values) and len(set(values)) == len(values)


@pytest.mark.parametrize("name", CASES)
def test_round_trip_is_bit_exact(name):
    freq = CASES[name]
    symbols = [s for s, f in freq.items() for _ in range(min(f, 2000))]
    random.Random(2).shuffle(symbols)
    stream = H.encode(symbols)
    lengths = H.code_lengths(Counter(symbols))
    assert stream.nbits == sum(lengths[s] for s in symbols)
    assert len(stream.data) == math.ceil(stream.nbits / 8) and stream.count == len(symbols)
    assert H.decode(stream) == symbols


def test_random_round_trips():
    rng = random.Random(3)
    for _ in range(30):
        alphabet = rng.randint(1, 70)
        symbols = rng.choices(range(alphabet), weights=[rng.random() ** 3 + 1e-3 for _ in range(alphabet)],
                              k=rng.randint(1, 3000))
        assert H.decode(H.encode(symbols)) == symbols


def test_lengths_alone_rebuild_the_code():
    stream = H.encode([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5])
    rebuilt = H.HuffmanStream(stream.data, stream.nbits, stream.count, dict(stream.lengths))
    assert H.decode(rebuilt) == [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least one symbol"):
        H.code_lengths({})
    with pytest.raises(ValueError, match="must not be empty"):
        H.encode([])
    for bad in (0, -1, True, float("inf"), "3"):
        with pytest.raises(ValueError, match=r"frequencies\['a'\]"):
            H.code_lengths({"a": bad, "b": 1})
    with pytest.raises(TypeError, match="mapping"):
        H.code_lengths([1, 2, 3])
    with pytest.raises(ValueError, match="Kraft"):
        H.canonical_codes({"a": 1, "b": 1, "c": 1})
    with pytest.raises(ValueError, match="int >= 1"):
        H.canonical_codes({"a": 0, "b": 1})


def test_corrupt_streams_are_refused():
    stream = H.encode([0, 1, 1, 2, 2, 2, 2])
    with pytest.raises(ValueError, match="corrupt"):
        H.decode(H.HuffmanStream(stream.data, stream.nbits, stream.count + 1, stream.lengths))
    with pytest.raises(ValueError, match="corrupt"):
        H.decode(H.HuffmanStream(stream.data, stream.nbits - 1, stream.count, stream.lengths))
    with pytest.raises(ValueError, match="corrupt"):
        H.decode(H.HuffmanStream(stream.data + b"\x00", stream.nbits, stream.count, stream.lengths))
    with pytest.raises(ValueError, match="corrupt"):
        H.decode(H.HuffmanStream(b"\x80", 1, 1, {5: 0}))
    with pytest.raises(TypeError):
        H.decode(b"\x00")


# --- what lecture 14 showed cell by cell -------------------------------------------------------------

def _heapq_tree_codes(frequencies):
    """An independent Huffman tree (tuples for inner nodes), as lecture 14 used to build it by hand."""
    import heapq
    heap = [(count, i, symbol) for i, (symbol, count) in enumerate(frequencies.items())]
    heapq.heapify(heap)
    tie = len(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, (a[0] + b[0], tie, (a[2], b[2])))
        tie += 1
    codes = {}

    def walk(node, path):
        if isinstance(node, tuple):
            walk(node[0], path + "0")
            walk(node[1], path + "1")
        else:
            codes[node] = path or "0"
    walk(heap[0][2], "")
    return codes


def test_lecture_14_text_code_lengths_equal_an_independent_heapq_tree():
    text = "deep compression: pruning, trained quantization and huffman coding"
    freq = Counter(text)
    reference = {s: len(c) for s, c in _heapq_tree_codes(freq).items()}
    ours = H.code_lengths(freq)
    assert H.expected_length(freq, ours) == H.expected_length(freq, reference)   # same optimum, any tie-break
    words = sorted(H.canonical_codes(ours).values())
    assert all(not b.startswith(a) for a, b in zip(words, words[1:]))
    assert H.kraft_sum(ours) == 1 and H.entropy(freq) <= H.expected_length(freq, ours) < H.entropy(freq) + 1
    assert H.decode(H.encode(list(text))) == list(text)


def test_lecture_14_skewed_stream_and_edge_cases_round_trip():
    import torch
    torch.manual_seed(0)
    symbols = torch.distributions.Geometric(probs=torch.tensor(0.3)).sample((20_000,)).clamp(max=31).long().tolist()
    stream = H.encode(symbols)
    assert H.decode(stream) == symbols
    average = stream.nbits / len(symbols)
    assert H.entropy(Counter(symbols)) <= average < H.entropy(Counter(symbols)) + 1
    assert stream.nbits == sum(stream.lengths[s] for s in symbols)
    for edge in ([7] * 100, [0, 1] * 50, [0] * 10_000 + [1]):
        assert H.decode(H.encode(edge)) == edge
    assert H.encode([7] * 100).nbits == 0
