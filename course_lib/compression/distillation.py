"""Knowledge distillation (Hinton, Vinyals & Dean, 2015): a small student learns from a big teacher.

The teacher's logits, softened by a temperature T, say more than the label does: a "7" that looks a
bit like a "1" gets a little probability on "1". The student is trained on both targets:

    loss = alpha * T^2 * KL(softmax(t / T) || softmax(s / T))  +  (1 - alpha) * CE(s, y)

KL is averaged over the batch ("batchmean"); the T^2 keeps the soft term's gradient on the same
scale as the hard term's when T changes (the soft gradients shrink as 1/T^2). At T = 1,
alpha = 1 the gradient w.r.t. the student logits is (softmax(s) - softmax(t)) / N.

    teacher_logits(teacher, x)                                  # [N, C], once for the whole set
    distill(TinyMLP(32), x, y, teacher, T=4, alpha=0.9, epochs=20)   # the distilled student
    distill(TinyMLP(32), x, y, epochs=20)                        # the same student trained alone

Design: `fit` calls `loss_fn(logits, y)` and never sees the images, so `distill` keeps the data
tensor-resident and hands `fit` a loader whose targets are the sample *indices*; the loss looks up
each sample's label and its precomputed teacher logits. The teacher is frozen, in eval mode, and
the course uses no augmentation, so its logits for an image never change: computing them once
costs one teacher forward per image in all instead of one per image per epoch (LeNet-5's forward
is ~100x the student's), and a training step then costs only the student's. With augmentation or
a streamed dataset the logits would change per batch and the teacher would have to run per step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..data import TensorLoader
from ..loop import History, fit, make_optimizer
from ..validate import number_in_range, positive_int, positive_number


class TinyMLP(nn.Module):
    """The student: 784 -> hidden -> 10 with ReLU.  [N,1,28,28] or [N,784] -> [N,10]

    hidden=32: 25,450 parameters (102 KB in fp32), 17x fewer than LeNet-5's 431,080.
    """

    def __init__(self, hidden: int = 32):
        super().__init__()
        positive_int("hidden", hidden)
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def check_temperature(T) -> float:
    """T as a float > 0 (finite); else ValueError naming T."""
    return float(positive_number("T (the temperature)", T, hint=" (1 = no softening, typical 2..20)"))


def check_alpha(alpha) -> float:
    """alpha as a float in [0, 1]; else ValueError naming alpha."""
    return float(number_in_range("alpha (the weight of the soft-target term; 1 - alpha weighs the labels)",
                                 alpha, 0, 1))


def _check_logits(student_logits, teacher_logits, labels) -> None:
    for name, t in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 2 or len(t) == 0:
            raise ValueError(f"{name} must be a floating-point tensor [N, C] with N >= 1; got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher_logits must have the shape of student_logits {tuple(student_logits.shape)} "
                         f"(same batch, same classes); got {tuple(teacher_logits.shape)}")
    if (not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.is_complex()
            or labels.shape != student_logits.shape[:1]):
        raise ValueError(f"labels must be an integer tensor [N] = [{len(student_logits)}] of class indices; got "
                         f"{(labels.dtype, tuple(labels.shape)) if isinstance(labels, torch.Tensor) else labels!r}")


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      T: float = 4.0, alpha: float = 0.9) -> torch.Tensor:
    """alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * CE(s, labels), a scalar.

    student_logits, teacher_logits: [N, C]; labels: int [N]. The teacher is a fixed target
    (detached). KL is summed over classes and averaged over the batch, as F.kl_div's "batchmean".
    """
    _check_logits(student_logits, teacher_logits, labels)
    T, alpha = check_temperature(T), check_alpha(alpha)
    log_p_student = F.log_softmax(student_logits / T, dim=1)
    log_p_teacher = F.log_softmax(teacher_logits.detach() / T, dim=1)
    # kl_div(input, target) is KL(target || input), input as log-probabilities; a log target is
    # stable where the teacher's probability underflows to 0.
    soft = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True) * T**2
    hard = F.cross_entropy(student_logits, labels)
    return alpha * soft + (1 - alpha) * hard


@torch.no_grad()
def teacher_logits(teacher: nn.Module, x: torch.Tensor, batch_size: int = 1000) -> torch.Tensor:
    """The teacher's logits for every image of `x` [N, ...], in eval mode: [N, C] on x's device.

    no_grad rather than inference_mode: the result becomes a training target, and tensors made
    under inference_mode may not be saved for a backward pass.
    """
    positive_int("batch_size", batch_size)
    device = next(teacher.parameters()).device
    was_training = teacher.training
    teacher.eval()
    try:
        return torch.cat([teacher(x[i:i + batch_size].to(device)).to(x.device)
                          for i in range(0, len(x), batch_size)])
    finally:
        teacher.train(was_training)


def distill(student: nn.Module, x: torch.Tensor, y: torch.Tensor, teacher: nn.Module | None = None,
            val_loader=None, *, T: float = 4.0, alpha: float = 0.9, epochs: int = 10, batch_size: int = 64,
            lr: float = 5e-3, seed: int = 0, **fit_kwargs) -> History:
    """Train `student` on images x [N, ...] and labels y [N] with `course_lib.loop.fit`; returns its History.

    With a teacher: `distillation_loss` against the teacher's logits (computed once, see the module
    docstring). teacher=None: the same student trained alone, plain cross-entropy (T and alpha
    unused), on the same batches in the same order (the loader's `seed`) with the same optimizer
    and schedule, so that the two differ in the loss only. Adam with a one-cycle schedule peaking at `lr`: its annealed
    end makes the final accuracy stable rather than one noisy step's. fit_kwargs: device, log, ...
    """
    positive_int("epochs", epochs)
    positive_int("batch_size", batch_size)
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or len(x) != len(y) or len(x) == 0:
        raise ValueError("x and y must be tensors with the same number N >= 1 of samples; got "
                         f"{getattr(x, 'shape', x)!r} and {getattr(y, 'shape', y)!r}")
    if "loss_fn" in fit_kwargs or "optimizer" in fit_kwargs or "scheduler" in fit_kwargs:
        raise ValueError("distill sets loss_fn, optimizer and scheduler itself; pass T, alpha, lr instead")
    T, alpha = check_temperature(T), check_alpha(alpha)
    device = torch.device(fit_kwargs.pop("device", None) or next(student.parameters()).device)
    labels = y.to(device)
    soft = None if teacher is None else teacher_logits(teacher, x).to(device)
    loader = TensorLoader(x, torch.arange(len(x)), batch_size=batch_size, seed=seed, device=device)

    def loss_fn(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if soft is None:
            return F.cross_entropy(logits, labels[index])
        return distillation_loss(logits, soft[index], labels[index], T, alpha)

    student.to(device)
    optimizer = make_optimizer("adam", student.parameters(), lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * len(loader))
    return fit(student, loader, val_loader, epochs=epochs, optimizer=optimizer, scheduler=scheduler,
               device=device, loss_fn=loss_fn, **fit_kwargs)
