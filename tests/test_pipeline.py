"""Model and pipeline parallelism on 2 and 4 processes against one process and torch.distributed.pipelining."""
import json

import pytest
import torch

from course_lib import bench
from course_lib.bench import pipeline as pipeline_bench
from course_lib.distributed import pipeline, pipeline_torch
from course_lib.distributed.launch import launch

P = pipeline


def test_split_model_and_boundary_shapes():
    model = P.make_mlp(width=32, blocks=4)
    stages = P.split_model(model, 2)
    assert [len(s) for s in stages] == [3, 2]
    x = torch.randn(8, 20)
    out = x
    for s in stages:
        out = s(out)
    assert torch.equal(out, model(x))
    assert P.boundary_shapes(stages, x) == [torch.Size([8, 20]), torch.Size([8, 32]), torch.Size([8, 5])]
    with pytest.raises(ValueError, match="K=6 stages but the model has only 5"):
        P.split_model(model, 6)
    with pytest.raises(ValueError, match="K must"):
        P.split_model(model, 0)


def test_train_refuses_a_batch_that_does_not_split():
    with pytest.raises(ValueError, match="batch=10 must be divisible by micro_batches=4"):
        P.train(0, 2, "gpipe", 4, batch=10)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_train_like_one_process_and_like_torch():
    ref = P.train_single(steps=3)
    runs = [("gpipe", 1), ("gpipe", 4), ("1f1b", 4)]
    results = launch(P.several, 2, *[(P.train, (s, m)) for s, m in runs],
                     (P.compare_with_torch_pipelining, (4,)), (pipeline_torch.compare_with_torch_schedules, (4,)),
                     timeout=200)
    for i, (schedule, M) in enumerate(runs):
        ranks = [r[i] for r in results]
        assert P.max_weight_difference(ranks, ref) < 1e-6, (schedule, M)
        assert ranks[-1]["losses"] == pytest.approx(ref["losses"], abs=1e-6)
        assert [r["peak_in_flight"] for r in ranks] == {("gpipe", 1): [1, 1], ("gpipe", 4): [4, 4],
                                                        ("1f1b", 4): [2, 1]}[(schedule, M)]
    torch_cmp = [r[3] for r in results]
    for name in ("gpipe", "1f1b"):
        assert all(c[f"{name}_order"] and c[f"{name}_grad_diff"] < 1e-6 for c in torch_cmp)
        assert torch_cmp[-1][f"{name}_loss"] == pytest.approx(torch_cmp[-1][f"{name}_ours_loss"], abs=1e-6)
        assert torch_cmp[-1][f"{name}_loss"] == pytest.approx(ref["losses"][0], abs=1e-6)
    assert_torch_schedules_agree([r[4] for r in results])


def assert_torch_schedules_agree(ranks):
    """compare_with_torch_schedules on every rank: torch's plan and what its stages ran are our order; gradients
    and the loss (on the rank that computes it) are those of one process on the whole batch."""
    for name in pipeline_torch.TORCH_SCHEDULES:
        assert all(r[f"{name}_plan"] and r[f"{name}_ran"] for r in ranks), name
        assert max(r[f"{name}_grad_diff"] for r in ranks) < 1e-6, name
        losses = [(r[f"{name}_loss"], r[f"{name}_ref_loss"]) for r in ranks if r[f"{name}_ref_loss"]]
        assert len(losses) == 1 and losses[0][0] == pytest.approx(losses[0][1], abs=1e-6), name


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_four_ranks_activation_memory_and_torch():
    ref = P.train_single(steps=2, batch=16)
    results = launch(P.several, 4, (P.train, ("gpipe", 8, 2)), (P.train, ("1f1b", 8, 2)),
                     (P.compare_with_torch_pipelining, (4,)), (pipeline_torch.compare_with_torch_schedules, (8,)),
                     timeout=280)
    for i, peaks in enumerate([[8, 8, 8, 8], [4, 3, 2, 1]]):
        ranks = [r[i] for r in results]
        assert P.max_weight_difference(ranks, ref) < 1e-6
        assert [r["peak_in_flight"] for r in ranks] == peaks
    assert all(r[2]["gpipe_order"] and r[2]["1f1b_order"] and r[2]["1f1b_grad_diff"] < 1e-6 for r in results)
    assert_torch_schedules_agree([r[3] for r in results])


def test_max_weight_difference_counts_parameters():
    with pytest.raises(ValueError, match="parameters"):
        P.max_weight_difference([{"weights": [torch.zeros(1).numpy()]}], {"weights": []})


def test_sleep_stage_and_make_stage():
    stage = pipeline_bench.make_stage("sleep", 4, 1, 1.0)
    x = torch.randn(2, 4, requires_grad=True)
    stage(x).sum().backward()
    assert x.grad is not None and stage.linear.weight.grad is not None
    assert len(pipeline_bench.make_stage("matmul", 8, 3, 0)) == 6
    with pytest.raises(ValueError, match="work must be"):
        pipeline_bench.make_stage("gpu", 8, 1, 0)


def test_summarize_defines_efficiency_from_stage_times():
    # two steps per rank, (wall s, stage s): each step is judged against its own stage times
    fake = [{"by_M": {4: {"wall_s": 0.05, "busy_s": 0.03, "steps": [(0.05, 0.01), (0.1, 0.02)]}}},
            {"by_M": {4: {"wall_s": 0.049, "busy_s": 0.03, "steps": [(0.049, 0.01), (0.09, 0.02)]}}}]
    (row,) = pipeline_bench.summarize(fake, [4])      # the slowest rank's wall counts
    assert row["predicted"] == 0.8 and row["measured"] == 0.8     # 4 x 0.02 s / 2 ranks / 0.05 s; 4 x 0.04 / 2 / 0.1
    assert row["measured/predicted"] == 1.0 and row["busy fraction"] == 0.6    # 0.06 / (2 x 0.05)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pipeline_benchmark_quick(capsys):
    assert bench.main(["pipeline", "--quick", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"benchmark", "efficiency_vs_model", "efficiency_vs_model_is", "busy_vs_model", "rows", "stage_ms",
            "stage_alone_ms", "send_ms", "stage_imbalance", "quick"} <= set(summary)
    assert summary["benchmark"] == "pipeline" and summary["quick"] is True
    assert [r["M"] for r in summary["rows"]] == [1, 4]
    assert all(0 < r["measured"] and 0 < r["predicted"] < 1 for r in summary["rows"])
    assert summary["efficiency_vs_model"] > 0 and 0 < summary["busy_vs_model"] <= 1.25
