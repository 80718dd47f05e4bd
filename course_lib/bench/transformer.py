"""Transformer benchmark: bytes each parallelism of lecture 17 sends per rank per step, measured against its formula.

    python -m course_lib.bench transformer --json    # 2 and 4 gloo ranks; --quick: 2 ranks only

Bytes, not times: counted by wrapping the collectives (gloo on CPU), so the figures do not depend on the
machine's load. Per rank and per step of the course's ViT shapes (S = 16 tokens, D = 64, 4 heads):
- TP, one block (`tensor_parallel_block`): 2 all-reduces of [B,S,D] forward, 2 backward, each 2(N-1)/N x BSD x 4
  bytes on a ring;
- SP, one block: the same bytes as reduce-scatters and all-gathers, and the activations kept per rank;
- CP (`context_parallel`, ring attention): k and v passed N-1 times forward, and dk, dv back: 2(N-1)/N x
  bytes(K) forward;
- EP (`moe`, top-2 over 8 experts, capacity factor 0.5): the all-to-all's token rows against the rows the
  routing sends (exact), and against 2 x S x D x 4 x (N-1)/N under exactly uniform routing.
Every row also gives the largest difference of the distributed result from the same computation in one process.
"""
from __future__ import annotations

import functools

from ..distributed import context_parallel, moe
from ..distributed import tensor_parallel_block as tpb
from ..distributed.launch import launch
from .result import BenchResult

BATCH, DIM, HEADS, TOKENS = 4, 64, 4, 16


def _row(world, parallelism, what, measured, formula, error):
    return {"ranks": world, "parallelism": parallelism, "bytes per rank": what, "measured": int(measured),
            "formula": int(round(formula)), "measured / formula": round(measured / formula, 4),
            "max |diff| vs 1 process": f"{error:.1e}"}


def measure(world: int) -> list:
    """The rows for `world` ranks: three launches (TP+SP, CP, EP), rank 0's bytes (every rank sends the same)."""
    tp = launch(functools.partial(tpb.compare_tensor_parallel_block, batch=BATCH, dim=DIM, heads=HEADS, depth=2),
                world, timeout=300)
    cp = launch(functools.partial(context_parallel.compare_ring_attention, batch=BATCH, heads=HEADS, tokens=TOKENS,
                                  head_dim=DIM // HEADS), world, timeout=300)
    ep = launch(moe.compare_expert_parallel, world, timeout=300)
    rows = []
    for mode, name in (("tp", "TP"), ("sp", "SP")):
        error = max(max(r[f"{mode}_loss"], r[f"{mode}_grad"]) for r in tp)
        formula = tp[0][f"{mode}_formula"]["ring_bytes"]
        for direction in ("forward", "backward"):
            calls = ", ".join(f"{n} {op}" for op, n in tp[0][f"{mode}_{direction}"]["calls"].items())
            rows.append(_row(world, name, f"one block, {direction} ({calls})",
                             tp[0][f"{mode}_{direction}"]["ring_bytes"], formula, error))
        rows.append(_row(world, name, "activations kept, one block", tp[0][f"{mode}_activation_bytes"],
                         tp[0][f"{mode}_activation_formula"], error))
    error = max(max(r[f"{n}_{k}"] for n in ("full", "causal") for k in ("out", "grad")) for r in cp)
    for direction in ("forward", "backward"):
        rows.append(_row(world, "CP", f"ring attention, {direction} (k, v chunks)", cp[0]["full_bytes"][direction],
                         cp[0]["bytes_formula"][direction], error))
    error = max(max(r[k] for k in ("out", "loss", "x_grad", "router_grad", "expert_grad")) for r in ep)
    rows.append(_row(world, "EP", "all-to-all forward, routed rows", ep[0]["bytes"]["forward"],
                     ep[0]["bytes_expected"], error))
    rows.append(_row(world, "EP", "all-to-all forward, uniform routing", ep[0]["bytes_balanced"]["forward"],
                     ep[0]["bytes_balanced_formula"], error))
    return rows


def run(data_dir=None, quick: bool = False) -> BenchResult:
    """Measure on 2 ranks, and on 4 unless quick (data_dir is unused: random tensors of the ViT's shapes)."""
    worlds = (2,) if quick else (2, 4)
    rows = [row for world in worlds for row in measure(world)]
    ratios = [r["measured / formula"] for r in rows]
    summary = {"benchmark": "transformer", "ranks": list(worlds), "rows": len(rows),
               "min_ratio": min(ratios), "max_ratio": max(ratios),
               "max_diff_vs_one_process": max(float(r["max |diff| vs 1 process"]) for r in rows),
               "shapes": f"batch {BATCH}, {TOKENS} tokens, dim {DIM}, {HEADS} heads (fp32); MoE: 16 tokens per rank, "
                         "8 experts, top-2, capacity factor 0.5",
               "data": "random tensors (no dataset)", "quick": quick}
    return BenchResult(f"bytes sent per rank per step, measured vs formula (ranks {', '.join(map(str, worlds))})",
                       rows, summary)
