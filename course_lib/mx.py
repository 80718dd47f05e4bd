"""Microscaling (MX) block formats from scratch: MXFP8, MXFP4 and NVFP4.

One scale per tensor wastes levels wherever values are small next to the tensor's largest. MX gives
each block of 32 consecutive values along the reduction dimension its own power-of-two scale
(OCP Microscaling Formats (MX) Specification v1.0, 2023):

    scale exponent  e = floor(log2(amax of the block)) - emax_elem     (stored as E8M0: 8 bits, 2^-127..2^127)
    element         P = round(x / 2^e) in the element format, saturating at its max

emax_elem is the exponent of the element format's largest binade: 8 for FP8 E4M3 (max 448 = 1.75 * 2^8),
2 for FP4 E2M1 (max 6 = 1.5 * 2^2). A power of two costs 8 bits per 32 values and multiplies exactly.
NVFP4 (NVIDIA Blackwell, 2025) uses blocks of 16 with an FP8 E4M3 scale (finer, not a power of two)
and one fp32 scale per tensor. Blackwell (B200/GB200) and MI355X run these in hardware; here a CPU
computes the same values, slowly.

Handling chosen here: an all-zero block gets scale 2^-127 and stays 0; a block holding NaN or inf gets
a NaN scale (E8M0 0xFF, as the spec says), so all its 32 values dequantize to NaN.
"""
from __future__ import annotations

import torch

from .validate import float_tensor, one_of, positive_int

E2M1_MAX = 6.0                                       # FP4 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives
ELEMENTS = {"fp8_e4m3": (8, 448.0), "fp4_e2m1": (2, E2M1_MAX)}   # name: (emax_elem, largest value)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """x rounded to FP4 E2M1, round-to-nearest-even, saturating at +-6. The grid's step is 0.5 below 2
    (0.5 is the subnormal), 1 in [2, 4), 2 in [4, 6]; torch.round rounds halves to even, and an even
    multiple of the step is an even mantissa, so ties go where the spec sends them."""
    a = x.abs().clamp(max=E2M1_MAX)
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    return torch.copysign(torch.round(a / step) * step, x)


def _elements(x: torch.Tensor, elem: str) -> torch.Tensor:
    if elem == "fp4_e2m1":
        return round_e2m1(x)
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()      # saturating, like torchao


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    float_tensor("x", x)
    positive_int("block", block)
    if x.dim() == 0 or x.shape[-1] % block:
        raise ValueError(f"block={block} must divide the last (reduction) dimension, got shape "
                         f"{tuple(x.shape)}; pad it (fake_quant(..., pad=True) does) or pick a divisor")
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // block, block)


def mx_quantize(x: torch.Tensor, elem: str = "fp8_e4m3", block: int = 32):
    """(scale exponents [..., K/block] as float, elements [..., K/block, block] as fp32 values of the
    element format) for blocks of `block` along the last dimension."""
    emax, _ = ELEMENTS[one_of("elem", elem, ELEMENTS)]
    xb = _blocks(x, block)
    amax = xb.abs().amax(-1, keepdim=True)
    _, e = torch.frexp(amax)                              # amax = m * 2^e with m in [0.5, 1): floor(log2) = e - 1
    exp = ((e - 1).float() - emax).clamp(-127, 127)
    exp = torch.where(amax == 0, -127.0, exp)
    exp = torch.where(torch.isfinite(amax), exp, torch.nan)     # NaN/inf in the block: NaN scale
    return exp.squeeze(-1), _elements(xb * torch.exp2(-exp), elem)


def mx_dequantize(exp: torch.Tensor, elements: torch.Tensor) -> torch.Tensor:
    """elements * 2^exp, back to the shape [..., K]."""
    return (elements * torch.exp2(exp).unsqueeze(-1)).flatten(-2)


def nvfp4_quantize(x: torch.Tensor, block: int = 16):
    """(tensor scale fp32, block scales [..., K/16] as E4M3 values, E2M1 elements [..., K/16, 16]).
    The tensor scale maps the tensor's amax to 448 * 6, so every block scale fits E4M3."""
    xb = _blocks(x, block)
    amax = xb.abs().max()
    tensor_scale = torch.where(amax > 0, amax / (448.0 * E2M1_MAX), 1.0)
    block_scale = (xb.abs().amax(-1) / E2M1_MAX / tensor_scale).to(torch.float8_e4m3fn).float()
    divisor = (block_scale * tensor_scale).unsqueeze(-1)
    elements = round_e2m1(torch.where(divisor > 0, xb / divisor, 0.0))
    return tensor_scale, block_scale, elements


def nvfp4_dequantize(tensor_scale, block_scale: torch.Tensor, elements: torch.Tensor) -> torch.Tensor:
    return (elements * (block_scale * tensor_scale).unsqueeze(-1)).flatten(-2)


FORMATS = ("mxfp8", "mxfp4", "nvfp4")


def fake_quant(x: torch.Tensor, fmt: str = "mxfp8", pad: bool = False) -> torch.Tensor:
    """dequantize(quantize(x)) with blocks along the last dimension, in x's dtype. pad=True pads it
    with zeros to a multiple of the block (zeros change no block's amax), as kernels pad K."""
    one_of("fmt", fmt, FORMATS)
    block = 16 if fmt == "nvfp4" else 32
    k = x.shape[-1] if x.dim() else 0
    t = torch.nn.functional.pad(x, (0, -k % block)) if pad and k % block else x
    if fmt == "nvfp4":
        y = nvfp4_dequantize(*nvfp4_quantize(t, block))
    else:
        y = mx_dequantize(*mx_quantize(t, "fp8_e4m3" if fmt == "mxfp8" else "fp4_e2m1", block))
    return y[..., :k].to(x.dtype)


def fake_quant_nhwc(t: torch.Tensor, fmt: str = "mxfp8") -> torch.Tensor:
    """fake_quant of a layer's input [N, K] / [N, C, H, W] or weight [out, K] / [out, C, kh, kw], each row (a
    sample, an output channel) blocked along its reduction dimension in the order a channels-last (NHWC)
    convolution kernel reads it: (H, W, C) for an input, (kh, kw, C) for a weight, channels fastest
    (permute (0, 2, 3, 1), then flatten), zero-padded to whole blocks. A block then runs through the input
    channels of one tap, then of the next: consecutive values of the implicit GEMM's reduction dimension
    (K = kh*kw*C), as the hardware blocks it. PyTorch's memory order (C, kh, kw) would block one channel's
    kh*kw taps together instead. 2-D tensors are blocked along their last dim as they are.
    """
    rows = t.movedim(1, -1)
    return fake_quant(rows.flatten(1), fmt, pad=True).reshape(rows.shape).movedim(-1, 1)
