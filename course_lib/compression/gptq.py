"""GPTQ: post-training weight quantization that corrects each rounding error as it goes.

Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", ICLR 2023 (arXiv:2210.17323), Algorithm 1.

Round-to-nearest (RTN) rounds every weight on its own. But a layer computes W X, so what matters is
the output error ||W X - W_hat X||^2, and its inputs are correlated (neighbouring pixels, features):
the error of one rounded weight can be partly cancelled by nudging the not-yet-rounded weights of
inputs correlated with it. GPTQ rounds one input column at a time, every output row at once:

    for column j = 0, 1, ..., in - 1:
        q_j = round(w_j)                                       # on the row's fixed int grid, as RTN
        w_{j+1:} -= (w_j - q_j) / Hinv_jj * Hinv_{j, j+1:}     # OBS: the best correction of the rest
        Hinv <- Hinv with column j eliminated

with H = 2 X X^T / n, the Hessian of the output error in W (X: the layer's n calibration inputs, one
column each). The rows that the loop needs are the rows of the upper Cholesky factor of H^-1, so one
Cholesky replaces the eliminations, and "lazy batches" update the later columns once per block of
`block_size` columns instead of once per column (the same numbers, fewer passes over memory). A
convolution is a matmul on unfolded patches (im2col), so a Conv2d is quantized like a Linear.

The grid is `quantization`'s per-channel one (one scale per output row, set by RTN's min/max), fixed
before the loop: GPTQ changes which grid point each weight gets, not the grid.

    H = hessian(layer_inputs(layer, x))                             # x: layer inputs -> [in, in]
    codes, scale, zero_point = quantize(layer.weight, H, bits=4)     # codes: ints, shaped like the weight
    qmodel, codes = quantize_model(model, calibration_batches, bits=4)               # GPTQ, layer by layer
    rtn_model, _ = quantize_model(model, bits=4, method="rtn")                         # the baseline
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from ..env import torch_threads
from ..validate import boolean, float_tensor, int_in_range, number_in_range, one_of, positive_int
from . import quantization as Q

METHODS = ("gptq", "rtn")
BITS = (2, 8)          # the weight widths allowed: GPTQ is for low-bit weights, codes stored as int8


def _check_grid(bits, symmetric) -> None:
    int_in_range("bits", bits, *BITS)
    boolean("symmetric", symmetric)


def _matrix(weight: torch.Tensor) -> torch.Tensor:
    """A Linear's [out, in] or a Conv2d's [out, C, kh, kw] weight as float32 [out, in] (in = C*kh*kw)."""
    float_tensor("weight", weight)
    if weight.dim() not in (2, 4):
        raise ValueError(f"weight must be 2-D [out, in] (Linear) or 4-D [out, C, kh, kw] (Conv2d); "
                         f"got shape {tuple(weight.shape)}")
    return weight.detach().float().flatten(1)


def grid(weight: torch.Tensor, bits: int = 4, symmetric: bool = True):
    """(scale [out] float32, zero_point [out] int64): one signed `bits`-bit grid per output row, from the
    row's min/max (`quantization.observe_range` + `choose_qparams`, the same grid as RTN)."""
    _check_grid(bits, symmetric)
    lo, hi = Q.observe_range(_matrix(weight), "minmax", axis=0)
    return Q.choose_qparams(lo, hi, bits, symmetric=symmetric, signed=True)


def rtn(weight: torch.Tensor, bits: int = 4, symmetric: bool = True):
    """Round to nearest on `grid`: (codes int8 shaped like weight, scale [out], zero_point [out])."""
    scale, zero_point = grid(weight, bits, symmetric)
    codes = Q.quantize(_matrix(weight), scale, zero_point, bits, axis=0)
    return codes.to(torch.int8).reshape(weight.shape), scale, zero_point


def layer_inputs(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What `layer` multiplies its weight with, one row per output position: [n, in].

    Linear: x [..., in] -> [n, in]. Conv2d: x [N, C, H, W] -> patches [N * L, C * kh * kw] (im2col with
    F.unfold; L output positions), in the order of weight.flatten(1), so conv(x) = W.flatten(1) @ patches^T.
    """
    if isinstance(layer, nn.Linear):
        return x.detach().reshape(-1, layer.in_features)
    if isinstance(layer, nn.Conv2d):
        if layer.groups != 1 or layer.padding_mode != "zeros" or isinstance(layer.padding, str):
            raise ValueError(f"Conv2d needs groups=1, padding_mode='zeros' and numeric padding here; got "
                             f"groups={layer.groups}, padding_mode={layer.padding_mode!r}, padding={layer.padding!r}")
        patches = F.unfold(x.detach(), layer.kernel_size, layer.dilation, layer.padding, layer.stride)
        return patches.transpose(1, 2).reshape(-1, patches.shape[1])
    raise ValueError(f"layer must be an nn.Linear or nn.Conv2d; got {type(layer).__name__}")


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2 X^T X / n in float64 for inputs x [n, in]: [in, in], the Hessian of ||(W - W_hat) X^T||^2 / n."""
    float_tensor("x", x)
    if x.dim() != 2 or x.shape[0] == 0:
        raise ValueError(f"x must be 2-D [n, in] with n >= 1 (see layer_inputs); got shape {tuple(x.shape)}")
    x = x.double()
    return 2 * x.T @ x / x.shape[0]


def inverse_cholesky(H: torch.Tensor, damp: float = 0.01) -> torch.Tensor:
    """U, upper triangular with U^T U = (H + damp * mean(diag H) * I)^-1: row j of U is row j of H^-1 with
    columns 0..j-1 eliminated, divided by the square root of its diagonal. An input that was always 0 in
    calibration (diag 0) gets diag 1: nothing correlates with it, so its weights are plainly rounded (the
    paper's code sets them to 0 instead)."""
    number_in_range("damp", damp, 0, 1)
    H = H.detach().double().clone()
    dead = H.diagonal() == 0
    H[dead, dead] = 1
    H.diagonal().add_(damp * H.diagonal().mean())
    L, info = torch.linalg.cholesky_ex(H)
    if info:
        raise ValueError(f"the hessian is not positive definite with damp={damp}: raise damp (1% is GPTQ's) "
                         "or calibrate on more inputs")
    Hinv = torch.cholesky_solve(torch.eye(len(H), dtype=H.dtype, device=H.device), L)       # H^-1 from L
    return torch.linalg.cholesky(Hinv, upper=True)


@torch.no_grad()
def quantize(weight: torch.Tensor, H: torch.Tensor, bits: int = 4, symmetric: bool = True, damp: float = 0.01,
             block_size: int = 128):
    """GPTQ's Algorithm 1: (codes int8 shaped like weight, scale [out], zero_point [out]).

    weight: [out, in] or [out, C, kh, kw]; H: [in, in] (`hessian`); the dequantized weight is
    (codes - zero_point) * scale per row. With H = I no error is passed on and GPTQ is exactly RTN.
    """
    W = _matrix(weight).clone()                                   # [out, in], updated in place
    float_tensor("H", H)
    if H.shape != (W.shape[1], W.shape[1]):
        raise ValueError(f"H must be [in, in] = {(W.shape[1],) * 2} for this weight; got {tuple(H.shape)}")
    positive_int("block_size", block_size)
    scale, zero_point = grid(W, bits, symmetric)
    U = inverse_cholesky(H, damp).to(W)                           # [in, in]
    codes = torch.empty_like(W, dtype=torch.int8)
    with torch_threads(1):      # small ops, one column at a time: a second thread only waits (10x on a busy CPU)
        for b0 in range(0, W.shape[1], block_size):
            b1 = min(b0 + block_size, W.shape[1])
            block, errors = W[:, b0:b1], W.new_empty(W.shape[0], b1 - b0)     # block: a view of W
            for j in range(b1 - b0):
                q = Q.quantize(block[:, j], scale, zero_point, bits, axis=0)              # round to nearest
                err = (block[:, j] - Q.dequantize(q, scale, zero_point, bits, axis=0)) / U[b0 + j, b0 + j]
                block[:, j:] -= err[:, None] * U[b0 + j, b0 + j:b1]                     # correct this block now
                codes[:, b0 + j], errors[:, j] = q, err
            W[:, b1:] -= errors @ U[b0:b1, b1:]                                         # the rest: once per block
    return codes.reshape(weight.shape), scale, zero_point


def _run(model: nn.Module, batches) -> None:
    """Feed `batches` (tensors, or (x, y) pairs as from a loader) through `model`, without gradients."""
    device = next(model.parameters()).device
    with torch.no_grad():
        for batch in batches:
            model((batch[0] if isinstance(batch, (tuple, list)) else batch).to(device))


def _forward_order(model: nn.Module, layers: list, batches) -> list:
    """`layers` ((name, module) pairs) in the order a forward pass first calls them; layers it never
    calls go last (their calibration then fails and says why)."""
    called = []
    handles = [m.register_forward_hook(lambda m, *_: None if m in called else called.append(m)) for _, m in layers]
    try:
        _run(model, batches)
    finally:
        for handle in handles:
            handle.remove()
    return sorted(layers, key=lambda item: called.index(item[1]) if item[1] in called else len(called))


def _calibrate_hessian(model: nn.Module, layer: nn.Module, batches) -> torch.Tensor:
    """`hessian` of all the inputs `layer` sees while `batches` run through `model` (a forward hook
    sums 2 x^T x batch by batch, so the inputs are never all held at once)."""
    H, n = 0, 0

    def hook(_, args, __):
        nonlocal H, n
        x = layer_inputs(layer, args[0]).double()
        H, n = H + 2 * x.T @ x, n + x.shape[0]

    handle = layer.register_forward_hook(hook)
    try:
        _run(model, batches)
    finally:
        handle.remove()
    if n == 0:
        raise ValueError("batches must hold at least one batch (of inputs that reach every layer)")
    return H / n


def quantize_model(model: nn.Module, batches=None, bits: int = 4, symmetric: bool = True, method: str = "gptq",
                   damp: float = 0.01, block_size: int = 128):
    """A copy of `model` with every nn.Linear/nn.Conv2d weight fake-quantized (on the int grid x scale,
    float32), and {layer name: (codes int8, scale [out], zero_point [out])}.

    method="gptq": layers in the order the forward pass calls them, each calibrated on the inputs it gets from the copy whose
    earlier layers are already quantized (as the paper does), so it corrects their errors too.
    batches: a few hundred training images (tensors, or (x, y) pairs as from a loader); iterated once
    per layer, so a list, not a one-shot iterator. method="rtn": round to nearest, batches unused.
    """
    one_of("method", method, METHODS)
    _check_grid(bits, symmetric)
    if method == "gptq":
        if batches is None:
            raise ValueError("batches must be given for method='gptq': the calibration inputs")
        batches = list(batches)
    model = copy.deepcopy(model).eval()
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not layers:
        raise ValueError(f"model ({type(model).__name__}) has no nn.Linear or nn.Conv2d layer to quantize")
    if method == "gptq":
        layers = _forward_order(model, layers, batches[:1])
    codes = {}
    for name, layer in layers:
        if method == "gptq":
            H = _calibrate_hessian(model, layer, batches)
            codes[name] = quantize(layer.weight, H, bits, symmetric, damp, block_size)
        else:
            codes[name] = rtn(layer.weight, bits, symmetric)
        c, scale, zero_point = codes[name]
        w_hat = Q.dequantize(c.flatten(1), scale, zero_point, bits, axis=0).reshape(c.shape)
        layer.weight.data.copy_(w_hat.to(layer.weight.dtype))
    return model, codes
