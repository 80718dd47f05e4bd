"""Group-wise int4 weight-only quantization: how large language models run on laptops.

At batch 1 a model's forward pass reads every weight once and does little arithmetic with it:
time goes to moving weights from memory, so 4-bit weights move ~4x fewer bytes than bf16 ones (and
run up to that much faster where memory is the limit) and fit ~4x more parameters in the same RAM. One scale for a whole row is too coarse at 4 bits (one large
weight stretches the grid for hundreds of others), so the row is cut into *groups* of G consecutive
input channels (G = 32..128 in GPTQ, AWQ and llama.cpp's 4-bit formats), each with its own scale
and zero point. Activations stay in float: "weight-only".

    codes, scale, zero = quantize(w, group_size=32)     # w [out, in] -> codes 0..15, [out, in // 32] x2
    packed = pack(codes)                                 # two codes per byte: [out, in // 2] uint8
    w_hat = dequantize(unpack(packed, in_features), scale, zero, 32)
    layer = Int4WeightOnlyLinear.from_linear(linear, group_size=32, pad=True)

Conventions (the same as torchao's `quantize_affine` with an integer zero point):
- asymmetric: codes 0..15, `w_hat = (code - zero) * scale` per group; the group's range is widened
  to include 0 so that 0.0 is exact; `zero = round(-lo / scale)` (halves to even), an integer 0..15;
- scales are stored in `scale_dtype` (float16 by default, as GPTQ/AWQ checkpoints do), rounded *up*
  to it so that the grid still covers the group: |w - w_hat| <= scale / 2 for every weight;
- nibble order: element 2k in the LOW nibble of byte k, element 2k+1 in the HIGH nibble (lowest
  bits first, as GPTQ packs eight codes into an int32; llama.cpp's Q4_0 pairs element j with j + 16
  instead: every format states its own); an odd count is padded with one 0 nibble.

On a CPU this module dequantizes the whole weight in every forward: it shows the accuracy and the
bytes, not the speed; the speed comes from kernels that unpack in registers (torchao's int4 CPU/GPU
kernels, llama.cpp, Marlin). `torchao_int4_linear` wraps torchao's CPU int4 path for comparison.
"""
from __future__ import annotations

import copy
import logging

import torch
from torch import nn
from torch.nn import functional as F

from .. import numerics
from ..validate import float_tensor

QMIN, QMAX = numerics.qrange(4, signed=False)     # 0..15
GROUP_SIZES = (32, 64, 128)                 # the usual choices; any divisor of in_features works


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_weight(weight: torch.Tensor, group_size: int) -> None:
    """TypeError for a non-float tensor, ValueError for a group size that does not divide in_features."""
    float_tensor("weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [out_features, in_features]; got shape {tuple(weight.shape)}")
    n = weight.shape[1]
    if not isinstance(group_size, int) or group_size <= 0 or n % group_size:
        raise ValueError(f"group_size={group_size!r} must be a positive divisor of in_features={n}: one of "
                         f"{_divisors(n)} (or pad the weight's columns, e.g. from_linear(..., pad=True))")


def group_qparams(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.float16):
    """One scale (in scale_dtype) and one integer zero point (uint8, 0..15) per group: [out, in // G] each."""
    check_weight(weight, group_size)
    w = weight.detach().float().reshape(weight.shape[0], -1, group_size)
    lo, hi = w.amin(-1).clamp(max=0), w.amax(-1).clamp(min=0)
    scale = ((hi - lo) / (QMAX - QMIN)).to(scale_dtype)
    short = scale.float() < (hi - lo) / (QMAX - QMIN)            # rounded down: the grid would miss hi
    scale = torch.where(short, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))   # an all-zero group: any scale is exact
    zero = torch.round(-lo / scale.float()).clamp(QMIN, QMAX)
    return scale, zero.to(torch.uint8)


def quantize(weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype = torch.float16):
    """weight [out, in] -> (codes uint8 0..15 [out, in], scale [out, in // G], zero uint8 [out, in // G]).

    A group is a channel of lecture 02's per-channel quantization (`numerics.quantize`, as
    torch.fake_quantize_per_channel_affine) on the weight reshaped to [out * in // G, G]."""
    scale, zero = group_qparams(weight, group_size, scale_dtype)
    codes = numerics.quantize(weight.detach().reshape(-1, group_size), scale.float().flatten(), zero.flatten(),
                              bits=4, signed=False, axis=0)
    return codes.to(torch.uint8).reshape(weight.shape), scale, zero


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """(code - zero) * scale per group, in float32: [out, in]."""
    w = numerics.dequantize(codes.reshape(-1, group_size), scale.float().flatten(), zero.flatten(),
                            bits=4, signed=False, axis=0)
    return w.reshape(codes.shape)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dim: element 2k low nibble, 2k+1 high nibble."""
    if codes.is_floating_point() or codes.is_complex():
        raise TypeError(f"codes must be an integer tensor; got {codes.dtype}")
    if codes.numel() and (codes.min() < QMIN or codes.max() > QMAX):
        raise ValueError(f"codes must lie in {QMIN}..{QMAX}; got {codes.min().item()}..{codes.max().item()}")
    codes = codes.to(torch.uint8)
    if codes.shape[-1] % 2:                                       # an odd count: pad one 0 nibble
        codes = F.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of pack: [..., ceil(n / 2)] uint8 -> [..., n] codes (uint8 0..15)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8; got {packed.dtype}")
    if packed.shape[-1] != (n + 1) // 2:
        raise ValueError(f"n={n} codes need {(n + 1) // 2} bytes per row; packed has {packed.shape[-1]}")
    both = torch.stack([packed & 0x0F, packed >> 4], dim=-1)     # low nibble first
    return both.flatten(-2)[..., :n]


class Int4WeightOnlyLinear(nn.Module):
    """A Linear whose weight is stored as packed int4 codes + a scale and zero point per group.

    Buffers: packed [out, in_padded // 2] uint8, scale [out, groups] (scale_dtype), zero [out, groups]
    uint8, bias (float, as in the original). forward dequantizes and calls F.linear: weight-only."""

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool = True,
                 scale_dtype: torch.dtype = torch.float16):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        padded = -(-in_features // group_size) * group_size
        groups = padded // group_size
        self.register_buffer("packed", torch.zeros(out_features, padded // 2 + padded % 2, dtype=torch.uint8))
        self.register_buffer("scale", torch.ones(out_features, groups, dtype=scale_dtype))
        self.register_buffer("zero", torch.zeros(out_features, groups, dtype=torch.uint8))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int, pad: bool = False,
                    scale_dtype: torch.dtype = torch.float16) -> "Int4WeightOnlyLinear":
        """Quantize a Linear; pad=True zero-pads its columns to a multiple of group_size (stored, counted)."""
        w = linear.weight.detach()
        if pad and isinstance(group_size, int) and group_size > 0:
            w = F.pad(w, (0, -w.shape[1] % group_size))
        codes, scale, zero = quantize(w, group_size, scale_dtype)
        layer = cls(linear.in_features, linear.out_features, group_size, linear.bias is not None, scale_dtype)
        layer.packed.copy_(pack(codes))
        layer.scale.copy_(scale)
        layer.zero.copy_(zero)
        if linear.bias is not None:
            layer.bias.copy_(linear.bias.detach())
        return layer

    def weight(self) -> torch.Tensor:
        """The dequantized weight [out, in], float32."""
        padded = self.scale.shape[1] * self.group_size
        codes = unpack(self.packed, padded)
        return dequantize(codes, self.scale, self.zero, self.group_size)[:, :self.in_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight().to(x.dtype), bias)

    def weight_bytes(self) -> int:
        """Exact bytes of the stored weight: packed codes + scales + zero points (bias not included)."""
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scale, self.zero))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"scale_dtype={self.scale.dtype}")


def quantize_model(model: nn.Module, group_size: int | None, pad: bool = True,
                   scale_dtype: torch.dtype = torch.float16) -> nn.Module:
    """A copy of model with every nn.Linear int4 weight-only; group_size=None: one group per row (per channel)."""
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                g = child.in_features if group_size is None else group_size
                setattr(parent, name, Int4WeightOnlyLinear.from_linear(child, g, pad=pad, scale_dtype=scale_dtype))
    return model


def weight_bytes(model: nn.Module, fmt: str) -> int:
    """Bytes of every Linear weight of model in fmt: "fp32", "fp16", "int8 per channel" (1 byte per
    weight + one fp32 scale per row, symmetric: no zero point), or "int4" (the model's own buffers)."""
    formats = {"fp32": lambda o, i: 4 * o * i, "fp16": lambda o, i: 2 * o * i,
               "int8 per channel": lambda o, i: o * i + 4 * o}
    if fmt == "int4":
        return sum(m.weight_bytes() for m in model.modules() if isinstance(m, Int4WeightOnlyLinear))
    if fmt not in formats:
        raise ValueError(f"fmt={fmt!r}: allowed {sorted(formats) + ['int4']}")
    return sum(formats[fmt](m.out_features, m.in_features) for m in model.modules() if isinstance(m, nn.Linear))


class _TorchaoInt4(nn.Module):
    """torchao's CPU int4 kernel on the Linear zero-padded (columns to a multiple of G, rows to one of
    16, as its kernel needs), its output cut back to out_features, plus the bias."""

    def __init__(self, inner: nn.Module, linear: nn.Linear, cols: int):
        super().__init__()
        self.inner, self.in_features, self.out_features, self.cols = inner, linear.in_features, linear.out_features, cols
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(F.pad(x, (0, self.cols - self.in_features)))[..., :self.out_features]
        return y if self.bias is None else y + self.bias


def torchao_int4_linear(linear: nn.Linear, group_size: int) -> nn.Module:
    """torchao's int4 weight-only Linear on this CPU (Int4WeightOnlyQuantizer, float32 in and out; its
    zero point is a float, the "tinygemm" convention); RuntimeError saying why where it cannot run."""
    try:
        from torchao.quantization import Int4WeightOnlyQuantizer
    except ImportError as err:
        raise RuntimeError(f"torchao's int4 weight-only path is not available: {err}") from err
    cols, rows = -(-linear.in_features // group_size) * group_size, -(-linear.out_features // 16) * 16
    bare = nn.Sequential(nn.Linear(cols, rows, bias=False))     # it leaves Linears with a bias alone
    with torch.no_grad():
        w = linear.weight.detach().float()
        bare[0].weight.copy_(F.pad(w, (0, cols - w.shape[1], 0, rows - w.shape[0])))
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)                                  # its "0 is padded" notice
    try:
        inner = Int4WeightOnlyQuantizer(groupsize=group_size, device=torch.device("cpu"),
                                        precision=torch.float32).quantize(bare)
        inner(torch.zeros(1, cols))
    except Exception as err:                          # a kernel missing from this torch build, a changed API
        raise RuntimeError(f"torchao's int4 weight-only path did not run here: {type(err).__name__}: {err}") from err
    finally:
        root.setLevel(level)
    if isinstance(inner[0], nn.Linear):
        raise RuntimeError("torchao's Int4WeightOnlyQuantizer left the Linear unquantized")
    return _TorchaoInt4(inner, linear, cols)
