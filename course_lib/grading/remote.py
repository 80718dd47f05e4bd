"""The grader's side of the sandbox: start it, send it cells, and call the student's answers as proxies.

    box = Sandbox(folder, hide=[source_notebook])        # a jailed `python -m course_lib.grading.answers`
    box.run_cell("def add(a, b): return a + b")         # -> {"status": "ok"} or {"status": "error", ...}
    add = box.get(["add"])["add"]                       # a Remote: calling it runs add in the sandbox
    add(2, 3)                                           # -> 5, as data

A Remote stands for an object that lives in the sandbox. Calling it, reading an attribute, len,
iteration, indexing and repr each become one request; arguments go over by value (a tensor, module
or optimizer sent before goes by reference, so it stays the same object over there), results come
back as data (course_lib.grading.wire) or as another Remote. What the call changed in the grader's
tensors and modules (parameters, .grad, .requires_grad, .training) is copied back; a result that depends on the
grader's tensors that require grad is differentiable here (its backward runs over there). An
exception raised by the student's code arrives as StudentError, or as the same built-in exception
type (ValueError, TypeError, ...) so a check can expect it; the student can never raise SystemExit
or KeyboardInterrupt in the grader. A request that runs past `deadline` or a sandbox that dies
raises SandboxLost (a BaseException: a check's `except Exception` cannot swallow it); the sandbox
is then killed, with everything it started.
"""
from __future__ import annotations

import builtins
import contextlib
import copy
import math
import os
import queue
import shutil
import sys
import threading
import time
from pathlib import Path
from subprocess import PIPE, Popen

import torch

import course_lib

from ..data import cache_dir, data_root
from ..processes import kill_tree
from . import jail, wire, zygote
from .environment import sealed
from .limits import Limits

COURSE_ROOT = Path(course_lib.__file__).resolve().parent.parent
RAISED_AS = {name: getattr(builtins, name) for name in (
    "ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "NotImplementedError", "RuntimeError",
    "ZeroDivisionError", "AssertionError", "StopIteration", "ArithmeticError", "LookupError", "OverflowError",
    "NameError", "FileNotFoundError", "OSError", "PermissionError", "TimeoutError")}
_DUNDERS = ("__name__", "__qualname__", "__doc__", "__module__")


class SandboxLost(BaseException):
    """The sandbox died, sent garbage or ran past its deadline; it has been killed."""


class StudentError(Exception):
    """The student's code raised `name`: `message` (its traceback, as text, in `traceback`)."""

    def __init__(self, name: str, message: str, traceback: str = ""):
        super().__init__(f"{name}: {message}" if message else name)
        self.name, self.message, self.traceback = name, message, traceback


def _raised(reply: dict) -> BaseException:
    name, message = str(reply.get("error")), str(reply.get("message", ""))
    if name in RAISED_AS:    # the same built-in type, so `with pytest.raises(ValueError)` style checks work
        error = type(name, (RAISED_AS[name], StudentError), {"__init__": StudentError.__init__})
        error.__module__ = "builtins"
        return error(name, message, str(reply.get("traceback", "")))
    return StudentError(name, message, str(reply.get("traceback", "")))


class Remote:
    """A proxy for an object in the sandbox (see the module docstring). `source`: the answer cells' code
    that defined it, when it is one of the answer's names (make-it-small measures that code)."""

    __slots__ = ("_sandbox", "_number", "_kind", "_name", "source")

    def __init__(self, sandbox, number: int, kind: str, name: str):
        for key, value in (("_sandbox", sandbox), ("_number", number), ("_kind", kind), ("_name", name),
                           ("source", None)):
            object.__setattr__(self, key, value)

    def _course_handle(self) -> int:
        if self._sandbox.generation != self._number[0]:
            raise TypeError(f"{self._name} belongs to a sandbox that was restarted (a cell hung or crashed)")
        return self._number[1]

    def __call__(self, *args, **kwargs):
        return self._sandbox.call(self, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name not in _DUNDERS:
            raise AttributeError(name)
        return self._sandbox.request({"op": "getattr", "target": self, "name": name})

    def __setattr__(self, name, value):
        self._sandbox.request({"op": "setattr", "target": self, "name": name, "value": value})

    def _builtin(self, name, *args):
        return self._sandbox.request({"op": "builtin", "target": self, "name": name, "args": args})

    def __len__(self):
        return int(self._builtin("len"))

    def __bool__(self):
        return bool(self._builtin("bool"))

    def __repr__(self):
        return str(self._builtin("repr"))[:2000]

    def __str__(self):
        return str(self._builtin("str"))[:2000]

    def __iter__(self):
        return iter(self._builtin("iter"))

    def __contains__(self, item):
        return bool(self._builtin("contains", item))

    def __getitem__(self, key):
        return self._builtin("getitem", key)

    def __setitem__(self, key, value):
        self._builtin("setitem", key, value)

    def __int__(self):
        return int(self._builtin("int"))

    def __float__(self):
        return float(self._builtin("float"))

    def __index__(self):
        return int(self._builtin("index"))


def is_remote(obj) -> bool:
    return type(obj) is Remote


_hidden: list | None = None     # while grade() runs: what no process of the student may see
_limits: Limits = Limits()       # while grade() runs: the resource limits of the student's processes


@contextlib.contextmanager
def grading(hide, limits: Limits | None = None):
    """While grading: student_command jails every process the checks start for the student's code,
    with `limits` (default: Limits())."""
    global _hidden, _limits
    previous = _hidden, _limits
    _hidden, _limits = list(hide), limits or Limits()
    try:
        yield
    finally:
        _hidden, _limits = previous


def student_command(argv: list, work: Path) -> list:
    """`argv` (a process that runs the student's code, e.g. torchrun on their script) jailed with `work` as
    its only writable folder, while grading and where the machine allows it; as it is otherwise."""
    if _hidden is None or jail.available() is not None:
        return list(argv)
    return jail.wrap(list(argv), work=Path(work), hide=_hidden, limits=_limits)


def start_student(argv: list, work: Path, env: dict, **popen_kwargs):
    """processes.start(student_command(argv, work), ...) with `env` (added to the allow-listed environment);
    a `python -c` is forked from the zygote instead (zygote.popen), jailed while grading."""
    env = {**sealed(), "OMP_NUM_THREADS": "1", **env}
    if _hidden is None or jail.available() is not None:
        return zygote.popen(argv, None, (), None, env, work, **popen_kwargs)
    return zygote.popen(argv, work, _hidden, _limits, env, work, **popen_kwargs)


class _Link:
    def __init__(self, sandbox, graph: int, outputs: list):
        self.sandbox, self.graph, self.outputs = sandbox, graph, outputs


class _RemoteGrad(torch.autograd.Function):
    """The student's result, differentiable here: backward asks the sandbox for the input gradients."""

    @staticmethod
    def forward(ctx, link, *inputs):
        ctx.link, ctx.shapes = link, [t.shape for t in inputs]
        outputs = tuple(o.clone() for o in link.outputs)
        return outputs if len(outputs) > 1 else outputs[0]

    @staticmethod
    def backward(ctx, *grads):
        got = ctx.link.sandbox.request({"op": "backward", "graph": ctx.link.graph, "grads": list(grads)})
        if not isinstance(got, list) or len(got) != len(ctx.shapes) or any(
                g is not None and (not isinstance(g, torch.Tensor) or g.shape != s) for g, s in zip(got, ctx.shapes)):
            raise SandboxLost("the sandbox sent gradients of the wrong shape")
        return (None, *got)


class Sandbox:
    """One jailed answer process; `deadline` (time.monotonic()) bounds every request."""

    def __init__(self, folder: Path, hide=(), generation: int = 0):
        self.folder, self.generation, self.deadline = Path(folder), generation, math.inf
        self.work = self.folder / f"work{generation}"
        self.work.mkdir(mode=0o700)
        self.sent: dict = {}                          # id -> (number, obj): what the grader sent
        self.by_number: dict = {}
        self.seen: dict = {}                          # number -> how the object looked when both sides agreed
        # the allow-list of the grader's environment (grading.environment), never all of it: it may hold secrets
        env = sealed(dict(
            PYTHONPATH=os.pathsep.join(filter(None, [str(COURSE_ROOT), os.environ.get("PYTHONPATH")])),
            MPLBACKEND="Agg", IPYTHONDIR=str(self.work / ".ipython"), HOME=str(self.work),
            PYTHONDONTWRITEBYTECODE="1", TQDM_DISABLE="1", COURSE_DATA_DIR=str(data_root().resolve()),
            COURSE_CACHE_DIR=str(self.work / ".cache"),
            COURSE_PROGRESS="off"))      # a grade never writes (or reads) a learner's progress record
        argv = [sys.executable, "-c", "from course_lib.grading.answers import main; main()", str(self.work / "output.log")]
        _copy_cache(self.work / ".cache")
        self.errors = open(self.folder / f"sandbox{generation}.err", "w+b")   # the jail's own complaints
        if jail.available() is None:   # forked from the zygote, which has imported torch, or exec'd
            self.proc = zygote.popen(argv, self.work, hide, _limits, env, self.work, PIPE, PIPE, self.errors)
        else:
            self.proc = Popen(argv, stdin=PIPE, stdout=PIPE, stderr=self.errors, cwd=self.work, env=env,
                              start_new_session=True, preexec_fn=_limits.apply)
        self.inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        while True:
            try:
                self.inbox.put(wire.read_frame(self.proc.stdout))
            except BaseException as exc:  # noqa: BLE001 - EOF, a too-large frame: the sandbox is done
                self.inbox.put(exc)
                return

    def kill(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
        self.proc.wait()
        self.errors.close()

    def close(self) -> None:
        """Say goodbye, then kill whatever is left (the student may have started processes)."""
        try:
            self.proc.stdin.write(wire.to_sandbox({"op": "bye"}, {}))
            self.proc.stdin.flush()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - it is killed below either way
            pass
        self.kill()

    def output(self, limit: int = 4000) -> str:
        """The last `limit` characters the student's cells printed."""
        try:
            with open(self.work / "output.log", "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _lost(self, why: str) -> SandboxLost:
        self.kill()
        with open(self.errors.name, "rb") as f:
            complaint = f.read()[-500:].decode(errors="replace").strip()
        return SandboxLost(why + (f" ({complaint})" if complaint.startswith("jail:") else ""))

    def _looks(self, obj):
        if isinstance(obj, torch.Tensor):
            return obj._version, id(obj.grad), None if obj.grad is None else obj.grad._version, obj.requires_grad
        if isinstance(obj, torch.nn.Module):
            return {k: copy.copy(v) for k, v in vars(obj).items() if k == "training" or not k.startswith("_")}
        return None

    def raw(self, message: dict) -> dict:
        """Send `message`; the reply as a dict, its changes applied. SandboxLost on death or deadline.
        What the grader changed in objects it sent before goes along ("push"), so both sides agree."""
        push = [obj for number, obj in self.by_number.items() if self._looks(obj) != self.seen.get(number)]
        frame = wire.to_sandbox({**message, "push": push}, self.sent)
        for number, obj in self.sent.values():
            self.by_number[number] = obj
            self.seen[number] = self._looks(obj)
        try:
            self.proc.stdin.write(frame)
            self.proc.stdin.flush()
        except OSError:
            raise self._lost("the sandbox process is gone") from None
        try:
            reply = self.inbox.get(timeout=max(0.0, min(self.deadline - time.monotonic(), 1e6)))
        except queue.Empty:
            raise self._lost("the student's code ran past the time limit") from None
        if isinstance(reply, BaseException):
            raise self._lost(f"the sandbox process died ({type(reply).__name__})") from None
        try:
            reply = wire.from_sandbox(reply)
            if type(reply) is not dict:
                raise wire.ProtocolError("the reply is not a dict")
            self._sync(reply.get("sync", []))
        except (wire.ProtocolError, TypeError, ValueError, RuntimeError) as exc:
            raise self._lost(f"the sandbox sent a malformed reply: {exc}") from None
        return reply

    def request(self, message: dict):
        """`raw`, then the reply's value decoded (or the student's exception raised)."""
        reply = self.raw(message)
        if "error" in reply:
            raise _raised(reply)
        try:
            return wire.decode(reply.get("value"), self._remote)
        except wire.ProtocolError as exc:
            raise self._lost(f"the sandbox sent a malformed reply: {exc}") from None

    def call(self, target: Remote, args: tuple, kwargs: dict):
        reply = self.raw({"op": "call", "target": target, "args": args, "kwargs": kwargs,
                          "rng": torch.get_rng_state()})
        if "error" in reply:
            raise _raised(reply)
        rng = reply.get("rng")
        if isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8 and rng.shape == torch.get_rng_state().shape:
            torch.set_rng_state(rng)
        value = wire.decode(reply.get("value"), self._remote)
        if "graph" not in reply:
            return value
        inputs = [self.by_number.get(n) for n in reply.get("inputs", [])]
        outputs = list(value) if isinstance(value, (tuple, list)) else [value]
        if not inputs or not all(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs) or \
                not all(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outputs):
            return value
        linked = _RemoteGrad.apply(_Link(self, reply["graph"], outputs), *inputs)
        linked = linked if isinstance(linked, tuple) else (linked,)
        return linked[0] if not isinstance(value, (tuple, list)) else type(value)(linked)

    def run_cell(self, source: str) -> dict:
        return self.raw({"op": "cell", "source": source})

    def get(self, names) -> dict:
        """{name: value or Remote} for the names the sandbox has (absent names are left out)."""
        reply = self.raw({"op": "get", "names": list(names)})
        values = reply.get("values")
        if type(values) is not dict:
            raise self._lost("the sandbox sent a malformed reply to get")
        out = {}
        for name in names:
            value = values.get(name)
            if not (type(value) is tuple and len(value) == 3 and value[:2] == (wire.TAG, "missing")):
                out[name] = wire.decode(value, self._remote)
        return out

    def library(self, function: str, *args, **kwargs):
        """Call course_lib's `module:function` inside the sandbox (e.g. a launch of the student's ranks)."""
        return self.request({"op": "library", "function": function, "args": args, "kwargs": kwargs})

    def _remote(self, number: int, kind: str, name: str):
        if kind == "sent":
            if number not in self.by_number:
                raise wire.ProtocolError("the reply names an object the grader never sent")
            return self.by_number[number]
        return Remote(self, (self.generation, number), kind, name[:100])

    def _sync(self, changes) -> None:
        if type(changes) is not list:
            raise wire.ProtocolError("sync is not a list")
        for item in changes:
            number, change = item
            obj = self.by_number.get(number)
            if isinstance(obj, torch.Tensor) and type(change) is dict:
                data, grad = change.get("data"), change.get("grad")
                if not isinstance(data, torch.Tensor) or not (grad is None or isinstance(grad, torch.Tensor)):
                    raise wire.ProtocolError("a tensor's new state is not a tensor")
                with torch.no_grad():
                    if data.shape == obj.shape and data.dtype == obj.dtype:
                        obj.copy_(data)
                    else:
                        obj.data = data
                if grad is None or (grad.shape == obj.shape and grad.dtype == obj.dtype):
                    obj.grad = grad
                if type(change.get("requires_grad")) is bool and obj.is_leaf:   # e.g. a frozen layer
                    obj.requires_grad_(change["requires_grad"])
            elif isinstance(obj, torch.nn.Module) and type(change) is dict:
                attributes = wire.decode(change.get("attributes", {}), _no_handles)
                for key, value in attributes.items() if type(attributes) is dict else ():
                    old = vars(obj).get(key)
                    if type(key) is str and key in vars(obj) and type(value) is type(old):
                        setattr(obj, key, value)
            self.seen[number] = self._looks(obj)


def _copy_cache(folder: Path) -> None:
    """The practicum's cached given model, copied where the sandbox (perhaps user nobody) can read it."""
    folder.mkdir()
    for path in cache_dir().glob("make_it_small_*.pt"):
        shutil.copyfile(path, folder / path.name)


def _no_handles(*_):
    raise wire.ProtocolError("a module attribute is not plain data")
