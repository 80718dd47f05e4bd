"""The train CLI with --model vit: alone, under torchrun with fsdp_tp (2-D), misuse of --tp refused.

The ViT has no dropout, so with rank 0's weights and the same data order a 2-D run must end where one process
with the same global batch ends: 4 fsdp_tp ranks (dp 2 x tp 2) x 16 against 1 process x 32. (ddp and fsdp are
model-agnostic: tests/test_train_ddp.py and test_train_fsdp.py run them under torchrun on Net; FSDP's units of the
ViT are checked below. One torchrun launch of 5 processes here, with a restart: each costs the suite seconds of CPU.) Only summation order differs. That comparison uses SGD: attention's k bias has
a true gradient of 0 (softmax ignores a shift that is the same for every key), so its gradient is rounding
noise, which Adam (dividing by sqrt(v)) turns into steps of about lr in either direction.
"""
import pytest
import torch

from conftest import needs_mnist
from course_lib import train
from course_lib.checkpoint import load_checkpoint
from course_lib.distributed.multinode import last_json, torchrun_command
from course_lib.distributed.sharding import shard_units
from course_lib.processes import run_commands
from course_lib.vit import ViT

COMMON = ["--model", "vit", "--epochs", "1", "--train-subset", "256", "--no-progress", "--json"]
SGD = [*COMMON, "--optimizer", "sgd", "--lr", "0.05"]


def parse(args):
    return train.build_parser().parse_args(args)


def test_fsdp_shards_the_vit_block_by_block():
    vit = ViT()
    assert shard_units(vit) == [vit.embed, *vit.blocks, vit.norm, vit.head]    # pos goes with the root


@pytest.mark.slow     # 4 gloo ranks (or a training run): tens of CPU-seconds
@needs_mnist
def test_vit_trains_in_one_process_and_channels_last_changes_nothing():
    args = [*COMMON, "--train-subset", "128", "--batch-size", "64"]
    auto = train.run(parse(args))
    assert auto["model"] == "vit" and auto["parameters"] == 204_938 and auto["memory_format"] == "contiguous"
    assert auto["model_flops_per_image"] > 0 and 0.0 <= auto["test_accuracy"] <= 1.0
    forced = train.run(parse([*args, "--memory-format", "channels_last"]))   # no 4-D weights: nothing to convert
    assert forced["test_loss"] == pytest.approx(auto["test_loss"], abs=1e-5)


@pytest.mark.slow
@needs_mnist
@pytest.mark.timeout(420)
def test_fsdp_tp_under_torchrun_equals_one_process_even_after_a_killed_rank_restarts(tmp_path):
    """4 fsdp_tp ranks lose rank 1 after step 5 of 8, restart from the step-3 checkpoint (mid-epoch: the
    checkpoint's full state dicts resharded onto the 2-D mesh) and must end where one process ends."""
    env = {"TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    (code, out, err, _, _), = run_commands([torchrun_command(
        ["course_lib.distributed.faults", "--fail-at-step", "5", "--fail-rank", "1", *SGD, "--batch-size", "16",
         "--strategy", "fsdp_tp", "--tp", "2", "--checkpoint-every", "3", "--resume",
         "--checkpoint-dir", str(tmp_path / "fsdp_tp")], nproc_per_node=4, max_restarts=1)], env=env, timeout=300)
    assert code == 0, err[-3000:]
    assert "rank 1 exits at step 5" in err, "the failure hook did not fire:\n" + err[-3000:]
    assert "resumed" in out.lower(), "the restarted group did not resume from the checkpoint:\n" + out
    summary = last_json(out)
    single = train.run(parse([*SGD, "--batch-size", "32", "--checkpoint-dir", str(tmp_path / "one")]))
    reference = load_checkpoint(tmp_path / "one" / "last.pt")["model"]
    assert summary["strategy"] == "fsdp_tp" and summary["world_size"] == 4
    assert summary["global_batch_size"] == 32 and summary["train_samples"] == 256   # dp 2 x 16
    state = load_checkpoint(tmp_path / "fsdp_tp" / "last.pt")
    assert state["step"] == 8                                      # 256 images / 32 per step
    ViT().load_state_dict(state["model"])                          # full, unsharded tensors
    for key, value in reference.items():
        torch.testing.assert_close(state["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert summary["test_accuracy"] == pytest.approx(single["test_accuracy"], abs=2e-3)


def test_tp_is_refused_where_it_does_not_apply(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="--tp applies to --strategy fsdp_tp only; got --strategy ddp"):
        train.run(parse(["--model", "vit", "--strategy", "ddp", "--tp", "2"]))
    with pytest.raises(ValueError, match="--tp 3 must divide the world size 2"):
        train.run(parse(["--model", "vit", "--strategy", "fsdp_tp", "--tp", "3"]))
    assert train.main(["--model", "vit", "--strategy", "single", "--tp", "2"]) == 2    # the CLI says "error: --tp ..."


@needs_mnist
def test_fsdp_tp_refuses_a_model_without_a_tensor_parallel_plan(one_rank_launch):
    with pytest.raises(ValueError, match="--tp: only --model vit has a tensor-parallel plan; got LeNet300"):
        train.run(parse(["--model", "lenet300", "--epochs", "1", "--train-subset", "64", "--no-progress",
                         "--strategy", "fsdp_tp", "--tp", "1"]))
