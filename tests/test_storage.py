"""Deep Compression's storage format: relative indices with fillers, bit-exact layer round trips,
and accounting that adds up."""
import math
from collections import Counter

import pytest
import torch

from course_lib.compression import huffman as H
from course_lib.compression import storage as S
from course_lib.compression.kmeans import kmeans_quantize, reconstruct


def reference_relative_indices(positions, bits):
    """A plain loop: emit fillers while the run of zeros is too long, then the entry."""
    largest, gaps, fillers, previous = 2**bits - 1, [], [], -1
    for p in positions:
        zeros = p - previous - 1
        while zeros > largest:
            gaps.append(largest)
            fillers.append(True)
            zeros -= largest + 1
        gaps.append(zeros)
        fillers.append(False)
        previous = p
    return gaps, fillers


def test_the_papers_figure_2_with_3_bit_indices():
    # non-zeros at 1, 4 and 15: gaps 1 and 2, then 10 zeros: more than 7 -> a filler at 12, then 2
    gaps, is_filler = S.relative_indices([1, 4, 15], bits=3)
    assert gaps.tolist() == [1, 2, 7, 2] and is_filler.tolist() == [False, False, True, False]
    assert S.positions_from_gaps(gaps).tolist() == [1, 4, 12, 15]


@pytest.mark.parametrize("zeros, fillers", [(0, 0), (7, 0), (8, 1), (15, 1), (16, 2), (100, 12)])
def test_a_run_of_z_zeros_needs_z_div_2_to_the_b_fillers(zeros, fillers):
    gaps, is_filler = S.relative_indices([zeros], bits=3)
    assert int(is_filler.sum()) == fillers == zeros // 8
    assert int(gaps.max()) <= 7 and S.positions_from_gaps(gaps)[-1] == zeros


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("density", [0.01, 0.08, 0.5, 1.0])
def test_random_positions_match_the_reference_and_decode_back(bits, density):
    g = torch.Generator().manual_seed(bits)
    positions = (torch.rand(3000, generator=g) < density).nonzero().flatten()
    gaps, is_filler = S.relative_indices(positions, bits)
    want_gaps, want_fillers = reference_relative_indices(positions.tolist(), bits)
    assert gaps.tolist() == want_gaps and is_filler.tolist() == want_fillers
    decoded = S.positions_from_gaps(gaps)
    assert torch.equal(decoded[~is_filler], positions)
    assert int(gaps.min()) >= 0 and int(gaps.max()) <= 2**bits - 1
    zeros = torch.diff(positions, prepend=torch.tensor([-1])) - 1
    assert int(is_filler.sum()) == int((zeros // 2**bits).sum())


def test_relative_indices_edge_cases_and_errors():
    gaps, is_filler = S.relative_indices([], 5)
    assert gaps.numel() == 0 and is_filler.numel() == 0
    assert S.relative_indices([0], 5)[0].tolist() == [0]     # the first gap counts from position 0
    for bad in ([3, 3], [5, 2], [-1, 4]):
        with pytest.raises(ValueError, match="strictly increasing"):
            S.relative_indices(bad, 5)
    for bits in (0, 17, 2.0, True):
        with pytest.raises(ValueError, match="bits"):
            S.relative_indices([1], bits)


def shared_layer(shape=(30, 40), k=13, density=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(shape, generator=g)
    mask = (torch.rand(shape, generator=g) < density).float()
    centroids, indices = kmeans_quantize(weight, k, iters=10, mask=mask)
    return centroids, indices, torch.randn(shape[0], generator=g)


@pytest.mark.parametrize("shape, k, bits, index_bits, density", [
    ((30, 40), 13, 4, 3, 0.1), ((300, 784), 63, 6, 5, 0.08), ((20, 1, 5, 5), 255, 8, 5, 0.66),
    ((50, 20, 5, 5), 200, 8, 8, 0.12), ((10, 50), 1, 1, 2, 0.3)])
def test_layer_round_trip_is_exact(shape, k, bits, index_bits, density):
    centroids, indices, bias = shared_layer(shape, k, density)
    layer = S.compress_layer(centroids, indices, bias, bits, index_bits)
    weight, got_bias = S.decompress_layer(layer)
    assert torch.equal(weight, reconstruct(centroids, indices)) and torch.equal(got_bias, bias)
    assert layer.nonzero == int((indices >= 0).sum()) and layer.shape == shape
    assert layer.codebook.shape == (2**bits,) and layer.codebook[0] == 0


def test_layer_bits_add_up():
    centroids, indices, bias = shared_layer((300, 784), 63, 0.08)
    layer = S.compress_layer(centroids, indices, bias, 6, 5)
    b = S.layer_bits(layer)
    codes, gaps = H.decode(layer.codes), H.decode(layer.gaps)
    assert len(codes) == len(gaps) == b["entries"] == b["nonzero"] + b["fillers"]
    assert b["codes_fixed"] == 6 * b["entries"] and b["gaps_fixed"] == 5 * b["entries"]
    assert b["codes_huffman"] == layer.codes.nbits == sum(layer.codes.lengths[c] for c in codes)
    assert b["codes_huffman"] <= b["codes_fixed"] and b["gaps_huffman"] <= b["gaps_fixed"]   # fixed width is a prefix code
    assert b["codebook"] == 32 * 64 and b["bias"] == 32 * 300 and b["tables"] == 8 * (64 + 32)
    assert b["dense"] == 32 * (300 * 784 + 300)
    assert b["pq"] == b["codes_fixed"] + b["gaps_fixed"] + b["codebook"] + b["bias"] + b["count"]
    assert b["pqh"] == b["codes_huffman"] + b["gaps_huffman"] + b["tables"] + b["codebook"] + b["bias"] + b["count"]
    fillers = sum(1 for c in codes if c == 0)                  # code 0 is a stored zero: only fillers use it
    assert fillers == b["fillers"]
    assert math.isclose(b["codes_huffman"] / b["entries"], H.expected_length(Counter(codes), layer.codes.lengths))


def test_total_bits_and_ratios():
    layers = [S.compress_layer(*shared_layer((30, 40), 13, 0.1, seed), 4, 3) for seed in range(3)]
    per_layer = {f"l{i}": S.layer_bits(layer) for i, layer in enumerate(layers)}
    total = S.total_bits(per_layer, other_bits=320)
    assert total["pqh"] == sum(b["pqh"] for b in per_layer.values()) + 320
    assert total["ratio_pqh"] == total["dense"] / total["pqh"]
    unshared = total["bias"] + 320
    assert total["weights_ratio_pq"] == (total["dense"] - unshared) / (total["pq"] - unshared)
    with pytest.raises(ValueError):
        S.total_bits({})


def test_compress_layer_refuses_bad_input():
    centroids, indices, bias = shared_layer((30, 40), 13, 0.1)
    with pytest.raises(ValueError, match="reserved for 0.0"):
        S.compress_layer(centroids, indices, bias, 3, 3)              # 13 centroids need 4 bits (15 codes)
    with pytest.raises(ValueError, match="no non-zero"):
        S.compress_layer(centroids, torch.full_like(indices, -1), bias, 4, 3)
    with pytest.raises(ValueError, match="cluster index"):
        S.compress_layer(centroids, indices + 20, bias, 4, 3)
    with pytest.raises(ValueError, match="index_bits"):
        S.compress_layer(centroids, indices, bias, 4, 0)
