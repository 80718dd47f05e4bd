"""Checks for solutions/13_quantization_exercises.ipynb: linear quantization, fake-quant with a
straight-through estimator, k-means weight sharing, the group-wise int4 quantizer with packing.

Compared against PyTorch's own torch.fake_quantize_per_tensor_affine (values and gradient), its
MinMaxObserver where this torch still has one, the properties Lloyd's algorithm guarantees, and for
int4 the behaviour the format fixes (shapes, nibble order, the grid, |w - w_hat| <= scale / 2).
"""
from __future__ import annotations

import warnings

import torch

from . import expect, expect_close, passed, torch_quantized

RANGES = [(-128, 127), (0, 255), (-8, 7), (0, 15)]
QTYPES = {(-128, 127): torch.qint8, (0, 255): torch.quint8}


def _grid_cases(scale: float, seed: int = 0) -> torch.Tensor:
    """Random values, values far out of range, and for a power-of-two scale the exact halves of the
    grid (how ties round). Other scales get no ties: there x / scale and PyTorch's x * (1 / scale)
    can differ in the last bit, and so round a near-tie differently."""
    g = torch.Generator().manual_seed(seed)
    halves = (torch.arange(-40, 40, dtype=torch.float32) + 0.5) * scale
    cases = [torch.randn(200, generator=g) * 40 * scale, torch.tensor([1e4, -1e4]) * scale]
    return torch.cat(cases + ([halves] if scale == 2.0 ** round(torch.tensor(scale).log2().item()) else []))


def check_linear_quantize(linear_quantize, linear_dequantize) -> None:
    """`linear_quantize(x, scale, zero_point, qmin, qmax)` -> integer tensor and
    `linear_dequantize(q, scale, zero_point)` -> float tensor, equal to PyTorch's."""
    for i, (qmin, qmax) in enumerate(RANGES):
        for scale in (0.5, 0.0173):
            zero_point = (qmin + qmax + 1) // 2 - 3
            x = _grid_cases(scale, seed=i)
            q = linear_quantize(x, scale, zero_point, qmin, qmax)
            expect(isinstance(q, torch.Tensor) and q.shape == x.shape,
                   f"linear_quantize must return a tensor of x's shape {tuple(x.shape)}")
            expect(not q.is_floating_point(), f"linear_quantize returned {q.dtype}: quantized values are "
                   "integers. Hint: finish with .to(torch.int32) (or int64).")
            ref, fq = torch_quantized(x, scale, zero_point, qmin, qmax)
            q = q.to(torch.int64)
            expect(q.min() >= qmin and q.max() <= qmax,
                   f"qmin={qmin}, qmax={qmax}: got integers from {q.min().item()} to {q.max().item()}. Values "
                   "outside the range must saturate at qmin/qmax (clamp), or they would wrap around.")
            bad = q != ref
            if bad.any():
                t = (x[bad] / scale).tolist()[:3]
                halves = bool(torch.all(((x[bad] / scale) % 1 - 0.5).abs() < 1e-4))
                expect(False, f"qmin={qmin}, qmax={qmax}, scale={scale}, zero_point={zero_point}: "
                       f"{int(bad.sum())} of {len(x)} integers differ from PyTorch's, e.g. x/scale={t}: "
                       f"expected {ref[bad][:3].tolist()}, got {q[bad][:3].tolist()}. Hint: "
                       + ("only the exact halves differ: torch.round rounds halves to even, as PyTorch's "
                          "kernels do; floor(x/scale + 0.5) rounds them up." if halves else
                          "q = clamp(round(x / scale) + zero_point, qmin, qmax): round to nearest, not floor; "
                          "add the zero point (do not subtract it)."))
            if hasattr(torch, "quantize_per_tensor") and (qmin, qmax) in QTYPES:   # deprecated in torch 2.14
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    theirs = torch.quantize_per_tensor(x, scale, zero_point, QTYPES[qmin, qmax]).int_repr()
                expect(torch.equal(q, theirs.to(torch.int64)), "linear_quantize differs from torch.quantize_per_tensor")
            expect_close(linear_dequantize(ref, scale, zero_point), fq, f"linear_dequantize (scale={scale}, "
                         f"zero_point={zero_point})", atol=1e-5, rtol=1e-6,
                         hint="x_hat = (q - zero_point) * scale, as a float tensor.")
    x = torch.randn(6, 50, generator=torch.Generator().manual_seed(5))
    q = linear_quantize(x, 0.02, 3, -128, 127)
    expect(isinstance(q, torch.Tensor) and q.shape == x.shape,
           f"linear_quantize of a {tuple(x.shape)} tensor returned shape {tuple(getattr(q, 'shape', ()))}: keep x's "
           "shape (element-wise operations do; do not flatten).")
    expect(torch.equal(q.to(torch.int64), torch_quantized(x, 0.02, 3, -128, 127)[0]),
           "linear_quantize of a [6, 50] tensor differs from PyTorch's: one scale and zero point for every element.")
    passed("linear_quantize / linear_dequantize")


def _torch_minmax_qparams(x, qmin, qmax):
    """PyTorch's MinMaxObserver (torch.ao, deprecated; or its torchao copy), or None if neither exists."""
    for module in ("torch.ao.quantization.observer", "torchao.quantization.pt2e"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                observer = __import__(module, fromlist=["MinMaxObserver"]).MinMaxObserver(
                    dtype=torch.quint8 if qmin >= 0 else torch.qint8, quant_min=qmin, quant_max=qmax)
        except (ImportError, AttributeError):
            continue
        observer(x)
        scale, zero_point = observer.calculate_qparams()
        return scale.item(), int(zero_point.item())
    return None


def check_linear_qparams(linear_qparams) -> None:
    """`linear_qparams(x, qmin, qmax) -> (scale: float, zero_point: int)` from x's min and max."""
    g = torch.Generator().manual_seed(0)
    cases = {"mixed signs": torch.randn(500, generator=g) * 2 + 0.5,
             "all positive (like ReLU outputs)": torch.rand(500, generator=g) * 3 + 2,
             "all negative": -torch.rand(500, generator=g) * 4 - 1,
             "a [6, 50] weight, rows of different ranges":
                 torch.randn(6, 50, generator=g) * torch.arange(1.0, 7.0)[:, None]}
    for name, x in cases.items():
        for qmin, qmax in RANGES:
            got = linear_qparams(x.clone(), qmin, qmax)
            expect(isinstance(got, tuple) and len(got) == 2, "linear_qparams must return (scale, zero_point)")
            scale, zero_point = got
            for value, what in ((scale, "scale"), (zero_point, "zero_point")):
                expect(not isinstance(value, torch.Tensor) or value.numel() == 1,
                       f"{name}, range {qmin}..{qmax}: {what} has shape {tuple(getattr(value, 'shape', ()))}: "
                       "that is one per row "
                       "(per channel). This exercise is PER TENSOR: one scale and zero point from the min and max "
                       "of the whole tensor (x.min(), x.max() without dim).")
            scale = float(scale)
            expect(float(zero_point) == round(float(zero_point)), f"zero_point must be an integer; got {zero_point}")
            zero_point = int(zero_point)
            expect(scale > 0, f"{name}, range {qmin}..{qmax}: scale must be > 0; got {scale}")
            expect(qmin <= zero_point <= qmax, f"{name}, range {qmin}..{qmax}: zero_point {zero_point} is outside "
                   "the integer range. Hint: zero_point = qmin - round(lo / scale), clamped to [qmin, qmax]; "
                   "check its sign.")
            lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
            fq = torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin, qmax)
            worst = (fq - x).abs().max().item()
            expect(worst <= scale / 2 * 1.001 + 1e-6,
                   f"{name}, range {qmin}..{qmax}: some x is off by {worst:.3g} after quantize/dequantize, more "
                   f"than scale/2 = {scale / 2:.3g}: the grid does not cover [min(x), max(x)]. Hint: use "
                   "lo = min(x.min(), 0), hi = max(x.max(), 0) (0 must be in the range, so that 0.0 is exact), "
                   "scale = (hi - lo) / (qmax - qmin), zero_point = qmin - round(lo / scale).")
            expect(scale <= (hi - lo) / (qmax - qmin) * (1 + 1e-5),
                   f"{name}, range {qmin}..{qmax}: scale {scale:.4g} is larger than needed "
                   f"({(hi - lo) / (qmax - qmin):.4g}): levels are wasted. Hint: divide by qmax - qmin.")
            theirs = _torch_minmax_qparams(x, qmin, qmax)
            if theirs is not None:
                expect(abs(scale - theirs[0]) <= 1e-5 * theirs[0] and zero_point == theirs[1],
                       f"{name}, range {qmin}..{qmax}: PyTorch's MinMaxObserver gives scale={theirs[0]:.6g}, "
                       f"zero_point={theirs[1]}; got {scale:.6g}, {zero_point}.")
    passed("linear_qparams")


def check_fake_quant_ste(fake_quant_ste) -> None:
    """`fake_quant_ste(x, scale, zero_point, qmin, qmax)`: values and gradient of
    torch.fake_quantize_per_tensor_affine (straight-through inside the range, 0 where clamped)."""
    for qmin, qmax in RANGES:
        scale, zero_point = 0.05, (qmin + qmax + 1) // 2
        x = (torch.randn(400, generator=torch.Generator().manual_seed(qmax)) * (qmax - qmin) * scale / 3)
        # just beyond the ends of the grid: x / scale + zero_point is outside [qmin, qmax] but rounds onto it
        # (0.25 / 0.75 of a step: no ties), and just far enough to round off it
        edges = torch.tensor([qmin - 0.25, qmin - 0.75, qmax + 0.25, qmax + 0.75, qmin, qmax]) - zero_point
        x = torch.cat([x, edges * scale]).requires_grad_()
        ours = fake_quant_ste(x, scale, zero_point, qmin, qmax)
        theirs = torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin, qmax)
        expect_close(ours.detach(), theirs.detach(), f"fake_quant_ste values (range {qmin}..{qmax})", atol=1e-6,
                     hint="forward: (clamp(round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale.")
        expect(ours.requires_grad, "the output has no gradient: round() must not cut x out of the graph. "
               "Hint: the straight-through estimator, e.g. x + (x_hat - x).detach() times a mask, or an "
               "autograd.Function whose backward passes the gradient through.")
        upstream = torch.linspace(-1, 1, len(x))
        (g_ours,) = torch.autograd.grad(ours, x, upstream)
        (g_theirs,) = torch.autograd.grad(theirs, x, upstream)
        clipped = g_theirs == 0
        # (1 / scale) * scale need not be exactly 1 in float32: a chain through x / scale is still straight-through
        wrong = (g_ours - g_theirs).abs() > 1e-5 * upstream.abs().max()
        wrong_inside = ~clipped & wrong
        if wrong_inside.any():
            v = x.detach() / scale + zero_point
            code = torch.round(v)
            at_ends = (code <= qmin) | (code >= qmax)
            expect(not bool(at_ends[wrong_inside].all()),
                   f"range {qmin}..{qmax}: an x with x / scale + zero_point = "
                   f"{v[wrong_inside][0].item():.2f} got no gradient, but it rounds to {code[wrong_inside][0]:.0f}, "
                   "inside the range, so PyTorch passes its gradient. Take the mask from the ROUNDED code, "
                   "qmin <= round(x / scale) + zero_point <= qmax, not from x against the range's ends, nor "
                   "from clamp's own gradient (torch.clamp passes none to a value exactly at a bound, and "
                   "v + (round(v) - v).detach() is not exactly round(v) in floating point).")
            raise AssertionError(f"range {qmin}..{qmax}: inside the range the gradient must pass straight through "
                                 "(times 1); round() itself has zero gradient almost everywhere, which would stop "
                                 "training.")
        expect(not wrong.any(),
               f"range {qmin}..{qmax}: {int(wrong.sum())} values were clamped to qmin/qmax but "
               "still got a gradient. PyTorch (and QAT) block the gradient where clamp saturated: nudging "
               "such an x changes nothing in the output.")
    passed("fake_quant_ste")


def _kmeans_call(kmeans_quantize, w, k, iters):
    got = kmeans_quantize(w, k, iters)
    expect(isinstance(got, tuple) and len(got) == 2, "kmeans_quantize must return (centroids, indices)")
    centroids, indices = got
    expect(isinstance(centroids, torch.Tensor) and centroids.shape == (k,),
           f"centroids must be a tensor of shape ({k},); got {getattr(centroids, 'shape', type(centroids))}")
    expect(isinstance(indices, torch.Tensor) and indices.shape == w.shape and not indices.is_floating_point(),
           f"indices must be an integer tensor of the weight's shape {tuple(w.shape)}")
    expect(indices.min() >= 0 and indices.max() < k, f"indices must lie in 0..{k - 1}")
    return centroids.detach().float(), indices.long()


def check_kmeans_quantize(kmeans_quantize) -> None:
    """`kmeans_quantize(weight, k, iters) -> (centroids [k], indices)`: linear init, Lloyd's algorithm."""
    g = torch.Generator().manual_seed(0)
    w = torch.cat([torch.randn(1500, generator=g) * 0.05 - 0.1, torch.randn(900, generator=g) * 0.02 + 0.15,
                   torch.tensor([0.4, -0.35] * 50)]).reshape(25, 100)
    for k in (4, 16):
        c0, i0 = _kmeans_call(kmeans_quantize, w, k, 0)
        expect_close(c0, torch.linspace(w.min().item(), w.max().item(), k), f"centroids with iters=0 (k={k})",
                     atol=1e-6, hint="linear initialisation as in Deep Compression: k values evenly spaced from "
                     "w.min() to w.max() (torch.linspace), not random and not quantiles.")
        torch.manual_seed(1)
        c1, i1 = _kmeans_call(kmeans_quantize, w, k, 200)   # enough iterations to converge
        torch.manual_seed(2)
        c2, i2 = _kmeans_call(kmeans_quantize, w, k, 200)
        expect(torch.equal(c1, c2) and torch.equal(i1, i2), f"k={k}: two calls gave different results: the "
               "result must not depend on the random seed. Hint: the linear initialisation is deterministic.")
        shared = c1[i1]
        expect(shared.unique().numel() <= k, f"k={k}: the shared weights take more than k distinct values")
        dist = (w.reshape(-1, 1) - c1).abs()
        mine = dist.gather(1, i1.reshape(-1, 1)).squeeze(1)
        expect(bool((mine <= dist.min(1).values + 1e-6).all()),
               f"k={k}: {int((mine > dist.min(1).values + 1e-6).sum())} weights are not mapped to their nearest "
               "centroid. Hint: indices = (w[..., None] - centroids).abs().argmin(-1), computed from the final "
               "centroids (after the last update).")
        for j in range(k):
            members = w[i1 == j]
            if len(members):
                expect(abs(c1[j].item() - members.double().mean().item()) < 1e-5,
                       f"k={k}: centroid {j} is {c1[j].item():.5f} but the mean of its {len(members)} weights is "
                       f"{members.double().mean().item():.5f}. Hint: each iteration moves every centroid to the "
                       "mean of the weights assigned to it (keep it where it is if none are).")
        start = c0[i0]
        err, bound = (shared - w).pow(2).mean().item(), (start - w).pow(2).mean().item()
        expect(err <= bound + 1e-9, f"k={k}: mean squared error {err:.3g} is worse than the linear start's "
               f"{bound:.3g}: Lloyd's iterations can only lower it.")
    passed("kmeans_quantize")


def _int4_weight(out: int, cols: int, seed: int) -> torch.Tensor:
    """Not centred on 0 (asymmetric matters), an outlier, a group of one sign; no all-zero group."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, cols, generator=g) * 0.05 + 0.03
    w[1, 3] = 0.7
    w[2, :8] = torch.rand(8, generator=g) + 0.2
    return w


def _int4_shapes(got, out: int, cols: int, G: int):
    expect(isinstance(got, tuple) and len(got) == 3, "int4_group_quantize must return (packed, scale, zero)")
    packed, scale, zero = (torch.as_tensor(t) for t in got)
    groups = cols // G
    expect(packed.dtype == torch.uint8, f"packed must be a uint8 tensor; got {packed.dtype}")
    expect(tuple(packed.shape) != (out, cols), f"packed has shape {(out, cols)}: one code per byte. Pack two "
           "4-bit codes into each byte: [out, in // 2], code 2k | code 2k+1 << 4.")
    expect(tuple(packed.shape) == (out, cols // 2), f"packed has shape {tuple(packed.shape)}; expected "
           f"{(out, cols // 2)}: two codes per byte along each row (the input dimension).")
    for t, what in ((scale, "scale"), (zero, "zero")):
        shape = tuple(t.shape)
        expect(shape not in ((out,), (out, 1)), f"{what} has shape {shape}: one per row (per channel). Group-wise "
               f"means one per group of {G} consecutive input channels: shape {(out, groups)}.")
        expect(shape == (out, groups), f"{what} has shape {shape}; expected {(out, groups)}: groups of {G} "
               "consecutive INPUT channels, along the last dim of the [out, in] weight (not along the output "
               "dim: a matmul sums over the input dim, and a group's scale must apply to one row's slice).")
    expect(scale.is_floating_point(), f"scale must be a float tensor; got {scale.dtype}")
    expect(bool((zero.double() == zero.double().round()).all()), "zero points must be integers (round them)")
    return packed, scale.double(), zero.double().round().long()


def check_int4_group_quantize(int4_group_quantize) -> None:
    """`int4_group_quantize(w, group_size) -> (packed uint8 [out, in // 2], scale [out, in // G],
    zero [out, in // G])`: asymmetric int4 per group of input channels, low nibble first."""
    for out, cols, G, seed in ((64, 256, 32, 0), (6, 48, 8, 1), (10, 256, 128, 2)):
        w = _int4_weight(out, cols, seed)
        packed, scale, zero = _int4_shapes(int4_group_quantize(w.clone(), G), out, cols, G)
        grouped = w.double().reshape(out, -1, G)
        lo, hi = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
        step = (hi - lo) / 15
        ratio = (scale / step).median().item()
        expect(abs(ratio - 15 / 16) > 1e-3, "scale = (hi - lo) / 16: 16 levels 0..15 are 15 steps, so "
               "scale = (hi - lo) / 15 (range 0..15, not 0..16).")
        expect(abs(ratio - 15 / 14) > 1e-3, "scale = (hi - lo) / 14: the codes run 0..15, 15 steps: "
               "scale = (hi - lo) / 15 (clamp to 0..15, not 0..14).")
        sym = (grouped.abs().amax(-1) / 7.5, grouped.abs().amax(-1) / 7, grouped.abs().amax(-1) / 8)
        expect(not (bool((zero == 8).all()) or any(torch.allclose(scale, s, rtol=1e-4) for s in sym)),
               "this is SYMMETRIC quantization (zero point fixed at 8, scale from max|w|): on a group of one sign "
               "it wastes half of the 16 levels. Asymmetric: lo = min(group min, 0), hi = max(group max, 0), "
               "scale = (hi - lo) / 15, zero = round(-lo / scale).")
        expect(torch.allclose(scale, step, rtol=1e-5, atol=0),
               f"scale differs from (hi - lo) / 15 per group (largest ratio {(scale / step).max().item():.4g}). "
               "Hint: lo = min(group min, 0), hi = max(group max, 0), one value per group of G input channels.")
        expect(bool(((zero - (-lo / scale)).abs() <= 0.5 + 1e-6).all()) and int(zero.min()) >= 0 and int(zero.max()) <= 15,
               "zero must be round(-lo / scale), an integer in 0..15 (the code that stands for 0.0).")
        low_first = torch.stack([packed & 15, packed >> 4], -1).flatten(1).long().reshape(out, -1, G)
        high_first = torch.stack([packed >> 4, packed & 15], -1).flatten(1).long().reshape(out, -1, G)
        v = grouped / scale[..., None] + zero[..., None]
        want = v.round().clamp(0, 15)
        tie = ((v - v.floor()) - 0.5).abs() < 1e-4                 # either neighbour of a half is right
        ok = lambda codes: bool(((codes == want) | (tie & ((codes - v).abs() <= 0.5 + 1e-4))).all())  # noqa: E731
        if not ok(low_first):
            expect(not ok(high_first), "nibble order: element 2k must go in the LOW nibble (bits 0-3) and "
                   "element 2k+1 in the HIGH nibble (bits 4-7): byte = code[2k] | code[2k+1] << 4.")
            top = int(low_first.max())   # what the answer stored, not a guess at why
            expect(not (top < 15 and bool((want == 15).any())),
                   f"the largest code stored is {top}, but each group's largest weight must get code 15: clamp the "
                   f"codes to 0..15 (2^4 = 16 levels){', not 0..14' if top == 14 else ''}.")
            bad = ~((low_first == want) | tie)
            expect(False, f"G={G}: {int(bad.sum())} codes differ from clamp(round(w / scale) + zero, 0, 15) of "
                   "their group (unpacked low nibble first). Hint: round to nearest, ADD the zero point, clamp to 0..15.")
        w_hat = (low_first - zero[..., None]) * scale[..., None]
        worst = ((w_hat - grouped).abs() / (scale[..., None] / 2)).max().item()
        expect(worst <= 1 + 1e-4, f"G={G}: a weight is {worst:.3g} half-steps from its dequantized value "
               "(code - zero) * scale; at most 1 is allowed.")
    passed("int4_group_quantize")
