"""Checkpoints that survive a crash mid-write and load without running pickled code.

A checkpoint is written to a temporary file in the same folder and renamed over the old one:
`os.replace` is atomic on POSIX and Windows, so a reader (or a restarted job) sees either the
old file or the new one, never half of one. Loading uses `weights_only=True`, which refuses
arbitrary pickled objects, so store tensors, numbers, strings, lists and dicts only.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch


def save_checkpoint(path, state: dict) -> Path:
    """Atomically write `state` (a dict of tensors/state_dicts/plain values) to `path`."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict; got {type(state).__name__}")
    return _atomic(path, lambda f: torch.save(state, f))


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write `data` to `path` so that a reader sees the old file or the whole new one, never half."""
    return _atomic(path, lambda f: f.write(data))


def _atomic(path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path, map_location="cpu") -> dict:
    """Load a checkpoint written by `save_checkpoint` (weights_only: no code is unpickled)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location=map_location, weights_only=True)


def rng_state(device) -> dict:
    """The random state that decides the next dropout masks: the CPU's, and the GPU's on CUDA."""
    state = {"cpu": torch.get_rng_state()}
    if torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)   # dropout on a GPU draws from the GPU's generator
    return state


def set_rng_state(state, device) -> None:
    """Restore what `rng_state` returned (or a bare CPU state tensor, as older checkpoints hold)."""
    if isinstance(state, torch.Tensor):
        state = {"cpu": state}
    torch.set_rng_state(state["cpu"].cpu())
    if state.get("cuda") is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def optimizer_keyed_by_name(optimizer_state: dict) -> bool:
    """True for an optimizer state dict keyed by parameter name (FSDP's full state dicts), not by index."""
    params = optimizer_state["param_groups"][0]["params"]
    return bool(params) and isinstance(params[0], str)


class Checkpointer:
    """DIR/last.pt of a training run: model, optimizer, scheduler, loss scaler, every rank's RNG, position.

        ckpt = Checkpointer("runs/a", strategy, "net", model, optimizer, scheduler, scaler, steps_per_epoch, every=50)
        start_epoch, skip_batches = ckpt.restore()         # (0, 0) when there is nothing to resume
        fit(..., on_step_end=ckpt.on_step_end, on_epoch_end=ckpt.on_epoch_end)

    Every rank calls `save` (under FSDP gathering the state is a collective); rank 0 writes the
    file atomically, then all ranks wait for it. A run resumed from it, also mid-epoch (`every`
    optimizer steps), ends with the weights of the uninterrupted run: each rank gets its own RNG
    state back and the batches already trained in the epoch are skipped.
    `strategy` is a `course_lib.strategy` object (rank, gather, barrier, state dicts, how it keys
    optimizer state).
    """

    def __init__(self, directory, strategy, model_name: str, model, optimizer, scheduler, scaler,
                 steps_per_epoch: int, every: int | None = None):
        self.path = Path(directory) / "last.pt"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"checkpoint directory {str(directory)!r} cannot be created: {exc.strerror}") from None
        self.strategy, self.model_name, self.steps_per_epoch, self.every = strategy, model_name, steps_per_epoch, every
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.resumed_step = None      # the global step `restore` found

    def save(self, epoch: int, batches_done: int) -> None:
        """Write the state after `batches_done` batches of `epoch` (all ranks call this)."""
        rng = rng_state(self.strategy.device)
        rngs = self.strategy.gather(rng)
        model_state, optimizer_state = self.strategy.state_dicts(self.model, self.optimizer)
        if self.strategy.info.is_main:
            save_checkpoint(self.path, {
                "model_name": self.model_name, "epoch": epoch, "batches_done": batches_done,
                "step": epoch * self.steps_per_epoch + batches_done, "world_size": self.strategy.info.world_size,
                "strategy": self.strategy.name,
                "model": model_state, "optimizer": optimizer_state, "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": rng, "rng_per_rank": rngs})
        self.strategy.barrier()

    def on_step_end(self, epoch: int, batches_done: int) -> None:
        """For `fit`: save every `every` optimizer steps (epoch ends are saved by `on_epoch_end`)."""
        step = epoch * self.steps_per_epoch + batches_done
        if self.every and step % self.every == 0 and batches_done < self.steps_per_epoch:
            self.save(epoch, batches_done)

    def on_epoch_end(self, epoch: int, history=None) -> None:
        """For `fit`: save at the end of every epoch."""
        self.save(epoch, self.steps_per_epoch)

    def restore(self, device="cpu") -> tuple[int, int]:
        """Load last.pt if it exists: (epoch to start at, batches of it to skip); (0, 0) if there is none."""
        if not self.path.is_file():
            return 0, 0
        state = load_checkpoint(self.path, map_location=device)
        if state["model_name"] != self.model_name:
            raise SystemExit(f"{self.path} holds a {state['model_name']!r} model, not --model {self.model_name!r}")
        by_name = optimizer_keyed_by_name(state["optimizer"])
        if by_name != self.strategy.keys_optimizer_by_name:
            # the strategy that keys by name: the writer (files without its name: fsdp, then the only one) or this one
            named = state.get("strategy", "fsdp") if by_name else self.strategy.name
            word = "with" if by_name else "without"
            raise SystemExit(f"{self.path} was written {word} --strategy {named}; resume it {word} {named} "
                             f"({named} keys optimizer state by parameter name)")
        self.strategy.load_state_dicts(self.model, self.optimizer, state["model"], state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        info, rngs = self.strategy.info, state.get("rng_per_rank")
        set_rng_state(rngs[info.rank] if rngs and len(rngs) == info.world_size else state["rng"], device)
        done = state.get("batches_done", self.steps_per_epoch)   # epoch-end checkpoints: the epoch is complete
        self.resumed_step = state.get("step")
        return (state["epoch"] + 1, 0) if done >= self.steps_per_epoch else (state["epoch"], done)
