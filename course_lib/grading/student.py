"""Run a function written in a notebook cell on N processes (notebooks 05 and 09, and the checks of 05).

A spawned process can only import functions that live in a module, so a notebook-defined function
cannot be passed to `launch`. Instead we send its SOURCE: each worker `exec`s it in a fresh
namespace that already holds `torch`, `dist` (torch.distributed) and `math`, and calls it.

Calling convention: the student's function takes the per-rank arguments only, and asks
torch.distributed for its rank itself, exactly as code under torchrun does:

    from course_lib.grading.student import launch_student

    def my_all_reduce(tensor):                  # in a notebook cell
        rank, n = dist.get_rank(), dist.get_world_size()
        ...
    launch_student(my_all_reduce, 3, torch.ones(5))   # -> [result of rank 0, 1, 2]

The function must be self-contained: only its own source travels (helpers it calls from other
cells do not), and it can use torch, dist, math and whatever it imports itself.

When the grader calls these with a student's function, `fn` is a proxy (course_lib.grading.remote)
for a function that lives in the grading sandbox: the launch then happens in the sandbox, so every
rank runs jailed, and only the ranks' results come back, as data.
"""
from __future__ import annotations

import inspect
import math
import textwrap

import numpy as np
import torch
import torch.distributed as dist

from ..distributed.launch import launch
from ..env import rank_device
from .remote import is_remote


def student_source(fn) -> str:
    """The dedented source of `fn` (a plain function defined with `def`)."""
    if not inspect.isfunction(fn) or fn.__name__ == "<lambda>":
        raise TypeError(f"fn must be a function defined with def; got {fn!r}")
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise TypeError(f"cannot read the source of {fn.__name__!r} ({e}); define it in a notebook cell "
                        "or a .py file") from None


def compile_source(source: str, name: str):
    """exec `source` in a namespace with torch, dist and math; return the function called `name`."""
    if not isinstance(source, str) or not isinstance(name, str):
        raise TypeError("source and name must be strings")
    namespace = {"torch": torch, "dist": dist, "math": math, "__name__": "__student__"}
    exec(compile(source, f"<student {name}>", "exec"), namespace)
    if not callable(namespace.get(name)):
        raise ValueError(f"the source does not define a function called {name!r}")
    return namespace[name]


def run_source(rank: int, world_size: int, source: str, name: str, *args):
    """Worker for `launch`: compile `source` and return `name(*args)` on this rank.

    CPU tensors among `args` are moved to this rank's GPU first when the backend is nccl. A tensor
    result comes back as a numpy array (pickled by value: a returned tensor would travel through shared
    memory that vanishes when the worker exits); `launch_student` turns it back into a tensor.
    """
    fn = compile_source(source, name)
    device = rank_device()
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    result = fn(*args)
    return result.detach().cpu().numpy() if isinstance(result, torch.Tensor) else result


def launch_source(worker, world_size: int, fn, *args, **launch_kwargs) -> list:
    """launch(worker, world_size, the source of fn, fn's name, *args): `worker` compiles the source on each
    rank (compile_source). In the grading sandbox when `fn` is a grader's proxy for a student's function."""
    if is_remote(fn):
        return fn._sandbox.library("course_lib.grading.student:launch_source", worker, world_size, fn, *args,
                                   **launch_kwargs)
    results = launch(worker, world_size, student_source(fn), fn.__name__, *args, **launch_kwargs)
    return [torch.from_numpy(r) if isinstance(r, np.ndarray) else r for r in results]


def launch_student(fn, world_size: int, *args, **launch_kwargs) -> list:
    """`launch` for a notebook-defined `fn(*args)`: returns its result on each rank, in rank order.

    launch_kwargs go to `launch` (backend, timeout, threads_per_rank).
    """
    return launch_source(run_source, world_size, fn, *args, **launch_kwargs)
