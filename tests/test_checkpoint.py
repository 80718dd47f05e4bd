import pickle

import pytest
import torch

from course_lib import checkpoint
from course_lib.checkpoint import load_checkpoint, save_checkpoint


def test_round_trip(tmp_path):
    state = {"epoch": 3, "model": {"w": torch.arange(4.0)}, "rng": torch.get_rng_state()}
    save_checkpoint(tmp_path / "sub" / "last.pt", state)
    loaded = load_checkpoint(tmp_path / "sub" / "last.pt")
    assert loaded["epoch"] == 3 and torch.equal(loaded["model"]["w"], torch.arange(4.0))


def test_a_failed_write_leaves_the_old_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"epoch": 1})

    def crash(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(checkpoint.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"epoch": 2})
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


class Evil:
    def __reduce__(self):
        return (print, ("this code ran while loading",))


def test_loading_refuses_pickled_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"payload": Evil()}, path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(path)


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(TypeError, match="state must be a dict"):
        save_checkpoint(tmp_path / "x.pt", [1, 2])


def test_rng_state_round_trips_and_reads_the_old_format():
    from course_lib.checkpoint import rng_state, set_rng_state
    saved = rng_state("cpu")
    first = torch.rand(3)
    set_rng_state(saved, "cpu")
    assert torch.equal(torch.rand(3), first)
    set_rng_state(saved["cpu"], "cpu")            # checkpoints written before the GPU state was kept
    assert torch.equal(torch.rand(3), first)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rng_state_keeps_the_gpu_generator_that_dropout_uses_on_cuda():
    from course_lib.checkpoint import rng_state, set_rng_state
    saved = rng_state("cuda")
    first = torch.rand(3, device="cuda")
    set_rng_state(saved, "cuda")
    assert torch.equal(torch.rand(3, device="cuda"), first)
