"""`fit(..., precision=...)`, `--precision` in the train CLI, and the precision benchmark."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import needs_mnist
from course_lib import bench, train
from course_lib.data import TensorLoader
from course_lib.env import seed_everything
from course_lib.loop import fit, train_epoch
from test_train import blobs, cli, tiny_model


def run_fit(precision, seed=0, epochs=3):
    seed_everything(seed)
    x, y = blobs()
    model = tiny_model()
    hist = fit(model, TensorLoader(x, y, batch_size=32, seed=seed), TensorLoader(x, y, batch_size=128, shuffle=False),
               epochs=epochs, lr=1e-2, progress=False, log=None, precision=precision)
    return model, hist


def test_bf16_fit_learns_like_fp32_and_keeps_fp32_weights():
    m32, h32 = run_fit("32")
    m16, h16 = run_fit("bf16")
    assert h16.val_accuracy[-1] > 0.9 and abs(h16.val_accuracy[-1] - h32.val_accuracy[-1]) < 0.02
    assert h16.step_loss != h32.step_loss                                 # bf16 really rounded something
    assert max(abs(a - b) for a, b in zip(h16.step_loss, h32.step_loss)) < 0.1
    assert all(p.dtype == torch.float32 for p in m16.parameters())      # autocast: fp32 master weights
    assert run_fit("bf16", epochs=1)[1].step_loss == run_fit("bf16", epochs=1)[1].step_loss   # deterministic


def test_fit_refuses_fp16_on_cpu_and_unknown_precisions():
    x, y = blobs(64)
    with pytest.raises(ValueError, match=r"precision 16 .*CUDA.*bf16"):
        fit(tiny_model(), TensorLoader(x, y, batch_size=32), device="cpu", precision="16", progress=False, log=None)
    with pytest.raises(ValueError, match="precision must be one of"):
        fit(tiny_model(), TensorLoader(x, y, batch_size=32), precision="fp8", progress=False, log=None)
    with pytest.raises(TypeError, match="scaler must be a torch.amp.GradScaler or None; got float"):
        fit(tiny_model(), TensorLoader(x, y, batch_size=32), scaler=2.0**16, progress=False, log=None)


@pytest.mark.parametrize("blow_up", [1.0, 1e35])
def test_a_step_skipped_by_the_scaler_does_not_advance_the_scheduler(blow_up):
    """The fp16 path of train_epoch, driven on CPU by torch's GradScaler. Multiplying the loss by
    1e35 makes the scaled gradients overflow fp32: those steps are skipped, each halves the scale
    (no growth within 8 steps), and the schedule advances only on the steps that were taken."""
    seed_everything(0)
    x, y = blobs(256)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    train_epoch(model, TensorLoader(x, y, batch_size=32), opt, torch.device("cpu"), scheduler=sched,
                progress=False, scaler=scaler, loss_fn=lambda out, target: blow_up * F.cross_entropy(out, target))
    skipped = round(math.log2(2.0**16 / scaler.get_scale()))
    assert (skipped > 0) == (blow_up > 1)
    assert sched.last_epoch == 8 - skipped


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["16", "bf16"])
def test_low_precision_fit_on_cuda(precision):
    seed_everything(0)
    x, y = blobs()
    model = tiny_model().cuda()
    hist = fit(model, TensorLoader(x, y, batch_size=32, device="cuda"), TensorLoader(x, y, batch_size=128,
               shuffle=False, device="cuda"), epochs=3, lr=1e-2, progress=False, log=None, precision=precision)
    assert hist.val_accuracy[-1] > 0.9 and all(p.dtype == torch.float32 for p in model.parameters())


def test_cli_precision_choices():
    assert train.build_parser().parse_args([]).precision == "32"
    result = cli("--precision", "half")
    assert result.returncode == 2 and "--precision: invalid choice" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cli_refuses_fp16_on_cpu_and_says_what_to_use():
    result = cli("--precision", "16", "--epochs", "1", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--precision 16" in result.stderr and "CUDA" in result.stderr and "--precision bf16" in result.stderr


@pytest.mark.slow
@needs_mnist
def test_cli_bf16_json_summary():
    result = cli("--precision", "bf16", "--epochs", "1", "--train-subset", "512", "--json", "--no-progress",
                 "--model", "lenet300")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["precision"] == "bf16" and 0.5 < summary["test_accuracy"] <= 1.0


@pytest.mark.slow
@needs_mnist
def test_precision_benchmark_quick(capsys):
    assert bench.main(["precision", "--quick", "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert {"fp32_test_accuracy", "bf16_test_accuracy", "accuracy_gap_pp", "bf16_speedup", "data", "benchmark",
            "quick", "cpu_capability", "bf16_saved_activation_ratio"} <= set(summary)
    assert summary["benchmark"] == "precision" and summary["quick"] is True
    assert 0.5 < summary["fp32_test_accuracy"] <= 1 and 0.5 < summary["bf16_test_accuracy"] <= 1
    assert summary["accuracy_gap_pp"] == pytest.approx(
        100 * (summary["fp32_test_accuracy"] - summary["bf16_test_accuracy"]), abs=0.011)
    assert summary["bf16_speedup"] > 0 and 0 < summary["bf16_saved_activation_ratio"] < 1
    assert summary["data"].startswith("1,000 of the ")
    assert "bf16" in out and "images/s" in out                           # the table


@needs_mnist
def test_resume_restores_the_loss_scale(tmp_path, monkeypatch):
    """The fp16 path's GradScaler state lives in the checkpoint. Driven on CPU: the CLI's scaler is
    torch's GradScaler("cpu") growing every 2 steps, so a resumed run that started again from the
    initial scale would end with another scale (and other weights) than the uninterrupted run."""
    import course_lib.checkpoint as ckpt
    from course_lib.checkpoint import load_checkpoint

    monkeypatch.setattr(train, "grad_scaler", lambda precision, device: torch.amp.GradScaler(
        "cpu", init_scale=2.0**4, growth_interval=2))
    common = ["--epochs", "2", "--train-subset", "256", "--batch-size", "32", "--no-progress", "--model", "lenet300"]
    train.run(train.build_parser().parse_args(common + ["--checkpoint-dir", str(tmp_path / "a")]))
    original, saves = ckpt.save_checkpoint, []

    def crash_after_first_epoch(path, state):
        original(path, state)
        saves.append(state["scaler"]["scale"])
        if len(saves) == 1:
            raise KeyboardInterrupt("worker killed")

    monkeypatch.setattr(ckpt, "save_checkpoint", crash_after_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        train.run(train.build_parser().parse_args(common + ["--checkpoint-dir", str(tmp_path / "b")]))
    train.run(train.build_parser().parse_args(common + ["--checkpoint-dir", str(tmp_path / "b"), "--resume"]))
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    assert saves[0] == 2.0**4 * 2 ** 4                       # 8 steps in epoch 1: grew 4 times
    assert a["scaler"] == b["scaler"] and a["scaler"]["scale"] == 2.0**4 * 2 ** 8
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-5, atol=1e-6)
