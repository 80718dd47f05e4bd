"""The sandbox side of grading: runs a student's cells and answers the grader's calls with data.

    python -c "from course_lib.grading.answers import main; main()" LOG     # by course_lib.grading.remote, jailed

It reads frames on stdin and writes frames on stdout (course_lib.grading.wire); everything the
cells print goes to LOG, never into the protocol. Messages (dicts, "op" says which):
    cell     run a cell's source in IPython (setup cells and the submission's answer cells)
    get      the values of the answer's names: plain data, or a handle to the object
    call / getattr / setattr / builtin (len, repr, iter, ...)   on a handle
    library  call a course_lib function here with handles resolved (a launch of the student's ranks)
    backward gradients through a result computed here (remote autograd)
    bye      exit
Every reply also carries "sync": the tensors and modules the grader sent that the call changed
(an optimizer step, .grad, model.train()), so the grader's copies change as they would in one process.

Nothing here is trusted: the student's code runs in this process and may rewrite any of it. The
grader treats every reply as untrusted data (wire.decode) and decides every grade itself.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import os
import pickle
import sys
import traceback

import torch

from . import wire

_tracked = wire.ADOPTED             # the grader's number -> our copy of its tensor / module / optimizer
_state: dict[int, tuple] = {}        # number -> what the object looked like after the last reply
_handles: list = []                  # handle number -> the student's object
_graphs: dict[int, tuple] = {}       # graph number -> (outputs, inputs) kept for backward
_seen = wire.SEEN                    # numbers of the grader's objects in the message being handled
BUILTINS = {"len": len, "bool": bool, "repr": repr, "str": str, "int": int, "float": float, "index": int,
            "iter": lambda obj: list(_capped(obj)), "contains": lambda obj, item: item in obj,
            "getitem": lambda obj, key: obj[key], "setitem": lambda obj, key, value: obj.__setitem__(key, value)}
MAX_ITEMS = 100_000




def _look(obj):
    if isinstance(obj, torch.Tensor):
        grad = obj.grad
        return (obj._version, obj.data_ptr(), tuple(obj.shape), obj.dtype, id(grad),
                None if grad is None else grad._version, obj.requires_grad)
    if isinstance(obj, torch.nn.Module):
        return _module_attributes(obj)
    return None


def _module_attributes(module) -> dict:
    """A module's plain attributes (training, and lists or numbers a check's module records)."""
    out = {}
    for key, value in vars(module).items():
        if key == "training" or not key.startswith("_"):
            try:
                out[key] = wire.encode(value, _refuse)
            except TypeError:
                pass                                  # not plain data: stays in the sandbox
    return out


def _refuse(obj):
    raise TypeError("not data")


def _changes() -> list:
    """(number, payload) for every tracked object whose state differs from the last reply."""
    changed = []
    for number, obj in _tracked.items():
        try:
            now = _look(obj)
        except TypeError:
            continue
        if now == _state[number]:
            continue
        _state[number] = now
        if isinstance(obj, torch.Tensor):
            grad = obj.grad
            changed.append((number, {"data": obj.detach().clone(), "requires_grad": obj.requires_grad,
                                     "grad": None if grad is None else grad.detach().clone()}))
        elif isinstance(obj, torch.nn.Module):
            changed.append((number, {"attributes": now}))
    return changed


def _handle(obj):
    for number, mine in _tracked.items():      # the grader's own module or optimizer, returned: itself
        if mine is obj:
            return (wire.TAG, "sent", number)
    _handles.append(obj)
    kind = "callable" if callable(obj) else "object"
    return (wire.TAG, "handle", (len(_handles) - 1, kind, getattr(obj, "__name__", type(obj).__name__)
                                 if isinstance(getattr(obj, "__name__", None), str) else type(obj).__name__))


def _capped(obj):
    for i, item in enumerate(iter(obj)):
        if i >= MAX_ITEMS:
            raise ValueError(f"more than {MAX_ITEMS:,} items: the grader stops reading there")
        yield item


def _value(value):
    """A value as data; an iterator or generator comes back as its items (consumed here)."""
    if hasattr(value, "__next__") and hasattr(value, "__iter__") and not isinstance(value, torch.Tensor):
        return (wire.TAG, "iterator", [wire.encode(v, _handle) for v in _capped(value)])
    return wire.encode(value, _handle)


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        """A handle, or a grader's object we already have, updated in place to how the grader has it now
        (so what holds it here, e.g. an optimizer holding parameters, sees the change)."""
        kind, number = pid[:2]
        if kind == "handle":
            return _handles[number]
        obj = _tracked[number]
        _seen.append(number)
        if kind == "tensor":
            data, grad, requires_grad = pid[2:]
            with torch.no_grad():     # into the same storage where it fits: views of it (a student's buffer
                if data.shape == obj.shape and data.dtype == obj.dtype:   # aliasing p.grad) see the new values,
                    obj.copy_(data)                                       # as they would in one process
                else:
                    obj.data = data
            if obj.is_leaf:
                obj.requires_grad_(requires_grad)
            obj.grad = grad
        elif kind == "module":
            vars(obj).update(pid[2])
        _state[number] = _look(obj)
        return obj


def _error(exc: BaseException) -> dict:
    lines = traceback.format_exception(exc)
    return {"error": type(exc).__name__, "message": str(exc)[:2000], "traceback": "".join(lines[-12:])[-4000:]}


def _result(value) -> dict:
    """The reply for a call's result; keeps its graph when it is differentiable w.r.t. the grader's tensors."""
    outputs = value if isinstance(value, (tuple, list)) else (value,)
    numbers = [n for n in dict.fromkeys(_seen) if isinstance(_tracked[n], torch.Tensor) and _tracked[n].requires_grad]
    if numbers and outputs and all(isinstance(o, torch.Tensor) for o in outputs) and \
            any(o.requires_grad for o in outputs):
        _graphs[len(_graphs)] = (list(outputs), [_tracked[n] for n in numbers])
        return {"value": _value(value), "graph": len(_graphs) - 1, "inputs": numbers}
    return {"value": _value(value)}


def _run_cell(shell, source: str) -> dict:
    result = shell.run_cell(source, store_history=True)
    exc = result.error_in_exec or result.error_before_exec
    return {"status": "ok"} if exc is None else {"status": "error", **_error(exc)}


def handle(shell, message: dict) -> dict:
    op = message["op"]
    if op == "cell":
        return _run_cell(shell, message["source"])
    if op == "get":
        return {"values": {name: _value(shell.user_ns[name]) if name in shell.user_ns else (wire.TAG, "missing", 0)
                           for name in message["names"]}}
    try:
        if op == "call":         # with the grader's random state, so dropout draws what it would draw there
            torch.set_rng_state(message["rng"])
            value = message["target"](*message["args"], **message["kwargs"])
            return {**_result(value), "rng": torch.get_rng_state()}
        if op == "getattr":
            return {"value": _value(getattr(message["target"], message["name"]))}
        if op == "setattr":
            setattr(message["target"], message["name"], message["value"])
            return {"value": None}
        if op == "builtin":
            return {"value": _value(BUILTINS[message["name"]](message["target"], *message["args"]))}
        if op == "library":
            module, _, name = message["function"].partition(":")
            function = getattr(importlib.import_module(module), name)
            return {"value": _value(function(*message["args"], **message["kwargs"]))}
        if op == "backward":
            outputs, inputs = _graphs[message["graph"]]
            wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
            grads = torch.autograd.grad(outputs, [inputs[i] for i in wanted], message["grads"],
                                        allow_unused=True, retain_graph=True)
            out = [None] * len(inputs)
            for i, g in zip(wanted, grads):
                out[i] = g
            return {"value": out}
    except BaseException as exc:  # noqa: BLE001 - the student's exception is the answer
        return _error(exc)
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    inbox, outbox = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)                        # what the cells print goes to the log, not the protocol
    os.dup2(log, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance(history_length=0, colors="NoColor")
    shell.history_manager.enabled = False
    while True:
        _seen.clear()
        try:
            frame = wire.read_frame(inbox, limit=2**40)
        except EOFError:
            return
        try:
            message = _Unpickler(io.BytesIO(frame)).load()    # may import modules: it can fail like a call
            if message["op"] == "bye":
                # no interpreter shutdown (a second with torch and IPython loaded): the grader waits for it
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(BaseException):   # the student's cells may have replaced them
                        stream.flush()
                os._exit(0)
            for number in _seen:                              # how the grader's new objects look on arrival
                _state.setdefault(number, _look(_tracked[number]))
            reply = handle(shell, message)
            reply["sync"] = _changes()
            buffer = io.BytesIO()
            torch.save(reply, buffer)
        except BaseException as exc:  # noqa: BLE001 - e.g. a result torch.save cannot write
            buffer = io.BytesIO()
            torch.save({**_error(exc), "sync": []}, buffer)
        outbox.write(wire.pack(buffer.getvalue()))
        outbox.flush()
