"""Sharding benchmark: what one rank holds under ZeRO-1 and FSDP2 on 2 ranks, against unsharded DDP.

    python -m course_lib.bench sharding --json     # keys zero1_state_ratio, fsdp_param_ratio

Bytes, not times: the ratios do not depend on the machine's load. Model: `shard_friendly_mlp`
(784 -> 784 x4 -> 10, 2.47M parameters, Adam), trained a few steps on random batches.
zero1_state_ratio = the larger rank's optimizer-state bytes under ZeroRedundancyOptimizer /
one rank's under DDP + Adam: 0.501, not 0.500, because ZeRO-1 hands whole tensors to ranks (the
four 784x784 weights split 2 + 2, but the 10x784 head and the biases cannot be balanced exactly).
fsdp_param_ratio = the larger rank's parameter bytes under FSDP2 / the unsharded model's: exactly
0.5 here, since FSDP2 cuts every parameter's dim 0 in halves and all of them are even.
"""
from __future__ import annotations

from ..distributed.launch import launch
from ..distributed.sharding_workers import measure_sharding
from .result import BenchResult

WORLD_SIZE = 2


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """Measure on 2 ranks (data_dir is unused: random MNIST-shaped batches)."""
    steps = 2 if quick else 10
    results = launch(measure_sharding, WORLD_SIZE, steps, timeout=300)
    zero, fsdp = [r["zero"] for r in results], [r["fsdp"] for r in results]
    rows = []

    def add(what, variant, per_rank, unsharded):
        rows.append({"what": what, "variant": variant, "rank 0 bytes": per_rank[0], "rank 1 bytes": per_rank[1],
                     "unsharded bytes": unsharded, "max rank / unsharded": round(max(per_rank) / unsharded, 4)})
        return max(per_rank) / unsharded

    adam_state = zero[0]["state_bytes"]["adam"]
    add("optimizer state", "DDP + Adam", [r["state_bytes"]["adam"] for r in zero], adam_state)
    zero1 = add("optimizer state", "ZeroRedundancyOptimizer", [r["state_bytes"]["zero1"] for r in zero], adam_state)
    manual = add("optimizer state", "ShardedOptimizer (ours)", [r["state_bytes"]["manual"] for r in zero], adam_state)
    ratios = {}
    for key, what in (("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("state_bytes", "optimizer state")):
        ratios[key] = add(what, "FSDP2", [r[key]["fsdp"] for r in fsdp], fsdp[0][key]["ddp"])
    loss_diff = max(abs(a - b) for r in fsdp for a, b in zip(r["losses"]["ddp"], r["losses"]["fsdp"]))
    summary = {"benchmark": "sharding", "world_size": WORLD_SIZE,
               "zero1_state_ratio": round(zero1, 4), "manual_state_ratio": round(manual, 4),
               "fsdp_param_ratio": round(ratios["param_bytes"], 4), "fsdp_grad_ratio": round(ratios["grad_bytes"], 4),
               "fsdp_state_ratio": round(ratios["state_bytes"], 4),
               "unsharded_state_bytes": adam_state, "unsharded_param_bytes": fsdp[0]["param_bytes"]["ddp"],
               "zero1_max_weight_diff": max(r["max_diff"]["zero1"] for r in zero),
               "manual_max_weight_diff": max(r["max_diff"]["manual"] for r in zero),
               "fsdp_max_weight_diff": max(r["max_diff"] for r in fsdp), "fsdp_max_loss_diff": loss_diff,
               "model": "shard_friendly_mlp(784, 4): 784-784x4-10, Adam", "steps": steps,
               "data": "random MNIST-shaped batches (no dataset)", "quick": quick}
    return BenchResult(f"per-rank bytes on {WORLD_SIZE} ranks vs unsharded ({summary['model']}, {steps} steps)",
                       rows, summary)
