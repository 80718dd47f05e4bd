"""course_lib.precision against torch.autocast, torch.amp.GradScaler and plain casts."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import precision as P
from course_lib.models import Net
from course_lib.numerics import float_format


def test_check_precision_maps_names_to_dtypes_and_refuses_fp16_off_cuda():
    assert P.check_precision("32", "cpu") is None
    assert P.check_precision("bf16", "cpu") is torch.bfloat16
    with pytest.raises(ValueError, match="precision must be one of"):
        P.check_precision("fp16", "cpu")
    with pytest.raises(ValueError, match=r"--precision 16 .*CUDA.*Use --precision bf16"):
        P.check_precision("16", "cpu", name="--precision")
    assert P.grad_scaler("32", "cpu") is None and P.grad_scaler("bf16", "cpu") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp16_on_cuda_gets_a_grad_scaler():
    assert P.check_precision("16", "cuda") is torch.float16
    assert isinstance(P.grad_scaler("16", "cuda"), torch.amp.GradScaler)


def test_autocast_computes_matmuls_in_bf16_and_keeps_fp32_weights_and_grads():
    model = nn.Linear(8, 3)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    with P.autocast("bf16", "cpu"):
        out = model(x)
        loss = F.cross_entropy(out, y)
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32   # cross-entropy: fp32 list
    loss.backward()
    assert model.weight.dtype == model.weight.grad.dtype == torch.float32  # the master weights
    with P.autocast("32", "cpu"):
        assert model(x).dtype == torch.float32


@pytest.mark.parametrize("dtype,update,stored", [
    (torch.bfloat16, 1e-4, 0.0), (torch.float16, 1e-4, 0.0),       # below half the spacing at 1
    (torch.bfloat16, 1e-2, 2.0**-7), (torch.float16, 1e-2, 10 * 2.0**-10),   # rounded to the spacing
])
def test_stored_update_rounds_small_updates_away(dtype, update, stored):
    assert P.stored_update(1.0, update, dtype) == stored
    assert P.stored_update(1.0, 1e-4, torch.float32) == pytest.approx(1e-4, rel=1e-3)
    # the rule: an update below half of eps (the spacing at 1) vanishes
    assert (update < float_format(dtype).eps / 2) == (stored == 0.0)


def regression(seed=0, n=64, d=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w_true = 1 + 0.1 * torch.randn(d, generator=g)
    return x, x @ w_true


def train_regression(kind, steps=150, lr=3e-3):
    """kind: fp32, bf16 (weights stored in bf16), master (bf16 + fp32 master), autocast (torch's)."""
    x, y = regression()
    model = nn.Linear(16, 1, bias=False)
    nn.init.ones_(model.weight)
    if kind in ("bf16", "master"):
        model = model.to(torch.bfloat16)
    if kind == "master":
        master = P.MasterWeights(model, lambda ps: torch.optim.SGD(ps, lr=lr))
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        with P.autocast("bf16" if kind == "autocast" else "32", "cpu"):
            loss = F.mse_loss(model(x.to(model.weight.dtype)).float().squeeze(1), y)
        model.zero_grad()
        loss.backward()
        master.step() if kind == "master" else opt.step()
    return F.mse_loss(model.float()(x).squeeze(1), y).item(), model


def test_master_weights_keep_small_updates_that_bf16_weights_lose():
    start = F.mse_loss(regression()[0].sum(1), regression()[1]).item()
    fp32, _ = train_regression("fp32")
    bf16, bf16_model = train_regression("bf16")
    master, _ = train_regression("master")
    amp, _ = train_regression("autocast")
    assert fp32 < 0.2 * start
    assert bf16 == pytest.approx(start, rel=1e-3) and torch.all(bf16_model.weight == 1)  # nothing moved
    assert master == pytest.approx(fp32, rel=0.15) and amp == pytest.approx(fp32, rel=0.15)


def test_master_weights_equal_a_hand_written_loop_and_skip_inf():
    x, y = regression()
    low = nn.Linear(16, 1).to(torch.bfloat16)
    ref = copy.deepcopy(low)
    master = P.MasterWeights(low, lambda ps: torch.optim.SGD(ps, lr=0.01))
    copies = [p.detach().float().clone() for p in ref.parameters()]
    for _ in range(5):
        for net in (low, ref):
            net.zero_grad()
            (F.mse_loss(net(x.bfloat16()).float().squeeze(1), y) * 8).backward()
        assert master.step(scale=8)
        with torch.no_grad():
            for p, m in zip(ref.parameters(), copies):
                m.add_(p.grad.float() / 8, alpha=-0.01)       # what SGD does
                p.copy_(m)
    assert all(torch.equal(a, b) for a, b in zip(low.parameters(), ref.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(master.master, copies))
    before = [p.clone() for p in low.parameters()]
    low.weight.grad[0, 0] = float("inf")
    assert master.step() is False
    assert all(torch.equal(a, b) for a, b in zip(low.parameters(), before))
    master.zero_grad()
    assert all(p.grad is None for p in low.parameters())


@pytest.mark.parametrize("kw", [dict(init_scale=2.0**16, growth_interval=3),
                                dict(init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2),
                                dict(init_scale=2.0**127, growth_interval=1)])   # growth would overflow fp32
def test_scale_schedule_equals_grad_scaler(kw):
    flags = [False, True, False, False, False, False, True, True, False, False, False, False, False, False]
    scales, skipped = P.grad_scaler_schedule(flags, **kw)                 # torch's GradScaler on CPU
    assert P.scale_schedule(flags, **kw) == (scales, skipped) and any(skipped)


def test_loss_scaler_trains_exactly_like_grad_scaler_in_fp16_autocast():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))
    data = [(30 * torch.randn(32, 20), torch.randint(0, 3, (32,))) for _ in range(16)]

    def train(scaler):
        model = copy.deepcopy(net)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        scales = []
        for x, y in data:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):      # fp16 arithmetic runs on CPU too
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scales.append(scaler.get_scale())
            scaler.step(opt)
            scaler.update()
        return model, scales

    theirs, their_scales = train(torch.amp.GradScaler("cpu", init_scale=2.0**20, growth_interval=3))
    ours, our_scales = train(P.LossScaler(2.0**20, growth_interval=3))
    assert our_scales == their_scales and len(set(our_scales)) > 3    # it backed off and grew again
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))


def test_static_loss_scaler_keeps_its_scale_and_skips_overflow():
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.5)
    scaler = P.LossScaler(1024.0, dynamic=False)
    scaler.scale(p.sum()).backward()
    assert torch.equal(p.grad, torch.full((2,), 1024.0))
    assert scaler.step(opt) and torch.equal(p.detach(), torch.full((2,), 0.5))   # unscaled before the step
    scaler.update()
    opt.zero_grad()
    scaler.scale(p.sum() * float("inf")).backward()
    assert not scaler.step(opt) and torch.equal(p.detach(), torch.full((2,), 0.5))
    scaler.update()
    assert scaler.get_scale() == 1024.0
    with pytest.raises(RuntimeError, match="step"):
        scaler.update()


@pytest.mark.parametrize("kw,match", [(dict(init_scale=0), "init_scale"), (dict(growth_factor=1.0), "growth_factor"),
                                      (dict(backoff_factor=1.5), "backoff_factor"),
                                      (dict(growth_interval=0), "growth_interval")])
def test_loss_scaler_refuses_bad_arguments_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        P.LossScaler(**kw)


def test_flushed_to_zero_follows_the_fp16_cast():
    tiny = float_format(torch.float16).smallest_subnormal            # 2^-24 ~ 6e-8
    x = torch.tensor([0.0, 0.4 * tiny, 0.6 * tiny, tiny, 1e-3, -0.3 * tiny])
    assert P.flushed_to_zero(x) == 2                     # 0.4 and -0.3 round to 0; 0.6 rounds up; 0 is not counted
    assert P.flushed_to_zero(x, scale=2.0**10) == 0
    assert P.flushed_to_zero(x, torch.bfloat16) == 0     # bf16 has fp32's exponent range
    assert P.flushed_to_zero(x) == int(((x != 0) & (x.half() == 0)).sum())


def test_low_precision_grads_lose_tiny_gradients_that_loss_scaling_keeps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = 1e-2 * torch.randn(16, 64), torch.zeros(16)
    loss_fn = lambda out, _y: 1e-6 * out.sum()          # gradients ~1e-8: below fp16's smallest subnormal
    ref_w, ref_a = P.low_precision_grads(model, x, y, torch.float32, loss_fn=loss_fn)
    manual = copy.deepcopy(model)
    loss_fn(manual(x), y).backward()
    assert all(torch.equal(r, p.grad) for r, p in zip(ref_w, manual.parameters()))
    assert [a.shape for a in ref_a] == [(16, 32), (16, 4)]              # outputs of the two Linear layers
    assert torch.allclose(ref_a[1], torch.full((16, 4), 1e-6))          # d loss / d output
    plain_w, plain_a = P.low_precision_grads(model, x, y, torch.float16, loss_fn=loss_fn)
    scaled_w, scaled_a = P.low_precision_grads(model, x, y, torch.float16, scale=2.0**14, loss_fn=loss_fn)
    assert P.lost_gradients(ref_w, plain_w) > 50 and P.lost_gradients(ref_w, scaled_w) == 0
    assert P.lost_gradients(ref_a, plain_a) > 0 and P.lost_gradients(ref_a, scaled_a) == 0
    for r, s in zip(ref_w + ref_a, scaled_w + scaled_a):   # the smallest still land on fp16 subnormals: atol
        torch.testing.assert_close(s, r, rtol=1e-2, atol=1e-3 * r.abs().max().item())
    assert all(p.dtype == torch.float32 and p.grad is None for p in model.parameters())   # the model was copied
    # all in fp16, d(scaled loss)/d(loss) = scale is an fp16 number too: 2^16 > 65504 overflows
    too_big_w, _ = P.low_precision_grads(model, x, y, torch.float16, scale=2.0**16, loss_fn=loss_fn)
    assert not any(torch.isfinite(g).all() for g in too_big_w)


def test_saved_tensor_bytes_counts_activations_in_the_autocast_dtype():
    model, x = nn.Linear(784, 10), torch.randn(64, 784)
    assert P.saved_tensor_bytes(model, x) == 64 * 784 * 4                        # x, for the weight grad
    assert P.saved_tensor_bytes(model, x, "bf16") == 64 * 784 * 2                 # the same x, in bf16
    net, images = Net(), torch.randn(64, 1, 28, 28)
    assert P.saved_tensor_bytes(net, images, "bf16") < 0.8 * P.saved_tensor_bytes(net, images)


def test_gradient_magnitudes_drop_zeros():
    mags = P.gradient_magnitudes([torch.tensor([0.0, -2.0]), torch.tensor([[3.0, 0.0]])])
    assert torch.equal(mags, torch.tensor([2.0, 3.0]))


def test_recommended_precision_is_bf16_on_cpu_and_follows_bf16_units_on_cuda():
    assert P.recommended_precision("cpu") == "bf16"
    if torch.cuda.is_available():
        assert P.recommended_precision("cuda") == ("bf16" if torch.cuda.is_bf16_supported() else "16")
