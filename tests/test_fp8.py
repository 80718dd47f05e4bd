"""course_lib.fp8: the scaled round trip is torch's own cast bit for bit; the formats' numbers from their bits;
saturation, overflow; FP8 training (X, W in E4M3, dY in E5M2, dW in fp32) against a direct computation, torch's
conv backward and torchao's emulated Float8Linear; delayed scaling."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import fp8
from course_lib.models import Net

OCP = [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)]
FNUZ = [("e4m3fnuz", torch.float8_e4m3fnuz), ("e5m2fnuz", torch.float8_e5m2fnuz)]


@pytest.mark.parametrize("fmt, dtype", OCP + FNUZ)
def test_round_trip_is_torchs_cast_bit_for_bit(fmt, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 33, generator=g) * 10.0 ** torch.empty(64, 1).uniform_(-6, 6, generator=g)
    q, scale = fp8.quantize(x, fmt)
    assert q.dtype == dtype and torch.equal(scale, torch.tensor(torch.finfo(dtype).max) / x.abs().max())
    ref = (x * scale).to(dtype)                               # amax maps to max: nothing is out of range
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))
    assert torch.equal(fp8.dequantize(q, scale), ref.float() / scale)
    assert torch.equal(fp8.fake_quant(x, fmt), ref.float() / scale)


# (exponent bits, mantissa bits, bias, top exponent code holds numbers, top mantissa of the top code is NaN)
LAYOUT = {"e4m3": (4, 3, 7, True, True), "e5m2": (5, 2, 15, False, False),
          "e4m3fnuz": (4, 3, 8, True, False), "e5m2fnuz": (5, 2, 16, True, False)}


@pytest.mark.parametrize("fmt", list(fp8.DTYPES))
def test_bit_facts_follow_from_the_layout(fmt):
    e, m, bias, top_is_finite, top_mantissa_nan = LAYOUT[fmt]
    top_code = 2**e - 1 if top_is_finite else 2**e - 2
    top_fraction = 2 - 2 ** (1 - m) if top_mantissa_nan else 2 - 2.0**-m
    facts = fp8.bit_facts(fmt)
    assert facts.max == top_fraction * 2.0 ** (top_code - bias) == fp8.fp8_max(fmt)
    assert facts.eps == 2.0**-m
    assert facts.smallest_normal == 2.0 ** (1 - bias) == torch.finfo(fp8.DTYPES[fmt]).smallest_normal
    assert facts.smallest_subnormal == 2.0 ** (1 - bias - m)
    fnuz = fmt.endswith("fnuz")
    assert facts.negative_zero is not fnuz                   # fnuz: 0x80 is the one NaN, not -0
    assert (facts.nan_codes, facts.inf_codes) == ((1, 0) if fnuz else (2, 0) if fmt == "e4m3" else (6, 2))


def test_fnuz_e4m3_is_not_ocp_e4m3():
    assert fp8.fp8_max("e4m3fnuz") == 240 and fp8.fp8_max("e4m3") == 448
    x = torch.tensor([300.0])                                 # in OCP E4M3's range, not in FNUZ's
    assert fp8.fake_quant(x, "e4m3", scale=1.0).item() == 288 and fp8.fake_quant(x, "e4m3fnuz", scale=1.0).item() == 240
    families = {f for hw in fp8.HARDWARE for f in hw.formats}
    assert families <= set(fp8.DTYPES) and all(hw.source for hw in fp8.HARDWARE)
    by_chip = {chip.strip(): hw.formats for hw in fp8.HARDWARE for chip in hw.chips.split(",")}
    assert by_chip["MI300X"] == ("e4m3fnuz", "e5m2fnuz") and by_chip["MI355X"] == by_chip["L40S"] == ("e4m3", "e5m2")


def test_saturation_and_overflow():
    x = torch.tensor([1.0, 470.0, -1e6, float("inf"), float("nan")])
    assert fp8.cast(x, "e4m3").float()[:4].tolist() == [1.0, 448.0, -448.0, 448.0]
    assert torch.isnan(fp8.cast(x, "e4m3").float()[4])
    e4 = fp8.cast(torch.tensor([464.0, 465.0]), "e4m3", saturate=False).float()   # 464: tie -> 448 (even)
    assert e4[0] == 448 and torch.isnan(e4[1])                                      # e4m3fn has no inf
    e5 = fp8.cast(torch.tensor([60000.0, 1e6]), "e5m2", saturate=False).float()
    assert e5[0] == 57344 and torch.isinf(e5[1])                                    # e5m2 has inf
    assert torch.equal(fp8.cast(torch.tensor([1e6]), "e5m2").float(), torch.tensor([57344.0]))
    fnuz = fp8.cast(torch.tensor([1e6, 247.0, 248.0]), "e4m3fnuz", saturate=False).float()
    assert torch.isnan(fnuz[0]) and fnuz[1] == 240 and torch.isnan(fnuz[2])         # 248: tie -> 256 (even): NaN
    assert fp8.cast(torch.tensor([1e6]), "e4m3fnuz").float().item() == 240


def test_zero_tensor_and_scales():
    q, scale = fp8.quantize(torch.zeros(5))
    assert scale == 1 and torch.equal(fp8.dequantize(q, scale), torch.zeros(5))
    assert fp8.fp8_max("e4m3") == 448 and fp8.fp8_max("e5m2") == 57344


# --- FP8 training: what is rounded where --------------------------------------------------------------

def on_grid(shape, fmt, seed):
    """Values already on the fmt grid whose amax is the format's max: their scale is exactly 1."""
    g = torch.Generator().manual_seed(seed)
    x = fp8.cast(torch.randn(*shape, generator=g) * fp8.fp8_max(fmt) / 8, fmt).float()
    x.view(-1)[0] = fp8.fp8_max(fmt)
    return x


def linear_grads(x, w, b, dy, grad_fmt="e5m2"):
    x, w, b = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = fp8.Fp8Matmul.apply(x, w, b, "e4m3", grad_fmt, None)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


def test_on_the_grid_with_scale_1_it_is_the_fp32_matmul():
    x, w, dy = on_grid((6, 8), "e4m3", 0), on_grid((5, 8), "e4m3", 1), on_grid((6, 5), "e5m2", 2)
    b = torch.randn(5)
    assert fp8.amax_scale(x.abs().max()) == 1 and fp8.amax_scale(dy.abs().max(), "e5m2") == 1
    y, dx, dw, db = linear_grads(x, w, b, dy)
    assert torch.equal(y, x @ w.T + b)
    assert torch.equal(dx, dy @ w) and torch.equal(dw, dy.T @ x) and torch.equal(db, dy.sum(0))


@pytest.mark.parametrize("grad_fmt", ["e5m2", "e4m3"])
def test_forward_rounds_x_and_w_backward_rounds_dy_only(grad_fmt):
    g = torch.Generator().manual_seed(3)
    x, w, b, dy = (torch.randn(*s, generator=g) for s in ((2, 7, 16), (4, 16), (4,), (2, 7, 4)))
    y, dx, dw, db = linear_grads(x, w, b, dy, grad_fmt)
    xq, wq, dyq = fp8.fake_quant(x, "e4m3"), fp8.fake_quant(w, "e4m3"), fp8.fake_quant(dy, grad_fmt)
    assert torch.equal(y, xq @ wq.T + b) and not torch.allclose(y, x @ w.T + b, rtol=1e-4, atol=0)
    assert torch.equal(dx, dyq @ wq) and not torch.allclose(dx, dy @ wq, rtol=1e-4, atol=0)   # dY rounded
    assert torch.equal(dw, dyq.flatten(0, 1).T @ xq.flatten(0, 1))
    assert dw.dtype == torch.float32 and not torch.equal(dw, fp8.fake_quant(dw, "e5m2"))      # dW not rounded
    assert torch.equal(db, dy.sum((0, 1)))                                                  # from the fp32 dY
    other = linear_grads(x, w, b, dy, "e4m3" if grad_fmt == "e5m2" else "e5m2")[1]
    assert not torch.equal(dx, other)                         # the gradient format shows in dX


def test_conv_matches_torchs_conv_backward_on_the_rounded_operands():
    g = torch.Generator().manual_seed(4)
    x, w, b = torch.randn(3, 4, 9, 9, generator=g), torch.randn(6, 2, 3, 3, generator=g), torch.randn(6, generator=g)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    with torch.no_grad():
        conv.weight.copy_(w), conv.bias.copy_(b)
    conv8 = fp8.fp8_training(conv)
    xa = x.clone().requires_grad_(True)
    y = conv8(xa)
    dy = torch.randn(y.shape, generator=g)
    y.backward(dy)
    xq, wq = (fp8.fake_quant(t, "e4m3").requires_grad_(True) for t in (x, w))
    bq = b.clone().requires_grad_(True)
    ref = F.conv2d(xq, wq, bq, stride=2, padding=1, groups=2)
    ref.backward(fp8.fake_quant(dy, "e5m2"))
    assert torch.equal(y, ref)
    assert torch.allclose(xa.grad, xq.grad, rtol=1e-6, atol=1e-6)
    assert torch.allclose(conv8.weight.grad, wq.grad, rtol=1e-6, atol=1e-5)
    assert torch.allclose(conv8.bias.grad, dy.sum((0, 2, 3)), rtol=1e-6, atol=1e-5)


def test_matches_torchaos_emulated_float8_linear():
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8))
        theirs = copy.deepcopy(model)
        convert_to_float8_training(theirs, config=Float8LinearConfig(emulate=True))
    except Exception as e:                         # not installed, or its API changed
        pytest.skip(f"torchao.float8 does not run here: {type(e).__name__}: {e}")
    ours = fp8.fp8_training(model)
    x, dy = torch.randn(12, 32), torch.randn(12, 8)
    outs = []
    for net in (ours, theirs):
        xa = x.clone().requires_grad_(True)
        y = net(xa)
        y.backward(dy)
        outs.append([y.detach(), xa.grad] + [p.grad for p in net.parameters()])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_torchao_offers_current_scaling_only():
    try:
        from torchao.float8 import ScalingType
    except Exception as e:
        pytest.skip(f"torchao.float8 is not importable here: {type(e).__name__}: {e}")
    names = {s.name for s in ScalingType}
    assert "DYNAMIC" in names and "DELAYED" not in names     # as fp8.DelayedScaling's docstring says


def synthetic_digits(n, seed):
    """Images of 10 fixed random patterns plus noise, label = pattern: a task Net learns in a few dozen steps."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(99))
    y = torch.randint(0, 10, (n,), generator=g)
    return patterns[y] + 0.5 * torch.randn(n, 1, 28, 28, generator=g), y


def train(model, x, y, steps=40):
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses = []
    for i in range(steps):
        xb, yb = x[32 * (i % 8): 32 * (i % 8 + 1)], y[32 * (i % 8): 32 * (i % 8 + 1)]
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, opt


def test_fp8_training_of_net_learns_like_bf16_and_keeps_fp32_state():
    torch.manual_seed(0)
    net = Net()
    x, y = synthetic_digits(256, 0)
    xt, yt = synthetic_digits(512, 1)
    accuracy = {}
    for name, fmts in {"bf16": ("bf16", "bf16"), "e5m2": ("e4m3", "e5m2"), "e4m3": ("e4m3", "e4m3")}.items():
        model = fp8.fp8_training(net, *fmts)
        losses, opt = train(model, x, y)
        assert sum(losses[-5:]) < 0.6 * sum(losses[:5]), name             # the loss falls
        with torch.no_grad():
            accuracy[name] = (model.eval()(xt).argmax(1) == yt).float().mean().item()
        assert list(model.state_dict()) == list(net.state_dict())           # same names, fp32 master weights
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(s.dtype == torch.float32 for st in opt.state.values() for s in st.values())
    assert accuracy["bf16"] > 0.9                                           # chance: 0.1
    assert abs(accuracy["e5m2"] - accuracy["bf16"]) < 0.05 and abs(accuracy["e4m3"] - accuracy["bf16"]) < 0.05
    assert not torch.equal(net.conv1.weight, model.conv1.weight)       # a copy was trained, not the original


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
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(12, 4))
    shapes = []
    q = fp8.fake_quantized(model, lambda w: shapes.append(w.shape) or fp8.fake_quant(w), lambda x: x.round())
    assert shapes == [model[0].weight.shape, model[2].weight.shape]       # each weight in its own shape
    x = torch.randn(3, 2, 4, 4) * 3
    h = F.conv2d(x.round(), fp8.fake_quant(model[0].weight.detach()), model[0].bias).flatten(1)
    want = F.linear(h.round(), fp8.fake_quant(model[2].weight.detach()), model[2].bias)
    assert torch.allclose(q(x), want) and not torch.equal(model[0].weight, q[0].weight)


@pytest.mark.parametrize("call, error, match", [
    (lambda: fp8.quantize(torch.arange(4)), TypeError, "floating-point"),
    (lambda: fp8.quantize([1.0, 2.0]), TypeError, "floating-point"),
    (lambda: fp8.quantize(torch.ones(2), "e3m4"), ValueError, "fmt"),
    (lambda: fp8.fp8_max("fp8"), ValueError, "e4m3"),
    (lambda: fp8.bit_facts("fp8"), ValueError, "fmt"),
    (lambda: fp8.DelayedScaling("e4m3", history=0), ValueError, "history"),
    (lambda: fp8.fp8_training(Net(), grad_fmt="fp16"), ValueError, "grad_fmt"),
    (lambda: fp8.fp8_training(nn.Conv2d(1, 2, 3, padding="same")), ValueError, "padding"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
