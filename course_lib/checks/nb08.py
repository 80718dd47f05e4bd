"""Checks for solutions/08_multi_node_exercises.ipynb: ranks across nodes, atomic checkpoints.

The rank check compares with torchrun's layout (node blocks of nproc_per_node consecutive ranks,
every rank exactly once). The checkpoint check simulates a crash in the middle of `torch.save`
(it writes a few bytes, then raises) and looks at what is left on disk.
"""
from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

import torch

from . import expect, passed


LAYOUTS = [(1, 1), (1, 4), (2, 1), (2, 4), (3, 8), (4, 2), (2, 3)]   # (nnodes, nproc_per_node)

# Layouts learners write instead of torchrun's (rank = node_rank * nproc_per_node + local_rank), each named by what
# it does; a layout is named only when it gives the answer's rank on EVERY case (the layouts above separate them).
RANK_MISTAKES = [
    (lambda node, local, nproc, nnodes: local * nnodes + node, "numbers the ranks across the nodes first "
     "(local_rank * nnodes + node_rank: node 0 gets ranks 0, nnodes, 2*nnodes, ...); torchrun gives each node a "
     "block of nproc_per_node consecutive ranks: node_rank * nproc_per_node + local_rank"),
    (lambda node, local, nproc, nnodes: node * nnodes + local, "sizes the node blocks by nnodes; each node holds "
     "nproc_per_node ranks: node_rank * nproc_per_node + local_rank"),
    (lambda node, local, nproc, nnodes: node * nproc + local + 1, "starts the ranks at 1; they start at 0 (rank 0 "
     "is node 0's first process)"),
    (lambda node, local, nproc, nnodes: node + local, "adds node_rank and local_rank; node_rank counts whole nodes "
     "of nproc_per_node ranks each: node_rank * nproc_per_node + local_rank"),
]


def _call(rank_and_world_size, args: tuple):
    """The answer's result on valid input; a ValueError there is a mistake, not the check's failure."""
    try:
        return rank_and_world_size(*args)
    except ValueError as exc:
        raise AssertionError(f"rank_and_world_size{args} raised ValueError ({exc}) although the input is valid: "
                             "local_rank in [0, nproc_per_node) and node_rank in [0, nnodes) are allowed, 0 "
                             "included") from None


def check_rank_and_world_size(rank_and_world_size) -> None:
    """(node_rank, local_rank, nproc_per_node, nnodes) -> (RANK, WORLD_SIZE), as torchrun assigns them."""
    answers = {}
    for nnodes, nproc in LAYOUTS:
        for node in range(nnodes):
            for local in range(nproc):
                args = (node, local, nproc, nnodes)
                got = _call(rank_and_world_size, args)
                expect(isinstance(got, tuple) and len(got) == 2, f"return a pair (rank, world_size); got {got!r}")
                expect(all(isinstance(v, int) and not isinstance(v, bool) for v in got),
                       f"rank_and_world_size{args} = {got!r}: rank and world size are ints")
                answers[args] = got
    for args, (rank, world) in answers.items():
        node, local, nproc, nnodes = args
        expect(world == nnodes * nproc,
               f"{nnodes} node(s) x {nproc} process(es) per node: world_size should be {nnodes * nproc}, got "
               f"{world}. Every process on every node is one rank.")
        if rank != node * nproc + local:
            mistake = next((why for layout, why in RANK_MISTAKES
                            if all(layout(*a) == r for a, (r, _) in answers.items())), "")
            raise AssertionError(f"rank_and_world_size{args} (node_rank, local_rank, nproc_per_node, nnodes) gave rank "
                                 f"{rank}; torchrun's is {node * nproc + local}. " + (
                                     f"Your answer {mistake}." if mistake else
                                     "Node n holds the block of ranks n*nproc_per_node ... (n+1)*nproc_per_node - 1, "
                                     "local_rank the position in the block."))
    for bad in ((0, 4, 4, 2), (2, 0, 4, 2), (0, -1, 4, 2), (-1, 0, 4, 2), (1, 0, 1, 1), (0, 1, 1, 1)):
        try:
            rank_and_world_size(*bad)
        except ValueError:
            continue
        except Exception as exc:  # noqa: BLE001 - which error the answer raised is the answer
            why = " (an assert disappears under python -O)" if isinstance(exc, AssertionError) else ""
            raise AssertionError(f"rank_and_world_size{bad} raised {type(exc).__name__}, not ValueError: raise "
                                 f"ValueError{why}") from None
        raise AssertionError(f"rank_and_world_size{bad} should raise ValueError: local_rank must be in "
                             "[0, nproc_per_node) and node_rank in [0, nnodes)")
    passed("rank_and_world_size")


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _crashing_save(error: BaseException):
    """Stands in for torch.save: writes a few bytes to `f`, then raises `error`, as a full disk or a lost node."""
    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as handle:
                handle.write(b"PARTIAL")
        else:
            f.write(b"PARTIAL")
            f.flush()
        raise error
    return save


CRASHES = {   # how torch.save fails half-way: any error, not only one kind, must leave the old checkpoint
    "crash": RuntimeError("simulated crash in the middle of torch.save (node lost)"),
    "disk full": OSError(errno.ENOSPC, "No space left on device (simulated crash in the middle of torch.save)"),
}


def _step_on_disk(path: Path):
    try:
        return torch.load(path, weights_only=True)["step"]
    except Exception:  # noqa: BLE001 - half a file does not unpickle
        return None


@contextlib.contextmanager
def _recording_renames_and_removals(renames: list, removals: list):
    """os.replace / os.rename record (source folder, destination); os.remove / os.unlink (Path.unlink too) the
    files they delete."""
    saved = {name: getattr(os, name) for name in ("replace", "rename", "remove", "unlink")}

    def rename(real):
        def wrapper(src, dst, *args, **kwargs):
            renames.append((str(Path(src).resolve().parent), str(Path(dst).resolve())))
            return real(src, dst, *args, **kwargs)
        return wrapper

    def remove(real):
        def wrapper(target, *args, **kwargs):
            removals.append(str(Path(target).resolve()))
            return real(target, *args, **kwargs)
        return wrapper
    for name, real in saved.items():
        setattr(os, name, (rename if name in ("replace", "rename") else remove)(real))
    try:
        yield
    finally:
        for name, real in saved.items():
            setattr(os, name, real)


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k]
                                        for k in a)


def save_probe(atomic_save) -> dict:
    """Run atomic_save in a fresh folder: a clean save, then saves where torch.save fails half-way (each error of
    CRASHES), then one over the existing file with a str path; report, as plain data, what it renamed and removed
    and what was left on disk. Runs where the learner's function lives (in the grading sandbox when graded), so
    the patches reach it."""
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp).resolve() / "last.pt"
        state, renames, removals = {"step": 1, "w": torch.ones(3)}, [], []
        with _recording_renames_and_removals(renames, []):
            atomic_save(path, state)
        loaded = torch.load(path, weights_only=True) if path.is_file() else {}
        report["clean"] = {"exists": path.is_file(), "files": _files(path.parent), "renames": renames,
                           "path": str(path), "loads": _same_state(loaded, {"step": 1, "w": torch.ones(3)}),
                           "state_unchanged": _same_state(state, {"step": 1, "w": torch.ones(3)})}
        if not report["clean"]["exists"]:
            return report
        for name, crash in CRASHES.items():
            real_save, error = torch.save, None
            torch.save = _crashing_save(crash)
            try:
                atomic_save(path, {"step": 2, "w": torch.zeros(3)})
            except Exception as exc:  # noqa: BLE001 - which error reached the caller is the answer
                error = f"{type(exc).__name__}: {exc}"
            finally:
                torch.save = real_save
            report[name] = {"error": error, "exists": path.is_file(), "step": _step_on_disk(path),
                            "files": _files(path.parent)}
        with _recording_renames_and_removals([], removals):
            atomic_save(str(path), {"step": 3, "w": torch.full((3,), 3.0)})
        report["again"] = {"step": _step_on_disk(path), "removed_path": str(path) in removals}
    return report


def judge_atomic_save(report: dict) -> None:
    """AssertionError naming the first mistake in `save_probe`'s report."""
    clean = report["clean"]
    expect(clean["exists"], "atomic_save(path, state) did not create last.pt. Hint: write a temporary file, then "
           "os.replace(temporary, path).")
    expect(clean["files"] == ["last.pt"], f"after a successful save the folder should hold only last.pt; found "
           f"{clean['files']}. Did the temporary file get renamed onto the path?")
    expect(clean["state_unchanged"], "atomic_save changed the state dict it was given; only save it")
    expect(clean["loads"], "the saved file does not load back as the state that was saved "
           "(torch.load(path, weights_only=True))")
    for src_folder, dst in clean["renames"]:
        expect(src_folder == str(Path(dst).parent), f"the temporary file was in {src_folder}, not in the "
               "checkpoint's folder: os.replace is only atomic (or even possible) within one file system. "
               "Hint: tempfile.mkstemp(dir=path.parent).")
    expect(any(dst == clean["path"] for _, dst in clean["renames"]),
           "the checkpoint never arrived by a rename (os.replace(temporary, path)): copying or writing the bytes "
           "onto the path is not atomic, a crash in the middle leaves half a file.")
    for name, crash in CRASHES.items():
        _judge_crash(report[name], f"torch.save failed half-way with {type(crash).__name__} ({name})")
    expect(report["again"]["step"] == 3, "saving over an existing checkpoint (path given as a str) did not "
           "replace it")
    expect(not report["again"]["removed_path"], "atomic_save deleted the existing checkpoint (os.remove / unlink) "
           "before renaming the new one onto it: a crash between the two leaves no checkpoint at all. "
           "os.replace(temporary, path) replaces the old file in one step.")


def _judge_crash(crash: dict, what: str) -> None:
    expect(crash["error"] is not None, f"{what} during atomic_save, but atomic_save returned normally: let the "
           "error propagate (after cleaning up) so the caller knows no checkpoint was written")
    expect("simulated crash" in crash["error"], f"{what}, and atomic_save raised another error: {crash['error']}")
    expect(crash["exists"], f"{what}, and that destroyed the old checkpoint: never write to the checkpoint path "
           "itself, write a temporary file and rename it over the path when complete")
    expect(crash["step"] == 1, f"{what}, and the checkpoint on disk is not the old one: the new state was written "
           "in place (a reader would find half a file). Write to a temporary file first.")
    expect(crash["files"] == ["last.pt"], f"{what}, and the folder holds {crash['files']}: remove the temporary "
           "file whatever error the write raises (try/except BaseException: unlink, then raise).")


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
