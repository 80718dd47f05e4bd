"""Mixed precision training: autocast, FP32 master weights, loss scaling, underflow counting.

Low-precision floats halve memory traffic and run on tensor cores, but they round away small
updates (bf16: 1 + 1e-4 == 1) and flush small gradients to zero (fp16 has 5 exponent bits).
The cure is the recipe of Micikevicius et al. (2018), which torch.autocast + GradScaler implement:

- compute in low precision, keep an FP32 master copy of the weights for the update;
- fp16 only: multiply the loss by a scale S so that gradients land inside fp16's range, divide
  the gradients by S before the step, skip the step when they overflowed (inf/nan).

    with autocast("bf16", "cpu"):              # what `fit(..., precision="bf16")` does
        loss = F.cross_entropy(model(x), y)
    python -m course_lib.train --precision bf16 --json   # CPU or GPU; "16": fp16 + GradScaler, CUDA only

Range, epsilon and rounding of the formats themselves live in `course_lib.numerics` (lecture 02).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .env import bf16_supported
from .validate import one_of, positive_int

PRECISIONS = ("32", "bf16", "16")
_DTYPES = {"32": None, "bf16": torch.bfloat16, "16": torch.float16}
_FP32_MAX = torch.finfo(torch.float32).max


def check_precision(precision: str, device, name: str = "precision") -> torch.dtype | None:
    """The autocast dtype of `precision` on `device` (None for "32"); a clear error where it cannot run.

    "16" is refused off CUDA: fp16 pays off on tensor cores and needs GradScaler against underflow;
    a CPU has no fp16 matmul units, so it would only add rounding and slowness. `name` is how the
    error names the setting (the CLI passes "--precision").
    """
    one_of(name, precision, PRECISIONS)
    device = torch.device(device)
    if precision == "16" and device.type != "cuda":
        why = ("a CPU has no fp16 matrix units, so fp16 would be slower than fp32 and only add underflow"
               if device.type == "cpu" else "course_lib runs fp16 + GradScaler on CUDA only")
        raise ValueError(
            f"{name} 16 (fp16 autocast + GradScaler) needs a CUDA GPU; this run is on {device.type}: {why}. "
            f"Use {name} bf16 (bfloat16 autocast: fp32's exponent range, so no loss scaling is needed) "
            f"or {name} 32.")
    if precision == "bf16" and not _bf16_ok(str(device)):
        raise ValueError(f"{name} bf16: this {device.type} device does not support bfloat16 "
                         f"(GPUs before Ampere); use {name} 16 (fp16 + GradScaler) or {name} 32.")
    return _DTYPES[precision]


@functools.lru_cache(maxsize=None)
def _bf16_ok(device: str) -> bool:
    return bf16_supported(device)   # runs a matmul: once per device, not once per training step


def recommended_precision(device) -> str:
    """The mixed-precision recipe for `device`: "bf16" on CPUs and on GPUs with bf16 units (Ampere and
    newer: no loss scaling needed), "16" (fp16 autocast + GradScaler) on older CUDA GPUs (Volta, Turing),
    "32" where neither runs (e.g. a device without bf16)."""
    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if _bf16_ok(str(device)) else "16"
    return "bf16" if _bf16_ok(str(device)) else "32"


def autocast(precision: str, device):
    """Context for the forward pass and loss: torch.autocast in bf16/fp16, nothing for "32".

    Autocast keeps the parameters in fp32 (they are the master weights) and casts per op:
    matmuls and convolutions run in low precision, the ops on the device's fp32 list in fp32 (CPU and CUDA
    lists differ: `autocast_op_names`, `autocast_policies`).
    """
    dtype = check_precision(precision, device)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


# ops a network runs after a matmul, each given h [8, 16] (and labels y [8]); name -> (aten op, call)
AUTOCAST_PROBES = {
    "linear": ("linear", lambda h, y: F.linear(h, h)), "relu": ("relu", lambda h, y: F.relu(h)),
    "softmax": ("softmax.int", lambda h, y: F.softmax(h, -1)),
    "log_softmax": ("log_softmax.int", lambda h, y: F.log_softmax(h, -1)),
    "sum": ("sum", lambda h, y: h.sum()), "exp": ("exp", lambda h, y: h.exp()),
    "layer_norm": ("layer_norm", lambda h, y: F.layer_norm(h, h.shape[-1:])),
    "mse_loss": ("mse_loss", lambda h, y: F.mse_loss(h, h.flip(0))),
    "nll_loss": ("nll_loss", lambda h, y: F.nll_loss(h, y)),
    "cross_entropy": ("cross_entropy_loss", lambda h, y: F.cross_entropy(h, y)),
}
_AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}


def autocast_op_names(device_type: str = "cpu") -> set[str]:
    """The aten ops that have an autocast rule on `device_type` ("mm", "softmax.int", ...), read from torch.

    The rules are C++ lists (aten/src/ATen/autocast_mode.cpp): each listed op gets a kernel under the
    dispatch key AutocastCPU / AutocastCUDA that casts its inputs (down to bf16/fp16, up to fp32, or to the
    widest input); every other op falls through and runs in its inputs' dtype. Both devices' kernels are
    registered in every torch build, so this works without a GPU. It asks torch's dispatcher (torch._C,
    no public API exists); which *way* an op casts is measured by `autocast_policies`.
    """
    one_of("device_type", device_type, tuple(_AUTOCAST_KEYS))
    key = _AUTOCAST_KEYS[device_type]
    return {name.removeprefix("aten::") for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)}


def autocast_output_dtypes(device_type: str = "cpu", dtype=torch.bfloat16, input_dtype=None) -> dict:
    """{probe name: output dtype} of `AUTOCAST_PROBES` under torch.autocast(device_type, dtype), measured.

    input_dtype None: each op gets a matmul's output (already `dtype`), as in a network; an op on autocast's
    fp32 list casts it up, an op on no list keeps it. input_dtype=torch.float32 shows which ops cast down.
    """
    one_of("device_type", device_type, tuple(_AUTOCAST_KEYS))
    x = torch.randn(8, 16, device=device_type)
    y = torch.arange(8, device=device_type) % 16
    with torch.autocast(device_type, dtype=dtype):
        h = x @ torch.randn(16, 16, device=device_type) if input_dtype is None else x.to(input_dtype)
        return {name: op(h, y).dtype for name, (_, op) in AUTOCAST_PROBES.items()}


def autocast_policies(device_type: str = "cpu", dtype=torch.bfloat16) -> dict:
    """{probe name: "lower precision" | "fp32" | "no rule"}: what autocast does to each probe op, measured.

    "lower precision": an fp32 input comes out `dtype` (matmuls, convs); "fp32": a `dtype` input comes out
    fp32 (autocast's fp32 list); "no rule": the output keeps the input's dtype.
    """
    from_low = autocast_output_dtypes(device_type, dtype)
    from_fp32 = autocast_output_dtypes(device_type, dtype, input_dtype=torch.float32)
    return {name: "lower precision" if from_fp32[name] == dtype else "fp32" if from_low[name] == torch.float32
            else "no rule" for name in AUTOCAST_PROBES}


def grad_scaler(precision: str, device) -> torch.amp.GradScaler | None:
    """torch's GradScaler for fp16, None otherwise: bf16 has fp32's range, so its gradients do not underflow."""
    check_precision(precision, device)
    return torch.amp.GradScaler(torch.device(device).type) if precision == "16" else None


def stored_update(weight: float, update: float, dtype) -> float:
    """How much of `update` survives when `weight + update` is stored in `dtype`.

    An update smaller than half the spacing of floats near the weight rounds away completely:
    stored_update(1.0, 1e-4, torch.bfloat16) == 0.0, because bf16's spacing at 1 is 2^-7.
    """
    w = torch.tensor(float(weight), dtype=dtype)
    return (w + torch.tensor(float(update), dtype=dtype)).double().item() - w.double().item()


class MasterWeights:
    """FP32 master copy of a low-precision model's parameters, as mixed precision keeps them.

    model: already in low precision (e.g. `copy.deepcopy(net).to(torch.bfloat16)`); forward and
    backward run on it. make_optimizer(params) builds the optimizer over the fp32 copies.
    `step(scale)` turns the model's gradients into fp32 / scale, skips the step if any is inf/nan,
    updates the fp32 copies (small updates accumulate there) and copies them back, rounded.
    """

    def __init__(self, model: nn.Module, make_optimizer):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = make_optimizer(self.master)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, scale: float = 1.0) -> bool:
        """Returns False (and leaves the weights alone) when a gradient is inf/nan."""
        grads = [None if p.grad is None else p.grad.float() / scale for p in self.params]
        if any(g is not None and not torch.isfinite(g).all() for g in grads):
            return False
        for m, g in zip(self.master, grads):
            m.grad = g
        self.optimizer.step()
        for p, m in zip(self.params, self.master):
            p.copy_(m)                       # round the fp32 master into the low-precision model
        return True


def next_scale(scale: float, good_steps: int, found_inf: bool, growth_factor: float = 2.0,
               backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[float, int]:
    """One update of dynamic loss scaling (torch._amp_update_scale_'s rule) -> (scale, good_steps).

    inf/nan: the step was skipped; scale *= backoff_factor and the count of good steps restarts.
    Otherwise count the step; after `growth_interval` good steps in a row, scale *= growth_factor
    (unless that overflows fp32) and restart the count.
    """
    if found_inf:
        return scale * backoff_factor, 0
    good_steps += 1
    if good_steps == growth_interval:
        grown = scale * growth_factor
        return (grown if grown <= _FP32_MAX else scale), 0
    return scale, good_steps


def scale_schedule(found_infs, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                   backoff_factor: float = 0.5, growth_interval: int = 2000) -> tuple[list, list]:
    """(scale used at each step, whether that step was skipped) for a sequence of found-inf flags."""
    scale, good, scales, skipped = float(init_scale), 0, [], []
    for inf in found_infs:
        scales.append(scale)
        skipped.append(bool(inf))
        scale, good = next_scale(scale, good, bool(inf), growth_factor, backoff_factor, growth_interval)
    return scales, skipped


def grad_scaler_schedule(found_infs, **kwargs) -> tuple[list, list]:
    """What torch.amp.GradScaler("cpu", **kwargs) does for a sequence of found-inf flags: the
    reference for `scale_schedule`. One parameter gets an inf gradient wherever a flag is set."""
    p = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    scales, skipped = [], []
    for inf in found_infs:
        optimizer.zero_grad()
        scales.append(scaler.get_scale())
        before = p.detach().clone()
        # small coefficients: only the injected inf overflows, even at a scale near fp32's maximum
        scaler.scale((p * torch.tensor([1e-3, math.inf if inf else 2e-3, 3e-3])).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        skipped.append(torch.equal(p.detach(), before))     # a skipped step leaves the weights alone
    return scales, skipped


class LossScaler:
    """Loss scaling with GradScaler's interface: scale(loss), step(optimizer), update(), get_scale().

    dynamic=False is static loss scaling: one fixed scale (too large: every step overflows and is
    skipped; too small: gradients still underflow). dynamic=True adapts it by `next_scale`.
    Gradients must be fp32 (as under autocast), since unscaling fp16 gradients would underflow again.
    """

    def __init__(self, init_scale: float = 2.0**16, dynamic: bool = True, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0; got {init_scale!r}")
        if not (growth_factor > 1 and 0 < backoff_factor < 1):
            raise ValueError("need growth_factor > 1 and 0 < backoff_factor < 1; "
                             f"got {growth_factor!r}, {backoff_factor!r}")
        positive_int("growth_interval", growth_interval)
        self.scale_value, self.dynamic, self.good_steps = float(init_scale), dynamic, 0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.found_inf = None

    def get_scale(self) -> float:
        return self.scale_value

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    @torch.no_grad()
    def unscale_(self, optimizer) -> bool:
        """Divide every gradient by the scale in place; return (and remember) whether any is inf/nan."""
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        found = False
        for g in grads:
            g.mul_(1.0 / self.scale_value)
            found = found or not bool(torch.isfinite(g).all())
        self.found_inf = found
        return found

    def step(self, optimizer) -> bool:
        """Unscale (if not done yet) and step, unless a gradient overflowed; True if it stepped."""
        if self.found_inf is None:
            self.unscale_(optimizer)
        if not self.found_inf:
            optimizer.step()
        return not self.found_inf

    def update(self) -> None:
        if self.found_inf is None:
            raise RuntimeError("update() needs a step() (or unscale_()) first in this iteration")
        if self.dynamic:
            self.scale_value, self.good_steps = next_scale(self.scale_value, self.good_steps, self.found_inf,
                                                           self.growth_factor, self.backoff_factor,
                                                           self.growth_interval)
        self.found_inf = None


def flushed_to_zero(x: torch.Tensor, dtype=torch.float16, scale: float = 1.0) -> int:
    """How many non-zero elements of `x` become exactly 0 when `x * scale` is stored in `dtype`."""
    x = torch.as_tensor(x).float()
    return int(((x != 0) & ((x * scale).to(dtype) == 0)).sum())


def low_precision_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype=torch.float16,
                        scale: float = 1.0, loss_fn=F.cross_entropy) -> tuple[list, list]:
    """Gradients of a `dtype` copy of `model`, forward and backward entirely in `dtype`, with the
    loss multiplied by `scale`. Returns (parameter grads, activation grads), fp32 and divided by
    `scale`: one tensor per parameter, and one per output of each module that has parameters
    (activation grads are [N, ...]: each sample's share of a batch-mean loss, ~1/N of a weight grad).

    Runs in eval mode (no dropout) so runs at different precisions see the same network. Every
    intermediate gradient is rounded to `dtype`, so what underflows inside backward is lost here
    exactly as on a GPU. dtype=torch.float32 gives the reference. In pure fp16 the seed of
    backward, d(loss * scale)/d(loss) = scale, is an fp16 number: scales above 65504 give inf.
    """
    net = copy.deepcopy(model).to(dtype).eval()
    outputs = []

    def keep(_module, _inputs, out):
        out.retain_grad()
        outputs.append(out)

    hooks = [m.register_forward_hook(keep) for m in net.modules() if list(m.parameters(recurse=False))]
    try:
        loss = loss_fn(net(x.to(dtype)), y)
    finally:
        for h in hooks:
            h.remove()
    (loss * scale).backward()
    return ([p.grad.float() / scale for p in net.parameters()],
            [out.grad.float() / scale for out in outputs])


def lost_gradients(reference: list[torch.Tensor], grads: list[torch.Tensor]) -> int:
    """Elements that are non-zero in the fp32 `reference` but exactly zero in `grads`."""
    return sum(int(((r != 0) & (g == 0)).sum()) for r, g in zip(reference, grads))


def saved_tensor_bytes(model: nn.Module, x: torch.Tensor, precision: str = "32") -> int:
    """Bytes autograd keeps for backward during one forward pass, not counting the parameters
    (they exist anyway). Under autocast activations are saved in bf16/fp16: about half of fp32's.
    """
    device = next(model.parameters()).device
    params = {p.data_ptr() for p in model.parameters()}
    seen: dict = {}

    def pack(t):
        if t.data_ptr() not in params:
            seen[(t.data_ptr(), t.dtype, tuple(t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(precision, device):
        model(x.to(device))
    return sum(seen.values())


def gradient_magnitudes(grads: list[torch.Tensor]) -> torch.Tensor:
    """|g| of every non-zero element of `grads`, flattened into one fp32 tensor (for log histograms)."""
    flat = torch.cat([g.detach().float().flatten() for g in grads])
    return flat[flat != 0].abs()

