"""Checks for solutions/08_multi_node_exercises.ipynb: ranks across nodes, atomic checkpoints.

The rank check compares with torchrun's layout (node blocks of nproc_per_node consecutive ranks,
every rank exactly once). The checkpoint check simulates a crash in the middle of `torch.save`
(it writes a few bytes, then raises) and looks at what is left on disk.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from . import expect, passed


def check_rank_and_world_size(rank_and_world_size) -> None:
    """(node_rank, local_rank, nproc_per_node, nnodes) -> (RANK, WORLD_SIZE), as torchrun assigns them."""
    for nnodes, nproc in ((1, 1), (1, 4), (2, 1), (2, 4), (3, 8)):
        seen = []
        for node in range(nnodes):
            for local in range(nproc):
                got = rank_and_world_size(node, local, nproc, nnodes)
                expect(isinstance(got, tuple) and len(got) == 2,
                       f"return a pair (rank, world_size); got {got!r}")
                rank, world = got
                expect(world == nnodes * nproc,
                       f"{nnodes} node(s) x {nproc} process(es) per node: world_size should be {nnodes * nproc}, "
                       f"got {world}. Hint: every process on every node is one rank.")
                expect(0 <= rank < world, f"node_rank={node}, local_rank={local}, nproc_per_node={nproc}, "
                       f"nnodes={nnodes}: rank {rank} is outside [0, world_size={world}). Off by one?")
                seen.append(rank)
        expect(sorted(seen) == list(range(nnodes * nproc)),
               f"nnodes={nnodes}, nproc_per_node={nproc}: the ranks are not 0..{nnodes * nproc - 1} exactly once "
               f"each; got {sorted(seen)}")
    rank, _ = rank_and_world_size(1, 0, 4, 2)
    expect(rank == 4, f"node 1, local rank 0 with 4 processes per node should be rank 4, got {rank}. torchrun "
           "gives each node a block of nproc_per_node consecutive ranks (node 0: 0-3, node 1: 4-7); did you "
           "swap node_rank and local_rank?")
    rank, _ = rank_and_world_size(2, 3, 8, 3)
    expect(rank == 19, f"node 2, local rank 3, 8 per node should be rank 2*8+3 = 19, got {rank}")
    for bad in ((0, 4, 4, 2), (2, 0, 4, 2), (0, -1, 4, 2), (-1, 0, 4, 2)):
        try:
            rank_and_world_size(*bad)
        except ValueError:
            continue
        raise AssertionError(f"rank_and_world_size{bad} should raise ValueError: local_rank must be in "
                             "[0, nproc_per_node) and node_rank in [0, nnodes)")
    passed("rank_and_world_size")


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _save_recording_replace(atomic_save, path: Path, state) -> list[tuple[Path, Path]]:
    """atomic_save(path, state) with os.replace watched: the (src, dst) of every rename it made."""
    real_replace, replaced = os.replace, []

    def recording_replace(src, dst, *args, **kwargs):
        replaced.append((Path(src), Path(dst)))
        return real_replace(src, dst, *args, **kwargs)

    os.replace = recording_replace
    try:
        atomic_save(path, state)
    finally:
        os.replace = real_replace
    return replaced


def _expect_clean_save(path: Path, state, replaced) -> None:
    """After a save that did not crash: only the checkpoint is left, it loads back, the rename stayed in its folder."""
    expect(path.is_file(), f"atomic_save(path, state) did not create {path.name}. Hint: write a temporary "
           "file, then os.replace(temporary, path).")
    expect(_files(path.parent) == ["last.pt"], f"after a successful save the folder should hold only last.pt; "
           f"found {_files(path.parent)}. Did the temporary file get renamed onto the path?")
    loaded = torch.load(path, weights_only=True)
    expect(loaded["step"] == state["step"] and torch.equal(loaded["w"], state["w"]), "the saved file does not "
           "load back as the state that was saved (torch.load(path, weights_only=True))")
    for src, dst in replaced:
        expect(src.parent.resolve() == dst.parent.resolve(), f"the temporary file {src} is not in the "
               "checkpoint's folder: os.replace is only atomic (or even possible) within one file system. "
               "Hint: tempfile.mkstemp(dir=path.parent).")


def _crashing_save(obj, f, *args, **kwargs):
    """Stands in for torch.save: writes a few bytes to `f`, then fails as a full disk or a lost node would."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as handle:
            handle.write(b"PARTIAL")
    else:
        f.write(b"PARTIAL")
        f.flush()
    raise RuntimeError("simulated crash in the middle of torch.save (disk full, node lost)")


def _save_with_crash(atomic_save, path: Path, state) -> None:
    """atomic_save(path, state) while torch.save crashes mid-write; the crash must reach the caller."""
    real_save = torch.save
    torch.save = _crashing_save
    try:
        atomic_save(path, state)
    except RuntimeError as exc:
        expect("simulated crash" in str(exc), f"the save failed with an unexpected error: {exc}")
    else:
        raise AssertionError("torch.save raised during atomic_save, but atomic_save returned normally: let "
                             "the error propagate (after cleaning up) so the caller knows no checkpoint was written")
    finally:
        torch.save = real_save


def _expect_survived_crash(path: Path, old_step: int) -> None:
    """After the crash: the old checkpoint is still there, whole, and no temporary file is left."""
    expect(path.is_file(), "the crash during the write destroyed the old checkpoint: never write to the "
           "checkpoint path itself, write a temporary file and rename it over the path when complete")
    try:
        survivor = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - half a file does not unpickle
        survivor = {"step": None}
    expect(survivor["step"] == old_step, "after a crash mid-write the checkpoint on disk is not the old one: the "
           "new state was written in place (a reader would find half a file). Write to a temporary file first.")
    expect(_files(path.parent) == ["last.pt"], f"after the crash the folder holds {_files(path.parent)}: remove "
           "the temporary file when the write fails (try/except: unlink, then raise).")


def check_atomic_save(atomic_save) -> None:
    """atomic_save(path, state): a crash during the write leaves the old checkpoint and no temp file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "last.pt"
        old = {"step": 1, "w": torch.ones(3)}
        _expect_clean_save(path, old, _save_recording_replace(atomic_save, path, old))
        _save_with_crash(atomic_save, path, {"step": 2, "w": torch.zeros(3)})
        _expect_survived_crash(path, old_step=1)
        atomic_save(str(path), {"step": 3, "w": torch.full((3,), 3.0)})
        expect(torch.load(path, weights_only=True)["step"] == 3, "saving over an existing checkpoint (path "
               "given as a str) did not replace it")
    passed("atomic_save")
