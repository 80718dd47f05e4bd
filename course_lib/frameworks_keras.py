"""The course's model trained by Keras 3's `fit` on the torch backend (lecture 16); Keras is optional.

    from course_lib.frameworks_keras import keras_fit, load_keras
    keras = load_keras()                  # None (and a printed install line) when Keras is missing
    history = keras_fit(model, x, y, epochs=2, lr=0.1)

Keras 3 runs on JAX, TensorFlow or PyTorch; the backend is read once, from KERAS_BACKEND, when
keras is first imported, so `load_keras` sets it to "torch" before that. `TorchModuleWrapper` lets
Keras train a torch `nn.Module` as it is: its parameters become Keras variables that share their
storage, so `fit` updates the very same tensors (and they can be compared with the course's loop).
Keras with the torch backend has no data-parallel `fit`: `keras.distribution` has JAX (and
TensorFlow) implementations only; on PyTorch you wrap the model in DDP and write the loop yourself.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import torch
from torch import nn

from .validate import positive_int, positive_number

INSTALL = 'pip install "keras>=3"'


def load_keras():
    """The keras module on the torch backend, or None with a printed line saying what to install."""
    if importlib.util.find_spec("keras") is None:
        print(f"Keras is not installed; this part is skipped. To run it: {INSTALL}")
        return None
    backend = os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        keras = importlib.import_module("keras")
    except ImportError as exc:          # e.g. KERAS_BACKEND=jax without jax installed
        print(f"Keras did not import on the {backend!r} backend ({exc}); skipped. Set KERAS_BACKEND=torch before the "
              f"first `import keras` (restart the kernel).")
        return None
    if int(keras.__version__.split(".")[0]) < 3 or keras.backend.backend() != "torch":
        print(f"Keras {keras.__version__} on the {keras.backend.backend()!r} backend (KERAS_BACKEND={backend!r}) "
              f"cannot train a torch module; skipped. Needs Keras >= 3 with KERAS_BACKEND=torch set before the "
              f"first `import keras` (restart the kernel): {INSTALL}")
        return None
    return keras


def keras_fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 1, lr: float = 0.1,
              batch_size: int = 64) -> dict:
    """Train `model` (x [N,...] -> logits [N,C]) with Keras's `fit`: SGD(lr), cross-entropy on logits, batches
    in the given order (shuffle=False). Returns Keras's history: {"loss": [...], "accuracy": [...]} per epoch."""
    positive_int("epochs", epochs)
    positive_int("batch_size", batch_size)
    positive_number("lr", lr)
    keras = load_keras()
    if keras is None:
        raise ImportError(f"keras_fit needs Keras >= 3 on the torch backend: {INSTALL}")
    wrapped = keras.Sequential([keras.Input(tuple(x.shape[1:])), keras.layers.TorchModuleWrapper(model)])
    wrapped.compile(optimizer=keras.optimizers.SGD(learning_rate=lr),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = wrapped.fit(x.numpy(), y.numpy(), batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    return history.history
