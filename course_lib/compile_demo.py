"""Operator fusion with torch.compile (lecture 04): capture, fuse, measure, and where capture breaks.

Eager PyTorch runs one kernel per op, and each kernel reads its inputs from memory and writes its
output back. For a chain of elementwise ops that is several passes over the data, and elementwise
ops are memory-bound (lecture 02's roofline: ~1 FLOP per 4-8 bytes), so the passes are the cost.
`torch.compile` captures the Python function as a graph (Dynamo), lowers it with Inductor, which
fuses the chain into ONE generated loop (C++/OpenMP on a CPU, Triton on a GPU): one pass.

    from course_lib import compile_demo
    result = compile_demo.try_compile(compile_demo.elementwise_chain, x, y)   # None + why, if it cannot
    compile_demo.fused_kernels(compile_demo.elementwise_chain, x, y)        # {kernel name: its C++ loop}
    compile_demo.graph_breaks(compile_demo.branchy, x)                      # graphs, breaks, reasons
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .gpu import time_fn
from .validate import positive_int


def elementwise_chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """gelu(2x + 1) * y: four elementwise ops, four passes over memory in eager mode, one when fused."""
    return F.gelu(x * 2 + 1) * y


def branchy(x: torch.Tensor) -> torch.Tensor:
    """Code Dynamo cannot capture as one graph: it needs a value from the data, and a Python side effect."""
    y = torch.relu(x) * 2
    if y.sum() > 0:              # a Python branch on the data: the graph ends here, Python decides
        y = y + 1
    print(f"mean {y.mean().item():.3f}")   # .item() and print run in Python: another break
    return y.exp()


@dataclass
class Compiled:
    """What `try_compile` gives: the compiled callable and its first call's seconds, or why it failed."""
    fn: object = None
    seconds: float = float("nan")
    error: str | None = None


def try_compile(fn, *args, **compile_kwargs) -> Compiled:
    """torch.compile(fn) and call it once on `args` (compilation happens at the first call), timed.

    Inductor on a CPU needs a C++ compiler (and Triton on a GPU); where compiling fails, this returns
    the reason instead of raising, so a lecture can explain it rather than stop.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable; got {fn!r}")
    compiled = torch.compile(fn, **compile_kwargs)
    return _first_call(compiled, lambda: compiled(*args))


def compile_training(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, **compile_kwargs) -> Compiled:
    """torch.compile(model) and one `train_step` on (x, y): forward and backward (AOTAutograd) compile at
    this first step. Returns Compiled(fn() = one more training step, seconds of the first step) or why not."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    compiled = torch.compile(model, **compile_kwargs)
    step = lambda: train_step(compiled, optimizer, x, y)  # noqa: E731
    return _first_call(step, step)


def _first_call(fn, call) -> Compiled:
    import logging
    quiet = logging.getLogger("torch.utils.cpp_extension")      # "No CUDA runtime is found" on a CPU machine
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    t0 = time.perf_counter()
    try:
        call()
    except Exception as err:  # noqa: BLE001 - any backend failure becomes an explanation
        text = str(err).strip()
        return Compiled(error=f"{type(err).__name__}: {text.splitlines()[0][:300] if text else ''}")
    finally:
        quiet.setLevel(level)
    return Compiled(fn, time.perf_counter() - t0)


def speedup(eager, compiled, *args, repeats: int = 5) -> dict:
    """Median seconds per call of eager and compiled `fn(*args)` (same inputs, same clock), and their ratio."""
    positive_int("repeats", repeats)
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    eager_s = time_fn(lambda: eager(*args), device, repeats=repeats)
    compiled_s = time_fn(lambda: compiled(*args), device, repeats=repeats)
    return {"eager_s": eager_s, "compiled_s": compiled_s, "ratio": eager_s / compiled_s}


_KERNEL_DEF = re.compile(r"^(\w*(?:cpp|triton)\w*fused\w*) = async_compile\.\w+\(", re.M)


def fused_kernels(fn, *args) -> dict:
    """{kernel name: its generated source} of what Inductor writes for `fn(*args)`.

    Names read as the ops fused into them, e.g. `cpp_fused_add_gelu_mul_0`: one loop for four ops.
    """
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()                    # compile afresh, so the code is generated (or loaded) and returned
    _, sources = run_and_get_code(torch.compile(fn), *args)
    kernels = {}
    for source in sources:
        for match in _KERNEL_DEF.finditer(source):
            body = source[match.end():]
            end = body.find("''')")
            kernels[match.group(1)] = body[:end if end >= 0 else None]
    return kernels


def loop_body(kernel_source: str, max_lines: int = 14) -> str:
    """The arithmetic lines of a generated C++ kernel (`auto tmpN = ...`): what one iteration computes."""
    lines = [line.strip() for line in kernel_source.splitlines() if line.strip().startswith("auto tmp")]
    return "\n".join(lines[:max_lines] + (["..."] if len(lines) > max_lines else []))


def kernel_profile():
    """Context in which Inductor wraps each generated CPU kernel in a profiler event named after it."""
    import torch._inductor.config as inductor_config
    return inductor_config.patch({"cpp.enable_kernel_profile": True})


def is_fused_kernel(name: str) -> bool:
    """trace.record's `keep`: the events of Inductor's generated kernels (with `kernel_profile()` on)."""
    return "cpp_fused" in name or "triton_" in name


def graph_breaks(fn, *args) -> dict:
    """{"graphs", "breaks", "reasons"}: how Dynamo splits `fn(*args)`, from torch._dynamo.explain.

    Each break hands control back to Python; the code between breaks is compiled graph by graph,
    and no fusion crosses a break.
    """
    import logging
    torch._dynamo.reset()
    logger = logging.getLogger("torch._dynamo")
    level = logger.level
    logger.setLevel(logging.ERROR)           # the reasons are returned; no multi-line warning per break
    try:
        out = torch._dynamo.explain(fn)(*args)
    finally:
        logger.setLevel(level)
    reasons = [r.reason.strip().splitlines()[0] for r in out.break_reasons]
    return {"graphs": out.graph_count, "breaks": out.graph_break_count, "reasons": reasons}


def train_step(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    """One SGD step of `model` (eager or compiled): forward, cross-entropy, backward, update."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()
