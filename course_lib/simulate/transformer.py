"""Record the transformer's step: the course's ViT on real tensors, its tensor-parallel step on gloo ranks, and
one tensor-parallel rank's block at any size (real tensors, or by shape on the meta device).

- `record_vit`: one process, the course's step (`loop.train_epoch`: forward, backward, Adam) of `vit.ViT` on a
  random batch: every aten op with its FLOPs and bytes (record.Recorder).
- `record_vit_tp`: the same ViT split by `distributed.tensor_parallel_block.TensorParallelViT` over `tp` gloo
  ranks: Megatron's all-reduces (or, with sequence parallelism, all-gathers and reduce-scatters) are
  recorded collectives, with their bytes and the op they wait for. `collectives_by_phase` counts them.
- `record_rank_block`: the forward and backward of ONE block as one of `tp` ranks holds it (`rank_block`:
  q, k, v and fc1 with 1/tp of their output features, proj and fc2 with 1/tp of their inputs; the norms and
  the row layers' biases whole), without its collectives: the compute a tensor-parallel rank does per block.
  Real tensors for the ViT's own size; on the meta device (shapes only, no arithmetic, as `shapes.py` does
  for GPT-2) for a GPT-2- or 7B-sized block. `layouts` replays layouts from it.

    from course_lib.simulate.transformer import record_vit, record_vit_tp, collectives_by_phase
    rec = record_vit_tp(tp=2)                 # 2 gloo ranks, a few seconds
    collectives_by_phase(rec)                 # {"forward": [("all_reduce", bytes), ...], "backward": [...]}
"""
from __future__ import annotations

import functools
from dataclasses import asdict

import torch
from torch import nn

from ..validate import boolean, positive_int
from ..vit import Block, ViT
from .record import Event, RankTrace, Recorder, Recording, _batch, _param_table, _phased_step, _train_step, record_step


def record_vit(batch: int = 64, steps: int = 3) -> Recording:
    """One process, no communication: the course's step (train_epoch, Adam) of ViT() on `batch` random images."""
    from ..loop import make_optimizer
    positive_int("batch", batch)
    torch.manual_seed(0)
    model = ViT()
    opt = make_optimizer("adam", model.parameters(), lr=1e-3)
    rank, seconds = record_step(_train_step(model, _batch(batch, 0), opt), list(model.parameters()), steps)
    return Recording([rank], _param_table(model), 1, batch, f"ViT, batch {batch}, Adam, 1 process", seconds)


def vit_tp_worker(rank: int, world_size: int, batch: int = 8, sequence_parallel: bool = False,
                  steps: int = 2) -> dict:
    """Worker for `launch`: TensorParallelViT(ViT()) on this rank, the course's step (Adam), timed, recorded."""
    from ..distributed.tensor_parallel_block import TensorParallelViT, all_reduce_sequence_parallel_grads
    from ..loop import make_optimizer
    torch.manual_seed(0)                                       # the same model and batch on every rank
    model = TensorParallelViT(ViT(), sequence_parallel)
    opt = make_optimizer("adam", model.parameters(), lr=1e-3)
    images, labels = _batch(batch, 0)
    # with sequence parallelism the norms' gradients saw S/N tokens each: summed over the ranks in backward
    step = _phased_step(model, images, labels, opt,
                        functools.partial(all_reduce_sequence_parallel_grads, model) if sequence_parallel else None)
    trace, seconds = record_step(step, list(model.parameters()), steps)
    return {"trace": asdict(trace), "seconds": seconds, "params": _param_table(model)}


def record_vit_tp(tp: int = 2, batch: int = 8, sequence_parallel: bool = False, steps: int = 2,
                  timeout: float = 120.0) -> Recording:
    """Record the ViT's tensor-parallel step on `tp` gloo ranks (tp must divide the 4 heads): one RankTrace per
    rank, each holding its 1/tp of the blocks' weights; every TP collective is an event on the comm stream."""
    from ..distributed.launch import launch
    if positive_int("tp", tp) > 4 or 4 % tp:
        raise ValueError(f"tp must divide the ViT's 4 heads (1, 2 or 4); got {tp}")
    positive_int("batch", batch)
    boolean("sequence_parallel", sequence_parallel)
    outs = launch(vit_tp_worker, tp, batch, sequence_parallel, positive_int("steps", steps), timeout=timeout)
    ranks = [RankTrace([Event(**e) for e in o["trace"]["events"]], o["trace"]["grad_ready"]) for o in outs]
    what = "tensor + sequence parallel" if sequence_parallel else "tensor parallel"
    return Recording(ranks, outs[0]["params"], tp, batch, f"ViT, batch {batch}, Adam, {what} on {tp} gloo ranks",
                     max(o["seconds"] for o in outs))


def collectives_by_phase(recording: Recording, rank: int = 0) -> dict[str, list[tuple[str, float]]]:
    """{phase: [(kind, bytes), ...]} of one rank's recorded collectives, in the order they ran."""
    out: dict[str, list] = {}
    for e in recording.ranks[rank].events:
        if e.stream == "comm":
            out.setdefault(e.phase, []).append((e.name, e.bytes))
    return out


def rank_block(dim: int, heads: int, tp: int = 1, mlp_ratio: int = 4, device="cpu", dtype=torch.float32) -> Block:
    """A vit.Block as ONE of `tp` tensor-parallel ranks holds it (TensorParallelBlock's shapes, no collectives):
    q, k, v [D/tp, D], fc1 [mlp·D/tp, D] (column-parallel); proj [D, D/tp], fc2 [D, mlp·D/tp] (row-parallel);
    norms and the row layers' biases whole. vit.Attention infers the head count, so it runs heads/tp heads."""
    for name, value in dict(dim=dim, heads=heads, tp=tp, mlp_ratio=mlp_ratio).items():
        positive_int(name, value)
    if heads % tp:
        raise ValueError(f"tp={tp} must divide heads={heads}: each rank holds whole heads")
    with torch.device(device):
        block = Block(dim, heads, mlp_ratio)
        if tp > 1:
            d, h = dim // tp, mlp_ratio * dim // tp
            block.attn.q, block.attn.k, block.attn.v = (nn.Linear(dim, d) for _ in range(3))
            block.attn.proj = nn.Linear(d, dim)
            block.mlp.fc1, block.mlp.fc2 = nn.Linear(dim, h), nn.Linear(h, dim)
    return block.to(dtype)


@functools.lru_cache(maxsize=64)
def record_rank_block(dim: int, heads: int, seq: int, micro_batch: int, tp: int = 1, mlp_ratio: int = 4,
                      real: bool = True) -> RankTrace:
    """One block's forward and backward as a tensor-parallel rank runs it, on [micro_batch, seq, dim] tokens.

    real=True: real fp32 tensors on the CPU (the ViT's size); False: bf16 on the meta device (no memory, no
    arithmetic: a 7B-sized block in milliseconds). Events carry phase "forward" / "backward"; cached."""
    device, dtype = ("cpu", torch.float32) if real else ("meta", torch.bfloat16)
    torch.manual_seed(0)
    block = rank_block(dim, heads, tp, mlp_ratio, device, dtype)
    x = torch.randn(positive_int("micro_batch", micro_batch), positive_int("seq", seq), dim, device=device,
                    dtype=dtype, requires_grad=True)
    grad = torch.ones(micro_batch, seq, dim, device=device, dtype=dtype)
    rec = Recorder()
    rec.watch(list(block.parameters()))
    with rec:
        with torch.profiler.record_function("forward"):
            y = block(x)
        with torch.profiler.record_function("backward"):
            y.backward(grad)
    return RankTrace(rec.events, [rec.grad_ready.get(i, len(rec.events) - 1) for i in range(len(rec._params))])
