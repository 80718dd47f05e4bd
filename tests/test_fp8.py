"""course_lib.fp8: the scaled round trip is torch's own cast bit for bit; saturation, overflow, STE, delayed scaling."""
import pytest
import torch

from course_lib import fp8


@pytest.mark.parametrize("fmt, dtype", [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)])
def test_round_trip_is_torchs_cast_bit_for_bit(fmt, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 33, generator=g) * 10.0 ** torch.empty(64, 1).uniform_(-6, 6, generator=g)
    q, scale = fp8.quantize(x, fmt)
    assert q.dtype == dtype and torch.equal(scale, torch.finfo(dtype).max / x.abs().max())
    ref = (x * scale).to(dtype)                               # amax maps to max: nothing is out of range
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))
    assert torch.equal(fp8.dequantize(q, scale), ref.float() / scale)
    assert torch.equal(fp8.fake_quant(x, fmt), ref.float() / scale)


def test_saturation_and_overflow():
    x = torch.tensor([1.0, 470.0, -1e6, float("inf"), float("nan")])
    assert fp8.cast(x, "e4m3").float()[:4].tolist() == [1.0, 448.0, -448.0, 448.0]
    assert torch.isnan(fp8.cast(x, "e4m3").float()[4])
    e4 = fp8.cast(torch.tensor([464.0, 465.0]), "e4m3", saturate=False).float()   # 464: tie -> 448 (even)
    assert e4[0] == 448 and torch.isnan(e4[1])                                      # e4m3fn has no inf
    e5 = fp8.cast(torch.tensor([60000.0, 1e6]), "e5m2", saturate=False).float()
    assert e5[0] == 57344 and torch.isinf(e5[1])                                    # e5m2 has inf
    assert torch.equal(fp8.cast(torch.tensor([1e6]), "e5m2").float(), torch.tensor([57344.0]))


def test_zero_tensor_and_scales():
    q, scale = fp8.quantize(torch.zeros(5))
    assert scale == 1 and torch.equal(fp8.dequantize(q, scale), torch.zeros(5))
    assert fp8.fp8_max("e4m3") == 448 and fp8.fp8_max("e5m2") == 57344


def test_straight_through_gradient_is_e5m2():
    x = torch.randn(50, requires_grad=True)
    grad = torch.randn(50) * 1e-3
    y = fp8.Fp8Cast.apply(x)
    assert torch.equal(y, fp8.fake_quant(x.detach(), "e4m3"))
    y.backward(grad)
    assert torch.equal(x.grad, fp8.fake_quant(grad, "e5m2")) and not torch.equal(x.grad, grad)


def test_delayed_scaling_uses_the_history_and_saturates_on_a_jump():
    ds = fp8.DelayedScaling("e4m3", history=2)
    x = torch.linspace(-1, 1, 11)
    assert torch.equal(ds(x), fp8.fake_quant(x, "e4m3"))      # first call: current amax
    y = ds(x * 10)                                             # amax jumped 10x: history says 1
    assert ds.saturated > 0 and y.abs().max() == 1.0
    ds(x * 10), ds(x * 10)
    assert ds.amaxes == [10.0, 10.0]                          # history of length 2: the 1 is forgotten


def test_fake_quantized_model_rounds_weights_and_inputs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    q = fp8.fake_quantized(model, lambda w: fp8.fake_quant(w), lambda x: x.round())
    x = torch.randn(3, 8) * 3
    want = torch.nn.functional.linear(x.round(), fp8.fake_quant(model[0].weight.detach()), model[0].bias)
    assert torch.allclose(q(x), want) and not torch.equal(model[0].weight, q[0].weight)


@pytest.mark.parametrize("call, error, match", [
    (lambda: fp8.quantize(torch.arange(4)), TypeError, "floating-point"),
    (lambda: fp8.quantize([1.0, 2.0]), TypeError, "floating-point"),
    (lambda: fp8.quantize(torch.ones(2), "e3m4"), ValueError, "fmt"),
    (lambda: fp8.fp8_max("fp8"), ValueError, "e4m3"),
    (lambda: fp8.DelayedScaling("e4m3", history=0), ValueError, "history"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
