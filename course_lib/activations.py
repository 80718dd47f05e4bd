"""Activation memory: what autograd keeps for backward, formulas for it, and checkpointing that trades it for time.

Backward needs, for each op, some of the tensors its forward saw: Linear (addmm) and Conv2d save their
input, ReLU its output, max-pool its input and the argmax indices (int64), dropout its mask, GELU its
input, LayerNorm its input plus a mean and 1/std per row. Parameters are saved too, but they exist
anyway, so they are not counted. Those bytes grow with the batch and the depth; parameters do not.

    from course_lib import activations
    records = activations.saved_tensors(Net().train(), torch.randn(64, 1, 28, 28))   # per op, measured
    activations.net_activation_bytes(64)                                            # per layer, by formula
    activations.saved_bytes(blocks, x, mode="full")      # checkpointing: keep each block's input only

Checkpointing (torch.utils.checkpoint) keeps only a block's input and recomputes the block during
backward: about one extra forward. Selective checkpointing keeps the matmul outputs (expensive to
recompute) and recomputes the cheap element-wise ops around them (LayerNorm, GELU).

Attention written out keeps its [b, a, s, s] probabilities for backward; F.scaled_dot_product_attention's
fused kernels (FlashAttention) keep one number per row instead and recompute the rest in backward:

    activations.attention_saved(2, 4, 64, 16, impl="sdpa")      # measured: bytes, which kernel ran
    activations.transformer_activation_bytes(2048, 1, 4096, 32, 32, attention="sdpa")   # by formula
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .precision import saved_tensor_bytes
from .validate import one_of, positive_int

MODES = ("none", "selective", "full")
ATTENTION = ("eager", "sdpa")
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)


@dataclass
class SavedTensor:
    op: str            # the autograd node, e.g. "ConvolutionBackward0"
    what: str          # which of its tensors, e.g. "input", "result1" (max-pool's indices)
    shape: tuple
    dtype: torch.dtype
    bytes: int
    shared: bool       # the same tensor as one saved by an earlier op: memory counted once


def saved_tensors(model: nn.Module, x: torch.Tensor) -> list[SavedTensor]:
    """Run model(x) and list every non-parameter tensor autograd saved, in forward order.

    Walks the graph from the output and reads each node's `_saved_*` attributes: measured, not assumed.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    out = model(x)
    nodes, seen, stack = [], set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        stack += [fn for fn, _ in node.next_functions]
    records, ptrs = [], set()
    for node in sorted(nodes, key=lambda n: n._sequence_nr()):
        for attr in sorted(a for a in dir(node) if a.startswith("_saved_")):
            t = getattr(node, attr)
            if not isinstance(t, torch.Tensor) or t.untyped_storage().data_ptr() in params:
                continue
            key = t.untyped_storage().data_ptr()      # a view (flatten) shares its base's memory
            records.append(SavedTensor(node.name(), attr[len("_saved_"):], tuple(t.shape), t.dtype,
                                       t.numel() * t.element_size(), key in ptrs))
            ptrs.add(key)
    return records


def net_activation_bytes(batch: int) -> dict[str, int]:
    """The formula for models.Net in training mode: bytes saved for backward at `batch` images, by layer.

    fp32 activations (4 bytes), int64 max-pool indices (8). A tensor two layers share (a ReLU's output
    is the next layer's input) is counted once, at the first. Dropout2d's mask is one number per channel.
    """
    b, f, i = positive_int("batch", batch), 4, 8
    return {"conv1: input [B,1,28,28]": b * 1 * 28 * 28 * f,
            "max_pool 1: input [B,10,24,24] + indices [B,10,12,12]": b * 10 * 24 * 24 * f + b * 10 * 12 * 12 * i,
            "relu 1: output [B,10,12,12] (conv2's input)": b * 10 * 12 * 12 * f,
            "conv2_drop: channel mask [B,20,1,1]": b * 20 * f,
            "max_pool 2: input [B,20,8,8] + indices [B,20,4,4]": b * 20 * 8 * 8 * f + b * 20 * 4 * 4 * i,
            "relu 2: output [B,320] (fc1's input)": b * 320 * f,
            "relu 3: output [B,50]": b * 50 * f,
            "dropout: mask [B,50]": b * 50 * f,
            "fc2: input [B,50] (dropout's output)": b * 50 * f}


class Block(nn.Module):
    """A transformer's MLP block: x + Linear(GELU(Linear(LayerNorm(x)))), width w -> 4w -> w.  [B,w] -> [B,w]"""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def block_stack(width: int = 256, depth: int = 8) -> nn.Sequential:
    """`depth` Blocks of `width`: deep enough that activations, not parameters, dominate at large batch."""
    return nn.Sequential(*(Block(positive_int("width", width)) for _ in range(positive_int("depth", depth))))


def block_activation_bytes(batch: int, width: int, depth: int, mode: str = "none") -> int:
    """The formula for block_stack in fp32, per block (B = batch, w = width):

    none:      B·w (LayerNorm input) + 2B (mean, 1/std) + B·w (Linear input) + B·4w (GELU input)
               + B·4w (Linear input) = B(10w + 2) numbers
    selective: B·w (the block's input, kept by checkpoint) + B·4w + B·w (the two matmul outputs) = 6B·w
    full:      B·w, the block's input only
    """
    b, w, d = positive_int("batch", batch), positive_int("width", width), positive_int("depth", depth)
    per_block = {"none": b * (10 * w + 2), "selective": 6 * b * w, "full": b * w}[one_of("mode", mode, MODES)]
    return 4 * d * per_block


def save_matmuls(ctx, op, *args, **kwargs):
    """Selective checkpointing policy: keep matmul outputs, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(nn.Module):
    """Run a Sequential's children one by one, each checkpointed as `mode` says ("none", "selective", "full")."""

    def __init__(self, seq: nn.Sequential, mode: str = "full"):
        super().__init__()
        self.seq, self.mode = seq, one_of("mode", mode, MODES)

    def forward(self, x):
        for block in self.seq:
            if self.mode == "none":
                x = block(x)
            elif self.mode == "full":
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = checkpoint(block, x, use_reentrant=False, respect_saved_tensors_hooks=True,
                               context_fn=functools.partial(create_selective_checkpoint_contexts, save_matmuls))
        return x


def saved_bytes(seq: nn.Sequential, x: torch.Tensor, mode: str = "none") -> int:
    """Bytes autograd keeps for backward after one forward of `seq` checkpointed as `mode` (precision's hook)."""
    return saved_tensor_bytes(Checkpointed(seq, mode), x)


def gradients(seq: nn.Sequential, x: torch.Tensor, mode: str = "none") -> list[torch.Tensor]:
    """Parameter gradients of sum(seq(x)**2) under `mode`: checkpointing must not change them."""
    seq.zero_grad(set_to_none=True)
    Checkpointed(seq, mode)(x).pow(2).sum().backward()
    grads = [p.grad.clone() for p in seq.parameters()]
    seq.zero_grad(set_to_none=True)
    return grads


def step_seconds(seq: nn.Sequential, x: torch.Tensor, mode: str = "none", repeats: int = 3) -> float:
    """Median wall time (s) of forward + backward under `mode`, after one warm-up step."""
    import time

    positive_int("repeats", repeats)
    model, times = Checkpointed(seq, mode), []
    for i in range(repeats + 1):
        start = time.perf_counter()
        model(x).pow(2).sum().backward()
        times.append(time.perf_counter() - start)
    seq.zero_grad(set_to_none=True)
    return sorted(times[1:])[repeats // 2]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "eager") -> torch.Tensor:
    """softmax(q·kᵀ/√d)·v per head: q, k, v [b, a, s, d] -> [b, a, s, d].

    eager: written out, so autograd keeps the probabilities [b, a, s, s] for backward.
    sdpa:  F.scaled_dot_product_attention; its fused kernels (FlashAttention on GPUs, a flash kernel on
           the CPU) keep the output and one log-sum-exp per row [b, a, s], and rebuild the
           probabilities block by block in backward.
    """
    if one_of("impl", impl, ATTENTION) == "sdpa":
        return nn.functional.scaled_dot_product_attention(q, k, v)
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v


def attention_saved(batch: int, heads: int, seq_len: int, head_dim: int, impl: str = "eager",
                    dtype: torch.dtype = torch.bfloat16) -> dict:
    """Measured on the CPU: what autograd keeps for backward in one `attention` call.

    q, k, v [b, a, s, d] are random leaves that require grad (in a transformer: the QKV projection's
    output). Returns {"node": the output's autograd node, which names the kernel that ran,
    "saved": {name: bytes} per saved storage ("q", "k", "v", "output" or its shape and dtype),
    "bytes": their sum}. Views of one storage (matmul folds b and a together) count once.
    """
    shape = [positive_int(n, x) for n, x in (("batch", batch), ("heads", heads), ("seq_len", seq_len),
                                              ("head_dim", head_dim))]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g).to(dtype).requires_grad_() for _ in range(3))
    saved = {}

    def pack(t):
        view = saved.get(t.untyped_storage().data_ptr())
        if view is None or t.dim() > view.dim():           # keep the view with most dims, to name it
            saved[t.untyped_storage().data_ptr()] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = attention(q, k, v, impl)
    names = {t.untyped_storage().data_ptr(): n for n, t in (("q", q), ("k", k), ("v", v), ("output", out))}
    named = {names.get(ptr, f"{list(t.shape)} {str(t.dtype)[6:]}"): t.untyped_storage().nbytes()
             for ptr, t in saved.items()}
    return {"node": out.grad_fn.name(), "saved": named, "bytes": sum(named.values())}


def attention_core_bytes(batch: int, heads: int, seq_len: int, head_dim: int, impl: str = "eager",
                         element_size: int = 2) -> int:
    """The formula for `attention_saved` (h = a·d; e = element_size, 2 for bf16/fp16):

    eager: q, k, v and the probabilities       3·b·s·h·e + b·a·s²·e
    sdpa:  q, k, v, the output, an fp32 log-sum-exp per row   4·b·s·h·e + 4·b·a·s
    (sdpa: the flash kernel, what PyTorch picks here; at e = 2, eager is Korthikanti's 6sbh + 2as²b.)
    """
    b, a, s, d = (positive_int(n, x) for n, x in (("batch", batch), ("heads", heads), ("seq_len", seq_len),
                                                  ("head_dim", head_dim)))
    e = positive_int("element_size", element_size)
    if one_of("impl", impl, ATTENTION) == "eager":
        return 3 * b * s * a * d * e + b * a * s * s * e
    return 4 * b * s * a * d * e + 4 * b * a * s


def transformer_activation_bytes(seq_len: int, batch: int, hidden: int, heads: int, layers: int,
                                 recompute: str = "none", attention: str = "eager",
                                 tensor_parallel: int = 1) -> float:
    """Activations (bytes) of a GPT-style transformer, 16-bit, per micro-batch (Korthikanti et al., 2022).

    Per layer, s = seq_len, b = batch, h = hidden, a = heads (the paper's Table 2):
    none, eager: s·b·h·(34 + 5·a·s/h)   (34sbh: inputs of the matmuls, LayerNorms, GELU, dropout masks;
                                         5as²b: attention probabilities, their dropout mask and output)
    none, sdpa:  34·s·b·h + 4·a·s·b     (FlashAttention keeps no s×s tensor, only an fp32 log-sum-exp per
                                         row; see `attention_saved`)
    selective:   34·s·b·h               (the paper's selective recomputation: the attention core rebuilt)
    full:        2·s·b·h                (keep each layer's input; recompute the layer in backward)
    tensor_parallel = t > 1: t ranks split the layer with sequence parallelism, each holds 1/t of all of it
    (the paper's sbh(34/t + 5as/(ht))). Times `layers`; embeddings and the output layer are left out.
    ZeRO does not shard these: each data-parallel rank holds the activations of its own micro-batch.
    """
    s, b = positive_int("seq_len", seq_len), positive_int("batch", batch)
    h, a, n = positive_int("hidden", hidden), positive_int("heads", heads), positive_int("layers", layers)
    t = positive_int("tensor_parallel", tensor_parallel)
    if a % t:
        raise ValueError(f"tensor_parallel must divide heads={a} (each rank takes whole heads); got {t}")
    sbh = float(s * b * h)
    core = {"eager": 5 * a * s * s * b, "sdpa": 4 * a * s * b}[one_of("attention", attention, ATTENTION)]
    per_layer = {"none": 34 * sbh + core, "selective": 34 * sbh,
                 "full": 2 * sbh}[one_of("recompute", recompute, MODES)]
    return n * per_layer / t


def plot_transformer_activations(hidden: int, heads: int, seq_lens, batch: int = 1, title: str = "", ax=None):
    """GB of activations per layer against the sequence length, log-log: attention written out, SDPA, full
    recomputation (no recomputation for the first two). Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    lines = {"attention written out: sbh(34 + 5as/h)": ("none", "eager"), "SDPA / FlashAttention: 34sbh + 4asb":
             ("none", "sdpa"), "full recomputation: 2sbh": ("full", "eager")}
    for label, (recompute, impl) in lines.items():
        gb = [transformer_activation_bytes(s, batch, hidden, heads, 1, recompute, impl) / 1e9 for s in seq_lens]
        ax.plot(seq_lens, gb, "o-", ms=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length s (tokens)")
    ax.set_ylabel("activations per layer (GB)")
    ax.set_title(title or f"h = {hidden}, a = {heads}, micro-batch {batch}, 16-bit")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return ax
