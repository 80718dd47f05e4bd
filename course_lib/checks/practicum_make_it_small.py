"""Checks of the practicum "Make it small": every tier is a measured fact about what the answer produced.

Each check takes what `course_lib.grading.make_it_small.measure` (or `remeasure`) returned, by duck typing (the
grader re-imports course_lib before every test cell), and says what is missing for its tier and why.
"""
from __future__ import annotations

from ..grading.make_it_small import WORKING
from ..validate import positive_int
from . import expect, passed

HINTS = {
    "code": "The answer cells run again in a fresh Python process: keep every import and helper inside the "
            "two answer cells, and nothing but imports and definitions at their top level.",
    "compress": "compress raised in the measuring process: a fresh Python that may read the training data "
                "but no other file, and may not write files.",
    "artifact": "torch.load(..., weights_only=True) must load the artifact: return a dict of tensors, ints, "
                "floats and strings (lists and dicts of them are fine); no nn.Module, no objects of your own "
                "classes, no functions.",
    "decompress": "decompress raised, or returned something other than an nn.Module. It gets the artifact and "
                  "nothing else, in a fresh process: no globals that compress set, no files (not even the given "
                  "model's cache), no network.",
    "model": "the model failed on a batch of test images [500, 1, 28, 28] (normalised as "
             "course_lib.data.load_tensors gives them): it must return logits [N, 10].",
}


def _round_trip(result) -> None:
    stage = result.stage
    hint = HINTS.get(stage, "") + (" " + HINTS["code"] if "NameError" in result.error and stage != "code" else "")
    expect(not stage, f"the round trip failed at {stage}: {result.error}\n{hint}")


def check_round_trip(result) -> None:
    """compress -> bytes -> weights_only load -> decompress -> a model that works (>= WORKING accuracy)."""
    _round_trip(result)
    expect(result.accuracy >= WORKING,
           f"the decompressed model classifies {100 * result.accuracy:.1f}% of the test images right (chance is "
           f"10%; a working model needs {100 * WORKING:.0f}%). Does decompress put the artifact's weights into the "
           "model? A fresh LeNet300() is untrained, and a model pruned to almost nothing has forgotten everything.")
    passed("round trip")


def check_deterministic(result) -> None:
    """decompress called twice on the same artifact gives models with identical logits."""
    _round_trip(result)
    expect(result.deterministic, "decompress returned two models that compute different logits from the same "
           "artifact: the model you measure is not the model you ship. Do not draw random numbers in decompress "
           "(or seed them there).")
    passed("deterministic")


def check_not_the_given_model(result) -> None:
    """The model does not compute the given model's exact logits from fewer bytes than an fp16 copy needs."""
    _round_trip(result)
    expect(not result.same_as_given, f"the decompressed model computes exactly the given model's logits, which "
           f"takes its full fp32 weights (over 1 MB), yet the artifact and code hold {result.total_bytes:,} bytes: "
           "decompress found the weights somewhere else. That is not compression.")
    passed("the model comes from the artifact")


def check_floor(result) -> None:
    """Accuracy at least the given model's minus the student's floor_drop, on the same test images."""
    _round_trip(result)
    expect(result.floor_met,
           f"accuracy {100 * result.accuracy:.2f}% is below the floor {100 * result.floor:.2f}% (the given model's "
           f"{100 * result.baseline:.2f}% minus {100 * result.floor_drop:.1f} point, your variant) on "
           f"{result.images:,} "
           f"{result.test_set}. Prune less (or prune the small layers less: fc3 makes the logits), retrain with "
           "the masks held after pruning (lecture 12), or keep more shared values (lecture 13).")
    passed("accuracy floor")


def check_budget(result, budget: int | None = None) -> None:
    """Artifact bytes + code bytes <= `budget` (None: the student's smallest, result.budgets[-1]), with the
    accuracy floor met."""
    budget = result.budgets[-1] if budget is None else budget
    positive_int("budget", budget)   # bytes
    _round_trip(result)
    total, kb = result.total_bytes, f"{budget / 1000:,.3f}".rstrip("0").rstrip(".") + " KB"   # 47,500: 47.5 KB
    biggest = sorted(result.contents, key=lambda row: -row[2])[:3]
    expect(total <= budget,
           f"{total:,} bytes (artifact {result.artifact_bytes:,} + code {result.code_bytes:,}) is "
           f"{total - budget:,} bytes over the {kb} budget ({budget:,} bytes). "
           + ("The biggest entries: " + ", ".join(f"{key} ({what}, {nbytes:,} bytes)" for key, what, nbytes in biggest)
              + ". " if biggest else "")
           + "LeNet-300-100 has 266,610 weights: fp32 costs 1,066 KB, fp16 533 KB, 4-bit shared values 133 KB; "
           "below that, prune, and store where the survivors are compactly (relative indices, lecture 14) and "
           "small dtypes (uint8, float16). Each tensor in torch.save costs a few hundred bytes of overhead.")
    expect(result.floor_met, f"{total:,} bytes fits the {kb} budget, but a size tier counts only "
           f"with the accuracy floor met: {100 * result.accuracy:.2f}% < {100 * result.floor:.2f}%.")
    passed(f"size <= {kb} with the accuracy floor")
