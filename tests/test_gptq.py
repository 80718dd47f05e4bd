"""course_lib.compression.gptq: GPTQ (Frantar et al. 2023, Algorithm 1) against RTN, a direct OBS
reference and a hand computation; the int grid checked with PyTorch's own fake-quant."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.compression import gptq as G
from course_lib.compression import quantization as Q


def correlated_inputs(n=512, cols=64, seed=0):
    """[n, cols]: a few latent factors mixed into every column, plus a little noise (like pixels)."""
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(n, 8, generator=g)
    return latent @ torch.randn(8, cols, generator=g) + 0.1 * torch.randn(n, cols, generator=g)


def weight(out=16, cols=64, seed=1):
    return torch.randn(out, cols, generator=torch.Generator().manual_seed(seed)) * 0.1


def dequantized(codes, scale, zero_point, bits=4):
    return Q.dequantize(codes.flatten(1), scale, zero_point, bits, axis=0).reshape(codes.shape)


def obs_reference(w, H, bits, symmetric):
    """GPTQ without Cholesky or blocks, in float64: for each column j, the inverse of the Hessian of the
    columns not yet quantized (H[j:, j:]), and the OBS update of the paper's equation (2)/(3)."""
    w = w.double().clone()
    scale, zero_point = G.grid(w.float(), bits, symmetric)
    codes = torch.empty(w.shape, dtype=torch.int64)
    for j in range(w.shape[1]):
        Hinv = torch.linalg.inv(H[j:, j:].double())
        q = Q.quantize(w[:, j].float(), scale, zero_point, bits, axis=0)
        err = w[:, j] - Q.dequantize(q, scale, zero_point, bits, axis=0).double()
        w[:, j:] -= err[:, None] / Hinv[0, 0] * Hinv[0]
        codes[:, j] = q
    return codes


# (a) no correlation to exploit: GPTQ is RTN, bit for bit -------------------------------------------
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block_size", [128, 7])
def test_identity_hessian_is_round_to_nearest(symmetric, block_size):
    w = weight()
    codes, scale, zero_point = G.quantize(w, torch.eye(64), bits=4, symmetric=symmetric, block_size=block_size)
    rtn_codes, rtn_scale, rtn_zero = G.rtn(w, bits=4, symmetric=symmetric)
    assert torch.equal(codes, rtn_codes) and torch.equal(scale, rtn_scale) and torch.equal(zero_point, rtn_zero)
    # RTN itself is PyTorch's per-channel fake-quant on that grid (and, symmetric, the quantization module's)
    theirs = torch.fake_quantize_per_channel_affine(w, scale, zero_point.int(), 0, -8, 7)
    assert torch.equal(dequantized(codes, scale, zero_point), theirs)
    if symmetric:
        assert torch.equal(dequantized(codes, scale, zero_point), Q.quantize_weight(w, 4, per_channel=True))


# (b) correlated inputs: the layer's output error falls --------------------------------------------
@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("symmetric", [True, False])
def test_output_error_below_round_to_nearest(bits, symmetric):
    x, w = correlated_inputs(), weight()
    out_err = {}
    for name, (codes, scale, zero_point) in {
            "gptq": G.quantize(w, G.hessian(x), bits, symmetric),
            "rtn": G.rtn(w, bits, symmetric)}.items():
        out_err[name] = (x @ (w - dequantized(codes, scale, zero_point, bits)).T).pow(2).sum().item()
    assert out_err["gptq"] < 0.5 * out_err["rtn"], out_err


def test_blocks_change_only_the_order_of_sums():
    x, w = correlated_inputs(), weight()
    one = G.quantize(w, G.hessian(x), block_size=64)[0]
    for block_size in (1, 5, 16):
        assert (G.quantize(w, G.hessian(x), block_size=block_size)[0].long() - one.long()).abs().max() <= 1


# (c) every weight on the int grid ------------------------------------------------------------------
@pytest.mark.parametrize("symmetric", [True, False])
def test_weights_lie_on_the_int4_grid(symmetric):
    x, w = correlated_inputs(), weight()
    codes, scale, zero_point = G.quantize(w, G.hessian(x), bits=4, symmetric=symmetric)
    assert codes.dtype == torch.int8 and codes.shape == w.shape
    assert int(codes.min()) >= -8 and int(codes.max()) <= 7
    w_hat = dequantized(codes, scale, zero_point)
    assert all(row.unique().numel() <= 16 for row in w_hat)
    # PyTorch's own per-channel fake-quant leaves a weight that is on the grid unchanged
    theirs = torch.fake_quantize_per_channel_affine(w_hat, scale, zero_point.int(), 0, -8, 7)
    assert torch.allclose(theirs, w_hat, rtol=0, atol=1e-6 * scale.max().item())
    if symmetric:
        assert torch.equal(zero_point, torch.zeros_like(zero_point))


# (d) a hand case and a direct reference ------------------------------------------------------------
def test_hand_case_one_row_two_columns():
    """w = [0.75, 0.33], symmetric int4: scale = 0.75 / 7.5 = 0.1, grid -0.8 .. 0.7.
    Column 0: 7.5 is clamped to 7 -> 0.7, error 0.05. H = [[2, 1], [1, 2]], H^-1 = [[2, -1], [-1, 2]] / 3:
    w1 -= 0.05 * (-1/3) / (2/3) -> 0.33 + 0.025 = 0.355 -> code 4 (0.4), where RTN gives code 3 (0.3)."""
    w, H = torch.tensor([[0.75, 0.33]]), torch.tensor([[2.0, 1.0], [1.0, 2.0]])
    codes, scale, _ = G.quantize(w, H, bits=4, damp=0.0)
    assert codes.tolist() == [[7, 4]] and G.rtn(w, bits=4)[0].tolist() == [[7, 3]]
    assert scale.item() == pytest.approx(0.1)
    e_gptq, e_rtn = w - torch.tensor([[0.7, 0.4]]), w - torch.tensor([[0.7, 0.3]])
    assert (e_gptq @ H @ e_gptq.T).item() < (e_rtn @ H @ e_rtn.T).item()     # 0.0078 < 0.0098


@pytest.mark.parametrize("symmetric", [True, False])
def test_agrees_with_the_direct_obs_reference(symmetric):
    x, w = correlated_inputs(n=64, cols=12, seed=3), weight(out=5, cols=12, seed=4)
    H = G.hessian(x)
    for block_size in (128, 5):
        codes = G.quantize(w, H, bits=3, symmetric=symmetric, damp=0.0, block_size=block_size)[0]
        assert torch.equal(codes.long(), obs_reference(w, H, 3, symmetric))


def test_damping_adds_one_percent_of_the_mean_diagonal():
    H = G.hessian(correlated_inputs(n=64, cols=12))
    x = correlated_inputs(n=64, cols=12).double()
    assert torch.allclose(H, 2 * x.T @ x / 64)
    U = G.inverse_cholesky(H, damp=0.01)
    damped = H + 0.01 * H.diagonal().mean() * torch.eye(12, dtype=H.dtype)
    assert torch.allclose(U.T @ U, torch.linalg.inv(damped), rtol=1e-9, atol=1e-12)
    assert torch.equal(U, U.triu())


# (e) Linear and Conv2d, whole models, bad input -----------------------------------------------------
def test_conv_is_a_matmul_on_unfolded_patches():
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1, dilation=1)
    x = torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(0))
    patches = G.layer_inputs(conv, x)                                   # [2 * 25, 27]
    assert patches.shape == (50, 27)
    y = (patches @ conv.weight.flatten(1).T).reshape(2, 25, 4).transpose(1, 2).reshape(2, 4, 5, 5)
    assert torch.allclose(y, F.conv2d(x, conv.weight, None, 2, 1), atol=1e-5)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.fc1 = nn.Linear(6 * 8 * 8, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def batches(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    smooth = lambda x: F.avg_pool2d(x, 3, 1, 1)            # noqa: E731  correlated neighbouring pixels
    return [(smooth(torch.randn(32, 1, 16, 16, generator=g)), torch.zeros(32)) for _ in range(n)]


def test_model_conv_and_linear_layer_by_layer():
    torch.manual_seed(0)
    net, calib = Net().eval(), batches()
    qnet, codes = G.quantize_model(net, calib, bits=4)
    rnet, rcodes = G.quantize_model(net, bits=4, method="rtn")
    assert list(codes) == list(rcodes) == ["conv", "fc1", "fc2"]
    for name, (c, scale, zero_point) in codes.items():
        layer = getattr(qnet, name)
        assert c.shape == layer.weight.shape and int(c.min()) >= -8 and int(c.max()) <= 7
        assert torch.equal(layer.weight, dequantized(c, scale, zero_point))
        assert torch.equal(getattr(rnet, name).weight, dequantized(*rcodes[name]))
    assert not torch.equal(net.fc1.weight, qnet.fc1.weight)
    # the first layer: GPTQ on the conv's unfolded inputs, its output error below RTN's
    x = torch.cat([b[0] for b in calib])
    ref = net.conv(x)
    err = {n: (m.conv(x) - ref).pow(2).sum().item() for n, m in (("gptq", qnet), ("rtn", rnet))}
    assert err["gptq"] < err["rtn"], err
    # fc2 was calibrated on the inputs of the already-quantized conv and fc1 (not the float model's)
    seen = []
    hook = qnet.fc2.register_forward_hook(lambda m, a, o: seen.append(a[0]))
    for b in calib:
        qnet(b[0])
    hook.remove()
    H_quantized = G.hessian(torch.cat(seen))
    assert torch.equal(codes["fc2"][0], G.quantize(net.fc2.weight, H_quantized, bits=4)[0])


class Backwards(nn.Module):
    """Registered fc2 before fc1, called fc1 first."""

    def __init__(self):
        super().__init__()
        self.fc2 = nn.Linear(16, 4)
        self.fc1 = nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_layers_quantized_in_the_order_the_forward_pass_calls_them():
    torch.manual_seed(0)
    net, x = Backwards().eval(), correlated_inputs(n=256, cols=32)
    qnet, codes = G.quantize_model(net, (xb for xb in x.split(64)), bits=3)     # a one-shot iterator is fine
    assert list(codes) == ["fc1", "fc2"]
    H_fc2 = G.hessian(torch.relu(qnet.fc1(x)))                  # fc2's inputs after fc1 was quantized
    assert torch.equal(codes["fc2"][0], G.quantize(net.fc2.weight, H_fc2, bits=3)[0])


def test_the_float_model_is_untouched():
    net = Net().eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    G.quantize_model(net, batches(2), bits=3)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("bits", [1, 9, 4.0, True, None])
def test_bits_out_of_range_refused(bits):
    with pytest.raises(ValueError, match="bits"):
        G.quantize(weight(), torch.eye(64), bits=bits)
    with pytest.raises(ValueError, match="bits"):
        G.quantize_model(Net(), batches(1), bits=bits)


def test_bad_shapes_and_arguments_refused():
    w = weight()
    with pytest.raises(ValueError, match="weight"):
        G.quantize(w[0], torch.eye(64))                                   # 1-D
    with pytest.raises(ValueError, match="weight"):
        G.quantize(w[None], torch.eye(64))                                # 3-D
    with pytest.raises(TypeError, match="weight"):
        G.quantize(w.long(), torch.eye(64))
    with pytest.raises(ValueError, match="H must be"):
        G.quantize(w, torch.eye(63))
    with pytest.raises(ValueError, match="damp"):
        G.quantize(w, torch.eye(64), damp=-0.1)
    with pytest.raises(ValueError, match="damp"):                     # rank 1, undamped: not positive definite
        G.quantize(w, torch.ones(64, 64), damp=0.0)
    with pytest.raises(ValueError, match="block_size"):
        G.quantize(w, torch.eye(64), block_size=0)
    with pytest.raises(ValueError, match="symmetric"):
        G.quantize(w, torch.eye(64), symmetric="yes")
    with pytest.raises(ValueError, match="x must be"):
        G.hessian(torch.randn(3, 4, 5))
    with pytest.raises(ValueError, match="method"):
        G.quantize_model(Net(), batches(1), method="awq")
    with pytest.raises(ValueError, match="batches"):
        G.quantize_model(Net(), None)
    with pytest.raises(ValueError, match="batches"):
        G.quantize_model(Net(), [])
    with pytest.raises(ValueError, match="no nn.Linear or nn.Conv2d"):
        G.quantize_model(nn.Sequential(nn.ReLU()), batches(1))
    with pytest.raises(ValueError, match="groups=1"):
        G.layer_inputs(nn.Conv2d(4, 4, 3, groups=2), torch.randn(1, 4, 5, 5))
    with pytest.raises(ValueError, match="layer must be"):
        G.layer_inputs(nn.ReLU(), torch.randn(2, 3))
