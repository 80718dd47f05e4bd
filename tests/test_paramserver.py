"""A parameter server and ring all-reduce train to the same weights; the server carries the traffic."""
import pytest
import torch

from course_lib.distributed import paramserver as P
from course_lib.distributed.collectives import traffic_matrix
from course_lib.distributed.launch import launch


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_param_server_sharded_server_and_all_reduce_reach_the_same_weights():
    n, steps, servers = 3, 10, 2       # 2 sharded servers on 3 ranks: rank 2 only pushes and pulls
    results = launch(P.train_both, n, steps, 16, 0.1, 0, servers)
    reference = P.train_reference(n, steps)
    assert not torch.allclose(reference, P.train_reference(n, 0))  # training moved the weights
    for r in results:
        assert torch.allclose(torch.tensor(r["param_server"]), reference, atol=1e-5)
        assert torch.allclose(torch.tensor(r["all_reduce"]), reference, atol=1e-5)
        assert torch.allclose(torch.tensor(r["sharded_server"]), reference, atol=1e-5)
    nbytes = reference.numel() * 4 * steps
    ps = traffic_matrix([r["param_server_traffic"] for r in results])
    ring = traffic_matrix([r["all_reduce_traffic"] for r in results])
    assert ps[0].sum() == (n - 1) * nbytes and ps[:, 0].sum() == (n - 1) * nbytes  # the server's link
    assert ring.sum(1).tolist() == [2 * (n - 1) * nbytes // n] * n
    assert reference.numel() % servers == 0          # 804 parameters: equal chunks, exact byte counts
    sharded = traffic_matrix([r["sharded_server_traffic"] for r in results])
    per_server = (n - 1) * nbytes // servers         # each server's link carries 1/S of the single server's
    assert sharded[:servers].sum(1).tolist() == [per_server + (servers - 1) * nbytes // servers] * servers  # + own pushes
    assert sharded[:, :servers].sum(0).tolist() == [per_server + (servers - 1) * nbytes // servers] * servers
    assert sharded[servers:].sum(1).tolist() == [nbytes]     # a worker pushes its whole gradient, once


def test_data_and_model_are_deterministic_and_bad_input_is_named():
    x, y = P.make_data(8, seed=1)
    assert x.shape == (8, P.FEATURES) and y.shape == (8,) and int(y.max()) < P.CLASSES
    assert torch.equal(x, P.make_data(8, seed=1)[0])
    a, b = P.make_model(3), P.make_model(3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="n_samples"):
        P.make_data(0)
