"""Activation memory: measured saved tensors against the formulas, checkpointing keeps gradients, bad args."""
import pytest
import torch

from course_lib import activations
from course_lib.models import Net


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_net_saved_tensors_equal_the_formula(batch):
    torch.manual_seed(0)
    records = activations.saved_tensors(Net().train(), torch.randn(batch, 1, 28, 28))
    assert sum(r.bytes for r in records if not r.shared) == sum(activations.net_activation_bytes(batch).values())
    ops = [r.op for r in records]
    assert ops.count("ConvolutionBackward0") == 2 and ops.count("MaxPool2DWithIndicesBackward0") == 4
    indices = [r for r in records if r.dtype == torch.int64]
    assert [r.shape for r in indices] == [(batch, 10, 12, 12), (batch, 20, 4, 4)]      # max-pool argmax
    # relu's output is conv2's input, and (flattened) fc1's input: saved once each
    assert [r.op for r in records if r.shared] == ["ConvolutionBackward0", "AddmmBackward0"]


def test_net_formula_by_hand_for_one_image():
    per_layer = activations.net_activation_bytes(1)
    assert sum(per_layer.values()) == (784 + 5760 + 1440 + 20 + 1280 + 320 + 50 + 50 + 50) * 4 + (1440 + 320) * 8


def test_parameters_are_not_counted():
    model = torch.nn.Linear(5, 3)
    records = activations.saved_tensors(model, torch.randn(2, 5))
    assert [(r.what, r.shape) for r in records] == [("mat1", (2, 5))]


@pytest.mark.parametrize("mode, expected", [("none", 2 * (40 + 2) * 4), ("selective", 6 * 2 * 4 * 4),
                                            ("full", 2 * 4 * 4)])
def test_block_formula_by_hand(mode, expected):
    assert activations.block_activation_bytes(2, 4, 1, mode) == expected
    assert activations.block_activation_bytes(2, 4, 3, mode) == 3 * expected


@pytest.mark.parametrize("rows, width, depth", [(2, 4, 1), (16, 32, 3), (5, 8, 2)])
def test_checkpointing_saved_bytes_equal_the_formula(rows, width, depth):
    torch.manual_seed(0)
    blocks, x = activations.block_stack(width, depth), torch.randn(rows, width)
    for mode in activations.MODES:
        assert activations.saved_bytes(blocks, x, mode) == activations.block_activation_bytes(rows, width, depth, mode)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_checkpointing_gives_the_same_gradients(mode):
    torch.manual_seed(0)
    blocks, x = activations.block_stack(16, 3), torch.randn(8, 16)
    reference = activations.gradients(blocks, x, "none")
    grads = activations.gradients(blocks, x, mode)
    assert len(grads) == len(reference) == len(list(blocks.parameters()))
    for a, b in zip(reference, grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert all(p.grad is None for p in blocks.parameters())


def test_step_seconds_runs_every_mode():
    blocks, x = activations.block_stack(8, 2), torch.randn(4, 8)
    assert all(activations.step_seconds(blocks, x, mode, repeats=1) > 0 for mode in activations.MODES)


def test_transformer_formula_by_hand():
    """Korthikanti et al. 2022: sbh(34 + 5as/h) per layer, 34sbh selective, 2sbh full."""
    sbh = 2048 * 1 * 4096
    assert activations.transformer_activation_bytes(2048, 1, 4096, 32, 1) == sbh * (34 + 80) == 956_301_312
    assert activations.transformer_activation_bytes(2048, 1, 4096, 32, 1, "selective") == 285_212_672
    assert activations.transformer_activation_bytes(2048, 1, 4096, 32, 1, "full") == 16_777_216
    # s=4, b=2, h=8, a=2, L=3: sbh = 64, 5as/h = 5
    assert [activations.transformer_activation_bytes(4, 2, 8, 2, 3, m) for m in activations.MODES] == [7488, 6528, 384]


def test_transformer_formula_with_sdpa_and_tensor_parallel_by_hand():
    """s=4, b=2, h=8, a=2, L=3 (sbh = 64): SDPA keeps 34sbh + 4asb = 2176 + 64 per layer, no 5as²b;
    t = 2 with sequence parallelism: the paper's sbh(34/t + 5as/(ht)) = 64 x (17 + 2.5) per layer."""
    assert activations.transformer_activation_bytes(4, 2, 8, 2, 3, attention="sdpa") == 3 * (2176 + 64)
    assert activations.transformer_activation_bytes(4, 2, 8, 2, 3, tensor_parallel=2) == 3 * 64 * 19.5
    assert activations.transformer_activation_bytes(4, 2, 8, 2, 3, "full", tensor_parallel=2) == 3 * 64
    # recomputation does not depend on how attention is computed: the attention core is not kept either way
    for mode in ("selective", "full"):
        both = {activations.transformer_activation_bytes(4, 2, 8, 2, 3, mode, impl) for impl in activations.ATTENTION}
        assert len(both) == 1
    # 7B shape at s = 2048: eager keeps sbh(34 + 80), SDPA sbh(34 + 4a/h)
    eager, sdpa = (activations.transformer_activation_bytes(2048, 1, 4096, 32, 32, attention=a)
                   for a in activations.ATTENTION)
    assert eager / sdpa == pytest.approx(114 / (34 + 4 * 32 / 4096))


@pytest.mark.parametrize("dtype, size", [(torch.bfloat16, 2), (torch.float32, 4)])
@pytest.mark.parametrize("b, a, s, d", [(2, 4, 64, 16), (1, 3, 40, 8), (3, 2, 8, 32)])
def test_attention_saved_bytes_equal_the_formula(dtype, size, b, a, s, d):
    for impl in activations.ATTENTION:
        measured = activations.attention_saved(b, a, s, d, impl, dtype)
        assert measured["bytes"] == activations.attention_core_bytes(b, a, s, d, impl, size)
        assert sum(measured["saved"].values()) == measured["bytes"]
        assert {"q", "k", "v"} <= set(measured["saved"])
    eager, sdpa = (activations.attention_saved(b, a, s, d, impl, dtype) for impl in activations.ATTENTION)
    assert eager["saved"][f"{[b, a, s, s]} {str(dtype)[6:]}"] == b * a * s * s * size     # the probabilities
    assert "Flash" in sdpa["node"]                 # the CPU flash kernel ran, as the formula assumes
    assert sdpa["saved"][f"{[b, a, s]} float32"] == 4 * b * a * s                      # log-sum-exp per row
    assert not any(k.startswith(f"{[b, a, s, s]}") for k in sdpa["saved"])


def test_sdpa_math_backend_keeps_the_scores():
    """The saving is the fused kernel's, not the function's: SDPA forced onto its math path keeps [b, a, s, s]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        math = activations.attention_saved(2, 4, 64, 16, "sdpa", torch.float32)
    assert "Flash" not in math["node"]
    assert math["saved"]["[2, 4, 64, 64] float32"] == 2 * 4 * 64 * 64 * 4
    assert math["bytes"] > activations.attention_saved(2, 4, 64, 16, "sdpa", torch.float32)["bytes"]


def test_eager_and_sdpa_attention_agree():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 8, requires_grad=True) for _ in range(3))
    outs = [activations.attention(q, k, v, impl) for impl in activations.ATTENTION]
    grads = [torch.autograd.grad(o.pow(2).sum(), (q, k, v)) for o in outs]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_plot_transformer_activations_orders_the_lines():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seq_lens = [512, 2048, 8192]
    ax = activations.plot_transformer_activations(12288, 96, seq_lens)
    eager, sdpa, full = (line.get_ydata() for line in ax.get_lines())
    assert all(e > s > f for e, s, f in zip(eager, sdpa, full))
    assert sdpa[-1] / sdpa[0] == pytest.approx(16, rel=1e-3)            # linear in s
    assert eager[-1] / eager[0] > 16                                    # the s² term
    plt.close("all")


@pytest.mark.parametrize("call, match", [
    (lambda: activations.net_activation_bytes(0), "batch"),
    (lambda: activations.block_activation_bytes(2, 4, 1, "some"), "mode"),
    (lambda: activations.block_stack(0, 2), "width"),
    (lambda: activations.Checkpointed(activations.block_stack(4, 1), "partial"), "mode"),
    (lambda: activations.transformer_activation_bytes(8, 1, 8, 2, 1, recompute="half"), "recompute"),
    (lambda: activations.transformer_activation_bytes(8, 1, 8, 0, 1), "heads"),
    (lambda: activations.transformer_activation_bytes(8, 1, 8, 2, 1, attention="flash"), "attention"),
    (lambda: activations.transformer_activation_bytes(8, 1, 8, 2, 1, tensor_parallel=3), "tensor_parallel"),
    (lambda: activations.transformer_activation_bytes(8, 1, 8, 2, 1, tensor_parallel=0), "tensor_parallel"),
    (lambda: activations.attention_saved(2, 2, 0, 4), "seq_len"),
    (lambda: activations.attention_saved(2, 2, 4, 4, impl="flash"), "impl"),
    (lambda: activations.attention_core_bytes(2, 2, 4, 4, element_size=0), "element_size"),
    (lambda: activations.step_seconds(activations.block_stack(4, 1), torch.randn(2, 4), repeats=0), "repeats"),
])
def test_bad_arguments_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()
