"""Checks for solutions/15_distillation_and_inference_exercises.ipynb: the distillation loss, the Pareto front.

The loss is compared with Hinton et al.'s formula written with PyTorch's own F.kl_div and
F.cross_entropy, and with a known property of its gradient; when a value is wrong, the check
recomputes the usual mistakes with the same ops and names the one that matches. The Pareto front
is checked by its definition (brute force over all pairs), not against a reference front.
"""
from __future__ import annotations

import random
import warnings

import torch
import torch.nn.functional as F

from . import expect, expect_close, passed

# (N, C, T, alpha): T != 1 exposes a missing T^2 or an unsoftened teacher, alpha != 0.5 swapped
# weights, C > 1 reduction "mean" (which divides by N * C, not N).
LOSS_CASES = ((8, 10, 4.0, 0.9), (5, 3, 2.0, 0.3), (16, 10, 0.5, 0.7), (4, 10, 8.0, 1.0), (6, 10, 1.0, 0.0),
              (1, 2, 3.0, 0.6))


def _kl(s, t, T, reduction="batchmean"):
    """KL(softmax(t/T) || softmax(s/T)) with PyTorch's kl_div: input = log-probs, target = probs."""
    with warnings.catch_warnings():   # torch warns that "mean" is not KL's batch mean: that is the point
        warnings.simplefilter("ignore", UserWarning)
        return F.kl_div(F.log_softmax(s / T, dim=1), F.softmax(t / T, dim=1), reduction=reduction)


def _reference(s, t, y, T, alpha):
    return alpha * _kl(s, t, T) * T**2 + (1 - alpha) * F.cross_entropy(s, y)


def _mistakes(s, t, y, T, alpha) -> dict:
    """hint -> the value that mistake gives, computed with PyTorch's ops."""
    ce = F.cross_entropy(s, y)
    soft = {
        "the soft term lacks the T**2 factor (without it the soft gradients shrink as 1/T**2 when T grows)":
            _kl(s, t, T),
        "the soft term is scaled by T, not T**2": _kl(s, t, T) * T,
        "F.kl_div was given softmax(student / T); its first argument must be LOG-probabilities (log_softmax)":
            F.kl_div(F.softmax(s / T, dim=1), F.softmax(t / T, dim=1), reduction="batchmean") * T**2,
        "the KL direction is swapped: F.kl_div(input, target) computes KL(target || input), so the student's "
        "log-probabilities go first and the teacher's probabilities second":
            F.kl_div(F.log_softmax(t / T, dim=1), F.softmax(s / T, dim=1), reduction="batchmean") * T**2,
        "both arguments are log_softmax, but F.kl_div reads its target as probabilities unless log_target=True: "
        "pass log_target=True, or give the teacher's softmax":
            F.kl_div(F.log_softmax(s / T, dim=1), F.log_softmax(t / T, dim=1), reduction="batchmean") * T**2,
        "the teacher is not softened: use softmax(teacher_logits / T), the same T as the student":
            F.kl_div(F.log_softmax(s / T, dim=1), F.softmax(t, dim=1), reduction="batchmean") * T**2,
        "the student is not softened: use log_softmax(student_logits / T)":
            F.kl_div(F.log_softmax(s, dim=1), F.softmax(t / T, dim=1), reduction="batchmean") * T**2,
        "reduction='mean' averages over all N * C entries; KL is a sum over classes, so use 'batchmean' "
        "(sum, then divide by the batch size N)": _kl(s, t, T, "mean") * T**2,
        "reduction='sum' adds over the batch too; use 'batchmean' (divide by the batch size N)":
            _kl(s, t, T, "sum") * T**2,
    }
    out = {hint: alpha * value + (1 - alpha) * ce for hint, value in soft.items()}
    out["the weights are swapped: alpha multiplies the soft (teacher) term, 1 - alpha the cross-entropy"] = (
        (1 - alpha) * _kl(s, t, T) * T**2 + alpha * ce)
    out["the cross-entropy is on the softened logits; the hard-label term uses the plain student logits"] = (
        alpha * _kl(s, t, T) * T**2 + (1 - alpha) * F.cross_entropy(s / T, y))
    return out


def _case(n, c, seed):
    g = torch.Generator().manual_seed(seed)
    s, t = 3 * torch.randn(n, c, generator=g), 3 * torch.randn(n, c, generator=g)
    return s, t, torch.randint(0, c, (n,), generator=g)


def check_distillation_loss(distillation_loss) -> None:
    """`distillation_loss(student_logits, teacher_logits, labels, T, alpha)` equals Hinton et al.'s loss."""
    for seed, (n, c, T, alpha) in enumerate(LOSS_CASES):
        s, t, y = _case(n, c, seed)
        what = f"distillation_loss(logits [{n}, {c}], T={T}, alpha={alpha})"
        got = distillation_loss(s.clone(), t.clone(), y.clone(), T, alpha)
        expect(isinstance(got, torch.Tensor) and got.numel() == 1,
               f"{what} returned {type(got).__name__} {getattr(got, 'shape', '')}; expected a scalar tensor "
               "(keep it a tensor: training calls .backward() on it)")
        want = _reference(s, t, y, T, alpha)
        if not torch.allclose(got.detach().double().reshape(()), want.double(), rtol=1e-4, atol=1e-5):
            hints = [h for h, v in _mistakes(s, t, y, T, alpha).items()
                     if torch.allclose(got.detach().double().reshape(()), v.double(), rtol=1e-4, atol=1e-5,
                                                 equal_nan=True)]
            raise AssertionError(f"{what} = {got.item():.6f}, expected {want.item():.6f}. "
                                 + (f"Your value matches a known mistake: {hints[0]}." if hints else
                                    "Expected alpha * T**2 * KL(softmax(t/T) || softmax(s/T)) "
                                    "+ (1 - alpha) * cross_entropy(s, labels)."))
    # A known property: at T = 1, alpha = 1 the gradient w.r.t. the student logits is (softmax(s) - softmax(t)) / N.
    s, t, y = _case(8, 10, 99)
    s.requires_grad_(True)
    loss = distillation_loss(s, t, y, 1.0, 1.0)
    expect(isinstance(loss, torch.Tensor) and loss.requires_grad,
           "the loss must stay connected to student_logits (no .item(), .detach() or numpy): training "
           "calls loss.backward()")
    loss.backward()
    expect_close(s.grad, (F.softmax(s, 1) - F.softmax(t, 1)).detach() / len(s),
                 "gradient w.r.t. student_logits at T=1, alpha=1", atol=1e-6, rtol=1e-4,
                 hint="It must be (softmax(s) - softmax(t)) / N: KL averaged over the batch, no extra factor.")
    passed("distillation_loss")


# --- the Pareto front ----------------------------------------------------------------------------

def _beats(q, p) -> bool:
    """q is no bigger and no less accurate than p, and better in one of the two."""
    return q[0] <= p[0] and q[1] >= p[1] and (q[0] < p[0] or q[1] > p[1])


def _front_cases():
    yield [(1724.3, 0.981), (1066.4, 0.975), (87.4, 0.972), (171.9, 0.973), (505.0, 0.970), (101.8, 0.935),
           (103.0, 0.940), (431.0, 0.980), (267.0, 0.974), (33.2, 0.960)]
    yield [(10, 0.90), (10, 0.95), (20, 0.97)]                    # same size: the less accurate loses
    yield [(10, 0.90), (20, 0.90), (5, 0.80)]                     # same accuracy: the bigger loses
    yield [(3, 0.5)]
    yield [(8, 0.97), (1, 0.90), (32, 0.99), (4, 0.95), (2, 0.93)]   # all on the front, shuffled
    yield [(1, 0.99), (2, 0.50), (3, 0.60)]                       # the smallest beats everything
    yield [(1, 0.90), (2, 0.80), (3, 0.85), (4, 0.95)]            # 0.85 > 0.80, but 0.90 beats it
    yield [(4, 0.9), (2, 0.8), (4, 0.9), (1, 0.7)]                 # an exact duplicate on the front
    yield [(5, 0.6), (3, 0.9), (5, 0.6), (3, 0.9), (3, 0.9)]       # duplicates on and off the front
    rng = random.Random(15)
    for _ in range(5):
        pts = {(rng.randint(1, 30), rng.randint(80, 99) / 100) for _ in range(rng.randint(2, 15))}
        yield rng.sample(sorted(pts), len(pts))


def check_pareto_front(pareto_front) -> None:
    """`pareto_front(points)` -> indices of the points no other point beats, smallest size first (of exact
    duplicates on the front, one or all may be listed)."""
    for points in _front_cases():
        got = pareto_front([tuple(p) for p in points])
        what = f"pareto_front({points})"
        try:
            got = [int(i) for i in got]
        except (TypeError, ValueError):
            raise AssertionError(f"{what} returned {got!r}; expected a list of indices into points "
                                 "(e.g. [4, 2, 0]), not the points themselves") from None
        expect(all(0 <= i < len(points) for i in got),
               f"{what} returned {got}: indices must be in range({len(points)})")
        expect(len(set(got)) == len(got), f"{what} returned {got}: an index appears twice")
        for i in got:
            beaten = [j for j, q in enumerate(points) if _beats(q, points[i])]
            if beaten:
                raise AssertionError(f"{what}: point {i} {points[i]} is on your front, but point {beaten[0]} "
                                     f"{points[beaten[0]]} is no bigger and no less accurate (and better in one). "
                                     "Compare each point with every point, not only its neighbour; smaller size is "
                                     "better.")
        for i, p in enumerate(points):
            if i not in got and not any(_beats(q, p) for q in points):
                copies = [j for j, q in enumerate(points) if tuple(q) == tuple(p)]
                expect(len(copies) > 1 and any(j in got for j in copies),
                       f"{what}: point {i} {p} is missing: no other point is both no bigger and no less accurate "
                       "(a tie in one coordinate still needs a win in the other to beat it"
                       + (f"; points {copies} are exact copies of each other: a copy does not beat its twin, so keep "
                          "one of them, or all" if len(copies) > 1 else "") + ").")
        sizes = [points[i][0] for i in got]
        expect(sizes == sorted(sizes), f"{what} returned {got}: order them from the smallest size to the largest")
    passed("pareto_front")
