"""Deep Compression end to end: prune, share weights, Huffman-code, and count every bit.

    train(model, train_loader, epochs=15)                  # Adam, lr annealed to 0: the baseline
    result = deep_compress(model, train_loader, test_loader, **paper_config("lenet300"))
    result.ratio, result.compressed_accuracy, result.bits["fc1"], result.total
    print(format_table(paper_rows({"lenet300": result})))      # course_lib.bench.format_table

1. Prune: each layer to its own kept fraction (Han et al. 2015's), in `prune_rounds` steps on a
   geometric schedule (keep**(r/R) after round r), retraining with the masks held after each step.
2. Share weights: each layer's survivors become 2**b - 1 shared values (k-means, linear init);
   code 0 is the storage format's 0.0 (`storage`). Only the centroids are fine-tuned.
3. Encode every layer (`storage.compress_layer`: relative indices with fillers, Huffman-coded
   streams), decode the bytes into a plain model, and measure *that* model's accuracy.

The paper's figures live in PAPER with their sources; ours are computed from the real bit counts.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ..loop import evaluate, fit
from ..validate import positive_int
from . import storage
from .kmeans import SharedWeights
from .pruning import apply_masks, magnitude_mask, masked_fit, prunable_layers

HAN_2016 = "Han, Mao & Dally, Deep Compression, ICLR 2016 (arXiv:1510.00149v5)"
HAN_2015 = "Han, Pool, Tran & Dally, Learning both Weights and Connections, NIPS 2015 (arXiv:1506.02626)"


class PaperLayer(NamedTuple):
    """One row of Deep Compression's Table 2 or 3 (rates as fractions of the dense 32-bit size)."""

    paper_name: str
    weights: str
    kept: float
    weight_bits: int
    weight_bits_huffman: float
    index_bits: int
    index_bits_huffman: float
    rate_pq: float
    rate_pqh: float


PAPER = {
    "lenet300": {
        "title": "LeNet-300-100",
        "table1": {"error_ref": 1.64, "error_compressed": 1.58, "kb_ref": 1070, "kb_compressed": 27, "ratio": 40,
                   "source": f"{HAN_2016}, Table 1"},
        "pruning": {"error_ref": 1.64, "error_pruned": 1.59, "params_ref": "267K", "params_pruned": "22K",
                    "ratio": 12, "source": f"{HAN_2015}, Table 1"},
        "layers": {"fc1": PaperLayer("ip1", "235K", 0.08, 6, 4.4, 5, 3.7, 0.031, 0.0232),
                   "fc2": PaperLayer("ip2", "30K", 0.09, 6, 4.4, 5, 4.3, 0.038, 0.0304),
                   "fc3": PaperLayer("ip3", "1K", 0.26, 6, 4.3, 5, 3.2, 0.157, 0.127),
                   "total": PaperLayer("total", "266K", 0.08, 6, 5.1, 5, 3.7, 0.031, 0.0249)},
        "ratio_pq": 32, "layers_source": f"{HAN_2016}, Table 2",
    },
    "lenet5": {
        "title": "LeNet-5",
        "table1": {"error_ref": 0.80, "error_compressed": 0.74, "kb_ref": 1720, "kb_compressed": 44, "ratio": 39,
                   "source": f"{HAN_2016}, Table 1"},
        "pruning": {"error_ref": 0.80, "error_pruned": 0.77, "params_ref": "431K", "params_pruned": "36K",
                    "ratio": 12, "source": f"{HAN_2015}, Table 1"},
        "layers": {"conv1": PaperLayer("conv1", "0.5K", 0.66, 8, 7.2, 5, 1.5, 0.785, 0.6745),
                   "conv2": PaperLayer("conv2", "25K", 0.12, 8, 7.2, 5, 3.9, 0.060, 0.0528),
                   "fc1": PaperLayer("ip1", "400K", 0.08, 5, 4.5, 5, 4.5, 0.027, 0.0245),
                   "fc2": PaperLayer("ip2", "5K", 0.19, 5, 5.2, 5, 3.7, 0.069, 0.0613),
                   "total": PaperLayer("total", "431K", 0.08, 5.3, 4.1, 5, 4.4, 0.0305, 0.0255)},
        "ratio_pq": 33, "layers_source": f"{HAN_2016}, Table 3",
    },
}
# Index bits: Tables 2-3 list 5 bits for every LeNet layer, conv included, while section 2 says
# "8 bits for conv layer and 5 bits for fc layer" (and 5.2 uses 4 bits for AlexNet). We follow the tables.


def paper_config(name: str) -> dict:
    """keep / weight_bits / index_bits per layer as in the paper's Table 2 ("lenet300") or 3 ("lenet5")."""
    if name not in PAPER:
        raise ValueError(f"name must be one of {sorted(PAPER)}; got {name!r}")
    layers = {k: v for k, v in PAPER[name]["layers"].items() if k != "total"}
    return {"keep": {k: v.kept for k, v in layers.items()},
            "weight_bits": {k: v.weight_bits for k, v in layers.items()},
            "index_bits": {k: v.index_bits for k, v in layers.items()}}


@dataclass
class DeepCompressionResult:
    """What `deep_compress` measured. Accuracies are fractions on the validation loader; `model` is
    decoded from the stored bytes; `bits[layer]` is `storage.layer_bits`; `total` sums them plus
    any parameter outside the compressed layers (at 32 bits on both sides)."""

    keep: dict
    weight_bits: dict
    index_bits: dict
    baseline_accuracy: float
    pruned_accuracy: float
    quantized_accuracy: float     # right after k-means, before the centroids are fine-tuned
    shared_accuracy: float
    compressed_accuracy: float    # the decoded model
    rounds: list
    pruned: nn.Module
    shared: nn.Module
    model: nn.Module
    layers: dict
    bits: dict
    total: dict

    @property
    def ratio(self) -> float:
        """Dense / compressed size of the weights, as the paper counts (biases left out on both sides)."""
        return self.total["weights_ratio_pqh"]

    @property
    def file_ratio(self) -> float:
        """Dense / compressed size of the whole model, 32-bit biases counted on both sides."""
        return self.total["ratio_pqh"]

    @property
    def kept(self) -> float:
        """Fraction of the compressed layers' weights that survived pruning."""
        return self.total["nonzero"] / self.total["weights"]


def _check_config(model, keep, weight_bits, index_bits) -> dict:
    layers = prunable_layers(model)
    for arg, values in (("keep", keep), ("weight_bits", weight_bits), ("index_bits", index_bits)):
        if not isinstance(values, dict) or set(values) != set(layers):
            raise ValueError(f"{arg} must be a dict with one entry per Linear/Conv2d layer {list(layers)}; "
                             f"got {values!r}")
    bad = {name: k for name, k in keep.items() if not 0 < k <= 1}
    if bad:
        raise ValueError(f"keep must hold fractions in (0, 1] (the share of weights that stays); got {bad}")
    return layers


def share_layers(model: nn.Module, masks: dict, weight_bits: dict, iters: int = 30) -> nn.Module:
    """A copy of `model` whose pruned layers are SharedWeights with min(2**b - 1, survivors) centroids
    (code 0 is kept for 0.0). Only the centroids require grad."""
    shared = copy.deepcopy(model).requires_grad_(False)
    for name, mask in masks.items():
        layer = shared.get_submodule(name)
        k = min(2 ** weight_bits[name] - 1, int(mask.count_nonzero()))
        parent, _, child = name.rpartition(".")
        setattr(shared.get_submodule(parent) if parent else shared, child, SharedWeights(layer, k, iters, mask))
    return shared


def compress_model(shared: nn.Module, weight_bits: dict, index_bits: dict) -> dict:
    """name -> storage.CompressedLayer for every SharedWeights layer named in weight_bits."""
    layers = {name: shared.get_submodule(name) for name in weight_bits}
    return {name: storage.compress_layer(m.centroids, m.indices, m.layer.bias, weight_bits[name], index_bits[name])
            for name, m in layers.items()}


@torch.no_grad()
def decompress_model(template: nn.Module, layers: dict) -> nn.Module:
    """A copy of `template` (same architecture, plain layers) with weights and biases decoded from `layers`."""
    model = copy.deepcopy(template)
    for name, layer in layers.items():
        weight, bias = storage.decompress_layer(layer)
        target = model.get_submodule(name)
        target.weight.copy_(weight)
        if bias is not None:
            target.bias.copy_(bias)
    return model


def train(model: nn.Module, train_loader, epochs: int, lr: float = 1e-3, masks: dict | None = None):
    """Adam on the parameters that require grad, the lr annealed to 0 (cosine) over `epochs`, so that
    every stage ends settled; with `masks` (layer name -> 0/1) the masks are held (`masked_fit`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    steps = max(1, epochs * len(train_loader))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    kwargs = dict(epochs=epochs, optimizer=optimizer, scheduler=scheduler, progress=False, log=None)
    if masks is None:
        return fit(model, train_loader, **kwargs)
    return masked_fit(model, masks, train_loader, **kwargs)


def deep_compress(model: nn.Module, train_loader, val_loader, keep: dict, weight_bits: dict, index_bits: dict,
                  prune_rounds: int = 3, prune_epochs: int = 2, share_epochs: int = 1, lr: float = 1e-3,
                  share_lr: float = 1e-3, kmeans_iters: int = 30, log=None) -> DeepCompressionResult:
    """Prune -> share -> Huffman a trained `model` (left untouched); every Linear/Conv2d layer must
    appear in keep / weight_bits / index_bits (dicts layer name -> value). Each stage retrains
    with `train`. log: a print-like function for one line per stage, or None."""
    layers = _check_config(model, keep, weight_bits, index_bits)
    positive_int("prune_rounds", prune_rounds)
    say = log or (lambda line: None)
    baseline = evaluate(model, val_loader)[1]
    say(f"baseline: {100 * baseline:.2f}%")
    pruned, rounds = copy.deepcopy(model), []
    for r in range(1, prune_rounds + 1):
        masks = {name: magnitude_mask(pruned.get_submodule(name).weight, 1 - keep[name] ** (r / prune_rounds))
                 for name in layers}
        apply_masks(pruned, masks)
        before = evaluate(pruned, val_loader)[1]
        train(pruned, train_loader, prune_epochs, lr, masks)
        rounds.append({"round": r, "kept": {n: float(m.mean()) for n, m in masks.items()},
                       "accuracy_pruned": before, "accuracy": evaluate(pruned, val_loader)[1]})
        say(f"prune round {r}/{prune_rounds}: {100 * before:.2f}% -> retrained {100 * rounds[-1]['accuracy']:.2f}%")
    shared = share_layers(pruned, masks, weight_bits, kmeans_iters)
    quantized = evaluate(shared, val_loader)[1]
    train(shared, train_loader, share_epochs, share_lr)          # only the centroids require grad
    shared_accuracy = evaluate(shared, val_loader)[1]
    say(f"weight sharing: {100 * quantized:.2f}% -> centroids fine-tuned {100 * shared_accuracy:.2f}%")
    encoded = compress_model(shared, weight_bits, index_bits)
    decoded = decompress_model(pruned, encoded).eval()
    compressed = evaluate(decoded, val_loader)[1]
    bits = {name: storage.layer_bits(layer) for name, layer in encoded.items()}
    stored = sum(p.numel() for name in layers for p in pruned.get_submodule(name).parameters())
    other = storage.FLOAT_BITS * (sum(p.numel() for p in pruned.parameters()) - stored)
    total = storage.total_bits(bits, other_bits=other)
    say(f"decoded model: {100 * compressed:.2f}%; weights {total['weights_ratio_pqh']:.1f}x smaller than dense fp32, "
        f"whole model {total['ratio_pqh']:.1f}x")
    return DeepCompressionResult(dict(keep), dict(weight_bits), dict(index_bits), baseline, rounds[-1]["accuracy"],
                                 quantized, shared_accuracy, compressed, rounds, pruned, shared, decoded,
                                 encoded, bits, total)


# --- side by side with the paper ------------------------------------------------------------------

def paper_rows(results: dict) -> list:
    """Rows (for bench.format_table) of Han et al. 2016 Table 1 and Han et al. 2015 Table 1 (pruning
    only), paper against ours, for `results` = {"lenet300" and/or "lenet5": DeepCompressionResult}.
    "ratio" counts the weights as the paper's Tables 2-3 do (biases left out on both sides);
    "file ratio" and "size" are the whole model, 32-bit biases included. KB = 1000 bytes, as the
    paper's 1070 KB = 266,610 parameters x 4 bytes."""
    rows = []
    for name, r in results.items():
        if name not in PAPER:
            raise ValueError(f"results must be keyed by {sorted(PAPER)}; got {name!r}")
        p, t = PAPER[name], r.total
        table1, pruning = p["table1"], p["pruning"]

        def row(stage, paper_error, error, paper_size, size, paper_ratio, ratio, file_ratio):
            return {"network": p["title"], "stage": stage, "error % paper": paper_error,
                    "error % ours": f"{100 * (1 - error):.2f}", "size paper": paper_size, "size ours": size,
                    "ratio paper": paper_ratio, "ratio ours": ratio, "file ratio ours": file_ratio}

        rows += [
            row("reference", f"{table1['error_ref']:.2f}", r.baseline_accuracy, f"{table1['kb_ref']} KB",
                f"{t['dense'] / 8000:.0f} KB", "-", "-", "-"),
            row("pruned (2015)", f"{pruning['error_pruned']:.2f}", r.pruned_accuracy,
                f"{pruning['params_pruned']} weights", f"{t['nonzero'] / 1000:.1f}K weights",
                f"{pruning['ratio']}x", f"{t['weights'] / t['nonzero']:.1f}x", "-"),
            row("pruned + shared", "-", r.shared_accuracy, "-", f"{t['pq'] / 8000:.1f} KB", f"{p['ratio_pq']}x",
                f"{t['weights_ratio_pq']:.1f}x", f"{t['ratio_pq']:.1f}x"),
            row("+ Huffman", f"{table1['error_compressed']:.2f}", r.compressed_accuracy,
                f"{table1['kb_compressed']} KB", f"{t['pqh'] / 8000:.1f} KB", f"{table1['ratio']}x",
                f"{r.ratio:.1f}x", f"{r.file_ratio:.1f}x"),
        ]
    return rows


def layer_rows(name: str, result: DeepCompressionResult) -> list:
    """Rows like the paper's Table 2/3 for one network, each cell "paper / ours"; our bits per entry
    count fillers as entries, our rates include codebook, bias, count and Huffman tables."""
    paper = PAPER[name]["layers"]
    rows = []
    for layer, b in list(result.bits.items()) + [("total", result.total)]:
        p = paper[layer]
        rows.append({
            "layer": layer, "weights": f"{b['weights']:,}",
            "kept % (P)": f"{100 * p.kept:.0f} / {100 * b['nonzero'] / b['weights']:.1f}",
            "fillers": f"{b['fillers']:,}",
            "weight bits (P+Q)": f"{p.weight_bits} / {b['codes_fixed'] / b['entries']:.1f}",
            "weight bits (P+Q+H)": f"{p.weight_bits_huffman} / {b['codes_huffman'] / b['entries']:.1f}",
            "index bits (P+Q)": f"{p.index_bits} / {b['gaps_fixed'] / b['entries']:.1f}",
            "index bits (P+Q+H)": f"{p.index_bits_huffman} / {b['gaps_huffman'] / b['entries']:.1f}",
            "rate % (P+Q)": f"{100 * p.rate_pq:.2f} / {100 * b['pq'] / b['dense']:.2f}",
            "rate % (P+Q+H)": f"{100 * p.rate_pqh:.2f} / {100 * b['pqh'] / b['dense']:.2f}",
        })
    return rows
