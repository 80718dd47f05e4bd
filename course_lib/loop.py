"""The training loop: `fit`, `train_epoch`, `evaluate`, `History`, and the optimizer/scheduler recipe.

It knows nothing of launchers: a DDP- or FSDP-wrapped model, a sharded loader or a resumed
position are passed in by the caller (`course_lib.train`, the torchrun CLI, is one). The CLI, the
benchmarks and most lectures train with `fit`; lectures that take a loop apart (the seed's
batch-4 loop, DataParallel and DDP from scratch, pipeline schedules, QAT, distillation) write their
own loop on purpose, to show the step they teach.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function
from tqdm.auto import tqdm

from .precision import autocast, check_precision, grad_scaler
from .validate import non_negative_int

OPTIMIZERS = ("sgd", "adam", "adamw")


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


def one_cycle(optimizer: torch.optim.Optimizer, lr: float, epochs: int, steps_per_epoch: int):
    """The course's schedule: lr warms up to `lr` over the first 30% of the steps, then anneals (cosine).

    Step it once per optimizer step (`fit(scheduler=...)` does).
    """
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, epochs=epochs, steps_per_epoch=steps_per_epoch)


def _to(batch, device):
    # non_blocking only helps when the source is pinned; it is harmless otherwise.
    return [t.to(device, non_blocking=True) for t in batch]


@torch.no_grad()
def evaluate(model: nn.Module, loader, device=None, reduce=None) -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy in [0, 1]) of `model` over `loader`.

    Batches are (x, y) or (x, y, weight) with weight 1 for a sample that counts and 0 for padding
    (`rank_data.EvalShardLoader`). `reduce(totals)` adds the float64 tensor [loss sum, hits, samples] over
    the ranks that each scored a part (`Strategy.sum_over_data`); the totals stay on the device until the end
    (one host transfer per evaluation, not two per batch).
    """
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    for batch in loader:
        x, y, *weight = _to(tuple(batch), device)
        logits = model(x)
        w = weight[0].to(torch.float64) if weight else torch.ones(len(y), dtype=torch.float64, device=device)
        totals += torch.stack([(F.cross_entropy(logits, y, reduction="none").double() * w).sum(),
                               ((logits.argmax(1) == y).double() * w).sum(), w.sum()])
    model.train(was_training)
    if reduce is not None:
        totals = reduce(totals)
    loss, correct, seen = totals.tolist()
    if seen == 0:
        raise ValueError("evaluate got an empty loader")
    return loss / seen, correct / seen


def train_epoch(model, loader, optimizer, device, loss_fn=F.cross_entropy, scheduler=None,
                history: History | None = None, desc: str = "train", progress: bool = True,
                skip_batches: int = 0, on_step_end=None, precision: str = "32", scaler=None) -> tuple[float, int]:
    """One pass over `loader`; returns (mean loss, number of samples).

    skip_batches: leave out the first k batches (resuming mid-epoch: they were trained already).
    on_step_end(batches_done): called after every batch, batches_done counting the skipped ones.
    precision: "32", "bf16" or "16" (`course_lib.precision`): autocast for the forward and loss;
    `scaler` (a GradScaler, fp16) scales the loss and skips steps whose gradients overflowed.
    `scheduler` advances after every optimizer step taken, not after a step the scaler skipped.
    history.step_loss gets this epoch's step losses at the end of the epoch, all at once (see below).
    """
    model.train()
    losses, sizes = [], []     # per step: the loss, detached, where it was computed; the batch size
    batches = itertools.islice(loader, skip_batches, None)
    # A DataLoader over an IterableDataset (a ShardStream) may not know its length: no total then.
    try:
        n_batches = max(len(loader) - skip_batches, 0)
    except TypeError:
        n_batches = None
    # tqdm.auto is tqdm.notebook in a kernel, which ignores TQDM_DISABLE: read it here, so CI and
    # `bench lectures` (which set it) draw no bars, and pass `disable` only to switch a bar off.
    off = not progress or os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")
    for i, (x, y) in enumerate(tqdm(batches, desc=desc, leave=False, total=n_batches,
                                    **({"disable": True} if off else {})), start=skip_batches + 1):
        with record_function("copy to device"):
            x, y = _to((x, y), device)
        optimizer.zero_grad(set_to_none=True)
        with record_function("forward"), autocast(precision, device):    # the names a trace shows (course_lib.trace)
            loss = loss_fn(model(x), y)
        stepped = True
        if scaler is None:
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
        else:
            with record_function("backward"):
                scaler.scale(loss).backward()
            with record_function("optimizer"):
                scaler.step(optimizer)           # unscales; skips the step if a gradient is inf/nan
                scale = scaler.get_scale()
                scaler.update()
            stepped = scaler.get_scale() >= scale   # a skipped step halved the scale
        if scheduler is not None and stepped:
            scheduler.step()
        # No loss.item() here: on a GPU it makes the host wait until this step's kernels have run, so it
        # cannot queue the next step's launches ahead, and a small model's step becomes launch-bound
        # (course_lib.simulate's host_s). The losses stay on the device and cross once, after the loop.
        # (fp16's GradScaler above still reads its scale every step: the skipped-step check needs it.)
        losses.append(loss.detach())                 # no kernel, no copy
        sizes.append(len(y))
        if on_step_end is not None:
            on_step_end(i)
    values = torch.stack(losses).float().tolist() if losses else []   # one copy to the host
    if history is not None:
        history.step_loss.extend(values)
    seen = sum(sizes)
    return sum(v * n for v, n in zip(values, sizes)) / max(seen, 1), seen


def fit(model: nn.Module, train_loader, val_loader=None, *, epochs: int = 1, optimizer=None,
        lr: float = 1e-3, device=None, loss_fn=F.cross_entropy, scheduler=None, progress: bool = True,
        log=print, start_epoch: int = 0, on_epoch_end=None, skip_batches: int = 0, on_step_end=None,
        precision: str = "32", scaler=None, val_reduce=None) -> History:
    """Train `model` for `epochs` passes over `train_loader`; evaluate on `val_loader` each epoch.

    optimizer defaults to Adam(lr). `scheduler` is stepped after every optimizer step taken (an
    fp16 step that the scaler skipped does not advance it). `on_epoch_end(epoch, history)` runs
    after each epoch (checkpointing uses it). Returns a History; images/s counts training only,
    not evaluation. `log=None` silences the per-epoch line (non-zero ranks).
    skip_batches: batches of the first epoch already trained (resume mid-epoch);
    `on_step_end(epoch, batches_done)` runs after every batch.
    precision: "32" (default), "bf16" (autocast; CPU or GPU) or "16" (autocast + GradScaler; CUDA
    only). The parameters stay fp32 (the master weights); evaluation runs in fp32.
    scaler: the GradScaler to use; "16" makes one when None. Pass your own to checkpoint its state
    (the current scale and its growth counter), so a resumed run scales as the interrupted one would.
    val_reduce: adds evaluate's sums over ranks that each score a part of `val_loader` (see evaluate).
    """
    non_negative_int("epochs", epochs)
    non_negative_int("skip_batches", skip_batches)
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
            vloss, vacc = evaluate(model, val_loader, device, val_reduce)
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
