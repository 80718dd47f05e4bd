"""Checks for solutions/practicum_scale_out.ipynb: run the learner's DDP script for real, then inspect it.

`run_ddp(script)` writes the script to a private temporary folder and starts it with torchrun: 2
ranks, gloo, one thread each, a free port, a deadline, and every process killed afterwards. An
audit module on the ranks' PYTHONPATH (a `sitecustomize`) records each `torch.save` with the rank
that called it. The result (`DDPRun`) holds each rank's stdout, the files the script wrote, the
audit and the exit code; the folder is deleted. The checks compare it with facts, not with a copy
of the solution:

- logs: one log file per rank, progress printed by rank 0 only;
- sampler: each rank's samples per epoch are torch's `DistributedSampler(seed=..)` after `set_epoch(e)`;
- seeding: the ranks drew different augmentation noise;
- checkpoint: one file, saved by rank 0 only, that loads into a plain LeNet300;
- equivalence: the final weights equal those of the given single-process script
  (`course_lib.scale_out`) run on the global batch (world_size x batch) with the same sample order.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data.distributed import DistributedSampler

from ..distributed.launch import free_port
from ..distributed.multinode import run_commands
from ..env import pick
from ..models import LeNet300
from . import expect, expect_close, passed

# What the graders run: seed 3 (not the default 0) so that a sampler that ignores --seed shows;
# noise off so the run is deterministic (the noise is still drawn and logged as a fingerprint).
SETTINGS = {"epochs": 2, "batch_size": 16, "lr": 0.05, "samples": pick(512, 256), "seed": 3, "noise": 0.0}
WORLD_SIZE = 2

AUDIT = '''"""Grader's audit (sitecustomize): record every torch.save with the rank that called it."""
import json, os
if os.environ.get("SCALE_OUT_AUDIT"):
    import torch
    _real_save = torch.save
    def _audited_save(obj, f, *args, **kwargs):
        path = os.path.abspath(os.fspath(f) if isinstance(f, (str, os.PathLike)) else str(getattr(f, "name", f)))
        record = {"rank": os.environ.get("RANK"), "path": path}
        with open(os.path.join(os.environ["SCALE_OUT_AUDIT"], "saves-%d.jsonl" % os.getpid()), "a") as log:
            log.write(json.dumps(record) + "\\n")
        return _real_save(obj, f, *args, **kwargs)
    torch.save = torch.serialization.save = _audited_save
'''

PROBE = '''import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
report = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": t.item(), "python": sys.executable,
          "torch": torch.__version__}
os.write(1, (json.dumps(report) + "\\n").encode())   # one write: ranks share the output file
dist.destroy_process_group()
'''


@dataclass
class DDPRun:
    """What one torchrun launch of a script did (everything read into memory; the folder is gone)."""

    returncode: int
    timed_out: bool
    seconds: float
    settings: dict
    world_size: int
    console: str = ""                                 # torchrun's own stdout + stderr
    stdout: dict = field(default_factory=dict)        # rank -> what that rank printed
    stderr: dict = field(default_factory=dict)
    files: list = field(default_factory=list)         # names the script left in --out
    logs: dict = field(default_factory=dict)          # *.jsonl file name -> list of records
    checkpoint: dict | None = None                    # checkpoint.pt, loaded with weights_only
    saves: list = field(default_factory=list)         # one {"rank", "path"} per torch.save call


def _env(**extra) -> dict:
    """Extra environment for a child: course_lib importable whatever the working directory."""
    paths = [*extra.pop("prepend", []), str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p), "TQDM_DISABLE": "1", **extra}


def _arguments(settings: dict, out: Path) -> list[str]:
    args = ["--out", str(out)]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


SHUTDOWN_RACE = "terminate called without an active exception"


def _torchrun(nproc: int, port: int, log_dir: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--redirects", "3",
            "--log-dir", str(log_dir)]


def _on_a_free_port(command, timeout: float, **kwargs) -> tuple:
    """run_commands([command(port)]) on a free port; once more on another if someone took it in between.

    Returns (returncode, stdout, stderr, timed_out, attempt).
    """
    for attempt in range(2):
        (code, out, err, timed_out, _), = run_commands([command(free_port(), attempt)], timeout=timeout, **kwargs)
        if code == 0 or "EADDRINUSE" not in out + err:
            break
    return code, out, err, timed_out, attempt


def _read_jsonl(path: Path) -> list:
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            records.append({"unparsable line": line})
    return records


def _launch(tmp: Path, here: Path, world_size: int, settings: dict, timeout: float) -> DDPRun:
    """One torchrun launch of tmp/train_ddp.py writing into the fresh folder `here`; read back as a DDPRun."""
    out, logs, audit = here / "out", here / "torchrun_logs", here / "audit"
    audit.mkdir(parents=True)
    env = _env(prepend=[str(tmp / "site")], SCALE_OUT_AUDIT=str(audit))
    start = time.perf_counter()
    code, stdout, stderr, timed_out, attempt = _on_a_free_port(
        lambda port, attempt: _torchrun(world_size, port, logs / str(attempt))
        + [str(tmp / "train_ddp.py"), *_arguments(settings, out)], timeout, env=env, cwd=tmp)
    run = DDPRun(code, timed_out, time.perf_counter() - start, settings, world_size, stdout + stderr)
    for stream in ("stdout", "stderr"):
        for path in (logs / str(attempt)).glob(f"*/attempt_*/*/{stream}.log"):
            getattr(run, stream)[int(path.parent.name)] = path.read_text()
    if out.is_dir():
        run.files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        run.logs = {p.name: _read_jsonl(p) for p in sorted(out.glob("*.jsonl"))}
        if (out / "checkpoint.pt").is_file():
            try:
                run.checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - reported by check_checkpoint
                run.checkpoint = {"unloadable": f"{type(exc).__name__}: {exc}"}
    for path in sorted(audit.glob("*.jsonl")):
        run.saves += _read_jsonl(path)
    return run


def run_ddp(script: str, world_size: int = WORLD_SIZE, timeout: float = 90.0, quiet: bool = False,
            **overrides) -> DDPRun:
    """Run `script` (the text of a .py file) under torchrun on `world_size` CPU ranks; return a DDPRun.

    overrides change SETTINGS (e.g. epochs=1). Never raises for the script's own failures: they
    are in returncode/stderr, and the checks explain them.
    """
    if not isinstance(script, str):
        raise TypeError(f"script must be the text of a Python file (a str); got {type(script).__name__}")
    settings = {**SETTINGS, **overrides}
    tmp = Path(tempfile.mkdtemp(prefix="scale_out_"))
    try:
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(AUDIT)
        (tmp / "train_ddp.py").write_text(script)
        for launch in range(2):
            run = _launch(tmp, tmp / f"launch{launch}", world_size, settings, timeout)
            # PyTorch's gloo threads can abort a rank at interpreter exit even after destroy_process_group
            # (a known race in torch, not the student's fault): start that run once more from scratch.
            if run.returncode == 0 or not any(SHUTDOWN_RACE in text for text in run.stderr.values()):
                break
            if not quiet:
                print(f"(a rank hit PyTorch's gloo shutdown race, {SHUTDOWN_RACE!r}: running the script once more)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        print(f"torchrun, {world_size} ranks: exit code {run.returncode} after {run.seconds:.1f} s"
              + (" (killed at the deadline)" if run.timed_out else ""))
        for rank in sorted(run.stdout):
            print(f"--- rank {rank} printed:\n{run.stdout[rank].rstrip() or '(nothing)'}")
        if run.returncode != 0:
            rank = _failed_rank(run)
            print(f"--- rank {rank}'s error output (last lines):\n{_tail(run.stderr.get(rank, run.console))}")
    return run


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _failed_rank(run: DDPRun) -> int:
    with_traceback = [r for r, err in sorted(run.stderr.items()) if "Traceback" in err]
    return with_traceback[0] if with_traceback else 0


def _expect_success(run) -> None:
    expect(not run.timed_out,
           f"the script did not finish within the deadline ({run.seconds:.0f} s): a rank waiting in a collective "
           "that another rank never joins? (e.g. a barrier, or DDP's forward/backward, run by rank 0 only)")
    expect(run.returncode == 0, f"the script failed (exit code {run.returncode}). Rank {_failed_rank(run)}'s "
           f"error output ends with:\n{_tail(run.stderr.get(_failed_rank(run), run.console))}")


def _rank_log(run, rank: int) -> list:
    name = f"log_rank{rank}.jsonl"
    expect(name in run.logs, f"no {name}: each rank must write its own log, log_rank{{rank}}.jsonl (found "
           f"{sorted(run.logs) or 'no .jsonl file'}). "
           + ("All ranks appending to one log.jsonl interleave their lines and lose whose they were."
              if "log.jsonl" in run.logs else ""))
    return run.logs[name]


def check_rank_logs(run) -> None:
    """One log_rank{r}.jsonl per rank with a record per epoch; progress lines printed by rank 0 only."""
    _expect_success(run)
    epochs = run.settings["epochs"]
    for rank in range(run.world_size):
        records = _rank_log(run, rank)
        expect([r.get("epoch") for r in records] == list(range(epochs)),
               f"log_rank{rank}.jsonl should hold one record per epoch (epochs 0..{epochs - 1}); got epochs "
               f"{[r.get('epoch') for r in records]}")
    lines = {rank: [ln for ln in run.stdout.get(rank, "").splitlines() if ln.startswith("epoch")]
             for rank in range(run.world_size)}
    expect(len(lines[0]) == epochs, f"rank 0 should print {epochs} progress lines ('epoch ...'), one per epoch; "
           f"it printed {len(lines[0])}")
    chatty = [rank for rank in range(1, run.world_size) if lines[rank]]
    expect(not chatty, f"ranks {chatty} printed progress lines too: with N ranks the console shows every line N "
           "times. Print from rank 0 only (the per-rank details belong in log_rank{rank}.jsonl).")
    passed("rank_logs")


def expected_indices(n: int, rank: int, world_size: int, epoch: int, seed: int) -> list[int]:
    """The samples rank `rank` should train on in `epoch`: torch's DistributedSampler decides."""
    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def check_sampler(run) -> None:
    """Each rank's samples per epoch are DistributedSampler(seed=--seed)'s after set_epoch(epoch)."""
    _expect_success(run)
    n, seed, world = run.settings["samples"], run.settings["seed"], run.world_size
    logs = {rank: _rank_log(run, rank) for rank in range(world)}
    for rank in range(world):
        got = [record.get("indices") for record in logs[rank]]
        expect(not any(sorted(g or []) == list(range(n)) for g in got),
               f"rank {rank} trained on all {n} samples in an epoch: every rank repeats the whole dataset, so N "
               "ranks do N times the work for nothing. Give the DataLoader a DistributedSampler.")
        expect(len(got) < 2 or got[1] != got[0],
               f"rank {rank} trained on the same samples in the same order in epochs 0 and 1: call "
               "sampler.set_epoch(epoch) at the start of every epoch, or every epoch repeats the first one.")
        for epoch, indices in enumerate(got):
            want = expected_indices(n, rank, world, epoch, seed)
            if indices != want and indices == expected_indices(n, rank, world, epoch, 0):
                raise AssertionError(f"rank {rank}, epoch {epoch}: these are DistributedSampler's samples for seed 0, "
                                     f"but the run used --seed {seed}. Pass seed=args.seed to DistributedSampler.")
            expect(indices == want, f"rank {rank}, epoch {epoch}: expected DistributedSampler's samples "
                   f"{want[:8]}... ({len(want)} of them), got {(indices or [])[:8]}... ({len(indices or [])}). Hint: "
                   "DistributedSampler(dataset, shuffle=True, seed=args.seed), set_epoch(epoch), and no shuffle= "
                   "in the DataLoader.")
    passed("sampler")


def check_seeding(run) -> None:
    """The ranks drew different random noise (seeded with seed + rank), every epoch."""
    _expect_success(run)
    sums = {rank: [record.get("noise_sum") for record in _rank_log(run, rank)] for rank in range(run.world_size)}
    expect(all(len(s) == run.settings["epochs"] and all(isinstance(v, float) for v in s) for s in sums.values()),
           "every record in log_rank{rank}.jsonl needs the script's float noise_sum; keep the logging as given")
    for epoch in range(run.settings["epochs"]):
        values = [sums[rank][epoch] for rank in range(run.world_size)]
        expect(len(set(values)) == len(values),
               f"epoch {epoch}: the ranks drew identical noise (noise sums {values}). With the same seed on every "
               "rank, all ranks 'augment' their samples with the same random numbers. Seed with args.seed + rank "
               "(DDP still starts every rank from rank 0's weights).")
    passed("seeding")


def check_checkpoint(run) -> None:
    """checkpoint.pt is the only checkpoint, saved by rank 0 only, and loads into a plain LeNet300."""
    _expect_success(run)
    writers = sorted({str(s.get("rank")) for s in run.saves})
    expect(run.saves, "the script never called torch.save: write checkpoint.pt after every epoch, as the given "
           "script does")
    expect(writers == ["0"], f"torch.save was called by ranks {writers}: after the all-reduce every rank holds the "
           "same weights, so one writer is enough, and several writers race on the same file. Save on rank 0 only.")
    saved = [f for f in run.files if f.endswith((".pt", ".pth", ".ckpt"))]
    expect(saved == ["checkpoint.pt"], f"expected exactly one checkpoint, checkpoint.pt; the script left {saved}")
    state = run.checkpoint or {}
    expect("unloadable" not in state, f"checkpoint.pt does not load: {state.get('unloadable')}")
    expect({"epoch", "model", "optimizer"} <= set(state), f"checkpoint.pt should hold epoch, model and optimizer "
           f"(as the given script saves); it holds {sorted(state)}")
    expect(state["epoch"] == run.settings["epochs"] - 1,
           f"the checkpoint is from epoch {state['epoch']}, not the last epoch {run.settings['epochs'] - 1}")
    keys = list(state["model"])
    expect(not any(k.startswith("module.") for k in keys),
           "the model's keys start with 'module.': that is the DDP wrapper's state_dict. Save "
           "model.module.state_dict() so the checkpoint loads into a plain LeNet300 (for evaluation, or a run on "
           "a different number of ranks).")
    try:
        LeNet300().load_state_dict(state["model"])
    except RuntimeError as exc:
        raise AssertionError(f"checkpoint.pt's model does not load into LeNet300: {exc}") from None
    passed("checkpoint")


@functools.lru_cache(maxsize=4)
def _single_process(settings_items: tuple, global_batch: int, timeout: float) -> dict:
    settings = {**dict(settings_items), "batch_size": global_batch}
    with tempfile.TemporaryDirectory(prefix="scale_out_single_") as tmp:
        (code, out, err, timed_out, _), = run_commands(
            [[sys.executable, "-m", "course_lib.scale_out", *_arguments(settings, Path(tmp) / "out")]],
            timeout=timeout, env=_env())
        if code != 0 or timed_out:
            raise RuntimeError(f"the given single-process script failed (exit code {code}):\n{_tail(out + err)}")
        return {"checkpoint": torch.load(Path(tmp) / "out" / "checkpoint.pt", weights_only=True),
                "log": _read_jsonl(Path(tmp) / "out" / "log.jsonl")}


def single_process_reference(run, timeout: float = 90.0) -> dict:
    """The given script's checkpoint and log, run in one process at the DDP run's global batch size."""
    return _single_process(tuple(sorted(run.settings.items())), run.settings["batch_size"] * run.world_size, timeout)


def check_equivalence(run, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """The DDP run's final weights equal the single-process script's at the global batch (same order)."""
    _expect_success(run)
    expect(run.checkpoint and "model" in run.checkpoint, "no loadable checkpoint.pt with a 'model' to compare")
    reference = single_process_reference(run)["checkpoint"]["model"]
    got = {k.removeprefix("module."): v for k, v in run.checkpoint["model"].items()}
    expect(set(got) == set(reference),
           f"the checkpoint's parameters {sorted(got)} are not LeNet300's {sorted(reference)}")
    for name, want in reference.items():
        expect_close(got[name], want, f"final weights {name} vs one process with batch "
                     f"{run.world_size} x {run.settings['batch_size']}", atol=atol, rtol=rtol,
                     hint="N ranks x batch B must train exactly like one process with batch N*B on the same samples: "
                     "same initial weights on rank 0 (torch.manual_seed(args.seed + rank)), the same --lr (no "
                     "scaling here), DistributedSampler(seed=args.seed) with set_epoch, and DDP to average gradients.")
    passed("equivalence")


def check_torchrun_command(torchrun_command, nproc: int = 2, timeout: float = 60.0) -> None:
    """torchrun_command(script, nproc_per_node, port) -> argv that starts nproc ranks of this Python's torch."""
    tmp = Path(tempfile.mkdtemp(prefix="scale_out_probe_"))
    try:
        (tmp / "probe.py").write_text(PROBE)
        commands = []

        def command(port, attempt):
            cmd = torchrun_command(str(tmp / "probe.py"), nproc, port)
            expect(isinstance(cmd, (list, tuple)) and cmd and all(isinstance(a, str) for a in cmd),
                   f"return the command as a list of strings (an argv for subprocess.run); got {cmd!r}")
            commands.append(list(cmd))
            return commands[-1]

        code, out, err, timed_out, _ = _on_a_free_port(command, timeout, env=_env(), cwd=tmp)
        cmd = commands[-1]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    expect(not timed_out, f"the command did not finish within {timeout:.0f} s: {cmd}")
    expect(code == 0, f"the command failed (exit code {code}): {cmd}\n{_tail(out + err)}")
    reports = []
    for text in re.findall(r"\{[^{}]*\}", out):   # torchrun may prefix a rank's lines
        try:
            reports.append(json.loads(text))
        except ValueError:
            continue
    ranks = sorted(r.get("rank") for r in reports)
    expect(ranks == list(range(nproc)), f"expected {nproc} ranks (0..{nproc - 1}) to report, got ranks {ranks}. "
           f"Hint: --nproc_per_node, and the script path after torchrun's own options. The command printed:\n"
           f"{_tail(out + err)}")
    for r in reports:
        expect(r["world_size"] == nproc and r["sum"] == nproc * (nproc - 1) / 2,
               f"rank {r['rank']} saw world_size {r['world_size']} (expected {nproc}): the ranks did not form "
               "one group")
        expect(r["python"] == sys.executable and r["torch"] == torch.__version__,
               f"the ranks ran {r['python']} (torch {r['torch']}), not this kernel's {sys.executable} (torch "
               f"{torch.__version__}): a `torchrun` found on PATH may belong to another environment. Use "
               "[sys.executable, '-m', 'torch.distributed.run', ...].")
    passed("torchrun_command")
