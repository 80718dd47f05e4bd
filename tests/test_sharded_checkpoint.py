"""DCP checkpoints (course_lib.distributed.sharded_checkpoint): each rank writes its shard, any world size reads them.

The reference is PyTorch's own: the full weights FSDP2 gathers from the shards, and
`dcp_to_torch_save`, which reads a DCP folder into one ordinary state dict.
"""
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from course_lib.distributed import sharded_checkpoint as sc
from course_lib.distributed.launch import launch
from course_lib.models import Net

# dcp.save(no_dist=True) warns that it saves in one process: these tests mean it
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dcp")
    return folder, launch(sc.save_and_time, 2, folder, 1, 2, timeout=240)


def as_torch(folder, tmp_path, name):
    """The whole DCP checkpoint as one state dict, read by PyTorch's converter (weights_only load)."""
    dcp_to_torch_save(folder, tmp_path / f"{name}.pt")
    return torch.load(tmp_path / f"{name}.pt", weights_only=True)


def assert_equal_weights(model, weights: dict):
    state = model.state_dict()
    assert list(state) == list(weights)
    for name, value in weights.items():
        assert torch.equal(state[name], torch.as_tensor(value)), name


def test_every_rank_writes_its_own_file_of_its_own_rows(two_ranks):
    folder, ranks = two_ranks
    files = sc.layout(folder / "sync")
    assert sorted(files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert files[".metadata"]["items"] == {}
    for rank, first_row in ((0, 0), (1, 25)):             # fc1.weight [50, 320]: FSDP2 gives each rank 25 rows
        items = files[f"__{rank}_0.distcp"]["items"]
        assert items["model.fc1.weight"] == (first_row, 0)
        assert items["optim.state.fc1.weight.exp_avg"] == (first_row, 0)
        assert files[f"__{rank}_0.distcp"]["bytes"] > 0
    saved = set(files["__0_0.distcp"]["items"]) | set(files["__1_0.distcp"]["items"])
    assert {f"model.{name}" for name in Net().state_dict()} <= saved


def test_a_two_rank_checkpoint_loads_on_one_process_into_the_gathered_weights(two_ranks, tmp_path):
    folder, ranks = two_ranks
    weights = ranks[0]["weights"]
    assert ranks[1]["weights"] == {}                          # gathered to rank 0 only
    assert_equal_weights(sc.load_plain(folder / "sync"), weights)
    whole = as_torch(folder / "sync", tmp_path, "sync")       # PyTorch's own reader agrees
    for name, value in weights.items():
        assert torch.equal(whole["model"][name], torch.as_tensor(value))
    assert set(whole["optim"]["state"]) == set(weights)       # Adam's state, keyed by parameter name


def test_async_save_writes_the_state_of_the_call_not_of_later_steps(two_ranks):
    folder, ranks = two_ranks
    staged, final = ranks[0]["async_weights"], ranks[0]["final"]
    assert_equal_weights(sc.load_plain(folder / "async_1"), staged)
    assert any(not (staged[k] == final[k]).all() for k in staged)    # training moved on during the write
    for rank in ranks:
        assert rank["sync_s"] > 0
        assert len(rank["async"]) == 2 and all(t["write_s"] > 0 and t["blocked_s"] >= 0 for t in rank["async"])


def test_a_resave_on_three_ranks_holds_the_same_model_and_optimizer(two_ranks, tmp_path):
    folder, _ = two_ranks
    shards = launch(sc.reshard, 3, folder / "sync", tmp_path / "three", timeout=240)
    assert [s["fc1.weight"] for s in shards] == [[17, 320], [17, 320], [16, 320]]    # torch.chunk of 50 rows
    assert sorted(sc.layout(tmp_path / "three")) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    before, after = as_torch(folder / "sync", tmp_path, "two"), as_torch(tmp_path / "three", tmp_path, "three")
    for name, value in before["model"].items():
        assert torch.equal(after["model"][name], value), name
    for name, state in before["optim"]["state"].items():
        for key, value in state.items():
            assert torch.equal(after["optim"]["state"][name][key], value), (name, key)


def test_one_process_checkpoint_round_trip(tmp_path):
    torch.manual_seed(1)
    net = Net()
    dcp.save({"model": net.state_dict()}, checkpoint_id=str(tmp_path / "one"), no_dist=True)
    assert_equal_weights(sc.load_plain(tmp_path / "one"), net.state_dict())
    with pytest.raises(AssertionError):                       # the comparison can fail: a fresh Net differs
        torch.manual_seed(2)
        assert_equal_weights(Net(), net.state_dict())


def test_a_bad_folder_is_refused_by_name(tmp_path):
    torch.manual_seed(1)
    dcp.save({"model": Net().state_dict()}, checkpoint_id=str(tmp_path / "net"), no_dist=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("not a checkpoint")
    for bad, why in (("missing", "does not exist"), ("empty", "has no .metadata"), ("file", "is a file")):
        with pytest.raises(ValueError, match=rf"directory='.*{bad}' is not a DCP checkpoint: it {why}"):
            sc.load_plain(tmp_path / bad)
        with pytest.raises(ValueError, match=bad):
            sc.layout(tmp_path / bad)
    with pytest.raises(ValueError, match=r"does not hold a 'lenet300' model: .*Size mismatch"):
        sc.load_plain(tmp_path / "net", "lenet300")
    with pytest.raises(ValueError, match="model must be one of"):
        sc.load_plain(tmp_path / "net", "resnet")
    with pytest.raises(ValueError, match=r"directory='.*file' is a file"):
        sc.save(tmp_path / "file", Net(), None)
