"""GPU results recorded once and shipped, so that a room without a GPU sees what the GPU cells show.

Where CUDA is present, a lecture keeps what its GPU cells print, and the numbers its pictures draw:

    rec = recorded.Recorder("04_single_gpu")
    with rec.cell("bandwidth"):
        print(...)                     # shown as usual, and kept
    rec.put("rates", rates)            # numbers for a picture
    rec.save()                         # $COURSE_RECORD_DIR/04_single_gpu.json; nothing when it is unset

Where it is not, the same cell shows the recording that ships in this folder:
`recorded.show("04_single_gpu", "bandwidth")` prints it under a line naming the GPU, the date and
the versions it was measured with, and `recorded.values(...)` returns the numbers (or None).
A missing recording is a printed note, never an error: a lecture must not stop in front of a class.
To re-record on a GPU: `COURSE_RECORD_DIR=course_lib/recorded` while the lecture runs
(`tools/gpu_check.sh` does this).
"""
from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import platform
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ENV_VAR = "COURSE_RECORD_DIR"


def _check_name(what: str, name) -> str:
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ValueError(f"{what} must be a plain name such as '04_single_gpu'; got {name!r}")
    return name


def machine() -> dict:
    """What a recording was measured on: the device, the date and the versions."""
    from .. import __version__
    from ..env import quick_mode

    cuda = torch.cuda.is_available()
    return {"device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None, "python": platform.python_version(),
            "course_lib": __version__, "quick": quick_mode()}


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


class Recorder:
    """Keeps one lecture's printed GPU output (by cell name) and numbers; `save` writes them as JSON."""

    def __init__(self, lecture: str):
        self.lecture = _check_name("lecture", lecture)
        self.meta = machine()
        self.cells: dict[str, str] = {}
        self.values: dict = {}

    @contextlib.contextmanager
    def cell(self, name: str):
        """Print as usual inside the block; the text is also kept under `name`."""
        _check_name("name", name)
        buffer = io.StringIO()
        with contextlib.redirect_stdout(_Tee(sys.stdout, buffer)):
            yield
        self.cells[name] = buffer.getvalue()

    def put(self, name: str, value) -> None:
        """Keep `value` (anything JSON can hold: numbers, lists, dicts of them) under `name`."""
        json.dumps(value)   # fail here, naming nothing later, if it cannot be stored
        self.values[_check_name("name", name)] = value

    def save(self, folder=None) -> Path | None:
        """Write LECTURE.json into `folder` (default: $COURSE_RECORD_DIR); None and no file if neither is set."""
        folder = folder or os.environ.get(ENV_VAR)
        if not folder:
            return None
        path = Path(folder) / f"{self.lecture}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"lecture": self.lecture, "meta": self.meta, "cells": self.cells,
                                   "values": self.values}, indent=1) + "\n")
        os.replace(tmp, path)
        return path


def load(lecture: str, folder=None) -> dict | None:
    """The recording of `lecture` (the shipped one unless `folder` is given), or None if there is none."""
    path = Path(folder or HERE) / f"{_check_name('lecture', lecture)}.json"
    return json.loads(path.read_text()) if path.exists() else None


def label(record: dict) -> str:
    """One line naming where and when a recording was made."""
    m = record["meta"]
    cuda = f", CUDA {m['cuda']}" if m.get("cuda") else ""
    mode = ", quick mode" if m.get("quick") else ""
    data = f"; data: {m['data']}" if m.get("data") else ""
    return f"recorded on {m['device']}, {m['date']}, torch {m['torch']}{cuda}, course_lib {m['course_lib']}{mode}{data}"


def show(lecture: str, name: str, folder=None) -> bool:
    """Print the recorded output of cell `name` under its label; a note if none ships. True if shown."""
    record = load(lecture, folder)
    text = (record or {}).get("cells", {}).get(_check_name("name", name))
    if text is None:
        print(f"(No GPU recording of '{name}' ships with lecture {lecture}; run it on a GPU to see it.)")
        return False
    print(f"--- What this cell printed on a GPU ({label(record)}):")
    print(text.rstrip("\n"))
    return True


def values(lecture: str, name: str, folder=None):
    """The recorded numbers kept under `name` by `Recorder.put`, or None."""
    record = load(lecture, folder)
    return (record or {}).get("values", {}).get(_check_name("name", name))
