"""Number formats: floats from their bit layout, rounding, integer quantization, fixed point.

A float is sign x 2^(exponent - bias) x 1.mantissa. The exponent bits set the range, the
mantissa bits the precision; every figure in torch.finfo follows from those two counts:

    fmt = float_format(torch.bfloat16)   # 8 exponent bits, 7 mantissa bits
    fmt.eps, fmt.max, fmt.smallest_normal, fmt.smallest_subnormal
    decompose(1.5, torch.float16)        # Fields(sign=0, exponent=15, mantissa=512, ...)

Linear quantization stores x as an integer code q, x ~= (q - zero_point) * scale; the course's one
implementation lives here (lecture 02: int8; lecture 13 re-exports it: 1..16 bits, per channel):

    scale, zero_point = choose_qparams(x.min(), x.max(), bits=8)     # int8, asymmetric
    q = quantize(x, scale, zero_point, bits=8)                       # int32 codes in -128..127
    x_hat = dequantize(q, scale, zero_point, bits=8)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .validate import boolean, int_in_range, non_negative_int, one_of


@dataclass(frozen=True)
class FloatFormat:
    """A binary float format: 1 sign bit, `exponent_bits`, `mantissa_bits` (stored fraction).

    IEEE-like (FP32, FP16, BF16, FP8 E5M2): the all-ones exponent code holds inf and NaN.
    finite_only (OCP FP8 E4M3, torch.float8_e4m3fn): it holds ordinary numbers, there is no inf,
    and only S.1111.111 is NaN; one more binade of range, less its top mantissa.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    finite_only: bool = False

    def __post_init__(self):
        int_in_range("exponent_bits", self.exponent_bits, 2, 11)
        int_in_range("mantissa_bits", self.mantissa_bits, 1, 52)

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max_exponent(self) -> int:
        """Largest unbiased exponent of a finite number: code 2^e - 2 (IEEE-like), 2^e - 1 (finite_only)."""
        top = 2**self.exponent_bits - 1 if self.finite_only else 2**self.exponent_bits - 2
        return top - self.bias

    @property
    def eps(self) -> float:
        """Gap between 1 and the next float: one unit in the last mantissa place."""
        return 2.0 ** -self.mantissa_bits

    @property
    def max(self) -> float:
        """Largest finite number: the top mantissa that is not NaN x 2^max_exponent.

        IEEE-like: (2 - 2^-m) * 2^(2^e - 2 - bias); E5M2: 1.75 * 2^15 = 57344, FP16: 65504.
        finite_only: all mantissa bits set is NaN, so one step less: (2 - 2^(1-m)) * 2^(2^e - 1 - bias);
        E4M3: 1.75 * 2^8 = 448.
        """
        top_fraction = 2 - (2 if self.finite_only else 1) * self.eps
        return top_fraction * 2.0**self.max_exponent

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)


FORMATS = {
    torch.float32: FloatFormat("FP32", 8, 23),
    torch.float16: FloatFormat("FP16", 5, 10),
    torch.bfloat16: FloatFormat("BF16", 8, 7),
}
if hasattr(torch, "float8_e4m3fn"):
    FORMATS[torch.float8_e4m3fn] = FloatFormat("FP8 E4M3", 4, 3, finite_only=True)
if hasattr(torch, "float8_e5m2"):
    FORMATS[torch.float8_e5m2] = FloatFormat("FP8 E5M2", 5, 2)

_INT_VIEW = {32: torch.int32, 16: torch.int16, 8: torch.uint8}


def float_format(dtype) -> FloatFormat:
    """The FloatFormat of a torch float dtype (FP32, FP16, BF16 and FP8 where torch has it)."""
    return FORMATS[one_of("dtype", dtype, list(FORMATS))]


class Fields(NamedTuple):
    """The three bit fields of a float, the stored value, and the bits as text (sign exp mantissa)."""

    sign: int
    exponent: int  # biased exponent field
    mantissa: int  # stored fraction bits, as an integer
    value: float
    bits: str


def decompose(x: float, dtype=torch.float32) -> Fields:
    """Round x to `dtype` and read its sign/exponent/mantissa fields through an integer view."""
    fmt = float_format(dtype)
    t = torch.tensor([float(x)], dtype=torch.float64).to(dtype)
    raw = int(t.view(_INT_VIEW[fmt.bits]).item()) & (2**fmt.bits - 1)  # as unsigned
    mantissa = raw & (2**fmt.mantissa_bits - 1)
    exponent = (raw >> fmt.mantissa_bits) & (2**fmt.exponent_bits - 1)
    sign = raw >> (fmt.bits - 1)
    text = format(raw, f"0{fmt.bits}b")
    bits = f"{text[0]} {text[1:1 + fmt.exponent_bits]} {text[1 + fmt.exponent_bits:]}"
    return Fields(sign, exponent, mantissa, t.double().item(), bits)


def compose(sign: int, exponent: int, mantissa: int, dtype=torch.float32) -> float:
    """The value the formula gives for three bit fields (finite numbers only).

    normal (exponent > 0):  (-1)^sign * 2^(exponent - bias) * (1 + mantissa / 2^m)
    subnormal (exponent 0): (-1)^sign * 2^(1 - bias)        * (0 + mantissa / 2^m)
    """
    fmt = float_format(dtype)
    if sign not in (0, 1):
        raise ValueError(f"sign must be 0 or 1; got {sign!r}")
    if not 0 <= exponent < 2**fmt.exponent_bits:
        raise ValueError(f"exponent must be in 0..{2**fmt.exponent_bits - 1}; got {exponent!r}")
    if not 0 <= mantissa < 2**fmt.mantissa_bits:
        raise ValueError(f"mantissa must be in 0..{2**fmt.mantissa_bits - 1}; got {mantissa!r}")
    fraction = mantissa / 2**fmt.mantissa_bits
    if exponent == 0:
        return (-1) ** sign * 2.0 ** (1 - fmt.bias) * fraction
    return (-1) ** sign * 2.0 ** (exponent - fmt.bias) * (1 + fraction)


def spacing(x: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Gap to the next representable number above |x| in `dtype` (float64 tensor, same shape).

    Constant inside each binade [2^e, 2^(e+1)): 2^(e - m); constant below the smallest normal.
    Rounding to nearest makes an error of at most half of it.
    """
    fmt = float_format(dtype)
    x = torch.as_tensor(x, dtype=torch.float64).abs()
    e = torch.floor(torch.log2(x.clamp(min=fmt.smallest_normal)))
    return torch.pow(2.0, e - fmt.mantissa_bits)


def sequential_sum(values: torch.Tensor, dtype=torch.float16) -> float:
    """Add values one at a time with the running total stored in `dtype`.

    This is what a naive loop (or an accumulator kept in low precision) does: once the total's
    spacing exceeds twice a value, adding it rounds back to the same total and nothing changes.
    """
    float_format(dtype)
    total = torch.zeros((), dtype=dtype)
    for v in torch.as_tensor(values).to(dtype):
        total = total + v
    return total.item()


def kahan_sum(values: torch.Tensor, dtype=torch.float16) -> float:
    """Compensated (Kahan) summation in `dtype`: carry the rounding error of each addition."""
    float_format(dtype)
    total = torch.zeros((), dtype=dtype)
    carry = torch.zeros((), dtype=dtype)
    for v in torch.as_tensor(values).to(dtype):
        y = v - carry
        t = total + y
        carry = (t - total) - y
        total = t
    return total.item()


# --- linear (affine) integer quantization ----------------------------------------------------------
# Lecture 02 uses it as int8 per tensor; lecture 13 (compression.quantization) at any width, per channel.

def qrange(bits: int = 8, signed: bool = True) -> tuple[int, int]:
    """(qmin, qmax) of a `bits`-bit integer: [-2^(b-1), 2^(b-1) - 1] signed, [0, 2^b - 1] unsigned."""
    int_in_range("bits", bits, 1, 16)
    boolean("signed", signed)
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


def channel_axis(axis, x: torch.Tensor) -> int:
    """`axis` as a dim of x in 0..x.dim()-1 (negative counts from the end); else ValueError."""
    int_in_range("axis", axis, -x.dim(), x.dim() - 1, hint=f" for shape {tuple(x.shape)}", allow_none=True)
    return axis % x.dim()


def _along(values, x: torch.Tensor, axis, name: str) -> torch.Tensor:
    """A number (axis None) or a per-channel vector [x.shape[axis]], shaped to broadcast against x."""
    t = torch.as_tensor(values, device=x.device)
    if axis is None:
        if t.numel() != 1:
            raise ValueError(f"{name} must be a single number for per-tensor quantization (axis=None); "
                             f"got {t.numel()} values. Pass axis=... for one value per channel.")
        return t.reshape(())
    axis = channel_axis(axis, x)
    if t.numel() != x.shape[axis]:
        raise ValueError(f"{name} must have {x.shape[axis]} values (the size of axis {axis}); got {t.numel()}")
    shape = [1] * x.dim()
    shape[axis] = -1
    return t.reshape(shape)


def broadcast_qparams(x: torch.Tensor, scale, zero_point, bits: int = 8, signed: bool = True, axis=None):
    """Validated (scale float32, zero_point float32, qmin, qmax), shaped to broadcast against x."""
    qmin, qmax = qrange(bits, signed)
    s = _along(scale, x, axis, "scale").to(torch.float32)
    if not (torch.isfinite(s) & (s > 0)).all():
        raise ValueError(f"scale must be finite and > 0; got {scale!r}")
    z = _along(zero_point, x, axis, "zero_point")
    if z.is_floating_point() and not (z == z.round()).all():
        raise ValueError(f"zero_point must hold integers; got {zero_point!r}")
    if not ((z >= qmin) & (z <= qmax)).all():
        raise ValueError(f"zero_point must be an int in {qmin}..{qmax} (bits={bits}, signed={signed}); "
                         f"got {zero_point!r}")
    return s, z.to(torch.float32), qmin, qmax


def quantize(x: torch.Tensor, scale, zero_point, bits: int = 8, signed: bool = True, axis=None) -> torch.Tensor:
    """q = clamp(round(x / scale) + zero_point, qmin, qmax): int32 codes, shape of x.

    scale/zero_point: numbers (per tensor), or [C] vectors with `axis` (per channel). round() sends
    halves to the even neighbour, and out-of-range values saturate instead of wrapping around (200
    would become -56 in int8). Like PyTorch's kernels (torch.quantize_per_tensor/_per_channel) we
    multiply by the float32 reciprocal of the scale: x / scale rounds differently a hair from a tie.
    """
    s, z, qmin, qmax = broadcast_qparams(x, scale, zero_point, bits, signed, axis)
    return (torch.round(x.float() * (1.0 / s)) + z).clamp(qmin, qmax).to(torch.int32)


def dequantize(q: torch.Tensor, scale, zero_point, bits: int = 8, signed: bool = True, axis=None) -> torch.Tensor:
    """x_hat = (q - zero_point) * scale as float32, shape of q."""
    s, z, _, _ = broadcast_qparams(q, scale, zero_point, bits, signed, axis)
    return (q.float() - z) * s


def choose_qparams(lo, hi, bits: int = 8, symmetric: bool = False, signed: bool = True):
    """(scale float32, zero_point int64), shaped like lo/hi (a number or a [C] per-channel range).

    As PyTorch's MinMaxObserver: the range is widened to include 0, so that 0.0 (padding, ReLU
    output, a pruned weight) is exact. Asymmetric maps [lo, hi] onto [qmin, qmax]; symmetric maps
    [-m, m], m = max(-lo, hi), with zero_point in the middle (0 when signed): no zero-point
    arithmetic in the matmul, at the price of wasting half the range on one-signed data.
    """
    qmin, qmax = qrange(bits, signed)
    boolean("symmetric", symmetric)
    lo, hi = torch.as_tensor(lo, dtype=torch.float32), torch.as_tensor(hi, dtype=torch.float32)
    if lo.shape != hi.shape or not (torch.isfinite(lo) & torch.isfinite(hi)).all() or (lo > hi).any():
        raise ValueError(f"lo and hi must be finite, of the same shape, with lo <= hi; got {lo!r}, {hi!r}")
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    eps = torch.finfo(torch.float32).eps
    if symmetric:
        scale = (torch.maximum(-lo, hi) / ((qmax - qmin) / 2)).clamp(min=eps)
        return scale, torch.full_like(scale, (qmin + qmax + 1) // 2, dtype=torch.int64)
    scale = ((hi - lo) / (qmax - qmin)).clamp(min=eps)
    return scale, (qmin - torch.round(lo / scale)).clamp(qmin, qmax).to(torch.int64)


def _check_fixed_bits(int_bits, frac_bits) -> None:
    non_negative_int("int_bits", int_bits)
    non_negative_int("frac_bits", frac_bits)
    if int_bits + frac_bits > 62:
        raise ValueError(f"int_bits + frac_bits must be at most 62 (int64 storage); got {int_bits + frac_bits}")


def fixed_range(int_bits: int, frac_bits: int) -> tuple[float, float, float]:
    """(smallest, largest, resolution) of signed Qm.n: 1 sign + m integer + n fraction bits."""
    _check_fixed_bits(int_bits, frac_bits)
    resolution = 2.0**-frac_bits
    return -(2.0**int_bits), 2.0**int_bits - resolution, resolution


def to_fixed(x: torch.Tensor, int_bits: int, frac_bits: int) -> torch.Tensor:
    """Signed Qm.n fixed point: the int64 tensor round(x * 2^n), saturated to the format's range.

    Every number is an integer count of the resolution 2^-n: the spacing is the same
    everywhere, unlike a float's, which grows with the magnitude.
    """
    _check_fixed_bits(int_bits, frac_bits)
    limit = 2 ** (int_bits + frac_bits)
    raw = torch.round(torch.as_tensor(x, dtype=torch.float64) * 2.0**frac_bits)
    return raw.clamp(-limit, limit - 1).to(torch.int64)


def from_fixed(q: torch.Tensor, frac_bits: int) -> torch.Tensor:
    """The float64 values q * 2^-n of raw Qm.n integers q."""
    _check_fixed_bits(0, frac_bits)
    return torch.as_tensor(q).to(torch.float64) * 2.0**-frac_bits
