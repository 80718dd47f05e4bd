"""Linear quantization from scratch: scale and zero-point, observers, fake-quant with a
straight-through estimator, post-training quantization (PTQ) and quantization-aware training (QAT).

    q = clamp(round(x / scale) + zero_point, qmin, qmax),     x_hat = (q - zero_point) * scale

`qrange`, `quantize`, `dequantize` and `choose_qparams` are lecture 02's (`course_lib.numerics`,
re-exported here): any width from 1 to 16 bits, one scale per tensor or per channel (a Linear row,
a Conv2d filter), the same integers as PyTorch's torch.quantize_per_tensor / quantize_per_channel /
fake_quantize_per_*_affine. This module adds what training needs: observers, fake-quant, PTQ, QAT.

    lo, hi = observe_range(w, "minmax", axis=0)                        # per-channel range
    scale, zp = choose_qparams(lo, hi, bits=4, symmetric=True)
    w_hat = fake_quantize(w, scale, zp, bits=4, axis=0)                 # gradient: straight-through
    model = ptq(trained, calibration_batches, bits=4, act_bits=4)       # calibrated fake-quant copy
    fit(model, train_loader, epochs=1)                                  # QAT: just keep training it
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..numerics import broadcast_qparams, channel_axis, choose_qparams, dequantize, qrange, quantize  # noqa: F401
from ..validate import boolean, number_in_range, one_of

OBSERVERS = ("minmax", "percentile", "mse")
MSE_GRID = 100   # clipping ratios 0.01, 0.02, ..., 1 tried by the "mse" observer


class _FakeQuantSTE(torch.autograd.Function):
    """Quantize-dequantize forward; backward passes the gradient straight through round(), and
    blocks it where clamp saturated (exactly the gradient of torch.fake_quantize_*_affine)."""

    @staticmethod
    def forward(ctx, x, s, z, qmin, qmax):
        q = torch.round(x * (1.0 / s)) + z
        ctx.save_for_backward((q >= qmin) & (q <= qmax))
        return (q.clamp(qmin, qmax) - z) * s

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None, None, None


def fake_quantize(x: torch.Tensor, scale, zero_point, bits: int = 8, signed: bool = True, axis=None) -> torch.Tensor:
    """dequantize(quantize(x)) in x's dtype, differentiable with the straight-through estimator.

    round() has zero gradient almost everywhere, so training through it would stall; STE
    pretends it is the identity, so the float weights keep learning while the forward pass
    sees only quantized values.
    """
    s, z, qmin, qmax = broadcast_qparams(x, scale, zero_point, bits, signed, axis)
    return _FakeQuantSTE.apply(x.float(), s, z, qmin, qmax).to(x.dtype)


def _check_observer(method, percentile, name: str = "method") -> None:
    one_of(name, method, OBSERVERS)
    number_in_range("percentile", percentile, 50, 100, lo_open=True)


def observe_range(x: torch.Tensor, method: str = "minmax", axis=None, bits: int = 8, symmetric: bool = False,
                  signed: bool = True, percentile: float = 99.99) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi): scalars, or [C] with `axis`, the range an observer would quantize x to.

    "minmax": the extremes (no clipping; one outlier stretches the grid for everyone).
    "percentile": the `percentile`-th and (100 - percentile)-th percentiles: outliers are clipped.
    "mse": the min/max range clipped at +-r * max|x|, with the r (of MSE_GRID tried) that minimises
           the quantization MSE at `bits`: trades clipping error against rounding error.
    """
    _check_observer(method, percentile)
    x = x.detach().float()
    rows = x.reshape(1, -1) if axis is None else x.movedim(channel_axis(axis, x), 0).reshape(x.shape[axis], -1)
    if method == "percentile":
        n = rows.shape[1]
        k = max(1, min(n, round(percentile / 100 * n)))
        lo, hi = -(-rows).kthvalue(k, dim=1).values, rows.kthvalue(k, dim=1).values
    else:
        lo, hi = rows.amin(1), rows.amax(1)
    if method == "mse":
        ratios = torch.linspace(1 / MSE_GRID, 1, MSE_GRID, device=x.device)
        top = torch.maximum(-lo, hi)
        clip = lambda r: (torch.maximum(lo, -r * top), torch.minimum(hi, r * top))  # noqa: E731
        errors = []
        for r in ratios:
            s, z = choose_qparams(*clip(r), bits, symmetric, signed)
            errors.append((fake_quantize(rows, s, z, bits, signed, axis=0) - rows).pow(2).mean(1))
        lo, hi = clip(ratios[torch.stack(errors).argmin(0)])
    return (lo[0], hi[0]) if axis is None else (lo, hi)


def weight_qparams(w: torch.Tensor, bits: int = 8, per_channel: bool = True, observer: str = "minmax",
                   percentile: float = 99.99):
    """(scale, zero_point) for a weight: symmetric, signed, one scale per output channel (dim 0) or
    per tensor. Symmetric because weights are centred on 0; per channel because rows differ in
    size, and one scale set by the largest row wastes levels on all the others."""
    lo, hi = observe_range(w, observer, 0 if per_channel else None, bits, True, True, percentile)
    return choose_qparams(lo, hi, bits, symmetric=True, signed=True)


def quantize_weight(w: torch.Tensor, bits: int = 8, per_channel: bool = True, observer: str = "minmax",
                    percentile: float = 99.99) -> torch.Tensor:
    """Fake-quant of a weight with `weight_qparams` (gradient: straight-through)."""
    scale, zero_point = weight_qparams(w, bits, per_channel, observer, percentile)
    return fake_quantize(w, scale, zero_point, bits, signed=True, axis=0 if per_channel else None)


class Observer(nn.Module):
    """Running range (lo, hi) of the activations that pass a point: asymmetric, unsigned, per tensor.

    Calibration (`update(x)`): minmax keeps the extremes over all batches, percentile/mse average
    the per-batch estimates. QAT (`update(x, ema=True)`): an exponential moving average, so the
    range follows the activations as the weights change.
    """

    def __init__(self, method: str = "minmax", bits: int = 8, percentile: float = 99.99, momentum: float = 0.01):
        super().__init__()
        _check_observer(method, percentile)
        qrange(bits, signed=False)
        number_in_range("momentum", momentum, 0, 1, lo_open=True)
        self.method, self.bits, self.percentile, self.momentum = method, bits, percentile, momentum
        self.register_buffer("lo", torch.zeros(()))
        self.register_buffer("hi", torch.zeros(()))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    @torch.no_grad()
    def update(self, x: torch.Tensor, ema: bool = False) -> None:
        lo, hi = observe_range(x, self.method, None, self.bits, False, False, self.percentile)
        if self.count == 0:
            self.lo.copy_(lo), self.hi.copy_(hi)
        elif ema:
            self.lo.lerp_(lo, self.momentum), self.hi.lerp_(hi, self.momentum)
        elif self.method == "minmax":
            self.lo.clamp_(max=lo), self.hi.clamp_(min=hi)
        else:
            self.lo.lerp_(lo, 1 / (self.count.item() + 1)), self.hi.lerp_(hi, 1 / (self.count.item() + 1))
        self.count += 1

    def qparams(self):
        if self.count == 0:
            raise RuntimeError("this observer has seen no data: calibrate the model first (calibrate/ptq)")
        return choose_qparams(self.lo, self.hi, self.bits, symmetric=False, signed=False)

    def extra_repr(self) -> str:
        return f"{self.method}, bits={self.bits}, lo={self.lo.item():.4g}, hi={self.hi.item():.4g}"


@dataclass(frozen=True)
class QuantConfig:
    """bits: weights (symmetric, signed); act_bits: layer inputs (asymmetric, unsigned; None = float)."""

    bits: int = 8
    act_bits: int | None = 8
    per_channel: bool = True
    weight_observer: str = "minmax"
    act_observer: str = "minmax"
    percentile: float = 99.99

    def __post_init__(self):
        qrange(self.bits)
        if self.act_bits is not None:
            qrange(self.act_bits)
        boolean("per_channel", self.per_channel)
        _check_observer(self.weight_observer, self.percentile, "weight_observer")
        _check_observer(self.act_observer, self.percentile, "act_observer")


class _QuantLayer:
    """What QuantLinear and QuantConv2d share: fake-quant weights, observed + fake-quant inputs.

    observing=True (calibration): record input ranges, compute in float. Otherwise inputs are
    fake-quantized; in training mode (QAT) the observer keeps following them (EMA).
    """

    def _setup(self, config: QuantConfig) -> None:
        self.config, self.observing = config, True
        self.act = None if config.act_bits is None else Observer(config.act_observer, config.act_bits,
                                                                   config.percentile)

    def extra_repr(self) -> str:
        c = self.config
        return (f"{super().extra_repr()}, bits={c.bits}, act_bits={c.act_bits}, "
                f"{'per-channel' if c.per_channel else 'per-tensor'}, weights: {c.weight_observer}")

    def quantized_weight(self) -> torch.Tensor:
        """Fake-quant weight; its qparams are recomputed only when the weight changed (in-place
        updates bump the tensor's version), so evaluation with an "mse" observer stays cheap."""
        c, key = self.config, (self.weight.data_ptr(), self.weight._version)
        if getattr(self, "_qparams_key", None) != key:
            self._weight_qparams = weight_qparams(self.weight, c.bits, c.per_channel, c.weight_observer, c.percentile)
            self._qparams_key = key
        return fake_quantize(self.weight, *self._weight_qparams, c.bits, signed=True, axis=0 if c.per_channel else None)

    def quantized_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is None:
            return x
        if self.observing or self.training:
            self.act.update(x, ema=self.training and not self.observing)
        if self.observing:
            return x
        scale, zero_point = self.act.qparams()
        return fake_quantize(x, scale, zero_point, self.act.bits, signed=False)


class QuantLinear(_QuantLayer, nn.Linear):
    """nn.Linear computing with fake-quantized weights and inputs (build with `prepare`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.quantized_input(x), self.quantized_weight(), self.bias)


class QuantConv2d(_QuantLayer, nn.Conv2d):
    """nn.Conv2d computing with fake-quantized weights (per output filter) and inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self.quantized_input(x), self.quantized_weight(), self.bias)


_TWINS = {
    nn.Linear: (QuantLinear, lambda m: (m.in_features, m.out_features, m.bias is not None)),
    nn.Conv2d: (QuantConv2d, lambda m: (m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding,
                                        m.dilation, m.groups, m.bias is not None, m.padding_mode)),
}


def quant_layers(model: nn.Module) -> dict:
    """name -> QuantLinear/QuantConv2d of a prepared model."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _QuantLayer)}


def prepare(model: nn.Module, **config) -> nn.Module:
    """A copy of `model` with every nn.Linear/nn.Conv2d swapped for its fake-quant twin (same weights),
    ready for `calibrate`. config: the fields of QuantConfig (bits, act_bits, per_channel, ...)."""
    cfg = QuantConfig(**config)
    model = copy.deepcopy(model)

    def swap(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            if type(child) in _TWINS:
                cls, args = _TWINS[type(child)]
                twin = cls(*args(child)).to(child.weight.device, child.weight.dtype)
                twin.load_state_dict(child.state_dict())
                twin._setup(cfg)
                setattr(parent, name, twin.train(child.training))
            else:
                swap(child)

    swap(model)
    if not quant_layers(model):
        raise ValueError(f"model ({type(model).__name__}) has no nn.Linear or nn.Conv2d layer to quantize")
    return model


@torch.no_grad()
def calibrate(model: nn.Module, batches) -> nn.Module:
    """Run `batches` (tensors, or (x, y) pairs as from a loader) through a prepared model in eval
    mode to record activation ranges; then switch its layers to quantized inputs. Returns it."""
    layers = quant_layers(model)
    if not layers:
        raise ValueError("model has no quantized layers: build it with prepare() first")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    for layer in layers.values():
        layer.observing = True
    seen = 0
    for batch in batches:
        model((batch[0] if isinstance(batch, (tuple, list)) else batch).to(device))
        seen += 1
    if seen == 0:
        raise ValueError("calibration batches must hold at least one batch")
    for layer in layers.values():
        layer.observing = False
    return model.train(was_training)


def ptq(model: nn.Module, calibration_batches, **config) -> nn.Module:
    """Post-training quantization: `prepare` + `calibrate`, in eval mode (the float model is untouched).

    To fine-tune it with QAT, call `fit` on the result: in training mode the fake-quant forward and
    the straight-through backward train the float weights for the quantized grid.
    """
    return calibrate(prepare(model, **config), calibration_batches).eval()
