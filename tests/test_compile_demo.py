"""course_lib.compile_demo: torch.compile's fused kernels compute what eager does; graph breaks are reported."""
import pytest
import torch

from course_lib import compile_demo as C
from course_lib.models import Net


@pytest.mark.slow
def test_compiled_chain_matches_eager_in_one_fused_kernel():
    x, y = torch.randn(4096), torch.randn(4096)
    result = C.try_compile(C.elementwise_chain, x, y)
    if result.error:
        pytest.skip(f"inductor cannot compile on this machine: {result.error}")
    torch.testing.assert_close(result.fn(x, y), C.elementwise_chain(x, y))
    kernels = C.fused_kernels(C.elementwise_chain, x, y)
    assert len(kernels) == 1                                   # four ops, one loop
    name, source = next(iter(kernels.items()))
    assert all(op in name for op in ("add", "gelu", "mul"))
    assert C.loop_body(source).count("auto tmp") >= 4


def test_try_compile_explains_a_failure_instead_of_raising():
    def bad(x):
        return x @ torch.ones(3, 3)        # shapes do not match: the first call fails

    result = C.try_compile(bad, torch.ones(2, 2), backend="eager")
    assert result.fn is None and "Error" in result.error
    with pytest.raises(TypeError, match="fn must be callable"):
        C.try_compile(42)
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        C.compile_training("net", None, None, None)


def test_graph_breaks_name_the_data_dependent_branch_and_item(capsys):
    info = C.graph_breaks(C.branchy, torch.randn(100))
    assert info["breaks"] >= 2 and info["graphs"] == info["breaks"] + 1
    assert any("item" in r for r in info["reasons"])
    assert C.graph_breaks(C.elementwise_chain, torch.randn(8), torch.randn(8))["breaks"] == 0


def test_compiled_training_step_matches_eager():
    """The wrapper's plumbing (forward + backward through AOTAutograd), without Inductor's C++ compile
    (the chain test above covers Inductor; a cold compile of Net would cost CI tens of seconds)."""
    import copy
    torch.manual_seed(0)
    net = Net()
    twin = copy.deepcopy(net)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (net, twin)]
    loss = C.train_step(net.eval(), opts[0], x, y)                 # eval: no dropout, so the two are comparable
    result = C.compile_training(twin.eval(), opts[1], x, y, backend="aot_eager")
    assert result.error is None and result.seconds > 0
    for a, b in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert torch.isfinite(loss)
