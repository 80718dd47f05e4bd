"""The course's training loop written with PyTorch-Ignite's Engine (lecture 16).

    from course_lib.frameworks_ignite import ignite_fit
    trainer, losses = ignite_fit(model, TensorLoader(x, y, batch_size=64), epochs=2, lr=5e-3)

Ignite keeps the loop visible: `create_supervised_trainer` is the step (zero_grad, forward, loss,
backward, step, in `course_lib.loop.train_epoch`'s order) and everything else is a handler attached
to an event. Here: Adam with a one-cycle schedule stepped every batch (as `course_lib.train`), and
the loader's `set_epoch` at each epoch start (as `course_lib.loop.fit`), so the same seed gives the
same weights as `fit`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:
    from ignite.engine import Engine, Events, create_supervised_evaluator, create_supervised_trainer
    from ignite.metrics import Accuracy, Loss
except ImportError as exc:   # a requirement of lecture 16 only
    raise ImportError("course_lib.frameworks_ignite (lecture 16) needs PyTorch-Ignite: "
                      "pip install 'course_lib[frameworks]' (or pip install pytorch-ignite)") from exc

from .validate import positive_int, positive_number


def ignite_fit(model: nn.Module, loader, epochs: int = 1, lr: float = 5e-3) -> tuple[Engine, list[float]]:
    """Train `model` with Adam(lr) and OneCycleLR(max_lr=lr) on `loader` ((x, y) batches, len() known).

    Returns the trainer (its `state` holds epoch and iteration counts) and the loss of every step.
    """
    positive_int("epochs", epochs)
    positive_number("lr", lr)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * len(loader))
    trainer = create_supervised_trainer(model, optimizer, F.cross_entropy)   # output: the loss as a float
    losses: list[float] = []

    @trainer.on(Events.EPOCH_STARTED)
    def reshuffle(engine):             # Ignite counts epochs from 1; DistributedSampler.set_epoch from 0
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(engine.state.epoch - 1)

    @trainer.on(Events.ITERATION_COMPLETED)
    def step_schedule_and_log(engine):
        schedule.step()
        losses.append(engine.state.output)

    trainer.run(loader, max_epochs=epochs)
    return trainer, losses


def ignite_evaluate(model: nn.Module, loader) -> dict:
    """{"accuracy", "loss"} over `loader`, computed by Ignite's metrics (accumulated per batch, as torchmetrics)."""
    evaluator = create_supervised_evaluator(model, metrics={"accuracy": Accuracy(), "loss": Loss(F.cross_entropy)})
    return dict(evaluator.run(loader).metrics)
