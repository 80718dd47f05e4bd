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

`engineering_table()` counts, in course_lib's own source, the lines that do each of those jobs by
hand (counted from the code at run time, so notebook 16's table stays true when the code changes).
`manual_accumulate_and_clip` is the raw-PyTorch meaning of two Trainer flags, and `FlagProbe` a tiny
LightningModule that records what the Trainer did, to check such mappings.
"""
from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


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


def nested_function(func, name: str) -> str:
    """The source of the function `name` defined inside `func`."""
    source = textwrap.dedent(inspect.getsource(func))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(source, node)
    raise LookupError(f"{func.__qualname__} defines no function {name!r}")


def statements_mentioning(func, *words: str) -> list[str]:
    """Code lines of the statements in `func` whose own text (a block's header line) contains one of `words`.

    A matching `if`/`for`/`with` counts with its whole block; otherwise the search goes inside it.
    """
    source = textwrap.dedent(inspect.getsource(func))
    lines, keep = source.splitlines(), set()

    def visit(statements):
        for node in statements:
            inner = [n for field in ("body", "orelse", "finalbody", "handlers") for n in getattr(node, field, [])
                     if isinstance(n, (ast.stmt, ast.excepthandler))]
            own = lines[node.lineno - 1:(inner[0].lineno - 1 if inner else node.end_lineno)]
            if any(w in text for text in own for w in words):
                keep.update(range(node.lineno, node.end_lineno + 1))
            else:
                visit(inner)

    visit(ast.parse(source).body[0].body)
    code = set(code_lines(source))
    return [lines[i - 1] for i in sorted(keep) if lines[i - 1] in code]


def engineering_table() -> list[dict]:
    """One row per engineering job: where course_lib does it by hand, how many code lines, and Lightning's way."""
    from . import checkpoint, train
    from .distributed import ddp

    rows = [
        ("process group, backend, one device per rank", "`train._setup_strategy`",
         code_lines(inspect.getsource(train._setup_strategy)),
         '`Trainer(accelerator=..., devices=N, strategy="ddp")`'),
        ("wrap the model in DDP", "statements of `train._train`",
         statements_mentioning(train._train, "DistributedDataParallel", "train_model = model"),
         "the strategy does it"),
        ("shard the data per rank; reshuffle each epoch",
         "`ddp.shard_indices`, `ddp.ShardedTensorLoader`, `set_epoch` in `train.fit`",
         code_lines(inspect.getsource(ddp.shard_indices)) + code_lines(inspect.getsource(ddp.ShardedTensorLoader))
         + statements_mentioning(train.fit, "set_epoch"), "a `DistributedSampler` injected, `set_epoch` called"),
        ("device placement", "`train._to`, `.to(device)` in `train._train`",
         code_lines(inspect.getsource(train._to)) + statements_mentioning(train._train, ".to(device)"),
         "`accelerator=` moves the model and the batches"),
        ("log from rank 0 only; sum throughput over ranks", "statements of `train._train` and `train.main`",
         statements_mentioning(train._train, "log = ", "all_reduce(rate")
         + statements_mentioning(train.main, "is_main"),
         "`self.log(..., sync_dist=True)`; loggers write on rank 0"),
        ("checkpoint on rank 0 behind a barrier; resume",
         "`checkpoint.save_checkpoint`/`load_checkpoint`, `checkpoint()` and resume in `train._train`",
         code_lines(inspect.getsource(checkpoint.save_checkpoint))
         + code_lines(inspect.getsource(checkpoint.load_checkpoint))
         + code_lines(nested_function(train._train, "checkpoint"))
         + statements_mentioning(train._train, "args.resume", "ckpt_path =", "checkpoint_every"),
         '`ModelCheckpoint` callback; `trainer.fit(..., ckpt_path="last")`'),
    ]
    return [{"job": job, "course_lib": where, "lines": len(lines), "lightning": instead}
            for job, where, lines, instead in rows]


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
