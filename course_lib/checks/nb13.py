"""Checks for solutions/13_quantization_exercises.ipynb: linear quantization, fake-quant with a
straight-through estimator, k-means weight sharing, the group-wise int4 quantizer with packing.

Compared against PyTorch's own torch.fake_quantize_per_tensor_affine (values and gradient), its
MinMaxObserver where this torch still has one, the properties Lloyd's algorithm guarantees, and for
int4 the behaviour the format fixes (shapes, nibble order, the grid, |w - w_hat| <= scale / 2). Edges tried:
all-zero and tiny tensors and groups (scale 0, eps), exact halves of a power-of-two grid, integer dtypes that
cannot hold the range, any shape the text allows; the answers must not call PyTorch's quantization functions
or the course's own versions.
"""
from __future__ import annotations

import warnings

import torch

from . import expect, expect_close, library_call, passed, torch_quantized

RANGES = [(-128, 127), (0, 255), (-8, 7), (0, 15)]
QTYPES = {(-128, 127): torch.qint8, (0, 255): torch.quint8}
EPS = torch.finfo(torch.float32).eps          # MinMaxObserver's smallest scale
# PyTorch's own quantization and the course's versions: each does a whole exercise in one call
QUANT_LIBRARY = ("quantize_per_tensor", "quantize_per_channel", "fake_quantize_per_tensor_affine",
                 "fake_quantize_per_channel_affine", "fake_quantize_per_tensor_affine_cachemask", "int_repr",
                 "MinMaxObserver", "calculate_qparams", "choose_qparams", "_choose_qparams_per_tensor",
                 "FakeQuantize", "_FakeQuantSTE", "observe_range", "weight_qparams", "quantize_affine",
                 "choose_qparams_affine", "group_qparams", "Int4WeightOnlyLinear", "KMeans", "kmeans2",
                 "torch_quantized")


def _no_library(fn, what: str, methods=()) -> None:
    used = library_call(fn, QUANT_LIBRARY, methods=("quantize", "dequantize", "fake_quantize") + tuple(methods))
    expect(not used, f"{what} uses {used}: that is a library doing the whole exercise. Write it with tensor "
           "operations (round, clamp, ...); the check compares with PyTorch's own.")


def _unchanged(given, original, what: str) -> None:
    expect(torch.equal(given, original), f"{what} changed the tensor it was given (an in-place op such as div_, "
           "round_, clamp_ or sub_ on it): compute on new tensors.")


def _grid_cases(scale: float, seed: int = 0) -> torch.Tensor:
    """Random values, values far out of range, and for a power-of-two scale the exact halves of the
    grid (how ties round). Other scales get no ties: there x / scale and PyTorch's x * (1 / scale)
    can differ in the last bit, and so round a near-tie differently."""
    g = torch.Generator().manual_seed(seed)
    halves = (torch.arange(-40, 40, dtype=torch.float32) + 0.5) * scale
    cases = [torch.randn(200, generator=g) * 40 * scale, torch.tensor([1e4, -1e4]) * scale]
    return torch.cat(cases + ([halves] if scale == 2.0 ** round(torch.tensor(scale).log2().item()) else []))


def _quantize_mistake(x, q, scale, zero_point, qmin, qmax) -> str:
    """Which plausible rule the wrong integers follow, read off the values that differ."""
    v = x.double() / scale
    rules = {"floor(x / scale)": v.floor(), "ceil(x / scale)": v.ceil(), "trunc(x / scale)": v.trunc(),
             "floor(x / scale + 0.5), which rounds halves UP": (v + 0.5).floor()}
    for name, r in rules.items():
        if torch.equal(q, (r + zero_point).clamp(qmin, qmax).long()):
            return (f"these are {name} + zero_point: round to the nearest integer with torch.round (halves to the "
                    "even neighbour, as PyTorch's kernels do).")
    if torch.equal(q, (v.round() - zero_point).clamp(qmin, qmax).long()):
        return "these are round(x / scale) - zero_point: ADD the zero point."
    if torch.equal(q, ((x.double() - zero_point) / scale).round().clamp(qmin, qmax).long()):
        return "these are round((x - zero_point) / scale): the zero point is an integer, added after rounding."
    return "q = clamp(round(x / scale) + zero_point, qmin, qmax)."


def _dequantize_mistake(q, got, scale, zero_point) -> str:
    qd = q.double()
    rules = {"q * scale - zero_point: subtract the zero point BEFORE scaling": qd * scale - zero_point,
             "(q + zero_point) * scale: SUBTRACT the zero point": (qd + zero_point) * scale,
             "q / scale - zero_point: MULTIPLY by the scale": qd / scale - zero_point,
             "q * scale: subtract the zero point first": qd * scale}
    for name, r in rules.items():
        if torch.allclose(got.double(), r, rtol=1e-6, atol=1e-6):
            return f"these are {name}."
    return "x_hat = (q - zero_point) * scale, as a float tensor."


def check_linear_quantize(linear_quantize, linear_dequantize) -> None:
    """`linear_quantize(x, scale, zero_point, qmin, qmax)` -> integer tensor and
    `linear_dequantize(q, scale, zero_point)` -> float tensor, equal to PyTorch's, for x of any shape."""
    _no_library(linear_quantize, "linear_quantize")
    _no_library(linear_dequantize, "linear_dequantize")
    g = torch.Generator().manual_seed(5)
    cases = [(_grid_cases(scale, seed=i), scale, (qmin + qmax + 1) // 2 - 3, qmin, qmax)
             for i, (qmin, qmax) in enumerate(RANGES) for scale in (0.5, 0.0173)]
    cases += [(torch.randn(6, 50, generator=g), 0.02, 3, -128, 127),                     # 2-D, 3-D, 0-d,
              (torch.randn(2, 3, 40, generator=g), 2.0**-5, 130, 0, 255),                # a transposed view
              (torch.tensor(0.3), 0.1, 0, -8, 7), (torch.randn(40, 6, generator=g).t(), 0.05, -2, -128, 127)]
    for x, scale, zero_point, qmin, qmax in cases:
        where = (f"x of shape {tuple(x.shape)}{'' if x.is_contiguous() else ' (transposed)'}, qmin={qmin}, "
                 f"qmax={qmax}, scale={scale}, zero_point={zero_point}")
        given = x.clone()
        q = linear_quantize(given, scale, zero_point, qmin, qmax)
        _unchanged(given, x, f"linear_quantize ({where})")
        expect(isinstance(q, torch.Tensor) and q.shape == x.shape,
               f"linear_quantize ({where}) returned shape {tuple(getattr(q, 'shape', ()))}: keep x's shape "
               "(element-wise operations do; do not flatten).")
        expect(not q.is_floating_point() and not q.is_complex() and q.dtype != torch.bool,
               f"linear_quantize returned {q.dtype}: quantized values are integers. Hint: finish with "
               ".to(torch.int32) (or int64).")
        info = torch.iinfo(q.dtype)
        expect(info.min <= qmin and qmax <= info.max, f"linear_quantize ({where}) returned {q.dtype}, which holds "
               f"{info.min}..{info.max} only: it cannot hold qmin..qmax = {qmin}..{qmax}, so codes wrap around. "
               "Use torch.int32 (or int64).")
        ref, fq = torch_quantized(x, scale, zero_point, qmin, qmax)
        q = q.to(torch.int64)
        expect(q.min() >= qmin and q.max() <= qmax,
               f"{where}: got integers from {q.min().item()} to {q.max().item()}. Values outside the range must "
               "saturate at qmin/qmax (clamp after adding the zero point), or they would wrap around.")
        bad = q != ref
        if bad.any():
            halves = bool(torch.all(((x[bad] / scale) % 1 - 0.5).abs() < 1e-4))
            expect(False, f"{where}: {int(bad.sum())} of {x.numel()} integers differ from PyTorch's, e.g. "
                   f"x/scale={(x[bad] / scale).tolist()[:3]}: expected {ref[bad][:3].tolist()}, got "
                   f"{q[bad][:3].tolist()}. Hint: " + ("only the exact halves differ: torch.round rounds halves to "
                   "even, as PyTorch's kernels do; floor(x/scale + 0.5) rounds them up." if halves else
                   _quantize_mistake(x, q, scale, zero_point, qmin, qmax)))
        if hasattr(torch, "quantize_per_tensor") and (qmin, qmax) in QTYPES:   # deprecated in torch 2.14
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = torch.quantize_per_tensor(x, scale, zero_point, QTYPES[qmin, qmax]).int_repr()
            expect(torch.equal(q, theirs.to(torch.int64)), "linear_quantize differs from torch.quantize_per_tensor")
        codes = ref.to(torch.int32)
        x_hat = linear_dequantize(codes, scale, zero_point)
        _unchanged(codes, ref.to(torch.int32), f"linear_dequantize ({where})")
        expect(isinstance(x_hat, torch.Tensor) and x_hat.is_floating_point(),
               f"linear_dequantize must return a float tensor; got {getattr(x_hat, 'dtype', type(x_hat).__name__)}")
        expect(x_hat.shape == x.shape, f"linear_dequantize ({where}) returned shape {tuple(x_hat.shape)}; keep q's "
               "shape.")
        expect_close(x_hat, fq, f"linear_dequantize ({where})", atol=1e-5, rtol=1e-6,
                     hint=f"Hint: {_dequantize_mistake(codes, x_hat.detach(), scale, zero_point)}")
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


def _qparams_cases() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"mixed signs": torch.randn(500, generator=g) * 2 + 0.5,
            "all positive (like ReLU outputs)": torch.rand(500, generator=g) * 3 + 2,
            "all negative": -torch.rand(500, generator=g) * 4 - 1,
            "a [6, 50] weight, rows of different ranges":
                torch.randn(6, 50, generator=g) * torch.arange(1.0, 7.0)[:, None],
            "a [2, 3, 4] tensor": torch.randn(2, 3, 4, generator=g),
            "a 0-d tensor": torch.tensor(-1.7),
            "all zeros (hi = lo = 0)": torch.zeros(4, 8),
            "all equal (3.0)": torch.full((10,), 3.0),
            "tiny values (|x| < 1e-8): the scale clamps to eps": torch.randn(50, generator=g) * 1e-9}


def check_linear_qparams(linear_qparams) -> None:
    """`linear_qparams(x, qmin, qmax) -> (scale: float, zero_point: int)` from x's min and max, the scale at
    least float32's eps, as MinMaxObserver computes them (compared with it where this torch still has one)."""
    _no_library(linear_qparams, "linear_qparams")
    for name, x in _qparams_cases().items():
        for qmin, qmax in RANGES:
            where = f"{name}, range {qmin}..{qmax}"
            lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
            given = x.clone()
            try:
                got = linear_qparams(given, qmin, qmax)
            except ZeroDivisionError:
                raise AssertionError(f"{where}: linear_qparams divided by zero: hi - lo = {hi - lo:g} makes the scale "
                                     "0. Clamp it: scale = max((hi - lo) / (qmax - qmin), eps) with eps = "
                                     "torch.finfo(torch.float32).eps, as MinMaxObserver does.") from None
            _unchanged(given, x, f"linear_qparams ({where})")
            expect(isinstance(got, tuple) and len(got) == 2, "linear_qparams must return (scale, zero_point)")
            scale, zero_point = got
            for value, what in ((scale, "scale"), (zero_point, "zero_point")):
                expect(not isinstance(value, torch.Tensor) or value.numel() == 1,
                       f"{where}: {what} has shape {tuple(getattr(value, 'shape', ()))}: that is one per row "
                       "(per channel). This exercise is PER TENSOR: one scale and zero point from the min and max "
                       "of the whole tensor (x.min(), x.max() without dim).")
            expect(isinstance(scale, float), f"{where}: scale is a {type(scale).__name__}; return a Python float "
                   "(.item() of a one-element tensor, or float(...)).")
            expect(isinstance(zero_point, int) and not isinstance(zero_point, bool),
                   f"{where}: zero_point is {zero_point!r} ({type(zero_point).__name__}); return a Python int: round "
                   "it (round() of a float is an int) and clamp it to qmin..qmax.")
            expect(scale > 0 and scale == scale, f"{where}: scale must be > 0; got {scale}" + (
                   ". Here hi = lo: clamp the scale to at least eps = torch.finfo(torch.float32).eps, as "
                   "MinMaxObserver does." if hi == lo else ""))
            step = (hi - lo) / (qmax - qmin)
            expect(scale >= EPS * (1 - 1e-6) or step >= EPS,
                   f"{where}: scale {scale:.3g} is below eps = {EPS:.3g}; MinMaxObserver clamps the scale: "
                   "scale = max((hi - lo) / (qmax - qmin), eps), eps = torch.finfo(torch.float32).eps.")
            expect(qmin <= zero_point <= qmax, f"{where}: zero_point {zero_point} is outside the integer range. "
                   "Hint: zero_point = qmin - round(lo / scale), clamped to [qmin, qmax]; check its sign.")
            fq = torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin, qmax)
            worst = (fq - x).abs().max().item()
            expect(worst <= scale / 2 * 1.001 + 1e-6,
                   f"{where}: some x is off by {worst:.3g} after quantize/dequantize, more than scale/2 = "
                   f"{scale / 2:.3g}: the grid does not cover [min(x), max(x)]. Hint: use lo = min(x.min(), 0), "
                   "hi = max(x.max(), 0) (0 must be in the range, so that 0.0 is exact), scale = (hi - lo) / "
                   "(qmax - qmin), zero_point = qmin - round(lo / scale).")
            expect(scale <= max(step, EPS) * (1 + 1e-5),
                   f"{where}: scale {scale:.4g} is larger than needed ({max(step, EPS):.4g}): levels are wasted. "
                   "Hint: divide by qmax - qmin" + (" and clamp only to eps." if step < EPS else "."))
            theirs = _torch_minmax_qparams(x, qmin, qmax)
            if theirs is not None:
                expect(abs(scale - theirs[0]) <= 1e-5 * theirs[0] and zero_point == theirs[1],
                       f"{where}: PyTorch's MinMaxObserver gives scale={theirs[0]:.6g}, zero_point={theirs[1]}; got "
                       f"{scale:.6g}, {zero_point}.")
    passed("linear_qparams")


def check_fake_quant_ste(fake_quant_ste) -> None:
    """`fake_quant_ste(x, scale, zero_point, qmin, qmax)`: values and gradient of
    torch.fake_quantize_per_tensor_affine (straight-through inside the range, 0 where clamped); for a power-of-two
    scale also at the exact halves of the grid (ties round to even), and on a 2-D x."""
    _no_library(fake_quant_ste, "fake_quant_ste")
    for qmin, qmax in RANGES:
        for scale in (0.05, 2.0**-4):
            zero_point = (qmin + qmax + 1) // 2
            x = (torch.randn(400, generator=torch.Generator().manual_seed(qmax)) * (qmax - qmin) * scale / 3)
            # just beyond the ends of the grid: x / scale + zero_point is outside [qmin, qmax] but rounds onto it
            # (0.25 / 0.75 of a step: no ties), and just far enough to round off it
            edges = torch.tensor([qmin - 0.25, qmin - 0.75, qmax + 0.25, qmax + 0.75, qmin, qmax]) - zero_point
            halves = torch.arange(qmin - zero_point - 2, qmax - zero_point + 2) + 0.5 if scale == 2.0**-4 else []
            x = torch.cat([x, edges * scale, torch.as_tensor(halves) * scale])
            x = x.reshape(-1, 2) if x.numel() % 2 == 0 else x.reshape(1, -1)          # 2-D: any shape is allowed
            _fake_quant_case(fake_quant_ste, x.requires_grad_(), scale, zero_point, qmin, qmax)
    passed("fake_quant_ste")


def _fake_quant_case(fake_quant_ste, x, scale, zero_point, qmin, qmax) -> None:
    where = f"range {qmin}..{qmax}, scale={scale}, zero_point={zero_point}"
    ours = fake_quant_ste(x, scale, zero_point, qmin, qmax)
    theirs = torch.fake_quantize_per_tensor_affine(x, scale, zero_point, qmin, qmax)
    expect(isinstance(ours, torch.Tensor) and ours.shape == x.shape,
           f"fake_quant_ste ({where}) of an x of shape {tuple(x.shape)} returned shape "
           f"{tuple(getattr(ours, 'shape', ()))}: keep x's shape.")
    v = x.detach() / scale + zero_point
    off = (ours.detach() - theirs.detach()).abs() > 1e-6
    halves = bool(off.any()) and bool(((v[off] - v[off].floor()) == 0.5).all())
    expect_close(ours.detach(), theirs.detach(), f"fake_quant_ste values ({where})", atol=1e-6,
                 hint="Only exact halves of the grid differ: torch.round sends them to the even neighbour, as "
                      "PyTorch does." if halves else
                      "forward: (clamp(round(x / scale) + zero_point, qmin, qmax) - zero_point) * scale.")
    expect(ours.requires_grad, "the output has no gradient: round() must not cut x out of the graph. "
           "Hint: the straight-through estimator, e.g. x + (x_hat - x).detach() times a mask, or an "
           "autograd.Function whose backward passes the gradient through.")
    upstream = torch.linspace(-1, 1, x.numel()).reshape(x.shape)
    (g_ours,) = torch.autograd.grad(ours, x, upstream)
    (g_theirs,) = torch.autograd.grad(theirs, x, upstream)
    # (1 / scale) * scale need not be exactly 1 in float32: a chain through x / scale is still straight-through
    wrong = (g_ours - g_theirs).abs() > 1e-5 * upstream.abs().max()
    wrong_inside = (g_theirs != 0) & wrong
    if wrong_inside.any():
        code = torch.round(v)
        first = f"an x with x / scale + zero_point = {v[wrong_inside][0].item():.2f} got no gradient, but it " \
                f"rounds to {code[wrong_inside][0]:.0f}, inside the range, so PyTorch passes its gradient"
        beyond = (v < qmin) | (v > qmax)
        if bool(beyond[wrong_inside].all()):
            raise AssertionError(f"{where}: {first}. Those x lie beyond the range's ends BEFORE rounding: take the "
                                 "mask from the ROUNDED code, qmin <= round(x / scale) + zero_point <= qmax, not from "
                                 "x against the range's ends.")
        if bool(((code == qmin) | (code == qmax))[wrong_inside].all()):
            raise AssertionError(f"{where}: {first}. Those x round exactly onto qmin or qmax: take the mask from the "
                                 "ROUNDED code, qmin <= round(x / scale) + zero_point <= qmax, not from clamp's own "
                                 "gradient (torch.clamp passes none to a value exactly at a bound, and "
                                 "v + (round(v) - v).detach() is not exactly round(v) in floating point).")
        raise AssertionError(f"{where}: inside the range the gradient must pass straight through (times 1); round() "
                             "itself has zero gradient almost everywhere, which would stop training.")
    expect(not wrong.any(),
           f"{where}: {int(wrong.sum())} values were clamped to qmin/qmax but still got a gradient. PyTorch (and QAT) "
           "block the gradient where clamp saturated: nudging such an x changes nothing in the output.")


def _kmeans_call(kmeans_quantize, w, k, iters):
    given = w.clone()
    got = kmeans_quantize(given, k, iters)
    _unchanged(given, w, "kmeans_quantize")
    expect(isinstance(got, tuple) and len(got) == 2, "kmeans_quantize must return (centroids, indices)")
    centroids, indices = got
    expect(isinstance(centroids, torch.Tensor) and centroids.shape == (k,) and centroids.is_floating_point(),
           f"centroids must be a float tensor of shape ({k},); got {getattr(centroids, 'shape', type(centroids))}"
           f" {getattr(centroids, 'dtype', '')}")
    expect(isinstance(indices, torch.Tensor) and indices.shape == w.shape,
           f"indices must be a tensor of the weight's shape {tuple(w.shape)}; got "
           f"{tuple(getattr(indices, 'shape', ()))}")
    expect(not indices.is_floating_point() and indices.dtype != torch.bool,
           f"indices are {indices.dtype}: they must be an integer tensor (int64 from argmin, or any integer dtype)")
    expect(indices.min() >= 0 and indices.max() < k, f"indices must lie in 0..{k - 1}")
    return centroids.detach().float(), indices.long()


def check_kmeans_quantize(kmeans_quantize) -> None:
    """`kmeans_quantize(weight, k, iters) -> (centroids [k], indices)`: linear init, Lloyd's algorithm; on weights
    of 1 to 4 dims, one whose values are all equal (every centroid starts at the same place), k from 2 to 16."""
    _no_library(kmeans_quantize, "kmeans_quantize", methods=("kmeans_quantize", "linear_init", "assign"))
    g = torch.Generator().manual_seed(0)
    w = torch.cat([torch.randn(1500, generator=g) * 0.05 - 0.1, torch.randn(900, generator=g) * 0.02 + 0.15,
                   torch.tensor([0.4, -0.35] * 50)]).reshape(25, 100)
    # First before convergence, where each update still moves the centroids (so a mistake shows and can be
    # named): the text fixes the result of exactly `iters` updates. The first weight leaves the two middle
    # centroids without weights (they stay where they are).
    early = [torch.tensor([0.0] * 5 + [0.1] * 5 + [1.0] * 5),
             torch.randn(300, generator=torch.Generator().manual_seed(13)) ** 3]
    for weight, k in zip(early, (4, 5)):
        for iters in (1, 2, 3):
            _kmeans_steps(kmeans_quantize, weight, k, iters)
    # iterations enough to converge (then each centroid is its members' mean)
    for w, k, iters in [(w, 4, 200), (w, 16, 200), (torch.randn(6, 1, 5, 5, generator=g) * 0.3, 8, 60),
                        (torch.full((10,), 0.3), 4, 3), (torch.randn(40, generator=g), 2, 30)]:
        _kmeans_case(kmeans_quantize, w, k, iters)
    passed("kmeans_quantize")


def _lloyd(w: torch.Tensor, k: int, iters: int) -> list:
    """The text's algorithm: the centroids after 0, 1, ..., iters updates, and each update's empty clusters."""
    w = w.reshape(-1)
    centroids, steps = torch.linspace(w.min().item(), w.max().item(), k), []
    for _ in range(iters):
        assigned, before = _nearest(w, centroids), centroids.clone()
        empty = [j for j in range(k) if not (assigned == j).any()]
        steps.append((before, empty))
        centroids = torch.stack([w[assigned == j].mean() if j not in empty else before[j] for j in range(k)])
    return steps + [(centroids, [])]


def _nearest(w: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    return (w.reshape(-1, 1) - centroids).abs().argmin(1)


def _kmeans_steps(kmeans_quantize, w, k, iters) -> None:
    """The answer after `iters` updates against the text's, with the mistake named from where it is instead."""
    where = f"k={k}, iters={iters}, weight of shape {tuple(w.shape)}"
    steps = _lloyd(w, k, iters + 1)
    c, i = _kmeans_call(kmeans_quantize, w, k, iters)
    close = lambda a, b: bool(torch.allclose(a, b, atol=1e-5, rtol=1e-5))   # noqa: E731
    want, (before, empty) = steps[iters][0], steps[iters - 1]
    if not close(c, want):
        expect(not close(c, before), f"{where}: your centroids are where {iters - 1} update(s) leave them: one "
               f"update short. The loop runs `iters` times (range(iters)), each an assignment then a move.")
        expect(not close(c, steps[iters + 1][0]), f"{where}: your centroids are where {iters + 1} updates leave "
               "them: one update too many (run exactly `iters`; the last assignment moves nothing).")
        moved = [j for j in empty if not close(c[j:j + 1], before[j:j + 1])]
        expect(not moved, f"{where}: centroid(s) {moved} had no weights in update {iters} and must stay where they "
               f"were ({[round(before[j].item(), 4) for j in moved]}); yours went to "
               f"{[round(c[j].item(), 4) for j in moved]}" + (" (the mean of no weights is NaN)"
                                                             if c[moved].isnan().any() else ""))
        expect(False, f"{where}: centroids {[round(v, 4) for v in c.tolist()]}, expected "
               f"{[round(v, 4) for v in want.tolist()]} (linear initialisation, then {iters} times: assign each "
               "weight to its nearest centroid, move each centroid to the mean of its weights).")
    flat, stale = i.reshape(-1), _nearest(w, before)
    wrong = (w.reshape(-1, 1) - c).abs().gather(1, flat.reshape(-1, 1)).squeeze(1) > \
        (w.reshape(-1, 1) - c).abs().min(1).values + 1e-6
    expect(not wrong.any() or not torch.equal(flat, stale),
           f"{where}: your indices are the assignment made before the last update: {int(wrong.sum())} weights "
           "point at a centroid that is no longer their nearest. Assign once more from the centroids you return.")
    expect(not wrong.any(), f"{where}: {int(wrong.sum())} weights are not mapped to their nearest centroid.")


def _kmeans_case(kmeans_quantize, w, k, iters) -> None:
    where = f"k={k}, weight of shape {tuple(w.shape)}"
    c0, i0 = _kmeans_call(kmeans_quantize, w, k, 0)
    expect_close(c0, torch.linspace(w.min().item(), w.max().item(), k), f"{where}: centroids with iters=0",
                 atol=1e-6, hint="linear initialisation as in Deep Compression: k values evenly spaced from "
                 "w.min() to w.max() (torch.linspace), not random and not quantiles.")
    torch.manual_seed(1)
    c1, i1 = _kmeans_call(kmeans_quantize, w, k, iters)
    torch.manual_seed(2)
    c2, i2 = _kmeans_call(kmeans_quantize, w, k, iters)
    expect(torch.equal(c1, c2) and torch.equal(i1, i2), f"{where}: two calls gave different results: the "
           "result must not depend on the random seed. Hint: the linear initialisation is deterministic.")
    shared = c1[i1]
    expect(shared.unique().numel() <= k, f"{where}: the shared weights take more than k distinct values")
    dist = (w.reshape(-1, 1) - c1).abs()
    mine = dist.gather(1, i1.reshape(-1, 1)).squeeze(1)
    expect(bool((mine <= dist.min(1).values + 1e-6).all()),
           f"{where}: {int((mine > dist.min(1).values + 1e-6).sum())} weights are not mapped to their nearest "
           "centroid. Hint: indices = (w[..., None] - centroids).abs().argmin(-1), computed from the final "
           "centroids (after the last update).")
    for j in range(k):
        members = w[i1 == j]
        if len(members):
            expect(abs(c1[j].item() - members.double().mean().item()) < 1e-5,
                   f"{where}: centroid {j} is {c1[j].item():.5f} but the mean of its {len(members)} weights is "
                   f"{members.double().mean().item():.5f}. Hint: each iteration moves every centroid to the "
                   "mean of the weights assigned to it (keep it where it is if none are).")
    start = c0[i0]
    err, bound = (shared - w).pow(2).mean().item(), (start - w).pow(2).mean().item()
    expect(err <= bound + 1e-9, f"{where}: mean squared error {err:.3g} is worse than the linear start's "
           f"{bound:.3g}: Lloyd's iterations can only lower it.")


def _int4_weight(out: int, cols: int, seed: int) -> torch.Tensor:
    """Not centred on 0 (asymmetric matters), an outlier, a group of one sign; no all-zero group."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, cols, generator=g) * 0.05 + 0.03
    w[1, 3] = 0.7
    w[2, :8] = torch.rand(8, generator=g) + 0.2
    return w


def _int4_edges() -> torch.Tensor:
    """Groups of 8 at the edges: all zeros (hi = lo = 0), all equal, tiny values, one non-zero, exact halves."""
    w = _int4_weight(5, 32, 3)
    w[0, :8] = 0.0                                         # all zero: any positive scale, codes = zero point
    w[1, 8:16] = 0.25                                      # all equal (and positive): lo = 0, hi = 0.25
    w[2, :8] = torch.linspace(-3e-30, 1e-30, 8)            # tiny: scale ~ 3e-31, a normal float32 still
    w[3, 16:24] = 0.0
    w[3, 20] = -1.5                                        # one non-zero: zero = 15
    w[4, 24:32] = torch.tensor([0.0, 1.5, 3.0, -1.5, 0.5, 2.5, -0.5, 1.0])   # steps of 0.3: exact halves
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
        expect(shape == (out, groups) or shape not in ((out,), (out, 1)),
               f"{what} has shape {shape}: one per row (per channel). Group-wise "
               f"means one per group of {G} consecutive input channels: shape {(out, groups)}.")
        expect(shape == (out, groups), f"{what} has shape {shape}; expected {(out, groups)}: groups of {G} "
               "consecutive INPUT channels, along the last dim of the [out, in] weight (not along the output "
               "dim: a matmul sums over the input dim, and a group's scale must apply to one row's slice).")
    expect(scale.is_floating_point(), f"scale must be a float tensor; got {scale.dtype}")
    expect(not zero.is_floating_point() and not zero.is_complex() and zero.dtype != torch.bool,
           f"zero is {zero.dtype}: it must be an integer tensor (round, then e.g. .to(torch.uint8)).")
    return packed, scale.double(), zero.long()


INT4_LIBRARY = ("pack", "unpack", "int4_weight_only", "Int4WeightOnlyConfig")


def check_int4_group_quantize(int4_group_quantize) -> None:
    """`int4_group_quantize(w, group_size) -> (packed uint8 [out, in // 2], scale [out, in // G],
    zero [out, in // G] integer)`: asymmetric int4 per group of input channels, low nibble first. An all-zero group
    may have any positive scale (its codes must equal its zero point); at an exact half either code is right."""
    _no_library(int4_group_quantize, "int4_group_quantize", methods=INT4_LIBRARY)
    cases = [(_int4_weight(64, 256, 0), 32), (_int4_weight(6, 48, 1), 8), (_int4_weight(10, 256, 2), 128),
             (_int4_edges(), 8)]
    for w, G in cases:
        out, cols = w.shape
        given = w.clone()
        got = int4_group_quantize(given, G)
        _unchanged(given, w, "int4_group_quantize")
        packed, scale, zero = _int4_shapes(got, out, cols, G)
        _expect_int4(w, G, packed, scale, zero)
    passed("int4_group_quantize")


def _expect_int4(w, G, packed, scale, zero) -> None:
    out, cols = w.shape
    where = f"G={G}, w of shape {(out, cols)}"
    grouped = w.double().reshape(out, -1, G)
    lo, hi = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
    step = (hi - lo) / 15
    live = step > 0                                            # not an all-zero group
    expect(bool(((scale > 0) & torch.isfinite(scale)).all()),
           f"{where}: scale holds {scale[~((scale > 0) & torch.isfinite(scale))][:3].tolist()}: every scale must be "
           "positive and finite. An all-zero group has hi - lo = 0: give it any positive scale (e.g. 1), so "
           "that its zero point and codes stay integers.")
    ratio = (scale[live] / step[live]).median().item() if live.any() else 1.0
    expect(abs(ratio - 15 / 16) > 1e-3, "scale = (hi - lo) / 16: 16 levels 0..15 are 15 steps, so "
           "scale = (hi - lo) / 15 (range 0..15, not 0..16).")
    expect(abs(ratio - 15 / 14) > 1e-3, "scale = (hi - lo) / 14: the codes run 0..15, 15 steps: "
           "scale = (hi - lo) / 15 (clamp to 0..15, not 0..14).")
    amax = grouped.abs().amax(-1)
    sym = (amax / 7.5, amax / 7, amax / 8)
    right = torch.allclose(scale[live], step[live], rtol=1e-5, atol=0)
    expect(right or not (bool((zero[live] == 8).all()) or
                         any(torch.allclose(scale[live], s[live], rtol=1e-4, atol=0) for s in sym)),
           "this is SYMMETRIC quantization (zero point fixed at 8, scale from max|w|): on a group of one sign "
           "it wastes half of the 16 levels. Asymmetric: lo = min(group min, 0), hi = max(group max, 0), "
           "scale = (hi - lo) / 15, zero = round(-lo / scale).")
    off = live & ((scale - step).abs() > 1e-5 * step)
    if off.any():
        floor = scale[off].min().item()
        raise AssertionError(f"{where}: scale differs from (hi - lo) / 15 per group, e.g. {scale[off][0].item():.4g} "
                             f"where (hi - lo) / 15 = {step[off][0].item():.4g}" + (
                                 f": every such scale is {floor:.3g}, a minimum you clamp to; only an all-zero "
                                 "group needs a stand-in scale" if bool((scale[off] == floor).all()) and
                                 bool((step[off] < floor).all()) else
                                 ". Hint: lo = min(group min, 0), hi = max(group max, 0), one value per group of G "
                                 "input channels") + ".")
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
        expect(False, f"{where}: {int(bad.sum())} codes differ from clamp(round(w / scale) + zero, 0, 15) of "
               "their group (unpacked low nibble first). Hint: round to nearest, ADD the zero point, clamp to 0..15.")
    w_hat = (low_first - zero[..., None]) * scale[..., None]
    worst = ((w_hat - grouped).abs() / (scale[..., None] / 2)).max().item()
    expect(worst <= 1 + 1e-4, f"{where}: a weight is {worst:.3g} half-steps from its dequantized value "
           "(code - zero) * scale; at most 1 is allowed.")
