"""Linear quantization from scratch agrees with PyTorch's own quantize/fake-quantize ops, bit for bit."""
import warnings

import pytest
import torch
from torch import nn

from course_lib import numerics
from course_lib.compression import quantization as Q
from course_lib.models import LeNet5, LeNet300, Net

# torch 2.14 warns that quantized tensors (torch.quantize_per_tensor & co.) are deprecated:
# compare against them while they exist, skip when they are gone.
HAS_QTENSORS = hasattr(torch, "quantize_per_tensor") and hasattr(torch, "quantize_per_channel")
needs_qtensors = pytest.mark.skipif(not HAS_QTENSORS, reason="torch has no quantized tensors any more")
TORCH_DTYPES = {(8, True): torch.qint8, (8, False): torch.quint8}


def hard_cases(scale: float, n: int = 300, seed: int = 0) -> torch.Tensor:
    """Random values, exact halves of the grid, their float32 neighbours (x/scale and x*(1/scale)
    round differently there), and values far outside the range (clamping)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.tensor(scale, dtype=torch.float32)
    halves = (torch.arange(-150, 150, dtype=torch.float32) + 0.5) * s
    return torch.cat([torch.randn(n, generator=g) * 60 * s, halves, torch.nextafter(halves, halves + 1),
                      torch.nextafter(halves, halves - 1), torch.tensor([1e6, -1e6, 0.0])])


@pytest.fixture(autouse=True)
def _no_deprecation_noise():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_qrange():
    assert Q.qrange(8) == (-128, 127) and Q.qrange(8, signed=False) == (0, 255)
    assert Q.qrange(4) == (-8, 7) and Q.qrange(1, signed=False) == (0, 1) and Q.qrange(16) == (-32768, 32767)


@needs_qtensors
@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("scale, zero_point", [(0.5, 0), (0.0123, 3), (0.37, -20), (1e-3, 100)])
def test_quantize_per_tensor_matches_torch(signed, scale, zero_point):
    if not signed:
        zero_point += 128
    x = hard_cases(scale)
    ours = Q.quantize(x, scale, zero_point, bits=8, signed=signed)
    theirs = torch.quantize_per_tensor(x, scale, zero_point, TORCH_DTYPES[(8, signed)])
    assert torch.equal(ours, theirs.int_repr().to(torch.int32))
    assert torch.equal(Q.dequantize(ours, scale, zero_point, 8, signed), theirs.dequantize())


@needs_qtensors
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_per_channel_matches_torch(axis):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 5, 4, generator=g) * 3
    n = x.shape[axis]
    scales = torch.rand(n, generator=g, dtype=torch.float64) * 0.05 + 0.01
    zero_points = torch.randint(-20, 20, (n,), generator=g)
    theirs = torch.quantize_per_channel(x, scales, zero_points, axis % 3, torch.qint8)
    ours = Q.quantize(x, scales, zero_points, bits=8, axis=axis)
    assert torch.equal(ours, theirs.int_repr().to(torch.int32))
    # torch's per-channel dequantize multiplies in float64 (per-tensor: float32): 1 ulp apart at most
    assert torch.allclose(Q.dequantize(ours, scales, zero_points, axis=axis), theirs.dequantize(), rtol=1.2e-7, atol=0)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8, 12, 16])
@pytest.mark.parametrize("signed", [True, False])
def test_fake_quantize_per_tensor_matches_torch_values_and_gradient(bits, signed):
    qmin, qmax = Q.qrange(bits, signed)
    scale, zero_point = 0.0731, (qmin + qmax) // 2
    x = hard_cases(scale, seed=bits).requires_grad_()
    ours = Q.fake_quantize(x, scale, zero_point, bits, signed)
    (g_ours,) = torch.autograd.grad(ours.sum(), x)
    theirs = torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin, qmax)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), x)
    assert torch.equal(ours, theirs)
    assert torch.equal(g_ours, g_theirs)            # straight through inside, 0 where clamped
    assert 0 < g_ours.sum() < len(x)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_fake_quantize_per_channel_matches_torch_values_and_gradient(bits):
    g = torch.Generator().manual_seed(bits)
    x = (torch.randn(7, 30, generator=g) * 2).requires_grad_()
    qmin, qmax = Q.qrange(bits)
    scales = torch.rand(7, generator=g) * 0.3 + 0.05
    zero_points = torch.randint(qmin, qmax + 1, (7,), generator=g, dtype=torch.int32)
    ours = Q.fake_quantize(x, scales, zero_points, bits, axis=0)
    theirs = torch.fake_quantize_per_channel_affine(x, scales, zero_points, 0, qmin, qmax)
    assert torch.equal(ours, theirs)
    upstream = torch.randn(7, 30, generator=g)
    assert torch.equal(torch.autograd.grad(ours, x, upstream)[0], torch.autograd.grad(theirs, x, upstream)[0])


def test_halves_round_to_even_and_out_of_range_saturates():
    q = Q.quantize(torch.tensor([0.25, 0.75, 1.25, -0.25, -0.75, 100.0, -100.0]), 0.5, 0, bits=4)
    assert q.tolist() == [0, 2, 2, 0, -2, 7, -8]


def test_is_lecture_02s_quantization_and_covers_fixed_point():
    assert Q.quantize is numerics.quantize and Q.choose_qparams is numerics.choose_qparams   # one implementation
    # Qm.n fixed point is linear quantization with scale 2^-n, zero point 0, 1 + m + n bits
    m, n = 3, 4
    xs = torch.tensor([0.03125, -0.09375, 1.7, -8.0, 7.97, 20.0, -20.0])
    assert torch.equal(Q.quantize(xs, 2.0**-n, 0, bits=1 + m + n).long(), numerics.to_fixed(xs, m, n))


def _torch_observer(per_channel: bool, **kwargs):
    """PyTorch's MinMaxObserver (torch.ao, deprecated) or its torchao copy; None if neither exists."""
    for module in ("torch.ao.quantization.observer", "torchao.quantization.pt2e"):
        try:
            mod = __import__(module, fromlist=["MinMaxObserver"])
        except ImportError:
            continue
        cls = mod.PerChannelMinMaxObserver if per_channel else mod.MinMaxObserver
        return cls(**kwargs)
    return None


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("dtype, bits, signed", [(torch.qint8, 8, True), (torch.quint8, 8, False),
                                                 (torch.qint8, 4, True)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_choose_qparams_matches_torch_minmax_observer(symmetric, dtype, bits, signed, per_channel):
    qmin, qmax = Q.qrange(bits, signed)
    qscheme = ((torch.per_channel_symmetric if symmetric else torch.per_channel_affine) if per_channel
               else (torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine))
    observer = _torch_observer(per_channel, dtype=dtype, qscheme=qscheme, quant_min=qmin, quant_max=qmax)
    if observer is None:
        pytest.skip("neither torch.ao nor torchao has a MinMaxObserver")
    if symmetric and not signed:
        pytest.skip("torch puts a custom unsigned symmetric range's zero point at (qmin+qmax)//2, we at 128")
    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(2)) + 0.7
    observer(x)
    t_scale, t_zp = observer.calculate_qparams()
    axis = 0 if per_channel else None
    lo, hi = Q.observe_range(x, "minmax", axis)
    scale, zp = Q.choose_qparams(lo, hi, bits, symmetric, signed)
    assert torch.allclose(scale, t_scale.reshape(scale.shape), rtol=1e-6, atol=0)
    assert torch.equal(zp, t_zp.reshape(zp.shape).long())


def test_range_includes_zero_so_zero_is_exact():
    x = torch.linspace(2.0, 5.0, 50)                       # all positive: lo is widened to 0
    scale, zp = Q.choose_qparams(x.min(), x.max(), bits=4, signed=False)
    assert zp.item() == 0
    assert Q.fake_quantize(torch.tensor([0.0]), scale, zp, 4, False).item() == 0.0
    assert (Q.fake_quantize(x, scale, zp, 4, False) - x).abs().max() <= scale / 2 + 1e-6


def test_observers():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10000, generator=g)
    x[0] = 50.0                                            # one outlier
    lo, hi = Q.observe_range(x, "minmax")
    assert hi == 50.0
    lo_p, hi_p = Q.observe_range(x, "percentile", percentile=99.9)
    assert 2 < hi_p < 5 and -5 < lo_p < -2                 # the outlier is clipped
    for bits in (3, 4):
        errors = {}
        for method in Q.OBSERVERS:
            lo, hi = Q.observe_range(x, method, bits=bits)
            s, z = Q.choose_qparams(lo, hi, bits)
            errors[method] = (Q.fake_quantize(x, s, z, bits) - x).pow(2).mean().item()
        assert errors["mse"] <= 1.1 * min(errors.values()) and errors["mse"] < errors["minmax"] / 2
    w = torch.randn(6, 20, generator=g)
    lo, hi = Q.observe_range(w, "mse", axis=0, bits=3, symmetric=True)
    assert lo.shape == hi.shape == (6,) and (hi <= w.amax(1)).all()


def test_observer_module_calibration_and_ema():
    obs = Q.Observer("minmax", bits=8)
    with pytest.raises(RuntimeError, match="calibrate"):
        obs.qparams()
    obs.update(torch.tensor([0.0, 1.0]))
    obs.update(torch.tensor([-2.0, 0.5]))
    assert (obs.lo.item(), obs.hi.item()) == (-2.0, 1.0)     # extremes over all batches
    obs.update(torch.tensor([0.0, 11.0]), ema=True)
    assert obs.hi.item() == pytest.approx(1.0 + 0.01 * 10)
    mean = Q.Observer("percentile", percentile=100)
    mean.update(torch.tensor([0.0, 2.0]))
    mean.update(torch.tensor([0.0, 4.0]))
    assert mean.hi.item() == pytest.approx(3.0)               # per-batch estimates averaged
    scale, zp = obs.qparams()
    assert scale > 0 and 0 <= zp <= 255


@pytest.mark.parametrize("call, match", [
    (lambda: Q.qrange(0), "bits must be an int in 1..16"),
    (lambda: Q.qrange(17), "bits must be an int in 1..16"),
    (lambda: Q.qrange(8.0), "bits"),
    (lambda: Q.qrange(True), "bits"),
    (lambda: Q.qrange(8, signed="yes"), "signed must be True or False"),
    (lambda: Q.quantize(torch.ones(3), 0.0, 0), "scale must be finite and > 0"),
    (lambda: Q.quantize(torch.ones(3), -1.0, 0), "scale must be finite and > 0"),
    (lambda: Q.quantize(torch.ones(3), 0.1, 128), r"zero_point must be an int in -128\.\.127"),
    (lambda: Q.quantize(torch.ones(3), 0.1, -1, signed=False), r"zero_point must be an int in 0\.\.255"),
    (lambda: Q.quantize(torch.ones(3), 0.1, 0.5), "zero_point must hold integers"),
    (lambda: Q.quantize(torch.ones(3, 2), torch.ones(2), 0), "scale must be a single number"),
    (lambda: Q.quantize(torch.ones(3, 2), torch.ones(2), torch.zeros(2), axis=0), r"scale must have 3 values"),
    (lambda: Q.quantize(torch.ones(3, 2), torch.ones(3), torch.zeros(3), axis=2), r"axis must be None or an int"),
    (lambda: Q.choose_qparams(1.0, -1.0), "lo <= hi"),
    (lambda: Q.choose_qparams(-1.0, 1.0, symmetric="yes"), "symmetric must be True or False"),
    (lambda: Q.observe_range(torch.ones(4), "kl"), r"method must be one of \('minmax', 'percentile', 'mse'\)"),
    (lambda: Q.observe_range(torch.ones(4), "percentile", percentile=30), r"percentile must be a number in \(50, 100\]"),
    (lambda: Q.QuantConfig(weight_observer="histogram"), "weight_observer must be one of"),
    (lambda: Q.QuantConfig(act_observer="max"), "act_observer must be one of"),
    (lambda: Q.QuantConfig(bits=32), "bits must be an int in 1..16"),
    (lambda: Q.QuantConfig(per_channel=1), "per_channel must be True or False"),
    (lambda: Q.Observer(momentum=0), r"momentum must be a number in \(0, 1\]"),
    (lambda: Q.prepare(nn.Sequential(nn.ReLU())), "no nn.Linear or nn.Conv2d"),
    (lambda: Q.prepare(LeNet300(), bitz=4), "unexpected keyword"),
    (lambda: Q.calibrate(LeNet300(), [torch.ones(1, 784)]), "prepare"),
    (lambda: Q.calibrate(Q.prepare(LeNet300()), []), "at least one batch"),
])
def test_bad_input_is_refused_with_a_clear_message(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_prepare_swaps_linear_and_conv_and_leaves_the_float_model_alone():
    torch.manual_seed(0)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = Q.prepare(model, bits=4)
    assert sorted(Q.quant_layers(q)) == ["conv1", "conv2", "fc1", "fc2"]
    assert isinstance(q.conv1, Q.QuantConv2d) and isinstance(q.fc1, Q.QuantLinear)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(isinstance(m, (nn.Linear, nn.Conv2d)) and not isinstance(m, Q._QuantLayer)
               for m in (model.conv1, model.fc1))
    assert "bits=4" in repr(q.fc1)


def test_quant_conv_computes_with_torchs_fake_quantized_weight_and_input():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8)
    q = Q.ptq(nn.Sequential(conv), [x], bits=4, act_bits=6).eval()[0]
    wmax = conv.weight.detach().abs().amax((1, 2, 3))
    w = torch.fake_quantize_per_channel_affine(conv.weight, wmax / 7.5, torch.zeros(4, dtype=torch.int32), 0, -8, 7)
    scale, zp = Q.choose_qparams(x.min(), x.max(), bits=6, signed=False)
    xq = torch.fake_quantize_per_tensor_affine(x, scale.item(), int(zp), 0, 63)
    assert torch.allclose(q(x), nn.functional.conv2d(xq, w, conv.bias), atol=1e-6)


def test_ptq_at_16_bits_is_nearly_float_and_low_bits_are_not():
    torch.manual_seed(0)
    model = LeNet300().eval()
    x = torch.randn(64, 1, 28, 28)
    ref = model(x)
    err = {bits: (Q.ptq(model, [x], bits=bits, act_bits=bits)(x) - ref).abs().max().item() for bits in (16, 8, 2)}
    assert err[16] < 1e-3 < err[8] * 10 and err[8] < err[2]
    weight_only = Q.ptq(model, [x], bits=8, act_bits=None)
    assert weight_only.fc1.act is None and (weight_only(x) - ref).abs().max() < err[8] * 2


def test_calibration_does_not_quantize_and_qat_trains_through_the_ste():
    torch.manual_seed(0)
    model = LeNet5()
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    q = Q.prepare(model, bits=4, act_bits=4)
    for layer in Q.quant_layers(q).values():
        assert layer.observing
    Q.calibrate(q, [(x, y)])
    assert not any(layer.observing for layer in Q.quant_layers(q).values())
    q.train()
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    lo_before = q.fc1.act.lo.clone()
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(q(x), y)
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (q.conv1.weight, q.fc2.weight))
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.7
    assert not torch.equal(q.fc1.act.lo, lo_before)         # EMA followed the activations


def test_weight_qparams_are_recomputed_after_the_weight_changes():
    layer = Q.ptq(nn.Sequential(nn.Linear(4, 3)), [torch.randn(2, 4)], bits=8, act_bits=None)[0]
    first = layer.quantized_weight()
    with torch.no_grad():
        layer.weight.mul_(2)
    assert torch.allclose(layer.quantized_weight(), 2 * first)


# --- the agreement checks lecture 13 used to run in its cells -----------------------------------------

def test_lecture_13_example_round_trip_error_is_half_a_step_and_matches_torch():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 2 + 1
    scale, zero_point = Q.choose_qparams(x.min(), x.max(), bits=8)
    scale, zero_point = scale.item(), int(zero_point)
    q = Q.quantize(x, scale, zero_point, bits=8)
    x_hat = Q.dequantize(q, scale, zero_point, bits=8)
    assert (x_hat - x).abs().max() <= scale / 2 + 1e-6            # rounding error: at most half a step
    assert torch.equal(x_hat, torch.fake_quantize_per_tensor_affine(x, scale, zero_point, -128, 127))
    if hasattr(torch, "quantize_per_tensor"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = torch.quantize_per_tensor(x, scale, zero_point, torch.qint8)
        assert torch.equal(q, theirs.int_repr().to(torch.int32))
    halves = Q.quantize(torch.tensor([0.25, 0.75, 1.25, 100.0, -100.0]), scale=0.5, zero_point=0, bits=4)
    assert halves.tolist() == [0, 2, 2, 7, -8]


def test_symmetric_wastes_half_the_levels_on_one_signed_data_not_on_weights():
    g = torch.Generator().manual_seed(0)
    data = {"relu": torch.relu(torch.randn(10_000, generator=g)), "weights": torch.randn(10_000, generator=g) * 0.05}
    mse = {}
    for name, t in data.items():
        for symmetric in (False, True):
            s, z = Q.choose_qparams(t.min(), t.max(), bits=4, symmetric=symmetric)
            mse[name, symmetric] = (Q.fake_quantize(t, s, z, bits=4) - t).pow(2).mean().item()
    assert mse["relu", True] > 3 * mse["relu", False]
    assert mse["weights", True] < 1.5 * mse["weights", False]


def test_per_channel_never_worse_and_one_more_bit_quarters_the_error():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 784, generator=g) * (torch.rand(300, 1, generator=g) * 0.1 + 0.01)   # rows of differing spread
    err = {pc: [(Q.quantize_weight(w, b, pc) - w).pow(2).mean().item() for b in range(2, 9)] for pc in (False, True)}
    assert all(c <= t for c, t in zip(err[True], err[False]))
    assert 2.5 < err[True][3] / err[True][4] < 6          # 5 -> 6 bits: about 4x less error
