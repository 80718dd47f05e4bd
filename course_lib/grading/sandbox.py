"""The guarded child processes that run a "Make it small" answer (for course_lib.grading.make_it_small).

    replies, printed = run_child("compress", {"code": code, "state": state_dict, **readable})

`run_child(role, request, later)` starts a fresh Python (python -c _CHILD role, forked from the
zygote that imported torch where the machine allows: course_lib.grading.zygote) in a session of its
own, one thread (OMP_NUM_THREADS=1: a busy grading machine then slows
it down least), in a private temporary folder, and talks to it in frames (8-byte length +
torch.save bytes, loaded with weights_only) on its stdin/stdout; what the answer prints goes to a
log. The child execs the answer's code as __main__ and runs compress (on the state dict it was
sent) or decompress (twice, on the artifact; only then does it get the test images, never the
labels, and it returns the logits of both models). Limits: SECONDS per role (then the whole
process tree is killed, course_lib.processes.kill_tree), MAX_ARTIFACT_BYTES per artifact.

Threat model. Before the answer's code runs, an audit hook (`sys.addaudithook`) refuses Python-level
opens of files other than `folders` and `files` (never under `denied`), any write, sockets, new
processes and gc's object lists (_BLOCKED): decompress cannot read the cached given model, a saved
model or any data, and compress cannot read the test set. An artifact carries no code and no pickled
classes (weights_only). Not defended: native code (ctypes, C extensions, torch's C++ readers such as
torch.from_file or torch.jit.load) bypasses audit hooks.
"""
from __future__ import annotations

import io
import linecache
import os
import queue
import re
import site
import struct
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path
from subprocess import PIPE

import torch
from torch import nn

import course_lib

from ..models import LeNet300
from ..processes import kill_tree
from .remote import start_student

SECONDS = {"compress": 60.0, "decompress": 45.0}   # together under the grader's 120 s per cell
MAX_ARTIFACT_BYTES = 64 * 2**20
PACKAGE = Path(course_lib.__file__).resolve().parent   # the imported course_lib: a clone, an install, --target
_CHILD = "from course_lib.grading.sandbox import _child; _child()"
_BLOCKED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.kill",
            "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.link", "os.symlink", "os.chmod",
            "shutil.", "gc.get_", "urllib.", "http.", "ftplib.", "smtplib.", "pty.")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def python_folders() -> list[str]:
    """Where Python, its packages, torch and course_lib live: what the answer's code may read (real paths).

    PYTHONPATH's folders count too (packages installed with pip --target live there), except the
    course's own folder and those above it: they hold solutions/ and its hidden tests. `denied`
    (the test set) still wins over any of them.
    """
    course = os.path.join(str(PACKAGE.parent), "")
    extra = [os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    folders = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, str(PACKAGE), os.devnull,
               *site.getsitepackages(), site.getusersitepackages(), str(Path(torch.__file__).parent.parent),
               *(p for p in extra if not course.startswith(os.path.join(p, "")))}
    return [os.path.realpath(p) for p in folders]


def load_artifact(blob: bytes) -> dict:
    """The artifact as decompress will get it (torch.load, weights_only); ValueError saying why it cannot be."""
    if len(blob) > MAX_ARTIFACT_BYTES:
        raise ValueError(f"{len(blob):,} bytes is over the {MAX_ARTIFACT_BYTES:,} limit")
    try:
        artifact = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch says which global it refused
        why = re.search(r"WeightsUnpickler error: (.*?)(?: Please use|\n|$)", str(exc))
        why = why.group(1) if why else str(exc)[:300]
        raise ValueError(f"torch.load(weights_only=True) refused it: {why}") from None
    if not isinstance(artifact, dict):
        raise ValueError(f"compress must return a dict; it returned a {type(artifact).__name__}")
    return artifact


def describe(artifact: dict) -> list:
    """(key, what it is, storage bytes) per value stored in `artifact` (a view's storage counts once)."""
    contents: list = []

    def walk(prefix, value):
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, (torch.Tensor, dict, list, tuple))
                                                      for v in value):
            for i, item in enumerate(value):
                walk(f"{prefix}[{i}]", item)
        elif isinstance(value, torch.Tensor):   # torch.save writes a view's whole storage, once
            storage = value.untyped_storage()
            contents.append((prefix, f"{str(value.dtype).removeprefix('torch.')} {list(value.shape)}",
                             0 if storage.data_ptr() in seen else storage.nbytes()))
            seen.add(storage.data_ptr())
        else:
            contents.append((prefix, f"{type(value).__name__} (size of its repr)", len(repr(value))))
    seen: set = set()
    walk("", artifact)
    return contents


def _frame(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return struct.pack("<Q", len(buffer.getvalue())) + buffer.getvalue()


def _receive(stream) -> dict:
    header = stream.read(8)
    size = struct.unpack("<Q", header)[0] if len(header) == 8 else -1
    payload = stream.read(size) if size >= 0 else b""
    if size < 0 or len(payload) != size:
        raise EOFError("the stream ended")
    return torch.load(io.BytesIO(payload), weights_only=True)


def _pump(stream) -> queue.Queue:
    """A queue that a daemon thread fills with the frames read from `stream`, then the exception that ended it."""
    inbox: queue.Queue = queue.Queue()

    def pump():
        while True:
            try:
                inbox.put(_receive(stream))
            except Exception as exc:  # noqa: BLE001 - EOF or garbage: the child is gone
                inbox.put(exc)
                return
    threading.Thread(target=pump, daemon=True).start()
    return inbox


def run_child(role: str, request: dict, later=()) -> tuple[list, str]:
    """Start a child for `role`, send `request`, and each of `later` after each reply; (replies, printed output).
    Stops at the first reply with an "error"; a child that dies or runs past SECONDS[role] becomes one.
    The child and everything it started are killed before this returns."""
    if role not in SECONDS:
        raise ValueError(f"role must be one of {sorted(SECONDS)}; got {role!r}")
    deadline, replies = time.monotonic() + SECONDS[role], []
    env = {"PYTHONDONTWRITEBYTECODE": "1", "TQDM_DISABLE": "1",   # start_student adds OMP_NUM_THREADS=1
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix=f"make_it_small_{role}_") as tmp, open(Path(tmp) / "log", "w+b") as log:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor")    # made now: the child may not mkdir
        (Path(tmp) / "inductor" / "dynamo").mkdir(parents=True)
        proc = start_student([sys.executable, "-c", _CHILD, role], Path(tmp), env, stdin=PIPE, stdout=PIPE, stderr=log)
        inbox = _pump(proc.stdout)
        try:
            for message in [request, *later]:
                proc.stdin.write(_frame(message))
                proc.stdin.flush()
                reply = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
                if isinstance(reply, Exception):
                    raise EOFError
                replies.append(reply)
                if "error" in reply:
                    break
        except queue.Empty:
            replies.append({"stage": role, "error": f"{role} did not finish within {SECONDS[role]:.0f} s"})
        except (EOFError, BrokenPipeError, OSError):
            proc.wait(timeout=10)
            replies.append({"stage": role, "error": f"the process running {role} exited (code {proc.returncode}) "
                                                    "before it answered; its last output is below"})
        finally:
            kill_tree(proc.pid)
            proc.wait()
            log.seek(max(0, log.seek(0, os.SEEK_END) - 4000))
            output = log.read().decode(errors="replace")
    return replies, output


def _guard(folders, files, denied) -> None:
    """An audit hook, for the rest of this process: read (or dlopen) only `files` and files under `folders`
    (but not under `denied`); no writes, sockets, processes or gc object lists. Its state lives in a closure."""
    folders, denied = tuple(os.path.join(f, "") for f in folders), tuple(os.path.join(d, "") for d in denied)
    files = frozenset(files)

    def readable(path) -> bool:
        real = os.path.realpath(os.fsdecode(path))
        return real in files or (not real.startswith(denied) and (real + os.sep).startswith(folders))

    def hook(event, args):
        if event == "open" and args[0] is not None and not isinstance(args[0], int):
            path, mode, flags = args
            if (isinstance(flags, int) and flags & _WRITE_FLAGS) or any(c in (mode or "") for c in "wax+"):
                raise PermissionError(f"the measuring process does not let your code write files ({path})")
            if not readable(path):
                raise PermissionError(f"the measuring process does not let your code read {path}")
        elif event == "ctypes.dlopen" and not (isinstance(args[0], (str, bytes)) and readable(args[0])):
            raise PermissionError(f"the measuring process does not let your code load the library {args[0]}")
        elif event.startswith(_BLOCKED):
            raise PermissionError(f"the measuring process does not let your code do {event}")
    sys.addaudithook(hook)


def _failure(stage: str, exc: BaseException) -> dict:
    """The error's last line first, then the traceback from the answer's first frame on."""
    text = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    first = next((i for i, line in enumerate(text) if "<answer cell>" in line), len(text) - 1)
    return {"stage": stage, "error": "\n".join(text[-1:] + ["traceback:"] + text[first:-1][-12:])}


def _predict(model, images) -> torch.Tensor:
    with torch.inference_mode():
        logits = torch.cat([model(images[i:i + 500]) for i in range(0, len(images), 500)])
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (len(images), 10):
        raise ValueError(f"the model must map images [N, 1, 28, 28] to logits [N, 10]; got {tuple(logits.shape)}")
    return logits.float()


def _child() -> None:
    """A measuring process: python -c _CHILD compress|decompress; frames on stdin/stdout, prints to stderr."""
    role, start = sys.argv[1], time.monotonic()
    inbox, outbox = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                                   # the student's prints go to the log, not the protocol
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    request = _receive(inbox)

    def send(reply: dict) -> None:
        for stream in (sys.stdout, sys.stderr):   # the answer's prints reach the log before the parent, which
            stream.flush()                        # kills this process once it has the reply, reads it
        outbox.write(_frame({**reply, "seconds": time.monotonic() - start}))
        outbox.flush()

    if role == "compress":
        model = LeNet300()
        model.load_state_dict(request["state"])
    _guard(request["folders"], request["files"], request["denied"])
    main = sys.modules["__main__"] = types.ModuleType("__main__")   # the student's classes pickle as __main__.X
    code = request["code"]
    linecache.cache["<answer cell>"] = (len(code), None, code.splitlines(True), "<answer cell>")   # for tracebacks
    try:
        exec(compile(code, "<answer cell>", "exec"), main.__dict__)
        if not callable(main.__dict__.get(role)):
            raise NameError(f"the answer cells define no function {role}")
        function = main.__dict__[role]
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyError included: all are the answer's faults
        return send(_failure("code", exc))
    if role == "compress":
        try:
            buffer = io.BytesIO()
            torch.save(function(model.eval()), buffer)
        except BaseException as exc:  # noqa: BLE001
            return send(_failure("compress", exc))
        return send({"artifact": buffer.getvalue()})
    models = []
    for _ in range(2):
        try:
            artifact = torch.load(io.BytesIO(request["artifact"]), weights_only=True, map_location="cpu")
            models.append(function(artifact))
            if not isinstance(models[-1], nn.Module):
                raise TypeError(f"decompress must return an nn.Module; it returned a {type(models[-1]).__name__}")
            models[-1].eval()
        except BaseException as exc:  # noqa: BLE001
            return send(_failure("decompress", exc))
    send({"ready": type(models[0]).__name__})
    images = _receive(inbox)["images"]
    try:
        logits = [_predict(m, images) for m in models]
    except BaseException as exc:  # noqa: BLE001
        return send(_failure("model", exc))
    send({"logits": logits[0], "same": torch.equal(logits[0], logits[1])})
