"""The lecture-15 checks pass the reference solutions and fail stubs and plausible wrong answers."""
import re

import pytest
import torch
import torch.nn.functional as F

from course_lib.checks.nb15 import check_distillation_loss, check_pareto_front
from course_lib.compression import distillation, inference
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "15_distillation_and_inference_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_distillation_loss(NS["distillation_loss"])
    check_pareto_front(NS["pareto_front"])


def test_the_course_lib_versions_pass_too():
    check_distillation_loss(distillation.distillation_loss)
    check_pareto_front(inference.pareto_front)


@pytest.mark.parametrize("check", [check_distillation_loss, check_pareto_front])
def test_stubs_fail(check):
    with pytest.raises(NotImplementedError):
        check(stub)


# --- distillation_loss --------------------------------------------------------------------------

def loss(student="log_softmax", teacher_T=True, student_T=True, power=2, reduction="batchmean", swap_kl=False,
         swap_alpha=False, ce_T=False, detach=False):
    def fn(s, t, y, T, alpha):
        s_in = s / T if student_T else s
        t_in = t / T if teacher_T else t
        first = (F.log_softmax if student == "log_softmax" else F.softmax)(s_in, dim=1)
        second = F.softmax(t_in, dim=1)
        if swap_kl:
            first, second = F.log_softmax(t_in, dim=1), F.softmax(s_in, dim=1)
        soft = F.kl_div(first, second, reduction=reduction) * T**power
        hard = F.cross_entropy(s / T if ce_T else s, y)
        a, b = (1 - alpha, alpha) if swap_alpha else (alpha, 1 - alpha)
        out = a * soft + b * hard
        return torch.tensor(out.item()) if detach else out
    return fn


WRONG_LOSSES = {
    "missing T squared": loss(power=0),
    "T instead of T squared": loss(power=1),
    "softmax for the student": loss(student="softmax"),
    "KL direction swapped": loss(swap_kl=True),
    "teacher not softened": loss(teacher_T=False),
    "student not softened": loss(student_T=False),
    "alpha weights swapped": loss(swap_alpha=True),
    "reduction mean": loss(reduction="mean"),
    "reduction sum": loss(reduction="sum"),
    "cross-entropy on softened logits": loss(ce_T=True),
    "detached from the graph": loss(detach=True),
    "log_softmax on both, no log_target": lambda s, t, y, T, a: (
        a * F.kl_div(F.log_softmax(s / T, 1), F.log_softmax(t / T, 1), reduction="batchmean") * T**2
        + (1 - a) * F.cross_entropy(s, y)),
}


@pytest.mark.filterwarnings("ignore:reduction")
@pytest.mark.parametrize("name", WRONG_LOSSES)
def test_wrong_losses_fail(name):
    with pytest.raises(AssertionError):
        check_distillation_loss(WRONG_LOSSES[name])


@pytest.mark.parametrize("name, words", [
    ("missing T squared", re.escape("T**2")), ("softmax for the student", "LOG-probabilities"),
    ("KL direction swapped", "swapped"), ("teacher not softened", "teacher is not softened"),
    ("alpha weights swapped", "weights are swapped"), ("reduction mean", "batchmean"),
    ("detached from the graph", "backward"), ("log_softmax on both, no log_target", "log_target=True"),
    ("T instead of T squared", "scaled by T, not"), ("reduction sum", "batch size"),
    ("cross-entropy on softened logits", "plain student logits"), ("student not softened", "student is not"),
])
@pytest.mark.filterwarnings("ignore:reduction")
def test_the_message_names_the_mistake(name, words):
    with pytest.raises(AssertionError, match=words):
        check_distillation_loss(WRONG_LOSSES[name])


def test_a_manual_kl_passes():
    def manual(s, t, y, T, alpha):
        p = F.softmax(t / T, dim=1)
        kl = (p * (F.log_softmax(t / T, dim=1) - F.log_softmax(s / T, dim=1))).sum(1).mean()
        return alpha * T * T * kl + (1 - alpha) * F.cross_entropy(s, y)

    check_distillation_loss(manual)


@pytest.mark.parametrize("right", [
    lambda s, t, y, T, a: a * T**2 * F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True,
                                               reduction="batchmean") + (1 - a) * F.cross_entropy(s, y),
    lambda s, t, y, T, a: a * T * T * torch.nn.KLDivLoss(reduction="sum")(F.log_softmax(s / T, 1),
                                                                        F.softmax(t / T, 1)) / len(s)
    + (1 - a) * F.nll_loss(F.log_softmax(s, 1), y),
], ids=["log_target", "KLDivLoss sum over N, nll"])
def test_other_correct_losses_pass(right):
    check_distillation_loss(right)


def test_returning_a_float_fails():
    with pytest.raises(AssertionError, match="scalar tensor"):
        check_distillation_loss(lambda *a: NS["distillation_loss"](*a).item())


# --- pareto_front -------------------------------------------------------------------------------

def all_sorted(points):
    return sorted(range(len(points)), key=lambda i: points[i][0])


def best_only(points):
    return [max(range(len(points)), key=lambda i: points[i][1])]


def neighbour_greedy(points):
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front = [order[0]]
    for prev, i in zip(order, order[1:]):
        if points[i][1] > points[prev][1]:
            front.append(i)
    return front


def keeps_ties(points):
    def beaten(p):
        return any(q[0] < p[0] and q[1] > p[1] for q in points)   # needs a strict win in both
    return sorted((i for i, p in enumerate(points) if not beaten(p)), key=lambda i: points[i][0])


def bigger_is_better(points):
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


def largest_first(points):
    return NS["pareto_front"](points)[::-1]


def returns_points(points):
    return [points[i] for i in NS["pareto_front"](points)]


def size_ties_unsorted(points):
    order = sorted(range(len(points)), key=lambda i: points[i][0])   # ties keep input order
    front, best = [], float("-inf")
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def assumes_sorted_input(points):
    """Never sorts: right only when the points come smallest first."""
    front, best = [], float("-inf")
    for i, p in enumerate(points):
        if p[1] > best:
            front.append(i)
            best = p[1]
    return front


def twins_cancel(points):
    """Brute force with <= and >= against every OTHER index: two exact copies knock each other out."""
    keep = [i for i, p in enumerate(points)
            if not any(j != i and q[0] <= p[0] and q[1] >= p[1] for j, q in enumerate(points))]
    return sorted(keep, key=lambda i: points[i][0])


def ties_in_input_order(points):
    """Sorts by size only (stable): of two the same size it keeps whichever comes first in the input."""
    order = sorted(range(len(points)), key=lambda i: points[i][0])
    front = []
    for i in order:
        if front and points[i][0] == points[front[-1]][0]:
            continue
        if not front or points[i][1] > points[front[-1]][1]:
            front.append(i)
    return front


@pytest.mark.parametrize("wrong, message", [
    (all_sorted, "is on your front"), (best_only, "missing"), (neighbour_greedy, "is on your front"),
    (keeps_ties, "is on your front"), (bigger_is_better, "is on your front|missing"),
    (largest_first, "smallest size"), (returns_points, "indices"), (size_ties_unsorted, "is on your front"),
    (assumes_sorted_input, "is on your front|missing"), (twins_cancel, "exact copies"),
    (ties_in_input_order, "is on your front|missing"),
])
def test_wrong_fronts_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pareto_front(wrong)


def test_keeping_every_copy_of_a_duplicate_passes():
    def all_copies(points):
        keep = [i for i, p in enumerate(points) if not any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in points)]
        return sorted(keep, key=lambda i: (points[i][0], i))

    check_pareto_front(all_copies)
    check_pareto_front(NS["pareto_front"])   # keeps one copy


def test_a_brute_force_front_passes():
    def brute(points):
        keep = [i for i, p in enumerate(points)
                if not any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in points)]
        return sorted(keep, key=lambda i: points[i][0])

    check_pareto_front(brute)


# --- more wrong losses, each named; other correct ones --------------------------------------------------------

def teacher_in_place(s, t, y, T, alpha):
    """Right value, but softens the caller's teacher logits in place."""
    t /= T
    soft = F.kl_div(F.log_softmax(s / T, dim=1), F.softmax(t, dim=1), reduction="batchmean") * T**2
    return alpha * soft + (1 - alpha) * F.cross_entropy(s, y)


def student_in_place(s, t, y, T, alpha):
    s_soft = s.div_(T)
    soft = F.kl_div(F.log_softmax(s_soft, dim=1), F.softmax(t / T, dim=1), reduction="batchmean") * T**2
    return alpha * soft + (1 - alpha) * F.cross_entropy(s * T, y)


def log_of_softmax(s, t, y, T, alpha):
    """Right formula, with torch.log(F.softmax(...)): -inf where softmax underflows."""
    soft = F.kl_div(torch.log(F.softmax(s / T, dim=1)), F.softmax(t / T, dim=1), reduction="batchmean") * T**2
    return alpha * soft + (1 - alpha) * F.cross_entropy(s, y)


def manual_kl_with_log_of_teacher(s, t, y, T, alpha):
    p = F.softmax(t / T, dim=1)
    kl = (p * (torch.log(p) - F.log_softmax(s / T, dim=1))).sum(1).mean()
    return alpha * T**2 * kl + (1 - alpha) * F.cross_entropy(s, y)


MORE_WRONG_LOSSES = {
    "teacher in place": (teacher_in_place, "changed teacher_logits in place"),
    "student in place": (student_in_place, "changed student_logits in place"),
    "log of softmax": (log_of_softmax, "never torch.log\\(F.softmax"),
    "manual KL, log of the teacher's softmax": (manual_kl_with_log_of_teacher, "underflows to exact zeros"),
    "softmax over the batch": (lambda s, t, y, T, a: a * T**2 * F.kl_div(
        F.log_softmax(s / T, dim=0), F.softmax(t / T, dim=0), reduction="batchmean")
        + (1 - a) * F.cross_entropy(s, y), "dim=0"),
    "divided by T squared": (loss(power=-2), "divided by T\\*\\*2"),
    "T squared on the whole loss": (lambda s, t, y, T, a: T**2 * (a * F.kl_div(
        F.log_softmax(s / T, 1), F.softmax(t / T, 1), reduction="batchmean") + (1 - a) * F.cross_entropy(s, y)),
        "whole loss"),
    "a one-element vector": (lambda *args: NS["distillation_loss"](*args).reshape(1), "0-dim"),
    "the lecture's function": (lambda s, t, y, T, a: distillation.distillation_loss(s, t, y, T, a),
                               "distillation.distillation_loss"),
}


@pytest.mark.filterwarnings("ignore:reduction")
@pytest.mark.parametrize("name", MORE_WRONG_LOSSES)
def test_more_wrong_losses_name_the_mistake(name):
    wrong, words = MORE_WRONG_LOSSES[name]
    with pytest.raises(AssertionError, match=words):
        check_distillation_loss(wrong)


def test_an_in_place_student_division_is_named_in_the_gradient_probe_too():
    def divides_the_leaf(s, t, y, T, alpha):
        s /= T
        return F.kl_div(F.log_softmax(s, 1), F.softmax(t / T, 1), reduction="batchmean")

    with pytest.raises(AssertionError, match="in place"):
        check_distillation_loss(lambda s, t, y, T, a: NS["distillation_loss"](s, t, y, T, a) if not s.requires_grad
                                else divides_the_leaf(s, t, y, T, a))


@pytest.mark.parametrize("right", [
    lambda s, t, y, T, a: a * T**2 * (F.cross_entropy(s / T, F.softmax(t / T, -1))
                                      + (F.softmax(t / T, -1) * F.log_softmax(t / T, -1)).sum(-1).mean())
    + (1 - a) * F.cross_entropy(s, y),
    lambda s, t, y, T, a: (a * T**2 * torch.xlogy(F.softmax(t / T, 1), F.softmax(t / T, 1)).sum() / len(s)
                           - a * T**2 * (F.softmax(t / T, 1) * F.log_softmax(s / T, 1)).sum() / len(s)
                           + (1 - a) * F.cross_entropy(s, y)),
], ids=["soft-target cross-entropy minus entropy", "xlogy"])
def test_more_correct_losses_pass(right):
    check_distillation_loss(right)


# --- more wrong fronts ---------------------------------------------------------------------------------------

def sorts_the_points(points):
    """Sorts the caller's list in place, then returns indices into the sorted list."""
    points.sort(key=lambda p: (p[0], -p[1]))
    return NS["pareto_front"](points)


def crashes_without_points(points):
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front = [order[0]]
    for i in order[1:]:
        if points[i][1] > points[front[-1]][1]:
            front.append(i)
    return front


@pytest.mark.parametrize("wrong, message", [
    (sorts_the_points, "changed the list"), (crashes_without_points, "No points have no front"),
    (lambda points: inference.pareto_front(points), "inference.pareto_front"),
])
def test_more_wrong_fronts_name_the_mistake(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_pareto_front(wrong)


def test_a_tuple_of_numpy_indices_passes():
    import numpy as np
    check_pareto_front(lambda points: tuple(np.array(NS["pareto_front"](points), dtype=np.int64)))


# --- property tests: the solutions agree with the lecture's functions on drawn inputs ---------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from course_lib.checks import nb15  # noqa: E402

TEMPERATURES = st.one_of(st.sampled_from([0.5, 1.0, 2, 4.0, 20.0]), st.floats(0.1, 50.0))


@st.composite
def loss_inputs(draw):
    n, c = draw(st.integers(1, 6)), draw(st.integers(2, 7))
    scale = draw(st.sampled_from([0.0, 1e-3, 1.0, 5.0, 60.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))    # float64: T**2 (up to 2,500) times a
    s, t = (scale * torch.randn(n, c, generator=g, dtype=torch.float64) for _ in range(2))   # float32 KL is noise
    return s, t, torch.randint(0, c, (n,), generator=g), draw(TEMPERATURES), draw(st.sampled_from([0, 0.25, 0.9, 1]))


@settings(max_examples=120)
@given(loss_inputs())
def test_solution_loss_equals_the_lectures(inputs):
    """Any batch and class count, zero, tiny and huge logits, temperatures 0.1..50: the solution's loss is the
    lecture's (a log-probability target) and the check's reference."""
    s, t, y, T, alpha = inputs
    got = NS["distillation_loss"](s, t, y, T, alpha)
    assert torch.allclose(got, distillation.distillation_loss(s, t, y, T, alpha), rtol=1e-6, atol=1e-9)
    nb15.judge_loss(got, s, t, y, T, alpha, "drawn")


@settings(max_examples=120)
@given(loss_inputs(), st.sampled_from(sorted(set(WRONG_LOSSES) - {"detached from the graph"})))
def test_a_wrong_loss_is_named_wherever_it_differs(inputs, name):
    """Where a mistake changes the value, the judge fails it; where it names a mistake, that is one whose value the
    answer has."""
    s, t, y, T, alpha = inputs
    got = WRONG_LOSSES[name](s, t, y, T, alpha)
    if torch.allclose(got, nb15._reference(s, t, y, T, alpha), rtol=1e-4, atol=1e-5):
        return
    with pytest.raises(AssertionError) as failure:
        nb15.judge_loss(got, s, t, y, T, alpha, "drawn")
    named = str(failure.value).partition("known mistake: ")[2]
    for hint in filter(None, named.rstrip(".").split("; or: ")):
        assert torch.allclose(got.double(), nb15._mistakes(s, t, y, T, alpha)[hint].double(), rtol=1e-4, atol=1e-5,
                              equal_nan=True)


POINTS = st.lists(st.tuples(st.one_of(st.integers(1, 5), st.floats(0.5, 5.0)), st.sampled_from([0.5, 0.7, 0.9, 1.0])),
                  max_size=12)


def brute_front(points):
    return {i for i, p in enumerate(points) if not any(nb15._beats(q, p) for q in points)}


@settings(max_examples=150)
@given(POINTS)
def test_solution_front_is_the_definitions(points):
    """Ties in size and accuracy, duplicates, int and float sizes: the front by brute force, smallest size first."""
    got = NS["pareto_front"](list(points))
    assert {points[i] for i in got} == {points[i] for i in brute_front(points)}
    assert [points[i][0] for i in got] == sorted(points[i][0] for i in got)
    assert got == inference.pareto_front(points)
    nb15.judge_front(points, got, "drawn")


WRONG_FRONTS = [all_sorted, best_only, neighbour_greedy, keeps_ties, bigger_is_better, largest_first,
                size_ties_unsorted, assumes_sorted_input, twins_cancel, ties_in_input_order]


@settings(max_examples=200)
@given(POINTS.filter(bool), st.sampled_from(WRONG_FRONTS))
def test_judge_rejects_every_wrong_front(points, wrong):
    """A wrong algorithm is right on some inputs: the judge fails it exactly where its front is not the definition's
    (the same points, up to exact duplicates, in size order)."""
    got = wrong(list(points))
    right = ({points[i] for i in got} == {points[i] for i in brute_front(points)} and len(set(got)) == len(got)
             and set(got) <= brute_front(points) and [points[i][0] for i in got] == sorted(points[i][0] for i in got))
    if right:
        nb15.judge_front(points, got, "drawn")
    else:
        with pytest.raises(AssertionError):
            nb15.judge_front(points, got, "drawn")
