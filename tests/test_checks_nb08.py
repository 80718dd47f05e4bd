"""The checks of exercise notebook 08 pass the reference solutions and fail stubs and wrong answers."""
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from course_lib.checks.nb08 import check_atomic_save, check_rank_and_world_size
from nbtools import ROOT, notebook_namespace

NS = notebook_namespace(ROOT / "solutions" / "08_multi_node_exercises.ipynb")


def stub(*args):
    raise NotImplementedError()


def test_reference_solutions_pass():
    check_rank_and_world_size(NS["rank_and_world_size"])
    check_atomic_save(NS["atomic_save"])


def test_stubs_fail():
    for check in (check_rank_and_world_size, check_atomic_save):
        with pytest.raises(NotImplementedError):
            check(stub)


def _validated(fn):
    def wrapped(node_rank, local_rank, nproc_per_node, nnodes):
        if not (0 <= local_rank < nproc_per_node and 0 <= node_rank < nnodes):
            raise ValueError("out of range")
        return fn(node_rank, local_rank, nproc_per_node, nnodes)
    return wrapped


@pytest.mark.parametrize("wrong", [
    _validated(lambda n, l, p, N: (l * N + n, N * p)),           # node and local rank swapped (interleaved)
    _validated(lambda n, l, p, N: (n * p + l + 1, N * p)),       # off by one: ranks start at 1
    _validated(lambda n, l, p, N: (n * p + l, N * p - 1)),       # world size off by one
    _validated(lambda n, l, p, N: (n * N + l, N * p)),           # node block sized by nnodes
    lambda n, l, p, N: (n * p + l, N * p),                       # right numbers, no input check
], ids=["swapped", "rank-plus-one", "world-minus-one", "block-by-nnodes", "no-validation"])
def test_wrong_ranks_fail(wrong):
    with pytest.raises(AssertionError):
        check_rank_and_world_size(wrong)


def in_place(path, state):
    torch.save(state, path)


def temp_left_behind(path, state):
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)                      # no cleanup when this raises
    os.replace(tmp, path)


def never_renamed(path, state):
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    torch.save(state, tmp)


def swallows_error(path, state):
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except RuntimeError:
        tmp.unlink(missing_ok=True)


def temp_in_other_folder(path, state):
    with tempfile.TemporaryDirectory() as other:
        tmp = Path(other) / "ckpt.tmp"
        try:
            torch.save(state, tmp)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def copies_over(path, state):                   # a temporary file, but COPIED onto the path: not atomic
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        shutil.copyfile(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def moved_from_home_folder(path, state):         # shutil.move from another folder (a copy across file systems)
    fd, tmp = tempfile.mkstemp(suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        shutil.move(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def removes_then_renames(path, state):           # deletes the old checkpoint first: a crash leaves nothing
    path = Path(path)
    path.unlink(missing_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        tmp.rename(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@pytest.mark.parametrize("wrong, message", [
    (in_place, "never arrived by a rename"), (temp_left_behind, "remove the temporary file"),
    (never_renamed, "did not create"), (swallows_error, "returned normally"),
    (temp_in_other_folder, "not in the checkpoint's folder"), (copies_over, "never arrived by a rename"),
    (moved_from_home_folder, "not in the checkpoint's folder"), (removes_then_renames, "destroyed the old"),
])
def test_wrong_atomic_saves_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_atomic_save(wrong)


def test_equivalent_atomic_saves_pass():
    def named_temporary_file(path, state):       # NamedTemporaryFile + fsync + Path.replace
        path = Path(path)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
            try:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            except BaseException:
                f.close()
                os.unlink(f.name)
                raise
        Path(f.name).replace(path)

    def fixed_name_with_rename(path, state):    # a fixed temporary name beside the path, os.rename (POSIX)
        tmp = f"{path}.partial"
        try:
            torch.save(state, tmp)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        os.rename(tmp, path)
    check_atomic_save(named_temporary_file)
    check_atomic_save(fixed_name_with_rename)


def test_check_restores_torch_save_and_os_replace():
    real_save, real_replace = torch.save, os.replace
    with pytest.raises(AssertionError):
        check_atomic_save(in_place)
    assert torch.save is real_save and os.replace is real_replace
