"""Counting a model's work: FLOPs per training image, and model FLOPs utilisation (MFU).

torch.utils.flop_counter.FlopCounterMode watches every aten operator a call runs and adds up the
FLOPs of the matmul-like ones (mm, addmm, bmm, convolution and their backward), 2 FLOPs per
multiply-add, from the tensor shapes. It ignores elementwise work (ReLU, pooling, the loss,
bias adds, the optimizer): for CNNs and MLPs those are a few percent of the total.

A training step is the forward plus the backward. A layer's backward does about twice its
forward's multiply-adds (the gradient of the input and of the weight, each the size of the
forward), except that nothing is computed for a gradient nobody needs, such as the input image's.

MFU = achieved model FLOP/s / the device's THEORETICAL peak FLOP/s (PaLM, Chowdhery et al. 2022,
Appendix B: model FLOPs / (time x peak FLOP/s of the hardware); `hardware.peak_flops`): how much of
the machine the model's own arithmetic uses. The numerator counts only the model's FLOPs, so
recomputation or padding cannot inflate it. Divided by the achievable peak instead (the best
measured matmul, `hardware.achievable_flops`) it says how far the run is from a well-tuned kernel
on the same machine: larger, and not comparable across machines.

    from course_lib.flops import count_flops, training_flops_per_image, mfu
    count_flops(lambda: model(x))                  # forward FLOPs of one call
    training_flops_per_image(Net())                # 2,595,000 (forward 961,000 + backward)
    mfu(2.595e6, images_per_second=5000, peak_flops=100e9)   # 0.13
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .validate import positive_int


def count_flops(fn) -> int:
    """FLOPs of the matmuls and convolutions that `fn()` runs (FlopCounterMode's total)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable; got {fn!r}")
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def training_flops_per_image(model: nn.Module, batch_size: int = 64, image_shape=(1, 28, 28)) -> float:
    """Training FLOPs per image: forward + backward of one step on one batch, over the batch size.

    FlopCounterMode counts the matmuls and convolutions (2 FLOPs per multiply-add) of the forward
    and of the backward (the gradients of weights and of inputs that need them); elementwise ops,
    the loss and the optimizer step are not counted.

    Counted on a copy of `model` on the meta device (shapes only: no arithmetic, no memory, no
    random numbers drawn, and `model`'s gradients stay untouched). For the course's models the
    count is the same for any batch size. A DDP or FSDP wrapper: pass the plain model inside.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    positive_int("batch_size", batch_size)
    shadow = copy.deepcopy(model).to(device="meta").train()
    x = torch.empty(batch_size, *image_shape, device="meta")
    y = torch.zeros(batch_size, dtype=torch.long, device="meta")     # class labels: any value will do
    return count_flops(lambda: F.cross_entropy(shadow(x), y).backward()) / batch_size


def mfu(flops_per_image: float, images_per_second: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: flops_per_image * images_per_second / peak_flops (a fraction).

    peak_flops: the theoretical peak in FLOP/s (`hardware.peak_flops(device).flops`); the measured
    `hardware.achievable_flops(device).flops` gives the achievable MFU.
    """
    for name, value in (("flops_per_image", flops_per_image), ("images_per_second", images_per_second),
                        ("peak_flops", peak_flops)):
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name} must be a number > 0; got {value!r}")
    return flops_per_image * images_per_second / peak_flops
