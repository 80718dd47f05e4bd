"""int8 inference through PyTorch's own APIs, feature-detected: what exists, what is fast, here.

    qmodel, api = int8_model(model, calibration_batches)   # the fastest route this install has
    available_apis()                                        # name -> None (usable) or why not

Four routes, all for CPU inference (a model on a GPU is copied to the CPU):
- "torch.ao-static-fx" (DEPRECATED: torch warns that torch.ao.quantization will be removed):
  FX graph mode `prepare_fx` / calibrate / `convert_fx` on the x86 engine. int8 weights per
  channel, activations int8 *between* layers with ranges calibrated ahead of time, fused
  Linear+ReLU: hand-written fbgemm kernels, eager, no compiler. Fastest measured here.
- "torch.ao-dynamic" (DEPRECATED, same module): `quantize_dynamic`: int8 weights, activations
  quantized on the fly per batch (a min/max pass per layer): no calibration needed.
- "torchao-pt2e" (maintained successor): torch.export -> torchao's X86InductorQuantizer (the
  same static scheme) -> convert_pt2e -> torch.compile with freezing, where inductor swaps the
  quantize/dequantize patterns for oneDNN int8 kernels. Needs torchao and a C++ compiler, and
  compiles for seconds; on an AVX2 CPU without VNNI it is only a little faster than fp32.
- "torchao-quantize_" (maintained, eager): `torchao.quantization.quantize_` with
  Int8DynamicActivationInt8WeightConfig: int8 tensor subclasses designed for GPUs. On a CPU its
  int8 matmul (torch._int_mm) has no fast kernel: correct, but far slower than fp32. Shown, never
  chosen by "auto".

"auto" takes the first usable route of AUTO_ORDER (routes that calibrate are skipped without
calibration batches). When torch.ao.quantization is removed, "auto" moves to torchao-pt2e.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import operator
import shutil
import warnings

import torch
from torch import nn

APIS = ("torch.ao-static-fx", "torch.ao-dynamic", "torchao-pt2e", "torchao-quantize_")
AUTO_ORDER = ("torch.ao-static-fx", "torch.ao-dynamic", "torchao-pt2e")
DEPRECATED = ("torch.ao-static-fx", "torch.ao-dynamic")
CALIBRATED = ("torch.ao-static-fx", "torchao-pt2e")
INSTALL_HINT = "pip install torchao  (the maintained home of PyTorch's quantization)"


NOISY_LOGGERS = ("torch.utils._pytree", "torch.utils.cpp_extension")   # import- and compile-time chatter


@contextlib.contextmanager
def _quiet():
    """Silence the deprecation warnings and log lines these APIs print while they load and compile."""
    logs = [logging.getLogger(name) for name in NOISY_LOGGERS]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def _why_not(api: str) -> str | None:
    """None if `api` can run here, else the reason (and what to do)."""
    if api in DEPRECATED:
        with _quiet():
            try:
                from torch.ao.quantization import get_default_qconfig_mapping, quantize_dynamic  # noqa: F401
                from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx  # noqa: F401
            except ImportError:
                return (f"torch {torch.__version__} no longer has torch.ao.quantization "
                        "(deprecated, now removed); torchao-pt2e is its successor")
        engines = torch.backends.quantized.supported_engines
        if not {"x86", "fbgemm"} & set(engines):
            return f"no x86/fbgemm quantized engine in this torch build (engines: {engines})"
        return None
    with _quiet():
        try:
            if api == "torchao-pt2e":
                import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401
                import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer  # noqa: F401
            else:
                from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_  # noqa: F401
        except ImportError as exc:
            return f"torchao is missing or too old ({exc}): {INSTALL_HINT}"
    if api == "torchao-pt2e" and not shutil.which("g++") and not shutil.which("c++"):
        return "torch.compile (inductor) needs a C++ compiler (g++) to build its CPU kernels"
    return None


def available_apis() -> dict:
    """name -> None if usable on this machine, else a one-line reason."""
    return {api: _why_not(api) for api in APIS}


def _first_input(batches) -> torch.Tensor:
    for batch in batches:
        return (batch[0] if isinstance(batch, (tuple, list)) else batch).cpu()
    raise ValueError("calibration_batches must hold at least one batch")


def _x86_engine() -> str:
    engines = torch.backends.quantized.supported_engines
    torch.backends.quantized.engine = engine = "x86" if "x86" in engines else "fbgemm"
    return engine


def _torch_ao_dynamic(model):
    from torch.ao.quantization import quantize_dynamic

    _x86_engine()
    return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


@torch.no_grad()
def _torch_ao_static_fx(model, batches):
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    prepared = prepare_fx(model, get_default_qconfig_mapping(_x86_engine()), (_first_input(batches),))
    for batch in batches:
        prepared((batch[0] if isinstance(batch, (tuple, list)) else batch).cpu())
    return convert_fx(prepared)


def _torchao_quantize_(model):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    return model


class CompiledInt8(nn.Module):
    """A torch.compile'd pt2e int8 graph. Inductor needs freezing (weights as constants) and no
    autograd to swap in its int8 kernels; every call runs under both, always in inference mode
    (a change of grad mode between calls would make dynamo compile again, for seconds)."""

    def __init__(self, graph: nn.Module):
        super().__init__()
        self.graph = graph
        self.compiled = torch.compile(graph, dynamic=True)   # one compile for every batch size
        self.training = False

    def train(self, mode: bool = True):
        """A no-op: the graph was exported in eval mode, and switching an exported graph's mode
        rewrites it, which would force a recompile."""
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch._inductor.config as inductor_config

        with inductor_config.patch(freezing=True), torch.inference_mode():
            return self.compiled(x)

    def state_dict(self, *args, **kwargs):
        return self.graph.state_dict(*args, **kwargs)


def _drop_unused_attributes(gm) -> None:
    """convert_pt2e keeps the fp32 weights next to their folded int8 copies: delete what the graph
    no longer reads, so that the saved model holds only what inference uses."""
    used = {node.target for node in gm.graph.nodes if node.op == "get_attr"}
    for name, _ in list(gm.named_parameters()) + list(gm.named_buffers()):
        if name not in used:
            owner, _, attr = name.rpartition(".")
            delattr(gm.get_submodule(owner), attr)


class RouteFailed(RuntimeError):
    """An int8 route that imported but did not produce an int8 model with this torch/torchao pair."""


def _torchao_pt2e(model, batches):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    example = _first_input(batches)
    batch = torch.export.Dim("batch", min=1)
    graph = torch.export.export(model, (example,), dynamic_shapes=({0: batch},)).module()
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for b in batches:
            prepared((b[0] if isinstance(b, (tuple, list)) else b).cpu())
    converted = convert_pt2e(prepared)
    _drop_unused_attributes(converted)
    read = [operator.attrgetter(n.target)(converted) for n in converted.graph.nodes if n.op == "get_attr"]
    if not any(getattr(t, "dtype", None) == torch.int8 for t in read):
        import torchao   # seen with torch 2.11 + torchao 0.18 on a GPU machine: the weights stayed fp32
        raise RouteFailed(f"torchao-pt2e left the weights in float32 here (torch {torch.__version__}, torchao "
                          f"{torchao.__version__}: convert_pt2e did not fold them to int8); use another route")
    compiled = CompiledInt8(converted)
    compiled(example)       # compile now, not in the first timed call
    return compiled


def int8_model(model: nn.Module, calibration_batches=None, api: str = "auto") -> tuple[nn.Module, str]:
    """(int8 model for CPU inference, name of the API used). The float model is left untouched.

    calibration_batches: a few input batches (tensors or (x, y) pairs); needed by the static routes
    (CALIBRATED), whose activation ranges are fixed ahead of time. api: "auto" or one of APIS.
    """
    if api != "auto" and api not in APIS:
        raise ValueError(f"api must be 'auto' or one of {APIS}; got {api!r}")
    if calibration_batches is not None:
        calibration_batches = list(calibration_batches)
    if api == "auto":
        reasons = {name: _why_not(name) for name in AUTO_ORDER}
        if calibration_batches is None:
            reasons.update({name: reasons[name] or "needs calibration_batches" for name in CALIBRATED})
        usable = [name for name in AUTO_ORDER if reasons[name] is None]
        if not usable:
            raise RuntimeError("no int8 API usable here: " + "; ".join(f"{k}: {v}" for k, v in reasons.items()))
        api = usable[0]
    else:
        reason = _why_not(api)
        if reason:
            raise RuntimeError(f"api={api!r} is not usable here: {reason}")
    if api in CALIBRATED and calibration_batches is None:
        raise ValueError(f"calibration_batches are needed for api={api!r}: static int8 fixes the "
                         "activation ranges ahead of time from a few batches")
    model = copy.deepcopy(model).cpu().eval()
    with _quiet():
        if api == "torch.ao-static-fx":
            return _torch_ao_static_fx(model, calibration_batches), api
        if api == "torch.ao-dynamic":
            return _torch_ao_dynamic(model), api
        if api == "torchao-quantize_":
            return _torchao_quantize_(model), api
        return _torchao_pt2e(model, calibration_batches), api
