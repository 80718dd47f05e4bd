"""The checks of exercise notebook 08 pass the reference solutions and fail stubs and wrong answers."""
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


def asserts_instead(node_rank, local_rank, nproc_per_node, nnodes):
    assert 0 <= local_rank < nproc_per_node and 0 <= node_rank < nnodes
    return node_rank * nproc_per_node + local_rank, nnodes * nproc_per_node


def rejects_rank_zero(node_rank, local_rank, nproc_per_node, nnodes):   # 0 < local_rank: off by one in the bound
    if not (0 < local_rank < nproc_per_node and 0 <= node_rank < nnodes):
        raise ValueError("out of range")
    return node_rank * nproc_per_node + local_rank, nnodes * nproc_per_node


def upper_bound_inclusive(node_rank, local_rank, nproc_per_node, nnodes):  # local_rank == nproc_per_node passes
    if not (0 <= local_rank <= nproc_per_node and 0 <= node_rank <= nnodes):
        raise ValueError("out of range")
    return node_rank * nproc_per_node + local_rank, nnodes * nproc_per_node


@pytest.mark.parametrize("wrong, message", [
    (_validated(lambda n, l, p, N: (l * N + n, N * p)), "across the nodes first"),       # interleaved
    (_validated(lambda n, l, p, N: (n * p + l + 1, N * p)), "starts the ranks at 1"),
    (_validated(lambda n, l, p, N: (n * p + l, N * p - 1)), "world_size should be"),
    (_validated(lambda n, l, p, N: (n * N + l, N * p)), "sizes the node blocks by nnodes"),
    (_validated(lambda n, l, p, N: (n + l, N * p)), "adds node_rank and local_rank"),
    (_validated(lambda n, l, p, N: (l * p + n, N * p)), "torchrun's is"),               # a layout with no name
    (_validated(lambda n, l, p, N: [n * p + l, N * p]), "return a pair"),
    (_validated(lambda n, l, p, N: (n * p + l, N * p / 1)), "are ints"),
    (lambda n, l, p, N: (n * p + l, N * p), "should raise ValueError"),                  # no input check
    (asserts_instead, "raised AssertionError, not ValueError.*python -O"),
    (rejects_rank_zero, "raised ValueError .* although the input is valid"),
    (upper_bound_inclusive, "should raise ValueError"),
], ids=["swapped", "rank-plus-one", "world-minus-one", "block-by-nnodes", "sum", "other-layout", "list", "float",
        "no-validation", "assert", "rejects-zero", "inclusive-bound"])
def test_wrong_ranks_fail(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_rank_and_world_size(wrong)


@settings(max_examples=40)
@given(st.integers(1, 9), st.integers(1, 9))
def test_rank_solution_gives_each_node_a_block_of_consecutive_ranks(nnodes, nproc):
    ranks = [NS["rank_and_world_size"](n, l, nproc, nnodes) for n in range(nnodes) for l in range(nproc)]
    assert ranks == [(r, nnodes * nproc) for r in range(nnodes * nproc)]
    for bad in ((nnodes, 0), (-1, 0), (0, nproc), (0, -1)):
        with pytest.raises(ValueError):
            NS["rank_and_world_size"](*bad, nproc, nnodes)


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


def cleans_up_runtime_errors_only(path, state):  # a full disk raises OSError: the temporary file stays
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except RuntimeError:
        tmp.unlink(missing_ok=True)
        raise


def removes_old_after_writing(path, state):     # writes the temporary file, deletes the old one, then renames
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if path.exists():
        os.remove(path)                          # a crash here leaves no checkpoint at all
    os.rename(tmp, path)


def stamps_the_state(path, state):               # adds a key to the caller's dict
    state["saved_by"] = "atomic_save"
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def wraps_the_error(path, state):                # raises its own error instead of the one that happened
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise RuntimeError("checkpoint failed") from None


@pytest.mark.parametrize("wrong, message", [
    (in_place, "never arrived by a rename"), (temp_left_behind, "RuntimeError \\(crash\\).*remove the temporary"),
    (cleans_up_runtime_errors_only, "OSError \\(disk full\\).*remove the temporary file"),
    (removes_old_after_writing, "deleted the existing checkpoint"), (stamps_the_state, "changed the state dict"),
    (wraps_the_error, "raised another error: RuntimeError: checkpoint failed"),
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

    def through_the_descriptor(path, state):   # torch.save into the file mkstemp opened; Path.replace
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(state, f)
            Path(tmp).replace(path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    check_atomic_save(through_the_descriptor)


def test_check_restores_torch_save_and_os_functions():
    real = (torch.save, os.replace, os.rename, os.remove, os.unlink)
    with pytest.raises(AssertionError):
        check_atomic_save(in_place)
    assert (torch.save, os.replace, os.rename, os.remove, os.unlink) == real


@settings(max_examples=15)
@given(st.dictionaries(st.text("abcxyz_", min_size=1, max_size=6),
                       st.one_of(st.integers(-2**40, 2**40), st.floats(allow_nan=False),
                                 st.tuples(st.sampled_from([torch.float32, torch.float16, torch.int64, torch.bool]),
                                           st.lists(st.integers(0, 3), max_size=3))),   # (dtype, shape): a tensor
                       max_size=4))
def test_atomic_save_solution_saves_what_torch_save_saves(raw):
    state = {k: torch.ones(v[1], dtype=v[0]) if isinstance(v, tuple) else v for k, v in raw.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"
        NS["atomic_save"](path, state)
        loaded = torch.load(path, weights_only=True)
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["ckpt.pt"]
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], v) if torch.is_tensor(v) else loaded[k] == v for k, v in state.items())
