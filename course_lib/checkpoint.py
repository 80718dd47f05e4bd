"""Checkpoints that survive a crash mid-write and load without running pickled code.

A checkpoint is written to a temporary file in the same folder and renamed over the old one:
`os.replace` is atomic on POSIX and Windows, so a reader (or a restarted job) sees either the
old file or the new one, never half of one. Loading uses `weights_only=True`, which refuses
arbitrary pickled objects, so store tensors, numbers, strings, lists and dicts only.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


def save_checkpoint(path, state: dict) -> Path:
    """Atomically write `state` (a dict of tensors/state_dicts/plain values) to `path`."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict; got {type(state).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path, map_location="cpu") -> dict:
    """Load a checkpoint written by `save_checkpoint` (weights_only: no code is unpickled)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location=map_location, weights_only=True)
