"""The course's Vision Transformer: attention against torch.nn.MultiheadAttention and SDPA, patch embedding
against a strided Conv2d, every documented shape, bad arguments refused by name."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.vit import Attention, Block, PatchEmbedding, ViT, as_torch_attention, shapes, split_heads


@pytest.mark.parametrize("sdpa", [False, True])
def test_attention_equals_multihead_attention(sdpa):
    torch.manual_seed(0)
    ours = Attention(dim=24, heads=3, sdpa=sdpa)
    theirs = as_torch_attention(ours)
    x = torch.randn(5, 7, 24, requires_grad=True)
    y = ours(x)
    x2 = x.detach().clone().requires_grad_()
    y_ref, _ = theirs(x2, x2, x2, need_weights=False)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    v = torch.randn_like(y)
    (v * y).sum().backward()
    (v * y_ref).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.q.weight.grad, theirs.in_proj_weight.grad[:24], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.proj.weight.grad, theirs.out_proj.weight.grad, rtol=1e-5, atol=1e-5)


def test_eager_and_sdpa_agree_and_heads_are_independent():
    torch.manual_seed(1)
    eager = Attention(16, 4)
    fused = Attention(16, 4, sdpa=True)
    fused.load_state_dict(eager.state_dict())
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(eager(x), fused(x), rtol=1e-5, atol=1e-5)
    # head h is features h·d..(h+1)·d-1: changing v's last head changes only the last 4 features before proj
    q = split_heads(torch.arange(2 * 9 * 16.).view(2, 9, 16), head_dim=4)
    assert q.shape == (2, 4, 9, 4) and torch.equal(q[0, 1, 0], torch.tensor([4., 5., 6., 7.]))


def test_patch_embedding_is_a_strided_conv():
    torch.manual_seed(2)
    embed = PatchEmbedding(image=28, patch=7, channels=1, dim=8)
    conv = nn.Conv2d(1, 8, kernel_size=7, stride=7)
    with torch.no_grad():
        conv.weight.copy_(embed.proj.weight.view(8, 1, 7, 7))
        conv.bias.copy_(embed.proj.bias)
    images = torch.randn(3, 1, 28, 28)
    torch.testing.assert_close(embed(images), conv(images).flatten(2).transpose(1, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("patch,pool", [(7, "mean"), (4, "cls")])
def test_every_shape_as_documented(patch, pool):
    b, d, h, depth = 3, 32, 4, 2
    s = (28 // patch) ** 2 + (pool == "cls")
    model = ViT(patch=patch, dim=d, depth=depth, heads=h, mlp_ratio=4, pool=pool)
    got = shapes(model, torch.randn(b, 1, 28, 28))
    assert got["embed.proj"] == got["embed"] == (b, (28 // patch) ** 2, d)
    for i in range(depth):
        for name in ("norm1", "attn.q", "attn.k", "attn.v", "attn.proj", "attn", "norm2", "mlp.fc2", "mlp", ""):
            assert got[f"blocks.{i}.{name}".rstrip(".")] == (b, s, d), name
        assert got[f"blocks.{i}.mlp.fc1"] == (b, s, 4 * d)
    assert got["norm"] == (b, s, d) and got["head"] == (b, 10)
    assert list(got)[0] == "embed.proj" and list(got)[-1] == "head"     # forward order


def test_block_is_pre_norm_residual():
    torch.manual_seed(3)
    block = Block(8, 2)
    x = torch.randn(2, 5, 8)
    mid = x + block.attn(block.norm1(x))
    torch.testing.assert_close(block(x), mid + block.mlp.fc2(F.gelu(block.mlp.fc1(block.norm2(mid)))))


def test_vit_fits_a_small_batch():
    torch.manual_seed(4)
    model = ViT(dim=16, depth=1, heads=2)
    images, labels = torch.randn(16, 1, 28, 28), torch.arange(16) % 10
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = F.cross_entropy(model(images), labels).item()
    for _ in range(30):
        opt.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
    assert loss.item() < 0.25 * first, (first, loss.item())


@pytest.mark.parametrize("kwargs,message", [
    (dict(dim=30, heads=4), "dim=30 must be divisible by heads=4"),
    (dict(image=28, patch=5), "image=28 must be divisible by patch=5"),
    (dict(pool="max"), "pool must be one of"),
    (dict(heads=0), "heads must be a positive int"),
    (dict(depth=1.5), "depth must be a positive int"),
    (dict(sdpa=1), "sdpa must be True or False"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ViT(**kwargs)
