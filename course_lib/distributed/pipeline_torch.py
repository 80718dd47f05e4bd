"""torch.distributed.pipelining's interleaved and zero-bubble schedules: their orders as data, and run for real.

torch builds a multi-stage schedule's whole plan on every rank: `schedule.pipeline_order[rank]` is
the list of `_Action(stage_index, computation_type, microbatch_index)` (None: an idle slot of its
unit-time grid) that rank runs. `torch_order` reads it without any communication, in one process,
on a fake process group; `compare_with_torch_schedules` runs the schedules on K gloo ranks with
`pipeline.make_mlp` cut into chunks, logs what each stage actually ran, and compares gradients
and loss with one process training the whole model on the whole batch.

    from course_lib.distributed import pipeline_torch, schedules_zb
    pipeline_torch.torch_order("zb-v", K=4, M=8) == schedules_zb.order("zb-v", 4, 8)
    launch(pipeline_torch.compare_with_torch_schedules, 4, 8)    # per rank: orders and gradients agree?
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..env import rank_device
from ..models import max_diff
from ..validate import one_of, positive_int
from . import schedules_zb as zb
from .pipeline import make_batch, make_mlp, split_model

TORCH_SCHEDULES = {"interleaved": "ScheduleInterleaved1F1B", "zb-h1": "ScheduleInterleavedZeroBubble",
                   "zb-v": "ScheduleZBVZeroBubble"}     # ZB-H1: torch's interleaved zero bubble, one stage per rank


def _schedule(name: str, stages: list, M: int, loss_fn=nn.functional.cross_entropy):
    from torch.distributed import pipelining
    return getattr(pipelining, TORCH_SCHEDULES[name])(stages, n_microbatches=M, loss_fn=loss_fn)


def _actions(torch_actions) -> list[zb.Action]:
    """torch's compute actions (None and communication dropped) as our Actions."""
    return [zb.Action(a.computation_type.value, a.stage_index, a.microbatch_index) for a in torch_actions
            if a is not None and a.computation_type.value in zb.KINDS]


def torch_order(name: str, K: int, M: int, v: int = 2) -> list[list[zb.Action]]:
    """Per rank, the compute actions of torch's schedule for `name` ("interleaved", "zb-h1" or "zb-v").

    Starts a fake process group (no communication; torch's "fake" backend) as rank 0 of K in this
    process, builds the schedule on stub stages and ends the group: the plan is the same on every rank.
    """
    from torch.distributed.pipelining import PipelineStage

    one_of("name", name, tuple(TORCH_SCHEDULES))
    positive_int("K", K)
    positive_int("M", M)
    if dist.is_initialized():
        raise RuntimeError("torch_order starts its own fake process group: call it where none is initialized")
    dist.init_process_group("fake", rank=0, world_size=K, store=dist.HashStore())
    try:
        ranks = zb.stage_ranks(name, K, v)
        stages = [PipelineStage(nn.Linear(1, 1), s, len(ranks), torch.device("cpu"))
                  for s, r in enumerate(ranks) if r == 0]
        plan = _schedule(name, stages, M).pipeline_order
        return [_actions(plan[r]) for r in range(K)]
    finally:
        dist.destroy_process_group()


def _log_actions(stage, log: list) -> None:
    """Append ("F" | "B" | "I" | "W", stage index, micro-batch) to `log` each time torch's `stage` computes."""
    forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def forward_one_chunk(m, *args, **kwargs):
        log.append(zb.Action("F", stage.stage_index, m))
        return forward(m, *args, **kwargs)

    def backward_one_chunk(m, *args, full_backward=True, **kwargs):
        log.append(zb.Action("B" if full_backward else "I", stage.stage_index, m))
        return backward(m, *args, full_backward=full_backward, **kwargs)

    def backward_weight_one_chunk(m, *args, **kwargs):
        log.append(zb.Action("W", stage.stage_index, m))
        return weight(m, *args, **kwargs)

    stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def compare_with_torch_schedules(rank: int, world_size: int, micro_batches: int = 4, names=tuple(TORCH_SCHEDULES),
                                 batch: int = 16, width: int = 32, seed: int = 0) -> dict:
    """Worker: one step of each torch schedule in `names` on the small seeded `make_mlp` cut into the schedule's
    chunks (world_size x `schedules_zb.chunks_per_rank`), batch [batch, 20] in `micro_batches` micro-batches.

    Per schedule, on this rank: "<name>_plan" (torch's plan for this rank is our order), "<name>_ran"
    (the actions torch's stages ran, in order, are our order), "<name>_grad_diff" (max |gradient - the
    whole-batch gradient of one process| over this rank's chunks), "<name>_loss" on the rank that
    computes the loss (mean of torch's per-micro-batch losses) and "<name>_ref_loss" (one process).
    """
    from torch.distributed.pipelining import PipelineStage

    K, M = world_size, positive_int("micro_batches", micro_batches)
    device = rank_device()
    x, y = make_batch(0, batch, seed=seed)
    out = {}
    for name in names:
        ranks = zb.stage_ranks(name, K)
        mine = [s for s, r in enumerate(ranks) if r == rank]
        reference = split_model(make_mlp(width, len(ranks), seed=seed), len(ranks))   # blocks + 1 children
        ref_loss = nn.functional.cross_entropy(nn.Sequential(*reference)(x), y)
        ref_loss.backward()
        chunks = split_model(make_mlp(width, len(ranks), seed=seed), len(ranks))
        log: list = []
        stages = [PipelineStage(chunks[s].to(device), s, len(ranks), device) for s in mine]
        for stage in stages:
            _log_actions(stage, log)
        schedule = _schedule(name, stages, M)
        losses: list = []
        first, last = 0 in mine, len(ranks) - 1 in mine
        kwargs = {"target": y.to(device), "losses": losses} if last else {}
        schedule.step(*([x.to(device)] if first else []), **kwargs)
        ours = zb.order(name, K, M)[rank]
        out[f"{name}_plan"] = _actions(schedule.pipeline_order[rank]) == ours
        out[f"{name}_ran"] = log == ours
        out[f"{name}_grad_diff"] = max_diff([p.grad.cpu() for s in mine for p in chunks[s].parameters()],
                                            [p.grad for s in mine for p in reference[s].parameters()])
        out[f"{name}_loss"] = torch.stack(losses).mean().item() if losses else 0.0
        out[f"{name}_ref_loss"] = ref_loss.item() if last else 0.0
    return out
