"""Notebook 07's DDP run written for PyTorch Lightning, and what the framework takes off our hands.

    import lightning.pytorch as L
    from course_lib.frameworks import LitClassifier, mnist_dataloaders
    train, val = mnist_dataloaders(batch_size=64, train_subset=2048)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_notebook", max_epochs=1)
    trainer.fit(LitClassifier("lenet300"), train, val)

`LitClassifier` is exactly what `python -m course_lib.train` trains (a course model, Adam with a
one-cycle schedule stepped every batch, cross-entropy); the Trainer does the engineering: process
group, DistributedSampler and set_epoch, device placement, rank-0 logging, checkpoints. It lives
in a module because a spawned process (strategy="ddp_spawn") must import it by name.

`engineering_table()` counts the code lines of the course_lib functions and classes that do each
of those jobs by hand (`ENGINEERING_JOBS`, a table of names: counted from the code at run time, so
notebook 16's table stays true when the code changes).
`FEATURES` / `features_table()`: which API of Lightning, Ignite and Keras 3 takes over each engineering job
(looked up in the installed packages, so a renamed API shows). The Ignite and Keras runs themselves live in
`frameworks_ignite` and `frameworks_keras`; Horovod's steps in `horovod_map`.
`manual_accumulate_and_clip` is the raw-PyTorch meaning of two Trainer flags, and `FlagProbe` a tiny
LightningModule that records what the Trainer did, to check such mappings.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import io
import os
import textwrap
import tokenize

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as L
except ImportError as exc:   # lightning is an extra: the rest of course_lib does not need it
    raise ImportError("course_lib.frameworks (lecture 16) needs Lightning: pip install 'course_lib[frameworks]' "
                      "(or pip install lightning)") from exc


class LitClassifier(L.LightningModule):
    """A course model (`course_lib.models.MODELS`) trained as `course_lib.train` trains it."""

    def __init__(self, model: str = "net", lr: float = 5e-3):
        super().__init__()
        from .models import build_model

        self.save_hyperparameters()
        self.model = build_model(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # [N,1,28,28] -> logits [N,10]
        return self.model(x)

    def on_train_start(self):   # how many threads the Trainer gave this rank (notebook 16 checks it)
        self.log("threads_per_rank", float(torch.get_num_threads()), sync_dist=True)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_accuracy", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        # estimated_stepping_batches = epochs x batches per rank: the same schedule as course_lib.train's
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams.lr,
                                                       total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def mnist_dataloaders(batch_size: int = 64, train_subset: int | None = None, val_subset: int | None = None,
                      root=None) -> tuple[DataLoader, DataLoader]:
    """Plain (train, val) DataLoaders over MNIST tensors. Under DDP Lightning swaps their samplers for
    DistributedSampler(shuffle=True for train, seed 0) and calls set_epoch: the order course_lib.train uses."""
    from .data import load_tensors

    x, y = load_tensors("train", root, train_subset)
    xt, yt = load_tensors("test", root, val_subset)
    return (DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True),
            DataLoader(TensorDataset(xt, yt), batch_size=1000))


# --- counting the engineering code that a framework replaces ---------------------------------------

def code_lines(source: str) -> list[str]:
    """The lines of `source` that hold code: no blank lines, comments or docstrings."""
    source = textwrap.dedent(source)
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    code_rows = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                 if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                     tokenize.DEDENT, tokenize.ENDMARKER)}
    lines = source.splitlines()
    return [lines[i - 1] for i in sorted(code_rows - docstrings)]


# One row per engineering job that `python -m course_lib.train --strategy ddp` does by hand: the
# course_lib objects that do it (whole functions, classes or methods, "module:qualname") and what
# replaces them in Lightning. Lines are counted in those objects as they are now.
ENGINEERING_JOBS = [
    ("process group, backend, one device per rank",
     ["course_lib.strategy:setup_strategy", "course_lib.strategy:Strategy.start",
      "course_lib.strategy:_join_process_group"],
     '`Trainer(accelerator=..., devices=N, strategy="ddp")`'),
    ("wrap the model in DDP; gather, sum and wait across ranks",
     ["course_lib.strategy:DDP", "course_lib.strategy:Strategy.gather", "course_lib.strategy:Strategy.barrier",
      "course_lib.strategy:Strategy.sum", "course_lib.strategy:Strategy.close"], "the strategy does it"),
    ("shard the data per rank; reshuffle each epoch",
     ["course_lib.rank_data:shard_indices", "course_lib.rank_data:ShardedTensorLoader",
      "course_lib.train:_loaders"], "a `DistributedSampler` injected, `set_epoch` called"),
    ("device placement", ["course_lib.loop:_to", "course_lib.env:get_device"],
     "`accelerator=` moves the model and the batches"),
    ("checkpoint on rank 0 behind a barrier; resume",
     ["course_lib.checkpoint:save_checkpoint", "course_lib.checkpoint:load_checkpoint",
      "course_lib.checkpoint:Checkpointer"], '`ModelCheckpoint` callback; `trainer.fit(..., ckpt_path="last")`'),
]


def _resolve(name: str):
    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def engineering_table() -> list[dict]:
    """One row per engineering job: where course_lib does it by hand, how many code lines, and Lightning's way."""
    rows = []
    for job, names, instead in ENGINEERING_JOBS:
        lines = sum(len(code_lines(inspect.getsource(_resolve(n)))) for n in names)
        where = ", ".join(f"`{n.replace(':', '.').removeprefix('course_lib.')}`" for n in names)
        rows.append({"job": job, "course_lib": where, "lines": lines, "lightning": instead})
    return rows


# --- who does each engineering job, framework by framework ----------------------------------------

FRAMEWORKS = ("course_lib", "Lightning", "Ignite", "Keras 3 (torch)")
# One row per job: per framework the API that does it ("module:attribute", resolved by `features_table`,
# so a renamed API shows up) and how it is used; None: the framework has nothing for it.
FEATURES = [
    ("training loop", [("course_lib.loop:fit", "written by hand"), ("lightning.pytorch:Trainer", "`trainer.fit`"),
                       ("ignite.engine:create_supervised_trainer", "an Engine with the step; you keep the loop body"),
                       ("keras:Model", "`model.fit`")]),
    ("device placement", [("course_lib.env:get_device", "`.to(device)` on model and every batch"),
                          ("lightning.pytorch:Trainer", "`accelerator=`"),
                          ("ignite.distributed:auto_model", "`device=` of the trainer, or `idist.auto_model`"),
                          ("keras.config:backend", "the torch backend picks the GPU when one is visible")]),
    ("distributed setup", [("course_lib.strategy:setup_strategy", "process group, DDP, samplers by hand"),
                           ("lightning.pytorch:Trainer", '`devices=N, strategy="ddp"`'),
                           ("ignite.distributed:Parallel", "`idist.Parallel(backend=...)` + `auto_dataloader/optim`"),
                           None]),
    ("checkpointing", [("course_lib.checkpoint:Checkpointer", "rank 0, behind a barrier; resume"),
                       ("lightning.pytorch.callbacks:ModelCheckpoint", "on by default"),
                       ("ignite.handlers:Checkpoint", "a handler on an event"),
                       ("keras.callbacks:ModelCheckpoint", "a callback")]),
    ("logging", [("course_lib.loop:History", "rank 0 prints; History keeps the numbers"),
                 ("lightning.pytorch.loggers:CSVLogger", "`self.log(...)`; CSV, TensorBoard, W&B, ..."),
                 ("ignite.handlers:TensorboardLogger", "loggers attached to events"),
                 ("keras.callbacks:CSVLogger", "`History` returned by fit; callbacks")]),
    ("early stopping", [None, ("lightning.pytorch.callbacks:EarlyStopping", "a callback"),
                        ("ignite.handlers:EarlyStopping", "a handler"),
                        ("keras.callbacks:EarlyStopping", "a callback")]),
    ("metrics", [("course_lib.loop:evaluate", "accuracy and loss by hand"), ("torchmetrics:Accuracy", "torchmetrics"),
                 ("ignite.metrics:Accuracy", "accumulated over batches, synced across ranks"),
                 ("keras.metrics:SparseCategoricalAccuracy", '`metrics=["accuracy"]`')]),
]


def features_table() -> list[dict]:
    """FEATURES with every API looked up: {"job", framework: "`api` how" | "—" | "(not installed)"}.

    A framework that is not installed reads "(not installed)"; an API that moved raises AttributeError."""
    os.environ.setdefault("KERAS_BACKEND", "torch")   # keras reads it once, at its first import
    rows = []
    for job, cells in FEATURES:
        row = {"job": job}
        for framework, cell in zip(FRAMEWORKS, cells):
            if cell is None:
                row[framework] = "—"
                continue
            name, how = cell
            try:
                _resolve(name)
            except ModuleNotFoundError:
                row[framework] = "(not installed)"
                continue
            row[framework] = f"`{name.replace(':', '.')}`: {how}"
        rows.append(row)
    return rows


# --- Trainer flags, in raw PyTorch ----------------------------------------------------------------

def manual_accumulate_and_clip(model: nn.Module, batches, lr: float, accumulate: int = 1,
                               clip: float | None = None) -> nn.Module:
    """One epoch of SGD as Trainer(accumulate_grad_batches=accumulate, gradient_clip_val=clip) runs it.

    Each loss is divided by `accumulate` (so k micro-batches add up to the mean of one big batch); the
    norm of the summed gradient is clipped to `clip` just before each step; the last batch of the epoch
    always steps, even when fewer than `accumulate` batches were collected.
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = list(batches)
    for i, (x, y) in enumerate(batches):
        (F.cross_entropy(model(x), y) / accumulate).backward()
        if (i + 1) % accumulate == 0 or i + 1 == len(batches):
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()
    return model


class FlagProbe(L.LightningModule):
    """Wraps `model` (logits out), trains it with SGD(lr), and records what the Trainer did:
    `dtypes` (of the logits, per step), `autocast` (was autocast on?), `steps` (optimizer steps)."""

    def __init__(self, model: nn.Module, lr: float = 0.1):
        super().__init__()
        self.model, self.lr = model, lr
        self.dtypes, self.autocast, self.steps = [], [], 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.model(x)
        self.dtypes.append(logits.dtype)
        self.autocast.append(torch.is_autocast_enabled(x.device.type))
        return F.cross_entropy(logits, y)

    def on_before_optimizer_step(self, optimizer):
        self.steps += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit_quietly(module: L.LightningModule, loader, **trainer_flags) -> L.Trainer:
    """One epoch on one CPU device, no logger, checkpoint or progress bar; returns the Trainer."""
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **trainer_flags)
    trainer.fit(module, loader)
    return trainer
