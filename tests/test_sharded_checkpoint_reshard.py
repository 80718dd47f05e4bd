"""Resharding and torn saves (course_lib.distributed.reshard_checkpoint): the 2-D ViT saved on 4 ranks
(dp 2 x tp 2), loaded on 2 FSDP ranks and in one process exactly; a rank killed mid-save leaves the previous
step loadable and the torn one refused. The references: the weights FSDP gathers (not read back through
DCP), and PyTorch's own `dcp_to_torch_save`."""
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from course_lib.distributed import reshard_checkpoint as rc
from course_lib.vit import ViT

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def resharded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reshard")
    return folder, rc.reshard_demo(folder, save_world=4, tp=2, load_worlds=(2, 1), timeout=240)


@pytest.mark.slow     # 4 gloo ranks (or a training run): tens of CPU-seconds
def test_a_2d_checkpoint_loads_exactly_on_two_fsdp_ranks_and_on_one_process(resharded):
    folder, out = resharded
    assert out["saved_on"] == {"world": 4, "dp": 2, "tp": 2}
    assert out["loads"] == {2: 0.0, 1: 0.0}
    # q.weight [64, 64]: 2 FSDP ranks hold 32 rows each; one process all 64
    assert out["shard_rows"] == {2: [32, 32], 1: [64]}
    assert sorted(out["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    assert out["bytes"] == sum(out["files"].values()) and all(b > 0 for b in out["files"].values())
    assert rc.latest_step(folder).name == "step_1" and out["checkpoint"].endswith("step_1")


@pytest.mark.slow     # 4 gloo ranks (or a training run): tens of CPU-seconds
def test_pytorch_s_converter_reads_the_same_model_and_adam_state(resharded, tmp_path):
    folder, _ = resharded
    dcp_to_torch_save(folder / "step_1", tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)
    reference = torch.load(folder / "weights_step_1.pt", weights_only=True)
    assert list(reference) == list(ViT().state_dict())
    for name, value in reference.items():
        assert torch.equal(whole["model"][name], value), name
        assert whole["optim"]["state"][name]["exp_avg"].shape == value.shape     # Adam's state, whole, by name


@pytest.mark.slow     # 4 gloo ranks (or a training run): tens of CPU-seconds
def test_a_save_never_overwrites_a_finished_step(resharded):
    folder, _ = resharded
    assert not list(folder.glob("*.tmp"))                 # renamed once finished
    assert rc.step_dir(folder, 1).is_dir()


@pytest.mark.slow     # 4 gloo ranks (or a training run): tens of CPU-seconds
def test_a_rank_killed_mid_save_leaves_the_previous_step_loadable(tmp_path):
    out = rc.torn_save_demo(tmp_path, world=4, tp=2, die_rank=1, timeout=240)
    assert out["crash"] is not None and "failed" in out["crash"]
    assert "step_1" in out["folder"] and "step_2.tmp" in out["folder"] and "step_2" not in out["folder"]
    assert "__1_0.distcp" in out["tmp_files"] and ".metadata" not in out["tmp_files"]
    assert out["torn_refused"] is not None and "has no .metadata" in out["torn_refused"]
    assert out["latest"] == "step_1" and out["max_diff"] == 0.0


def test_latest_step_takes_the_newest_complete_folder_only(tmp_path):
    assert rc.latest_step(tmp_path) is None
    for name, complete in (("step_2", True), ("step_10", True), ("step_11", False), ("step_12.tmp", True),
                           ("step_x", True)):
        (tmp_path / name).mkdir()
        if complete:
            (tmp_path / name / ".metadata").write_bytes(b"")
    assert rc.latest_step(tmp_path).name == "step_10"     # by number, not by name; no .tmp, no folder without .metadata
    with pytest.raises(ValueError, match="step must be a positive int"):
        rc.step_dir(tmp_path, 0)
