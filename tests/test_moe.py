"""Mixture of experts: dispatch and the aux loss on hand cases, the layer against a dense evaluation and a
per-token loop in one process, and expert parallelism (all-to-all) against one process on 2 and 4 ranks."""
import pytest
import torch
import torch.nn.functional as F

from course_lib.distributed.launch import launch
from course_lib.distributed.moe import (MoE, compare_expert_parallel, dense_moe, dispatch_indices, expert_capacity,
                                        load_balancing_loss, route)


def slots(experts, capacity):
    return dispatch_indices(torch.tensor(experts), capacity).tolist()


def test_dispatch_indices_hand_cases():
    assert slots([0, 1, 0], 0) == [-1, -1, -1]                    # capacity 0: everything dropped
    assert slots([0, 1, 0, 2], 1) == [0, 0, -1, 0]                # the second token for expert 0 finds it full
    assert slots([3, 3, 3, 3], 2) == [0, 1, -1, -1]               # all to one expert: first come, first served
    assert slots([0, 2, 0, 2], 5) == [0, 0, 1, 1]                 # expert 1 (and 3) empty
    assert dispatch_indices(torch.empty(0, dtype=torch.long), 1).shape == (0,)
    # k = 2: every first choice before any second choice (GShard): with one slot, token 2's first choice takes
    # expert 1 before token 0's second choice can; with two, token 2's second choice (expert 0) comes last.
    assert slots([[0, 1], [0, 2], [1, 0]], 1) == [[0, -1], [-1, 0], [0, -1]]
    assert slots([[0, 1], [0, 2], [1, 0]], 2) == [[0, 1], [1, 0], [0, -1]]


def test_dispatch_indices_bad_input():
    with pytest.raises(ValueError, match="capacity must be a non-negative int"):
        slots([0], -1)
    with pytest.raises(ValueError, match="expert ids >= 0"):
        slots([0, -1], 1)
    with pytest.raises(ValueError, match=r"\[tokens\] or \[tokens, k\]"):
        dispatch_indices(torch.zeros(1, 1, 1, dtype=torch.long), 1)


def test_expert_capacity():
    assert expert_capacity(8, 4, 2, 1.25) == 5                    # 1.25 * 8 * 2 / 4 = 5 exactly
    assert expert_capacity(3, 2, 1, 0.5) == 1                     # ceil(0.75)
    assert expert_capacity(10, 1, 1, 1.1) == 11                   # 11.000000000000002 in floats: not 12


def test_load_balancing_loss_hand_cases():
    uniform = torch.full((4, 4), 0.25)
    balanced = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]])
    # Convention: f_e over the S*k assignments, so perfect balance gives 1.0 for k = 1 and k = 2 alike.
    assert load_balancing_loss(uniform, balanced[:, :1]).item() == pytest.approx(1.0)
    assert load_balancing_loss(uniform, balanced).item() == pytest.approx(1.0)
    collapsed = F.one_hot(torch.zeros(4, dtype=torch.long), 4).float()
    assert load_balancing_loss(collapsed, torch.zeros(4, 1, dtype=torch.long)).item() == pytest.approx(4.0)
    # f = [2, 1, 1, 0] / 4, P = [.5, .25, .25, 0]: 4 * (.25 + .0625 + .0625) = 1.5; dLoss/dprobs[t, e] = E f_e / S.
    probs = torch.tensor([[0.5, 0.5, 0, 0], [0.5, 0, 0.5, 0]], requires_grad=True)
    loss = load_balancing_loss(probs, torch.tensor([[0, 1], [0, 2]]))
    loss.backward()
    assert loss.item() == pytest.approx(1.5)
    torch.testing.assert_close(probs.grad, torch.tensor([[1.0, 0.5, 0.5, 0.0]] * 2))


def test_route_ties_go_to_the_lower_expert():
    moe = MoE(3, 4, num_experts=4, k=2)
    torch.nn.init.zeros_(moe.router.weight)                       # every probability 1/4: all ties
    r = route(moe.router, torch.randn(4, 3), k=2, capacity_factor=1.0)
    assert r.expert.tolist() == [[0, 1]] * 4 and r.capacity == 2
    torch.testing.assert_close(r.gate, torch.full((4, 2), 0.5))  # renormalised over the two chosen
    assert r.slot.tolist() == [[0, 0], [1, 1], [-1, -1], [-1, -1]] and r.dropped == 4
    r1 = route(moe.router, torch.randn(4, 3), k=1, capacity_factor=1.0)
    assert r1.expert.tolist() == [[0]] * 4 and r1.dropped == 3
    torch.testing.assert_close(r1.gate, torch.full((4, 1), 0.25))   # k = 1: the plain probability (Switch)


def test_moe_hand_case_drops_a_token():
    moe = MoE(2, 3, num_experts=2, k=1, capacity_factor=0.5)     # capacity ceil(0.5 * 3 / 2) = 1
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(2))
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])       # experts 0, 0 (full: dropped), 1
    out = moe(x)
    p = torch.softmax(torch.tensor([1.0, 0.0]), 0)[0]
    assert out.dropped == 1
    torch.testing.assert_close(out.y[0], p * moe.experts[0](x[0]))
    assert out.y[1].eq(0).all()
    torch.testing.assert_close(out.y[2], p * moe.experts[1](x[2]))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_gates_against_a_per_token_loop(k):
    torch.manual_seed(k)
    moe, x = MoE(5, 7, num_experts=4, k=k, capacity_factor=4.0), torch.randn(6, 5)   # capacity >= tokens: no drop
    out = moe(x)
    for t in range(len(x)):
        p = torch.softmax(moe.router(x[t]), 0)
        top = p.argsort(descending=True)[:k]
        gates = p[top] / p[top].sum() if k > 1 else p[top]
        expected = sum(g * moe.experts[int(e)](x[t]) for g, e in zip(gates, top))
        torch.testing.assert_close(out.y[t], expected, rtol=1e-5, atol=1e-6)
    assert out.dropped == 0


@pytest.mark.parametrize("k, capacity_factor, groups", [(1, 0.5, 1), (1, 2.0, 2), (2, 0.5, 2), (2, 1.0, 4)])
def test_one_process_equals_dense(k, capacity_factor, groups):
    torch.manual_seed(0)
    moe, x, v = MoE(6, 10, num_experts=4, k=k, capacity_factor=capacity_factor), torch.randn(16, 6), torch.randn(16, 6)
    results = []
    for forward in (moe.forward, lambda inp, groups: dense_moe(moe, inp, groups)):
        moe.zero_grad()
        inp = x.clone().requires_grad_()
        out = forward(inp, groups=groups)
        ((v * out.y).sum() + 0.1 * out.aux_loss).backward()
        results.append((out, [inp.grad] + [p.grad.clone() for p in moe.parameters()]))
    (sparse, grads), (dense, dense_grads) = results
    torch.testing.assert_close(sparse.y, dense.y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, dense_grads, rtol=1e-5, atol=1e-5)
    assert sparse.dropped == dense.dropped
    if capacity_factor < 1:                                       # fewer slots than assignments: some must drop
        assert sparse.dropped >= 16 * k - 4 * expert_capacity(16 // groups, 4, k, capacity_factor) * groups


def test_moe_bad_arguments():
    with pytest.raises(ValueError, match="k must be an int in 1..4"):
        MoE(4, 8, num_experts=4, k=5)
    with pytest.raises(ValueError, match="capacity_factor must be a finite number > 0"):
        MoE(4, 8, num_experts=4, capacity_factor=0)
    moe = MoE(4, 8, num_experts=4)
    with pytest.raises(ValueError, match="groups=3 must divide the number of tokens"):
        moe(torch.randn(8, 4), groups=3)
    with pytest.raises(ValueError, match=r"x must be \[tokens, 4\]"):
        moe(torch.randn(8, 5))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 4])
def test_expert_parallel_equals_one_process(world_size):
    outs = launch(compare_expert_parallel, world_size, timeout=150)
    for out in outs:
        for key in ("out", "loss", "x_grad", "router_grad", "expert_grad"):
            assert out[key] < 1e-5, (key, out)
        assert out["dropped"] == out["dropped_reference"] > 0, out
        assert out["bytes"]["forward"] == out["bytes"]["backward"] == out["bytes_expected"] > 0, out
        assert out["bytes"]["counts"] == (world_size - 1) * (8 // world_size) * 8      # int64 counts of E = 8
        balanced = out["bytes_balanced"]
        assert balanced["forward"] == balanced["backward"] == out["bytes_balanced_formula"], out
    # The formula is an average over uniform routing: a router at random initialisation is near it. It can
    # never be exceeded by more than N/(N-1): that is every kept row leaving its rank.
    total, formula = sum(o["bytes"]["forward"] for o in outs), sum(o["bytes_formula"] for o in outs)
    assert 0.5 * formula < total <= formula * world_size / (world_size - 1)
