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


def _crashing_save(obj, f, *args, **kwargs):
    """Stands in for torch.save: writes a few bytes to `f`, then fails as a full disk or a lost node would."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as handle:
            handle.write(b"PARTIAL")
    else:
        f.write(b"PARTIAL")
        f.flush()
    raise RuntimeError("simulated crash in the middle of torch.save (disk full, node lost)")


def _step_on_disk(path: Path):
    try:
        return torch.load(path, weights_only=True)["step"]
    except Exception:  # noqa: BLE001 - half a file does not unpickle
        return None


def save_probe(atomic_save) -> dict:
    """Run atomic_save three times in a fresh folder (a clean save, one where torch.save crashes mid-write, one
    over an existing file with a str path) and report, as plain data, what it renamed and what was left on disk.
    Runs where the learner's function lives (in the grading sandbox when graded), so the patches reach it."""
    real_save, real_replace, real_rename, renames = torch.save, os.replace, os.rename, []

    def recording(real):
        def rename(src, dst, *args, **kwargs):
            renames.append((str(Path(src).resolve().parent), str(Path(dst).resolve())))
            return real(src, dst, *args, **kwargs)
        return rename

    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp).resolve() / "last.pt"
        os.replace, os.rename = recording(real_replace), recording(real_rename)
        try:
            atomic_save(path, {"step": 1, "w": torch.ones(3)})
        finally:
            os.replace, os.rename = real_replace, real_rename
        loaded = torch.load(path, weights_only=True) if path.is_file() else {}
        report["clean"] = {"exists": path.is_file(), "files": _files(path.parent), "renames": renames,
                           "path": str(path), "loads": loaded.get("step") == 1 and torch.equal(loaded.get("w"),
                                                                                                 torch.ones(3))}
        if not report["clean"]["exists"]:
            return report
        torch.save, error = _crashing_save, None
        try:
            atomic_save(path, {"step": 2, "w": torch.zeros(3)})
        except Exception as exc:  # noqa: BLE001 - which error reached the caller is the answer
            error = f"{type(exc).__name__}: {exc}"
        finally:
            torch.save = real_save
        report["crash"] = {"error": error, "exists": path.is_file(), "step": _step_on_disk(path),
                           "files": _files(path.parent)}
        atomic_save(str(path), {"step": 3, "w": torch.full((3,), 3.0)})
        report["again"] = {"step": _step_on_disk(path)}
    return report


def judge_atomic_save(report: dict) -> None:
    """AssertionError naming the first mistake in `save_probe`'s report."""
    clean = report["clean"]
    expect(clean["exists"], "atomic_save(path, state) did not create last.pt. Hint: write a temporary file, then "
           "os.replace(temporary, path).")
    expect(clean["files"] == ["last.pt"], f"after a successful save the folder should hold only last.pt; found "
           f"{clean['files']}. Did the temporary file get renamed onto the path?")
    expect(clean["loads"], "the saved file does not load back as the state that was saved "
           "(torch.load(path, weights_only=True))")
    for src_folder, dst in clean["renames"]:
        expect(src_folder == str(Path(dst).parent), f"the temporary file was in {src_folder}, not in the "
               "checkpoint's folder: os.replace is only atomic (or even possible) within one file system. "
               "Hint: tempfile.mkstemp(dir=path.parent).")
    expect(any(dst == clean["path"] for _, dst in clean["renames"]),
           "the checkpoint never arrived by a rename (os.replace(temporary, path)): copying or writing the bytes "
           "onto the path is not atomic, a crash in the middle leaves half a file.")
    crash = report["crash"]
    expect(crash["error"] is not None, "torch.save raised during atomic_save, but atomic_save returned normally: "
           "let the error propagate (after cleaning up) so the caller knows no checkpoint was written")
    expect("simulated crash" in crash["error"], f"the save failed with an unexpected error: {crash['error']}")
    expect(crash["exists"], "the crash during the write destroyed the old checkpoint: never write to the "
           "checkpoint path itself, write a temporary file and rename it over the path when complete")
    expect(crash["step"] == 1, "after a crash mid-write the checkpoint on disk is not the old one: the new state "
           "was written in place (a reader would find half a file). Write to a temporary file first.")
    expect(crash["files"] == ["last.pt"], f"after the crash the folder holds {crash['files']}: remove the "
           "temporary file when the write fails (try/except: unlink, then raise).")
    expect(report["again"]["step"] == 3, "saving over an existing checkpoint (path given as a str) did not "
           "replace it")


def probe_atomic_save(atomic_save) -> dict:
    """`save_probe` where atomic_save lives: here, or in the grading sandbox (whose files the grader cannot see)."""
    from ..grading.remote import is_remote
    if is_remote(atomic_save):
        return atomic_save._sandbox.library("course_lib.checks.nb08:save_probe", atomic_save)
    return save_probe(atomic_save)


def check_atomic_save(atomic_save) -> None:
    """atomic_save(path, state): a crash during the write leaves the old checkpoint and no temp file."""
    judge_atomic_save(probe_atomic_save(atomic_save))
    passed("atomic_save")
