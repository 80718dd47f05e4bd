"""Checks for solutions/15_distillation_and_inference_exercises.ipynb: the distillation loss, the Pareto front.

The loss is compared with Hinton et al.'s formula written with PyTorch's own F.kl_div and
F.cross_entropy, and with a known property of its gradient; when a value is wrong, the check
recomputes the usual mistakes with the same ops and names the one that matches. The Pareto front
is checked by its definition (brute force over all pairs), not against a reference front. Both
checks also refuse an answer that changes its inputs, or that calls the lecture's own function.
"""
from __future__ import annotations

import random
import warnings

import torch
import torch.nn.functional as F

from . import answer_source, calls_method, expect, expect_close, passed

# (N, C, T, alpha, logit scale): T != 1 exposes a missing T^2 or an unsoftened teacher, alpha != 0.5 swapped
# weights, C > 1 reduction "mean" (which divides by N * C, not N); ints for T and alpha; logits of ~100 at T=0.5,
# where softmax underflows to exact zeros (log(softmax) is -inf there, log_softmax is not).
LOSS_CASES = ((8, 10, 4.0, 0.9, 3), (5, 3, 2.0, 0.3, 3), (16, 10, 0.5, 0.7, 3), (4, 10, 8.0, 1.0, 3),
              (6, 10, 1.0, 0.0, 3), (1, 2, 3.0, 0.6, 3), (3, 5, 2, 1, 3), (6, 10, 0.5, 0.8, 40), (5, 4, 20.0, 0.5, 3))


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
        "the soft term is divided by T**2; it is multiplied by T**2": _kl(s, t, T) / T**2,
        "the softmax runs over dim=0, the batch; the classes are dim=1":
            F.kl_div(F.log_softmax(s / T, dim=0), F.softmax(t / T, dim=0), reduction="batchmean") * T**2,
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
    out["T**2 multiplies the whole loss; only the soft (teacher) term gets it"] = (
        (alpha * _kl(s, t, T) + (1 - alpha) * ce) * T**2)
    return out


def _case(n, c, seed, scale=3):
    g = torch.Generator().manual_seed(seed)
    s, t = scale * torch.randn(n, c, generator=g), scale * torch.randn(n, c, generator=g)
    return s, t, torch.randint(0, c, (n,), generator=g)


def _unchanged(what: str, given: tuple, kept: tuple) -> None:
    names = ("student_logits", "teacher_logits", "labels")
    changed = [name for name, a, b in zip(names, given, kept) if not torch.equal(a, b)]
    expect(not changed, f"{what} changed {' and '.join(changed)} in place: the caller still needs them (training "
                        "logs the logits, and the teacher's are reused). Compute new tensors: s / T, not s /= T "
                        "or s.div_(T).")


def _known(got: torch.Tensor, values: dict) -> str:
    """The hints whose value equals `got` (nan equals nan), joined; "" if none."""
    value = got.detach().double()
    return "; or: ".join(h for h, v in values.items()
                         if torch.allclose(value, v.double(), rtol=1e-4, atol=1e-5, equal_nan=True))


def judge_loss(got, s, t, y, T, alpha, what: str) -> None:
    """AssertionError unless `got` is a scalar tensor equal to Hinton et al.'s loss of (s, t, y, T, alpha)."""
    expect(isinstance(got, torch.Tensor) and got.dim() == 0,
           f"{what} returned {type(got).__name__} {tuple(getattr(got, 'shape', ''))}; expected a scalar tensor "
           "(0-dim, shape ()): keep it a tensor, training calls .backward() on it, and reduce every dimension")
    want = _reference(s, t, y, T, alpha)
    if torch.allclose(got.detach().double(), want.double(), rtol=1e-4, atol=1e-5):
        return
    # a nan where softmax underflows to exact zeros has that cause; a nan elsewhere is matched like any value
    underflow = not torch.isfinite(got) and bool((F.softmax(s / T, dim=1) == 0).any()
                                                 or (F.softmax(t / T, dim=1) == 0).any())
    hints = "" if underflow else _known(got, _mistakes(s, t, y, T, alpha))
    raise AssertionError(
        f"{what} = {got.item():.6f}, expected {want.item():.6f}. "
        + ("Here softmax underflows to exact zeros, whose log is -inf: take log-probabilities from F.log_softmax "
           "(the teacher's too, with log_target=True, if you need them), never torch.log(F.softmax(...))."
           if underflow else f"Your value matches a known mistake: {hints}." if hints else
           "Expected alpha * T**2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * cross_entropy(s, labels)."))


def check_distillation_loss(distillation_loss) -> None:
    """`distillation_loss(student_logits, teacher_logits, labels, T, alpha)` equals Hinton et al.'s loss."""
    expect(not calls_method(answer_source(distillation_loss), "distillation_loss"),
           "your answer calls the lecture's distillation.distillation_loss, which does the whole exercise: write "
           "the loss with F.kl_div and F.cross_entropy")
    for seed, (n, c, T, alpha, scale) in enumerate(LOSS_CASES):
        s, t, y = _case(n, c, seed, scale)
        what = (f"distillation_loss(logits [{n}, {c}]{' of about ' + str(2 * scale) if scale > 3 else ''}, T={T}, "
                f"alpha={alpha})")
        given = (s.clone(), t.clone(), y.clone())
        got = distillation_loss(*given, T, alpha)
        _unchanged(what, given, (s, t, y))
        judge_loss(got, s, t, y, T, alpha, what)
    # A known property: at T = 1, alpha = 1 the gradient w.r.t. the student logits is (softmax(s) - softmax(t)) / N.
    s, t, y = _case(8, 10, 99)
    s.requires_grad_(True)
    try:
        loss = distillation_loss(s, t, y, 1.0, 1.0)
    except RuntimeError as exc:
        if "in-place" not in str(exc):
            raise
        raise AssertionError(f"distillation_loss changed a tensor in place that backward needs ({exc}): compute new "
                             "tensors (s / T, not s /= T)") from None
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
    yield [(2.5, 0.9), (2, 0.9), (2.5, 1.0)]                      # float sizes; a tie in accuracy, then in size
    rng = random.Random(15)
    for _ in range(5):
        pts = {(rng.randint(1, 30), rng.randint(80, 99) / 100) for _ in range(rng.randint(2, 15))}
        yield rng.sample(sorted(pts), len(pts))
    for _ in range(60):                                            # few values: ties and duplicates everywhere
        yield [(rng.randint(1, 4), rng.choice((0.5, 0.7, 0.9))) for _ in range(rng.randint(1, 9))]
    yield []


def judge_front(points: list, got, what: str) -> None:
    """AssertionError unless `got` lists the indices of exactly the points nothing beats (of exact duplicates on the
    front one or all), smallest size first."""
    try:
        got = [int(i) for i in got]
    except (TypeError, ValueError):
        raise AssertionError(f"{what} returned {got!r}; expected a list of indices into points "
                             "(e.g. [4, 2, 0]), not the points themselves") from None
    expect(all(0 <= i < len(points) for i in got), f"{what} returned {got}: indices must be in range({len(points)})")
    expect(len(set(got)) == len(got), f"{what} returned {got}: an index appears twice")
    order = sorted(range(len(points)), key=lambda j: (points[j][0], -points[j][1], j))
    for i in got:
        beaten = [j for j, q in enumerate(points) if _beats(q, points[i])]
        if beaten:
            before = order[order.index(i) - 1] if order.index(i) else None
            raise AssertionError(f"{what}: point {i} {points[i]} is on your front, but point {beaten[0]} "
                                 f"{points[beaten[0]]} is no bigger and no less accurate (and better in one)"
                                 + (f"; its neighbour by size, point {before} {points[before]}, does not beat it: "
                                    "compare each point with every smaller one, not only its neighbour"
                                    if before is not None and not _beats(points[before], points[i]) else "")
                                 + ". Smaller size is better.")
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


def check_pareto_front(pareto_front) -> None:
    """`pareto_front(points)` -> indices of the points no other point beats, smallest size first (of exact
    duplicates on the front, one or all may be listed)."""
    expect(not calls_method(answer_source(pareto_front), "pareto_front"),
           "your answer calls the lecture's inference.pareto_front, which does the whole exercise: write it yourself")
    for points in _front_cases():
        given = list(points)
        what = f"pareto_front({points})"
        try:
            got = pareto_front(given)
        except (IndexError, ValueError, TypeError) as exc:
            if points:
                raise
            name = type(exc).__name__
            raise AssertionError(f"pareto_front([]) raised {name}: {str(exc).removeprefix(name + ': ')}. No points "
                                 "have no front: return [].") from None
        expect(given == points, f"{what} changed the list it was given (it now holds {given}): the caller's indices "
                                "refer to the list as it was. Sort a list of indices (sorted(range(len(points)), "
                                "key=...)), not the points themselves.")
        judge_front(points, got, what)
    passed("pareto_front")
