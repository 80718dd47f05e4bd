import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import RESUME_TOLERANCE, needs_mnist
from course_lib import hardware, loop, train
from course_lib.checkpoint import load_checkpoint
from course_lib.data import TensorLoader
from course_lib.env import seed_everything
from course_lib.loop import History, evaluate, fit, make_optimizer


def blobs(n=512, seed=0):
    """Ten well-separated Gaussian blobs in 28x28 'images': learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    centers = torch.randn(10, 1, 28, 28, generator=g)
    return centers[y] + 0.3 * torch.randn(n, 1, 28, 28, generator=g), y


def tiny_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))


def run_fit(seed=0, epochs=3):
    seed_everything(seed)
    x, y = blobs()
    model = tiny_model()
    hist = fit(model, TensorLoader(x, y, batch_size=32, seed=seed), TensorLoader(x, y, batch_size=128, shuffle=False),
               epochs=epochs, lr=1e-2, progress=False, log=None)
    return model, hist


def test_fit_learns_and_records_history():
    model, hist = run_fit()
    assert len(hist.train_loss) == len(hist.val_accuracy) == len(hist.epoch_seconds) == 3
    assert len(hist.step_loss) == 3 * 16
    assert hist.train_loss[-1] < hist.train_loss[0]
    assert hist.val_accuracy[-1] > 0.9
    assert hist.mean_images_per_second > 0 and hist.train_seconds > 0
    assert set(hist.as_dict()) >= {"train_loss", "val_accuracy", "step_loss"}


def test_fit_is_deterministic_when_seeded():
    m1, h1 = run_fit(seed=1)
    m2, h2 = run_fit(seed=1)
    _, h3 = run_fit(seed=2)
    assert h1.step_loss == h2.step_loss
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert h1.step_loss != h3.step_loss


def test_evaluate_counts_correct_predictions():
    class Fixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.dummy = nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return nn.functional.one_hot(x.flatten(1)[:, 0].long(), 10).float()

    x = torch.tensor([0, 1, 2, 3]).float().view(4, 1, 1, 1)
    y = torch.tensor([0, 1, 9, 3])
    loss, acc = evaluate(Fixed(), TensorLoader(x, y, batch_size=3, shuffle=False))
    assert acc == 0.75 and loss > 0


@pytest.mark.parametrize("n, world_size, batch_size", [(10, 3, 2), (7, 4, 5), (3, 4, 1), (1000, 2, 1000), (64, 8, 8)])
def test_evaluation_split_over_ranks_adds_up_to_one_process(n, world_size, batch_size):
    """Each rank scores its block (same batch count on every rank, padding weighted 0); the added sums give one
    process's loss and accuracy: every sample once, whatever n, world size and batch size (n < world size too)."""
    from course_lib.rank_data import EvalShardLoader
    torch.manual_seed(n)
    model = nn.Linear(5, 10)
    x, y = torch.randn(n, 5), torch.randint(0, 10, (n,))
    whole = evaluate(model, TensorLoader(x, y, batch_size=batch_size, shuffle=False))
    shards = [EvalShardLoader(x, y, batch_size=batch_size, rank=r, world_size=world_size) for r in range(world_size)]
    assert len({len(s) for s in shards}) == 1 and all(s.dataset_size == n for s in shards)
    own = [int(sum(b[2].sum().item() for b in s)) for s in shards]
    assert sum(own) == n and own == [min(-(-n // world_size), max(n - r * -(-n // world_size), 0))
                                     for r in range(world_size)]
    seen = torch.cat([b[0][b[2] > 0] for s in shards for b in s])
    assert torch.equal(seen, x)                              # in order, each sample once
    parts = []                                               # what each rank's evaluate hands its all-reduce
    for shard in shards:
        evaluate(model, shard, reduce=lambda totals: parts.append(totals) or torch.ones(3))   # a rank may own none
    added = torch.stack(parts).sum(0)
    loss, acc = evaluate(model, shards[0], reduce=lambda totals: added)
    assert acc == whole[1] and loss == pytest.approx(whole[0], rel=1e-6)    # fp32 rows of other batch sizes


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="epochs"):
        fit(tiny_model(), [], epochs=-1)
    with pytest.raises(ValueError, match="epochs must be a non-negative int; got True"):
        fit(tiny_model(), [], epochs=True)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        make_optimizer("rmsprop", tiny_model().parameters(), 0.1)
    with pytest.raises(ValueError, match="lr must be > 0"):
        make_optimizer("sgd", tiny_model().parameters(), 0.0)
    with pytest.raises(ValueError, match="empty loader"):
        evaluate(tiny_model(), [])


def test_plot_history_draws_losses_and_accuracy():
    import matplotlib
    matplotlib.use("Agg")
    _, hist = run_fit(epochs=2)
    ax = loop.plot_history(hist, title="t")
    assert len(ax.lines) == 3 and ax.get_title() == "t"


def cli(*args, env_extra=None, timeout=300):
    env = {**os.environ, "TQDM_DISABLE": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "course_lib.train", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.mark.parametrize("args,message", [
    (["--epochs", "-1"], "--epochs: must be > 0"),
    (["--epochs", "two"], "--epochs: must be a int"),
    (["--model", "resnet"], "--model: invalid choice"),
    (["--batch-size", "0"], "--batch-size: must be > 0"),
    (["--optimizer", "lion"], "--optimizer: invalid choice"),
    (["--memory-format", "nhwc"], "--memory-format: invalid choice"),
    (["--compile-mode", "fast"], "--compile-mode: invalid choice"),
])
def test_cli_refuses_bad_arguments_by_name(args, message, capsys):
    """In this process: main parses before it does anything (test_cli_cuda_without_gpu_is_a_clear_error runs the
    command itself)."""
    with pytest.raises(SystemExit) as exited:
        train.main(args)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_memory_format_auto_picks_channels_last_for_conv_models_only():
    from course_lib.models import build_model

    net, mlp = build_model("net"), build_model("lenet300")
    assert train.resolve_memory_format("auto", net) is torch.channels_last
    assert train.resolve_memory_format("auto", mlp) is torch.contiguous_format
    assert train.resolve_memory_format("auto", net, shards_parameters=True) is torch.contiguous_format
    assert train.resolve_memory_format("contiguous", net) is torch.contiguous_format
    with pytest.raises(ValueError, match="memory_format must be one of"):
        train.resolve_memory_format("nhwc", net)


def test_channels_last_computes_the_same_step_as_contiguous():
    from course_lib.models import build_model

    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    grads = []
    for memory_format in (torch.contiguous_format, torch.channels_last):
        seed_everything(0)
        model = build_model("net").to(memory_format=memory_format)
        nn.functional.cross_entropy(model(x), y).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cli_cuda_without_gpu_is_a_clear_error():
    result = cli("--device", "cuda", "--epochs", "1")
    assert result.returncode == 2 and "no CUDA GPU" in result.stderr and "Traceback" not in result.stderr


def test_cli_offline_without_data_says_where_to_put_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COURSE_DOWNLOAD", "0")
    assert train.main(["--epochs", "1"]) == 2     # main's return is the command's exit status (train.cli)
    err = capsys.readouterr().err
    assert "COURSE_DATA_DIR" in err and "MNIST/raw" in err


@pytest.mark.slow
@needs_mnist
def test_cli_json_summary():
    result = cli("--epochs", "1", "--train-subset", "512", "--json", "--no-progress", "--model", "lenet300")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"test_accuracy", "train_seconds", "images_per_second", "world_size", "device"} <= set(summary)
    device = "cuda" if torch.cuda.is_available() else "cpu"      # --device auto
    assert summary["world_size"] == 1 and summary["device"] == device and summary["train_samples"] == 512
    assert 0.5 < summary["test_accuracy"] <= 1.0 and summary["test_samples"] == 10_000
    assert summary["memory_format"] == "contiguous"      # auto, for an MLP; named as --memory-format names it
    assert len(summary["epoch_seconds"]) == len(summary["epoch_test_accuracy"]) == 1
    assert summary["epoch_test_accuracy"][-1] == summary["test_accuracy"] and summary["compile"] is False
    assert {"model_flops_per_image", "achieved_flops", "peak_flops", "peak_source", "mfu",
            "achievable_flops", "achievable_source", "mfu_achievable"} <= set(summary)
    mfu_line = next(line for line in result.stdout.splitlines() if line.startswith("MFU"))
    assert f"{100 * summary['mfu']:.2g}%" in mfu_line and f"{100 * summary['mfu_achievable']:.2g}%" in mfu_line


@needs_mnist
def test_mfu_of_net_is_its_hand_counted_flops_times_images_per_second_over_the_peak():
    """`python -m course_lib.train --epochs 1 --json` reports MFU; checked in-process (train.run) on Net."""
    from test_flops import net_flops_by_hand

    summary = train.run(train.build_parser().parse_args(["--epochs", "1", "--train-subset", "512", "--no-progress"]))
    assert summary["model_flops_per_image"] == pytest.approx(net_flops_by_hand()["training"], rel=0.01)
    assert summary["achieved_flops"] == pytest.approx(summary["model_flops_per_image"] * summary["images_per_second"],
                                                      rel=1e-3)
    assert 0 < summary["mfu"] <= 1 and 0 < summary["mfu_achievable"]
    assert summary["mfu"] == pytest.approx(summary["achieved_flops"] / summary["peak_flops"], rel=1e-3)
    assert summary["mfu_achievable"] == pytest.approx(summary["achieved_flops"] / summary["achievable_flops"],
                                                      rel=1e-3)
    # the denominator is the theoretical peak wherever one can be derived (PaLM's MFU), the same one hardware gives;
    # on a CPU whose cores boost above the clock it reports, the matmul measured beats it and is the peak instead
    device = "cuda" if torch.cuda.is_available() else "cpu"
    theoretical = hardware.estimate_peak_gflops(device)
    assert summary["peak_source"].startswith("theoretical:" if theoretical.gflops is not None else "measured:")
    if theoretical.gflops is not None:
        raised = device == "cpu" and summary["achievable_flops"] > theoretical.gflops * 1e9
        expected = summary["achievable_flops"] if raised else theoretical.gflops * 1e9
        assert summary["peak_flops"] == pytest.approx(expected, rel=1e-6)
        assert ("so the cores run" in summary["peak_source"]) == raised
    assert summary["achievable_source"].startswith("measured: the best of 3") and summary["mfu_note"] == "one process"


def test_mfu_under_ddp_is_global_sums_over_the_ranks():
    """Each rank measures its own peak; the strategy sums peaks over the ranks, as it sums images/s."""
    from types import SimpleNamespace

    class TwoRanks:
        device, distributed, info = torch.device("cpu"), True, SimpleNamespace(world_size=2)

        @staticmethod
        def sum(value):
            return 2 * value
    args = SimpleNamespace(model="net", batch_size=64, precision="32")
    one = train.model_flops_utilisation(args, SimpleNamespace(device=torch.device("cpu"), distributed=False,
                                                              sum=lambda v: v), 1000.0)
    two = train.model_flops_utilisation(args, TwoRanks, 2000.0)      # images/s already summed over 2 ranks
    for key in ("peak_flops", "achievable_flops"):                  # the per-process peaks are cached
        assert two[key] == pytest.approx(2 * one[key], rel=1e-6)
    assert two["mfu"] == pytest.approx(one["mfu"], rel=1e-3) and two["mfu_note"] == "sums over ranks"
    assert two["mfu_achievable"] == pytest.approx(one["mfu_achievable"], rel=1e-3)
    assert two["peak_source"].endswith("summed over 2 ranks") and two["achievable_source"].endswith("over 2 ranks")
    none = train.model_flops_utilisation(args, TwoRanks, 0.0)          # no epoch run (resumed at the end)
    assert none["mfu"] is None and none["mfu_achievable"] is None


@needs_mnist
def test_compile_trains_the_compiled_model(monkeypatch):
    """--compile hands fit the torch.compile'd model (compiling itself is torch's; timed by bench gpu-fast)."""
    compiled = []

    def fake_compile(model, mode=None):
        compiled.append(mode)
        return model
    monkeypatch.setattr(train.torch, "compile", fake_compile)
    args = ["--epochs", "1", "--train-subset", "256", "--no-progress", "--model", "lenet300"]
    summary = train.run(train.build_parser().parse_args(args))
    assert summary["compile"] is False and summary["compile_mode"] is None and not compiled
    summary = train.run(train.build_parser().parse_args(args + ["--compile"]))
    assert summary["compile"] is True and compiled == ["default"] and summary["epochs_run"] == 1
    assert summary["compile_mode"] == "default" and summary["compile_note"] is None


def test_compile_mode_records_cuda_graphs_on_cuda_and_falls_back_with_a_note_elsewhere():
    """The decision alone, on device objects: torch.device("cuda") needs no GPU to exist."""
    assert train.compile_mode_for(torch.device("cuda"), "reduce-overhead") == ("reduce-overhead", None)
    assert train.compile_mode_for("cuda:1", "max-autotune") == ("max-autotune", None)
    for device in ("cpu", torch.device("mps")):
        for mode in ("reduce-overhead", "max-autotune"):
            used, note = train.compile_mode_for(device, mode)
            assert used == "default" and f"--compile-mode {mode}" in note and "CUDA" in note
    assert train.compile_mode_for("cpu", "default") == ("default", None)
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        train.compile_mode_for("cuda", "fast")


@needs_mnist
@pytest.mark.parametrize("on_cuda", [False, True])
def test_compile_mode_reaches_torch_compile_and_the_summary(monkeypatch, capsys, on_cuda):
    """--compile-mode reduce-overhead implies --compile; what torch.compile gets is compile_mode_for's answer:
    on this CPU "default" and one note; with the decision made as on a CUDA device (on_cuda), the CUDA-graph
    mode and no note. torch.compile is replaced: Inductor's cold compile of Net takes about 20 s on 2 cores, and
    compiling is torch's (test_compile_demo compiles for real; bench gpu-fast times the modes)."""
    compiled = []
    monkeypatch.setattr(train.torch, "compile", lambda model, mode=None: compiled.append(mode) or model)
    if on_cuda:
        real = train.compile_mode_for
        monkeypatch.setattr(train, "compile_mode_for", lambda device, mode: real(torch.device("cuda"), mode))
    args = ["--epochs", "1", "--train-subset", "256", "--no-progress", "--model", "lenet300",
            "--compile-mode", "reduce-overhead"]
    summary = train.run(train.build_parser().parse_args(args))
    used = "reduce-overhead" if on_cuda else "default"
    assert compiled == [used] and summary["compile"] is True and summary["compile_mode"] == used
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    if on_cuda:
        assert notes == [] and summary["compile_note"] is None
    else:
        assert notes == [f"note: {summary['compile_note']}"] and "CUDA" in summary["compile_note"]


def test_train_epoch_reads_the_loss_on_the_host_once_per_epoch_not_once_per_step(monkeypatch):
    """No host sync inside the step (on a GPU, .item() waits for the step's kernels): Tensor.item is counted
    during one epoch of 11 steps. The losses are the ones a loop that calls .item() every step records, bit
    for bit. SGD: Adam reads its step counter with .item() itself (a CPU tensor: no wait for the device)."""
    x, y = blobs()

    def epoch(history=None, reference=False):
        seed_everything(0)
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = TensorLoader(x, y, batch_size=48, seed=0)       # 512 = 10 x 48 + 32: a smaller last batch
        if not reference:
            return loop.train_epoch(model, loader, opt, "cpu", history=history, progress=False)
        values, sizes = [], []
        for xb, yb in loader:                                     # the loop as it was: .item() every step
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            values.append(loss.item())
            sizes.append(len(yb))
        return values, sum(v * n for v, n in zip(values, sizes)) / sum(sizes)

    calls = []
    item = torch.Tensor.item
    history = History()
    monkeypatch.setattr(torch.Tensor, "item", lambda self: calls.append(1) or item(self))
    mean, seen = epoch(history)
    monkeypatch.undo()
    assert len(history.step_loss) == 11 and seen == 512
    assert len(calls) <= 1, f"{len(calls)} .item() calls in an epoch of 11 steps"
    assert all(type(v) is float for v in history.step_loss)
    values, expected_mean = epoch(reference=True)
    assert history.step_loss == values and mean == expected_mean


@pytest.mark.slow
@needs_mnist
def test_resume_after_a_crash_ends_with_the_same_weights(tmp_path, monkeypatch):
    common = ["--epochs", "3", "--train-subset", "256", "--batch-size", "32", "--no-progress", "--model", "net"]
    whole = train.run(train.build_parser().parse_args(common + ["--checkpoint-dir", str(tmp_path / "a")]))

    import course_lib.checkpoint as ckpt  # run() imports save_checkpoint from here at call time

    saves = {"n": 0}
    original = ckpt.save_checkpoint

    def crash_after_first_epoch(path, state):
        original(path, state)
        saves["n"] += 1
        if saves["n"] == 1:
            raise KeyboardInterrupt("worker killed")

    monkeypatch.setattr(ckpt, "save_checkpoint", crash_after_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        train.run(train.build_parser().parse_args(common + ["--checkpoint-dir", str(tmp_path / "b")]))
    assert load_checkpoint(tmp_path / "b" / "last.pt")["epoch"] == 0
    resumed = train.run(train.build_parser().parse_args(common + ["--checkpoint-dir", str(tmp_path / "b"), "--resume"]))
    assert resumed["epochs_run"] == 2
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], **RESUME_TOLERANCE)
    assert resumed["test_accuracy"] == pytest.approx(whole["test_accuracy"], abs=1e-3)


def test_history_defaults_are_empty():
    assert History().mean_images_per_second == 0.0 and History().train_seconds == 0.0


@pytest.mark.slow
@needs_mnist
def test_under_a_launcher_the_cli_leaves_without_interpreter_teardown():
    """Under torchrun (MASTER_ADDR set) the CLI flushes and leaves with os._exit: no atexit handler runs,
    and with it none of the interpreter teardown in which a gloo worker thread can abort a finished run
    (SIGABRT). Without a launcher it exits normally. Either way the summary is printed and the code is 0."""
    script = ("import atexit, runpy, sys; atexit.register(lambda: print('TEARDOWN RAN', flush=True)); "
              "sys.argv[0] = 'course_lib.train'; runpy.run_module('course_lib.train', run_name='__main__')")
    args = ["--model", "lenet300", "--epochs", "1", "--train-subset", "128", "--no-progress", "--json"]
    launcher = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    for extra, teardown in (({}, True), (launcher, False)):
        env = {k: v for k, v in os.environ.items() if k not in launcher}
        out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                             env={**env, "TQDM_DISABLE": "1", **extra})
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1 - teardown])["world_size"] == 1
        assert ("TEARDOWN RAN" in out.stdout) is teardown, out.stdout


@pytest.mark.parametrize("args,message", [
    (["--train-subset", "100000000"], "--train-subset 100,000,000 is more than the training set holds"),
])
@needs_mnist
def test_cli_refuses_a_subset_larger_than_the_training_set(args, message, capsys):
    assert train.main([*args, "--epochs", "1", "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_cli_says_when_the_checkpoint_folder_cannot_be_created(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert train.main(["--epochs", "1", "--train-subset", "64", "--no-progress",
                       "--checkpoint-dir", str(blocker / "run")]) == 2
    err = capsys.readouterr().err
    assert "cannot be created" in err and str(blocker / "run") in err


@pytest.mark.parametrize("env,progress,disabled", [("1", True, True), ("", True, False), ("", False, True)])
def test_progress_bars_follow_tqdm_disable_even_in_a_notebook(monkeypatch, env, progress, disabled):
    """tqdm.auto is tqdm.notebook in a kernel, and that ignores TQDM_DISABLE: train_epoch reads it itself."""
    seen = []

    def fake_tqdm(iterable, **kwargs):
        seen.append(kwargs.get("disable", False))
        return iterable

    monkeypatch.setattr(loop, "tqdm", fake_tqdm)
    monkeypatch.setenv("TQDM_DISABLE", env)
    model = torch.nn.Linear(4, 2)
    batches = [(torch.randn(3, 4), torch.tensor([0, 1, 0]))]
    loop.train_epoch(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), "cpu", progress=progress)
    assert seen == [disabled]


def test_ranks_share_no_gpu_auto_falls_back_to_the_cpu_and_explicit_cuda_says_what_to_do(monkeypatch, capsys):
    """nccl refuses two ranks on one GPU: with fewer GPUs than ranks on a node, auto means gloo on the CPU."""
    from course_lib import strategy
    from course_lib.env import DistInfo
    monkeypatch.setattr(strategy, "get_device", lambda name: torch.device("cuda" if name in ("auto", "cuda") else name))
    monkeypatch.setattr(strategy.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert strategy._rank_device("auto", DistInfo(0, 2, 0)) == torch.device("cpu")
    assert "2 ranks on this node but 1 GPU(s)" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--nproc_per_node 1 or --device cpu"):
        strategy._rank_device("cuda", DistInfo(1, 2, 1))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")                     # one rank per node, one GPU each
    assert strategy._rank_device("auto", DistInfo(1, 2, 0)) == torch.device("cuda", 0)
    assert strategy._rank_device("cpu", DistInfo(1, 2, 0)) == torch.device("cpu")
