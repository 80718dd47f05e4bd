"""Number formats: floats from their bit layout, rounding, INT8 quantization, fixed point.

A float is sign x 2^(exponent - bias) x 1.mantissa. The exponent bits set the range, the
mantissa bits the precision; every figure in torch.finfo follows from those two counts:

    fmt = float_format(torch.bfloat16)   # 8 exponent bits, 7 mantissa bits
    fmt.eps, fmt.max, fmt.smallest_normal, fmt.smallest_subnormal
    decompose(1.5, torch.float16)        # Fields(sign=0, exponent=15, mantissa=512, ...)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class FloatFormat:
    """A binary float format: 1 sign bit, `exponent_bits`, `mantissa_bits` (stored fraction).

    finite_only: the top exponent code holds ordinary numbers instead of inf (FP8 E4M3 "fn":
    only the all-ones pattern is NaN), which extends the range by one binade.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    finite_only: bool = False

    def __post_init__(self):
        if not isinstance(self.exponent_bits, int) or not 2 <= self.exponent_bits <= 11:
            raise ValueError(f"exponent_bits must be an int in 2..11; got {self.exponent_bits!r}")
        if not isinstance(self.mantissa_bits, int) or not 1 <= self.mantissa_bits <= 52:
            raise ValueError(f"mantissa_bits must be an int in 1..52; got {self.mantissa_bits!r}")

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max_exponent(self) -> int:
        """Largest unbiased exponent of a finite number (IEEE keeps the all-ones code for inf/NaN)."""
        top = 2**self.exponent_bits - 1 if self.finite_only else 2**self.exponent_bits - 2
        return top - self.bias

    @property
    def eps(self) -> float:
        """Gap between 1 and the next float: one unit in the last mantissa place."""
        return 2.0 ** -self.mantissa_bits

    @property
    def max(self) -> float:
        # all mantissa bits set gives 2 - eps; with finite_only that pattern is NaN, so one less
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
    if dtype not in FORMATS:
        raise ValueError(f"dtype must be one of {list(FORMATS)}; got {dtype!r}")
    return FORMATS[dtype]


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


_QRANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


def _qrange(dtype) -> tuple[int, int]:
    if dtype not in _QRANGE:
        raise ValueError(f"dtype must be torch.int8 or torch.uint8; got {dtype!r}")
    return _QRANGE[dtype]


def _check_qparams(scale, zero_point, dtype) -> tuple[int, int]:
    qmin, qmax = _qrange(dtype)
    if not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive number; got {scale!r}")
    if not isinstance(zero_point, int) or not qmin <= zero_point <= qmax:
        raise ValueError(f"zero_point must be an int in {qmin}..{qmax} for {dtype}; got {zero_point!r}")
    return qmin, qmax


def quantize(x: torch.Tensor, scale: float, zero_point: int, dtype=torch.int8) -> torch.Tensor:
    """Linear quantization q = clamp(round(x / scale) + zero_point, qmin, qmax), same shape.

    round() is half-to-even (as torch.quantize_per_tensor); the clamp saturates instead of
    letting the integer wrap around (200 would otherwise become -56 in int8). Like torch's
    kernels we multiply by the float32 reciprocal of the scale: x / scale rounds differently
    for values a hair from a half step.
    """
    qmin, qmax = _check_qparams(scale, zero_point, dtype)
    inverse = 1.0 / torch.tensor(scale, dtype=torch.float32)
    q = torch.round(torch.as_tensor(x, dtype=torch.float32) * inverse) + zero_point
    return q.clamp(qmin, qmax).to(dtype)


def dequantize(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """x ~= (q - zero_point) * scale as float32, same shape as q."""
    _check_qparams(scale, zero_point, q.dtype)
    return (q.to(torch.float32) - zero_point) * scale


def choose_qparams(x: torch.Tensor, dtype=torch.int8, symmetric: bool = False) -> tuple[float, int]:
    """(scale, zero_point) that map the range of x onto the integer range, as PyTorch's
    MinMaxObserver does. The range always includes 0 so that 0.0 (padding, ReLU output) is exact.

    symmetric: range [-max|x|, max|x|], zero_point in the middle (0 for int8, 128 for uint8).
    """
    qmin, qmax = _qrange(dtype)
    x = torch.as_tensor(x, dtype=torch.float32)
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    tiny = torch.finfo(torch.float32).eps
    if symmetric:
        scale = max(max(-lo, hi) / ((qmax - qmin) / 2), tiny)
        return scale, (qmin + qmax + 1) // 2
    scale = max((hi - lo) / (qmax - qmin), tiny)
    zero_point = int(min(max(qmin - round(lo / scale), qmin), qmax))
    return scale, zero_point


def _check_fixed_bits(int_bits, frac_bits) -> None:
    for name, value in (("int_bits", int_bits), ("frac_bits", frac_bits)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int; got {value!r}")
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
