"""The checks of exercise notebook 13 pass the reference solutions and fail stubs and wrong answers."""
import pytest
import torch
from nbtools import ROOT, notebook_namespace

from course_lib.checks.nb13 import (
    check_fake_quant_ste,
    check_int4_group_quantize,
    check_kmeans_quantize,
    check_linear_qparams,
    check_linear_quantize,
)

NS = notebook_namespace(ROOT / "solutions" / "13_quantization_exercises.ipynb")
quantize, dequantize = NS["linear_quantize"], NS["linear_dequantize"]


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_linear_qparams(NS["linear_qparams"])
    check_linear_quantize(quantize, dequantize)
    check_fake_quant_ste(NS["fake_quant_ste"])
    check_kmeans_quantize(NS["kmeans_quantize"])


def test_the_library_versions_pass_too():
    from course_lib.compression import kmeans
    from course_lib.compression import quantization as Q

    check_linear_quantize(lambda x, s, z, lo, hi: x.mul(1 / torch.tensor(s)).round().add(z).clamp(lo, hi).int(),
                          lambda q, s, z: (q.float() - z) * s)
    check_fake_quant_ste(lambda x, s, z, lo, hi: Q._FakeQuantSTE.apply(x, torch.tensor(s), torch.tensor(float(z)), lo, hi))
    check_kmeans_quantize(lambda w, k, iters: kmeans.kmeans_quantize(w, k, iters))


def test_stubs_fail():
    with pytest.raises(NotImplementedError):
        check_linear_qparams(stub)
    with pytest.raises(NotImplementedError):
        check_linear_quantize(stub, stub)
    with pytest.raises(NotImplementedError):
        check_linear_quantize(quantize, stub)
    with pytest.raises(NotImplementedError):
        check_fake_quant_ste(stub)
    with pytest.raises(NotImplementedError):
        check_kmeans_quantize(stub)


def qparams_without_zero(x, qmin, qmax):
    lo, hi = x.min().item(), x.max().item()
    scale = (hi - lo) / (qmax - qmin)
    return scale, int(min(max(qmin - round(lo / scale), qmin), qmax))


def qparams_zero_point_sign(x, qmin, qmax):
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    return scale, qmin + round(lo / scale)


def qparams_too_many_levels(x, qmin, qmax):
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / (qmax - qmin + 1)
    return scale, int(min(max(qmin - round(lo / scale), qmin), qmax))


def qparams_unrounded(x, qmin, qmax):
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    return scale, qmin - lo / scale


def qparams_symmetric(x, qmin, qmax):
    m = x.abs().max().item()
    return 2 * m / (qmax - qmin), (qmin + qmax + 1) // 2


@pytest.mark.parametrize("wrong", [qparams_without_zero, qparams_zero_point_sign, qparams_too_many_levels,
                                   qparams_unrounded, qparams_symmetric])
def test_wrong_qparams_fail(wrong):
    with pytest.raises(AssertionError):
        check_linear_qparams(wrong)


@pytest.mark.parametrize("wrong", [
    lambda x, s, z, lo, hi: (torch.round(x / s) + z).int(),                           # no clamp
    lambda x, s, z, lo, hi: (torch.floor(x / s) + z).clamp(lo, hi).int(),             # floor
    lambda x, s, z, lo, hi: (torch.floor(x / s + 0.5) + z).clamp(lo, hi).int(),       # halves round up
    lambda x, s, z, lo, hi: (torch.round(x / s) - z).clamp(lo, hi).int(),             # zero-point sign
    lambda x, s, z, lo, hi: torch.round(x / s + z).clamp(lo, hi),                     # float result
    lambda x, s, z, lo, hi: torch.round((x - z) / s).clamp(lo, hi).int(),             # z in float units
])
def test_wrong_quantize_fails(wrong):
    with pytest.raises(AssertionError):
        check_linear_quantize(wrong, dequantize)


@pytest.mark.parametrize("wrong", [lambda q, s, z: q.float() * s - z, lambda q, s, z: (q.float() + z) * s,
                                   lambda q, s, z: q.float() / s - z])
def test_wrong_dequantize_fails(wrong):
    with pytest.raises(AssertionError):
        check_linear_quantize(quantize, wrong)


def fq(x, s, z, lo, hi):
    return (torch.round(x / s) + z).clamp(lo, hi).sub(z).mul(s)


@pytest.mark.parametrize("wrong", [
    fq,                                                                    # round(): zero gradient
    lambda x, s, z, lo, hi: x + (fq(x, s, z, lo, hi) - x).detach(),        # STE without the clamp mask
    lambda x, s, z, lo, hi: fq(x, s, z, lo, hi).detach(),                  # no gradient at all
    lambda x, s, z, lo, hi: x + (torch.round(x / s) * s - x).detach(),     # no zero point, no clamp
])
def test_wrong_fake_quant_ste_fails(wrong):
    with pytest.raises(AssertionError):
        check_fake_quant_ste(wrong)


def lloyd(weight, k, iters, init, update=True, nearest=lambda d: d.abs().argmin(1)):
    w = weight.reshape(-1)
    centroids = init(w, k)
    for _ in range(iters):
        indices = nearest(w[:, None] - centroids[None, :])
        for j in range(k):
            if update and (indices == j).any():
                centroids[j] = w[indices == j].mean()
    return centroids, nearest(w[:, None] - centroids[None, :]).reshape(weight.shape)


def linear(w, k):
    return torch.linspace(w.min().item(), w.max().item(), k)


@pytest.mark.parametrize("wrong", [
    lambda w, k, iters: lloyd(w, k, iters, lambda v, k: v[torch.randperm(len(v))[:k]].clone()),      # random init
    lambda w, k, iters: lloyd(w, k, iters, lambda v, k: torch.rand(k) * (v.max() - v.min()) + v.min()),
    lambda w, k, iters: lloyd(w, k, iters, lambda v, k: v.quantile(torch.linspace(0, 1, k))),         # density init
    lambda w, k, iters: lloyd(w, k, iters, linear, update=False),                                      # not updated
    lambda w, k, iters: lloyd(w, k, iters, linear, nearest=lambda d: d.argmin(1)),                      # no abs
    lambda w, k, iters: lloyd(w, k, iters, lambda v, k: torch.linspace(0, 1, k)),                       # wrong range
])
def test_wrong_kmeans_fails(wrong):
    torch.manual_seed(0)
    with pytest.raises(AssertionError):
        check_kmeans_quantize(wrong)



def qparams_per_channel(x, qmin, qmax):
    x2 = x.reshape(x.shape[0], -1) if x.dim() > 1 else x[None]
    lo, hi = x2.amin(1).clamp(max=0), x2.amax(1).clamp(min=0)
    scale = (hi - lo) / (qmax - qmin)
    zero_point = (qmin - torch.round(lo / scale)).clamp(qmin, qmax).int()
    return (scale, zero_point) if x.dim() > 1 else (scale.item(), int(zero_point))


def qparams_int8_only(x, qmin, qmax):
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / 255
    return scale, int(min(max(qmin - round(lo / scale), qmin), qmax))


def qparams_truncated_zero_point(x, qmin, qmax):
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    return scale, int(min(max(qmin - int(lo / scale), qmin), qmax))


@pytest.mark.parametrize("wrong, hint", [
    (qparams_per_channel, "PER TENSOR"), (qparams_int8_only, "scale"), (qparams_truncated_zero_point, "zero_point"),
])
def test_qparams_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_linear_qparams(wrong)


@pytest.mark.parametrize("wrong, hint", [
    (lambda x, s, z, lo, hi: torch.round(x / s).clamp(lo, hi).int() + z, "saturate"),       # clamps before adding z
    (lambda x, s, z, lo, hi: (torch.round(x / s) + z).clamp(-128, 127).int(), "saturate"),  # int8 range always
    (lambda x, s, z, lo, hi: (torch.round(x.flatten() / s) + z).clamp(lo, hi).int(), "shape"),
])
def test_quantize_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_linear_quantize(wrong, dequantize)


def ste_mask_on_x(x, s, z, lo, hi):
    inside = ((x >= (lo - z) * s) & (x <= (hi - z) * s)).float()
    return x * inside + (fq(x, s, z, lo, hi) - x * inside).detach()


def ste_clamped_identity(x, s, z, lo, hi):
    xc = x.clamp((lo - z) * s, (hi - z) * s)
    return xc + (fq(x, s, z, lo, hi) - xc).detach()


def ste_through_clamp(x, s, z, lo, hi):             # STE round, then clamp: v + (round(v) - v) is not round(v)
    v = x / s
    q = (v + (torch.round(v) - v).detach() + z).clamp(lo, hi)
    return (q - z) * s


@pytest.mark.parametrize("wrong", [ste_mask_on_x, ste_clamped_identity, ste_through_clamp])
def test_ste_mask_from_x_fails_with_a_reason(wrong):
    with pytest.raises(AssertionError, match="ROUNDED code"):
        check_fake_quant_ste(wrong)


def test_other_right_ste_answers_pass():
    def ste_mask_then_clamp(x, s, z, lo, hi):       # exact codes, the mask from them, gradient through x / s * s
        v = x / s
        code = torch.round(v.detach()) + z
        inside = (code >= lo) & (code <= hi)
        return ((v * inside + (code.clamp(lo, hi) - z - v * inside).detach()) * s)

    check_fake_quant_ste(ste_mask_then_clamp)


class Round(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v):
        return torch.round(v)

    @staticmethod
    def backward(ctx, g):
        return g


def test_ste_with_clamps_gradient_fails_at_the_end_codes():   # torch.clamp gives no gradient AT its bounds
    with pytest.raises(AssertionError, match="clamp's own gradient"):
        check_fake_quant_ste(lambda x, s, z, lo, hi: (Round.apply(x / s) + z).clamp(lo, hi).sub(z).mul(s))


# ---- exercise 5: the int4 group quantizer with packing ----------------------------------------------
def int4_variant(w, G, axis_last=True, symmetric=False, levels=15, clamp_max=15, per_row=False, swap=False, pack=True):
    """A parametrised int4 group quantizer: the defaults are right; each argument makes one plausible mistake."""
    out, n = w.shape
    if not axis_last:                                        # groups of G consecutive OUTPUT channels
        groups = w.t().reshape(n, out // G, G)
    elif per_row:
        groups = w.reshape(out, 1, n)
    else:
        groups = w.reshape(out, n // G, G)
    if symmetric:
        scale = groups.abs().amax(-1) / 7.5
        zero = torch.full_like(scale, 8)
    else:
        lo, hi = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
        scale = (hi - lo) / levels
        zero = torch.round(-lo / scale)
    codes = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, clamp_max).to(torch.uint8)
    codes = codes.reshape(n, out).t() if not axis_last else codes.reshape(out, n)
    if not pack:
        return codes, scale, zero
    low, high = (codes[:, 1::2], codes[:, 0::2]) if swap else (codes[:, 0::2], codes[:, 1::2])
    return low | (high << 4), scale, zero


def int4_signed_no_zero(w, G):                               # codes -8..7, no zero point at all
    out, n = w.shape
    groups = w.reshape(out, n // G, G)
    scale = groups.abs().amax(-1) / 7.5
    codes = torch.round(groups / scale[..., None]).clamp(-8, 7).to(torch.int8).reshape(out, n)
    nibbles = (codes & 15).to(torch.uint8)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4), scale, torch.zeros_like(scale)


@pytest.mark.parametrize("wrong, message", [
    (lambda w, G: int4_variant(w, G, axis_last=False), "INPUT channels"),
    (lambda w, G: int4_variant(w, G, symmetric=True), "SYMMETRIC"),
    (int4_signed_no_zero, "SYMMETRIC"),
    (lambda w, G: int4_variant(w, G, swap=True), "nibble order"),
    (lambda w, G: int4_variant(w, G, levels=16), "not 0..16"),
    (lambda w, G: int4_variant(w, G, clamp_max=14), "the largest code stored is 14, .* not 0..14"),
    (lambda w, G: int4_variant(w, G, clamp_max=7), r"the largest code stored is 7, .*0..15 \(2\^4 = 16 levels\)\.$"),
    (lambda w, G: int4_variant(w, G, levels=14, clamp_max=14), "not 0..14"),
    (lambda w, G: int4_variant(w, G, per_row=True), "one per row"),
    (lambda w, G: int4_variant(w, G, pack=False), "one code per byte"),
])
def test_wrong_int4_answers_fail_with_a_reason(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_int4_group_quantize(wrong)


def test_int4_stub_fails_and_right_variants_pass():
    with pytest.raises(NotImplementedError):
        check_int4_group_quantize(stub)
    check_int4_group_quantize(NS["int4_group_quantize"])
    check_int4_group_quantize(int4_variant)

    def python_loops(w, G):                                  # group by group, packed with view and arithmetic
        out, n = w.shape
        scale, zero = torch.empty(out, n // G, dtype=torch.float64), torch.empty(out, n // G, dtype=torch.int64)
        codes = torch.empty(out, n, dtype=torch.int64)
        for r in range(out):
            for j in range(n // G):
                group = w[r, j * G:(j + 1) * G].double()
                lo, hi = min(group.min().item(), 0.0), max(group.max().item(), 0.0)
                scale[r, j] = (hi - lo) / 15
                zero[r, j] = 0 - round(lo / scale[r, j].item())
                codes[r, j * G:(j + 1) * G] = (group / scale[r, j] + zero[r, j]).round().clamp(0, 15).long()
        pairs = codes.view(out, n // 2, 2)
        return (pairs[..., 0] + 16 * pairs[..., 1]).to(torch.uint8), scale, zero

    check_int4_group_quantize(python_loops)

    from course_lib.compression import int4

    def library(w, G):
        codes, scale, zero = int4.quantize(w, G, scale_dtype=torch.float32)
        return int4.pack(codes), scale, zero

    check_int4_group_quantize(library)
