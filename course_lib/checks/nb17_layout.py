"""Check for lecture 17's exercise (d), the memory of a dp x tp x pp layout (to merge into nb17).

`layout_memory(layers, hidden, heads, seq, micro_batch, dp, tp, pp, zero_stage, micro_batches)` returns bytes per
GPU of the first pipeline stage: {"parameters", "gradients", "optimizer_states", "activations"}. Compared with
`course_lib.simulate.layout_memory.layout_memory` (tests/test_simulate_layouts.py checks it by hand, against
lecture 10's ZeRO formula and against Korthikanti et al. 2022) on layouts that exercise each ZeRO stage, tp = 1,
pp = 1, dp = 1 and fewer micro-batches than stages; a wrong term is matched against known mistakes to name it.
"""
from __future__ import annotations

import math

from ..simulate.layout_memory import TERMS, activation_bytes_per_layer, block_params, layout_memory
from . import call_answer, expect, library_call, passed

NAMES = ("layers", "hidden", "heads", "seq", "micro_batch", "dp", "tp", "pp", "zero_stage", "micro_batches")
_ONE = (4, 64, 4, 16, 2, 1, 1, 1, 0, 1)
CASES = [dict(zip(NAMES, v)) for v in (
    _ONE,                                           # one GPU: bytes per parameter, the activation formula
    (4, 64, 4, 16, 2, 4, 1, 1, 0, 1),               # plain data parallel: nothing divided by dp
    (4, 64, 4, 16, 2, 4, 1, 1, 1, 1),               # ZeRO-1
    (4, 64, 4, 16, 2, 4, 1, 1, 2, 1),               # ZeRO-2
    (4, 64, 4, 16, 2, 4, 1, 1, 3, 1),               # ZeRO-3
    (4, 64, 4, 16, 2, 1, 2, 1, 0, 1),               # tensor (+ sequence) parallel
    (4, 64, 4, 16, 2, 1, 1, 2, 0, 3),               # pipeline, m > pp
    (8, 64, 4, 16, 2, 1, 1, 4, 0, 2),               # pipeline, m < pp
    (8, 64, 4, 32, 2, 2, 2, 2, 1, 8), (8, 64, 4, 32, 2, 2, 4, 2, 2, 8), (8, 64, 4, 32, 2, 2, 2, 4, 3, 3),
    (32, 4096, 32, 2048, 1, 8, 8, 4, 1, 16),        # a 7B-sized layout
)]
LIBRARY = ("layout_report", "sweep_layouts", "activation_bytes_per_layer", "block_params", "zero_memory",
           "transformer_activation_bytes")
REFUSED = [(dict(CASES[5], tp=3), "tp", "tp=3 does not divide heads=4"),
           (dict(CASES[6], pp=3), "pp", "pp=3 does not divide layers=4")]

# name: (how it differs from the right answer, the message that names it)
MISTAKES = {
    "bytes": (dict(param_bytes=4), "parameters and gradients are bf16 under mixed precision: 2 bytes each, not 4"),
    "k16": (dict(k=16), "the optimizer states are K = 12 bytes per parameter (fp32 master weights, momentum, "
                        "variance); the bf16 parameters and gradients are counted in their own terms"),
    "states_whole": (dict(states_from=4), "the optimizer states are not divided by dp: ZeRO-1 (and 2, 3) shards "
                                          "them, 12 bytes per parameter / dp"),
    "params_early": (dict(params_from=1), "you divide the parameters by dp at ZeRO-1 or 2: only ZeRO-3 shards the "
                                          "parameters"),
    "params_whole": (dict(params_from=4), "ZeRO-3 shards the parameters too: divide them by dp"),
    "grads_early": (dict(grads_from=1), "you divide the gradients by dp at ZeRO-1: gradients are sharded from "
                                        "ZeRO-2 on"),
    "grads_whole": (dict(grads_from=4), "ZeRO-2 (and 3) shard the gradients: divide them by dp"),
    "replicated_split": (dict(replicated_tp=True), "you divide every parameter by tp: the LayerNorms and the "
                                                   "row-parallel layers' biases (6·hidden per block) are whole "
                                                   "copies on every tp rank"),
    "tp_ignored": (dict(tp_params=False), "the parameters are not divided by tp: each tp rank holds 1/tp of "
                                          "q, k, v, proj, fc1 and fc2"),
    "pp_ignored": (dict(pp_params=False), "the parameters are not divided by pp: the first stage holds "
                                          "layers/pp blocks"),
    "no_sp": (dict(act="tp_only"), "sbh(10 + 24/t + 5as/(ht)) is tensor parallelism WITHOUT sequence parallelism; "
                                   "with SP the LayerNorm inputs and dropout masks are split over the sequence "
                                   "too: sbh(34/t + 5as/(ht))"),
    "act_whole": (dict(act="whole"), "the activations are not divided by tp: with tensor + sequence parallelism "
                                     "each rank keeps 1/tp of every activation, sbh(34/t + 5as/(ht))"),
    "no_scores": (dict(act="selective"), "the attention term 5as²b (scores, softmax, its dropout mask) is missing: "
                                         "34sbh alone is what selective recomputation keeps"),
    "gpipe": (dict(flight="gpipe"), "you keep all m micro-batches in flight, as GPipe does; 1F1B's first stage "
                                    "holds min(pp, m)"),
    "one_micro": (dict(flight="one"), "1F1B's first stage holds min(pp, m) micro-batches at once, not one"),
    "pp_micro": (dict(flight="pp"), "with fewer micro-batches than stages (m < pp) only m are in flight: "
                                    "min(pp, m)"),
    "act_pp_ignored": (dict(act_pp=False), "each stage keeps the activations of its own layers/pp blocks only"),
}


def _memory(c: dict, param_bytes=2, k=12, states_from=1, grads_from=2, params_from=3, replicated_tp=False,
            tp_params=True, pp_params=True, act="sp", flight="1f1b", act_pp=True) -> dict:
    """The answer with one mistake (the defaults: the right answer, equal to layout_memory's)."""
    split, whole = block_params(c["hidden"])
    tp = c["tp"] if tp_params else 1
    params = c["layers"] // (c["pp"] if pp_params else 1) * (split / tp + whole / (tp if replicated_tp else 1))
    div = {s: c["dp"] if c["zero_stage"] >= s else 1 for s in range(1, 5)}
    per_layer = activation_bytes_per_layer(c["seq"], c["micro_batch"], c["hidden"], c["heads"],
                                           1 if act == "whole" else c["tp"], act != "tp_only",
                                           "selective" if act == "selective" else "none")
    m, pp = c["micro_batches"], c["pp"]
    held = {"1f1b": min(pp, m), "gpipe": m, "one": 1, "pp": pp}[flight]
    return {"parameters": param_bytes * params / div[params_from], "gradients": param_bytes * params / div[grads_from],
            "optimizer_states": k * params / div[states_from],
            "activations": c["layers"] // (pp if act_pp else 1) * held * per_layer}


def _close(a, b) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def check_layout_memory(layout_memory_fn) -> None:
    """`layout_memory(layers, hidden, heads, seq, micro_batch, dp, tp, pp, zero_stage, micro_batches) -> dict`."""
    used = library_call(layout_memory_fn, LIBRARY, methods=("layout_memory",))
    expect(not used, f"layout_memory uses {used}: that is the library's own formula, the whole exercise. Write the "
           "terms yourself; the check compares with course_lib.simulate.layout_memory.")
    for c in CASES:
        want = layout_memory(**c)
        got = call_answer(layout_memory_fn, *c.values(), what=f"layout_memory({_args(c)})")
        expect(isinstance(got, dict) and set(got) == set(TERMS),
               f"layout_memory must return a dict with keys {list(TERMS)} (bytes per GPU); got "
               f"{sorted(got) if isinstance(got, dict) else type(got).__name__}")
        for term in TERMS:
            expect(isinstance(got[term], (int, float)) and not isinstance(got[term], bool),
                   f"{term} must be a number of bytes; got {type(got[term]).__name__}")
        for term in TERMS:
            value = got[term]
            if _close(value, want[term]):
                continue
            wrong = [_memory(c, **how) for how, _ in MISTAKES.values()]     # whole answers first, then this term
            named = [msg for w, (_, msg) in zip(wrong, MISTAKES.values()) if all(_close(got[t], w[t]) for t in TERMS)]
            named += [msg for w, (_, msg) in zip(wrong, MISTAKES.values()) if _close(value, w[term])]
            raise AssertionError(f"{term} for layout_memory({_args(c)}): expected {want[term]:,.0f} bytes, got "
                                 f"{value:,.0f}. " + (named[0] if named else _HINTS[term]))
    for c, name, why in REFUSED:
        try:
            layout_memory_fn(*c.values())
        except ValueError as e:
            expect(name in str(e), f"layout_memory({_args(c)}) raised ValueError({str(e)!r}); name the argument "
                                   f"{name!r} in its message")
            continue
        except NotImplementedError:
            raise
        except Exception as e:  # noqa: BLE001 - any other error is the answer's
            raise AssertionError(f"layout_memory({_args(c)}) raised {type(e).__name__}: {e}; {why}: raise a "
                                 f"ValueError naming {name!r}") from None
        raise AssertionError(f"layout_memory({_args(c)}) returned a result, but {why}: raise a ValueError naming "
                             f"{name!r} (that layout cannot be built)")
    passed("layout_memory")


def _args(c: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in c.items())


_HINTS = {"parameters": "Per block 12h² + 7h parameters are split over tp and 6h stay whole; the stage holds "
                        "layers/pp blocks; 2 bytes each, / dp at ZeRO-3.",
          "gradients": "As the parameters (2 bytes each), / dp from ZeRO-2.",
          "optimizer_states": "12 bytes per parameter of the stage's tp shard, / dp from ZeRO-1.",
          "activations": "layers/pp blocks x min(pp, m) micro-batches x sbh(34/t + 5as/(ht)) bytes."}
