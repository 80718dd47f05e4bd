"""2:4 semi-structured sparsity: the one sparsity pattern GPU tensor cores accelerate.

In every group of 4 consecutive weights along the *input* dimension (the reduction dimension of the matmul),
keep the 2 of largest magnitude: along in_features for a Linear weight [out, in]; along in_channels for a
conv weight [out, c_in, kh, kw], at each (out, kh, kw). A convolution runs on tensor cores as an implicit
GEMM over channels-last (NHWC) data, where the reduction dimension is (kh, kw, c_in) with channels fastest,
so 4 consecutive values are 4 input channels; NVIDIA's ASP (apex.contrib.sparsity, `create_mask`) permutes a
conv weight the same way, to groups of 4 input channels, for its 2:4 mask. Half the weights go, but every
group of 4 keeps exactly 2, so the matrix can be stored as a dense half-width matrix of values plus a 2-bit
index per kept value (which of the 4 positions it came from). NVIDIA's sparse tensor cores (Ampere A100 and
later) read those indices to pick the matching activations and skip the zeros: up to 2x the dense math peak
(Mishra et al., "Accelerating Sparse Deep Neural Networks", arXiv:2104.08378, 2021).
Unstructured 50% sparsity has no such hardware path.

    mask = nm_mask(weight)                    # bool, exactly 2 of every 4 kept
    masks = semi_structured_prune(model)      # in place; keep them with pruning.masked_fit
    storage_bytes(weight)                     # dense vs 2:4 (values + metadata) vs CSR / bitmask

Generalised to N:M (keep N of every M); ties go to the lower index within a group. A weight whose
input dim is not a multiple of m is refused with a ValueError (ASP's mask function pads it with zeros
instead); `eligible_layers` leaves such layers dense, e.g. a first conv on 1-channel images.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
from torch import nn

from ..validate import float_tensor, one_of, positive_int
from .measure import csr_bytes
from .pruning import apply_masks, magnitude_mask, prunable_layers

VALUE_BITS = (16, 32)     # fp16/bf16 or fp32 values
INDEX_BYTES = 4           # CSR column indices and row pointers as int32


def _check_nm(n, m) -> None:
    positive_int("n", n)
    positive_int("m", m)
    if n >= m:
        raise ValueError(f"n must be smaller than m (keep n of every m weights; 2:4 is n=2, m=4); got n={n}, m={m}")


def as_matrix(weight: torch.Tensor, m: int = 4) -> torch.Tensor:
    """`weight` as [rows, reduction] with the groups of m along each row: a Linear's [out, in] as it is, a conv's
    [out, c_in, kh, kw] as [out*kh*kw, c_in] (channels last: permute (0, 2, 3, 1)), a vector as one row.

    TypeError for a non-float tensor; ValueError when the grouped dim (in, or c_in) is not a multiple of m.
    """
    float_tensor("weight", weight)
    if weight.dim() == 0:
        raise ValueError("weight must have at least 1 dimension; got a scalar")
    matrix = weight.detach().reshape(1, -1) if weight.dim() == 1 else weight.detach().movedim(1, -1)
    matrix = matrix.reshape(-1, matrix.shape[-1])
    if matrix.shape[1] % m:
        raise ValueError(f"weight's input dimension (in_features; in_channels for a conv) must be a multiple of "
                         f"m={m}; got {matrix.shape[1]} (shape {tuple(weight.shape)})")
    return matrix


def nm_mask(weight: torch.Tensor, n: int = 2, m: int = 4) -> torch.Tensor:
    """Bool mask (weight's shape): in every m consecutive weights along the input dim, the n largest |w|.

    The input dim: in_features of a Linear [out, in]; in_channels of a conv [out, c_in, kh, kw], whose
    groups are 4 input channels at one (out, kh, kw) (`as_matrix`). Ties go to the lower index: a stable
    descending sort keeps equal values in their original order, so four equal weights keep positions 0
    and 1 (torch.topk gives no such promise).
    """
    _check_nm(n, m)
    matrix = as_matrix(weight, m)
    if not bool(torch.isfinite(matrix).all()):
        raise ValueError("weight must be finite: NaN/inf have no magnitude order")
    groups = matrix.abs().reshape(-1, m)                               # [rows * in/m, m]
    order = torch.sort(groups, dim=1, descending=True, stable=True).indices
    mask = torch.zeros_like(groups, dtype=torch.bool)
    mask.scatter_(1, order[:, :n], True)
    if weight.dim() <= 2:
        return mask.reshape(weight.shape)
    channels_last = weight.movedim(1, -1).shape                        # [out, kh, kw, c_in]
    return mask.reshape(channels_last).movedim(-1, 1)


def is_nm_sparse(weight: torch.Tensor, n: int = 2, m: int = 4) -> bool:
    """True if every group of m consecutive weights along the input dim (`as_matrix`) has at most n non-zeros."""
    _check_nm(n, m)
    return bool((as_matrix(weight, m).reshape(-1, m) != 0).sum(dim=1).le(n).all())


def eligible_layers(model: nn.Module, m: int = 4, layers=None) -> dict:
    """name -> Linear/Conv2d whose input dim (in_features; in_channels per conv group) is a multiple of m.

    layers=None picks every eligible layer (a 1-channel conv cannot be 2:4); named layers must all be eligible.
    """
    found = prunable_layers(model, layers)
    fits = {name: mod for name, mod in found.items() if mod.weight.shape[1] % m == 0}
    if layers is not None and len(fits) < len(found):
        bad = {name: mod.weight.shape[1] for name, mod in found.items() if name not in fits}
        raise ValueError(f"layers must have an input dimension (in_features, or in_channels) that is a multiple of "
                         f"m={m}; got {bad}")
    if not fits:
        raise ValueError(f"model ({type(model).__name__}) has no Linear/Conv2d with an input dim divisible by m={m}")
    return fits


def semi_structured_prune(model: nn.Module, n: int = 2, m: int = 4, layers=None) -> dict:
    """Prune the (eligible) layers to N:M in place; returns name -> 0/1 mask in the weight's dtype.

    The masks are `pruning`'s kind: `pruning.masked_fit(model, masks, ...)` fine-tunes with them held.
    """
    _check_nm(n, m)
    masks = {name: nm_mask(mod.weight, n, m).to(mod.weight.dtype)
             for name, mod in eligible_layers(model, m, layers).items()}
    apply_masks(model, masks)
    return masks


# --- storage ---------------------------------------------------------------------------------------

def storage_bytes(weight: torch.Tensor, n: int = 2, m: int = 4, value_bits: int = 16) -> dict:
    """Bytes of one weight matrix at the same sparsity 1 - n/m, stored four ways (values in value_bits):

    - "dense": every value;
    - "nm": the kept values (n of every m) + "nm_metadata": ceil(log2 m) bits per kept value, the
      position in its group (2 bits for 2:4: NVIDIA's sparse tensor core metadata);
    - "csr": unstructured magnitude pruning to the same count in CSR (value + int32 column index
      per non-zero, int32 row pointers), counted by torch's own CSR tensor (`measure.csr_bytes`);
    - "bitmask": the same non-zeros + one bit per position saying whether it is kept.
    """
    _check_nm(n, m)
    one_of("value_bits", value_bits, VALUE_BITS)
    matrix = as_matrix(weight, m)
    numel = matrix.numel()
    kept = numel // m * n
    nm_values = kept * value_bits // 8
    nm_metadata = math.ceil(kept * math.ceil(math.log2(m)) / 8)
    dtype = torch.float16 if value_bits == 16 else torch.float32
    unstructured = matrix * magnitude_mask(matrix, 1 - kept / numel)
    return {"dense": numel * value_bits // 8, "nm": nm_values + nm_metadata, "nm_values": nm_values,
            "nm_metadata": nm_metadata, "csr": csr_bytes(unstructured.to(dtype), torch.int32),
            "bitmask": kept * value_bits // 8 + math.ceil(numel / 8)}


# --- the GPU's speed (needs CUDA, compute capability >= 8.0) ----------------------------------------

def gpu_matmul_times(out_features: int = 8192, in_features: int = 8192, batch: int = 4096,
                     repeats: int = 20) -> dict:
    """Median ms of fp16 F.linear(x, W) with W dense vs W in torch.sparse.to_sparse_semi_structured.

    Raises RuntimeError without an Ampere-or-later CUDA GPU (the CPU has no 2:4 kernel at all).
    Returns dense_ms, sparse_ms, speedup and max_abs_diff of the two outputs.
    """
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        raise RuntimeError("2:4 sparse matmul needs a CUDA GPU with compute capability >= 8.0 (Ampere or later)")
    from torch.sparse import to_sparse_semi_structured

    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(out_features, in_features, device="cuda", dtype=torch.float16, generator=g)
    w = w * nm_mask(w)
    x = torch.randn(batch, in_features, device="cuda", dtype=torch.float16, generator=g)
    w_sparse = to_sparse_semi_structured(w)
    runs = {"dense": lambda: nn.functional.linear(x, w), "sparse": lambda: nn.functional.linear(x, w_sparse)}
    times = {name: [] for name in runs}
    for i in range(repeats + 3):                       # 3 warm-up rounds, then interleaved timing
        for name, run in runs.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run()
            torch.cuda.synchronize()
            if i >= 3:
                times[name].append(1e3 * (time.perf_counter() - t0))
    dense_ms, sparse_ms = statistics.median(times["dense"]), statistics.median(times["sparse"])
    diff = float((runs["dense"]() - runs["sparse"]()).abs().max())
    return {"dense_ms": dense_ms, "sparse_ms": sparse_ms, "speedup": dense_ms / sparse_ms, "max_abs_diff": diff}
