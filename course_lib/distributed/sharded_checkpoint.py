"""Checkpoints at scale: every rank writes its own shard (torch.distributed.checkpoint, "DCP").

`course_lib.checkpoint.Checkpointer` gathers the whole state to rank 0, which writes one file. Fine
for 21,840 parameters; at scale rank 0 would hold every parameter and optimizer state in its memory
and push them through one disk or network card while every other rank waits. DCP saves the state as
it lies: each rank writes its own shards to its own file (`__<rank>_0.distcp`), all at once, and rank 0
adds `.metadata`, the map of which slice of which tensor lies in which file. A load reads the slices a
rank needs, so a checkpoint written on N ranks loads on M ranks (resharding), or on one process into a
plain model. `dcp.async_save` copies the state to CPU memory ("staging") and writes it from a
background thread: training blocks only for the copy.

Trust: unlike `course_lib.checkpoint.load_checkpoint` (weights_only), reading a DCP folder unpickles its
`.metadata` and its non-tensor values with full pickle (torch 2.14's FileSystemReader.read_metadata and
DefaultLoadPlanner.load_bytes; tensors are read weights_only): load only checkpoints you trust.

    from course_lib.distributed.launch import launch
    from course_lib.distributed.sharded_checkpoint import layout, load_plain, save_and_time
    ranks = launch(save_and_time, 2, "ckpt")     # FSDP2 Net on 2 ranks: a DCP save, then async saves
    layout("ckpt/sync")                          # {file: {"bytes", "items"}}: one file per rank
    model = load_plain("ckpt/sync", "net")       # in this process, no process group: a plain Net
    launch(reshard, 3, "ckpt/sync", "ckpt3")     # the same checkpoint, restored and saved on 3 ranks
"""
from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)

from ..env import rank_device
from ..models import build_model
from ..validate import positive_int
from .sharding import shard_model

METADATA = ".metadata"      # written by rank 0 once every rank has written: no .metadata, no checkpoint


def app_state(model: nn.Module, optimizer) -> dict:
    """{"model": ..., "optim": ...} as this rank holds them: under FSDP2 its DTensor shards, not full tensors.

    get_state_dict keys the optimizer's state by parameter name ("conv1.weight"), not by position, so
    the checkpoint loads into another world size, or into a model wrapped another way.
    """
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def save(directory, model: nn.Module, optimizer, process_group=None):
    """Every rank calls it (a collective): each writes its own shards, rank 0 also `.metadata`."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ValueError(f"directory={str(directory)!r} is a file; a DCP checkpoint is a folder")
    return dcp.save(app_state(model, optimizer), checkpoint_id=str(path), process_group=process_group)


def restore(directory, model: nn.Module, optimizer) -> None:
    """Every rank calls it: each reads the slices of its own shards, whatever world size wrote them."""
    state = app_state(model, optimizer)        # the tensors to fill: DCP loads in place
    dcp.load(state, checkpoint_id=str(check_checkpoint_dir(directory)))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def load_plain(directory, model_name: str = "net") -> nn.Module:
    """On ONE process, no process group: the checkpoint's weights in a plain `build_model(model_name)`.

    Unpickles the folder's `.metadata` (see the module's docstring): a checkpoint you trust."""
    model = build_model(model_name)
    state = {"model": model.state_dict()}      # only these keys are read: the optimizer's stay on disk
    path = check_checkpoint_dir(directory)
    try:
        with warnings.catch_warnings():        # DCP warns that it loads in a single process: we mean it
            warnings.filterwarnings("ignore", message=".*single process")
            dcp.load(state, checkpoint_id=str(path), no_dist=True)
    except CheckpointException as exc:         # a BaseException, which `except Exception` would let through
        reason = str(exc).strip().splitlines()[-1]
        raise ValueError(f"directory={str(directory)!r} does not hold a {model_name!r} model: {reason}") from None
    model.load_state_dict(state["model"])      # DCP's documented last step (a state_dict() may hold copies)
    return model


def check_checkpoint_dir(directory) -> Path:
    """`directory` as a Path if it holds a finished DCP checkpoint; ValueError naming it otherwise."""
    path = Path(directory)
    if not (path / METADATA).is_file():
        what = ("does not exist" if not path.exists() else "is a file, not a folder" if not path.is_dir()
                else f"has no {METADATA} (an unfinished save, or a folder dcp.save did not write)")
        raise ValueError(f"directory={str(directory)!r} is not a DCP checkpoint: it {what}")
    return path


def layout(directory) -> dict[str, dict]:
    """{file name: {"bytes": size on disk, "items": {key: offsets of its slice, or None}}}, by name.

    Read from `.metadata`: e.g. "model.fc1.weight": (25, 0) is the slice that starts at row 25. Keys
    without offsets are plain values (learning rate, ...). `.metadata` itself holds no items.
    """
    path = check_checkpoint_dir(directory)
    files = {f.name: {"bytes": f.stat().st_size, "items": {}} for f in sorted(path.iterdir()) if f.is_file()}
    for index, info in dcp.FileSystemReader(str(path)).read_metadata().storage_data.items():
        offsets = tuple(index.offset) if index.offset is not None else None
        files[info.relative_path]["items"][index.fqn] = offsets
    return files


def _gathered(model: nn.Module) -> dict:
    """{name: numpy array} of the full weights, gathered to rank 0 (other ranks get {}): a collective.

    numpy, not tensors: a tensor that a worker returns lives in shared memory that ends with the worker."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {name: t.numpy() for name, t in full.items()}


def _batches(rank: int, steps: int, device, batch: int = 32) -> list:
    g = torch.Generator().manual_seed(100 + rank)       # each rank its own random MNIST-shaped batches
    return [(torch.randn(batch, 1, 28, 28, generator=g).to(device),
             torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in range(steps)]


def _step(model, optimizer, x, y) -> None:
    optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def save_and_time(rank: int, world_size: int, directory, steps: int = 1, async_saves: int = 2,
                  model_name: str = "net") -> dict:
    """Worker: FSDP2 `model_name` + Adam, `steps` steps, `save` to DIR/sync; then training with async saves.

    `async_saves` times: one step, then `dcp.async_save` to DIR/async_<i>, after waiting for the previous
    one (one write in flight at most: each holds a staged copy in memory); one more step runs while the
    last one writes. Async saves run their collectives on a process group of their own, so the background
    thread never interleaves them with training's all-gathers. Returns on every rank its seconds: "sync_s"
    (dcp.save) and per async save "blocked_s" (the wait for the previous write + the call) and "write_s"
    (call to future done); on rank 0 the full weights, gathered from the shards, at DIR/sync ("weights"),
    when the last async save was called ("async_weights") and at the end ("final").
    """
    positive_int("steps", steps)
    positive_int("async_saves", async_saves)
    directory, device = Path(directory), rank_device()
    torch.manual_seed(0)
    model = shard_model(build_model(model_name).to(device))   # rank 0's weights, then fully_shard per layer
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = _batches(rank, steps + async_saves + 1, device)
    for x, y in batches[:steps]:
        _step(model, optimizer, x, y)
    start = time.perf_counter()
    save(directory / "sync", model, optimizer)
    out = {"sync_s": time.perf_counter() - start, "weights": _gathered(model), "async": []}

    checkpoint_group = dist.new_group(backend="gloo")         # the background writes' own collectives
    pending = None
    for i, (x, y) in enumerate(batches[steps:-1]):
        _step(model, optimizer, x, y)
        start = time.perf_counter()
        if pending is not None:
            _wait(*pending)                                   # at most one save in flight
        called = time.perf_counter()
        future = dcp.async_save(app_state(model, optimizer), checkpoint_id=str(directory / f"async_{i}"),
                                process_group=checkpoint_group)
        timing, done = {"blocked_s": time.perf_counter() - start}, threading.Event()
        future.add_done_callback(lambda _, t=timing, c=called, d=done: (t.update(write_s=time.perf_counter() - c),
                                                                        d.set()))
        out["async"].append(timing)
        pending = future, done
    out["async_weights"] = _gathered(model)                   # what the last async save staged ...
    _step(model, optimizer, *batches[-1])                     # ... and training moves on while it writes
    _wait(*pending)
    out["final"] = _gathered(model)
    return out


def reshard(rank: int, world_size: int, source, target, model_name: str = "net") -> dict:
    """Worker: a fresh FSDP2 `model_name` + Adam on THIS world size `restore`s `source`, then `save`s to `target`.

    Returns {parameter name: shape of this rank's shard}: the same tensors, cut for `world_size` ranks.
    """
    model = shard_model(build_model(model_name).to(rank_device()))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    restore(source, model, optimizer)
    save(target, model, optimizer)
    return {name: list(p.to_local().shape) for name, p in model.named_parameters()}


def _wait(future, done: threading.Event) -> None:
    """Until the write is over and its done-callback has run (result() can return just before it)."""
    future.result()                                           # raises what the background write raised
    done.wait()
