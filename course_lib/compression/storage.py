"""Deep Compression's storage format, and what it costs in bits (Han et al. 2016, section 2, Tables 2-3).

A pruned, weight-shared layer keeps one *entry* per non-zero weight, in row-major order of its
weight tensor, stored as two streams of equal length:
- codes: the weight's codebook index in `weight_bits` bits. Code 0 stands for the value 0.0 (as in
  Han's released decoder, decode.py, where pruned positions read codebook[0]); codes 1..2**b - 1
  are the trained centroids, so a layer shares at most 2**b - 1 non-zero values;
- gaps: the *relative index*, the number of zeros skipped since the previous entry (the first
  counted from position 0), in `index_bits` bits, so at most 2**index_bits - 1. A longer run of
  zeros gets a *filler*: an entry with the largest gap and code 0, a stored zero that costs one
  slot in both streams (the paper's Figure 2).
Plus the codebook (2**b float32 values, entry 0 included), the bias (float32), and a 32-bit count
of entries. With Huffman coding each stream is replaced by its Huffman code (`huffman.encode`) and
its table: one 8-bit code length per symbol of the alphabet (a canonical code needs nothing else).

    gaps, is_filler = relative_indices(positions, bits=5)
    layer = compress_layer(centroids, indices, bias, weight_bits=6, index_bits=5)
    weight, bias = decompress_layer(layer)      # from the encoded bytes alone
    layer_bits(layer)                           # the accounting, fixed-width and Huffman-coded
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..validate import positive_int
from . import huffman

FLOAT_BITS = 32          # codebook entries and biases are float32
COUNT_BITS = 32          # the number of entries of a layer
TABLE_BITS_PER_SYMBOL = 8   # a Huffman table: one code length per symbol of the alphabet


def _bits(name: str, value) -> int:
    positive_int(name, value)
    if value > 16:
        raise ValueError(f"{name} must be at most 16 (symbols of up to 16 bits); got {value}")
    return value


def relative_indices(positions, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(gaps int64 [E], is_filler bool [E]) for strictly increasing flat `positions` [N] of the
    non-zero entries, E = N + fillers. gap = zeros skipped since the previous entry (the first
    from position 0), at most 2**bits - 1; a run of z zeros needs z // 2**bits fillers.
    """
    _bits("bits", bits)
    pos = torch.as_tensor(positions, dtype=torch.int64).reshape(-1).cpu()
    if len(pos) and (pos[0] < 0 or bool((pos[1:] <= pos[:-1]).any())):
        raise ValueError("positions must be non-negative and strictly increasing (flat indices of the non-zeros)")
    span = 2**bits                       # a filler skips span - 1 zeros and sits on the next one
    zeros = torch.diff(pos, prepend=pos.new_tensor([-1])) - 1
    fillers = zeros // span
    real = (fillers + 1).cumsum(0) - 1   # where each non-zero lands in the stream, after its fillers
    total = int(real[-1]) + 1 if len(pos) else 0
    gaps = torch.full((total,), span - 1, dtype=torch.int64)
    gaps[real] = zeros - fillers * span
    is_filler = torch.ones(total, dtype=torch.bool)
    is_filler[real] = False
    return gaps, is_filler


def positions_from_gaps(gaps) -> torch.Tensor:
    """Flat position of every entry (fillers included): the running sum of gap + 1, minus 1."""
    gaps = torch.as_tensor(gaps, dtype=torch.int64).reshape(-1)
    return (gaps + 1).cumsum(0) - 1


@dataclass(frozen=True)
class CompressedLayer:
    """One layer as stored: shape, bit widths, codebook [2**weight_bits] (entry 0 is 0.0), bias,
    and the two Huffman-coded streams (`codes`, `gaps`) of `entries` = nonzero + fillers symbols."""

    shape: tuple
    weight_bits: int
    index_bits: int
    codebook: torch.Tensor
    bias: torch.Tensor | None
    nonzero: int
    fillers: int
    codes: huffman.HuffmanStream
    gaps: huffman.HuffmanStream

    @property
    def entries(self) -> int:
        return self.nonzero + self.fillers

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())


def compress_layer(centroids: torch.Tensor, indices: torch.Tensor, bias: torch.Tensor | None,
                   weight_bits: int, index_bits: int) -> CompressedLayer:
    """Store a shared layer: centroids [k] (k <= 2**weight_bits - 1), indices (weight's shape,
    int64 cluster index or -1 where pruned, as `kmeans.kmeans_quantize` returns), bias [out] or None.
    """
    _bits("weight_bits", weight_bits)
    _bits("index_bits", index_bits)
    k = centroids.numel()
    if not 1 <= k <= 2**weight_bits - 1:
        raise ValueError(f"centroids must hold 1 to 2**weight_bits - 1 = {2**weight_bits - 1} values (code 0 is "
                         f"reserved for 0.0); got {k}")
    flat = indices.detach().reshape(-1).cpu()
    if flat.numel() and (int(flat.min()) < -1 or int(flat.max()) >= k):
        raise ValueError(f"indices must be -1 (pruned) or a cluster index in 0..{k - 1}")
    positions = (flat >= 0).nonzero().flatten()
    if not len(positions):
        raise ValueError("the layer has no non-zero weight to store: prune less")
    gaps, is_filler = relative_indices(positions, index_bits)
    codes = torch.zeros(len(gaps), dtype=torch.int64)
    codes[~is_filler] = flat[positions] + 1
    codebook = torch.cat([centroids.new_zeros(1), centroids.detach()]).float().cpu()
    codebook = torch.cat([codebook, codebook.new_zeros(2**weight_bits - len(codebook))])
    return CompressedLayer(tuple(indices.shape), weight_bits, index_bits, codebook,
                           None if bias is None else bias.detach().float().cpu().clone(),
                           len(positions), int(is_filler.sum()), huffman.encode(codes.tolist()),
                           huffman.encode(gaps.tolist()))


def decompress_layer(layer: CompressedLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) rebuilt from the encoded bytes alone: decode both streams, place each code's
    value at its position (fillers place a 0.0), zeros elsewhere."""
    codes = torch.tensor(huffman.decode(layer.codes), dtype=torch.int64)
    positions = positions_from_gaps(huffman.decode(layer.gaps))
    weight = torch.zeros(layer.numel)
    weight[positions] = layer.codebook[codes]
    bias = None if layer.bias is None else layer.bias.clone()
    return weight.reshape(layer.shape), bias


def layer_bits(layer: CompressedLayer) -> dict:
    """The storage of one layer in bits, every part counted.

    Keys: weights, nonzero, fillers, entries (counts); codes_fixed / gaps_fixed (entries x b bits),
    codes_huffman / gaps_huffman (the encoded streams), tables (Huffman tables), codebook, bias,
    count; dense (32-bit weights and bias); pq = pruning + quantization, fixed-width streams;
    pqh = with Huffman coding (tables included).
    """
    bias = 0 if layer.bias is None else FLOAT_BITS * layer.bias.numel()
    out = {"weights": layer.numel, "nonzero": layer.nonzero, "fillers": layer.fillers, "entries": layer.entries,
           "codes_fixed": layer.entries * layer.weight_bits, "gaps_fixed": layer.entries * layer.index_bits,
           "codes_huffman": layer.codes.nbits, "gaps_huffman": layer.gaps.nbits,
           "tables": TABLE_BITS_PER_SYMBOL * (2**layer.weight_bits + 2**layer.index_bits),
           "codebook": FLOAT_BITS * len(layer.codebook), "bias": bias, "count": COUNT_BITS,
           "dense": FLOAT_BITS * layer.numel + bias}
    shared = out["codebook"] + out["bias"] + out["count"]
    out["pq"] = out["codes_fixed"] + out["gaps_fixed"] + shared
    out["pqh"] = out["codes_huffman"] + out["gaps_huffman"] + out["tables"] + shared
    return out


def total_bits(per_layer: dict, other_bits: int = 0) -> dict:
    """Sum of `layer_bits` dicts over layers (name -> dict); `other_bits` (parameters stored as they
    are, e.g. 32 x a BatchNorm's) is added to dense, pq and pqh alike. Adds the ratios dense /
    compressed: "ratio_pq", "ratio_pqh" for the whole model, and "weights_ratio_pq",
    "weights_ratio_pqh" for the weights alone, biases and other parameters left out on both sides,
    as Deep Compression's Tables 2-3 count (their rates are per weight)."""
    if not per_layer:
        raise ValueError("per_layer must hold at least one layer's bits")
    total = {key: sum(bits[key] for bits in per_layer.values()) for key in next(iter(per_layer.values()))}
    for key in ("dense", "pq", "pqh"):
        total[key] += other_bits
    total["other"] = other_bits
    unshared = total["bias"] + other_bits
    for key in ("pq", "pqh"):
        total[f"ratio_{key}"] = total["dense"] / total[key]
        total[f"weights_ratio_{key}"] = (total["dense"] - unshared) / (total[key] - unshared)
    return total
