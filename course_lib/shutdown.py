"""A faster exit: skip Python's last garbage collections over torch's objects.

At exit the interpreter's final collections walk every object torch created: about 1 CPU-s in each process
that imported it (torch 2.14, Python 3.11; a kernel's shutdown 1.7 s -> 0.5 s). The process is ending and its
memory goes back whole, so `freeze_at_exit` (registered with atexit by `import course_lib`) moves the objects
out of the collector's sight. Not where a nanobind extension is loaded (triton >= 3.9): nanobind reports the
objects it still holds at exit as leaks, which would print a screen of warnings after every run.
"""
from __future__ import annotations

import gc
import sys
import types


def _uses_nanobind(module) -> bool:
    """Whether an extension module (or one of its submodules) defines nanobind classes."""
    if not str(getattr(module, "__file__", None) or "").endswith((".so", ".pyd")):
        return False
    for value in list(vars(module).values()):
        inner = list(vars(value).values()) if isinstance(value, types.ModuleType) else []
        if any(isinstance(v, type) and type(v).__module__ == "nanobind" for v in (value, *inner)):
            return True
    return False


def freeze_at_exit() -> None:
    if not any(_uses_nanobind(m) for m in list(sys.modules.values())):
        gc.freeze()
