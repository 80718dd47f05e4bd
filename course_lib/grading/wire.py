"""What crosses the trust boundary between the grader and the sandbox that runs a student's cells.

    frame = pack(payload)                    # 8-byte length + payload, both directions
    to_sandbox(message, sent)                # grader -> sandbox: pickle (the sandbox may unpickle our data)
    from_sandbox(payload, limit)             # sandbox -> grader: DATA ONLY, never a pickled student object

Grader -> sandbox is ordinary pickle: the sandbox is the untrusted side, so it may unpickle what
the grader sends. Two things are special. A `Remote` (a student object the grader holds a handle to)
travels as its handle number. A tensor, module or optimizer keeps one number for the whole session
(`sent`), so the sandbox keeps working on the same object across calls: tensors and modules travel by
value every time and are updated in place over there (what the grader changed in between arrives),
an optimizer the sandbox already has travels as its number only (it keeps its momentum between two
`train_step` calls; the grader's copy of its state is never newer).

Sandbox -> grader is `torch.save` bytes read back with `torch.load(weights_only=True)` (plain
containers, numbers, strings, tensors, dtypes, devices, sizes: no code), then checked node by node
by `decode`: only the exact types in DATA are accepted; a few tagged tuples stand for what pickling
by value cannot carry (a range, an iterator's items, a numpy value, a handle to a student object).
Whatever the student's code does to the sandbox, the worst it can send is wrong data.
"""
from __future__ import annotations

import collections
import io
import pickle
import struct

import torch

MAX_FRAME = 512 * 2**20          # bytes: larger answers are refused, not loaded
MAX_NODES = 2_000_000             # values in one reply
TAG = "\x00course-grading-tag"    # first item of a tagged tuple (the sandbox escapes student tuples that start so)
DATA = (type(None), bool, int, float, complex, str, bytes, torch.Tensor, torch.nn.Parameter, torch.dtype,
        torch.device, torch.Size)
TRACKED = (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)   # sent by reference after the first time


class ProtocolError(Exception):
    """The sandbox sent something that is not a well-formed reply (its process is then killed)."""


def pack(payload: bytes) -> bytes:
    return struct.pack("<Q", len(payload)) + payload


def read_frame(stream, limit: int = MAX_FRAME) -> bytes:
    header = stream.read(8)
    if len(header) != 8:
        raise EOFError("the stream ended")
    size = struct.unpack("<Q", header)[0]
    if size > limit:
        raise ProtocolError(f"a reply of {size:,} bytes is over the {limit:,}-byte limit")
    payload = stream.read(size)
    if len(payload) != size:
        raise EOFError("the stream ended inside a frame")
    return payload


# --- grader -> sandbox ----------------------------------------------------------------------------

class _Pickler(pickle.Pickler):
    """Pickle that sends handles by number and tracked objects with their session number."""

    def __init__(self, file, sent: dict):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.sent, self.fresh, self._inside, self._keep = sent, [], set(), []

    def _plain(self, obj):
        """`obj` pickled as itself, untracked (a tensor's data or .grad)."""
        if obj is not None:
            self._inside.add(id(obj))
            self._keep.append(obj)          # alive until the dump ends, so its id is not reused
        return obj

    def persistent_id(self, obj):
        handle = getattr(type(obj), "_course_handle", None)
        if handle is not None:
            return ("handle", handle(obj))
        if not isinstance(obj, TRACKED) or id(obj) not in self.sent or id(obj) in self._inside:
            return None
        number = self.sent[id(obj)][0]
        if isinstance(obj, torch.Tensor):
            return ("tensor", number, self._plain(obj.detach()), self._plain(obj.grad), obj.requires_grad)
        if isinstance(obj, torch.nn.Module):
            return ("module", number, vars(obj))     # its tensors and submodules update theirs over there
        return ("sent", number)                      # an optimizer: the sandbox's copy is the newer one

    def reducer_override(self, obj):
        if not isinstance(obj, TRACKED) or id(obj) in self._inside:
            return NotImplemented            # the second visit pickles the object itself
        self._inside.add(id(obj))
        number = len(self.sent) + len(self.fresh)
        self.fresh.append((number, obj))
        grad = self._plain(obj.grad) if isinstance(obj, torch.Tensor) else None   # pickling drops .grad
        return _adopt, (number, obj, grad)


ADOPTED: dict = {}   # (in the sandbox) the grader's number -> our copy of its tensor / module / optimizer
SEEN: list = []      # (in the sandbox) numbers of the grader's objects in the message being read


def _adopt(number: int, obj, grad=None):
    """Runs in the sandbox while unpickling: remember the grader's object under its number."""
    if grad is not None:
        obj.grad = grad
    SEEN.append(number)
    ADOPTED[number] = obj
    return obj


def to_sandbox(message, sent: dict) -> bytes:
    """`message` pickled into a frame; newly tracked objects are recorded in `sent` (id -> (number, obj))."""
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, sent)
    try:
        pickler.dump(message)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(f"cannot send this argument to the student's code: {exc}") from None
    for number, obj in pickler.fresh:
        sent[id(obj)] = (number, obj)      # holding obj keeps its id from being reused
    return pack(buffer.getvalue())


# --- sandbox -> grader ----------------------------------------------------------------------------

def from_sandbox(payload: bytes):
    """torch.load(weights_only=True) of a reply: containers of DATA only, no code."""
    try:
        return torch.load(io.BytesIO(payload), weights_only=True, map_location=None)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the reply is unusable
        raise ProtocolError(f"the reply is not plain data: {str(exc)[:300]}") from None


def decode(value, make_handle, _count=None, _depth=0):
    """The reply's `value` with tags resolved; ProtocolError for any type outside DATA and containers.
    `make_handle(number, kind, name)` turns a handle tag into the grader's proxy for that object."""
    count = _count if _count is not None else [0]
    count[0] += 1
    if count[0] > MAX_NODES or _depth > 200:
        raise ProtocolError("the reply is too large or too deeply nested")
    kind = type(value)
    if kind in DATA:
        return value
    if kind is list:
        return [decode(v, make_handle, count, _depth + 1) for v in value]
    if kind in (set, frozenset):
        return kind(decode(v, make_handle, count, _depth + 1) for v in value)
    if kind in (dict, collections.OrderedDict):
        return kind((decode(k, make_handle, count, _depth + 1), decode(v, make_handle, count, _depth + 1))
                    for k, v in value.items())
    if kind is tuple:
        if len(value) == 3 and value[0] == TAG and type(value[1]) is str:
            return _untag(value[1], value[2], make_handle, count, _depth)
        return tuple(decode(v, make_handle, count, _depth + 1) for v in value)
    raise ProtocolError(f"the reply holds a {kind.__name__}, which is not plain data")


def _untag(tag: str, payload, make_handle, count, depth):
    if tag == "tuple":          # a student tuple that starts with TAG, escaped
        return tuple(decode(v, make_handle, count, depth + 1) for v in payload)
    if tag == "range" and type(payload) is tuple and len(payload) == 3 and all(type(v) is int for v in payload):
        return range(*payload)
    if tag == "iterator" and type(payload) is list:
        return iter([decode(v, make_handle, count, depth + 1) for v in payload])
    if tag == "ndarray" and isinstance(payload, torch.Tensor):
        return payload.numpy()
    if tag == "sent" and type(payload) is int:      # one of the grader's own objects, returned
        return make_handle(payload, "sent", "")
    if tag == "handle" and type(payload) is tuple and len(payload) == 3 and type(payload[0]) is int \
            and all(type(v) is str for v in payload[1:]):
        return make_handle(*payload)
    raise ProtocolError(f"the reply holds an unknown tag {tag!r}")


def encode(value, handle, _depth=0):
    """(In the sandbox) `value` as plain data, with a handle (`handle(obj) -> tagged tuple`) for the rest."""
    import numpy as np
    kind = type(value)
    if _depth > 100:
        return handle(value)
    if kind in DATA:
        return value.detach() if isinstance(value, torch.Tensor) and value.requires_grad else value
    if isinstance(value, torch.Tensor):                  # a subclass: its data, as a plain tensor
        return value.detach().as_subclass(torch.Tensor)
    if kind is list:
        return [encode(v, handle, _depth + 1) for v in value]
    if kind is tuple:
        items = tuple(encode(v, handle, _depth + 1) for v in value)
        return (TAG, "tuple", items) if items[:1] == (TAG,) else items
    if kind in (dict, collections.OrderedDict, collections.defaultdict) and all(_plain_key(k) for k in value):
        return (collections.OrderedDict if kind is collections.OrderedDict else dict)(
            (k, encode(v, handle, _depth + 1)) for k, v in value.items())
    if kind in (set, frozenset) and all(_plain_key(v) for v in value):
        return value
    if kind is range:
        return (TAG, "range", (value.start, value.stop, value.step))
    if isinstance(value, np.ndarray) and value.dtype != object:
        return (TAG, "ndarray", torch.from_numpy(np.ascontiguousarray(value)).clone())
    if isinstance(value, np.generic) and not isinstance(value, np.object_):
        return value.item()
    return handle(value)


def _plain_key(key) -> bool:
    return type(key) in (type(None), bool, int, float, str, bytes) or (
        type(key) is tuple and all(_plain_key(k) for k in key))
