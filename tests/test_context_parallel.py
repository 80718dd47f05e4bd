"""Blockwise attention, the log-sum-exp merge and ring attention against torch's scaled_dot_product_attention."""
import random
import sys

import pytest
import torch
import torch.nn.functional as F

from course_lib.distributed.context_parallel import (block_attention, chunk_range, chunk_sizes,
                                                     compare_ring_attention, merge, ring_bytes_sent,
                                                     torch_context_parallel_reason)
from course_lib.distributed.launch import launch

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def _qkv(gen, b, h, tq, tk, d, dtype, spread=1.0):
    q = torch.randn(b, h, tq, d, generator=gen, dtype=dtype) * spread
    return q, torch.randn(b, h, tk, d, generator=gen, dtype=dtype), torch.randn(b, h, tk, d, generator=gen, dtype=dtype)


def _random_cuts(rng, tokens):
    """Cut 0..tokens into random unequal blocks, 1-token blocks included."""
    cuts = sorted(rng.sample(range(1, tokens), rng.randint(0, tokens - 1))) if tokens > 1 else []
    return list(zip([0] + cuts, cuts + [tokens]))


def _merge_blocks(q, k, v, blocks, rng, mask=None):
    parts = [block_attention(q, k[:, :, a:b], v[:, :, a:b], mask=None if mask is None else mask[:, a:b])
             for a, b in blocks]
    rng.shuffle(parts)                                     # the merge is order-free
    out, lse = parts[0]
    for o, l in parts[1:]:
        out, lse = merge(out, lse, o, l)
    return out, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocks_merged_in_any_order_equal_full_attention(dtype):
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    for _ in range(40):
        b, h, tq, tk, d = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 9), rng.randint(1, 20), rng.randint(1, 8)
        q, k, v = _qkv(gen, b, h, tq, tk, d, dtype, spread=rng.choice([0.1, 1.0, 10.0]))
        out, lse = _merge_blocks(q, k, v, _random_cuts(rng, tk), rng)
        scores = (q @ k.transpose(-2, -1)) / d ** 0.5
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=TOL[dtype], atol=TOL[dtype])
        torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=TOL[dtype], atol=TOL[dtype])


def test_one_block_is_softmax_attention_with_any_scale():
    gen = torch.Generator().manual_seed(1)
    q, k, v = _qkv(gen, 2, 3, 5, 7, 4, torch.float64)
    out, lse = block_attention(q, k, v, scale=0.3)
    p = torch.softmax(q @ k.transpose(-2, -1) * 0.3, -1)
    torch.testing.assert_close(out, p @ v)
    torch.testing.assert_close(lse, torch.log(torch.exp(q @ k.transpose(-2, -1) * 0.3).sum(-1)))


def test_large_logits_stay_finite_where_a_naive_softmax_overflows():
    gen = torch.Generator().manual_seed(2)
    q, k, v = _qkv(gen, 1, 2, 6, 12, 4, torch.float32, spread=1e3)      # scores ~ 1e3: exp overflows fp32
    assert not torch.isfinite(torch.exp(q @ k.transpose(-2, -1) / 2)).all()
    out, lse = _merge_blocks(q, k, v, [(0, 1), (1, 5), (5, 12)], random.Random(2))
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)


def test_a_block_a_query_cannot_see_is_neutral_and_never_nan():
    gen = torch.Generator().manual_seed(3)
    q, k, v = _qkv(gen, 2, 2, 4, 6, 3, torch.float64)
    none = torch.zeros(4, 3, dtype=torch.bool)
    o0, l0 = block_attention(q, k[:, :, :3], v[:, :, :3], mask=none)        # every score -inf
    assert (o0 == 0).all() and (l0 == float("-inf")).all()
    o1, l1 = block_attention(q, k[:, :, 3:], v[:, :, 3:])
    for out, lse in (merge(o0, l0, o1, l1), merge(o1, l1, o0, l0)):
        torch.testing.assert_close(out, o1)
        torch.testing.assert_close(lse, l1)
    out, lse = merge(o0, l0, o0, l0)                                         # nothing seen at all
    assert (out == 0).all() and (lse == float("-inf")).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_blocks_equal_causal_attention(dtype):
    rng, gen = random.Random(4), torch.Generator().manual_seed(4)
    for tokens in (1, 2, 7, 17):
        q, k, v = _qkv(gen, 2, 2, tokens, tokens, 5, dtype)
        causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        out, _ = _merge_blocks(q, k, v, _random_cuts(rng, tokens), rng, mask=causal)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(out, ref, rtol=TOL[dtype], atol=TOL[dtype])


def test_bad_shapes_name_the_argument():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"q must be \[batch, heads, tokens, head_dim\]"):
        block_attention(q[0], q, q)
    with pytest.raises(ValueError, match="must share batch, heads and head_dim"):
        block_attention(q, torch.zeros(1, 2, 3, 5), torch.zeros(1, 2, 3, 5))
    with pytest.raises(TypeError, match="k must be a floating-point"):
        block_attention(q, q.long(), q)


def test_chunks_follow_tensor_split():
    for tokens, n in ((16, 4), (17, 4), (50, 4), (5, 5), (17, 2)):
        assert chunk_sizes(tokens, n) == [len(c) for c in torch.arange(tokens).tensor_split(n)]
        assert [chunk_range(tokens, r, n) for r in range(n)] == \
            [slice(int(c[0]), int(c[-1]) + 1) for c in torch.arange(tokens).tensor_split(n)]
    with pytest.raises(ValueError, match="tokens must be an int >= world_size=4"):
        chunk_sizes(3, 4)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        chunk_sizes(3, 0)


def test_bytes_formula_is_the_closed_form_when_ranks_divide_tokens():
    b, h, t, d = 2, 3, 16, 8
    bytes_k = b * h * t * d * 4                                 # fp32 K [B, H, T, D]
    for n in (1, 2, 4, 8):
        for rank in range(n):
            sent = ring_bytes_sent(b, h, t, d, n, rank)
            assert sent["forward"] == 2 * (n - 1) * bytes_k // n
            assert sent["backward"] == sent["forward"] + (2 * bytes_k if n > 1 else 0)   # one rank: nothing sent


def test_torch_context_parallel_gives_a_reason_or_none(monkeypatch):
    from torch.distributed.tensor.experimental._context_parallel._attention import custom_ops
    reason = torch_context_parallel_reason("cpu")
    cpu_kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert (reason is None) == (cpu_kernel in custom_ops)
    if reason is not None:
        assert "_scaled_dot_product_flash_attention_for_cpu" in reason
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor.experimental._context_parallel._attention", None)
    assert "has no context parallel API here" in torch_context_parallel_reason("cpu")


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size, tokens", [(2, 17), (4, 16)])     # 16 ViT patches + class token; 16
def test_ring_attention_equals_full_attention(world_size, tokens):
    batch, heads, head_dim = 2, 2, 8
    for rank, out in enumerate(launch(compare_ring_attention, world_size, batch, heads, tokens, head_dim,
                                      timeout=150)):
        for name in ("full", "causal"):
            assert out[f"{name}_out"] < 1e-5 and out[f"{name}_grad"] < 1e-5, (name, out)
            assert out[f"{name}_bytes"] == out["bytes_formula"], (name, out)
        if tokens % world_size == 0:                             # the closed form, K [B, H, T, D] in fp32
            bytes_k = batch * heads * tokens * head_dim * 4
            assert out["bytes_formula"]["forward"] == 2 * (world_size - 1) * bytes_k // world_size
        assert out["torch_cp_reason"] == torch_context_parallel_reason("cpu")
        assert out["torch_cp"] == "not run (run_torch=False)"
