"""Tensor and sequence parallelism for a transformer block (course_lib.vit.Block), on N ranks.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): attention's q, k and v are column-parallel BY HEADS
(rank r holds heads r·H/N..(r+1)·H/N-1, i.e. output features r·D/N..(r+1)·D/N-1 of each), every head's
attention is computed where its q, k, v are, and the output projection is row-parallel: one all-reduce in
forward (after proj) and one in backward (at the block's entry, _Copy). The MLP is column (fc1) then row
(fc2): one more each way. Two all-reduces of [B,S,D] per block forward, two in backward.

Sequence parallelism (Korthikanti et al. 2022): the regions between those all-reduces (LayerNorm, residual
add, dropout) do the same work on every rank. Split them over the S tokens instead: each all-reduce becomes a
reduce-scatter (after the row-parallel layer: [B,S,D] partial sums -> [B,S/N,D] sums) and an all-gather (before
the column-parallel one: [B,S/N,D] -> [B,S,D]). A ring moves 2(N-1)/N·M bytes per rank for an all-reduce of M
bytes and (N-1)/N·M for each of these: the same traffic, while the norms' activations shrink to 1/N. The
norms' weights (and the row layers' biases) then see only S/N tokens per rank: their gradients are
all-reduced after backward (`all_reduce_sequence_parallel_grads`).

Activations kept for backward per block, in numbers (fp32: x4 bytes), eager attention, no dropout:
one process 16BSD + 4BS + HBS²; tensor parallel 4BSD + 4BS + (12BSD + HBS²)/N; sequence parallel
2BSD + (14BSD + 4BS + HBS²)/N (`block_activation_numbers`). The 2BSD left whole is the all-gathered input
that q/k/v and fc1 keep; Megatron-LM keeps its 1/N shard instead and gathers it again in backward.

    from course_lib.distributed.launch import launch
    from course_lib.distributed.tensor_parallel_block import compare_tensor_parallel_block
    launch(compare_tensor_parallel_block, 2)   # ours vs one process vs torch's parallelize_module, bytes
"""
from __future__ import annotations

import copy
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..validate import positive_int
from ..vit import ViT, Block
from .tensor_parallel import (ColumnParallelLinear, RowParallelLinear, _Copy, _Gather, _GatherForParallel, _Split,
                              shard_range)

SEQ = 1      # the sequence dimension of [B,S,D]


class TensorParallelBlock(nn.Module):
    """This rank's part of `block` (a vit.Block).  x [B,S,D] -> [B,S,D], or [B,S/N,D] -> [B,S/N,D] with
    sequence_parallel=True. The norms are whole copies; q, k, v, fc1 hold D/N (4D/N) output features,
    proj, fc2 D/N input features. vit.Attention infers the head count, so it runs its H/N heads unchanged."""

    def __init__(self, block: Block, sequence_parallel: bool = False):
        super().__init__()
        n, heads = dist.get_world_size(), block.attn.q.out_features // block.attn.head_dim
        if heads % n:
            raise ValueError(f"heads={heads} must be divisible by world_size={n}: each rank holds whole heads")
        self.sequence_parallel = sequence_parallel
        self.norm1, self.norm2 = copy.deepcopy(block.norm1), copy.deepcopy(block.norm2)
        self.attn, self.mlp = copy.deepcopy(block.attn), copy.deepcopy(block.mlp)
        for name in ("q", "k", "v"):
            setattr(self.attn, name, ColumnParallelLinear(getattr(block.attn, name), False, copy_input=False))
        self.attn.proj = RowParallelLinear(block.attn.proj, sequence_parallel=sequence_parallel)
        self.mlp.fc1 = ColumnParallelLinear(block.mlp.fc1, gather_output=False, copy_input=False)
        self.mlp.fc2 = RowParallelLinear(block.mlp.fc2, sequence_parallel=sequence_parallel)

    def enter(self, h: torch.Tensor) -> torch.Tensor:
        """Into a column-parallel layer: [B,S,D] as is (TP) or all-gathered from [B,S/N,D] (SP)."""
        return _GatherForParallel.apply(h, SEQ) if self.sequence_parallel else _Copy.apply(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.enter(self.norm1(x)))      # proj: all-reduce (TP) / reduce-scatter (SP)
        return x + self.mlp(self.enter(self.norm2(x)))


class TensorParallelViT(nn.Module):
    """A vit.ViT whose blocks are TensorParallelBlocks; the patch embedding, final norm and head are whole
    copies on every rank. Parameter names are the ViT's. With sequence_parallel the tokens [B,S,D] are split
    into [B,S/N,D] before the first block and gathered after the last."""

    def __init__(self, vit: ViT, sequence_parallel: bool = False):
        super().__init__()
        self.vit = copy.deepcopy(vit)
        self.vit.blocks = nn.Sequential(*(TensorParallelBlock(b, sequence_parallel) for b in vit.blocks))
        self.sequence_parallel = sequence_parallel

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.vit.tokens(images)                                       # [B,S,D] on every rank
        if self.sequence_parallel:
            x = _Gather.apply(self.vit.blocks(_Split.apply(x, SEQ)), SEQ)   # blocks see [B,S/N,D]
        else:
            x = self.vit.blocks(x)
        return self.vit.classify(x)


def sequence_parallel_params(block: TensorParallelBlock) -> list:
    """The whole (unsplit) parameters used inside the sequence-split region: the norms' weights and biases and
    the row-parallel layers' biases (added after the reduce-scatter). Each rank's gradient covers S/N tokens."""
    return [*block.norm1.parameters(), *block.norm2.parameters(), block.attn.proj.bias, block.mlp.fc2.bias]


def all_reduce_sequence_parallel_grads(model: nn.Module) -> int:
    """Sequence parallel: sum those gradients over ranks, as one flat all-reduce; returns its bytes, 6D·4 per
    block (fp32). Call after backward, before the optimizer step (Megatron-LM does the same)."""
    grads = [p.grad for b in model.modules() if isinstance(b, TensorParallelBlock) for p in sequence_parallel_params(b)]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat.numel() * flat.element_size()


# --- what it costs: collectives and activations, measured and by formula ------------------------------

RING_SHARE = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}   # x (N-1)/N x payload, sent per rank


def _payload(op: str, sizes: list, n: int) -> tuple[str, int] | None:
    """(kind, bytes of the whole reduced or gathered tensor) for a collective op, from its tensors' bytes."""
    table = {"allreduce_": ("all_reduce", sizes[0]), "all_reduce": ("all_reduce", sizes[0]),
             "allgather_": ("all_gather", n * sizes[-1]), "all_gather_into_tensor": ("all_gather", n * sizes[0]),
             "reduce_scatter_": ("reduce_scatter", n * sizes[0]), "reduce_scatter_tensor": ("reduce_scatter", sizes[0])}
    return table.get(op) if sizes else None


class CollectiveLog(TorchDispatchMode):
    """While active, log every collective that reaches the dispatcher: ours (torch.distributed's c10d ops) and
    DTensor's (functional collectives) alike. calls[kind], payload[kind] (bytes, the whole tensor reduced or
    gathered); `ring_bytes()` is what a ring sends per rank for them."""

    def __init__(self):
        super().__init__()
        self.calls, self.payload, self.n = Counter(), Counter(), dist.get_world_size()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional"):
            leaves = torch.utils._pytree.tree_leaves((args, kwargs))
            found = _payload(func._opname, [t.numel() * t.element_size() for t in leaves
                                            if isinstance(t, torch.Tensor)], self.n)
            if found:
                self.calls[found[0]] += 1
                self.payload[found[0]] += found[1]
        return func(*args, **(kwargs or {}))

    def ring_bytes(self) -> float:
        return sum(RING_SHARE[k] * b * (self.n - 1) / self.n for k, b in self.payload.items())


def block_communication(batch: int, seq: int, dim: int, world_size: int, sequence_parallel: bool,
                        bytes_per_number: int = 4) -> dict:
    """Closed form, per block and per pass (forward; backward is the same again): {"calls": {kind: n},
    "payload": {kind: bytes}, "ring_bytes": bytes a ring sends per rank}. Every collective moves one
    [B,S,D] activation: TP 2 all-reduces, SP 2 all-gathers + 2 reduce-scatters, the same ring bytes."""
    m = positive_int("batch", batch) * positive_int("seq", seq) * positive_int("dim", dim) * bytes_per_number
    n = positive_int("world_size", world_size)
    calls = {"all_gather": 2, "reduce_scatter": 2} if sequence_parallel else {"all_reduce": 2}
    payload = {k: c * m for k, c in calls.items()}
    return {"calls": calls, "payload": payload,
            "ring_bytes": sum(RING_SHARE[k] * b * (n - 1) / n for k, b in payload.items())}


def block_activation_numbers(batch: int, seq: int, dim: int, heads: int, world_size: int = 1,
                             sequence_parallel: bool = False) -> int:
    """Numbers one rank keeps for backward in one block (eager attention, no dropout); x4 for fp32 bytes.

    Whole on every rank: norm inputs 2BSD + their mean and 1/std 4BS (TP only), the inputs of q/k/v and of
    fc1 2BSD. Split over ranks: q, k, v 3BSD, softmax output HBS², proj input BSD, GELU input 4BSD, fc2
    input 4BSD. Sequence parallel also splits the norms: 2BSD + 4BS move into the /N part."""
    b, s, d, h = (positive_int(k, v) for k, v in dict(batch=batch, seq=seq, dim=dim, heads=heads).items())
    n, split = positive_int("world_size", world_size), 12 * b * s * d + h * b * s * s
    if sequence_parallel:
        return 2 * b * s * d + (2 * b * s * d + 4 * b * s + split) // n
    return 4 * b * s * d + 4 * b * s + split // n


def saved_activation_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward in one forward of module(x), parameters excluded; a storage shared
    by several saved tensors (views) counts once: measured with torch.autograd.graph.saved_tensors_hooks."""
    params, kept = {p.untyped_storage().data_ptr() for p in module.parameters()}, {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(kept.values())


def torch_plan(depth: int, sequence_parallel: bool = False) -> dict:
    """The same split with torch's own API, for parallelize_module on a ViT: {module name: style}.

    q, k, v, fc1 ColwiseParallel; proj, fc2 RowwiseParallel. PrepareModuleInput hands attn and mlp ONE
    DTensor, so q, k and v's partial input gradients are summed into one all-reduce (three without it).
    Sequence parallel: the norms are SequenceParallel, the entries all-gather (Shard(1) -> Replicate), the
    row layers reduce-scatter (output_layouts=Shard(1)); the tokens are split before block 0 and gathered
    before the final norm."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    between = Shard(1) if sequence_parallel else Replicate()
    plan = {}
    for i in range(depth):
        for name in ("attn.q", "attn.k", "attn.v", "mlp.fc1"):
            plan[f"blocks.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.proj", "mlp.fc2"):
            plan[f"blocks.{i}.{name}"] = RowwiseParallel(output_layouts=between,
                                                           use_local_output=not sequence_parallel)
        for name in ("attn", "mlp"):
            plan[f"blocks.{i}.{name}"] = PrepareModuleInput(input_layouts=between, desired_input_layouts=Replicate(),
                                                            use_local_output=False)
        if sequence_parallel:
            plan[f"blocks.{i}.norm1"], plan[f"blocks.{i}.norm2"] = SequenceParallel(), SequenceParallel()
    if sequence_parallel:
        plan["blocks.0"] = PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1),
                                              use_local_output=False)     # the residual stream stays a DTensor
        plan["norm"] = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate(),
                                          use_local_output=True)
    return plan


# --- worker for `launch` (tests and lecture 17) --------------------------------------------------------

def local_part(full: torch.Tensor, local: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's slice of `full` for a parameter (or gradient) of shape local.shape: every dimension that
    differs is split into world_size equal parts."""
    return full[tuple(shard_range(f, rank, world_size) if f != l else slice(None)
                      for f, l in zip(full.shape, local.shape))]


def compare_tensor_parallel_block(rank: int, world_size: int, batch: int = 2, dim: int = 32, heads: int = 4,
                                  depth: int = 2, patch: int = 7) -> dict:
    """Ours (TP and SP) and torch's parallelize_module against the same ViT in one process; costs per block.

    For mode in ("tp", "sp"):
    - "{mode}_loss": |loss - one process's|; "{mode}_grad": max |difference| of every gradient to this rank's
      slice of the one-process gradient (after all_reduce_sequence_parallel_grads for sp, whose bytes are
      "sp_grad_all_reduce_bytes");
    - "{mode}_forward", "{mode}_backward": {"calls", "payload", "ring_bytes"} logged around the last block;
      "{mode}_formula": block_communication's;
    - "{mode}_activation_bytes": measured on the last block; "{mode}_activation_formula": its formula (bytes);
    - torch's: "torch_{mode}_loss", "torch_{mode}_grad" (whole gradients vs one process), "torch_{mode}_vs_ours"
      (|loss - ours|), "torch_{mode}_forward" / "_backward" logs; or "torch_{mode}_error", why it cannot run here.
    "one_process_activation_bytes": the unsplit block's.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import parallelize_module

    from ..models import max_diff
    from .tensor_parallel import _my_slice

    torch.manual_seed(0)                                  # the same model and data on every rank
    vit = ViT(patch=patch, dim=dim, depth=depth, heads=heads)
    images, labels = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    ref = copy.deepcopy(vit)
    loss_ref = F.cross_entropy(ref(images), labels)
    loss_ref.backward()
    full = {name: p.grad for name, p in ref.named_parameters()}
    tokens = vit.tokens(images).detach()                  # [B,S,D]: the last block's test input
    seq = tokens.shape[SEQ]
    out = {"one_process_activation_bytes": saved_activation_bytes(vit.blocks[-1], tokens.clone().requires_grad_())}

    def costs(block, x, wrap=lambda t: t):
        x = x.clone().requires_grad_()
        with CollectiveLog() as fwd:
            y = block(wrap(x))
        with CollectiveLog() as bwd:
            y.backward(torch.ones_like(y))
        return ({"calls": dict(fwd.calls), "payload": dict(fwd.payload), "ring_bytes": fwd.ring_bytes()},
                {"calls": dict(bwd.calls), "payload": dict(bwd.payload), "ring_bytes": bwd.ring_bytes()})

    mesh = init_device_mesh("cpu", (world_size,))
    for mode in ("tp", "sp"):
        sp = mode == "sp"
        ours = TensorParallelViT(vit, sequence_parallel=sp)
        loss = F.cross_entropy(ours(images), labels)
        loss.backward()
        if sp:
            out["sp_grad_all_reduce_bytes"] = all_reduce_sequence_parallel_grads(ours)
        named = [(name.removeprefix("vit."), p.grad) for name, p in ours.named_parameters()]
        out[f"{mode}_loss"] = abs(loss.item() - loss_ref.item())
        out[f"{mode}_grad"] = max_diff([g for _, g in named],
                                       [local_part(full[name], g, rank, world_size) for name, g in named])
        x = _my_slice(tokens, SEQ) if sp else tokens
        out[f"{mode}_forward"], out[f"{mode}_backward"] = costs(ours.vit.blocks[-1], x)
        out[f"{mode}_formula"] = block_communication(batch, seq, dim, world_size, sp)
        out[f"{mode}_activation_bytes"] = saved_activation_bytes(ours.vit.blocks[-1], x.clone().requires_grad_())
        out[f"{mode}_activation_formula"] = 4 * block_activation_numbers(batch, seq, dim, heads, world_size, sp)
        try:
            theirs = parallelize_module(copy.deepcopy(vit), mesh, torch_plan(depth, sp))
            loss_t = F.cross_entropy(theirs(images), labels)
            loss_t.backward()
            out[f"torch_{mode}_loss"] = abs(loss_t.item() - loss_ref.item())
            out[f"torch_{mode}_vs_ours"] = abs(loss_t.item() - loss.item())
            out[f"torch_{mode}_grad"] = max_diff([p.grad for p in theirs.parameters()],
                                                 [p.grad for p in ref.parameters()])
            shard = (lambda t: DTensor.from_local(t, mesh, [Shard(SEQ)])) if sp else (lambda t: t)
            out[f"torch_{mode}_forward"], out[f"torch_{mode}_backward"] = costs(theirs.blocks[-1], x, shard)
        except Exception as exc:  # noqa: BLE001 - feature detection: say why torch's version cannot run here
            out[f"torch_{mode}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out
