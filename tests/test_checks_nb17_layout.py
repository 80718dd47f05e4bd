"""Lecture 17's exercise (d), the memory of a dp x tp x pp layout: the check passes the solution, fails the stub, and
names each plausible mistake. The solution is the one the solutions notebook carries (written out here, as a
learner would, without the library)."""
import pytest

from course_lib.checks.nb17_layout import CASES, MISTAKES, _memory, check_layout_memory
from course_lib.simulate.layout_memory import layout_memory as library_layout_memory


def make_answer(param_bytes=2, k=12, states_from=1, grads_from=2, params_from=3, replicated_tp=False, tp_params=True,
                pp_params=True, act="sp", flight="1f1b", act_pp=True, refuse=True):
    """The solution, or the solution with one mistake (the defaults: the solution)."""
    def layout_memory(layers, hidden, heads, seq, micro_batch, dp, tp, pp, zero_stage, micro_batches):
        if refuse and heads % tp:
            raise ValueError(f"tp={tp} must divide heads={heads}")
        if refuse and layers % pp:
            raise ValueError(f"pp={pp} must divide layers={layers}")
        h, s, b, a = hidden, seq, micro_batch, heads
        split, whole = 12 * h * h + 7 * h, 6 * h                 # per block: split over tp / whole on every rank
        t = tp if tp_params else 1
        params = layers // (pp if pp_params else 1) * (split / t + whole / (t if replicated_tp else 1))

        def shard(stage):
            return dp if zero_stage >= stage else 1
        t_act = 1 if act == "whole" else tp
        per_layer = {"sp": s * b * h * (34 / t_act + 5 * a * s / (h * t_act)),
                     "whole": s * b * h * (34 + 5 * a * s / h),
                     "tp_only": s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)),
                     "selective": s * b * h * 34 / tp}[act]
        held = {"1f1b": min(pp, micro_batches), "gpipe": micro_batches, "one": 1, "pp": pp}[flight]
        return {"parameters": param_bytes * params / shard(params_from),
                "gradients": param_bytes * params / shard(grads_from),
                "optimizer_states": k * params / shard(states_from),
                "activations": layers // (pp if act_pp else 1) * held * per_layer}
    return layout_memory


def test_solution_passes_and_equals_the_library(capsys):
    check_layout_memory(make_answer())
    assert "all checks passed" in capsys.readouterr().out
    for c in CASES:
        assert make_answer()(*c.values()) == pytest.approx(library_layout_memory(**c), rel=1e-12)
        assert _memory(c) == pytest.approx(library_layout_memory(**c), rel=1e-12)


def test_stub_fails():
    def stub(*args):
        raise NotImplementedError()
    with pytest.raises(NotImplementedError):
        check_layout_memory(stub)


def test_every_named_mistake_is_seen_by_some_case():
    """Each mistake changes some term on some case (else it could not be named)."""
    for name, (how, _) in MISTAKES.items():
        assert any(_memory(c, **how) != pytest.approx(_memory(c), rel=1e-12) for c in CASES), name


@pytest.mark.parametrize("mistake, message", [
    (dict(param_bytes=4), "bf16 under mixed precision: 2 bytes each"),
    (dict(k=16), "K = 12 bytes per parameter"),
    (dict(states_from=4), "optimizer states are not divided by dp"),
    (dict(params_from=1), "divide the parameters by dp at ZeRO-1 or 2"),
    (dict(params_from=4), "ZeRO-3 shards the parameters too"),
    (dict(grads_from=1), "divide the gradients by dp at ZeRO-1"),
    (dict(grads_from=4), "ZeRO-2 \\(and 3\\) shard the gradients"),
    (dict(replicated_tp=True), "LayerNorms and the row-parallel layers' biases"),
    (dict(tp_params=False), "parameters are not divided by tp"),
    (dict(pp_params=False), "parameters are not divided by pp"),
    (dict(act="tp_only"), "WITHOUT sequence parallelism"),
    (dict(act="whole"), "activations are not divided by tp"),
    (dict(act="selective"), "attention term 5as²b"),
    (dict(flight="gpipe"), "as GPipe does"),
    (dict(flight="one"), "not one"),
    (dict(flight="pp"), "only m are in flight"),
    (dict(act_pp=False), "its own layers/pp blocks"),
])
def test_named_mistakes_fail(mistake, message):
    with pytest.raises(AssertionError, match=message):
        check_layout_memory(make_answer(**mistake))


def test_unrefused_layouts_fail():
    with pytest.raises(AssertionError, match="tp=3 does not divide heads=4: raise a ValueError naming 'tp'"):
        check_layout_memory(make_answer(refuse=False))


def test_refusal_must_name_the_argument():
    def vague(*args):
        if args[2] % args[6] or args[0] % args[7]:
            raise ValueError("bad layout")
        return make_answer()(*args)
    with pytest.raises(AssertionError, match="name the argument 'tp'"):
        check_layout_memory(vague)


def test_wrong_return_types_fail():
    with pytest.raises(AssertionError, match="must return a dict with keys"):
        check_layout_memory(lambda *a: sum(make_answer()(*a).values()))
    with pytest.raises(AssertionError, match="must be a number of bytes"):
        check_layout_memory(lambda *a: {k: str(v) for k, v in make_answer()(*a).items()})


def test_gigabytes_instead_of_bytes_fail():
    with pytest.raises(AssertionError, match="parameters for layout_memory.*expected"):
        check_layout_memory(lambda *a: {k: v / 1e9 for k, v in make_answer()(*a).items()})


def test_the_library_function_is_refused():
    def layout_memory(*args):
        from course_lib.simulate.layout_memory import layout_memory
        return layout_memory(*args)
    with pytest.raises(AssertionError, match="the library's own formula"):
        check_layout_memory(layout_memory)
