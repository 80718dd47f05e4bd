"""2-D parallelism for the ViT: tensor parallel inside each block, FSDP over the data-parallel ranks.

world = dp x tp ranks on one DeviceMesh with dimensions ("dp", "tp"), row-major: rank = i·tp + j is data
rank i (its dp coordinate) and tensor rank j. The tp ranks of one row split every block by heads (q, k, v,
fc1 column-parallel; proj, fc2 row-parallel: `tensor_parallel_block.torch_plan` with torch's
`parallelize_module`) and so must see the SAME batch; the dp ranks of one column see different batches and
shard what they hold with FSDP2 (`fully_shard` per block, over "dp"). TP first, then FSDP: the order of
torchtitan (`parallelize_llama`), which FSDP2 requires for a parameter that is already a tp DTensor.
TP's all-reduces move activations inside a row (NVLink, one node); FSDP's all-gathers and
reduce-scatters move weights along a column (between nodes), once per block.

    from course_lib.distributed.fsdp_tp import compare_fsdp_tp
    compare_fsdp_tp(world_size=4, tp=2)          # 4 gloo ranks: equal to one process, bytes, collectives
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 4 -m course_lib.train --model vit \\
        --strategy fsdp_tp --tp 2 --json
"""
from __future__ import annotations

import copy
import logging
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..validate import positive_int
from ..vit import ViT
from .ddp import broadcast_parameters
from .sharding import gradient_bytes, optimizer_state_bytes, parameter_bytes, quiet_view_warning, shard_units
from .tensor_parallel_block import torch_plan

TP_MODELS = ("vit",)       # the models with a tensor-parallel plan


def check_tp(tp, world_size: int, model: nn.Module | None = None) -> int:
    """`tp` if it divides `world_size` and (given a model) the model has a TP plan whose heads it divides.

    ValueError naming --tp otherwise (the train CLI's flag; the same rules hold for the functions here).
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"--tp must be a positive int; got {tp!r}")
    if world_size % tp:
        raise ValueError(f"--tp {tp} must divide the world size {world_size} (dp = world size / tp ranks)")
    if model is not None:
        if not isinstance(model, ViT):
            raise ValueError(f"--tp: only --model {' or '.join(TP_MODELS)} has a tensor-parallel plan; "
                             f"got {type(model).__name__}")
        attn = model.blocks[0].attn
        heads = attn.q.out_features // attn.head_dim
        if heads % tp:
            raise ValueError(f"--tp {tp} must divide the ViT's {heads} heads (each tp rank holds whole heads)")
    return tp


def tp_split_names(model: ViT) -> set[str]:
    """Names of the parameters the TP plan splits over tp: column layers' weights and biases, row layers'
    weights. A row layer's bias is added after the all-reduce: replicated over tp, like norms and embeddings."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    names = set()
    for module, style in torch_plan(len(model.blocks)).items():
        if isinstance(style, ColwiseParallel):
            names |= {f"{module}.weight", f"{module}.bias"}
        elif isinstance(style, RowwiseParallel):
            names.add(f"{module}.weight")
    return names


def parallelize_vit(model: ViT, tp: int, reshard_after_forward: bool | None = None) -> ViT:
    """In place, on every rank: rank 0's weights everywhere, TP over "tp", then FSDP2 over "dp"; returns the model.

    Every parameter ends a DTensor: split ones on the 2-D mesh (dp Shard(0) of their tp shard), the others
    on the dp mesh (Shard(0)). One `fully_shard` per `sharding.shard_units` (patch embedding, each block,
    final norm, head), then the root (the position embedding).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    world = dist.get_world_size()
    check_tp(tp, world, model)
    broadcast_parameters(model)      # TP's distribute_tensor takes each tp row's first rank's weights: make them one
    quiet_view_warning()
    quiet_gather_warning()           # a full state dict (checkpoints) gathers every 2-D shard
    mesh = init_device_mesh(next(model.parameters()).device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], torch_plan(len(model.blocks)))
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    return model


def quiet_gather_warning() -> None:
    """Silence DTensor's note, on every rank, that gathering a 2-D shard (FSDP's rows of a TP shard: a
    _StridedShard) whole takes two all-gathers in a row: true, and the only way for these tensors (torch 2.14:
    "it is not possible to merge non-ascending order all_gather operations", flattened mesh or not)."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def _chunk(n: int, index: int, parts: int) -> int:
    """Length of piece `index` of torch.chunk(n rows, parts): ceil(n/parts) rows each, the last ones short or empty."""
    size = -(-n // parts)
    return max(0, min(size, n - index * size))


def expected_parameter_bytes(model: ViT, rank: int, world_size: int, tp: int, bytes_per_number: int = 4) -> dict:
    """This rank's parameter bytes under `parallelize_vit`, from the shapes of the plain `model`.

    "even": the formula 4·P_split/(dp·tp) + 4·P_rep/dp (P_split: numbers of `tp_split_names`, P_rep: the
    rest); the MEAN over ranks of what they hold. "exact": that rank's share with torch.chunk's uneven
    pieces: each parameter's tp shard (split along its output dim for column layers, input dim for row
    layers) cut along dim 0 into dp pieces (FSDP2's Shard(0)), piece dp-coordinate = rank // tp; a
    [1,16,64] position embedding has one row, all on dp rank 0.
    """
    dp, split = world_size // check_tp(tp, world_size), tp_split_names(model)
    p_split = sum(p.numel() for n, p in model.named_parameters() if n in split)
    p_rep = sum(p.numel() for n, p in model.named_parameters() if n not in split)
    exact = 0
    for name, p in model.named_parameters():
        shape = list(p.shape)
        if name in split:                      # row layers' weights are split along inputs, dim 1
            shape[1 if name.rsplit(".", 2)[-2] in ("proj", "fc2") else 0] //= tp
        exact += _chunk(shape[0], rank // tp, dp) * (torch.Size(shape).numel() // shape[0])
    return {"even": bytes_per_number * (p_split / (dp * tp) + p_rep / dp), "exact": bytes_per_number * exact,
            "tp_split_parameters": p_split, "replicated_parameters": p_rep}


def collective_counts(log) -> dict:
    """{"all_gather", "reduce_scatter", "all_reduce", ...: calls} from a CommDebugMode's counts by op."""
    names = {"_allgather_base_": "all_gather", "allgather_": "all_gather", "all_gather_into_tensor": "all_gather",
             "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
             "reduce_scatter_tensor": "reduce_scatter", "allreduce_": "all_reduce", "all_reduce": "all_reduce"}
    out = Counter()
    for op, calls in log.get_comm_counts().items():
        name = str(op).split(".")[-2] if str(op).count(".") >= 2 else str(op).split(".")[-1]
        out[names.get(name, name)] += calls
    return dict(out)


# --- one process against dp x tp ranks (lecture 17) ---------------------------------------------------

def _compare_worker(rank: int, world_size: int, tp: int, steps: int, batch: int) -> dict:
    """Worker: the same ViT + Adam, 2-D on this rank and whole in this process on the concatenated dp batches."""
    from torch.distributed.tensor.debug import CommDebugMode

    from ..models import max_diff

    torch.manual_seed(0)
    ref = ViT()
    model = parallelize_vit(copy.deepcopy(ref), tp)
    dp, data_rank = world_size // tp, rank // tp
    opt, ref_opt = (torch.optim.Adam(m.parameters(), lr=1e-3) for m in (model, ref))
    gen = torch.Generator().manual_seed(1)
    out = {"loss_diff": 0.0, "grad_diff": 0.0}
    for _ in range(steps):
        images, labels = torch.randn(dp * batch, 1, 28, 28, generator=gen), torch.randint(0, 10, (dp * batch,), generator=gen)
        mine = slice(data_rank * batch, (data_rank + 1) * batch)     # this rank's dp share; its tp row sees the same
        with CommDebugMode() as comm:
            loss = F.cross_entropy(model(images[mine]), labels[mine])
            loss.backward()
        ref_loss = F.cross_entropy(ref(images), labels)
        ref_loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean)                          # over dp x tp: the tp copies are equal, so the dp mean
        out["loss_diff"] = max(out["loss_diff"], abs(mean.item() / world_size - ref_loss.item()))
        out["grad_diff"] = max(out["grad_diff"], max_diff([p.grad for p in model.parameters()],
                                                          [p.grad for p in ref.parameters()]))
        out["grad_bytes"] = gradient_bytes(model)
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad(set_to_none=True)
    out.update(weight_diff=max_diff(model, ref), parameter_bytes=parameter_bytes(model),
               optimizer_bytes=optimizer_state_bytes(opt), collectives=collective_counts(comm),
               expected=expected_parameter_bytes(ref, rank, world_size, tp),
               adam_steps=sum(1 for s in opt.state.values() if "step" in s))
    return out


def compare_fsdp_tp(world_size: int = 4, tp: int = 2, steps: int = 2, batch: int = 8, timeout: float = 180) -> dict:
    """The ViT trained `steps` Adam steps on `world_size` gloo ranks (dp = world_size/tp x tp) against one
    process on the dp batches concatenated (dp·`batch` images); returns a plain dict:

    - "loss_diff", "grad_diff", "weight_diff": max |2-D - one process| over ranks and steps (the mean of the
      dp losses; every gradient, gathered whole; the weights after the last step: larger, since Adam divides
      by sqrt(v) and attention's k bias has a gradient that is 0 but for rounding, so it moves by up to lr);
    - per rank (lists, rank order): "parameter_bytes", "grad_bytes", "optimizer_bytes" (local shards of
      the DTensors) and "formula_exact" (`expected_parameter_bytes`' exact share);
    - "formula_even": 4·P_split/(dp·tp) + 4·P_rep/dp bytes, the mean over ranks of "parameter_bytes"
      (P_split: parameters the TP plan splits, P_rep: the rest); gradients are the same; Adam's two states
      (exp_avg, exp_avg_sq) double it, plus one 4-byte `step` tensor per parameter:
      optimizer = 2·parameters + 4·"parameter_tensors";
    - "collectives": one training step's (forward + backward) calls on rank 0 by kind, counted by torch's
      CommDebugMode: FSDP2's all-gathers and reduce-scatters (over dp) and TP's all-reduces (over tp).
    """
    from .launch import launch

    positive_int("world_size", world_size), positive_int("steps", steps), positive_int("batch", batch)
    check_tp(tp, world_size, ViT())
    ranks = launch(_compare_worker, world_size, tp, steps, batch, timeout=timeout)
    first = ranks[0]["expected"]
    return {"world_size": world_size, "dp": world_size // tp, "tp": tp, "steps": steps,
            "batch_per_dp_rank": batch, "parameters": first["tp_split_parameters"] + first["replicated_parameters"],
            "tp_split_parameters": first["tp_split_parameters"], "replicated_parameters": first["replicated_parameters"],
            "parameter_tensors": sum(1 for _ in ViT().parameters()),
            **{k: max(r[k] for r in ranks) for k in ("loss_diff", "grad_diff", "weight_diff")},
            **{k: [r[k] for r in ranks] for k in ("parameter_bytes", "grad_bytes", "optimizer_bytes")},
            "formula_exact": [r["expected"]["exact"] for r in ranks], "formula_even": first["even"],
            "collectives": ranks[0]["collectives"]}
