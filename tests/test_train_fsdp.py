"""The train CLI with --strategy fsdp: under torchrun against one process, resumed after a killed rank, misuse refused."""
import pytest
import torch

from conftest import needs_mnist
from course_lib import train
from course_lib.checkpoint import load_checkpoint
from course_lib.distributed.multinode import last_json, torchrun_command
from course_lib.models import LeNet300
from course_lib.processes import run_commands

# lenet300 has no dropout; 256 images, 2 ranks x 32 per batch: 4 steps per epoch, 8 in all.
COMMON = ["course_lib.train", "--model", "lenet300", "--epochs", "2", "--train-subset", "256", "--batch-size", "32",
          "--checkpoint-every", "3", "--resume", "--no-progress", "--json"]


def parse(args):
    return train.build_parser().parse_args(args)


@pytest.mark.slow
@needs_mnist
@pytest.mark.timeout(240)
def test_fsdp_under_torchrun_equals_one_process_even_after_a_killed_rank_restarts(tmp_path):
    """fsdp loses rank 1 after step 5, restarts from the step-3 checkpoint, and must end where one process with
    the global batch ends: same data order, same starting weights (rank 0's), gradients averaged. (ddp on 2
    ranks equals that one process too: tests/test_train_ddp.py.)"""
    env = {"TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    (code, out, err, _, _), = run_commands(
        [torchrun_command(["course_lib.distributed.faults", "--fail-at-step", "5", "--fail-rank", "1", *COMMON[1:],
                           "--strategy", "fsdp", "--checkpoint-dir", str(tmp_path / "fsdp")],
                          nproc_per_node=2, max_restarts=1)], env=env, timeout=220)
    assert code == 0, err[-3000:]
    assert "rank 1 exits at step 5" in err, "the failure hook did not fire:\n" + err[-3000:]
    assert "resumed" in out.lower(), "the restarted group did not resume from the checkpoint:\n" + out
    fsdp = last_json(out)
    assert fsdp["strategy"] == "fsdp" and fsdp["world_size"] == 2 and fsdp["global_batch_size"] == 64
    assert fsdp["parameters"] == 266_610 and fsdp["images_per_second_note"] == "sum over ranks"
    assert 0.5 < fsdp["test_accuracy"] <= 1.0 and fsdp["test_samples"] == 10_000
    single = train.run(parse([*COMMON[1:], "--batch-size", "64", "--checkpoint-dir", str(tmp_path / "one")]))
    assert fsdp["test_accuracy"] == pytest.approx(single["test_accuracy"], abs=2e-3)

    a, b = load_checkpoint(tmp_path / "one" / "last.pt"), load_checkpoint(tmp_path / "fsdp" / "last.pt")
    assert a["step"] == b["step"] == 8 and b["world_size"] == 2
    LeNet300().load_state_dict(b["model"])       # rank 0 wrote full, unsharded tensors
    for key in a["model"]:
        torch.testing.assert_close(b["model"][key], a["model"][key], rtol=1e-4, atol=1e-5, msg=f"weights differ in {key}")


@needs_mnist
def test_checkpoints_resume_only_with_the_strategy_family_that_wrote_them(tmp_path, one_rank_launch):
    args = ["--model", "lenet300", "--epochs", "1", "--train-subset", "128", "--batch-size", "64", "--no-progress"]
    fsdp = train.run(parse(args + ["--strategy", "fsdp", "--checkpoint-dir", str(tmp_path / "f")]))
    assert fsdp["world_size"] == 1 and fsdp["strategy"] == "fsdp"
    single = train.run(parse(args + ["--strategy", "ddp", "--checkpoint-dir", str(tmp_path / "s")]))
    assert fsdp["test_accuracy"] == pytest.approx(single["test_accuracy"], abs=1e-3)   # 1 rank: nothing sharded
    with pytest.raises(SystemExit, match="written without --strategy fsdp"):
        train.run(parse(args + ["--epochs", "2", "--strategy", "fsdp", "--resume", "--checkpoint-dir", str(tmp_path / "s")]))
    with pytest.raises(SystemExit, match="written with --strategy fsdp"):
        train.run(parse(args + ["--epochs", "2", "--strategy", "ddp", "--resume", "--checkpoint-dir", str(tmp_path / "f")]))


def test_fsdp_without_a_launcher_says_how_to_start_it(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(SystemExit, match="torchrun .*--strategy fsdp"):
        train.run(parse(["--epochs", "1", "--strategy", "fsdp"]))
