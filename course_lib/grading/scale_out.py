"""The practicum "scale it out": the single-process training script that students turn into DDP.

    python -m course_lib.grading.scale_out --out runs/single    # 2 epochs on 512 MNIST images

It trains LeNet-300-100 (no dropout) with SGD on the first `--samples` MNIST training images and
adds Gaussian noise to every input batch (a stand-in for data augmentation, drawn from torch's
global random generator). Each epoch visits the samples in the order
torch.randperm(n) seeded with seed + epoch, so two runs with the same flags repeat exactly.
What it writes to --out:

    log.jsonl       one JSON line per epoch: {"epoch", "indices" (the samples trained on, in
                    order), "loss" (mean), "noise_sum" (sum of the noise drawn: a fingerprint
                    of the random stream)}
    checkpoint.pt   {"epoch", "model", "optimizer"} (state dicts), rewritten after every epoch

and it prints one progress line per epoch. The graders run it with --batch-size equal to the
DDP run's global batch: N ranks x batch B must end with the same weights as this script at N*B.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from course_lib.data import load_tensors
from course_lib.models import LeNet300


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train LeNet-300-100 on MNIST in one process.")
    p.add_argument("--out", required=True, help="folder for log.jsonl and checkpoint.pt")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=512, help="train on the first N MNIST images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--noise", type=float, default=0.1, help="std of the noise added to the inputs")
    p.add_argument("--data-dir", default=None, help="MNIST root (default: $COURSE_DATA_DIR)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)                          # the model's weights and the noise
    x, y = load_tensors("train", args.data_dir, args.samples)
    dataset = TensorDataset(x, y, torch.arange(len(y)))  # each sample carries its index, for the log
    model = LeNet300()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(args.seed + epoch))
        loader = DataLoader(Subset(dataset, order.tolist()), batch_size=args.batch_size)
        indices, total, noise_sum = [], 0.0, 0.0
        for xb, yb, idx in loader:
            noise = torch.randn_like(xb)
            noise_sum += noise.sum().item()
            loss = F.cross_entropy(model(xb + args.noise * noise), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            indices += idx.tolist()
            total += loss.item() * len(yb)
        record = {"epoch": epoch, "indices": indices, "loss": total / len(indices), "noise_sum": noise_sum}
        with open(out / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   out / "checkpoint.pt")
        print(f"epoch {epoch + 1}/{args.epochs}: loss {record['loss']:.4f}", flush=True)


if __name__ == "__main__":
    main()
