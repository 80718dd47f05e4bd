"""A small Vision Transformer for MNIST, every step written out (Dosovitskiy et al. 2021, "An Image is Worth
16x16 Words"), the model of lecture 17 (transformer parallelism).

    images [B,C,H,W] --PatchEmbedding--> tokens [B,S,D] (+ position) --Block x depth--> [B,S,D]
                     --LayerNorm, mean over S (or the class token)--> [B,D] --Linear--> logits [B,classes]

B = batch, S = (image/patch)² tokens (+1 with a class token), D = dim, H = heads, d = D/H per head.
A Block is pre-norm: x + Attention(LayerNorm(x)), then x + MLP(LayerNorm(x)) with MLP = D -> mlp_ratio·D
(GELU) -> D. Attention has its own q, k, v projections (D -> D each, head h is features h·d..(h+1)·d-1)
and computes softmax(q kᵀ/√d) v per head (or F.scaled_dot_product_attention with sdpa=True).
The default: 7x7 patches -> 16 tokens of 49 pixels, dim 64, depth 4, 4 heads (204,938 parameters; the
CNN `models.Net` has 21,840). `course_lib.distributed.tensor_parallel_block` splits its blocks over ranks.

    from course_lib.vit import ViT, shapes
    model = ViT()
    shapes(model, torch.randn(2, 1, 28, 28))          # every module's output shape, in forward order
    python -m course_lib.train --model vit            # the course's trainer (once registered there)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .validate import boolean, one_of, positive_int

POOLS = ("mean", "cls")


class PatchEmbedding(nn.Module):
    """Cut the image into non-overlapping patch x patch squares (F.unfold), flatten each, project it to D.

    [B,C,image,image] -unfold-> [B, C·patch², S] -transpose-> [B, S, C·patch²] -Linear-> [B, S, D].
    The same as a Conv2d(C, D, kernel_size=patch, stride=patch) with its weight flattened (tests check).
    """

    def __init__(self, image: int, patch: int, channels: int, dim: int):
        super().__init__()
        if image % patch:
            raise ValueError(f"image={image} must be divisible by patch={patch} (non-overlapping patches)")
        self.patch = patch
        self.proj = nn.Linear(channels * patch * patch, dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        patches = F.unfold(images, kernel_size=self.patch, stride=self.patch)   # [B, C·p², S], row-major patches
        return self.proj(patches.transpose(1, 2))                                # [B, S, D]


def split_heads(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[B,S,H·d] -> [B,H,S,d]: head h is features h·d..(h+1)·d-1. H is inferred, so the same code runs on a
    tensor-parallel rank that holds only H/N of the heads."""
    b, s, _ = t.shape
    return t.view(b, s, -1, head_dim).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention.  x [B,S,D] -> [B,S,D]

    q, k, v = x W_qᵀ, x W_kᵀ, x W_vᵀ (+ biases), each [B,S,D] -> split_heads [B,H,S,d]
    scores  = q kᵀ / √d        [B,H,S,S]   (every token against every token, per head)
    out     = softmax(scores) v [B,H,S,d] -> merged [B,S,D] -> proj (D -> D)
    sdpa=True computes softmax(q kᵀ/√d) v with F.scaled_dot_product_attention (fused, no [S,S] kept).
    """

    def __init__(self, dim: int, heads: int, sdpa: bool = False):
        super().__init__()
        positive_int("dim", dim), positive_int("heads", heads)
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads} (each head gets dim/heads features)")
        self.head_dim, self.sdpa = dim // heads, boolean("sdpa", sdpa)
        self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (split_heads(lin(x), self.head_dim) for lin in (self.q, self.k, self.v))   # [B,H,S,d]
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            probs = torch.softmax(q @ k.transpose(-2, -1) / self.head_dim ** 0.5, dim=-1)    # [B,H,S,S]
            out = probs @ v                                                                 # [B,H,S,d]
        return self.proj(out.transpose(1, 2).reshape(b, s, -1))                              # [B,S,D]


class MLP(nn.Module):
    """x [B,S,D] -> fc1 [B,S,mlp_ratio·D] -> GELU -> fc2 [B,S,D]: the same two-layer net at every token."""

    def __init__(self, dim: int, mlp_ratio: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, mlp_ratio * dim), nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x)).  [B,S,D] -> [B,S,D]

    Pre-norm (the norm inside the residual branch) keeps the residual path an identity, which is why deep
    stacks train without warm-up tricks (Xiong et al. 2020)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4, sdpa: bool = False):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads, sdpa)
        self.norm2, self.mlp = nn.LayerNorm(dim), MLP(dim, positive_int("mlp_ratio", mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """images [B,channels,image,image] -> logits [B,classes]; see the module docstring for the shapes.

    pool="mean" averages the S tokens (Beyer et al. 2022, "Better plain ViT baselines"); "cls" prepends a
    learned class token (S+1 tokens) and classifies from it, as the original ViT. Position embeddings are
    learned, one D-vector per token.
    """

    def __init__(self, image: int = 28, patch: int = 7, dim: int = 64, depth: int = 4, heads: int = 4,
                 mlp_ratio: int = 4, classes: int = 10, channels: int = 1, pool: str = "mean", sdpa: bool = False):
        super().__init__()
        for name, value in dict(image=image, patch=patch, dim=dim, depth=depth, heads=heads, classes=classes,
                                channels=channels).items():
            positive_int(name, value)
        self.pool = one_of("pool", pool, POOLS)
        self.embed = PatchEmbedding(image, patch, channels, dim)
        tokens = (image // patch) ** 2 + (pool == "cls")
        self.cls = nn.Parameter(torch.zeros(1, 1, dim)) if pool == "cls" else None
        self.pos = nn.Parameter(0.02 * torch.randn(1, tokens, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, mlp_ratio, sdpa) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def tokens(self, images: torch.Tensor) -> torch.Tensor:
        """[B,C,image,image] -> [B,S,D]: patch embeddings (after the class token) plus position embeddings."""
        x = self.embed(images)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1)
        return x + self.pos

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """[B,S,D] -> final LayerNorm -> pool -> [B,D] -> logits [B,classes]."""
        x = self.norm(x)
        return self.head(x[:, 0] if self.pool == "cls" else x.mean(dim=1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classify(self.blocks(self.tokens(images)))


def shapes(model: nn.Module, x: torch.Tensor) -> dict[str, tuple]:
    """{module name: output shape} for one forward of `model` on `x`, in the order the modules ran."""
    out, hooks = {}, []

    def record(name):
        def hook(module, args, output):     # returns None: a hook's return value would replace the output
            out[name] = tuple(output.shape)
        return hook

    for name, module in model.named_modules():
        if name:
            hooks.append(module.register_forward_hook(record(name)))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return out


def as_torch_attention(attn: Attention) -> nn.MultiheadAttention:
    """torch.nn.MultiheadAttention with `attn`'s weights copied in: in_proj = [W_q; W_k; W_v] ([3D, D])."""
    dim = attn.q.in_features
    mha = nn.MultiheadAttention(dim, dim // attn.head_dim, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([attn.q.weight, attn.k.weight, attn.v.weight]))
        mha.in_proj_bias.copy_(torch.cat([attn.q.bias, attn.k.bias, attn.v.bias]))
        mha.out_proj.weight.copy_(attn.proj.weight)
        mha.out_proj.bias.copy_(attn.proj.bias)
    return mha
