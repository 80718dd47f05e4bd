"""Checkpoints that reshard and survive a torn save: the 2-D ViT (dp x tp) saved with DCP, loaded anywhere.

A DCP checkpoint (`sharded_checkpoint`) is a folder of per-rank files plus `.metadata`, the map from
global tensor slices to files. The ViT trained on 4 ranks (`fsdp_tp`: dp 2 x tp 2) writes its 2-D shards;
2 ranks that only shard with FSDP read the slices they need from them, and so does one process with no
process group into a plain ViT: the layout of the ranks that wrote is not the layout of those that read.

Atomic steps. A job that dies in the middle of a save leaves some ranks' files and no `.metadata`, or
(worse, with a reused folder) new files beside the old metadata. So each save goes to `DIR/step_N.tmp/`;
`dcp.save` returns on every rank only after rank 0 wrote `.metadata` (its last step gathers every
rank's write results first); then, after a barrier, rank 0 renames the folder to `DIR/step_N/` (one
atomic rename on a POSIX file system) and syncs DIR. A reader takes the newest `step_N/` holding
`.metadata` (`latest_step`) and never looks at a `.tmp`; a later save of the same step first removes
the torn `.tmp` folder.

    from course_lib.distributed.reshard_checkpoint import reshard_demo, torn_save_demo
    reshard_demo("ckpt")        # saved on 4 ranks (dp 2 x tp 2), loaded on 2 (FSDP) and on 1: max differences
    torn_save_demo("ckpt2")     # rank 1 killed mid-save: step_2.tmp refused, step_1 loads exactly
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

from ..env import rank_device
from ..validate import int_in_range, positive_int
from ..vit import ViT
from .fsdp_tp import check_tp, parallelize_vit
from .sharded_checkpoint import METADATA, _gathered, app_state, check_checkpoint_dir, layout, load_plain, restore
from .sharding import shard_model

STEP = re.compile(r"step_(\d+)")


def step_dir(folder, step: int) -> Path:
    """DIR/step_N: where step N's checkpoint lies once complete."""
    return Path(folder) / f"step_{positive_int('step', step)}"


def latest_step(folder) -> Path | None:
    """The newest complete checkpoint in `folder`: the step_N/ with the largest N that holds `.metadata`;
    None when there is none. `.tmp` folders (a save in progress, or torn) are never taken."""
    done = [(int(m.group(1)), p) for p in Path(folder).glob("step_*")
            if (m := STEP.fullmatch(p.name)) and p.is_dir() and (p / METADATA).is_file()]
    return max(done)[1] if done else None


def save_step(folder, step: int, model, optimizer, storage_writer=None) -> Path:
    """Every rank calls it: DCP save to DIR/step_N.tmp/, then rank 0 renames it DIR/step_N/; returns that.

    storage_writer: DCP's writer for the .tmp folder (default FileSystemWriter; the torn-save demo's kills
    its rank mid-write). ValueError naming `step` if DIR/step_N/ already exists: a step is written once.
    """
    final = step_dir(folder, step)
    tmp = final.with_name(final.name + ".tmp")
    if final.exists():
        raise ValueError(f"step={step}: {final} already exists; a checkpoint step is written once")
    if dist.get_rank() == 0:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)      # a torn save of this step, from a job that died
    dist.barrier()
    dcp.save(app_state(model, optimizer), checkpoint_id=str(tmp), storage_writer=storage_writer)
    dist.barrier()                                  # every rank's files and rank 0's .metadata are on disk
    if dist.get_rank() == 0:
        check_checkpoint_dir(tmp)
        os.rename(tmp, final)
        fd = os.open(folder, os.O_RDONLY)           # the rename itself survives a power cut once DIR is synced
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    dist.barrier()
    return final


class _DieAfterWriting(dcp.FileSystemWriter):
    """FileSystemWriter that ends this process (os._exit, no cleanup) once its own files are written:
    a rank that dies in the middle of a save, after its data, before rank 0 could write `.metadata`."""

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()
        os._exit(1)


def _train_step(model, dp_index: int, batch: int = 8) -> None:
    g = torch.Generator().manual_seed(1000 + dp_index)     # the same batch on the ranks of one tp group
    images, labels = torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g)
    F.cross_entropy(model(images.to(rank_device())), labels.to(rank_device())).backward()


def _model_2d(tp: int):
    torch.manual_seed(0)
    model = parallelize_vit(ViT().to(rank_device()), tp)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _save_2d(rank: int, world_size: int, folder, tp: int, steps: int = 1, die_rank: int | None = None) -> dict:
    """Worker: the 2-D ViT (+ Adam) trains `steps` steps, saving after each (`save_step`).

    die_rank: that rank os._exits in the middle of the last save. Rank 0 returns the full weights after
    each step ({step: {name: array}}) and also writes them, gathered by FSDP (not read back through DCP),
    to DIR/weights_step_N.pt: the reference when the launch itself dies."""
    model, optimizer = _model_2d(tp)
    out = {"weights": {}, "saved": []}
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        _train_step(model, rank // tp)
        optimizer.step()
        weights = _gathered(model)
        if rank == 0:
            out["weights"][step] = weights
            torch.save({k: torch.from_numpy(v) for k, v in weights.items()}, Path(folder) / f"weights_step_{step}.pt")
        tmp = str(step_dir(folder, step)) + ".tmp"
        writer = _DieAfterWriting(tmp) if rank == die_rank and step == steps else None
        out["saved"].append(str(save_step(folder, step, model, optimizer, writer)))
    return out


def _load_fsdp(rank: int, world_size: int, path) -> dict:
    """Worker: a fresh FSDP-only ViT (+ Adam) on THIS world size restores `path`; rank 0 returns the full weights."""
    torch.manual_seed(1)                           # other weights than the saved ones: the load must overwrite them
    model = shard_model(ViT().to(rank_device()))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    restore(path, model, optimizer)
    return {"weights": _gathered(model),
            "shard_rows": {n: p.to_local().shape[0] for n, p in model.named_parameters() if n == "blocks.0.attn.q.weight"}}


def _max_diff(weights: dict, reference: dict) -> float:
    if list(weights) != list(reference):
        raise ValueError(f"different parameters: {sorted(set(weights) ^ set(reference))}")
    return max(float(abs(torch.as_tensor(weights[k]) - torch.as_tensor(reference[k])).max()) for k in reference)


def reshard_demo(folder, save_world: int = 4, tp: int = 2, load_worlds=(2, 1), timeout: float = 240) -> dict:
    """Save the 2-D ViT after one Adam step on `save_world` ranks (dp x `tp`), load it on each of `load_worlds`.

    A load world > 1 is FSDP only (dp = that world, no tp); 1 is this process, no process group, a plain
    ViT (`sharded_checkpoint.load_plain`). Returns a plain dict: "saved_on" {"world", "dp", "tp"},
    "checkpoint" (the step folder), "files" {file: bytes, one __<rank>_0.distcp per saving rank, and
    .metadata} and "bytes" (their sum; DCP writes a slice that tp ranks hold alike once), "loads" {world:
    max |loaded - saved| over every weight, 0.0 when exact}, "shard_rows" {world: rows of
    blocks.0.attn.q.weight on each rank there}.
    """
    from .launch import launch

    positive_int("save_world", save_world)
    check_tp(tp, save_world, ViT())
    Path(folder).mkdir(parents=True, exist_ok=True)
    saved = launch(_save_2d, save_world, folder, tp, timeout=timeout)[0]
    path = Path(saved["saved"][-1])
    weights = saved["weights"][1]
    files = {name: info["bytes"] for name, info in layout(path).items()}
    out = {"saved_on": {"world": save_world, "dp": save_world // tp, "tp": tp}, "checkpoint": str(path),
           "files": files, "bytes": sum(files.values()), "loads": {}, "shard_rows": {}}
    for world in load_worlds:
        positive_int("load_worlds", world)
        if world == 1:
            loaded = {k: v.numpy() for k, v in load_plain(path, "vit").state_dict().items()}
            rows = ViT().blocks[0].attn.q.weight.shape[0]
            out["shard_rows"][world] = [rows]
        else:
            ranks = launch(_load_fsdp, world, path, timeout=timeout)
            loaded = ranks[0]["weights"]
            out["shard_rows"][world] = [r["shard_rows"]["blocks.0.attn.q.weight"] for r in ranks]
        out["loads"][world] = _max_diff(loaded, weights)
    return out


def torn_save_demo(folder, world: int = 4, tp: int = 2, die_rank: int = 1, timeout: float = 240) -> dict:
    """One launch on `world` ranks (dp x `tp`): step 1 trained and saved, step 2 trained and saved while rank
    `die_rank` os._exits after writing its own shard, before `.metadata`. Returns a plain dict: "killed_rank",
    "crash" (the launcher's error, first line: the rank it names may be a peer whose collective broke when
    the killed rank's connection closed), "folder" (sorted entries of `folder`), "tmp_files" (files in the torn
    step_2.tmp), "latest" (what `latest_step` picks), "torn_refused" (the ValueError that loading the .tmp
    folder raises, or None if it loaded), "max_diff" (|step 1 loaded in one process - the weights FSDP
    gathered at step 1|, DIR/weights_step_1.pt).
    """
    from .launch import WorkerError, launch

    positive_int("world", world)
    check_tp(tp, world, ViT())
    int_in_range("die_rank", die_rank, 0, world - 1)
    Path(folder).mkdir(parents=True, exist_ok=True)
    crash = None
    try:
        launch(_save_2d, world, folder, tp, 2, die_rank, timeout=timeout)
    except (WorkerError, TimeoutError) as exc:
        crash = str(exc).splitlines()[0]
    torn = Path(folder) / "step_2.tmp"
    try:
        load_plain(torn, "vit")
        refused = None
    except ValueError as exc:
        refused = str(exc)
    latest = latest_step(folder)
    reference = torch.load(Path(folder) / "weights_step_1.pt", weights_only=True)
    loaded = load_plain(latest, "vit").state_dict() if latest else {}
    return {"killed_rank": die_rank, "crash": crash, "folder": sorted(p.name for p in Path(folder).iterdir()),
            "tmp_files": sorted(p.name for p in torn.iterdir()) if torn.is_dir() else [],
            "latest": latest.name if latest else None, "torn_refused": refused,
            "max_diff": _max_diff(loaded, reference) if latest else None}
