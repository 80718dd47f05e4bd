import math

import pytest
import torch

from course_lib.numerics import (FORMATS, FloatFormat, choose_qparams, compose, decompose, dequantize, fixed_range,
                                 float_format, from_fixed, kahan_sum, qrange, quantize, sequential_sum, spacing,
                                 to_fixed)


@pytest.mark.parametrize("dtype", list(FORMATS))
def test_formats_from_bit_layout_match_finfo(dtype):
    fmt, fi = float_format(dtype), torch.finfo(dtype)
    assert fmt.bits == fi.bits
    assert fmt.eps == fi.eps
    assert fmt.max == fi.max
    assert fmt.smallest_normal == fi.smallest_normal
    # the smallest subnormal is the first number above zero
    tiny = torch.tensor(fmt.smallest_subnormal, dtype=torch.float64)
    assert tiny.to(dtype).double().item() == fmt.smallest_subnormal
    assert (tiny / 2).to(dtype).item() == 0.0  # half of it (a tie) rounds to even: zero


def test_known_layouts():
    assert (float_format(torch.float16).exponent_bits, float_format(torch.float16).mantissa_bits) == (5, 10)
    assert (float_format(torch.bfloat16).exponent_bits, float_format(torch.bfloat16).mantissa_bits) == (8, 7)
    assert float_format(torch.float16).max == 65504.0
    assert float_format(torch.float32).bias == 127


@pytest.mark.parametrize("name, fmt, largest", [
    ("float8_e4m3fn", FloatFormat("E4M3", 4, 3, finite_only=True), 1.75 * 2**8),     # 448: S.1111.110
    ("float8_e5m2", FloatFormat("E5M2", 5, 2), 1.75 * 2**15),                        # 57344: S.11110.11
    ("float16", FloatFormat("FP16", 5, 10), (2 - 2**-10) * 2**15),                   # 65504
    ("bfloat16", FloatFormat("BF16", 8, 7), (2 - 2**-7) * 2**127),
])
def test_largest_value_of_ieee_like_and_finite_only_formats(name, fmt, largest):
    """E4M3fn uses the top exponent for numbers (only S.1111.111 is NaN); IEEE-like formats keep it for inf/NaN."""
    dtype = getattr(torch, name)
    assert fmt.max == largest == torch.finfo(dtype).max
    top_code = 2**fmt.exponent_bits - (1 if fmt.finite_only else 2)
    top_mantissa = 2**fmt.mantissa_bits - (2 if fmt.finite_only else 1)
    assert compose(0, top_code, top_mantissa, dtype) == largest
    if fmt.bits == 8:                        # the bit pattern just above the largest value, read by torch
        above = torch.tensor([(top_code << fmt.mantissa_bits) + top_mantissa + 1], dtype=torch.uint8).view(dtype)
        assert (torch.isnan if fmt.finite_only else torch.isinf)(above.float()).all()


def test_bad_formats():
    with pytest.raises(ValueError, match="exponent_bits"):
        FloatFormat("x", 1, 3)
    with pytest.raises(ValueError, match="mantissa_bits"):
        FloatFormat("x", 5, 0)
    with pytest.raises(ValueError, match="dtype"):
        float_format(torch.int8)


@pytest.mark.parametrize("dtype", list(FORMATS))
def test_decompose_compose_round_trip(dtype):
    torch.manual_seed(0)
    fmt = float_format(dtype)
    values = torch.cat([torch.randn(50) * 10, torch.tensor([0.0, 1.0, -2.5, fmt.smallest_subnormal * 3])])
    for x in values.tolist():
        f = decompose(x, dtype)
        assert f.value == torch.tensor(x).to(dtype).double().item()
        assert compose(f.sign, f.exponent, f.mantissa, dtype) == f.value
        assert len(f.bits.replace(" ", "")) == fmt.bits


def test_decompose_known_values():
    one = decompose(1.0, torch.float32)
    assert (one.sign, one.exponent, one.mantissa) == (0, 127, 0)
    assert one.bits == "0 01111111 " + "0" * 23
    minus = decompose(-1.5, torch.float16)
    assert (minus.sign, minus.exponent, minus.mantissa) == (1, 15, 512)
    with pytest.raises(ValueError, match="dtype"):
        decompose(1.0, torch.int32)
    with pytest.raises(ValueError, match="mantissa"):
        compose(0, 1, 2**10, torch.float16)


def test_spacing_matches_nextafter_and_eps():
    x = torch.tensor([1.0, 1.5, 3.0, 1000.0, 1e-3, 1e-40], dtype=torch.float32)
    expected = (torch.nextafter(x, torch.tensor(float("inf"))) - x).double()
    assert torch.equal(spacing(x, torch.float32), expected)
    for dtype, fmt in FORMATS.items():
        assert spacing(torch.tensor(1.0), dtype).item() == fmt.eps


def test_round_to_nearest_even():
    assert torch.tensor(1 + torch.finfo(torch.float32).eps / 2).float().item() == 1.0
    # above 2048 fp16 numbers are 2 apart: ties go to the even mantissa
    assert torch.tensor([2049.0, 2051.0]).half().tolist() == [2048.0, 2052.0]


def test_low_precision_summation_stalls_kahan_fixes_it():
    values = torch.full((10_000,), 1e-4)
    exact = 1.0
    assert abs(sequential_sum(values, torch.float32) - exact) < 1e-3
    # the total stops growing once half its spacing exceeds 1e-4: at 0.25 in fp16, far earlier in bf16
    assert sequential_sum(values, torch.float16) == 0.25
    assert sequential_sum(values, torch.bfloat16) < 0.1
    assert abs(kahan_sum(values, torch.float16) - exact) < 0.01
    assert abs(kahan_sum(values, torch.bfloat16) - exact) < 0.01


@pytest.mark.parametrize("signed, zp", [(True, 5), (False, 128)])
def test_int8_quantize_matches_pytorch(signed, zp):
    """Lecture 02's use: 8 bits, one scale; codes and round trip as torch's fake-quant op computes them."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3
    qmin, qmax = qrange(8, signed)
    q = quantize(x, 0.05, zp, bits=8, signed=signed)
    fake = torch.fake_quantize_per_tensor_affine(x, 0.05, zp, qmin, qmax)
    assert q.dtype == torch.int32 and q.min() >= qmin and q.max() <= qmax
    assert torch.equal(dequantize(q, 0.05, zp, bits=8, signed=signed), fake)


@pytest.mark.parametrize("scale", [0.1, 0.03, 0.007, 1 / 3])
def test_quantize_matches_pytorch_at_near_ties(scale):
    """Values at, and one float32 step either side of, every half step: where x/scale and
    x*(1/scale) can round apart. torch multiplies by the reciprocal; so must we."""
    halves = ((torch.arange(-120, 120, dtype=torch.float32) + 0.5) * scale)
    x = torch.cat([halves, torch.nextafter(halves, halves + 1), torch.nextafter(halves, halves - 1)])
    fake = torch.fake_quantize_per_tensor_affine(x, scale, 3, -128, 127)
    assert torch.equal(dequantize(quantize(x, scale, 3), scale, 3), fake)


def test_quantize_rounds_half_even_and_saturates():
    q = quantize(torch.tensor([0.25, 0.75, -0.25, 100.0, -100.0]), 0.5, 0)
    assert q.tolist() == [0, 2, 0, 127, -128]
    assert quantize(torch.tensor([300.0, -5.0]), 1.0, 0, signed=False).tolist() == [255, 0]


def test_choose_qparams_int8_round_trip():
    x = torch.linspace(-4, 4, 2001)
    scale, zp = choose_qparams(-3.0, 3.0, bits=8)    # the range of x.clamp(-3, 3), as in lecture 02
    x_hat = dequantize(quantize(x, scale, zp), scale, zp)
    inside = x.abs() <= 3
    assert (x_hat - x)[inside].abs().max() <= scale / 2 + 1e-6      # rounding: at most half a step
    assert (x_hat - x)[~inside].abs().max() > 0.9                     # clipping outside the range
    assert dequantize(quantize(torch.zeros(1), scale, zp), scale, zp).item() == 0.0   # 0 is exact
    s, z = choose_qparams(0.5, 2.0, bits=8, signed=False)              # the range is widened to include 0
    assert z.item() == 0 and s.item() == pytest.approx(2.0 / 255)


def test_lecture_13_uses_the_same_functions():
    from course_lib.compression import quantization as Q

    assert (Q.quantize, Q.dequantize, Q.choose_qparams, Q.qrange) == (quantize, dequantize, choose_qparams, qrange)


def test_quantize_bad_input():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="scale must be finite and > 0"):
        quantize(x, 0.0, 0)
    with pytest.raises(ValueError, match=r"zero_point must be an int in -128\.\.127"):
        quantize(x, 1.0, 200)
    with pytest.raises(ValueError, match=r"bits must be an int in 1\.\.16; got 32"):
        quantize(x, 1.0, 0, bits=32)
    with pytest.raises(ValueError, match="signed must be True or False"):
        choose_qparams(-1.0, 1.0, signed=1)
    with pytest.raises(ValueError, match="scale"):
        dequantize(torch.zeros(3, dtype=torch.int32), -1.0, 0)
    with pytest.raises(ValueError, match=r"exponent_bits must be an int in 2\.\.11; got True"):
        FloatFormat("bool", True, 3)
    with pytest.raises(ValueError, match="frac_bits must be a non-negative int"):
        to_fixed(x, 3, -1)


def test_fixed_point_properties():
    lo, hi, res = fixed_range(3, 4)  # Q3.4: 8 bits
    assert (lo, hi, res) == (-8.0, 8.0 - 1 / 16, 1 / 16)
    x = torch.linspace(-7.9, 7.9, 1001, dtype=torch.float64)
    back = from_fixed(to_fixed(x, 3, 4), 4)
    assert (back - x).abs().max() <= res / 2  # rounding error at most half the resolution
    assert torch.equal(from_fixed(to_fixed(back, 3, 4), 4), back)  # representable numbers are exact
    sat = from_fixed(to_fixed(torch.tensor([100.0, -100.0]), 3, 4), 4)
    assert sat.tolist() == [hi, lo]  # saturation, no wrap-around
    assert to_fixed(torch.tensor([0.5 / 16, 1.5 / 16]), 3, 4).tolist() == [0, 2]  # ties to even
    assert math.isclose(fixed_range(0, 15)[2], 2**-15)


def test_fixed_point_bad_input():
    with pytest.raises(ValueError, match="int_bits"):
        to_fixed(torch.zeros(1), -1, 4)
    with pytest.raises(ValueError, match="frac_bits"):
        from_fixed(torch.zeros(1), 2.5)
    with pytest.raises(ValueError, match="at most 62"):
        fixed_range(40, 30)
