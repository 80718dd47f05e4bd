"""FP8 with a per-tensor scale: the cast that H100/H200 tensor cores multiply (and Blackwell, MI300X/MI355X).

FP8 comes in two flavours (OCP 8-bit Floating Point Specification (OFP8), 2023; torch.float8_e4m3fn /
torch.float8_e5m2): E4M3 keeps 3 mantissa bits but reaches only 448, E5M2 keeps 2 bits and reaches 57344.
Neither range fits raw tensors, so recipes (NVIDIA Transformer Engine, torchao.float8) multiply each tensor
by a scale = fp8 max / amax before the cast and divide after it; E4M3 for weights and activations in
forward, E5M2 for gradients in backward (more range, less precision). The scale comes from the current
tensor (one extra pass over it) or from a history of past amaxes ("delayed scaling", `DelayedScaling`).
On a CPU all of this is simulation: the values are exact, the speed comes only from the hardware.

    q, scale = quantize(x, "e4m3"); y = dequantize(q, scale)     # y == fake_quant(x, "e4m3")
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .validate import float_tensor, one_of, positive_int

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_max(fmt: str) -> float:
    """Largest finite value of the format: 448 (e4m3) or 57344 (e5m2)."""
    return torch.finfo(DTYPES[one_of("fmt", fmt, DTYPES)]).max


def amax_scale(amax, fmt: str = "e4m3") -> torch.Tensor:
    """scale = fp8 max / amax, so the largest |value| lands on the format's largest number.
    amax 0 (an all-zero tensor) or non-finite gives scale 1: nothing to stretch."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    ok = torch.isfinite(amax) & (amax > 0)
    return torch.where(ok, fp8_max(fmt) / torch.where(ok, amax, 1.0), 1.0)


def cast(x: torch.Tensor, fmt: str = "e4m3", saturate: bool = True) -> torch.Tensor:
    """x (already scaled) rounded to fp8, round-to-nearest-even. saturate=True clamps to +-max, as FP8
    recipes do; saturate=False shows what overflow does instead: e5m2 has inf, e4m3fn has no inf
    encoding ("fn": finite), so the OCP spec's non-saturating mode gives NaN there."""
    dtype = DTYPES[one_of("fmt", fmt, DTYPES)]
    big = fp8_max(fmt)
    x = float_tensor("x", x).float()
    if saturate:
        return x.clamp(-big, big).to(dtype)                  # NaN stays NaN
    q = x.to(dtype)
    if dtype == torch.float8_e4m3fn:     # torch's cast clamps; OCP: beyond max + half a step (464) -> NaN
        q = torch.where(x.abs() > big + 16, torch.nan, q.float()).to(dtype)
    return q


def quantize(x: torch.Tensor, fmt: str = "e4m3", scale=None):
    """(fp8 tensor, scale): x * scale cast with saturation; scale defaults to amax_scale(amax(x))."""
    x = float_tensor("x", x).float()
    if scale is None:
        scale = amax_scale(x.abs().max() if x.numel() else 0.0, fmt)
    scale = torch.as_tensor(scale, dtype=torch.float32)
    return cast(x * scale, fmt), scale


def dequantize(q: torch.Tensor, scale) -> torch.Tensor:
    """fp32 values of an fp8 tensor made with `quantize`: q / scale."""
    return q.float() / torch.as_tensor(scale, dtype=torch.float32)


def fake_quant(x: torch.Tensor, fmt: str = "e4m3", scale=None) -> torch.Tensor:
    """dequantize(quantize(x)), in x's dtype: the values an FP8 matmul would see."""
    return dequantize(*quantize(x, fmt, scale)).to(x.dtype)


class Fp8Cast(torch.autograd.Function):
    """Straight-through FP8: forward = e4m3 round trip (current scaling); backward = the incoming
    gradient rounded to e5m2 with its own amax scale, passed straight through the rounding."""

    @staticmethod
    def forward(ctx, x):
        return fake_quant(x, "e4m3")

    @staticmethod
    def backward(ctx, grad):
        return fake_quant(grad, "e5m2")


class DelayedScaling:
    """Scale from the largest amax of the last `history` tensors, known *before* the cast.

    Why: with current scaling the kernel must read the whole tensor for its amax, then read it again
    to cast; delayed scaling casts in one pass and records this tensor's amax on the way (fused). The
    price: when amax jumps above the history the scale is too large and values saturate (counted in
    `saturated`). Transformer Engine's default history is 1024; torchao.float8 offers both.
    """

    def __init__(self, fmt: str = "e4m3", history: int = 16):
        self.fmt = one_of("fmt", fmt, DTYPES)
        self.history = positive_int("history", history)
        self.amaxes: list[float] = []
        self.saturated = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = float_tensor("x", x)
        amax = float(x.detach().abs().max()) if x.numel() else 0.0
        past = max(self.amaxes) if self.amaxes else amax          # first call: nothing known yet, use the current
        scale = amax_scale(past, self.fmt)
        self.saturated += int((x.detach().abs().float() * scale > fp8_max(self.fmt)).sum())
        self.amaxes = (self.amaxes + [amax])[-self.history:]
        return fake_quant(x, self.fmt, scale)


def fake_quantized(model: nn.Module, weight_fn, input_fn=None, train: bool = False) -> nn.Module:
    """A copy of `model` whose Conv2d/Linear layers see weight_fn(weight as [out, in*kh*kw]) and
    input_fn(input) (its reduction dim is dim 1). train=False rounds the weights once; train=True
    keeps fp32 master weights and rounds them at every forward (straight-through if the fns are)."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if not isinstance(m, (nn.Conv2d, nn.Linear)):
            continue
        if train:
            nn.utils.parametrize.register_parametrization(m, "weight", _WeightFn(weight_fn))
        else:
            with torch.no_grad():
                m.weight.copy_(weight_fn(m.weight.flatten(1)).reshape(m.weight.shape))
        if input_fn is not None:
            m.register_forward_pre_hook(lambda mod, args: (input_fn(args[0]),) + args[1:])
    return model


class _WeightFn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, w):
        return self.fn(w.flatten(1)).reshape(w.shape)
