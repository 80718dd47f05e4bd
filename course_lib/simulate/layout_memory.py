"""Memory per GPU of a dp x tp x pp layout of a transformer: parameters, gradients, optimizer states, activations.

The transformer is the course's block (`vit.Block`, pre-norm, 4x GELU MLP, every Linear with a bias) repeated
`layers` times, hidden size h. Per block, with tensor parallelism over tp ranks (`block_params`):

    split over tp   q, k, v, proj, fc1, fc2 weights 12h² + the column layers' biases (q, k, v, fc1) 7h
    whole on each   two LayerNorms (weight, bias) 4h + the row layers' biases (proj, fc2) 2h   (replicated)

Mixed-precision Adam (ZeRO, Rajbhandari et al. 2020): 2 bytes of bf16 parameters, 2 of bf16 gradients and
K = 12 of fp32 master weights, momentum and variance per parameter. ZeRO stage 1 divides the optimizer states
by dp, stage 2 also the gradients, stage 3 also the parameters. Pipeline parallelism gives each of the pp stages
layers/pp blocks; the FIRST stage is the fullest (it also holds the embeddings, `other_params`, and keeps the
most micro-batches in flight), so these are its figures.

Activations per block and micro-batch (s tokens, b sequences, a heads; 16-bit; Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", Table 2):

    recompute    tensor parallel only            tensor + sequence parallel
    "none"       sbh(10 + 24/t + 5as/(ht))       sbh(34/t + 5as/(ht))       (t = tp)
    "selective"  sbh(10 + 24/t)                  sbh·34/t                   (attention core recomputed)
    "full"       2sbh                            2sbh/t                     (block input kept, layer recomputed)

34sbh are the inputs of the matmuls, LayerNorms, GELU and the dropout masks; 5as²b the attention scores, their
softmax and its dropout mask. Without sequence parallelism 10sbh (LayerNorm inputs, dropout masks) stay whole on
every rank. (The course's ViT has no dropout: its block keeps less, `tensor_parallel_block.block_activation_numbers`
counts it exactly.) The full-recompute row with SP keeps the sequence-split block input, as Megatron-LM does.
1F1B's first stage holds min(pp, m) micro-batches of layers/pp blocks each (pp·layers/pp = layers: independent
of pp once m >= pp, as Korthikanti et al. 2022 count it for 1F1B); GPipe holds all m.

    from course_lib.simulate.layout_memory import layout_memory
    layout_memory(32, 4096, 32, 2048, 1, dp=8, tp=8, pp=1, zero_stage=1, micro_batches=8)   # bytes per term
"""
from __future__ import annotations

from ..validate import int_in_range, non_negative_int, one_of, positive_int

TERMS = ("parameters", "gradients", "optimizer_states", "activations")
BYTES_PER_PARAM = {"parameters": 2, "gradients": 2, "optimizer_states": 12}   # mixed-precision Adam (ZeRO's K=12)
SHARDED_FROM = {"optimizer_states": 1, "gradients": 2, "parameters": 3}      # the ZeRO stage that divides it by dp
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe")


def block_params(hidden: int, mlp_ratio: int = 4) -> tuple[int, int]:
    """(split over tp, whole on every tp rank): the parameters of one vit.Block of width `hidden`."""
    h, r = positive_int("hidden", hidden), positive_int("mlp_ratio", mlp_ratio)
    return (4 + 2 * r) * h * h + (3 + r) * h, 6 * h


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = True, recompute: str = "none") -> float:
    """Bytes one tp rank keeps for backward in one block for one micro-batch: the module docstring's table."""
    s, b, h, a, t = (positive_int(k, v) for k, v in dict(seq=seq, micro_batch=micro_batch, hidden=hidden,
                                                          heads=heads, tp=tp).items())
    sbh, scores = float(s * b * h), 5 * a * s / h
    mode = one_of("recompute", recompute, RECOMPUTE)
    if mode == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    core = 0.0 if mode == "selective" else scores / t
    return sbh * ((34 / t if sequence_parallel else 10 + 24 / t) + core)


def check_layout(layers: int, hidden: int, heads: int, seq: int, dp: int, tp: int, pp: int,
                 sequence_parallel: bool = True, gpus: int | None = None) -> None:
    """Refuse a layout that cannot be built, naming the argument: tp must divide heads (whole heads per rank)
    and, with sequence parallelism, seq; pp must divide layers (equal stages); dp·tp·pp must be `gpus`."""
    for name, value in dict(layers=layers, hidden=hidden, heads=heads, seq=seq, dp=dp, tp=tp, pp=pp).items():
        positive_int(name, value)
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads} (each head gets hidden/heads features)")
    if heads % tp:
        raise ValueError(f"tp={tp} must divide heads={heads}: each tensor-parallel rank holds whole heads")
    if sequence_parallel and seq % tp:
        raise ValueError(f"tp={tp} must divide seq={seq}: sequence parallelism gives each rank seq/tp tokens")
    if layers % pp:
        raise ValueError(f"pp={pp} must divide layers={layers}: each pipeline stage holds layers/pp blocks")
    if gpus is not None and dp * tp * pp != positive_int("gpus", gpus):
        raise ValueError(f"dp x tp x pp = {dp} x {tp} x {pp} = {dp * tp * pp} must equal gpus={gpus}")


def in_flight(pp: int, micro_batches: int, schedule: str = "1f1b") -> int:
    """Micro-batches whose activations the first stage holds at once: min(pp, m) in 1F1B, m in GPipe."""
    m = positive_int("micro_batches", micro_batches)
    return m if one_of("schedule", schedule, SCHEDULES) == "gpipe" else min(positive_int("pp", pp), m)


def layout_memory(layers: int, hidden: int, heads: int, seq: int, micro_batch: int, dp: int, tp: int, pp: int,
                  zero_stage: int, micro_batches: int, *, mlp_ratio: int = 4, other_params: int = 0,
                  sequence_parallel: bool = True, recompute: str = "none", schedule: str = "1f1b") -> dict:
    """Bytes per GPU of the first pipeline stage, by term (TERMS; floats), for the module docstring's model.

    layers, hidden, heads: the transformer; seq tokens per sequence, micro_batch sequences per micro-batch;
    dp x tp x pp the layout; zero_stage 0 (plain data parallel) .. 3; micro_batches m per step and pipeline.
    other_params: parameters outside the blocks held whole by the first stage's ranks (embeddings)."""
    check_layout(layers, hidden, heads, seq, dp, tp, pp, sequence_parallel)
    int_in_range("zero_stage", zero_stage, 0, 3, hint=" (0: no sharding; 1 optimizer states, 2 + gradients, "
                                                      "3 + parameters)")
    split, whole = block_params(hidden, mlp_ratio)
    params = layers // pp * (split / tp + whole) + non_negative_int("other_params", other_params)
    out = {term: per * params / (dp if zero_stage >= SHARDED_FROM[term] else 1)
           for term, per in BYTES_PER_PARAM.items()}
    out["activations"] = (layers // pp * in_flight(pp, micro_batches, schedule)
                          * activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp, sequence_parallel,
                                                       recompute))
    return out
