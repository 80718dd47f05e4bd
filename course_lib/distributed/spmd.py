"""SPMD: ONE program on a 2-D device mesh, data parallel over "dp" and tensor parallel over "tp".

TF-Replicator (Buchlovsky et al., "TF-Replicator: Distributed Machine Learning for Researchers", 2019)
let a researcher write the step of ONE replica and copied it over the devices. Its successor is SPMD
(single program, multiple data): one program over a mesh of devices, where sharding annotations, not
per-device code, decide what each device holds (GSPMD in XLA, JAX's jit with shardings, PyTorch's
DTensor). `spmd_program` is such a program: every rank runs it unchanged; its coordinates in the mesh
pick its slice of the batch (dp) and its shard of each weight (tp).

    from course_lib.distributed.launch import launch
    from course_lib.distributed.spmd import spmd_program, train_single
    ranks = launch(spmd_program, 4)      # 2 x 2 mesh: same losses and weights as train_single()
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..env import rank_device

MESH_DIMS = ("dp", "tp")


def make_mlp(d_in: int = 8, hidden: int = 16, d_out: int = 4) -> nn.Sequential:
    """The same seeded (Linear, ReLU, Linear) on every rank and in the single-process reference."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def make_batch(batch: int = 8, d_in: int = 8, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch, x [batch, d_in] and labels [batch]; every rank builds it and keeps its dp slice."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, d_in, generator=g), torch.randint(0, classes, (batch,), generator=g)


def parallelize(model: nn.Sequential, mesh) -> nn.Module:
    """Annotate, don't rewrite: Linear 0 column-parallel and Linear 2 row-parallel over mesh["tp"].

    Each weight becomes a DTensor sharded over "tp" and replicated over "dp"; the all-reduce the row
    layer needs in forward and the column layer in backward is inserted by DTensor, not written here.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})


def average_over_dp(model: nn.Module, mesh) -> None:
    """Data parallel: average each gradient shard with the ranks that hold the same shard (the dp submesh)."""
    group, n = mesh["dp"].get_group(), mesh["dp"].size()
    for p in model.parameters():
        grad = p.grad.to_local()              # this rank's shard of the gradient (a view: reduce in place)
        dist.all_reduce(grad, group=group)
        grad /= n


def spmd_program(rank: int, world_size: int, dp: int = 2, tp: int = 2, steps: int = 3, lr: float = 0.1) -> dict:
    """Worker: the same SGD steps on every rank of a dp x tp mesh; what this rank held and computed.

    Keys: "coords" (dp index, tp index), "batch_rows" (its slice of the batch), "losses" (whole-batch
    loss per step), "full" (every weight after the steps, gathered with full_tensor()), "local" (name ->
    shape of this rank's shard), "shard" (name -> which part of the full weight it is, e.g. "[0:8, :]").
    """
    from torch.distributed.device_mesh import init_device_mesh

    if world_size != dp * tp:
        raise ValueError(f"world_size={world_size} must equal dp * tp = {dp} * {tp}")
    device = rank_device()
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=MESH_DIMS)
    model = parallelize(make_mlp().to(device), mesh)
    x, y = make_batch()
    me = mesh["dp"].get_local_rank()
    rows = slice(me * len(x) // dp, (me + 1) * len(x) // dp)
    x, y = x[rows].to(device), y[rows].to(device)         # my dp slice of the batch
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)               # the mean over my slice
        loss.backward()
        average_over_dp(model, mesh)                     # equal slices: the mean of the means is the batch mean
        opt.step()
        whole = loss.detach().clone()
        dist.all_reduce(whole, group=mesh["dp"].get_group())
        losses.append(whole.item() / dp)
    params = dict(model.named_parameters())
    return {"coords": (me, mesh["tp"].get_local_rank()), "batch_rows": (rows.start, rows.stop), "losses": losses,
            # numpy, not tensors: a tensor returned from a worker lives in its shared memory, gone when it exits
            "full": {n: p.full_tensor().detach().cpu().numpy() for n, p in params.items()},
            "local": {n: tuple(p.to_local().shape) for n, p in params.items()},
            "shard": {n: shard_label(p) for n, p in params.items()}}


def shard_label(p) -> str:
    """Which part of the full tensor a DTensor on a 1-D mesh keeps on this rank: "[0:8, :]", "[:]"."""
    index = [":"] * p.dim()
    for placement in p.placements:
        if placement.is_shard():
            d, n = placement.dim, p.to_local().shape[placement.dim]
            start = p.device_mesh.get_local_rank() * n
            index[d] = f"{start}:{start + n}"
    return "[" + ", ".join(index) + "]"


def train_single(steps: int = 3, lr: float = 0.1) -> dict:
    """The reference: the same model, the whole batch, one process. Keys "losses", "full"."""
    model, (x, y) = make_mlp(), make_batch()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "full": {n: p.detach().clone() for n, p in model.named_parameters()}}


def max_difference(ranks: list[dict], reference: dict) -> float:
    """Largest |difference| over ranks, losses and gathered weights against the single-process run."""
    diffs = [abs(a - b) for r in ranks for a, b in zip(r["losses"], reference["losses"], strict=True)]
    diffs += [float(abs(r["full"][n] - w.numpy()).max()) for r in ranks for n, w in reference["full"].items()]
    return max(diffs)


def holdings(ranks: list[dict]) -> list[dict]:
    """One row per rank for a table: rank, mesh coordinates, batch rows, each weight's shard and local shape."""
    return [{"rank": r, "dp": out["coords"][0], "tp": out["coords"][1], "batch rows": "{}:{}".format(*out["batch_rows"]),
             **{n: f"{out['shard'][n]} {list(out['local'][n])}" for n in out["local"]}} for r, out in enumerate(ranks)]


def draw_mesh(ranks: list[dict], ax=None):
    """The dp x tp mesh as a grid: a box per rank with its coordinates, batch rows and weight shards."""
    import matplotlib.pyplot as plt

    dp = 1 + max(out["coords"][0] for out in ranks)
    tp = 1 + max(out["coords"][1] for out in ranks)
    if ax is None:
        _, ax = plt.subplots(figsize=(2.9 * tp + 1, 1.9 * dp + 0.8))
    colours = plt.get_cmap("tab10")
    for r, out in enumerate(ranks):
        i, j = out["coords"]
        ax.add_patch(plt.Rectangle((j + 0.04, dp - 1 - i + 0.04), 0.92, 0.92, facecolor=colours(j), alpha=0.25,
                                   edgecolor="black"))
        lines = [f"rank {r}  (dp={i}, tp={j})", f"batch rows {out['batch_rows'][0]}:{out['batch_rows'][1]}"]
        lines += [f"{n} {out['shard'][n]}" for n in out["shard"]]
        ax.text(j + 0.5, dp - 1 - i + 0.5, "\n".join(lines), ha="center", va="center", fontsize=8, family="monospace")
    ax.set(xlim=(0, tp), ylim=(0, dp), xticks=[t + 0.5 for t in range(tp)], yticks=[dp - 0.5 - d for d in range(dp)],
           xticklabels=[f"tp={t}" for t in range(tp)], yticklabels=[f"dp={d}" for d in range(dp)])
    ax.set_xlabel('"tp": same batch rows, different weight shards (all-reduce inside the layer pair)')
    ax.set_ylabel('"dp": same shards,\nother rows (all-reduce grads)')
    ax.tick_params(length=0)
    return ax
