"""The practicum "Make it small": the given model's cache, the measuring harness, and the tiers.

The reference answer earns every tier; plausible wrong, naive and cheating answers earn exactly the points
they should. Every answer here really runs through `measure` (two fresh, guarded processes each), and the
practicum notebook is graded end to end by `course_lib.grade` and by nbgrader.
"""
import base64
import io
import os
import sys
import textwrap
import time
import warnings
from pathlib import Path

import nbformat
import pytest
import torch

from conftest import a_student, needs_mnist, write_idx
from course_lib.checks import practicum_make_it_small as pm
from course_lib.grading import grade, jail, sandbox, variants
from course_lib.grading import make_it_small as mis
from course_lib.models import LeNet300
from nbtools import ROOT

NAME = "practicum_make_it_small.ipynb"
SOLUTION_NB = nbformat.read(str(ROOT / "solutions" / NAME), as_version=4)
REFERENCE = "\n\n".join(c.source for c in SOLUTION_NB.cells if c.metadata.get("nbgrader", {}).get("solution"))
def answer(compress: str, decompress: str, top: str = "") -> str:
    """The code of two answer cells: the bodies of compress(model) and decompress(a), and top-level lines."""
    indent = lambda body: textwrap.indent(textwrap.dedent(body).strip(), "    ")  # noqa: E731
    return (f"import torch\nfrom course_lib.models import LeNet300\n{textwrap.dedent(top)}\n"
            f"def compress(model):\n{indent(compress)}\n\ndef decompress(a):\n{indent(decompress)}\n")


HALF = "return {k: v.half() for k, v in model.state_dict().items()}"
LOAD_HALF = """
    m = LeNet300()
    m.load_state_dict({k: v.float() for k, v in a.items()})
    return m"""
FRESH = "return LeNet300()"


def sparse(amount, scope: str) -> str:
    """Magnitude pruning without retraining; the survivors stored as int32 positions and fp16 values."""
    return answer(f"""
        from course_lib.compression.pruning import magnitude_prune
        magnitude_prune(model, {amount}, scope="{scope}")
        out = {{}}
        for name, layer in model.named_children():
            flat = layer.weight.detach().flatten()
            where = flat.nonzero().flatten()
            out[name] = {{"where": where.int(), "values": flat[where].half(), "bias": layer.bias.detach().half()}}
        return out""", """
        m = LeNet300()
        with torch.no_grad():
            for name, part in a.items():
                layer = getattr(m, name)
                weight = torch.zeros(layer.weight.numel())
                weight[part["where"].long()] = part["values"].float()
                layer.weight.copy_(weight.view_as(layer.weight))
                layer.bias.copy_(part["bias"].float())
        return m""")


ANSWERS = {   # name -> the answer cells' code
    "fp32 state dict": answer("return {k: v.clone() for k, v in model.state_dict().items()}", LOAD_HALF),
    "fp16 state dict": answer(HALF, LOAD_HALF),
    "pruned, stored dense": answer("""
        from course_lib.compression.pruning import magnitude_mask, masked_fit
        from course_lib.data import TensorLoader, load_tensors
        masks = {n: magnitude_mask(getattr(model, n).weight, 0.9) for n in ("fc1", "fc2")}
        loader = TensorLoader(*load_tensors("train", limit=10_000), batch_size=64, seed=0)
        masked_fit(model, masks, loader, epochs=2, lr=1e-3, progress=False, log=None)
        """ + HALF, LOAD_HALF),
    "4-bit shared values, no pruning": answer("""
        from course_lib.compression.kmeans import kmeans_quantize
        out = {}
        for name, layer in model.named_children():
            centroids, codes = kmeans_quantize(layer.weight, 16)
            codes = codes.flatten()
            out[name] = {"packed": (codes[0::2] * 16 + codes[1::2]).to(torch.uint8),
                         "codebook": centroids.half(), "bias": layer.bias.detach().half()}
        return out""", """
        m = LeNet300()
        with torch.no_grad():
            for name, part in a.items():
                layer = getattr(m, name)
                codes = torch.stack([part["packed"].long() >> 4, part["packed"].long() & 15], 1).flatten()
                layer.weight.copy_(part["codebook"].float()[codes].view_as(layer.weight))
                layer.bias.copy_(part["bias"].float())
        return m"""),
    "over-pruned (97% global, no retraining)": sparse(0.97, "global"),
    "pruned to nothing (99% per layer)": sparse(0.99, "layer"),
    "a pickled class in the artifact": answer('return {"packed": Packed(model.state_dict())}', """
        m = LeNet300()
        m.load_state_dict(a["packed"].state)
        return m""", top="""
        class Packed:
            def __init__(self, state):
                self.state = state
        """),
    "decompress ignores the artifact": answer("return {}", FRESH),
    "not deterministic": answer(HALF, """
        m = LeNet300()
        m.load_state_dict({k: v.float() + 1e-3 * torch.randn(v.shape) for k, v in a.items()})
        return m"""),
}
CHEATS = {   # name -> (code, the stage where it fails, words of the error)
    "decompress loads the given model": (answer("return {}", """
        from course_lib.grading.make_it_small import given_model
        return given_model()"""), "decompress", "does not let your code read"),
    "decompress uses a global set by compress": (answer("SAVED['m'] = model\nreturn {}", "return SAVED['m']",
                                                        top="SAVED = {}"), "decompress", "KeyError"),
    "compress reads the test set": (answer("""
        from course_lib.data import load_tensors
        load_tensors("test")
        return {}""", FRESH), "compress", "t10k-images"),
    "decompress retrains on the training data": (answer("return {}", """
        from course_lib.data import load_tensors
        load_tensors("train")
        return LeNet300()"""), "decompress", "train-images"),
    "decompress downloads the weights": (answer("return {}", """
        import urllib.request
        urllib.request.urlopen("http://127.0.0.1:9/weights")
        return LeNet300()"""), "decompress", "urllib.Request"),
    "compress writes a file with open()": (answer("""
        with open("weights.bin", "wb") as f:
            f.write(b"x")
        return {}""", FRESH), "compress", "write files"),
}
FULL = dict.fromkeys(["round trip", "floor", "<= 200 KB", "<= 100 KB", "<= 50 KB"], True)


def tiers(**met) -> dict:
    return {**dict.fromkeys(FULL, False), **met}


@pytest.fixture(scope="module", autouse=True)
def quick():
    """Quick mode (the fixed 2,000-image subset), as CI grades."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COURSE_QUICK", "1")
        mp.setenv("COURSE_STUDENT_ID", "anonymous")     # the default variant: 50 KB, 1 point (tests below vary it)
        yield


@pytest.fixture(scope="module")
def reference():
    return mis.measure(None, None, source=REFERENCE, quiet=True)


def measured(name):
    return mis.measure(None, None, source=ANSWERS[name], quiet=True)


# --- the answer's code, and the given model's cache (tiny data, no MNIST needed) -------------------

def test_answer_code_drops_comments_docstrings_and_magics_and_nothing_else():
    source = '%load_ext foo\ndef f(x):\n    """A docstring."""\n    # a comment\n    return x + "#" # note\n'
    code = mis.answer_code(source)
    assert code == "def f(x):\n    return x + '#'"
    assert mis.answer_code('def g():\n    """only a docstring"""\n') == "def g():\n    pass"
    with pytest.raises(SyntaxError):
        mis.answer_code("def f(:\n")


def test_answer_source_is_the_code_of_the_cells_that_define_the_functions():
    import nbtools

    here = Path(__file__).read_text()
    assert mis.answer_source(tiers, measured) == here     # plain Python: the file they come from, once
    assert mis.answer_source(tiers, nbtools.notebook_namespace) == here + "\n\n" + Path(nbtools.__file__).read_text()
    with pytest.raises(ValueError, match="plain functions"):
        mis.answer_source(tiers, len)
    result = mis.measure(len, print, quiet=True)
    assert result.stage == "code" and "plain functions" in result.error
    with pytest.raises(AssertionError, match="failed at code"):
        pm.check_round_trip(result)


def tiny_mnist(folder: Path, seed: int) -> Path:
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    for split, n in (("train", 128), ("t10k", 64)):
        write_idx(raw / f"{split}-images-idx3-ubyte", torch.randint(0, 256, (n, 28, 28), generator=g))
        write_idx(raw / f"{split}-labels-idx1-ubyte", torch.randint(0, 10, (n,), generator=g))
    return folder


def test_given_model_is_trained_once_cached_outside_the_repo_and_deterministic(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("COURSE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert not mis.cache_dir().resolve().is_relative_to(ROOT)
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    root = tiny_mnist(tmp_path / "a", seed=0)
    first = mis.given_checkpoint(root)
    files = list((tmp_path / "cache").iterdir())
    assert len(files) == 1 and "training the given model once" in capsys.readouterr().out
    assert torch.load(files[0], weights_only=True)["train_images"] == 128 == first["train_images"]
    import course_lib.loop
    monkeypatch.setattr(course_lib.loop, "fit", lambda *a, **k: pytest.fail("the cached model was trained again"))
    again = mis.given_checkpoint(root)
    assert all(torch.equal(again["model"][k], v) for k, v in first["model"].items())
    monkeypatch.undo()
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "cache"))
    files[0].write_bytes(b"not a checkpoint")                   # a damaged cache is trained again, identically
    retrained = mis.given_checkpoint(root)
    assert "unreadable" in capsys.readouterr().out
    assert all(torch.equal(retrained["model"][k], v) for k, v in first["model"].items())
    mis.given_checkpoint(tiny_mnist(tmp_path / "b", seed=1))     # other training data: another cache entry
    assert len(list((tmp_path / "cache").iterdir())) == 2
    model = mis.given_model(root)
    assert isinstance(model, LeNet300) and not model.training


# --- measuring real answers (MNIST: the data in use) --------------------------------------------

@pytest.mark.slow
@needs_mnist
def test_reference_solution_earns_every_tier_with_a_margin(reference):
    r = reference
    assert r.tiers() == FULL, r.report()
    assert r.total_bytes < 0.9 * 50_000 and r.accuracy > r.floor + 0.005, r.report()   # margins
    assert r.deterministic and not r.same_as_given and r.images == mis.QUICK_IMAGES
    for check in (pm.check_round_trip, pm.check_deterministic, pm.check_not_the_given_model, pm.check_floor):
        check(r)
    for budget in mis.BUDGETS:
        pm.check_budget(r, budget)
    noisy = mis.remeasure(r, seed=1234, quiet=True)
    assert noisy.images == mis.HIDDEN_IMAGES and "noise" in noisy.test_set
    pm.check_floor(noisy)
    pm.check_not_the_given_model(noisy)
    assert r.artifact_bytes == len(r.artifact) and r.code_bytes == len(mis.answer_code(REFERENCE).encode())
    print(f"\nreference: {r.total_bytes:,} bytes, {100 * r.accuracy:.2f}% (given {100 * r.baseline:.2f}%), "
          f"noisy {100 * noisy.accuracy:.2f}% (given {100 * noisy.baseline:.2f}%); {r.seconds}")


@needs_mnist
@pytest.mark.parametrize("budget", ["smallest", "largest", "tightest floor"])
def test_reference_solution_earns_every_tier_in_other_students_variants(reference, budget):
    import dataclasses
    choices = variants.VARIANTS[NAME.removesuffix(".ipynb")][1]
    wanted = {"smallest": lambda v: v["budget"] == min(choices["budget"]),
              "largest": lambda v: v["budget"] == max(choices["budget"]),
              "tightest floor": lambda v: v["floor_drop"] == min(choices["floor_drop"]) and v["budget"] != 50_000}
    r = dataclasses.replace(reference, **mis.student_terms(a_student(NAME.removesuffix(".ipynb"), wanted[budget])))
    assert r.budgets[-1] != 50_000 and all(r.tiers().values()), r.report()
    pm.check_floor(r)
    pm.check_budget(r)
    assert f"<= {r.budgets[-1] // 1000} KB" in r.tiers()


@needs_mnist
def test_an_answer_tuned_to_one_students_budget_fails_anothers(reference):
    """Alice's smallest budget is over 50 KB, dave's under it: an answer of 50 KB (padded code) passes for alice
    only; an accuracy 1.0 point below the given model's meets dave's floor (more than 1 point) but not alice's
    (less than 1 point)."""
    import dataclasses
    exercise = NAME.removesuffix(".ipynb")
    alice = a_student(exercise, lambda v: v["budget"] > 50_000 and v["floor_drop"] < 0.010)
    dave = a_student(exercise, lambda v: v["budget"] < 50_000 and v["floor_drop"] > 0.010)
    padding = 50_000 - reference.total_bytes
    tuned = dataclasses.replace(reference, code=reference.code + "#" * padding)
    assert tuned.total_bytes == 50_000
    pm.check_budget(dataclasses.replace(tuned, **mis.student_terms(alice)))
    with pytest.raises(AssertionError, match=f"over the {mis.student_terms(dave)['budgets'][-1] // 1000} KB budget"):
        pm.check_budget(dataclasses.replace(tuned, **mis.student_terms(dave)))
    lower = dataclasses.replace(reference, accuracy=reference.baseline - 0.010)
    pm.check_floor(dataclasses.replace(lower, **mis.student_terms(dave)))
    with pytest.raises(AssertionError, match=f"{100 * mis.student_terms(alice)['floor_drop']:.1f} point, your variant"):
        pm.check_floor(dataclasses.replace(lower, **mis.student_terms(alice)))


@pytest.mark.slow
@needs_mnist
@pytest.mark.parametrize("name,expected", [
    ("fp32 state dict", tiers(**{"round trip": True, "floor": True})),
    ("fp16 state dict", tiers(**{"round trip": True, "floor": True})),
    ("pruned, stored dense", tiers(**{"round trip": True, "floor": True})),
    ("4-bit shared values, no pruning", tiers(**{"round trip": True, "floor": True, "<= 200 KB": True})),
    ("over-pruned (97% global, no retraining)", tiers(**{"round trip": True})),
    ("pruned to nothing (99% per layer)", tiers()),
    ("a pickled class in the artifact", tiers()),
    ("decompress ignores the artifact", tiers()),
])
def test_naive_and_wrong_answers_earn_exactly_their_tiers(name, expected):
    r = measured(name)
    assert r.tiers() == expected, r.report()
    for budget, (tier, met) in zip(mis.BUDGETS, list(expected.items())[2:]):
        if not met:
            with pytest.raises(AssertionError, match="budget|floor|round trip"):
                pm.check_budget(r, budget)
    if name.startswith("fp"):
        assert 500_000 < r.total_bytes and "over the 200 KB budget" in failure(pm.check_budget, r, 200_000)
    if name == "4-bit shared values, no pruning":
        assert 100_000 < r.total_bytes < 200_000 and "prune" in failure(pm.check_budget, r, 100_000)
    if name.startswith("over-pruned"):
        assert r.total_bytes < 100_000 and "below the floor" in failure(pm.check_floor, r)
        assert "accuracy floor" in failure(pm.check_budget, r, 100_000)      # small, but not accurate enough
    if name == "a pickled class in the artifact":
        assert r.stage == "artifact" and "__main__.Packed" in r.error
        assert "weights_only" in failure(pm.check_round_trip, r)
    if name in ("decompress ignores the artifact", "pruned to nothing (99% per layer)"):
        assert r.accuracy < 0.2 and "chance is 10%" in failure(pm.check_round_trip, r)


def failure(check, *args) -> str:
    with pytest.raises(AssertionError) as info:
        check(*args)
    return str(info.value)


@pytest.mark.slow
@needs_mnist
def test_a_decompress_that_is_not_deterministic_fails_the_hidden_check():
    r = measured("not deterministic")
    assert r.tiers() == tiers(**{"round trip": True, "floor": True}) and r.deterministic is False
    assert "different logits" in failure(pm.check_deterministic, r)


@pytest.mark.slow
@needs_mnist
@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheats_are_refused_in_the_measuring_processes(name):
    code, stage, words = CHEATS[name]
    r = mis.measure(None, None, source=code, quiet=True)
    assert r.stage == stage and words in r.error, r.report()
    assert r.tiers() == tiers() and "failed at " + stage in failure(pm.check_round_trip, r)


@pytest.mark.slow
@needs_mnist
def test_weights_from_a_file_the_answer_cell_wrote_beforehand(tmp_path):
    """The answer cell runs unguarded in the grading kernel: say it saved the given model to a file."""
    saved, scripted = tmp_path / "given.pt", tmp_path / "given_jit.pt"
    torch.save(mis.given_model().state_dict(), saved)
    with warnings.catch_warnings():      # torch.jit is deprecated, and still loads
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(mis.given_model()), scripted)
    plain = answer("return {}", f"m = LeNet300()\nm.load_state_dict(torch.load({str(saved)!r}))\nreturn m")
    r = mis.measure(None, None, source=plain, quiet=True)
    assert r.stage == "decompress" and "does not let your code read" in r.error
    # torch.jit.load reads in C++, past the audit hook: the visible tiers pass, the hidden check does not
    jit = answer("return {}", f"return torch.jit.load({str(scripted)!r})")
    r = mis.measure(None, None, source=jit, quiet=True)
    assert r.tiers() == FULL and r.same_as_given
    assert "found the weights somewhere else" in failure(pm.check_not_the_given_model, r)


@pytest.mark.slow
@needs_mnist
def test_weights_hidden_in_the_code_count_toward_the_size():
    blob = io.BytesIO()
    torch.save({k: v.half() for k, v in mis.given_model().state_dict().items()}, blob)
    load = "a = torch.load(io.BytesIO(base64.b64decode(BLOB)), weights_only=True)\n" + textwrap.dedent(LOAD_HALF)
    code = answer("return {}", load,
                  top=f"import base64, io\nBLOB = {base64.b64encode(blob.getvalue()).decode()!r}")
    r = mis.measure(None, None, source=code, quiet=True)
    assert r.artifact_bytes < 2_000 and r.code_bytes > 700_000
    assert r.tiers() == tiers(**{"round trip": True, "floor": True}) and not r.same_as_given
    assert "code" in failure(pm.check_budget, r, 200_000)


@pytest.mark.slow
@needs_mnist
def test_a_compress_that_hangs_is_stopped(monkeypatch):
    monkeypatch.setitem(mis.SECONDS, "compress", 5.0)
    r = mis.measure(None, None, source=answer("while True:\n    pass", FRESH), quiet=True)
    assert r.stage == "compress" and "did not finish within 5 s" in r.error


def test_check_budget_rejects_a_bad_budget():
    with pytest.raises(ValueError, match="budget"):
        pm.check_budget(mis.Measurement(), 0)


# --- the sandbox on its own (no MNIST needed) ----------------------------------------------------

def test_load_artifact_and_describe():
    weights = torch.arange(12.0)
    blob = io.BytesIO()
    torch.save({"w": weights[:4], "again": weights[4:], "meta": {"n": 3, "name": "x"}}, blob)
    contents = sandbox.describe(sandbox.load_artifact(blob.getvalue()))
    assert contents == [("w", "float32 [4]", 48), ("again", "float32 [8]", 0),       # one storage, counted once
                        ("meta.n", "int (size of its repr)", 1), ("meta.name", "str (size of its repr)", 3)]
    for bad, words in ((b"garbage", "refused it"), (saved([1, 2]), "must return a dict"),
                       (b"x" * (sandbox.MAX_ARTIFACT_BYTES + 1), "over the")):
        with pytest.raises(ValueError, match=words):
            sandbox.load_artifact(bad)


def saved(obj) -> bytes:
    blob = io.BytesIO()
    torch.save(obj, blob)
    return blob.getvalue()


def test_run_child_runs_the_code_guarded_and_refuses_a_bad_role():
    readable = {"folders": sandbox.python_folders(), "files": [], "denied": []}
    code = textwrap.dedent("""
        import os, subprocess
        def compress(model):
            print("hello from compress")
            try:
                subprocess.run(["true"])
            except PermissionError as e:
                print(e)
            return {"n": sum(p.numel() for p in model.parameters()), "pid": os.getpid()}
        """)
    replies, output = sandbox.run_child("compress", {"code": code, "state": LeNet300().state_dict(), **readable})
    artifact = sandbox.load_artifact(replies[-1]["artifact"])
    assert artifact["n"] == 266_610 and "hello from compress" in output and "subprocess.Popen" in output
    assert not os.path.exists(f"/proc/{artifact['pid']}")     # the child is gone
    with pytest.raises(ValueError, match="role"):
        sandbox.run_child("train", {})


# --- the notebook, graded end to end --------------------------------------------------------------

def submission(tmp_path, answers: dict) -> Path:
    """The exercise notebook with its answer cells (by grade_id) replaced."""
    nb = nbformat.read(str(ROOT / "exercises" / NAME), as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers.pop(grade_id)
    assert not answers, answers
    path = tmp_path / NAME
    nbformat.write(nb, str(path))
    return path


@pytest.mark.slow
@needs_mnist
@pytest.mark.timeout(900)
def test_grading_the_student_version_and_a_cheat(tmp_path, monkeypatch):
    """The solution is graded whole by test_a_term_with_private_hidden_tests_end_to_end (this grader) and by
    nbgrader (test_nbgrader_autogrades_the_solution_full_and_the_release_zero)."""
    monkeypatch.chdir(ROOT)    # the grader finds solutions/ under the current folder
    report = grade.grade(ROOT / "exercises" / NAME)
    assert report.max_score == 10 and set(report.points.values()) == {0.0}
    assert all("NotImplementedError" in m for m in report.messages.values())
    # The first answer cell writes a TorchScript copy of the given model while it runs in the grading sandbox,
    # and defines both functions; decompress loads that copy. Without a jail the visible checks pass and the
    # hidden ones see the given model's exact logits; with one, the measuring child cannot see the sandbox's
    # files (nor the training data that would retrain the model), so the round trip fails. Zero either way.
    planted = tmp_path / "planted.pt"
    cheat = answer("return {}", "return torch.jit.load(PATH)", top=f"""
        import os
        PATH = {str(planted)!r}
        if not os.path.exists(PATH):
            from course_lib.grading.make_it_small import given_model
            torch.jit.save(torch.jit.script(given_model()), PATH)
        """)
    sub = submission(tmp_path, {"pr_small_compress": cheat, "pr_small_decompress": ""})
    report = grade.grade(sub, ROOT / "solutions" / NAME)
    assert set(report.points.values()) == {0.0}, grade.format_report(report)
    if jail.available() is not None:     # a reason: no jail here
        assert "found the weights somewhere else" in report.messages["pr_small_50kb_test"]


@pytest.mark.slow
@needs_mnist
@pytest.mark.timeout(900)
def test_nbgrader_autogrades_the_solution_full_and_the_release_zero(tmp_path, monkeypatch):
    pytest.importorskip("nbgrader")
    from test_nbgrader import autograde, course

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    api = course(tmp_path, "small", [ROOT / "solutions" / NAME])
    solved = autograde(api, tmp_path, "small", "solver", {NAME: ROOT / "solutions" / NAME})
    assert solved["total"] == solved["max"] == 10, solved
    untouched = autograde(api, tmp_path, "small", "idle", {NAME: tmp_path / "release" / "small" / NAME})
    assert untouched["total"] == 0 and untouched["max"] == 10, untouched


def test_pythonpath_folders_are_readable_but_the_test_set_still_is_not(monkeypatch, tmp_path):
    """Packages installed with pip --target live on PYTHONPATH; a denied folder under it stays denied."""
    extra = tmp_path / "site"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(extra), "", str(tmp_path / "other")]))
    folders = sandbox.python_folders()
    assert os.path.realpath(extra) in folders and os.path.realpath(tmp_path / "other") in folders
    assert os.path.realpath("") not in folders                  # an empty entry is not the current folder
    course = sandbox.PACKAGE.parent                             # it holds solutions/ and the hidden tests
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(course), str(course.parent), str(extra)]))
    folders = sandbox.python_folders()
    assert os.path.realpath(course) not in folders and os.path.realpath(course.parent) not in folders
    assert os.path.realpath(extra) in folders


@pytest.mark.slow
@needs_mnist
def test_a_term_with_private_hidden_tests_end_to_end(tmp_path, monkeypatch):
    """The instructor's private copy (this term's seed for the hidden re-measurement, one more hidden test) is
    checked against the public exercise, then grades from COURSE_SOLUTIONS_DIR: the private tests run. The public
    solution handed in earns every point but the one the private test takes away, and every cell runs without an
    error (make test leaves the practica's solutions to the gradings, not to nbval)."""
    from course_lib.grading import exercises
    nb = nbformat.read(str(ROOT / "solutions" / NAME), as_version=4)
    assert "seed=20261122" in nbformat.writes(nb)
    for cell in nb.cells:
        cell.source = cell.source.replace("seed=20261122", "seed=20270301")
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "pr_small_50kb_test":
            cell.source = cell.source.replace("### END HIDDEN TESTS",
                                              "assert False, \"this term's private hidden test\"\n### END HIDDEN TESTS")
    (tmp_path / "private").mkdir()
    nbformat.write(nb, str(tmp_path / "private" / NAME))
    assert exercises.main(["--private", str(tmp_path / "private"), "--exercises", str(ROOT / "exercises")]) == 0
    monkeypatch.setenv("COURSE_SOLUTIONS_DIR", str(tmp_path / "private"))
    monkeypatch.chdir(ROOT)
    (tmp_path / "submitted").mkdir()
    submitted = tmp_path / "submitted" / NAME
    submitted.write_bytes((ROOT / "solutions" / NAME).read_bytes())   # the public solution, handed in
    start = time.monotonic()
    report = grade.grade(submitted)
    seconds = time.monotonic() - start
    assert report.source == str(tmp_path / "private" / NAME)
    assert report.points == {**dict.fromkeys(report.max_points, 2.0), "pr_small_50kb_test": 0.0}, report.messages
    assert "this term's private hidden test" in report.messages["pr_small_50kb_test"]
    assert all(note.startswith("graded as") for note in report.notes), report.notes
    print(f"\ngrading the solution in quick mode took {seconds:.0f} s on this machine; target < 60 s on a quiet "
          "2-core CPU")
