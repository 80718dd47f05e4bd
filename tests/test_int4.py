"""course_lib.compression.int4: group-wise asymmetric int4 weight-only quantization with packing."""
import pytest
import torch
from torch import nn

from course_lib.compression import int4


def weight(out=24, cols=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, cols, generator=g) * 0.05 + 0.02       # not centred: asymmetric matters
    w[3, 5] = 0.6                                                # an outlier in one group
    w[4, :32] = 0.0                                              # an all-zero group
    w[5, 32:64] = torch.rand(32, generator=g) + 0.1              # a group of one sign
    return w


def reference(w, G):
    """An independent per-group loop: plain Python floats, float32 scale (scale_dtype=torch.float32)."""
    codes = torch.empty(w.shape, dtype=torch.int64)
    for r in range(w.shape[0]):
        for j in range(0, w.shape[1], G):
            group = w[r, j:j + G]
            lo, hi = min(group.min().item(), 0.0), max(group.max().item(), 0.0)
            scale = torch.tensor((hi - lo) / 15, dtype=torch.float32).item() or 1.0
            zero = min(max(round(-lo / scale), 0), 15)
            codes[r, j:j + G] = (torch.round(group / scale) + zero).clamp(0, 15).long()
    return codes


@pytest.mark.parametrize("G", [32, 64, 128])
def test_codes_match_an_independent_reference(G):
    w = weight()
    codes, scale, zero = int4.quantize(w, G, scale_dtype=torch.float32)
    assert codes.dtype == zero.dtype == torch.uint8 and scale.shape == zero.shape == (24, 128 // G)
    assert (codes.long() - reference(w, G)).abs().max() <= 1          # float32 vs float64 range: a near-tie at most
    assert (codes.long() != reference(w, G)).float().mean() < 0.01


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_error_within_half_a_step_and_zero_exact(scale_dtype):
    w = weight()
    for G in (32, 64, 128):
        codes, scale, zero = int4.quantize(w, G, scale_dtype)
        assert scale.dtype == scale_dtype and int(codes.min()) >= 0 and int(codes.max()) <= 15
        err = (int4.dequantize(codes, scale, zero, G) - w).abs().reshape(24, -1, G)
        assert bool((err <= scale.float()[..., None] / 2 * (1 + 1e-5) + 1e-9).all())
        assert torch.equal(int4.dequantize(codes, scale, zero, G)[4, :32], torch.zeros(32))


def test_a_group_is_a_channel_of_torchs_fake_quantize():
    w, G = weight(), 32
    codes, scale, zero = int4.quantize(w, G)
    theirs = torch.fake_quantize_per_channel_affine(w.reshape(-1, G), scale.float().flatten(),
                                                    zero.int().flatten(), 0, 0, 15)
    assert torch.equal(int4.dequantize(codes, scale, zero, G), theirs.reshape(w.shape))


def test_agrees_with_torchao_quantize_affine():
    primitives = pytest.importorskip("torchao.quantization.quant_primitives")
    w, G = weight(), 32
    codes, scale, zero = int4.quantize(w, G, scale_dtype=torch.float32)
    theirs = primitives.quantize_affine(w, (1, G), scale, zero.to(torch.int32), torch.uint8, 0, 15)
    assert torch.equal(theirs, codes)
    back = primitives.dequantize_affine(theirs, (1, G), scale, zero.to(torch.int32), torch.uint8, 0, 15)
    assert torch.allclose(back, int4.dequantize(codes, scale, zero, G), atol=1e-7)


def test_pack_nibble_order_and_round_trip():
    codes = torch.tensor([[1, 2, 3, 4, 15, 0]], dtype=torch.uint8)
    packed = int4.pack(codes)
    assert packed.tolist() == [[1 | 2 << 4, 3 | 4 << 4, 15]]          # element 2k low nibble, 2k+1 high
    odd = torch.tensor([7, 9, 5])                                     # an odd count: one 0 nibble of padding
    assert int4.pack(odd).tolist() == [7 | 9 << 4, 5]
    assert int4.unpack(int4.pack(odd), 3).tolist() == [7, 9, 5]
    c = torch.randint(0, 16, (5, 77), generator=torch.Generator().manual_seed(1))
    assert torch.equal(int4.unpack(int4.pack(c), 77), c.to(torch.uint8))


def test_layer_buffers_bytes_and_output():
    torch.manual_seed(0)
    lin = nn.Linear(100, 24)
    layer = int4.Int4WeightOnlyLinear.from_linear(lin, 32, pad=True)          # 100 -> 128 columns, 4 groups
    assert {n for n, _ in layer.named_buffers()} == {"packed", "scale", "zero", "bias"}
    assert not list(layer.parameters())
    assert layer.packed.shape == (24, 64) and layer.scale.shape == (24, 4)
    assert layer.weight_bytes() == 24 * 64 + 24 * 4 * 2 + 24 * 4
    x = torch.randn(7, 100)
    expected = nn.functional.linear(x, layer.weight(), lin.bias)
    assert torch.allclose(layer(x), expected, atol=1e-6)
    assert (layer.weight() - lin.weight).abs().max() <= layer.scale.float().max() / 2 * (1 + 1e-5)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    q = int4.quantize_model(model, None)                                  # per channel: one group per row
    assert [m.group_size for m in q.modules() if isinstance(m, int4.Int4WeightOnlyLinear)] == [64, 32]
    assert int4.weight_bytes(q, "int4") == 32 * 32 + 32 * 3 + 10 * 16 + 10 * 3
    assert int4.weight_bytes(model, "int8 per channel") == 64 * 32 + 32 * 4 + 32 * 10 + 10 * 4
    assert int4.weight_bytes(model, "fp16") == 2 * (64 * 32 + 32 * 10)


def test_bad_input():
    with pytest.raises(ValueError, match=r"group_size=48.*\[1, 2, 4, 8, 16, 32, 64, 128\]"):
        int4.quantize(torch.randn(4, 128), 48)
    with pytest.raises(ValueError, match="group_size=0"):
        int4.quantize(torch.randn(4, 128), 0)
    with pytest.raises(ValueError, match="group_size=32"):
        int4.Int4WeightOnlyLinear.from_linear(nn.Linear(100, 4), 32)        # no pad: 32 does not divide 100
    with pytest.raises(TypeError, match="floating-point"):
        int4.quantize(torch.ones(4, 128, dtype=torch.int32), 32)
    with pytest.raises(ValueError, match="2-D"):
        int4.quantize(torch.randn(128), 32)
    with pytest.raises(ValueError, match="0..15"):
        int4.pack(torch.tensor([16]))
    with pytest.raises(TypeError, match="integer"):
        int4.pack(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="fmt="):
        int4.weight_bytes(nn.Linear(4, 4), "int3")


def test_agrees_with_torchao_int4_kernel_on_cpu():
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    lin = nn.Linear(100, 40)
    with torch.no_grad():         # on a grid both conventions represent exactly: every group spans 0..15 steps
        steps = torch.randint(0, 16, (40, 100)).float()
        steps[:, ::32], steps[:, 1::32] = 0, 15
        lin.weight.copy_(steps * 2.0 ** -6 * torch.tensor([1.0, -1.0]).repeat(20)[:, None])
    try:
        theirs = int4.torchao_int4_linear(lin, 32)
    except RuntimeError as err:
        pytest.skip(str(err))
    x = torch.randn(16, 100)
    ours = int4.Int4WeightOnlyLinear.from_linear(lin, 32, pad=True)
    assert torch.allclose(ours(x), lin(x), atol=1e-5) and torch.allclose(theirs(x), ours(x), atol=1e-4)
    lin.reset_parameters()                    # a random weight: the zero-point conventions differ (theirs a
    ours = int4.Int4WeightOnlyLinear.from_linear(lin, 32, pad=True)   # float, "tinygemm"), both near fp32
    theirs = int4.torchao_int4_linear(lin, 32)
    ref = lin(x)
    rel = lambda a: ((a - ref).norm() / ref.norm()).item()          # noqa: E731
    assert rel(ours(x)) < 0.12 and rel(theirs(x)) < 0.12 and ((ours(x) - theirs(x)).norm() / ref.norm()).item() < 0.15
