"""Weight sharing by k-means (Deep Compression, Han et al. 2016, section 3).

A layer's weights are clustered into k shared values: the layer then stores a codebook of k
floats and, per weight, a log2(k)-bit index into it. Centroids start evenly spaced between the
smallest and largest weight ("linear initialisation": the paper found it keeps the rare large
weights, which matter most, better than random or density-based starts), then Lloyd's algorithm
moves each to the mean of its cluster. Fine-tuning trains the codebook: the gradient of a
centroid is the sum of the gradients of the weights that share it (`centroid_gradients`);
autograd through `centroids[indices]` computes exactly that.

    centroids, indices = kmeans_quantize(layer.weight, k=16)      # 4-bit indices
    shared = share_weights(model, bits=4)                           # every Linear/Conv2d
    fit(shared, train_loader, epochs=1)                             # trains the centroids only
    codebook_bits(shared)                                           # what it costs to store
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..validate import int_in_range, non_negative_int, positive_int

SHAREABLE = (nn.Linear, nn.Conv2d)


def linear_init(weight: torch.Tensor, k: int) -> torch.Tensor:
    """k centroids evenly spaced over [min(weight), max(weight)] (float32 [k]): deterministic."""
    w = weight.detach().float()
    return torch.linspace(w.min().item(), w.max().item(), k, device=w.device)


def assign(weight: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Index (int64, shape of weight) of the nearest of the sorted `centroids` for every weight.

    Nearest in 1-D means between the midpoints of neighbours: a binary search (bucketize), so
    memory stays O(n) even for k = 65536, where an [n, k] distance matrix would not fit.
    """
    midpoints = (centroids[1:] + centroids[:-1]) / 2
    return torch.bucketize(weight.detach().float(), midpoints)


def _check(weight, k, iters, mask):
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"weight must be a floating-point torch.Tensor; got {type(weight).__name__}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape != weight.shape):
        raise ValueError(f"mask must be None or a tensor of the weight's shape {tuple(weight.shape)}")
    values = weight.detach().float()[mask.bool()] if mask is not None else weight.detach().float().reshape(-1)
    positive_int("k", k)
    if k > values.numel():
        raise ValueError(f"k must be at most the number of weights to cluster ({values.numel()}); got {k}")
    non_negative_int("iters", iters)
    return values


def kmeans_quantize(weight: torch.Tensor, k: int, iters: int = 30, mask: torch.Tensor | None = None):
    """Cluster the weights into k shared values: (centroids float32 [k] sorted, indices int64 shape of weight).

    iters: Lloyd iterations (stops early once no weight changes cluster); 0 keeps the linear
    initialisation. mask: cluster only where mask != 0 (the survivors of pruning); elsewhere
    indices are -1 and `reconstruct` gives 0. An empty cluster keeps its centroid.
    In 1-D each cluster is a run of the sorted weights, so one sort up front turns every Lloyd
    step into k binary searches and prefix-sum lookups: O(k log n) instead of O(n).
    """
    values = _check(weight, k, iters, mask)
    centroids = linear_init(values, k)
    ordered = values.sort().values
    prefix = torch.cat([ordered.new_zeros(1, dtype=torch.float64), ordered.double().cumsum(0)])
    edges = None
    for _ in range(iters):
        # run j = the weights closer to centroid j than to its neighbours (ties go to the lower one)
        cuts = torch.searchsorted(ordered, (centroids[1:] + centroids[:-1]) / 2, right=True)
        new_edges = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), len(ordered))])
        if edges is not None and torch.equal(new_edges, edges):
            break
        edges = new_edges
        counts = edges[1:] - edges[:-1]
        sums = prefix[edges[1:]] - prefix[edges[:-1]]
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1), centroids.double()).float().sort().values
    if mask is None:
        return centroids, assign(weight, centroids)
    indices = torch.full(weight.shape, -1, dtype=torch.int64, device=weight.device)
    indices[mask.bool()] = assign(values, centroids)
    return centroids, indices


def reconstruct(centroids: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The shared weight: centroids[indices], 0 where indices is -1 (pruned). Differentiable in centroids."""
    shared = centroids[indices.clamp(min=0)]
    return torch.where(indices >= 0, shared, torch.zeros((), dtype=shared.dtype, device=shared.device))


def centroid_gradients(weight_grad: torch.Tensor, indices: torch.Tensor, k: int) -> torch.Tensor:
    """Deep Compression's update rule: dL/dc_j = sum of dL/dw over the weights in cluster j.  [k]"""
    keep = indices >= 0
    return torch.zeros(k, dtype=weight_grad.dtype, device=weight_grad.device).index_add_(
        0, indices[keep], weight_grad[keep])


class SharedWeights(nn.Module):
    """A Linear or Conv2d whose weight is centroids[indices]: a trainable codebook [k] and a
    buffer of indices. The layer's own float weight is gone; its bias is kept, frozen."""

    def __init__(self, layer: nn.Module, k: int, iters: int = 30, mask: torch.Tensor | None = None):
        super().__init__()
        if type(layer) not in SHAREABLE:
            raise TypeError(f"layer must be one of {[c.__name__ for c in SHAREABLE]}; got {type(layer).__name__}")
        centroids, indices = kmeans_quantize(layer.weight, k, iters, mask)
        self.layer = copy.deepcopy(layer).requires_grad_(False)
        del self.layer.weight
        self.centroids = nn.Parameter(centroids)
        self.register_buffer("indices", indices)

    @property
    def k(self) -> int:
        return self.centroids.numel()

    def weight(self) -> torch.Tensor:
        return reconstruct(self.centroids, self.indices)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.layer, nn.Conv2d):
            return self.layer._conv_forward(x, self.weight(), self.layer.bias)
        return F.linear(x, self.weight(), self.layer.bias)

    def extra_repr(self) -> str:
        return f"k={self.k} ({math.ceil(math.log2(self.k)) if self.k > 1 else 0}-bit indices)"


def share_weights(model: nn.Module, bits: int = 5, iters: int = 30, masks: dict | None = None) -> nn.Module:
    """A copy of `model` with every Linear/Conv2d weight shared among k = 2**bits centroids.

    Only the centroids require grad afterwards (biases and other layers are frozen), so fitting
    the result is the paper's centroid fine-tuning. masks: layer name -> 0/1 mask (from pruning).
    """
    int_in_range("bits", bits, 1, 16, hint=" (k = 2**bits clusters)")
    masks = masks or {}
    model = copy.deepcopy(model).requires_grad_(False)
    names = [name for name, m in model.named_modules() if type(m) in SHAREABLE]
    if not names:
        raise ValueError(f"model ({type(model).__name__}) has no Linear or Conv2d layer to share")
    unknown = sorted(set(masks) - set(names))
    if unknown:
        raise ValueError(f"masks must name Linear/Conv2d layers of the model, some of {names}; got {unknown}")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = getattr(parent, child)
        mask = masks.get(name)
        setattr(parent, child, SharedWeights(layer, 2**bits, iters, None if mask is None else mask.to(layer.weight.device)))
    return model


def codebook_bits(model: nn.Module) -> dict:
    """Storage of the shared layers in bits: "indices" (ceil(log2 k) per stored weight),
    "codebook" (32 per centroid) and "total". Pruned weights (index -1) are not counted here:
    where they sit is the sparse format's business (lecture 14)."""
    layers = [m for m in model.modules() if isinstance(m, SharedWeights)]
    if not layers:
        raise ValueError("model has no SharedWeights layers: build it with share_weights() first")
    index_bits = sum(int((m.indices >= 0).sum()) * math.ceil(math.log2(m.k)) for m in layers)
    codebook = sum(32 * m.k for m in layers)
    return {"indices": index_bits, "codebook": codebook, "total": index_bits + codebook}
