"""k-means weight sharing: the properties of Lloyd's algorithm, and the paper's centroid gradient."""
import math

import pytest
import torch
from torch import nn

from course_lib.compression import kmeans as K
from course_lib.models import LeNet5, LeNet300


def weights(n=2000, seed=0):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.1


def test_linear_init_spans_min_to_max():
    w = weights()
    c = K.linear_init(w, 5)
    assert torch.allclose(c, torch.linspace(w.min().item(), w.max().item(), 5))


def test_assign_is_the_nearest_centroid():
    w, c = weights(), torch.tensor([-0.2, -0.05, 0.0, 0.1, 0.3])
    expected = (w[:, None] - c[None, :]).abs().argmin(1)
    assert torch.equal(K.assign(w, c), expected)


@pytest.mark.parametrize("k", [2, 4, 16, 32])
def test_kmeans_properties(k):
    w = weights().reshape(40, 50)
    centroids, indices = K.kmeans_quantize(w, k, iters=100)
    assert centroids.shape == (k,) and indices.shape == w.shape and indices.dtype == torch.int64
    assert torch.equal(centroids, centroids.sort().values)
    shared = K.reconstruct(centroids, indices)
    assert shared.unique().numel() <= k
    # every weight sits in its nearest cluster, and every centroid is its cluster's mean (converged)
    dist = (w.reshape(-1, 1) - centroids).abs()
    assert torch.allclose(dist.gather(1, indices.reshape(-1, 1)).squeeze(1), dist.min(1).values)
    for j in range(k):
        members = w[indices == j]
        if len(members):
            assert centroids[j].item() == pytest.approx(members.double().mean().item(), abs=1e-6)
    # Lloyd never increases the error of the linear start
    start = K.reconstruct(*K.kmeans_quantize(w, k, iters=0))
    assert (shared - w).pow(2).mean() <= (start - w).pow(2).mean()


def test_iters_zero_is_the_linear_initialisation_and_results_are_deterministic():
    w = weights()
    c0, i0 = K.kmeans_quantize(w, 8, iters=0)
    assert torch.allclose(c0, K.linear_init(w, 8)) and torch.equal(i0, K.assign(w, c0))
    torch.manual_seed(1)
    a = K.kmeans_quantize(w, 8)
    torch.manual_seed(2)
    b = K.kmeans_quantize(w, 8)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_mask_clusters_only_the_survivors_of_pruning():
    w = weights().reshape(20, 100)
    mask = (w.abs() > 0.05).float()
    centroids, indices = K.kmeans_quantize(w, 4, mask=mask)
    assert ((indices == -1) == (mask == 0)).all()
    shared = K.reconstruct(centroids, indices)
    assert (shared[mask == 0] == 0).all() and (shared[mask == 1] != 0).all()
    assert (centroids.abs() > 0.05).all()       # the pruned zeros did not pull centroids to 0


def test_autograd_centroid_gradient_is_the_sum_over_each_cluster():
    torch.manual_seed(0)
    layer = nn.Linear(30, 20)
    shared = K.SharedWeights(layer, k=8)
    x = torch.randn(16, 30)
    loss = shared(x).pow(2).sum()
    loss.backward()
    # the same loss with the reconstructed weight as a leaf: its gradient, summed per cluster
    w = shared.weight().detach().requires_grad_()
    nn.functional.linear(x, w, layer.bias).pow(2).sum().backward()
    assert torch.allclose(shared.centroids.grad, K.centroid_gradients(w.grad, shared.indices, 8), atol=1e-4)
    assert shared.layer.bias.grad is None       # only the codebook trains


def test_share_weights_model_and_fine_tuning_moves_only_centroids():
    torch.manual_seed(0)
    model = LeNet5()
    shared = K.share_weights(model, bits=3)
    layers = [m for m in shared.modules() if isinstance(m, K.SharedWeights)]
    assert len(layers) == 4 and all(m.k == 8 for m in layers)
    assert [n for n, p in shared.named_parameters() if p.requires_grad] == [
        "conv1.centroids", "conv2.centroids", "fc1.centroids", "fc2.centroids"]
    assert not hasattr(shared.fc1.layer, "weight") or not isinstance(shared.fc1.layer.weight, nn.Parameter)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    before = {n: t.clone() for n, t in shared.state_dict().items()}
    opt = torch.optim.SGD([p for p in shared.parameters() if p.requires_grad], lr=0.1)
    nn.functional.cross_entropy(shared(x), y).backward()
    opt.step()
    changed = {n for n, t in shared.state_dict().items() if not torch.equal(t, before[n])}
    assert changed == {"conv1.centroids", "conv2.centroids", "fc1.centroids", "fc2.centroids"}
    assert all(t.unique().numel() <= 8 for t in (shared.fc1.weight(), shared.conv2.weight()))


def test_share_weights_outputs_match_a_float_model_with_the_shared_weights():
    torch.manual_seed(0)
    model = LeNet300()
    shared = K.share_weights(model, bits=4)
    for name in ("fc1", "fc2", "fc3"):
        getattr(model, name).weight.data = getattr(shared, name).weight().detach()
    x = torch.randn(4, 784)
    assert torch.allclose(shared(x), model(x), atol=1e-6)


def test_codebook_bits():
    shared = K.share_weights(LeNet300(), bits=5)
    bits = K.codebook_bits(shared)
    n = 784 * 300 + 300 * 100 + 100 * 10
    assert bits == {"indices": 5 * n, "codebook": 3 * 32 * 32, "total": 5 * n + 3 * 32 * 32}
    assert n * 32 / bits["total"] == pytest.approx(32 / 5, rel=0.01)
    masks = {"fc1": (torch.rand(300, 784) > 0.9).float()}
    pruned = K.codebook_bits(K.share_weights(LeNet300(), bits=5, masks=masks))
    assert pruned["indices"] == 5 * (int(masks["fc1"].sum()) + 300 * 100 + 100 * 10)
    assert math.log2(32) == 5


@pytest.mark.parametrize("call, match", [
    (lambda: K.kmeans_quantize(torch.randn(10), 11), r"k must be at most the number of weights to cluster \(10\)"),
    (lambda: K.kmeans_quantize(torch.randn(10), 0), "k must be a positive int"),
    (lambda: K.kmeans_quantize(torch.randn(10), 2.5), "k must be a positive int"),
    (lambda: K.kmeans_quantize(torch.randn(10), 2, iters=-1), "iters must be a non-negative int"),
    (lambda: K.kmeans_quantize(torch.arange(10), 2), "floating-point"),
    (lambda: K.kmeans_quantize(torch.randn(10), 2, mask=torch.ones(3)), "mask must be None or a tensor"),
    (lambda: K.kmeans_quantize(torch.randn(10), 4, mask=torch.tensor([1.0, 1] + [0] * 8)), "at most"),
    (lambda: K.share_weights(LeNet300(), bits=0), r"bits must be an int in 1..16"),
    (lambda: K.share_weights(LeNet300(), bits=17), r"bits must be an int in 1..16"),
    (lambda: K.share_weights(nn.Sequential(nn.Linear(2, 2)), bits=3), "at most the number of weights"),
    (lambda: K.share_weights(nn.Sequential(nn.ReLU()), bits=2), "no Linear or Conv2d"),
    (lambda: K.share_weights(LeNet300(), bits=2, masks={"fc9": torch.ones(1)}), r"masks must name .*fc1"),
    (lambda: K.SharedWeights(nn.ReLU(), 2), "layer must be one of"),
    (lambda: K.codebook_bits(LeNet300()), "share_weights"),
])
def test_bad_input_is_refused_with_a_clear_message(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
