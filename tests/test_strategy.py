"""The training seam: strategies are siblings, and the script and the checkpoints ask them, never their names."""
import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from course_lib import checkpoint, strategy, train
from course_lib.checkpoint import Checkpointer, save_checkpoint
from course_lib.env import DistInfo

PACKAGE = Path(strategy.__file__).parent


def test_strategies_are_siblings_of_one_base():
    classes = strategy.STRATEGY_CLASSES
    assert tuple(classes) == strategy.STRATEGIES == ("single", "ddp", "fsdp", "fsdp_tp")
    for name, cls in classes.items():   # siblings; the two sharding ones share their full state dicts
        base = strategy.Sharded if cls.shards_parameters else strategy.Strategy
        assert cls.__bases__ == (base,) and cls.name == name
    assert strategy.Sharded.__bases__ == (strategy.Strategy,)
    # only what differs is overridden: DDP wraps, FSDP shards, Single has no group; FSDPTP also takes --tp
    # (start, __init__: dunder, not listed) and says its data rank and world (properties)
    own = {name: {k for k in vars(cls) if callable(getattr(cls, k)) and not k.startswith("__")}
           for name, cls in classes.items()}
    assert own == {"single": {"start", "gather", "barrier", "sum", "sum_over_data", "close"}, "ddp": {"wrap"},
                   "fsdp": {"prepare"}, "fsdp_tp": {"start", "prepare"}}
    assert set(vars(strategy.Sharded)) >= {"state_dicts", "load_state_dicts"}
    assert [cls.keys_optimizer_by_name for cls in classes.values()] == [False, False, True, True]
    assert [cls.shards_parameters for cls in classes.values()] == [False, False, True, True]
    assert [cls.distributed for cls in classes.values()] == [False, True, True, True]
    assert [cls.tensor_parallel for cls in classes.values()] == [False, False, False, True]


def test_single_is_local_and_refuses_many_ranks():
    one = strategy.setup_strategy("single", "cpu", DistInfo(0, 1, 0))
    assert isinstance(one, strategy.Single) and one.device == torch.device("cpu")
    assert one.gather("x") == ["x"] and one.sum(2.5) == 2.5 and one.barrier() is None and one.close() is None
    model = nn.Linear(2, 2)
    assert one.prepare(model) is model and one.wrap(model) is model
    with pytest.raises(SystemExit, match="--strategy single"):
        strategy.setup_strategy("single", "cpu", DistInfo(0, 2, 0))
    with pytest.raises(ValueError, match=r"strategy must be one of \('single', 'ddp', 'fsdp', 'fsdp_tp'\); got 'zero3'"):
        strategy.setup_strategy("zero3", "cpu", DistInfo(0, 1, 0))


@pytest.mark.parametrize("module", ["train.py", "checkpoint.py"])
def test_train_and_checkpoint_never_compare_strategy_names(module):
    """`strategy.name == "fsdp"` or `"fsdp" in ...` would bring back the seam this test guards: ask attributes."""
    tree = ast.parse((PACKAGE / module).read_text())
    names = set(strategy.STRATEGIES)
    compared = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                and any(isinstance(side, ast.Constant) and side.value in names
                        for side in [node.left, *node.comparators])]
    assert not compared, f"{module} compares with a strategy's name: {compared}"
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "strategy" not in imported or module == "train.py", f"{module} imports back from strategy"
    assert "distributed.ddp" not in imported, f"{module} imports lecture 07's from-scratch module"


class _ByName(strategy.Single):
    """A strategy that keys optimizer state by parameter name, as FSDP does: the checkpoint must ask it, not its name."""

    name = "byname"
    keys_optimizer_by_name = True


def _checkpointer(tmp_path, strat):
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return Checkpointer(tmp_path, strat, "net", model, optimizer, scheduler, None, steps_per_epoch=4)


def test_checkpoints_resume_only_where_the_strategy_keys_optimizer_state_alike(tmp_path):
    info, cpu = DistInfo(0, 1, 0), torch.device("cpu")
    single, by_name = strategy.Single(info, cpu), _ByName(info, cpu)
    written = _checkpointer(tmp_path, single)
    written.save(0, 4)
    assert checkpoint.load_checkpoint(written.path)["strategy"] == "single"
    assert _checkpointer(tmp_path, single).restore() == (1, 0)
    with pytest.raises(SystemExit, match="written without --strategy byname; resume it without byname"):
        _checkpointer(tmp_path, by_name).restore()

    state = checkpoint.load_checkpoint(written.path)
    state["optimizer"]["param_groups"][0]["params"] = ["weight", "bias"]      # keyed by name, as FSDP writes it
    save_checkpoint(written.path, {**state, "strategy": "byname"})
    with pytest.raises(SystemExit, match=r"written with --strategy byname; resume it with byname \(byname keys"):
        _checkpointer(tmp_path, single).restore()
    assert checkpoint.optimizer_keyed_by_name(state["optimizer"])
    assert not checkpoint.optimizer_keyed_by_name(torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1).state_dict())


def test_data_rank_is_the_rank_except_where_ranks_share_a_batch():
    cpu = torch.device("cpu")
    for rank in range(4):
        info = DistInfo(rank, 4, rank)
        ddp, two_d = strategy.DDP(info, cpu), strategy.FSDPTP(info, cpu, tp=2)
        assert (ddp.data_rank, ddp.data_world_size) == (rank, 4)
        assert (two_d.data_rank, two_d.data_world_size) == (rank // 2, 2)     # the dp coordinate of a (dp, tp) mesh
    with pytest.raises(ValueError, match="--tp 3 must divide the world size 4"):
        strategy.FSDPTP(DistInfo(0, 4, 0), cpu, tp=3)


def test_memory_format_asks_whether_the_strategy_shards_parameters():
    from course_lib.models import build_model

    net = build_model("net")
    for cls in strategy.STRATEGY_CLASSES.values():
        expected = torch.contiguous_format if cls.shards_parameters else torch.channels_last
        assert train.resolve_memory_format("auto", net, cls.shards_parameters) is expected
