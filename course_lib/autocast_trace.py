"""Where autocast's time goes: a few training steps in fp32 and in bf16, traced, casts made visible.

Under `torch.autocast` every matmul/conv first casts its fp32 inputs (and the fp32 weights) to bf16:
an `aten::_to_copy` per cast, inside "forward", and another in "backward" for each cast's gradient.
`course_lib.trace` keeps only a thread's outermost events; `keep_casts` keeps these casts too, drawn
as thin "cast" bars over the phase they belong to.

    from course_lib import autocast_trace
    timelines = {p: autocast_trace.record_steps(Net(), x, y, p) for p in ("32", "bf16")}
    autocast_trace.native_bf16()         # (True, "AMX, AVX512-BF16") where bf16 has matrix units
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from . import trace
from .loop import train_epoch
from .precision import check_precision
from .validate import positive_int

CAST_OP = "aten::_to_copy"          # what `x.to(dtype)` and autocast's casts run (under `aten::to`)


def keep_casts(name: str) -> bool:
    """trace.record's `keep`: the casts, plus what the trace keeps anyway (collectives, device copies)."""
    return name == CAST_OP or trace.kind_of(name) == "comm" or any(w in name for w in trace.DEEP_COPIES)


def record_steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = "32", steps: int = 3,
                 label: str = "") -> trace.Timeline:
    """Trace `steps` SGD steps (after one warm-up) of a copy of `model` on the batch (x [N, ...], y [N]),
    with `course_lib.loop.train_epoch` (phases forward/backward/optimizer) at `precision` on x's device.
    Casts inside the phases are kept and marked kind "cast"."""
    positive_int("steps", steps)
    device = x.device
    check_precision(precision, device)
    model = copy.deepcopy(model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = [(x, y)]                                     # a one-batch "loader": one train_epoch = one step
    timeline = trace.record(lambda: train_epoch(model, batch, optimizer, device, precision=precision, progress=False),
                            steps=steps, warmup=1, label=label, keep=keep_casts)
    for span in timeline.spans:
        if span.name == CAST_OP and span.depth:
            span.kind = "cast"
    return timeline


def native_bf16() -> tuple[bool, str]:
    """(whether this CPU multiplies bf16 natively, the features found), from torch's own CPU checks.

    AVX512-BF16 (dot products) and AMX (matrix tiles) run bf16 matmuls at up to twice fp32's rate or more;
    without them (AVX2 and plain AVX512 CPUs) each bf16 op converts to fp32 and back: slower than fp32.
    """
    found = [name for name, check in (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
             if getattr(torch.cpu, check, lambda: False)()]
    return bool(found), ", ".join(found) or "none"
