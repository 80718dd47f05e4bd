"""FP8 with a per-tensor scale, and FP8 training as Transformer Engine and torchao.float8 do it.

Two FP8 families exist. OCP FP8 (OCP 8-bit Floating Point Specification (OFP8), 2023): E4M3 ("fn": finite,
max 448, NaN only at S.1111.111, torch.float8_e4m3fn) and E5M2 (IEEE-like, max 57344, has inf,
torch.float8_e5m2). The FNUZ variants (torch.float8_e4m3fnuz / float8_e5m2fnuz: finite, one NaN at 0x80, no
negative zero, exponent bias one larger, so E4M3 tops out at 240) are what AMD CDNA3 (MI300X) multiplies; OCP
FP8 is what NVIDIA Ada, Hopper, Blackwell and AMD CDNA4 (MI355X) multiply (`HARDWARE`, with sources).

Neither range fits raw tensors, so recipes multiply each tensor by scale = fp8 max / amax before the cast and
divide after it. FP8 training (`Fp8Matmul`, `fp8_training`) casts the operands of every matmul: X and W to
E4M3 in forward, the output gradient dY to E5M2 in backward (E4M3 in the "all E4M3" recipe); the weight
gradient, the master weights and the optimizer state stay in fp32. The scale comes from the current tensor
(current or dynamic scaling: one extra pass over it) or from a history of past amaxes (`DelayedScaling`).
On a CPU all of this is simulation: the values are exact, the speed comes only from the hardware.

    q, scale = quantize(x, "e4m3"); y = dequantize(q, scale)     # y == fake_quant(x, "e4m3")
    model8 = fp8_training(model)                                  # train it as usual: fp32 master weights
"""
from __future__ import annotations

import copy
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .validate import float_tensor, one_of, positive_int

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,                  # OCP FP8
          "e4m3fnuz": torch.float8_e4m3fnuz, "e5m2fnuz": torch.float8_e5m2fnuz}   # AMD CDNA3's FP8


class Fp8Hardware(NamedTuple):
    """A chip family, its chips, the FP8 formats (keys of DTYPES) its matrix units multiply, and the source."""

    family: str
    chips: str
    formats: tuple
    source: str


# Which FP8 the matrix units of each family multiply (keys of DTYPES).
HARDWARE = (
    Fp8Hardware("NVIDIA Ada (compute capability 8.9)", "L4, L40S, RTX 40xx", ("e4m3", "e5m2"),
                "NVIDIA Ada GPU Architecture whitepaper (2022): 4th-generation Tensor Cores with FP8 E4M3/E5M2"),
    Fp8Hardware("NVIDIA Hopper (9.0)", "H100, H200", ("e4m3", "e5m2"),
                "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)"),
    Fp8Hardware("NVIDIA Blackwell (10.0)", "B200, GB200", ("e4m3", "e5m2"),
                "NVIDIA Blackwell Architecture Technical Brief (2024); also MXFP8, MXFP4, NVFP4"),
    Fp8Hardware("AMD CDNA3 (gfx942)", "MI300X, MI325X", ("e4m3fnuz", "e5m2fnuz"),
                "AMD Instinct MI300 (CDNA3) ISA Reference Guide; ROCm 'Data types and precision support': FNUZ only"),
    Fp8Hardware("AMD CDNA4 (gfx950)", "MI350X, MI355X", ("e4m3", "e5m2"),
                "AMD Instinct CDNA4 ISA Reference Guide (2025): OCP FP8; also MXFP8, MXFP6, MXFP4"),
)


def fp8_max(fmt: str) -> float:
    """Largest finite value of the format: 448 (e4m3), 57344 (e5m2, e5m2fnuz), 240 (e4m3fnuz)."""
    return torch.finfo(DTYPES[one_of("fmt", fmt, DTYPES)]).max


class BitFacts(NamedTuple):
    """An FP8 format's numbers as its bit patterns decode them; NaN/inf codes counted; whether -0 exists."""

    max: float
    eps: float
    smallest_normal: float
    smallest_subnormal: float
    nan_codes: int
    inf_codes: int
    negative_zero: bool


def bit_facts(fmt: str) -> BitFacts:
    """The format's numbers read from its 256 bit patterns (each byte decoded by torch), not from torch.finfo.

    eps: the gap above 1. smallest_normal: the first value whose gap to the next is value * eps (below it,
    the subnormals are evenly spaced, smallest_subnormal apart).
    """
    v = torch.arange(256, dtype=torch.uint8).view(DTYPES[one_of("fmt", fmt, DTYPES)]).double()
    pos = v[torch.isfinite(v) & (v > 0)].unique()                  # the positive values, sorted
    eps = pos[pos > 1][0] - 1
    gap = pos[1:] - pos[:-1]
    smallest_normal = pos[:-1][gap == pos[:-1] * eps][0]
    return BitFacts(pos[-1].item(), eps.item(), smallest_normal.item(), pos[0].item(), int(torch.isnan(v).sum()),
                    int(torch.isinf(v).sum()), bool((torch.signbit(v) & (v == 0)).any()))


def amax_scale(amax, fmt: str = "e4m3") -> torch.Tensor:
    """scale = fp8 max / amax, so the largest |value| lands on the format's largest number.
    amax 0 (an all-zero tensor) or non-finite gives scale 1: nothing to stretch."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    ok = torch.isfinite(amax) & (amax > 0)
    big = torch.tensor(fp8_max(fmt))         # a tensor: `float / tensor` multiplies by a rounded reciprocal
    return torch.where(ok, big / torch.where(ok, amax, 1.0), 1.0)


def cast(x: torch.Tensor, fmt: str = "e4m3", saturate: bool = True) -> torch.Tensor:
    """x (already scaled) rounded to fp8, round-to-nearest-even. saturate=True clamps to +-max, as FP8
    recipes do; saturate=False shows what overflow does instead: e5m2 has inf, the other three have no inf
    encoding, so overflow gives NaN (OCP's non-saturating mode for e4m3; torch's own cast for the fnuz)."""
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


OPERAND_FORMATS = (*DTYPES, "bf16")     # bf16: the 16-bit reference (fp32's range: no scale needed)


def _operand(t: torch.Tensor, fmt: str) -> torch.Tensor:
    return t.bfloat16().to(t.dtype) if fmt == "bf16" else fake_quant(t, fmt)


class Fp8Matmul(torch.autograd.Function):
    """y = X Wᵀ + b (a Linear; X [..., in], W [out, in]) or conv2d(X, W) + b, computed as FP8 training computes it
    (Transformer Engine; torchao.float8's "tensorwise" recipe, which tests/test_fp8.py matches bit for bit):

        forward   Xq = fq(X, fmt), Wq = fq(W, fmt)        per-tensor scale from the current amax
                  y = Xq Wqᵀ + b                          fp32 accumulation
        backward  dYq = fq(dY, grad_fmt)                  the only cast in backward
                  dX = dYq Wq,  dW = dYqᵀ Xq              fp32 accumulation; dW is not rounded: it updates
                  db = sum of dY                          the fp32 master weights (optimizer state fp32 too)

    fq = fake_quant: values on the FP8 grid held in fp32 (a CPU has no FP8 matmul); fmt/grad_fmt "bf16" round
    to bf16 instead, the same recipe with 16-bit operands. conv: None for a Linear, else (stride, padding,
    dilation, groups), and the same products run as convolutions.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, fmt, grad_fmt, conv):
        xq, wq = _operand(x, fmt), _operand(weight, fmt)
        ctx.save_for_backward(xq, wq)                # kept for backward in FP8, as the recipes keep them
        ctx.grad_fmt, ctx.conv = grad_fmt, conv
        if conv is not None:
            return F.conv2d(xq, wq, bias, *conv)
        y = F.linear(xq, wq)                         # the GEMM; its epilogue adds the bias in fp32
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx, dy):
        xq, wq = ctx.saved_tensors
        dyq = _operand(dy, ctx.grad_fmt)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        if ctx.conv is None:
            dx = dyq @ wq if need_x else None                                          # [..., out] @ [out, in]
            dw = dyq.flatten(0, -2).T @ xq.flatten(0, -2) if need_w else None          # [out, N] @ [N, in]
            db = dy.flatten(0, -2).sum(0) if need_b else None
        else:
            dx = torch.nn.grad.conv2d_input(xq.shape, wq, dyq, *ctx.conv) if need_x else None
            dw = torch.nn.grad.conv2d_weight(xq, wq.shape, dyq, *ctx.conv) if need_w else None
            db = dy.sum((0, 2, 3)) if need_b else None
        return dx, dw, db, None, None, None


class _Fp8Linear(nn.Linear):
    def forward(self, x):
        return Fp8Matmul.apply(x, self.weight, self.bias, *self.fp8, None)


class _Fp8Conv2d(nn.Conv2d):
    def forward(self, x):
        return Fp8Matmul.apply(x, self.weight, self.bias, *self.fp8,
                               (self.stride, self.padding, self.dilation, self.groups))


def fp8_training(model: nn.Module, fmt: str = "e4m3", grad_fmt: str = "e5m2") -> nn.Module:
    """A copy of `model` whose Linear/Conv2d layers compute through `Fp8Matmul`; train it as usual.

    Its parameters stay fp32: they are the master weights, and the optimizer keeps its state in fp32.
    grad_fmt="e5m2" is Transformer Engine's HYBRID recipe (and torchao's), "e4m3" its all-E4M3 recipe;
    fmt = grad_fmt = "bf16" is the 16-bit reference through the same code. Each layer keeps its
    parameters and their names; only its forward changes (its class is swapped).
    """
    one_of("fmt", fmt, OPERAND_FORMATS)
    one_of("grad_fmt", grad_fmt, OPERAND_FORMATS)
    model = copy.deepcopy(model)
    for name, m in model.named_modules():
        if type(m) is nn.Conv2d and (isinstance(m.padding, str) or m.padding_mode != "zeros"):
            raise ValueError(f"model's {name or 'root'} Conv2d must use numeric zero padding; got padding="
                             f"{m.padding!r}, padding_mode={m.padding_mode!r}")
        swap = {nn.Linear: _Fp8Linear, nn.Conv2d: _Fp8Conv2d}.get(type(m))
        if swap is not None:
            m.__class__, m.fp8 = swap, (fmt, grad_fmt)
    return model


class DelayedScaling:
    """Scale from the largest amax of the last `history` tensors, known *before* the cast.

    Why: with current scaling the kernel must read the whole tensor for its amax, then read it again
    to cast; delayed scaling casts in one pass and records this tensor's amax on the way (fused). The
    price: when amax jumps above the history the scale is too large and values saturate (counted in
    `saturated`). Transformer Engine's `DelayedScaling` recipe does this (its default history: 1024
    amaxes); torchao.float8 does not: its ScalingType offers dynamic (current) scaling only, per tensor
    or per row (tests/test_fp8.py asks the installed torchao).
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


def fake_quantized(model: nn.Module, weight_fn, input_fn=None) -> nn.Module:
    """A copy of `model` (for evaluation) whose Conv2d/Linear weights are replaced by weight_fn(weight), once,
    and whose layers see input_fn(input). Both fns get tensors in their own shape ([out, in] or
    [out, c_in, kh, kw]; [N, in] or [N, C, H, W]) and choose their blocks themselves (`mx.fake_quant_nhwc`)."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if not isinstance(m, (nn.Conv2d, nn.Linear)):
            continue
        with torch.no_grad():
            m.weight.copy_(weight_fn(m.weight))
        if input_fn is not None:
            m.register_forward_pre_hook(lambda mod, args: (input_fn(args[0]),) + args[1:])
    return model
