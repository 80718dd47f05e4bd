"""The MNIST models of the course's trainer (`MODELS`, by CLI name). Every model returns logits [N, 10].

- `Net`: the seed's model from the classic PyTorch MNIST example (21,840 parameters).
  Identical layers; only the final `log_softmax` is gone, because CrossEntropyLoss applies
  it itself (notebook 01 explains why the original's extra log_softmax was harmless but wrong).
- `LeNet300`: LeNet-300-100, the fully connected net of the Deep Compression paper (266,610).
- `LeNet5`: LeNet-5 as in Caffe and the Deep Compression paper, 20-50-500-10 (431,080).
- "vit": `course_lib.vit.ViT`, the small Vision Transformer of lecture 17 (204,938), the one model with a
  tensor-parallel plan (`--strategy fsdp_tp`).

`count_parameters` sizes a model; `max_diff` is the course's "same result?" measure between two
models' parameters (or gradients, or tensors).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .vit import ViT


class Net(nn.Module):
    """conv 1->10 k5, conv 10->20 k5 + Dropout2d, fc 320->50 + dropout, fc 50->10.  [N,1,28,28] -> [N,10]"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))                   # [N,10,12,12]
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))  # [N,20,4,4]
        x = x.flatten(1)                                             # [N,320]
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return self.fc2(x)


class LeNet300(nn.Module):
    """784 -> 300 -> 100 -> 10 with ReLU.  [N,1,28,28] or [N,784] -> [N,10]"""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 300)
        self.fc2 = nn.Linear(300, 100)
        self.fc3 = nn.Linear(100, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class LeNet5(nn.Module):
    """Caffe's LeNet: conv 20 k5, pool, conv 50 k5, pool, fc 800->500 + ReLU, fc 500->10.

    As in Caffe's `lenet_train_test.prototxt` there is no non-linearity after the convolutions.
    [N,1,28,28] -> [N,10]
    """

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, kernel_size=5)
        self.conv2 = nn.Conv2d(20, 50, kernel_size=5)
        self.fc1 = nn.Linear(800, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.conv1(x), 2)   # [N,20,12,12]
        x = F.max_pool2d(self.conv2(x), 2)   # [N,50,4,4]
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


MODELS = {"net": Net, "lenet300": LeNet300, "lenet5": LeNet5, "vit": ViT}


def build_model(name: str) -> nn.Module:
    """A fresh model by its CLI name: one of MODELS ("net", "lenet300", "lenet5", "vit")."""
    try:
        return MODELS[name]()
    except KeyError:
        raise ValueError(f"model must be one of {sorted(MODELS)}; got {name!r}") from None


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter elements (buffers excluded)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def max_diff(a, b) -> float:
    """Largest ``|a - b|`` as a float: between two modules' parameters (in order), two equal-length
    sequences of tensors (gradients, numpy arrays), or two tensors. 0.0 when there is nothing to compare.

    DTensors (FSDP2, tensor parallel) are gathered into full tensors first, so every rank must call
    it alike. Shapes must match exactly (broadcasting would hide a wrong layout); NaN propagates.
    """
    if isinstance(a, nn.Module) and isinstance(b, nn.Module):
        a, b = a.parameters(), b.parameters()
    elif isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        a, b = [a], [b]
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"max_diff compares tensors (parameters) pairwise; got {len(a)} and {len(b)}")
    diffs = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x is None or y is None:
            raise ValueError(f"max_diff: tensor {i} is None on one side (a parameter without a gradient?)")
        x, y = (_full(t.detach()) if isinstance(t, torch.Tensor) else torch.as_tensor(t) for t in (x, y))
        if x.shape != y.shape:
            raise ValueError(f"max_diff: tensor {i} has shapes {tuple(x.shape)} and {tuple(y.shape)}")
        if x.numel():
            diffs.append((x - y.to(x.device)).abs().max().double().cpu())
    return torch.stack(diffs).max().item() if diffs else 0.0


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a DTensor (a collective: all ranks gather it); any other tensor as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
