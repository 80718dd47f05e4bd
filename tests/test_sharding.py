"""ZeRO memory formulas, the hand-sharded optimizer, FSDP2 helpers and the sharding benchmark."""
import json

import matplotlib
import pytest
import torch

from course_lib import activations, bench, trace
from course_lib.distributed import sharding
from course_lib.distributed.launch import launch
from course_lib.distributed.sharding_workers import fsdp_knobs, measure_sharding, shard_friendly_mlp, trace_fsdp

matplotlib.use("Agg")


def test_zero_memory_reproduces_the_papers_7_5b_example():
    """Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, K = 12, N = 64."""
    gb = [sharding.zero_memory(7.5e9, 64, stage)["total"] / 1e9 for stage in range(4)]
    assert [round(g, 1) for g in gb] == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_memory_components(stage):
    psi, n, k = 1000, 8, 12
    m = sharding.zero_memory(psi, n, stage, k)
    assert m["parameters"] == 2 * psi / (n if stage == 3 else 1)
    assert m["gradients"] == 2 * psi / (n if stage >= 2 else 1)
    assert m["optimizer_states"] == k * psi / (n if stage >= 1 else 1)
    assert m["total"] == pytest.approx(m["parameters"] + m["gradients"] + m["optimizer_states"])
    assert sharding.zero_memory(psi, 1, stage, k)["total"] == (4 + k) * psi   # one rank: nothing to shard
    assert sharding.zero_memory(psi, n, stage, 8)["total"] < m["total"]


def test_activations_add_to_every_stage_unsharded():
    """7B (Ψ = 7e9) on 8 ranks, ZeRO-3: 16Ψ/8 = 14 GB of states; + the Korthikanti estimate for
    s = 2048, b = 1, h = 4096, a = 32, 32 layers: 32 x 2048·4096·(34 + 80) = 30.6 GB without recompute."""
    acts = activations.transformer_activation_bytes(2048, 1, 4096, 32, 32)
    assert acts == 32 * 956_301_312
    for stage in range(4):
        plain, with_acts = sharding.zero_memory(7e9, 8, stage), sharding.zero_memory(7e9, 8, stage, activations=acts)
        assert plain["activations"] == 0 and with_acts["activations"] == acts
        assert with_acts["total"] == pytest.approx(plain["total"] + acts)
    assert round(sharding.zero_memory(7e9, 8, 3, activations=acts)["total"] / 1e9, 1) == 14.0 + 30.6
    full = activations.transformer_activation_bytes(2048, 1, 4096, 32, 32, "full")
    assert round(sharding.zero_memory(7e9, 8, 3, activations=full)["total"] / 1e9, 2) == 14.0 + 0.54


def test_plot_with_activations_stacks_states_and_activations():
    import matplotlib.pyplot as plt

    ax = sharding.plot_zero_with_activations(7e9, 8, {"none": 30e9, "full": 1e9})
    bars = ax.patches
    assert len(bars) == 4 * 2 * 2                      # 4 stages x 2 variants x (states, activations)
    assert max(b.get_height() for b in bars) == pytest.approx(112.0)   # DDP's states: 16 x 7
    plt.close("all")


def test_zero_communication_is_ddp_volume_until_stage_3():
    ddp = sharding.zero_communication(1e6, 4, 0)
    assert ddp == pytest.approx(2 * 3 / 4 * 1e6)
    assert [sharding.zero_communication(1e6, 4, s) / ddp for s in (1, 2, 3)] == pytest.approx([1, 1, 1.5])
    assert sharding.zero_communication(1e6, 1, 3) == 0


@pytest.mark.parametrize("call, match", [
    (lambda: sharding.zero_memory(100, 2, 4), "stage"),
    (lambda: sharding.zero_memory(100, 2, True), "stage"),
    (lambda: sharding.zero_memory(0, 2, 1), "num_params"),
    (lambda: sharding.zero_memory(100, 0, 1), "world_size"),
    (lambda: sharding.zero_memory(100, 2, 1, k=0), "k"),
    (lambda: sharding.zero_communication(100, 2, -1), "stage"),
    (lambda: sharding.zero_memory(100, 2, 1, activations=-1), "activations"),
    (lambda: sharding.zero_memory(100, 2, 1, activations="1GB"), "activations"),
    (lambda: sharding.plot_zero_with_activations(100, 2, {}), "activations"),
    (lambda: sharding.shard_range(10, 4, 4), "rank"),
    (lambda: sharding.shard_range(0, 0, 4), "n"),
    (lambda: sharding._check_reshard(3, 4), "reshard_after_forward"),
    (lambda: sharding._check_reshard(2, 2), "reshard_after_forward"),
    (lambda: sharding._check_reshard(1, 4), "reshard_after_forward"),
    (lambda: sharding._check_reshard("yes", 4), "reshard_after_forward"),
])
def test_bad_arguments_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_plot_draws_one_line_per_variant():
    import matplotlib.pyplot as plt

    ax = sharding.plot_zero_memory(7.5e9, world_sizes=(1, 8, 64))
    assert len(ax.get_lines()) == 4
    assert ax.get_lines()[0].get_ydata()[0] == pytest.approx(120.0)
    plt.close("all")


@pytest.mark.parametrize("n, world", [(10, 4), (12, 4), (5, 4), (1, 3), (7, 1), (1000, 7)])
def test_shard_range_matches_torch_chunk_and_covers_everything(n, world):
    chunks = torch.arange(n).chunk(world)
    covered = []
    for rank in range(world):
        start, stop = sharding.shard_range(n, rank, world)
        expected = chunks[rank].tolist() if rank < len(chunks) else []
        assert list(range(start, stop)) == expected
        covered += range(start, stop)
    assert covered == list(range(n))


def test_byte_counters_on_a_plain_model():
    model = shard_friendly_mlp(width=16, depth=2)
    n_params = sum(p.numel() for p in model.parameters())
    assert sharding.parameter_bytes(model) == 4 * n_params and sharding.gradient_bytes(model) == 0
    opt = torch.optim.Adam(model.parameters())
    torch.nn.functional.cross_entropy(model(torch.randn(3, 784)), torch.tensor([0, 1, 2])).backward()
    opt.step()
    assert sharding.gradient_bytes(model) == 4 * n_params
    # exp_avg and exp_avg_sq like every parameter, plus one 4-byte `step` per parameter tensor
    n_tensors = len(list(model.parameters()))
    assert sharding.optimizer_state_bytes(opt) == 2 * 4 * n_params + 4 * n_tensors


@pytest.fixture(scope="module")
def three_ranks():
    """measure_zero and measure_fsdp on 3 ranks, width 62: 53,206 parameters (not a multiple of 3)."""
    return launch(measure_sharding, 3, 3, 62, 2, timeout=240)


@pytest.mark.slow
def test_hand_sharded_and_zero1_equal_ddp_adam_on_3_ranks_with_padding(three_ranks):
    results = [r["zero"] for r in three_ranks]
    n = sum(p.numel() for p in shard_friendly_mlp(62, 2).parameters())
    assert n % 3 != 0
    shard = -(-n // 3)
    for r in results:
        # 3 ranks sum the gradients in another order than DDP's all-reduce (and /3 rounds); Adam's
        # normalised step turns that rounding into ~1e-6 of weight: a thousandth of one step of lr 1e-3.
        assert r["max_diff"]["manual"] < 1e-5 and r["max_diff"]["zero1"] < 1e-5
        assert r["losses"]["manual"] == pytest.approx(r["losses"]["adam"], abs=1e-5)
        assert r["state_bytes"]["manual"] == 2 * 4 * shard + 4          # exp_avg, exp_avg_sq, one step
    assert r["state_bytes"]["adam"] == 2 * 4 * n + 4 * len(list(shard_friendly_mlp(62, 2).parameters()))
    owned = sorted(name for r in results for name in r["zero1_owns"])
    assert owned == sorted(name for name, _ in shard_friendly_mlp(62, 2).named_parameters())   # each once


def test_fsdp_equals_ddp_and_the_shards_add_up_on_3_ranks(three_ranks):
    results = [r["fsdp"] for r in three_ranks]
    for r in results:
        assert r["losses"]["fsdp"] == pytest.approx(r["losses"]["ddp"], abs=1e-5)
        assert r["max_diff"] < 1e-5
    for key in ("param_bytes", "grad_bytes"):
        assert sum(r[key]["fsdp"] for r in results) == results[0][key]["ddp"]
    assert results[0]["shapes"]["1.weight"] == [[62, 784], [21, 784]]      # torch.chunk of dim 0: 21, 21, 20
    assert results[2]["shapes"]["1.weight"] == [[62, 784], [20, 784]]
    assert results[2]["shapes"]["5.weight"] == [[10, 62], [2, 62]]          # 10 rows: 4, 4, 2


@pytest.mark.slow
def test_sharding_benchmark_quick(capsys):
    assert bench.main(["sharding", "--quick", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"benchmark", "quick", "zero1_state_ratio", "fsdp_param_ratio", "manual_state_ratio", "data"} <= set(summary)
    assert summary["benchmark"] == "sharding" and summary["quick"] is True
    assert summary["zero1_state_ratio"] == pytest.approx(0.5, rel=0.05)
    assert summary["fsdp_param_ratio"] == pytest.approx(0.5, rel=0.05)
    assert summary["zero1_max_weight_diff"] < 1e-6 and summary["fsdp_max_loss_diff"] < 1e-5


@pytest.mark.slow
def test_fsdp_trace_holds_all_gathers_and_reduce_scatters(tmp_path):
    """2 ranks, 2 traced steps of 3 sharded layers; gloo names them FSDP::all_gather (i) (FSDP2's own
    record_function), c10d::_reduce_scatter_base_ (the dispatcher op) and gloo:all_gather on its threads."""
    timeline = trace.merge(launch(trace_fsdp, 2, 2, 16, 2, 4, timeout=240))
    path = timeline.save_chrome(tmp_path / "fsdp2.json")
    events = json.loads(path.read_text())["traceEvents"]
    names = [e["name"] for e in events if e["ph"] == "X"]
    for rank in range(2):
        main = [s for s in timeline.spans if s.row == f"rank {rank} · main"]
        phases = {p.kind: p for p in main if p.depth == 0 and p.kind in ("forward", "backward")}
        gathers = [s for s in main if s.name.startswith("FSDP::all_gather (")]
        scatters = [s for s in main if "reduce_scatter" in s.name]
        assert len(gathers) == 2 * 2 * 3 and len(scatters) == 2 * 3      # forward + backward gathers; 3 layers
        assert {"forward", "backward"} <= set(phases)
        backward = max((p for p in main if p.depth == 0 and p.kind == "backward"), key=lambda p: p.start_us)
        scatters.sort(key=lambda s: s.start_us)
        assert all(backward.start_us <= s.start_us < backward.start_us + backward.dur_us for s in scatters[-3:])
    assert sum("all_gather" in n for n in names) >= 2 * 12 and sum("reduce_scatter" in n for n in names) >= 2 * 6
    assert {e["cat"] for e in events if e["ph"] == "X" and "all_gather" in e["name"]} == {"comm"}


def test_reshard_after_forward_accepts_fsdp2s_values():
    assert [sharding._check_reshard(v, 8) for v in (None, True, False, 2, 4)] == [None, True, False, 2, 4]


@pytest.fixture(scope="module")
def knobs():
    """fsdp_knobs on 4 gloo ranks (4, so that reshard_after_forward=2 is allowed): 3 sharded layers."""
    return launch(fsdp_knobs, 4, backend="gloo", timeout=240)


def test_fsdp_knobs_change_the_collectives_not_the_result(knobs):
    assert set(knobs[0]) == {"default (True)", "reshard_after_forward=False", "reshard_after_forward=2",
                             "bf16 params, fp32 reduce", "prefetch=2"}
    for r in knobs:
        # one all-gather per layer in forward, just before the layer runs (prefetch=2: all before the first)
        for name in r:
            assert r[name]["forward"] == ("ag ag ag L1 L2 L3" if name == "prefetch=2" else "ag L1 ag L2 ag L3")
        # True gathers again in backward (one layer ahead, FSDP2's implicit prefetch); False does not
        assert r["default (True)"]["backward"] == "ag ag rs ag rs rs"
        assert r["reshard_after_forward=False"]["backward"] == "rs rs rs"
        assert r["default (True)"]["backward_gather_ranks"] == [4, 4, 4]
        assert r["reshard_after_forward=2"]["backward_gather_ranks"] == [2, 2, 2]
        # explicit prefetch of 2: every layer gathered before the first computes, in both passes
        assert r["prefetch=2"]["backward"] == "ag ag ag rs rs rs"
        mixed = r["bf16 params, fp32 reduce"]
        dtypes = ("gather_dtype", "compute_dtype", "reduce_dtype", "shard_dtype")
        assert [mixed[k] for k in dtypes] == ["bfloat16", "bfloat16", "float32", "float32"]
        assert (r["default (True)"]["gather_dtype"], r["default (True)"]["reduce_dtype"]) == ("float32", "float32")
        # received bytes: False skips backward's gathers (half); bf16 halves every gather
        assert 2 * r["reshard_after_forward=False"]["received"] == r["default (True)"]["received"]
        assert 2 * mixed["received"] == r["default (True)"]["received"]
        received = [r[name]["received"] for name in ("reshard_after_forward=False", "reshard_after_forward=2",
                                                     "default (True)")]
        assert received == sorted(set(received))                 # an int gathers less than True, more than False
        # the same weights and batch: only bf16 changes the gradients
        for name, setting in r.items():
            if name != "bf16 params, fp32 reduce":
                assert setting["grad_diff"] == 0 and setting["loss"] == r["default (True)"]["loss"]
        assert 0 < mixed["grad_diff"] < 0.1 and mixed["loss"] == pytest.approx(r["default (True)"]["loss"], abs=0.05)


def test_fsdp_knobs_parameter_bytes_held_between_forward_and_backward(knobs):
    full = knobs[0]["default (True)"]["full_bytes"]
    assert full == 4 * sum(p.numel() for p in shard_friendly_mlp(64, 2).parameters())
    held = {name: sum(rank[name]["held_after_forward"] for rank in knobs) for name in knobs[0]}
    assert held["default (True)"] == held["prefetch=2"] == held["bf16 params, fp32 reduce"] == full   # shards only
    assert held["reshard_after_forward=2"] == 2 * full          # each rank keeps 1/2
    assert held["reshard_after_forward=False"] == 4 * full      # each rank keeps every layer whole
