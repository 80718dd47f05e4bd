"""Practicum "Make it small": the given model, and the harness that measures a student's compression.

    model = given_model()                      # LeNet-300-100, trained once on this machine's MNIST, then cached
    result = measure(compress, decompress)     # prints a report; result.total_bytes, result.accuracy, ...
    noisy = remeasure(result, seed=7)          # other test images, with a little noise (hidden tests)

The student writes, in two answer cells, compress(model) -> artifact (a dict of tensors, numbers,
strings) and decompress(artifact) -> nn.Module. `measure` never calls them in the notebook's process:
1. it takes those cells' code without comments and docstrings (`answer_code`); the code counts toward
   the size, since a decoder ships with its data, and it is exactly the code that runs next;
2. a fresh Python process runs the code and compress(a copy of the given model) and returns the bytes
   of torch.save(artifact): size = len(those bytes) + len(code);
3. the bytes are loaded with weights_only=True: an artifact carries no code and no pickled classes;
4. another fresh process runs the code and decompress, twice; only then does it get the test images
   (never the labels), and it returns the logits of both models, in eval mode under inference_mode.
   Accuracy is computed here against the given model on the same images.
The processes (course_lib.grading.sandbox) run one thread each, under a deadline, guarded.

Threat model. Defended: weights hidden in the code (they count); state kept by compress (nothing of
the notebook's memory reaches decompress); pickled objects (weights_only). In both processes an audit
hook refuses opens of files other than Python's and course_lib's own (compress may also read the two
training files), writes, sockets and new processes (see the sandbox's docstring): decompress cannot
read the cached given model, a saved model or any data, and compress cannot read the test set. A
decompressed model that computes exactly the given model's logits from
fewer bytes than an fp16 copy needs is flagged (`same_as_given`): it got the weights from elsewhere.
When grading, both processes also run jailed (course_lib.grading.jail: read-only files, a private
folder, no view of the solutions), so native code that slips past the audit hook can still read
only what the jail shows (the given model's cache included, where the grader's user can read it).
Not defended: native code (ctypes, C extensions, torch's C++ readers such as torch.from_file or
torch.jit.load) bypasses audit hooks; outside grading, files planted by the notebook in Python's or
course_lib's folders; labels memorised from the public test set in a way that survives noise. The
grader's trust boundary (`course_lib.grading.grade`) applies; for high stakes, also read the code of
the top scores.
"""
from __future__ import annotations

import ast
import hashlib
import linecache
import os
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .. import data
from ..checkpoint import load_checkpoint, save_checkpoint
from ..compression.measure import serialized_bytes as saved_bytes  # noqa: F401 - an artifact's cost, for the notebook
from ..data import cache_dir
from ..env import quick_mode, seed_everything
from ..models import LeNet300
from .remote import is_remote
from .sandbox import SECONDS, describe, load_artifact, python_folders, run_child  # noqa: F401 - SECONDS: the limits
from .variants import student_id, variant

BUDGETS = (200_000, 100_000, 50_000)   # bytes (KB = 1000 bytes, as Deep Compression counts)
FLOOR_DROP = 0.01                      # accuracy may fall at most 1 percentage point below the given model's
# A student's variant (course_lib.grading.variants) replaces the smallest budget (45-55 KB) and FLOOR_DROP
# (0.8-1.2 points); without a student id these defaults hold.
WORKING = 0.5                          # a working model classifies at least half of the images right
QUICK_IMAGES, HIDDEN_IMAGES, NOISE = 2000, 5000, 0.1   # NOISE: std in normalised pixel units (~8/255)
RECIPE = {"epochs": 8, "lr": 1e-3, "batch_size": 64, "seed": 0}


# --- the given model ------------------------------------------------------------------------------

def given_checkpoint(root=None, log=print) -> dict:
    """{"model": state_dict, "test_accuracy", "train_images", "recipe"} of the given model.

    Trained once per training set (the cache key hashes its bytes and RECIPE): Adam with the lr
    annealed to 0 (cosine), seeded, on one CPU thread, so a machine gets the same weights every time.
    """
    images, labels = data._raw_tensors("train", str(data._resolve_root(root)))
    key = hashlib.sha256(images.numpy().tobytes() + labels.numpy().tobytes() + repr(RECIPE).encode()).hexdigest()
    path = cache_dir() / f"make_it_small_lenet300_{key[:16]}.pt"
    try:
        return load_checkpoint(path)
    except FileNotFoundError:
        log(f"training the given model once ({len(labels):,} training images); cached at {path}")
    except Exception as exc:  # noqa: BLE001 - a damaged cache is retrained, never trusted
        log(f"the cached given model {path} is unreadable ({type(exc).__name__}); training it again")
    from ..loop import evaluate, fit

    seed_everything(RECIPE["seed"])
    loader = data.TensorLoader(*data.load_tensors("train", root), batch_size=RECIPE["batch_size"],
                               seed=RECIPE["seed"])
    model = LeNet300()
    optimizer = torch.optim.Adam(model.parameters(), lr=RECIPE["lr"])
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=RECIPE["epochs"] * len(loader))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)    # batches of 64: as fast as 2 threads on a quiet machine, 10x faster on a busy one
    try:
        fit(model, loader, epochs=RECIPE["epochs"], optimizer=optimizer, scheduler=scheduler, device="cpu",
            progress=False, log=None)
    finally:
        torch.set_num_threads(threads)
    test = data.TensorLoader(*data.load_tensors("test", root), batch_size=1000, shuffle=False)
    state = {"model": model.state_dict(), "test_accuracy": evaluate(model, test)[1], "train_images": len(labels),
             "recipe": dict(RECIPE)}
    try:
        save_checkpoint(path, state)
    except OSError as exc:
        log(f"could not cache the given model at {path} ({exc}); it will be trained again next time")
    return state


def given_model(root=None) -> nn.Module:
    """The trained LeNet-300-100 to compress (266,610 parameters), in eval mode."""
    model = LeNet300()
    model.load_state_dict(given_checkpoint(root)["model"])
    return model.eval()


# --- the answer's code ----------------------------------------------------------------------------

def answer_source(*functions) -> str:
    """The code of the notebook cells that defined `functions`, in that order (IPython keeps every cell's
    code in linecache under the file name its functions carry; the grader's proxies carry it themselves)."""
    if all(is_remote(f) for f in functions):
        sources = [f.source for f in functions]
        if not all(sources):
            raise ValueError("compress and decompress must be defined in the answer cells")
        return "\n\n".join(dict.fromkeys(sources))
    files = [getattr(getattr(f, "__code__", None), "co_filename", None) for f in functions]
    if None in files:
        raise ValueError("compress and decompress must be plain functions (def) defined in the answer cells")
    sources = ["".join(linecache.getlines(name)) for name in dict.fromkeys(files)]
    if not all(sources):
        raise ValueError("cannot find the code of compress and decompress: pass source=the answer cells' code")
    return "\n\n".join(sources)


def answer_code(source: str) -> str:
    """`source` without comments, docstrings and IPython magics (`%`/`!` lines): what counts and what runs."""
    plain = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    tree = ast.parse(plain)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


# --- measuring ------------------------------------------------------------------------------------

def student_terms(student: str | None = None) -> dict:
    """{"budgets", "floor_drop"} of `student`'s variant (default: variants.student_id(), as the grader sets it)."""
    chosen = variant(student_id() if student is None else student, "practicum_make_it_small")
    return {"budgets": (*BUDGETS[:-1], chosen["budget"]), "floor_drop": chosen["floor_drop"]}


@dataclass
class Measurement:
    """What `measure` found. `stage` names where the answer failed ("" if it did not); accuracy and
    baseline (the given model's) are fractions on the same `images` test images."""

    code: str = ""
    artifact: bytes = b""
    contents: list = field(default_factory=list)   # (key, description, storage bytes) per stored value
    accuracy: float | None = None
    baseline: float | None = None
    images: int = 0
    test_set: str = ""
    deterministic: bool | None = None
    same_as_given: bool | None = None   # computes the given model's logits exactly
    stage: str = ""
    error: str = ""
    output: str = ""                    # the last lines the student's code printed
    seconds: dict = field(default_factory=dict)
    budgets: tuple = BUDGETS            # the size tiers, bytes: the student's variant
    floor_drop: float = FLOOR_DROP      # the floor is the given model's accuracy minus this: the student's variant

    @property
    def code_bytes(self) -> int:
        return len(self.code.encode())

    @property
    def artifact_bytes(self) -> int:
        return len(self.artifact)

    @property
    def total_bytes(self) -> int:
        return self.artifact_bytes + self.code_bytes

    @property
    def floor(self) -> float | None:
        return None if self.baseline is None else self.baseline - self.floor_drop

    @property
    def floor_met(self) -> bool:
        return self.accuracy is not None and self.accuracy >= self.floor - 1e-9

    def tiers(self) -> dict:
        """Tier name -> met? (every size tier needs the floor too)."""
        tiers = {"round trip": not self.stage and (self.accuracy or 0) >= WORKING, "floor": self.floor_met}
        for budget in self.budgets:
            tiers[f"<= {budget // 1000} KB"] = self.floor_met and self.total_bytes <= budget
        return tiers

    def report(self) -> str:
        lines = [f"size: artifact {self.artifact_bytes:,} bytes + code {self.code_bytes:,} bytes = "
                 f"{self.total_bytes:,} bytes ({self.total_bytes / 1000:.1f} KB)"]
        rows = sorted(self.contents, key=lambda row: -row[2])
        lines += [f"  {key:<28} {what:<30} {nbytes:>9,} bytes" for key, what, nbytes in rows[:8]]
        if rows[8:]:
            lines.append(f"  ... and {len(rows) - 8} smaller: {sum(row[2] for row in rows[8:]):,} bytes")
        if rows:
            lines.append(f"  torch.save's own bytes (names, pickle, zip records): "
                         f"{self.artifact_bytes - sum(row[2] for row in rows):,}")
        if self.seconds:
            lines.append("time in the measuring processes: " + ", ".join(
                f"{role} {seconds:.1f} s" for role, seconds in self.seconds.items() if seconds is not None))
        if self.accuracy is not None:
            lines.append(f"accuracy: {100 * self.accuracy:.2f}% on {self.images:,} {self.test_set} (given model "
                         f"{100 * self.baseline:.2f}%, floor {100 * self.floor:.2f}%); decompress "
                         + ("deterministic" if self.deterministic else "NOT deterministic"))
        if self.stage:
            lines.append(f"FAILED at {self.stage}: {self.error.strip()}")
        if self.output.strip():
            lines.append("your code printed (last lines):\n" + self.output.rstrip()[-1500:])
        lines.append("tiers: " + " | ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in self.tiers().items()))
        return "\n".join(lines)


def measure(compress, decompress, source: str | None = None, root=None, quiet: bool = False) -> Measurement:
    """Measure the answer cells that define `compress` and `decompress` (their code is `source`, or found
    in linecache): size of the artifact + code, accuracy on the test set (quick mode: a fixed
    subset of QUICK_IMAGES). Never raises for the answer's faults: they are in .stage/.error."""
    result = Measurement(**student_terms())
    try:
        result.code = answer_code(source if source is not None else answer_source(compress, decompress))
    except (ValueError, SyntaxError) as exc:
        result.stage, result.error = "code", f"{type(exc).__name__}: {exc}"
    if not result.stage:
        state = given_checkpoint(root)["model"]
        replies, result.output = run_child("compress", {"code": result.code, "state": state, **_readable(root)})
        reply, result.seconds["compress"] = replies[-1], replies[-1].get("seconds")
        if "error" in reply:
            result.stage, result.error = reply["stage"], reply["error"]
        elif not isinstance(reply.get("artifact"), bytes):
            result.stage, result.error = "compress", "the measuring process sent no artifact (was it tampered with?)"
        else:
            result.artifact = reply["artifact"]
            _inspect_artifact(result)
    if not result.stage:
        result = _evaluate(result, root)
    if not quiet:
        print(result.report())
    return result


def remeasure(result: Measurement, seed: int, noise: float = NOISE, images: int | None = None, root=None,
              quiet: bool = False) -> Measurement:
    """The same artifact and code on `images` other test images (a random subset drawn with `seed`) with
    Gaussian noise of std `noise` added: a model that works passes here too, a lookup of memorised
    test labels does not."""
    if result.stage:
        return replace(result)
    again = _evaluate(replace(result, output="", seconds=dict(result.seconds)), root, seed, noise,
                      images or HIDDEN_IMAGES)
    if not quiet:
        print(again.report())
    return again


def _evaluate(result: Measurement, root, seed=None, noise: float = 0.0, size: int | None = None) -> Measurement:
    x, y = data.load_tensors("test", root)
    if seed is None and not quick_mode():
        index, result.test_set = torch.arange(len(y)), "test images"
    else:   # quick mode: a fixed subset; hidden tests: a subset drawn with `seed`
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0 if seed is None else seed))
        index = order[:QUICK_IMAGES if seed is None else size].sort().values
        result.test_set = ("test images (quick mode: a fixed subset)" if seed is None
                           else f"other test images with noise (std {noise}, seed {seed})")
    images, labels = x[index], y[index]
    if noise:
        images = images + noise * torch.randn(images.shape, generator=torch.Generator().manual_seed(seed + 1))
    given = given_model(root)
    with torch.inference_mode():
        given_logits = torch.cat([given(images[i:i + 500]) for i in range(0, len(images), 500)])
    request = {"code": result.code, "artifact": result.artifact, **_readable(root, train=False)}
    replies, output = run_child("decompress", request, [{"images": images}])
    result.output = (result.output + output)[-4000:]
    reply, result.seconds["decompress"] = replies[-1], replies[-1].get("seconds")
    if "error" in reply:
        result.stage, result.error = reply["stage"], reply["error"]
        return result
    logits = reply.get("logits")
    if not isinstance(logits, torch.Tensor) or logits.shape != given_logits.shape:
        result.stage, result.error = "model", "the measuring process sent no logits [N, 10] (was it tampered with?)"
        return result
    result.images, result.baseline = len(labels), (given_logits.argmax(1) == labels).float().mean().item()
    result.accuracy = (logits.argmax(1) == labels).float().mean().item()
    result.deterministic = reply.get("same") is True
    exact = (logits - given_logits).abs().max().item() < 1e-5
    result.same_as_given = exact and result.total_bytes < 2 * sum(t.numel() for t in given.state_dict().values())
    return result


def _inspect_artifact(result: Measurement) -> None:
    """Load the artifact as decompress will get it (weights_only) and list what it holds."""
    try:
        result.contents = describe(load_artifact(result.artifact))
    except ValueError as exc:
        result.stage, result.error = "artifact", str(exc)


def _readable(root, train: bool = True) -> dict:
    """What the sandbox's guard lets the answer read: Python's and course_lib's folders; never the data or
    the cache, except the two training files when `train` (compress may retrain)."""
    raw = data._resolve_root(root) / "MNIST" / "raw"
    files = [str(raw / name) for name in data.RAW_FILES["train"]] if train else []
    real = lambda paths: [os.path.realpath(p) for p in paths]  # noqa: E731
    return {"folders": python_folders(), "files": real(files),
            "denied": real([cache_dir(), data._resolve_root(root)])}
