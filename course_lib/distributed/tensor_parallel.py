"""Tensor parallelism from scratch: column- and row-parallel Linear layers on N ranks (Megatron-LM style).

A Linear y = x W^T + b with W [out, in] can be cut two ways across N ranks:

- column-parallel: rank r keeps rows r of W (out/N output features) and b's matching slice, and
  computes its slice of y, [batch, out/N], from the whole x. Joining the slices (all-gather along
  the last dim) gives y. In backward every rank holds only part of dL/dx: they are summed (all-reduce).
- row-parallel: rank r keeps columns r of W (in/N input features) and sees only its slice of x,
  [batch, in/N]; x_r W_r^T is a partial sum of y: an all-reduce adds them. b is added once, after.

Column then row (an MLP's two Linears) needs no communication in between: the column layer's
output slices are exactly the row layer's input slices. One all-reduce per MLP forward, one in
backward, and each rank stores 1/N of the weights: what ColwiseParallel/RowwiseParallel do in
`torch.distributed.tensor.parallel`. The communication sits in four autograd functions, each the
other's transpose: copy (fwd identity / bwd all-reduce), reduce (fwd all-reduce / bwd identity),
split (fwd take my slice / bwd all-gather), gather (fwd all-gather / bwd take my slice). Sequence
parallelism (Korthikanti et al. 2022) splits the all-reduce in two, each the other's transpose:
reduce-scatter (fwd reduce-scatter / bwd all-gather) and sequence gather (fwd all-gather / bwd
reduce-scatter), over the sequence dimension; course_lib.distributed.tensor_parallel_block uses them.

    from course_lib.distributed.launch import launch
    from course_lib.distributed.tensor_parallel import compare_tensor_parallel
    launch(compare_tensor_parallel, 2)     # max |difference| to the unsharded layers and to torch's TP
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..env import rank_device
from ..models import max_diff


def shard_range(size: int, rank: int, world_size: int) -> slice:
    """The slice of `size` features rank `rank` owns; `size` must divide evenly (as torch's TP requires here)."""
    if size % world_size:
        raise ValueError(f"size={size} features cannot be split evenly over world_size={world_size} ranks")
    n = size // world_size
    return slice(rank * n, (rank + 1) * n)


def _all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)


def _my_slice(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    mine = shard_range(x.shape[dim], dist.get_rank(), dist.get_world_size())
    return x.narrow(dim, mine.start, mine.stop - mine.start).contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over ranks, keep this rank's 1/N along `dim`: half an all-reduce's traffic."""
    shard_range(x.shape[dim], 0, dist.get_world_size())           # refuses a size that does not divide
    parts = [p.contiguous() for p in x.chunk(dist.get_world_size(), dim=dim)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts)
    return out


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()                     # never reduce in place into a tensor autograd may still need
    dist.all_reduce(x)
    return x


class _Copy(torch.autograd.Function):
    """Forward: x is used whole by every rank. Backward: each rank has part of dL/dx; sum them."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad)


class _Reduce(torch.autograd.Function):
    """Forward: add the ranks' partial sums. Backward: every rank gets the whole gradient (identity)."""

    @staticmethod
    def forward(ctx, x):
        return _all_reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Split(torch.autograd.Function):
    """Forward: keep this rank's slice of dim `dim` (default last). Backward: all-gather the slices' gradients."""

    @staticmethod
    def forward(ctx, x, dim=-1):
        ctx.dim = dim
        return _my_slice(x, dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim), None


class _Gather(torch.autograd.Function):
    """Forward: all-gather the slices along `dim` (default last). Backward: keep this rank's slice
    (whatever follows is replicated: every rank computed the same whole gradient)."""

    @staticmethod
    def forward(ctx, x, dim=-1):
        ctx.dim = dim
        return _all_gather(x, dim)

    @staticmethod
    def backward(ctx, grad):
        return _my_slice(grad, ctx.dim), None


class _ReduceScatter(torch.autograd.Function):
    """Forward: add the ranks' partial sums, keep my slice of `dim`. Backward: all-gather the gradient."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return _reduce_scatter(x, dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim), None


class _GatherForParallel(torch.autograd.Function):
    """Forward: all-gather along `dim`. Backward: reduce-scatter, because what follows is column-parallel and
    each rank's gradient is a partial sum (sequence parallelism's replacement for _Copy)."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return _all_gather(x, dim)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.dim), None


class ColumnParallelLinear(nn.Module):
    """This rank's output-feature slice of `full` (weight [out/N, in]); x [.., in] -> y [.., out/N or out].

    gather_output=True all-gathers y to [.., out]; False leaves the slice for a RowParallelLinear.
    copy_input=False: the caller already entered the parallel region (one _Copy for attention's q, k and v
    together, or a sequence-parallel all-gather), so backward does not all-reduce dL/dx once per layer.
    """

    def __init__(self, full: nn.Linear, gather_output: bool = True, copy_input: bool = True):
        super().__init__()
        rows = shard_range(full.out_features, dist.get_rank(), dist.get_world_size())
        self.weight = nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rows].clone()) if full.bias is not None else None
        self.gather_output, self.copy_input = gather_output, copy_input

    def forward(self, x):
        y = F.linear(_Copy.apply(x) if self.copy_input else x, self.weight, self.bias)
        return _Gather.apply(y) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """This rank's input-feature slice of `full` (weight [out, in/N]); y [.., out] is the same on every rank.

    input_is_sharded=True takes x [.., in/N] (a ColumnParallelLinear's output); False takes the whole
    x [.., in] and keeps this rank's slice. The bias is added once, after the all-reduce.
    sequence_parallel=True reduce-scatters over dim 1 instead (x [B,S,in/N] -> y [B,S/N,out]): the same sum,
    each rank keeping 1/N of the tokens.
    """

    def __init__(self, full: nn.Linear, input_is_sharded: bool = True, sequence_parallel: bool = False):
        super().__init__()
        cols = shard_range(full.in_features, dist.get_rank(), dist.get_world_size())
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone())
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None
        self.input_is_sharded, self.sequence_parallel = input_is_sharded, sequence_parallel

    def forward(self, x):
        x = x if self.input_is_sharded else _Split.apply(x)
        partial = F.linear(x, self.weight)
        y = _ReduceScatter.apply(partial, 1) if self.sequence_parallel else _Reduce.apply(partial)
        return y + self.bias if self.bias is not None else y


def tensor_parallel_mlp(mlp: nn.Sequential) -> nn.Sequential:
    """(Linear, act, Linear) -> (ColumnParallel without gather, act, RowParallel): one all-reduce each way."""
    first, act, second = mlp
    return nn.Sequential(ColumnParallelLinear(first, gather_output=False), act, RowParallelLinear(second))


# --- worker for `launch` (tests and notebook 09) -----------------------------------------------------

def compare_tensor_parallel(rank: int, world_size: int, batch: int = 6, d_in: int = 8, hidden: int = 16,
                            d_out: int = 4) -> dict:
    """Max |difference| of outputs and gradients: ours vs the unsharded layers, and torch's TP vs ours.

    Keys: "column_out", "column_grad" (weight, bias, input), "row_out", "row_grad", "mlp_out", "mlp_grad":
    our layers vs an unsharded copy (this rank's slice of the full gradient). "torch_out", "torch_grad":
    torch's ColwiseParallel/RowwiseParallel on a DeviceMesh vs ours (its local weight shards' gradients).
    "local_weight_shapes": our two MLP weights' shapes on this rank.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    device = rank_device()
    torch.manual_seed(0)                              # the same full layers and data on every rank
    mlp = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out)).to(device)
    x = torch.randn(batch, d_in, device=device)
    out: dict = {}

    def run(model, inp):
        """Output and dL/dx for the loss sum(v * y), v fixed and random: every output gets its own gradient."""
        inp = inp.clone().requires_grad_()
        y = model(inp)
        v = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(device)
        (v * y).sum().backward()
        return y, inp.grad

    cols, rows = shard_range(hidden, rank, world_size), shard_range(d_in, rank, world_size)
    cases = {
        "column": (ColumnParallelLinear(copy.deepcopy(mlp[0])), copy.deepcopy(mlp[0]), x, (cols, slice(None))),
        "row": (RowParallelLinear(copy.deepcopy(mlp[0]), input_is_sharded=False), copy.deepcopy(mlp[0]), x,
                (slice(None), rows)),
    }
    for name, (ours, ref, inp, (r, c)) in cases.items():
        y, gx = run(ours, inp)
        y_ref, gx_ref = run(ref, inp)
        bias_ref = ref.bias.grad[r] if name == "column" else ref.bias.grad
        out[f"{name}_out"] = max_diff(y, y_ref)
        out[f"{name}_grad"] = max_diff([ours.weight.grad, ours.bias.grad, gx],
                                     [ref.weight.grad[r, c], bias_ref, gx_ref])

    ours, ref = tensor_parallel_mlp(copy.deepcopy(mlp)), copy.deepcopy(mlp)
    y, gx = run(ours, x)
    y_ref, gx_ref = run(ref, x)
    out["mlp_out"] = max_diff(y, y_ref)
    out["mlp_grad"] = max_diff([ours[0].weight.grad, ours[0].bias.grad, ours[2].weight.grad, ours[2].bias.grad, gx],
                               [ref[0].weight.grad[cols], ref[0].bias.grad[cols], ref[2].weight.grad[:, cols],
                                ref[2].bias.grad, gx_ref])
    out["local_weight_shapes"] = [tuple(ours[0].weight.shape), tuple(ours[2].weight.shape)]

    mesh = init_device_mesh(device.type, (world_size,))
    theirs = parallelize_module(copy.deepcopy(mlp), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    y_t, gx_t = run(theirs, x)
    out["torch_out"] = max_diff(y_t, y)
    out["torch_grad"] = max_diff([theirs[0].weight.grad.to_local(), theirs[2].weight.grad.to_local(), gx_t],
                                 [ours[0].weight.grad, ours[2].weight.grad, gx])
    return out
