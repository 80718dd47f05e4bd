"""The checks of exercise notebook 13 pass the reference solutions and fail stubs and wrong answers."""
import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
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


def test_other_quantizers_pass():
    check_linear_quantize(lambda x, s, z, lo, hi: x.mul(1 / torch.tensor(s)).round().add(z).clamp(lo, hi).int(),
                          lambda q, s, z: (q.float() - z) * s)


def library_fake_quant(x, s, z, lo, hi):
    from course_lib.compression import quantization as Q
    return Q._FakeQuantSTE.apply(x, torch.tensor(s), torch.tensor(float(z)), lo, hi)


def library_kmeans(w, k, iters):
    from course_lib.compression import kmeans
    return kmeans.kmeans_quantize(w, k, iters)


def torch_fake_quant(x, s, z, lo, hi):
    return torch.fake_quantize_per_tensor_affine(x, s, z, lo, hi)


def library_qparams(x, qmin, qmax):
    from torch.ao.quantization.observer import MinMaxObserver
    observer = MinMaxObserver(quant_min=qmin, quant_max=qmax)
    observer(x)
    scale, zero_point = observer.calculate_qparams()
    return scale.item(), int(zero_point)


def library_quantize(x, s, z, lo, hi):
    return torch.quantize_per_tensor(x, s, z, torch.qint32).int_repr().clamp(lo, hi)


def library_int4(w, G):
    from course_lib.compression import int4
    codes, scale, zero = int4.quantize(w, G, scale_dtype=torch.float32)
    return int4.pack(codes), scale, zero


@pytest.mark.parametrize("check, wrong, message", [
    (check_fake_quant_ste, library_fake_quant, "uses _FakeQuantSTE"),
    (check_fake_quant_ste, torch_fake_quant, "uses fake_quantize_per_tensor_affine"),
    (check_kmeans_quantize, library_kmeans, "uses kmeans_quantize"),
    (check_linear_qparams, library_qparams, "uses MinMaxObserver"),
    (lambda f: check_linear_quantize(f, dequantize), library_quantize, "uses quantize_per_tensor"),
    (check_int4_group_quantize, library_int4, "uses quantize"),
])
def test_library_versions_are_rejected(check, wrong, message):
    with pytest.raises(AssertionError, match=message):
        check(wrong)


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
        scale = torch.where(scale > 0, scale, 1.0)
        zero = torch.round(-lo / scale)
    codes = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, clamp_max).to(torch.uint8)
    codes = codes.reshape(n, out).t() if not axis_last else codes.reshape(out, n)
    zero = zero.to(torch.uint8)
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
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4), scale, torch.zeros_like(scale, dtype=torch.int64)


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
                scale[r, j] = (hi - lo) / 15 or 1.0           # an all-zero group: any positive scale
                zero[r, j] = 0 - round(lo / scale[r, j].item())
                codes[r, j * G:(j + 1) * G] = (group / scale[r, j] + zero[r, j]).round().clamp(0, 15).long()
        pairs = codes.view(out, n // 2, 2)
        return (pairs[..., 0] + 16 * pairs[..., 1]).to(torch.uint8), scale, zero

    check_int4_group_quantize(python_loops)


# ---- messages: each plausible mistake is named --------------------------------------------------------

def qparams_no_eps(x, qmin, qmax):                   # a tensor of zeros divides by zero
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = (hi - lo) / (qmax - qmin)
    return scale, int(min(max(qmin - round(lo / scale), qmin), qmax))


def qparams_small_eps(x, qmin, qmax):                # a stand-in scale, but not MinMaxObserver's eps
    lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
    scale = max((hi - lo) / (qmax - qmin), 1e-12)
    return scale, int(min(max(qmin - round(lo / scale), qmin), qmax))


def qparams_tensors(x, qmin, qmax):                   # one-element tensors, not Python numbers
    lo, hi = x.min().clamp(max=0), x.max().clamp(min=0)
    scale = ((hi - lo) / (qmax - qmin)).clamp(min=torch.finfo(torch.float32).eps)
    return scale, (qmin - torch.round(lo / scale)).clamp(qmin, qmax).int()


def qparams_in_place(x, qmin, qmax):                  # clamp_ changes the caller's tensor
    lo = x.clamp_(max=0).min().item()
    return NS["linear_qparams"](torch.tensor([lo, x.max().item()]), qmin, qmax)


@pytest.mark.parametrize("wrong, hint", [
    (qparams_no_eps, "divided by zero.*eps"), (qparams_small_eps, "below eps"), (qparams_tensors, "Python float"),
    (qparams_unrounded, "Python int"), (qparams_in_place, "changed the tensor"),
    (lambda x, qmin, qmax: tuple(float(v) for v in NS["linear_qparams"](x, qmin, qmax)), "Python int"),
])
def test_more_qparams_messages(wrong, hint):
    with pytest.raises(AssertionError, match=f"(?s){hint}"):
        check_linear_qparams(wrong)


@pytest.mark.parametrize("wrong, hint", [
    (lambda x, s, z, lo, hi: (torch.round(x / s) + z).clamp(lo, hi).to(torch.int8), "holds -128..127 only"),
    (lambda x, s, z, lo, hi: (torch.round(x / s) + z).clamp(lo, hi).to(torch.uint8), "holds 0..255 only"),
    (lambda x, s, z, lo, hi: (torch.round(x / s) + z).clamp(lo, hi).bool(), "quantized values are integers"),
    (lambda x, s, z, lo, hi: (torch.floor(x / s) + z).clamp(lo, hi).int(), "these are floor\\(x / scale\\)"),
    (lambda x, s, z, lo, hi: (torch.trunc(x / s) + z).clamp(lo, hi).int(), "these are trunc\\(x / scale\\)"),
    (lambda x, s, z, lo, hi: (torch.round(x / s) - z).clamp(lo, hi).int(), "ADD the zero point"),
    (lambda x, s, z, lo, hi: torch.round((x - z) / s).clamp(lo, hi).int(), "round\\(\\(x - zero_point\\) / scale\\)"),
    (lambda x, s, z, lo, hi: (torch.floor(x / s + 0.5) + z).clamp(lo, hi).int(), "only the exact halves differ"),
    (lambda x, s, z, lo, hi: quantize(x.div_(s).mul_(s), s, z, lo, hi), "changed the tensor"),
])
def test_more_quantize_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_linear_quantize(wrong, dequantize)


@pytest.mark.parametrize("wrong, hint", [
    (lambda q, s, z: q.float() * s - z, "subtract the zero point BEFORE scaling"),
    (lambda q, s, z: (q.float() + z) * s, "SUBTRACT the zero point"),
    (lambda q, s, z: q.float() / s - z, "MULTIPLY by the scale"),
    (lambda q, s, z: q.float() * s, "subtract the zero point first"),
    (lambda q, s, z: q - z, "float tensor"),                                   # integers: the scale forgotten
    (lambda q, s, z: q.sub_(z).float() * s, "changed the tensor"),
])
def test_dequantize_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_linear_quantize(quantize, wrong)


@pytest.mark.parametrize("wrong, hint", [
    (lambda x, s, z, lo, hi: ste_half_up(x, s, z, lo, hi), "Only exact halves of the grid differ"),
    (lambda x, s, z, lo, hi: NS["fake_quant_ste"](x.flatten(), s, z, lo, hi), "keep x's shape"),
    (ste_mask_on_x, "beyond the range's ends BEFORE rounding"),
    (ste_through_clamp, "round exactly onto qmin or qmax"),
])
def test_more_fake_quant_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_fake_quant_ste(wrong)


def ste_half_up(x, s, z, lo, hi):                    # floor(v + 0.5): halves go up, not to even
    q = torch.floor(x / s + 0.5) + z
    inside = ((q >= lo) & (q <= hi)).float()
    return x * inside + ((q.clamp(lo, hi) - z) * s - x * inside).detach()


@pytest.mark.parametrize("wrong, hint", [
    (lambda w, k, iters: (lambda c, i: (c, i.float()))(*NS["kmeans_quantize"](w, k, iters)), "integer tensor"),
    (lambda w, k, iters: (lambda c, i: (c, i == 1))(*NS["kmeans_quantize"](w, k, iters)), "integer tensor"),
    (lambda w, k, iters: NS["kmeans_quantize"](w.clamp_(min=w.min().item() + 1e-3), k, iters), "changed the tensor"),
    (lambda w, k, iters: (NS["kmeans_quantize"](w, k, iters)[0], NS["kmeans_quantize"](w, k, iters)[1].flatten()),
     "weight's shape"),
])
def test_kmeans_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_kmeans_quantize(wrong)


def int4_no_stand_in(w, G):                           # an all-zero group gets scale 0, zero nan
    out, n = w.shape
    groups = w.reshape(out, n // G, G)
    lo, hi = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    scale = (hi - lo) / 15
    zero = torch.round(-lo / scale).nan_to_num(0)
    codes = (torch.round(groups / scale[..., None]) + zero[..., None]).nan_to_num(0).clamp(0, 15).to(torch.uint8)
    codes = codes.reshape(out, n)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, zero.to(torch.uint8)


def int4_min_scale(w, G):                             # a floor on the scale: wrong for groups of tiny values
    packed, scale, zero = NS["int4_group_quantize"](w, G)
    if bool((scale >= 1e-8).all()):
        return packed, scale, zero
    return int4_variant(w, G, levels=15)[0], scale.clamp(min=1e-8), zero


@pytest.mark.parametrize("wrong, hint", [
    (int4_no_stand_in, "every scale must be positive and finite"),
    (lambda w, G: (lambda p, s, z: (p, s, z.float()))(*NS["int4_group_quantize"](w, G)), "zero is torch.float32"),
    (lambda w, G: NS["int4_group_quantize"](w.abs_(), G), "changed the tensor"),
    (int4_min_scale, "a minimum you clamp to"),
])
def test_more_int4_messages(wrong, hint):
    with pytest.raises(AssertionError, match=hint):
        check_int4_group_quantize(wrong)


# ---- drawn inputs ---------------------------------------------------------------------------------

@st.composite
def tensors(draw):
    """x of 0 to 3 dims, values over several magnitudes, and exact halves of a power-of-two grid."""
    shape = draw(st.lists(st.integers(1, 5), max_size=3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=g) * 10.0 ** draw(st.integers(-3, 2))
    if draw(st.booleans()):
        x = (torch.randint(-300, 300, shape, generator=g) + 0.5) * 2.0 ** draw(st.integers(-6, 2))
    return x


QPARAMS = st.tuples(st.sampled_from([(-128, 127), (0, 255), (-8, 7), (0, 15)]),
                    st.one_of(st.integers(-8, 2).map(lambda e: 2.0**e), st.floats(1e-3, 2.0)))


@settings(max_examples=100)
@given(tensors(), QPARAMS, st.integers(-20, 300))
def test_linear_quantize_is_torchs(x, ranges_scale, zero_point):
    from course_lib.checks import torch_quantized
    (qmin, qmax), scale = ranges_scale
    zero_point = min(max(zero_point, qmin), qmax)
    codes, values = torch_quantized(x, scale, zero_point, qmin, qmax)
    q = quantize(x, scale, zero_point, qmin, qmax)
    exact = 2.0 ** round(math.log2(scale)) == scale     # else x / s and x * (1 / s) may round a near-tie apart
    assert q.shape == x.shape and (torch.equal(q.long(), codes) if exact else (q.long() - codes).abs().max() <= 1)
    assert torch.allclose(dequantize(codes.int(), scale, zero_point), values, atol=1e-5, rtol=1e-6)


@settings(max_examples=60)
@given(tensors(), st.sampled_from([(-128, 127), (0, 255), (-8, 7), (0, 15)]), st.sampled_from([1.0, 0.0, 1e-9]))
def test_linear_qparams_is_minmaxobserver(x, qrange, factor):
    from course_lib.checks.nb13 import _torch_minmax_qparams
    x = x * factor                                            # zeros and tiny values too
    qmin, qmax = qrange
    scale, zero_point = NS["linear_qparams"](x, qmin, qmax)
    theirs = _torch_minmax_qparams(x, qmin, qmax)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert abs(scale - theirs[0]) <= 1e-5 * theirs[0]
    assert abs(zero_point - theirs[1]) <= (0 if x.abs().max() == 0 else 1)   # float32 vs float64 near a half


@settings(max_examples=60)
@given(tensors(), st.sampled_from([(-128, 127), (0, 255), (-8, 7)]), st.integers(-8, 2))
def test_fake_quant_ste_is_torchs(x, qrange, e):
    qmin, qmax = qrange
    scale, zero_point = 2.0**e, (qmin + qmax + 1) // 2
    x = x.clone().requires_grad_()
    ours = NS["fake_quant_ste"](x, scale, zero_point, qmin, qmax)
    theirs = torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin, qmax)
    assert torch.equal(ours, theirs)
    up = torch.randn(x.shape)
    assert torch.allclose(torch.autograd.grad(ours, x, up)[0], torch.autograd.grad(theirs, x, up)[0], atol=1e-6)


@st.composite
def int4_weights(draw):
    """[out, in] weights with groups of zeros, of one sign, of tiny values, and outliers."""
    out, groups, G = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.sampled_from([2, 4, 8]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    w = torch.randn(out, groups, G, generator=g) * 10.0 ** torch.randint(-30, 2, (out, groups, 1), generator=g)
    w = w + draw(st.sampled_from([0.0, 0.5])) * w.abs()                 # skewed to positive
    w[torch.rand(out, groups, generator=g) < 0.2] = 0.0                  # all-zero groups
    return w.reshape(out, groups * G), G


@settings(max_examples=60)
@given(int4_weights())
def test_int4_solution_and_the_course_library_meet_the_checks_rules(w_g):
    from course_lib.checks.nb13 import _expect_int4, _int4_shapes
    w, G = w_g
    for packed, scale, zero in (NS["int4_group_quantize"](w, G), library_int4(w, G)):
        _expect_int4(w, G, *_int4_shapes((packed, scale, zero), *w.shape, G))


def lloyd_variant(*, steps=lambda iters: iters, stale=False, empty=None):
    """The text's k-means with one thing changed: how many updates run, whether the indices returned are the
    last assignment inside the loop, and what an empty centroid becomes (None: it stays)."""
    def kmeans_quantize(weight, k, iters=50):
        w = weight.reshape(-1)
        centroids = torch.linspace(w.min().item(), w.max().item(), k)
        indices = (w[:, None] - centroids).abs().argmin(1)
        for _ in range(steps(iters)):
            indices = (w[:, None] - centroids).abs().argmin(1)
            for j in range(k):
                members = w[indices == j]
                if len(members) or empty is not None:
                    centroids[j] = members.mean() if len(members) else empty
        if not stale:
            indices = (w[:, None] - centroids).abs().argmin(1)
        return centroids, indices.reshape(weight.shape)
    return kmeans_quantize


@pytest.mark.parametrize("wrong, hint", [
    (lloyd_variant(steps=lambda iters: max(0, iters - 1)), "one update short"),
    (lloyd_variant(steps=lambda iters: iters + 1), "one update too many"),
    (lloyd_variant(stale=True), "assignment made before the last update"),
    (lloyd_variant(empty=float("nan")), r"had no weights .* must stay .*NaN"),
    (lloyd_variant(empty=0.0), r"centroid\(s\) \[1, 2\] had no weights in update 1"),
])
def test_kmeans_before_convergence_names_the_mistake(wrong, hint):
    """Judged only where it has converged, each of these passed: after 200 updates one more or one fewer changes
    nothing, and the last assignment is the final one."""
    with pytest.raises(AssertionError, match=hint):
        check_kmeans_quantize(wrong)


def test_kmeans_vectorised_and_either_tie_pass():
    def vectorised(weight, k, iters=50):
        w = weight.reshape(-1).double()
        centroids = torch.linspace(w.min().item(), w.max().item(), k, dtype=torch.float64)
        for _ in range(iters):
            idx = (w[:, None] - centroids).abs().argmin(1)
            sums = torch.zeros(k, dtype=torch.float64).index_add_(0, idx, w)
            counts = torch.bincount(idx, minlength=k)
            centroids = torch.where(counts > 0, sums / counts.clamp(min=1), centroids)
        # ties to the HIGHER index: flip, argmin, flip back
        idx = k - 1 - (w[:, None] - centroids.flip(0)).abs().argmin(1)
        return centroids.float(), idx.reshape(weight.shape)
    check_kmeans_quantize(vectorised)
    check_kmeans_quantize(lloyd_variant())
