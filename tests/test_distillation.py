"""course_lib.compression.distillation: the loss against PyTorch's own ops, its gradient, and `distill`."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.compression import distillation as D
from course_lib.data import TensorLoader
from course_lib.env import seed_everything
from course_lib.models import LeNet300, Net
from course_lib.loop import fit


def logits(n=16, c=10, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    s, t = scale * torch.randn(n, c, generator=g), scale * torch.randn(n, c, generator=g)
    return s, t, torch.randint(0, c, (n,), generator=g)


def reference(s, t, y, T, alpha):
    """Hinton et al.'s loss written with PyTorch's own kl_div (probability target) and cross_entropy."""
    soft = F.kl_div(F.log_softmax(s / T, dim=1), F.softmax(t / T, dim=1), reduction="batchmean") * T**2
    return alpha * soft + (1 - alpha) * F.cross_entropy(s, y)


@pytest.mark.parametrize("T", [0.5, 1.0, 2.0, 4.0, 20.0])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("shape", [(16, 10), (1, 3), (7, 2)])
def test_loss_equals_pytorch_formula(T, alpha, shape):
    s, t, y = logits(*shape, seed=shape[0])
    s, t = s.double(), t.double()        # float64: T^2 = 400 would magnify float32 rounding
    loss = D.distillation_loss(s, t, y, T, alpha)
    assert loss.dim() == 0
    torch.testing.assert_close(loss, reference(s, t, y, T, alpha))
    torch.testing.assert_close(D.distillation_loss(s.float(), t.float(), y, T, alpha),
                               reference(s, t, y, T, alpha).float(), rtol=1e-4, atol=1e-5)


def test_alpha_zero_is_cross_entropy_and_identical_logits_cost_nothing_soft():
    s, t, y = logits()
    torch.testing.assert_close(D.distillation_loss(s, t, y, 4.0, 0.0), F.cross_entropy(s, y))
    assert D.distillation_loss(s, s.clone(), y, 4.0, 1.0).abs() < 1e-6      # KL(p || p) = 0


def test_stable_where_the_teacher_is_certain():
    s, t, y = logits()
    t[:, 0] = 200.0   # softmax underflows to exactly 0 for the other classes
    loss = D.distillation_loss(s, t, y, 1.0, 1.0)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, reference(s, t, y, 1.0, 1.0))


def test_gradient_at_T1_alpha1_is_softmax_difference_over_batch():
    s, t, y = logits(n=8)
    s.requires_grad_(True)
    D.distillation_loss(s, t, y, T=1.0, alpha=1.0).backward()
    torch.testing.assert_close(s.grad, (F.softmax(s, 1) - F.softmax(t, 1)).detach() / len(s))


def test_t_squared_keeps_the_soft_gradient_scale_at_high_temperature():
    """Hinton et al.: for large T the soft gradient tends to (s - t) / (N C) (zero-mean logits; the
    1/T^2 of the softened gradient is cancelled by the T^2 factor), so its size does not depend on T."""
    s, t, y = logits(n=8, scale=1.0)
    s, t = (s - s.mean(1, keepdim=True)).double(), (t - t.mean(1, keepdim=True)).double()
    grads = {}
    for T in (10.0, 100.0, 1000.0):
        g = s.clone().requires_grad_(True)
        D.distillation_loss(g, t, y, T, 1.0).backward()
        grads[T] = g.grad
    limit = (s - t) / (8 * 10)
    torch.testing.assert_close(grads[1000.0], limit, rtol=1e-2, atol=1e-5)
    for T in (10.0, 100.0):
        assert grads[T].norm() / limit.norm() == pytest.approx(1.0, rel=0.1)


def test_no_gradient_reaches_the_teacher():
    s, t, y = logits()
    s.requires_grad_(True)
    t.requires_grad_(True)
    D.distillation_loss(s, t, y).backward()
    assert s.grad is not None and t.grad is None


@pytest.mark.parametrize("kwargs, words", [
    ({"T": 0}, ["T", "> 0"]), ({"T": -1.0}, ["T", "> 0"]), ({"T": float("inf")}, ["T", "finite"]),
    ({"T": True}, ["T"]), ({"T": "4"}, ["T"]),
    ({"alpha": -0.1}, ["alpha", "[0, 1]"]), ({"alpha": 1.5}, ["alpha", "[0, 1]"]), ({"alpha": None}, ["alpha"]),
])
def test_bad_temperature_and_alpha_are_refused(kwargs, words):
    s, t, y = logits()
    args = {"T": 4.0, "alpha": 0.5, **kwargs}
    with pytest.raises(ValueError) as err:
        D.distillation_loss(s, t, y, **args)
    assert all(w in str(err.value) for w in words)


def test_bad_shapes_are_refused():
    s, t, y = logits()
    with pytest.raises(ValueError, match="teacher_logits must have the shape of student_logits"):
        D.distillation_loss(s, t[:, :9], y)
    with pytest.raises(ValueError, match="teacher_logits must have the shape"):
        D.distillation_loss(s, t[:8], y)
    with pytest.raises(ValueError, match=r"student_logits must be .* \[N, C\]"):
        D.distillation_loss(s.flatten(), t, y)
    with pytest.raises(ValueError, match=r"student_logits must be .*N >= 1"):
        D.distillation_loss(s[:0], t[:0], y[:0])
    with pytest.raises(ValueError, match="labels must be an integer tensor"):
        D.distillation_loss(s, t, y.float())
    with pytest.raises(ValueError, match="labels must be an integer tensor"):
        D.distillation_loss(s, t, y[:3])
    with pytest.raises(ValueError, match="teacher_logits must be a floating-point"):
        D.distillation_loss(s, [[0.0]], y)


def test_tiny_mlp_shapes_and_size():
    m = D.TinyMLP(32)
    assert m(torch.zeros(5, 1, 28, 28)).shape == (5, 10) and m(torch.zeros(5, 784)).shape == (5, 10)
    assert sum(p.numel() for p in m.parameters()) == 784 * 32 + 32 + 32 * 10 + 10
    with pytest.raises(ValueError, match="hidden"):
        D.TinyMLP(0)


def test_teacher_logits_equal_a_forward_in_eval_mode_and_restore_the_mode():
    seed_everything(0)
    teacher = Net().train()                       # dropout: only eval mode is deterministic
    x = torch.randn(25, 1, 28, 28)
    out = D.teacher_logits(teacher, x, batch_size=10)
    assert teacher.training and not out.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(out, teacher.eval()(x))
    with pytest.raises(ValueError, match="batch_size"):
        D.teacher_logits(teacher, x, batch_size=0)


def tiny_data(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.randn(n, 1, 28, 28, generator=g) * 0.5 + y.view(-1, 1, 1, 1) * 0.2
    return x, y


def test_alone_equals_plain_fit_with_the_same_optimizer_schedule_and_batches():
    x, y = tiny_data()
    seed_everything(0)
    a = D.TinyMLP(8)
    b = copy.deepcopy(a)
    history = D.distill(a, x, y, epochs=2, batch_size=16, lr=1e-2, seed=3, log=None)
    loader = TensorLoader(x, y, batch_size=16, seed=3)
    opt = torch.optim.Adam(b.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=2 * len(loader))
    expected = fit(b, loader, epochs=2, optimizer=opt, scheduler=sched, log=None)
    assert history.step_loss == pytest.approx(expected.step_loss)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


def test_alpha_zero_distillation_trains_exactly_like_the_student_alone():
    x, y = tiny_data()
    teacher = LeNet300()
    seed_everything(0)
    a = D.TinyMLP(8)
    b = copy.deepcopy(a)
    D.distill(a, x, y, epochs=2, batch_size=16, log=None)
    D.distill(b, x, y, teacher, alpha=0.0, epochs=2, batch_size=16, log=None)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


def test_distill_uses_the_teacher_per_sample():
    """Labels are noise; the teacher knows the rule. Pure distillation (alpha=1) learns the teacher."""
    x, _ = tiny_data(n=128)
    seed_everything(0)
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    with torch.no_grad():
        teacher[1].weight.mul_(20)                 # a confident teacher: clear argmax margins
    noise = torch.randint(0, 10, (128,), generator=torch.Generator().manual_seed(9))
    student = D.TinyMLP(32)
    alone = copy.deepcopy(student)
    D.distill(student, x, noise, teacher, T=1.0, alpha=1.0, epochs=20, batch_size=32, lr=1e-2, log=None,
              progress=False)
    D.distill(alone, x, noise, epochs=20, batch_size=32, lr=1e-2, log=None, progress=False)
    with torch.no_grad():
        agree = (student(x).argmax(1) == teacher(x).argmax(1)).float().mean().item()
        agree_alone = (alone(x).argmax(1) == teacher(x).argmax(1)).float().mean().item()
    assert agree > 0.8 and agree_alone < 0.4       # measured: 0.95 and 0.04 (other seeds: >= 0.88, <= 0.23)


def test_distill_refuses_bad_arguments():
    x, y = tiny_data(n=8)
    m = D.TinyMLP(4)
    with pytest.raises(ValueError, match="epochs"):
        D.distill(m, x, y, epochs=0)
    with pytest.raises(ValueError, match="batch_size"):
        D.distill(m, x, y, batch_size=-1)
    with pytest.raises(ValueError, match="same number"):
        D.distill(m, x, y[:5])
    with pytest.raises(ValueError, match="T"):
        D.distill(m, x, y, Net(), T=0)
    with pytest.raises(ValueError, match="alpha"):
        D.distill(m, x, y, Net(), alpha=2)
    with pytest.raises(ValueError, match="lr"):
        D.distill(m, x, y, lr=0)
    with pytest.raises(ValueError, match="loss_fn"):
        D.distill(m, x, y, loss_fn=F.cross_entropy)


def test_distill_reports_validation_accuracy():
    x, y = tiny_data()
    history = D.distill(D.TinyMLP(8), x, y, LeNet300(), TensorLoader(x, y, batch_size=32, shuffle=False),
                        epochs=2, log=None)
    assert len(history.val_accuracy) == 2 and all(0 <= a <= 1 for a in history.val_accuracy)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_distill_on_the_gpu_with_a_cpu_teacher_matches_the_loss_on_the_cpu():
    x, y = tiny_data(n=64)
    teacher = LeNet300()
    seed_everything(0)
    student = D.TinyMLP(8)
    history = D.distill(student, x, y, teacher, epochs=1, batch_size=16, device="cuda", log=None)
    assert next(student.parameters()).device.type == "cuda" and len(history.step_loss) == 4
    soft = D.teacher_logits(teacher, x)
    with torch.no_grad():
        gpu = D.distillation_loss(student(x.cuda()), soft.cuda(), y.cuda()).cpu()
        cpu = D.distillation_loss(student.cpu()(x), soft, y)
    torch.testing.assert_close(gpu, cpu, rtol=1e-4, atol=1e-5)
