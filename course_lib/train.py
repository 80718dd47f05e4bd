"""The one training loop of the course, and its command-line entry point.

    python -m course_lib.train                                  # Net on MNIST, defaults below
    python -m course_lib.train --model lenet300 --epochs 3 --json
    python -m course_lib.train --precision bf16 --json          # bf16 autocast; 16 = fp16 + GradScaler (CUDA)
    python -m course_lib.train --checkpoint-dir runs/a --resume   # continue after a crash
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m course_lib.train --strategy ddp --json
    torchrun --nnodes 2 --node_rank 0 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --nproc_per_node 4 \
        -m course_lib.train --strategy ddp --checkpoint-dir runs/b --checkpoint-every 50 --resume

`fit` is used by every notebook and script; the CLI is a thin layer over it. The CLI reads
RANK/WORLD_SIZE/LOCAL_RANK (set by torchrun) and logs from rank 0 only. With --json the last
stdout line is a JSON object (test_accuracy, train_seconds, images_per_second, world_size,
device, ...); under DDP images_per_second is the sum over ranks and --batch-size is per rank.

--strategy ddp (under torchrun): gloo on CPU, nccl on cuda:LOCAL_RANK; torch's
DistributedDataParallel; each rank trains on its own shard of the data each epoch
(`distributed.ddp.ShardedTensorLoader`, DistributedSampler's order); rank 0 downloads the data
first, then the others load it; rank 0 alone logs and writes checkpoints, behind a barrier.

--strategy fsdp (under torchrun): the same launch and data, but the model is sharded with FSDP2
(`distributed.sharding.shard_model`: rank 0's weights, then `fully_shard` per layer): each rank
keeps half (1/N) of the parameters, gradients and Adam state. Checkpoints hold FULL state dicts
gathered to rank 0 (`get_model_state_dict(..., full_state_dict=True, cpu_offload=True)`): the
model part loads into an unsharded model; --resume re-shards them (fsdp checkpoints resume with
fsdp only: their optimizer state is keyed by parameter name).

Fault tolerance: --checkpoint-every N writes DIR/last.pt atomically every N optimizer steps
(model, optimizer, scheduler, every rank's RNG, epoch, step); --resume continues from it, mid-
epoch, skipping the batches already done. Test hook: with COURSE_FAIL_AT_STEP=N (and
COURSE_FAIL_RANK=R, default 0) rank R dies with os._exit(1) right after global step N (after
that step's checkpoint, if one is due), but only in the first attempt (TORCHELASTIC_RESTART_COUNT
unset or "0"), so that `torchrun --max-restarts 1` restarts the group and it finishes.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .precision import PRECISIONS, autocast, check_precision, grad_scaler

OPTIMIZERS = ("sgd", "adam", "adamw")
STRATEGIES = ("single", "ddp", "fsdp")
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")


@dataclass
class History:
    """What happened during `fit`: one entry per epoch, plus every step's training loss."""

    train_loss: list = field(default_factory=list)      # mean over the epoch
    val_loss: list = field(default_factory=list)
    val_accuracy: list = field(default_factory=list)    # fraction in [0, 1]
    images_per_second: list = field(default_factory=list)
    epoch_seconds: list = field(default_factory=list)
    step_loss: list = field(default_factory=list)

    @property
    def train_seconds(self) -> float:
        return float(sum(self.epoch_seconds))

    @property
    def mean_images_per_second(self) -> float:
        rates = self.images_per_second
        return float(sum(rates) / len(rates)) if rates else 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def make_optimizer(name: str, params, lr: float, momentum: float = 0.9) -> torch.optim.Optimizer:
    """"sgd" (with momentum), "adam" or "adamw"."""
    if not lr > 0:
        raise ValueError(f"lr must be > 0; got {lr!r}")
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}; got {name!r}")


def _to(batch, device):
    # non_blocking only helps when the source is pinned; it is harmless otherwise.
    return [t.to(device, non_blocking=True) for t in batch]


@torch.no_grad()
def evaluate(model: nn.Module, loader, device=None) -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy in [0, 1]) of `model` over `loader`."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    for x, y in loader:
        x, y = _to((x, y), device)
        logits = model(x)
        total_loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        seen += len(y)
    model.train(was_training)
    if seen == 0:
        raise ValueError("evaluate got an empty loader")
    return total_loss / seen, correct / seen


def train_epoch(model, loader, optimizer, device, loss_fn=F.cross_entropy, scheduler=None,
                history: History | None = None, desc: str = "train", progress: bool = True,
                skip_batches: int = 0, on_step_end=None, precision: str = "32", scaler=None) -> tuple[float, int]:
    """One pass over `loader`; returns (mean loss, number of samples).

    skip_batches: leave out the first k batches (resuming mid-epoch: they were trained already).
    on_step_end(batches_done): called after each optimizer step, batches_done counting skipped ones.
    precision: "32", "bf16" or "16" (`course_lib.precision`): autocast for the forward and loss;
    `scaler` (a GradScaler, fp16) scales the loss and skips steps whose gradients overflowed;
    the scheduler does not advance on a skipped step.
    """
    model.train()
    total, seen = 0.0, 0
    batches = itertools.islice(loader, skip_batches, None)
    # A DataLoader over an IterableDataset (a ShardStream) may not know its length: no total then.
    try:
        n_batches = max(len(loader) - skip_batches, 0)
    except TypeError:
        n_batches = None
    # Pass `disable` only to switch the bar off: an explicit value would override TQDM_DISABLE.
    for i, (x, y) in enumerate(tqdm(batches, desc=desc, leave=False, total=n_batches,
                                    **({} if progress else {"disable": True})), start=skip_batches + 1):
        x, y = _to((x, y), device)
        optimizer.zero_grad(set_to_none=True)
        with autocast(precision, device):
            loss = loss_fn(model(x), y)
        stepped = True
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)           # unscales; skips the step if a gradient is inf/nan
            scale = scaler.get_scale()
            scaler.update()
            stepped = scaler.get_scale() >= scale   # a skipped step halved the scale
        if scheduler is not None and stepped:
            scheduler.step()
        value = loss.item()
        total += value * len(y)
        seen += len(y)
        if history is not None:
            history.step_loss.append(value)
        if on_step_end is not None:
            on_step_end(i)
    return total / max(seen, 1), seen


def fit(model: nn.Module, train_loader, val_loader=None, *, epochs: int = 1, optimizer=None,
        lr: float = 1e-3, device=None, loss_fn=F.cross_entropy, scheduler=None, progress: bool = True,
        log=print, start_epoch: int = 0, on_epoch_end=None, skip_batches: int = 0, on_step_end=None,
        precision: str = "32", scaler=None) -> History:
    """Train `model` for `epochs` passes over `train_loader`; evaluate on `val_loader` each epoch.

    optimizer defaults to Adam(lr). `scheduler` is stepped every batch. `on_epoch_end(epoch,
    history)` runs after each epoch (checkpointing uses it). Returns a History; images/s counts
    training only, not evaluation. `log=None` silences the per-epoch line (non-zero ranks).
    skip_batches: batches of the first epoch already trained (resume mid-epoch);
    `on_step_end(epoch, batches_done)` runs after every optimizer step.
    precision: "32" (default), "bf16" (autocast; CPU or GPU) or "16" (autocast + GradScaler; CUDA
    only). The parameters stay fp32 (the master weights); evaluation runs in fp32.
    scaler: the GradScaler to use; "16" makes one when None. Pass your own to checkpoint its state
    (the current scale and its growth counter), so a resumed run scales as the interrupted one would.
    """
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative int; got {epochs!r}")
    if isinstance(skip_batches, bool) or not isinstance(skip_batches, int) or skip_batches < 0:
        raise ValueError(f"skip_batches must be a non-negative int; got {skip_batches!r}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    check_precision(precision, device)
    model.to(device)
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler or None; got {type(scaler).__name__}")
    scaler = scaler if scaler is not None else grad_scaler(precision, device)
    history = History()
    for epoch in range(start_epoch, start_epoch + epochs):
        # Reshuffle per epoch wherever the order lives: our loaders, a DistributedSampler, a ShardStream.
        for obj in (train_loader, getattr(train_loader, "sampler", None), getattr(train_loader, "dataset", None)):
            if hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step_hook = None if on_step_end is None else (lambda done, e=epoch: on_step_end(e, done))
        loss, seen = train_epoch(model, train_loader, optimizer, device, loss_fn, scheduler, history,
                                 desc=f"epoch {epoch + 1}", progress=progress,
                                 skip_batches=skip_batches if epoch == start_epoch else 0, on_step_end=step_hook,
                                 precision=precision, scaler=scaler)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        history.train_loss.append(loss)
        history.epoch_seconds.append(seconds)
        history.images_per_second.append(seen / seconds)
        line = f"epoch {epoch + 1}: train loss {loss:.4f}, {seen / seconds:,.0f} images/s"
        if val_loader is not None:
            vloss, vacc = evaluate(model, val_loader, device)
            history.val_loss.append(vloss)
            history.val_accuracy.append(vacc)
            line += f", val loss {vloss:.4f}, val accuracy {100 * vacc:.2f}%"
        if log is not None:
            log(line)
        if on_epoch_end is not None:
            on_epoch_end(epoch, history)
    return history


def plot_history(history: History, ax=None, title: str | None = None):
    """Step losses (faint), epoch losses and validation accuracy on twin axes; returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.5))
    steps = len(history.step_loss)
    per_epoch = steps / max(len(history.train_loss), 1)
    ax.plot(range(1, steps + 1), history.step_loss, alpha=0.3, label="step loss")
    ends = [per_epoch * (i + 1) for i in range(len(history.train_loss))]
    ax.plot(ends, history.train_loss, "o-", label="epoch train loss")
    if history.val_loss:
        ax.plot(ends, history.val_loss, "s--", label="val loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend(loc="upper left")
    if history.val_accuracy:
        ax2 = ax.twinx()
        ax2.plot(ends, [100 * a for a in history.val_accuracy], "g^-", label="val accuracy")
        ax2.set_ylabel("val accuracy (%)", color="g")
    if title:
        ax.set_title(title)
    return ax


# --- command line ---------------------------------------------------------------------------

def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a {kind.__name__}; got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0; got {text!r}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    from .env import DEVICE_CHOICES
    from .models import MODELS

    p = argparse.ArgumentParser(prog="python -m course_lib.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="net")
    p.add_argument("--epochs", type=_positive(int), default=15)
    p.add_argument("--batch-size", type=_positive(int), default=64, help="per process")
    p.add_argument("--lr", type=_positive(float), default=5e-3, help="peak learning rate (one-cycle schedule)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    p.add_argument("--device", default="auto", help=f"one of {DEVICE_CHOICES} or cuda:N")
    p.add_argument("--data-dir", default=None, help="MNIST root (default: $COURSE_DATA_DIR, else data/)")
    p.add_argument("--train-subset", type=_positive(int), default=None, help="use the first N training images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None, help="write DIR/last.pt atomically after every epoch")
    p.add_argument("--checkpoint-every", type=_positive(int), default=None, metavar="STEPS",
                   help="also write DIR/last.pt every STEPS optimizer steps (resume continues mid-epoch)")
    p.add_argument("--resume", action="store_true", help="continue from DIR/last.pt if it exists")
    p.add_argument("--strategy", choices=STRATEGIES, default="single",
                   help="ddp: DistributedDataParallel; fsdp: FSDP2, parameters/gradients/optimizer state sharded "
                        "over the ranks; both one process per rank (launch with torchrun)")
    p.add_argument("--precision", choices=PRECISIONS, default="32",
                   help="bf16: bfloat16 autocast (CPU or GPU); 16: fp16 autocast + GradScaler (CUDA only)")
    p.add_argument("--memory-format", choices=MEMORY_FORMATS, default="auto",
                   help="channels_last stores conv weights and activations as NHWC, which oneDNN (CPU) and cuDNN "
                        "run much faster for small convolutions; auto: channels_last for models with Conv2d "
                        "layers, except under fsdp (it shards parameters as flat rows)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def resolve_memory_format(name: str, model: nn.Module, strategy: str = "single") -> torch.memory_format:
    """torch.channels_last or torch.contiguous_format for --memory-format `name` (see its help)."""
    if name not in MEMORY_FORMATS:
        raise ValueError(f"memory_format must be one of {MEMORY_FORMATS}; got {name!r}")
    if name == "auto":
        has_conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
        name = "channels_last" if has_conv and strategy != "fsdp" else "contiguous"
    return torch.channels_last if name == "channels_last" else torch.contiguous_format


def _fail_hook(rank: int, global_step: int) -> None:
    """COURSE_FAIL_AT_STEP / COURSE_FAIL_RANK: die like a killed worker (first attempt only)."""
    at = os.environ.get("COURSE_FAIL_AT_STEP")
    if not at or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
        return
    if global_step == int(at) and rank == int(os.environ.get("COURSE_FAIL_RANK", "0")):
        print(f"COURSE_FAIL_AT_STEP: rank {rank} exits at step {global_step}", file=sys.stderr, flush=True)
        os._exit(1)


def _setup_strategy(args, info):
    """(device, is_distributed): checks the launch, and joins the process group for ddp and fsdp."""
    from .env import get_device

    if args.strategy == "single":
        if info.world_size > 1:
            raise SystemExit(f"WORLD_SIZE={info.world_size} but --strategy single: every rank would train its own "
                             "model on all the data. Use --strategy ddp, or run one process without torchrun.")
        return get_device(args.device), False
    if "MASTER_ADDR" not in os.environ:
        raise SystemExit(f"--strategy {args.strategy} needs a launcher that sets RANK/WORLD_SIZE/MASTER_ADDR, e.g.\n"
                         f"  torchrun --standalone --nproc_per_node 2 -m course_lib.train --strategy {args.strategy}")
    device = get_device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise SystemExit(f"--strategy {args.strategy} runs on CPU (gloo) or CUDA (nccl), not {device.type}")
    timeout = datetime.timedelta(minutes=10)
    # After a torchrun restart the rendezvous store still holds the dead attempt's addresses:
    # give each attempt its own key space, or ranks would connect to the old, gone peers.
    store = torch.distributed.PrefixStore(
        f"attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}",
        torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), info.world_size,
                                   is_master=False, timeout=timeout))
    torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                                         rank=info.rank, world_size=info.world_size, timeout=timeout)
    return device, True


def run(args: argparse.Namespace) -> dict:
    """Train as the CLI does and return the summary dict (tests call this in-process)."""
    from .env import dist_info

    info = dist_info()
    if args.resume and not args.checkpoint_dir:
        raise SystemExit("--resume needs --checkpoint-dir (where to look for last.pt)")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise SystemExit("--checkpoint-every needs --checkpoint-dir (where to write last.pt)")
    if args.seed < 0:
        raise SystemExit(f"--seed must be >= 0; got {args.seed}")
    device, ddp = _setup_strategy(args, info)
    try:
        return _train(args, info, device, ddp)
    finally:
        if ddp:
            torch.distributed.destroy_process_group()


def _train(args, info, device, ddp: bool) -> dict:
    from .checkpoint import load_checkpoint, save_checkpoint
    from .data import load_tensors, mnist_loaders
    from .distributed.ddp import ShardedTensorLoader
    from .distributed.sharding import full_state_dicts, load_full_state_dicts, shard_model
    from .env import seed_everything
    from .models import build_model, count_parameters

    check_precision(args.precision, device, name="--precision")   # before any data is loaded
    dist = torch.distributed
    log = (print if not ddp else (lambda line: print(f"[rank 0 of {info.world_size}] {line}", flush=True))) \
        if info.is_main else None
    seed_everything(args.seed, info.rank)   # per-rank dropout; weights still equal: DDP broadcasts rank 0's
    if ddp:
        if info.is_main:                     # download on rank 0 only, then everyone reads the files
            load_tensors("train", args.data_dir, args.train_subset)
        dist.barrier()
    train_loader, test_loader = mnist_loaders(args.batch_size, args.data_dir, args.train_subset, device, args.seed)
    if ddp:
        train_loader = ShardedTensorLoader(*train_loader.tensors, batch_size=args.batch_size, rank=info.rank,
                                           world_size=info.world_size, seed=args.seed)
    model = build_model(args.model).to(device)
    fsdp = args.strategy == "fsdp"
    memory_format = resolve_memory_format(args.memory_format, model, args.strategy)
    model.to(memory_format=memory_format)
    if fsdp:
        shard_model(model)                   # before the optimizer: it must see the sharded parameters
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr)
    scaler = grad_scaler(args.precision, device)      # fp16: None otherwise
    steps_per_epoch = len(train_loader)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, epochs=args.epochs,
                                                    steps_per_epoch=steps_per_epoch)
    start, skip = 0, 0
    ckpt_path = Path(args.checkpoint_dir) / "last.pt" if args.checkpoint_dir else None
    if args.resume and ckpt_path.is_file():
        state = load_checkpoint(ckpt_path, map_location=device)
        if state["model_name"] != args.model:
            raise SystemExit(f"{ckpt_path} holds a {state['model_name']!r} model, not --model {args.model!r}")
        by_name = isinstance(state["optimizer"]["param_groups"][0]["params"][0], str)   # fsdp wrote it
        if by_name != fsdp:
            raise SystemExit(f"{ckpt_path} was written {'with' if by_name else 'without'} --strategy fsdp; resume it "
                             f"{'with' if by_name else 'without'} fsdp (fsdp keys optimizer state by parameter name)")
        if fsdp:
            load_full_state_dicts(model, optimizer, state["model"], state["optimizer"])
        else:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        rngs = state.get("rng_per_rank")
        rng = rngs[info.rank] if rngs and len(rngs) == info.world_size else state["rng"]
        torch.set_rng_state(rng.cpu())
        done = state.get("batches_done", steps_per_epoch)   # epoch-end checkpoints: the epoch is complete
        start, skip = (state["epoch"] + 1, 0) if done >= steps_per_epoch else (state["epoch"], done)
        if log:
            log(f"resumed from {ckpt_path} at epoch {start + 1}, batch {skip} (global step {state.get('step')})")
    train_model = model
    if args.strategy == "ddp":
        train_model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                                          else None)

    def checkpoint(epoch, batches_done):
        """All ranks call this: gather every rank's RNG, rank 0 writes, everyone waits for the file."""
        if ckpt_path is None:
            return
        rng = torch.get_rng_state()
        rngs = [rng]
        if ddp:
            rngs = [None] * info.world_size
            dist.all_gather_object(rngs, rng)
        # fsdp: a collective that gathers the full (unsharded) state dicts to rank 0
        model_state, optimizer_state = (full_state_dicts(model, optimizer) if fsdp
                                        else (model.state_dict(), optimizer.state_dict()))
        if info.is_main:
            save_checkpoint(ckpt_path, {"model_name": args.model, "epoch": epoch, "batches_done": batches_done,
                                        "step": epoch * steps_per_epoch + batches_done,
                                        "world_size": info.world_size, "model": model_state,
                                        "optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
                                        "scaler": scaler.state_dict() if scaler is not None else None,
                                        "rng": rng, "rng_per_rank": rngs})
        if ddp:
            dist.barrier()

    def on_step_end(epoch, batches_done):
        step = epoch * steps_per_epoch + batches_done
        if args.checkpoint_every and step % args.checkpoint_every == 0 and batches_done < steps_per_epoch:
            checkpoint(epoch, batches_done)          # epoch ends are written by on_epoch_end
        _fail_hook(info.rank, step)

    if log:
        log(f"training {args.model} ({count_parameters(model):,} parameters) on {device}, "
            f"{train_loader.dataset_size:,} training images, epochs {start + 1}..{args.epochs}"
            + (f", {info.world_size} ranks x batch {args.batch_size}" if ddp else ""))
    history = fit(train_model, train_loader, test_loader, epochs=max(args.epochs - start, 0), optimizer=optimizer,
                  device=device, scheduler=scheduler, progress=not args.no_progress and info.is_main, log=log,
                  start_epoch=start, skip_batches=skip, on_step_end=on_step_end,
                  on_epoch_end=lambda epoch, _h: checkpoint(epoch, steps_per_epoch), precision=args.precision,
                  scaler=scaler)
    test_loss, test_acc = evaluate(model, test_loader, device)
    rate = torch.tensor([history.mean_images_per_second], dtype=torch.float64, device=device)
    if ddp:
        dist.all_reduce(rate)                # throughput of the whole job: the sum over ranks
    return {"model": args.model, "parameters": count_parameters(model), "device": str(device),
            "strategy": args.strategy, "precision": args.precision, "world_size": info.world_size,
            "memory_format": "channels_last" if memory_format is torch.channels_last else "contiguous",   # as the flag
            "epochs": args.epochs,
            "epochs_run": len(history.train_loss), "batch_size": args.batch_size,
            "global_batch_size": args.batch_size * info.world_size, "lr": args.lr, "optimizer": args.optimizer,
            "seed": args.seed, "train_samples": train_loader.dataset_size, "test_samples": test_loader.dataset_size,
            "test_loss": round(test_loss, 6), "test_accuracy": round(test_acc, 6),
            "train_seconds": round(history.train_seconds, 3),
            "images_per_second": round(rate.item(), 1),
            "images_per_second_note": "sum over ranks" if ddp else "one process"}


def main(argv=None) -> int:
    from .data import MNISTNotFoundError
    from .env import DeviceUnavailableError, dist_info

    args = build_parser().parse_args(argv)
    try:
        summary = run(args)
    except (MNISTNotFoundError, DeviceUnavailableError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not dist_info().is_main:
        return 0
    print(f"test accuracy {100 * summary['test_accuracy']:.2f}% on {summary['test_samples']:,} images after "
          f"{summary['train_seconds']:.1f} s of training ({summary['images_per_second']:,.0f} images/s)")
    if args.json:
        print(json.dumps(summary))
    return 0


def _exit_without_teardown(code: int) -> None:
    """End a torchrun worker now: the process group is destroyed and the output is written.

    With gloo, a worker thread can still be releasing the last collective's tensors (which needs
    the GIL) while the interpreter shuts down; it is then killed inside the GIL and the process
    aborts (SIGABRT, "terminate called without an active exception"), failing a finished run.
    os._exit skips the interpreter's teardown, and with it the race.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_code = main()
    if "MASTER_ADDR" in os.environ:   # launched by torchrun (or SLURM): gloo or nccl has run
        _exit_without_teardown(exit_code)
    sys.exit(exit_code)
