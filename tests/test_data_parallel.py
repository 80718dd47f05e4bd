"""DataParallel simulated on CPU: same gradients as one device with the whole batch, bytes through the master."""
import copy

import pytest
import torch
from torch import nn

from course_lib.distributed import data_parallel as dp, dp_report
from course_lib.models import Net


def small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def batch(n=10, features=6):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, features, generator=g), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("threads", [False, True])
def test_gradients_equal_one_device_with_whole_batch(k, threads):
    model = small_model()
    x, y = batch(10)  # 10 is not divisible by 3 or 4
    ref = dp.reference_grads(model, x, y)
    report = dp.dp_step(model, x, y, k, threads=threads)
    assert dp.max_grad_difference(model, ref) < 1e-6
    assert report.k == k and report.loss == pytest.approx(nn.functional.cross_entropy(model(x), y).item(), abs=1e-6)


def test_net_in_eval_mode_matches_and_train_mode_dropout_does_not():
    torch.manual_seed(0)
    model = Net().eval()
    x, y = torch.randn(7, 1, 28, 28), torch.randint(0, 10, (7,))
    ref = dp.reference_grads(model, x, y)
    dp.dp_step(model, x, y, 3)
    assert dp.max_grad_difference(model, ref) < 1e-6
    model.train()  # dropout: every replica draws its own mask, so the gradients differ
    torch.manual_seed(1)
    ref = dp.reference_grads(model, x, y)
    torch.manual_seed(1)
    dp.dp_step(model, x, y, 3)
    assert dp.max_grad_difference(model, ref) > 1e-4


def test_batchnorm_running_stats_come_from_device_0_only():
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 2))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    expected = copy.deepcopy(model)
    expected(x[:4])  # device 0's chunk of a K=2 split
    dp.dp_step(model, x, y, 2)
    assert torch.allclose(model[1].running_mean, expected[1].running_mean)


def test_optimizer_step_matches_one_device():
    model, x, y = small_model(), *batch(9)
    single = copy.deepcopy(model)
    opt_single = torch.optim.SGD(single.parameters(), lr=0.1)
    nn.functional.cross_entropy(single(x), y).backward()
    opt_single.step()
    dp.dp_step(model, x, y, 4, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    for a, b in zip(model.parameters(), single.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_old_master_gradients_are_replaced_not_added():
    model, x, y = small_model(), *batch(10)
    ref = dp.reference_grads(model, x, y)
    for p in model.parameters():
        p.grad = torch.full_like(p, 5.0)
    dp.dp_step(model, x, y, 2)
    assert dp.max_grad_difference(model, ref) < 1e-6


@pytest.mark.parametrize("n, k, sizes", [(10, 4, [3, 3, 3, 1]), (10, 3, [4, 4, 2]), (5, 4, [2, 2, 1]), (2, 4, [1, 1])])
def test_scatter_sizes_follow_torch_chunk(n, k, sizes):
    x = torch.arange(n * 2).reshape(n, 2)
    chunks = dp.scatter(x, k)
    assert [len(c) for c in chunks] == sizes == [len(c) for c in torch.chunk(x, k)]
    assert torch.equal(dp.gather(chunks), x)


def test_fewer_chunks_than_devices_leaves_devices_idle():
    model, x, y = small_model(), *batch(5)
    report = dp.dp_step(model, x, y, 4)  # chunks 2, 2, 1: device 3 gets nothing, as in nn.DataParallel
    assert report.traffic(3) == 0 and report.traffic(2) > 0


def test_gather_shape_and_bad_input():
    out = dp.gather([torch.zeros(3, 5), torch.zeros(2, 5)])
    assert out.shape == (5, 5)
    with pytest.raises(ValueError, match="outputs"):
        dp.gather([])


def test_replicas_are_independent_copies():
    model = small_model()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    replicas = dp.replicate(model, 3)
    assert len(replicas) == 3 and all(p.grad is None for r in replicas for p in r.parameters())
    with torch.no_grad():
        replicas[1][0].weight.add_(1.0)
    assert torch.equal(replicas[0][0].weight, model[0].weight)
    assert torch.equal(replicas[2][0].weight, model[0].weight)
    assert not torch.equal(replicas[1][0].weight, model[0].weight)


def test_parallel_apply_threads_and_sequential_agree():
    replicas = dp.replicate(small_model(), 2)
    inputs = dp.scatter(batch(6)[0], 2)
    a = dp.parallel_apply(replicas, inputs)
    b = dp.parallel_apply(replicas, inputs, threads=True)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    with pytest.raises(ValueError, match="one input per replica"):
        dp.parallel_apply(replicas, inputs[:1])


def test_reduce_gradients_sums_and_checks_shapes():
    master, replicas = small_model(), dp.replicate(small_model(), 3)
    for i, r in enumerate(replicas):
        for p in r.parameters():
            p.grad = torch.full_like(p, float(i + 1))
    dp.reduce_gradients(replicas, master)
    assert all(torch.equal(p.grad, torch.full_like(p, 6.0)) for p in master.parameters())
    with pytest.raises(ValueError, match="parameters"):
        dp.reduce_gradients([nn.Linear(6, 8)], master)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_bad_k_is_rejected(bad):
    model, x, y = small_model(), *batch(4)
    for call in (lambda: dp.scatter(x, bad), lambda: dp.replicate(model, bad), lambda: dp.dp_step(model, x, y, bad)):
        with pytest.raises(ValueError, match="k must be"):
            call()


def test_bad_batches_are_rejected():
    model = small_model()
    with pytest.raises(ValueError, match="batch"):
        dp.scatter(torch.zeros(0, 3), 2)
    with pytest.raises(ValueError, match="same"):
        dp.dp_step(model, torch.zeros(4, 6), torch.zeros(3, dtype=torch.long), 2)
    with pytest.raises(TypeError, match="module"):
        dp.replicate("net", 2)


def test_master_traffic_grows_with_k_others_stay_constant():
    x, y = batch(12)
    rows = dp_report.traffic_by_k(small_model, x, y, [1, 2, 3, 4, 6])
    master = [r["master_bytes"] for r in rows]
    assert master[0] == 0 and all(a < b for a, b in zip(master, master[1:]))
    others = [r["other_bytes"] for r in rows[1:]]
    assert max(others) <= others[0]  # a non-master device never moves more than with K=2
    report = dp.dp_step(small_model(), x, y, 4)
    assert report.traffic(dp.MASTER) == sum(report.traffic(d) for d in range(1, 4))  # every byte crosses the master


def test_report_phases_and_plots():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = dp.dp_step(small_model(), *batch(8), 2, optimizer=None)
    assert set(report.phase_times()) == set(dp.PHASES) - {"step"}
    assert all(e.end >= e.start for e in report.events)
    for ideal in (True, False):
        ax = dp_report.plot_dp_timeline(report, ideal=ideal)
        assert len(ax.patches) == len(report.events)
        plt.close("all")
    dp_report.plot_traffic(dp_report.traffic_by_k(small_model, *batch(8), [1, 2]))
    plt.close("all")


def test_comparison_table():
    table = dp_report.comparison_markdown()
    assert table.count("\n") == len(dp_report.COMPARISON) + 1 and "master bottleneck" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="the pass-through only happens without GPUs")
def test_nn_data_parallel_is_a_pass_through_on_cpu():
    model, (x, _) = small_model(), batch(5)
    wrapped = nn.DataParallel(model)
    assert wrapped.device_ids == [] and wrapped.module is model
    assert torch.equal(wrapped(x), model(x))


def test_torch_data_parallel_needs_two_gpus():
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match="CUDA GPUs"):
        dp.torch_data_parallel_grads(small_model(), *batch(4), max(2, available + 1))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs >= 2 CUDA GPUs")
@pytest.mark.parametrize("k", [2, 3])
def test_matches_real_nn_data_parallel(k):
    if torch.cuda.device_count() < k:
        pytest.skip(f"needs {k} GPUs")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    assert dp.assert_matches_torch_dp(small_model(), *batch(10), k) < 1e-5


# --- the agreement checks lecture 06 used to run cell by cell ---------------------------------------

def test_summing_is_right_and_averaging_is_k_times_too_small():
    model, (x, y) = small_model(), batch(10)
    ref = dp.reference_grads(model, x, y)
    dp.dp_step(model, x, y, 3)
    grads = [p.grad for p in model.parameters()]
    assert all(torch.allclose(g, r, atol=1e-6) for g, r in zip(grads, ref))
    assert not torch.allclose(grads[0] / 3, ref[0], atol=1e-6)


def test_phases_by_hand_equal_one_device_and_chunks_follow_torch_chunk():
    model, (x, y) = small_model(), batch(10)
    ref = dp.reference_grads(model, x, y)
    chunks = dp.scatter(x, 4)
    assert [len(c) for c in chunks] == [3, 3, 3, 1] and len(dp.scatter(x[:5], 4)) == 3
    replicas = dp.replicate(model, len(chunks))
    logits = dp.gather(dp.parallel_apply(replicas, chunks))
    assert torch.allclose(logits, model(x), atol=1e-6)
    nn.functional.cross_entropy(logits, y).backward()
    master = copy.deepcopy(model)
    dp.reduce_gradients(replicas, master)
    assert dp.max_grad_difference(master, ref) < 1e-6


def test_batchnorm_train_mode_differs_eval_mode_matches():
    torch.manual_seed(0)
    bn = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    x, y = batch(10)
    ref = dp.reference_grads(bn, x, y)
    dp.dp_step(bn, x, y, 2)
    assert dp.max_grad_difference(bn, ref) > 1e-4      # each chunk normalised with its own statistics
    bn.eval()
    ref = dp.reference_grads(bn, x, y)
    dp.dp_step(bn, x, y, 2)
    assert dp.max_grad_difference(bn, ref) < 1e-6      # running statistics: identical


def test_other_devices_move_about_two_model_copies_and_master_is_k_minus_1_of_them():
    x, y = batch(64)
    model_bytes = sum(p.numel() * p.element_size() for p in small_model().parameters())
    ks = list(range(1, 9))
    rows = dp_report.traffic_by_k(small_model, x, y, ks)
    master, others = [r["master_bytes"] for r in rows], [r["other_bytes"] for r in rows[1:]]
    assert all(a < b for a, b in zip(master, master[1:]))
    assert max(others) <= others[0] and min(others) > 0.95 * 2 * model_bytes
    assert abs(master[-1] - (ks[-1] - 1) * others[-1]) / master[-1] < 0.05


def test_master_only_phases_run_on_the_master_and_forward_on_every_device():
    report = dp.dp_step(small_model(), *batch(12), 4)
    master_only = {"scatter", "replicate", "gather", "loss", "grad_scatter", "reduce"}
    assert {e.device for e in report.events if e.phase in master_only} == {dp.MASTER}
    assert {e.device for e in report.events if e.phase == "forward"} == {0, 1, 2, 3}
