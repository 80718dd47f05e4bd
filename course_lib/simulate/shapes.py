"""A model large enough that scaling matters, recorded by shape: no weights, no arithmetic.

The course's MNIST models are tiny (Net: 21,840 parameters): on a GPU their step is all kernel
launches and their all-reduce all latency. To ask what happens to a real model on 8 or 512 GPUs, the
recorder runs a GPT-shaped model on PyTorch's *meta* device: every op runs with the right shapes and
dtypes but computes nothing and allocates nothing, so FLOPs (`flop_counter`'s formulas) and bytes are
exact for the full size while the recording takes a fraction of a second on a laptop.

GPT2_SMALL follows GPT-2 small (Radford et al. 2019, "Language Models are Unsupervised Multitask
Learners"; the released 124M configuration): 12 blocks, d_model 768, 12 heads, 1,024 positions, a
50,257-token vocabulary, the output layer tied to the token embedding. The block is the standard
pre-LayerNorm one (causal attention, a 4x GELU MLP); dropout is left out (it moves bytes, no FLOPs).
Attention is FlashAttention's fused kernel by default (`aten._scaled_dot_product_flash_attention`, what
a GPU runs: the t x t scores never reach memory) or, with attention="math", PyTorch's unfused path,
whose t x t scores make attention memory-bound.

    from course_lib.simulate.shapes import GPT2_SMALL, record_by_shape
    rec = record_by_shape(GPT2_SMALL, batch=8)     # 8 sequences of 1,024 tokens per device
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..validate import one_of, positive_int
from .record import RankTrace, Recorder, Recording


class GPTShape(NamedTuple):
    name: str
    layers: int
    d_model: int
    heads: int
    seq: int
    vocab: int


GPT2_SMALL = GPTShape("GPT-2 small (124M)", 12, 768, 12, 1024, 50257)


ATTENTION = ("flash", "math")


class Block(nn.Module):
    def __init__(self, d: int, heads: int, attention: str = "flash"):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attention == "flash":      # the fused kernel has a meta implementation, not a CPU one
            y = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, shape: GPTShape, attention: str = "flash"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(shape.vocab, shape.d_model), nn.Embedding(shape.seq, shape.d_model)
        self.blocks = nn.ModuleList(Block(shape.d_model, shape.heads, attention) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)      # tied output layer, as GPT-2's


def record_by_shape(shape: GPTShape = GPT2_SMALL, batch: int = 8, dtype=torch.bfloat16,
                    attention: str = "flash") -> Recording:
    """One training step (forward, backward, SGD update) of `shape` with `batch` sequences per device,
    on the meta device: the ops, FLOPs and bytes of the full-size step. dtype: what the step computes in
    (bf16, as a GPU would train it); the gradients DDP would all-reduce are counted in that dtype too."""
    if not isinstance(shape, GPTShape):
        raise TypeError(f"shape must be a GPTShape such as GPT2_SMALL; got {type(shape).__name__}")
    positive_int("batch", batch)
    one_of("attention", attention, ATTENTION)
    with torch.device("meta"):
        model = GPT(shape, attention).to(dtype)
        idx = torch.randint(0, shape.vocab, (batch, shape.seq))
        params = [p for p in model.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    rec = Recorder()
    rec.watch(params)
    with rec:
        with torch.profiler.record_function("forward"):
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, shape.vocab), idx.view(-1))
        with torch.profiler.record_function("backward"):
            loss.backward()
        with torch.profiler.record_function("optimizer"):
            optimizer.step()
    ready = [rec.grad_ready.get(i, len(rec.events) - 1) for i in range(len(params))]
    table = [[n, p.numel(), p.element_size()] for n, p in model.named_parameters()]
    return Recording([RankTrace(rec.events, ready)], table, 1, batch,
                     f"{shape.name} by shape, {batch} x {shape.seq} tokens per device, {str(dtype)[6:]}, "
                     f"{attention} attention")
